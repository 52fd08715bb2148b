#include "src/report/h5read.hpp"

#include <hdf5.h>

#include <filesystem>
#include <vector>

namespace strata::report {
namespace {

// Whether an attribute's or dataset's dataspace holds exactly one element:
// a reader of one value must not read an array (into one value's room).
bool one_element(hid_t space) {
  const bool one = space >= 0 && H5Sget_simple_extent_npoints(space) == 1;
  if (space >= 0) H5Sclose(space);
  return one;
}

// A status or an error message is far shorter; a damaged file may claim more.
constexpr std::size_t kLongestString = 1 << 20;

std::string read_string_attr(hid_t file, const char* name) {
  if (H5Aexists(file, name) <= 0) return "";
  const hid_t a = H5Aopen(file, name, H5P_DEFAULT);
  if (a < 0) return "";
  if (!one_element(H5Aget_space(a))) {
    H5Aclose(a);
    return "";
  }
  const hid_t t = H5Aget_type(a);
  std::string out;
  if (t < 0) {
    H5Aclose(a);
    return "";
  }
  if (H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) > 0) {
    char* text = nullptr;
    if (H5Aread(a, t, &text) >= 0 && text != nullptr) out = text;
    H5free_memory(text);
  } else if (H5Tget_class(t) == H5T_STRING && H5Tget_size(t) <= kLongestString) {
    std::vector<char> buf(H5Tget_size(t) + 1, '\0');
    if (H5Aread(a, t, buf.data()) >= 0) out = buf.data();
  }
  H5Tclose(t);
  H5Aclose(a);
  return out;
}

double read_scalar(hid_t file, const char* path) {
  double v = 0;
  if (H5Lexists(file, "summary", H5P_DEFAULT) <= 0 || H5Lexists(file, path, H5P_DEFAULT) <= 0) return 0;
  const hid_t d = H5Dopen(file, path, H5P_DEFAULT);
  if (d < 0) return 0;
  const hid_t t = H5Dget_type(d);
  const bool number = t >= 0 && (H5Tget_class(t) == H5T_FLOAT || H5Tget_class(t) == H5T_INTEGER);
  if (t >= 0) H5Tclose(t);
  if (!number || !one_element(H5Dget_space(d)) ||
      H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v) < 0)
    v = 0;
  H5Dclose(d);
  return v;
}

}  // namespace

std::optional<Headline> read_headline(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  std::optional<Headline> out;
  // A file that is not HDF5 is "no report", not an error to print.
  H5E_BEGIN_TRY {
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f >= 0) {
      Headline h;
      h.status = read_string_attr(f, "status");
      h.error = read_string_attr(f, "error");
      h.tokens_per_s = read_scalar(f, "/summary/tokens_per_s");
      h.mfu = read_scalar(f, "/summary/mfu");
      h.step_time = read_scalar(f, "/summary/step_time");
      h.final_loss = read_scalar(f, "/summary/final_loss");
      h.peak_bytes_total = read_scalar(f, "/summary/peak_bytes_total");
      H5Fclose(f);
      out = h;
    }
  }
  H5E_END_TRY;
  return out;
}

}  // namespace strata::report
