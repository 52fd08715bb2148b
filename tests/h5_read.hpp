// Reading a report back with plain HDF5 calls, the serial read path any
// reader takes: attributes, and one field of a compound table through a
// one-member compound memory type (HDF5 matches members by name, as
// h5py's dset["field"] does).
#pragma once

#include <hdf5.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace strata::h5_test {

inline std::string read_str_attr(hid_t obj, const std::string& name) {
  hid_t attr = H5Aopen(obj, name.c_str(), H5P_DEFAULT);
  if (attr < 0) return "<missing " + name + ">";
  hid_t type = H5Aget_type(attr);
  std::string value;
  if (H5Tis_variable_str(type) > 0) {  // as the writer stores them
    char* text = nullptr;
    H5Aread(attr, type, &text);
    value = text != nullptr ? text : "";
    H5free_memory(text);
  } else {
    value.assign(H5Tget_size(type) + 1, '\0');
    H5Aread(attr, type, value.data());
    value = value.substr(0, value.find('\0'));
  }
  H5Tclose(type);
  H5Aclose(attr);
  return value;
}

inline std::int64_t read_i64_attr(hid_t obj, const std::string& name) {
  std::int64_t v = -1;
  hid_t attr = H5Aopen(obj, name.c_str(), H5P_DEFAULT);
  H5Aread(attr, H5T_NATIVE_INT64, &v);
  H5Aclose(attr);
  return v;
}

inline double read_f64_attr(hid_t obj, const std::string& name) {
  double v = -1;
  hid_t attr = H5Aopen(obj, name.c_str(), H5P_DEFAULT);
  H5Aread(attr, H5T_NATIVE_DOUBLE, &v);
  H5Aclose(attr);
  return v;
}

inline std::size_t num_rows(hid_t dset) {
  hid_t space = H5Dget_space(dset);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  H5Sclose(space);
  return n;
}

// One field of a compound dataset, read through a one-member compound
// memory type: HDF5 matches members by name, as h5py's dset["field"] does.
template <typename T>
std::vector<T> read_field(hid_t dset, const std::string& field, hid_t member_type) {
  std::vector<T> out(num_rows(dset));
  hid_t mem = H5Tcreate(H5T_COMPOUND, sizeof(T));
  H5Tinsert(mem, field.c_str(), 0, member_type);
  EXPECT_GE(H5Dread(dset, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), 0) << field;
  H5Tclose(mem);
  return out;
}

inline std::vector<std::int64_t> read_i64(hid_t dset, const std::string& f) {
  return read_field<std::int64_t>(dset, f, H5T_NATIVE_INT64);
}
inline std::vector<double> read_f64(hid_t dset, const std::string& f) { return read_field<double>(dset, f, H5T_NATIVE_DOUBLE); }

inline std::vector<std::string> read_str(hid_t dset, const std::string& field, std::size_t len) {
  const std::size_t n = num_rows(dset);
  std::vector<char> raw(n * len + 1, '\0');
  hid_t str = H5Tcopy(H5T_C_S1);
  H5Tset_size(str, len);
  H5Tset_strpad(str, H5T_STR_NULLPAD);
  hid_t mem = H5Tcreate(H5T_COMPOUND, len);
  H5Tinsert(mem, field.c_str(), 0, str);
  EXPECT_GE(H5Dread(dset, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()), 0) << field;
  H5Tclose(mem);
  H5Tclose(str);
  std::vector<std::string> out;
  for (std::size_t r = 0; r < n; ++r) {
    std::string s(raw.data() + r * len, len);
    out.push_back(s.substr(0, s.find('\0')));
  }
  return out;
}

// A file opened for reading, closed at scope exit.
struct ReadFile {
  explicit ReadFile(const std::filesystem::path& p) : id(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)) {}
  ~ReadFile() {
    if (id >= 0) H5Fclose(id);
  }
  hid_t id;
};

struct Object {
  Object(hid_t file, const std::string& path) : id(H5Oopen(file, path.c_str(), H5P_DEFAULT)) {}
  ~Object() {
    if (id >= 0) H5Oclose(id);
  }
  hid_t id;
};

}  // namespace strata::h5_test
