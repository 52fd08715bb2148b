// H5File: the parallel HDF5 (MPI-IO) writer of the report. Metadata calls are
// made identically on every rank; a table's rows go straight from each rank to
// its exclusive-scan offset in one collective write, so nothing is gathered.
#include "src/report/h5file.hpp"

#include <hdf5.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <optional>
#include <vector>

#include "src/comm/mpi_check.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/foundation/memory.hpp"
#include "src/report/h5check.hpp"

namespace strata::report {

// ---- error handling (declared in h5check.hpp) ----

namespace {

herr_t collect_error(unsigned /*n*/, const H5E_error2_t* err, void* data) {
  auto* lines = static_cast<std::vector<std::string>*>(data);
  lines->push_back(fmt::format("{}(): {}", err->func_name ? err->func_name : "?", err->desc ? err->desc : ""));
  return 0;
}

// The outermost entry says what failed and the innermost says why (errno,
// "file exists", ...); the frames in between add little.
std::string h5_error_text() {
  std::vector<std::string> lines;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &lines);
  H5Eclear2(H5E_DEFAULT);
  if (lines.empty()) return "no HDF5 error detail";
  if (lines.size() == 1) return lines.front();
  return lines.front() + " ... " + lines.back();
}

}  // namespace

void h5_failed(const char* expr, const char* file, int line) {
  core::runtime_error("HDF5 call `{}` failed at {}:{}: {}", expr, file, line, h5_error_text());
}

void h5_quiet_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {

// ---- small helpers ----

// Owns one HDF5 id and closes it with the matching H5*close, so that an
// exception half-way through a write leaks no id (an open object keeps
// H5Fclose from closing the file).
class Id {
 public:
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Id() {
    if (id_ >= 0) close_(id_);
  }
  Id(Id&& other) noexcept : id_(other.id_), close_(other.close_) { other.id_ = -1; }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id& operator=(Id&&) = delete;
  operator hid_t() const { return id_; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// "a/b/", "/a/b" -> "/a/b"; "", "/" -> "/".
std::string absolute(const std::string& path) {
  std::string p = path;
  while (!p.empty() && p.back() == '/') p.pop_back();
  if (p.empty() || p.front() != '/') p.insert(p.begin(), '/');
  return p;
}

std::string join_path(const std::string& group, const std::string& name) {
  const std::string g = absolute(group);
  return g == "/" ? "/" + name : g + "/" + name;
}

// Creating "/a/b/x" makes "/a" and "/a/b" when they are missing.
Id link_create_plist() {
  Id lcpl(STRATA_CHECK_H5(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
  STRATA_CHECK_H5(H5Pset_create_intermediate_group(lcpl, 1));
  return lcpl;
}

Id collective_transfer() {
  Id dxpl(STRATA_CHECK_H5(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
  STRATA_CHECK_H5(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
  return dxpl;
}

// Nothing reads a dataset before it is written, so writing fill values
// first would only double the I/O.
Id dataset_create_plist() {
  Id dcpl(STRATA_CHECK_H5(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  STRATA_CHECK_H5(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  return dcpl;
}

// A fixed-length C string of exactly the value's length (h5py and h5dump
// read it back whole); HDF5 cannot make a zero-sized type, so "" is one NUL.
// The character set stays ASCII, HDF5's default: HDF5 refuses to convert
// between ASCII and UTF-8 string types, so a UTF-8 label would break every
// reader that builds its memory type from H5T_C_S1. Bytes pass unchanged.
Id string_type(std::size_t len) {
  Id type(STRATA_CHECK_H5(H5Tcopy(H5T_C_S1)), H5Tclose);
  STRATA_CHECK_H5(H5Tset_size(type, std::max<std::size_t>(len, 1)));
  STRATA_CHECK_H5(H5Tset_strpad(type, H5T_STR_NULLTERM));
  return type;
}

// Attributes cannot be overwritten in place with a different type or size
// ("running" -> "complete"), so an existing one is deleted and made anew.
void put_attr(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type, hid_t space, const void* buf) {
  if (STRATA_CHECK_H5(H5Aexists(obj, name.c_str())) > 0) STRATA_CHECK_H5(H5Adelete(obj, name.c_str()));
  Id attr(STRATA_CHECK_H5(H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  STRATA_CHECK_H5(H5Awrite(attr, mem_type, buf));
}

// Attributes (provenance, units, docs) are variable-length UTF-8 strings:
// h5py reads them as str. (Datasets' strings cannot be: parallel HDF5 does
// not write variable-length data, so table columns and scalar strings stay
// fixed-length, read as bytes.)
void put_attr(hid_t obj, const std::string& name, const std::string& value) {
  Id type(STRATA_CHECK_H5(H5Tcopy(H5T_C_S1)), H5Tclose);
  STRATA_CHECK_H5(H5Tset_size(type, H5T_VARIABLE));
  STRATA_CHECK_H5(H5Tset_cset(type, H5T_CSET_UTF8));
  Id space(STRATA_CHECK_H5(H5Screate(H5S_SCALAR)), H5Sclose);
  const char* text = value.c_str();
  put_attr(obj, name, type, type, space, &text);
}

void put_attr(hid_t obj, const std::string& name, std::int64_t value) {
  Id space(STRATA_CHECK_H5(H5Screate(H5S_SCALAR)), H5Sclose);
  put_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, space, &value);
}

void put_attr(hid_t obj, const std::string& name, double value) {
  Id space(STRATA_CHECK_H5(H5Screate(H5S_SCALAR)), H5Sclose);
  put_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, space, &value);
}

// Data that every rank holds the same copy of (scalars, weight exports) is
// written by rank 0 alone; the others join the collective write with an
// empty selection.
void write_from_rank0(hid_t dset, hid_t mem_type, int rank, const void* buf) {
  Id file_space(STRATA_CHECK_H5(H5Dget_space(dset)), H5Sclose);
  if (rank != 0) STRATA_CHECK_H5(H5Sselect_none(file_space));
  Id mem_space(STRATA_CHECK_H5(H5Scopy(file_space)), H5Sclose);
  Id dxpl = collective_transfer();
  STRATA_CHECK_H5(H5Dwrite(dset, mem_type, mem_space, file_space, dxpl, buf));
}

}  // namespace

// ---- H5File ----

H5File::H5File(MPI_Comm comm, const std::string& final_path, const std::string& temp_suffix)
    : comm_(comm), final_path_(final_path), temp_path_(final_path + temp_suffix) {
  STRATA_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  h5_quiet_errors();

  // One rank makes the directory; the broadcast both orders it before the
  // file is created and lets every rank fail together rather than hang.
  int dir_ok = 1;
  std::string why;
  if (rank_ == 0) {
    const auto parent = std::filesystem::path(final_path_).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) {
      dir_ok = 0;
      why = ec.message();
    }
  }
  STRATA_CHECK_MPI(MPI_Bcast(&dir_ok, 1, MPI_INT, 0, comm_));
  if (!dir_ok)
    core::runtime_error("cannot create the directory of report '{}'{}", final_path_, why.empty() ? "" : ": " + why);

  Id fapl(STRATA_CHECK_H5(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  STRATA_CHECK_H5(H5Pset_fapl_mpio(fapl, comm_, MPI_INFO_NULL));
  // Every metadata call here is collective anyway; saying so lets HDF5 read
  // metadata on one rank and broadcast it, and write it collectively,
  // instead of every rank hitting the file system.
  STRATA_CHECK_H5(H5Pset_all_coll_metadata_ops(fapl, true));
  STRATA_CHECK_H5(H5Pset_coll_metadata_write(fapl, true));
  const hid_t file = H5Fcreate(temp_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (file < 0) core::runtime_error("cannot create report file '{}': {}", temp_path_, h5_error_text());
  file_ = file;
}

H5File::~H5File() {
  // file_ < 0: published, or publish() closed the file and then failed to
  // rename it; that complete ".partial" file is kept for the user.
  // A failed publish may have closed the file on some ranks and not others:
  // every rank ends alike, as one that left it open.
  if (broken_ && !published_) ++left_open_;
  if (file_ < 0 || broken_) return;
  if (std::uncaught_exceptions() > 0) {
    // After an agreed error the file stays under its temporary name, as far
    // as it was written, and open: HDF5's close after a failed write (a full
    // disk) can diverge between ranks inside its own collective metadata
    // flush and hang. So does any close while this rank unwinds from an
    // error of its own, which the others may not share (they would wait for
    // it in the close's collectives). The process must then end without
    // MPI_Finalize, which would close it (files_left_open()).
    ++left_open_;
    return;
  }
  H5Fclose(file_);
  file_ = -1;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // too late for a collective; the ".partial" name still marks the file incomplete
  // Destructors must not throw: MPI errors here are ignored, the removal is
  // best effort (the name already says the file is incomplete). Like every
  // call here this is collective: a rank unwinding alone would wait in it,
  // which is why one rank's error ends the job with MPI_Abort.
  MPI_Barrier(comm_);
  if (rank_ == 0) std::remove(temp_path_.c_str());
  MPI_Barrier(comm_);
}

namespace {

void require_open(std::int64_t file, bool published, const std::string& path) {
  STRATA_CHECK(file >= 0 && !published, "report '{}' is already published or closed", path);
}

Id open_object(hid_t file, const std::string& object, const std::string& attr, const std::string& path) {
  const hid_t obj = H5Oopen(file, object.c_str(), H5P_DEFAULT);
  if (obj < 0)
    core::runtime_error("report '{}': cannot set attribute '{}' on '{}': {}", path, attr, object, h5_error_text());
  return Id(obj, H5Oclose);
}

}  // namespace

// Each call's outcome is agreed before any rank goes on: an error on one rank
// alone (a full disk seen by the rank that writes) would otherwise send it
// ahead to another collective call while the others wait in this one, and
// the job would hang. Every rank throws the first failing rank's message.
// (Arguments are the same on every rank, the contract above, so an error of
// one rank alone comes from the storage, inside a collective call that every
// rank completes: ROMIO returns a write's error to its caller.)
template <typename Body>
void H5File::together(const char* what, Body&& body) {
  std::string message;
  try {
    body();
  } catch (const std::exception& e) {
    message = e.what();
  }
  const comm::Failure f = comm::first_failure(message, comm_);
  if (f.rank < 0) return;
  broken_ = true;
  throw core::Error(core::ErrorKind::runtime,
                    fmt::format("writing report '{}' ({} on rank {}): {}", temp_path_, what, f.rank, f.message), true);
}

std::string hdf5_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return fmt::format("HDF5 {}.{}.{}", major, minor, release);
}

void H5File::require_room(double bytes) {
  double room = std::numeric_limits<double>::infinity();  // unknown: not refused
  struct statvfs st{};
  const std::string dir = std::filesystem::path(temp_path_).parent_path().string();
  if (rank_ == 0 && statvfs(dir.empty() ? "." : dir.c_str(), &st) == 0) room = double(st.f_bavail) * double(st.f_frsize);
  STRATA_CHECK_MPI(MPI_Bcast(&room, 1, MPI_DOUBLE, 0, comm_));
  if (room < bytes + kRoomMargin)
    core::runtime_error("No space left on device: {} free where the report is written, {} needed ({} of rows and {} "
                        "kept for HDF5's metadata)",
                        core::format_bytes(room), core::format_bytes(bytes + kRoomMargin), core::format_bytes(bytes),
                        core::format_bytes(kRoomMargin));
}

void H5File::set_attr(const std::string& object, const std::string& name, const std::string& value) {
  together("set_attr", [&] {
    require_open(file_, published_, final_path_);
    Id obj = open_object(file_, object, name, final_path_);
    put_attr(obj, name, value);
  });
}

void H5File::set_attr(const std::string& object, const std::string& name, std::int64_t value) {
  together("set_attr", [&] {
    require_open(file_, published_, final_path_);
    Id obj = open_object(file_, object, name, final_path_);
    put_attr(obj, name, value);
  });
}

void H5File::set_attr(const std::string& object, const std::string& name, double value) {
  together("set_attr", [&] {
    require_open(file_, published_, final_path_);
    Id obj = open_object(file_, object, name, final_path_);
    put_attr(obj, name, value);
  });
}

void H5File::create_group(const std::string& path) {
  together("create_group", [&] {
    require_open(file_, published_, final_path_);
    const std::string p = absolute(path);
    if (p == "/") return;  // the root always exists
    // H5Lexists fails (rather than answering no) when a parent is missing, so
    // the path is probed one component at a time.
    bool exists = true;
    for (std::size_t pos = 1; exists && pos != std::string::npos;) {
      pos = p.find('/', pos + 1);
      const std::string prefix = p.substr(0, pos);
      exists = STRATA_CHECK_H5(H5Lexists(file_, prefix.c_str(), H5P_DEFAULT)) > 0;
    }
    if (exists) {
      // (H5Iget_type rather than H5Oget_info: the latter changed signature between 1.10 and 1.12.)
      Id obj(STRATA_CHECK_H5(H5Oopen(file_, p.c_str(), H5P_DEFAULT)), H5Oclose);
      STRATA_CHECK(H5Iget_type(obj) == H5I_GROUP, "report '{}': '{}' exists and is not a group", final_path_, p);
      return;
    }
    Id lcpl = link_create_plist();
    Id group(STRATA_CHECK_H5(H5Gcreate2(file_, p.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
  });
}

void H5File::write_scalar(const std::string& group, const std::string& name, double value, const std::string& unit,
                          const std::string& doc) {
  together("write_scalar", [&] {
    require_open(file_, published_, final_path_);
    const std::string path = join_path(group, name);
    Id space(STRATA_CHECK_H5(H5Screate(H5S_SCALAR)), H5Sclose);
    Id lcpl = link_create_plist();
    Id dset(STRATA_CHECK_H5(H5Dcreate2(file_, path.c_str(), H5T_IEEE_F64LE, space, lcpl, H5P_DEFAULT, H5P_DEFAULT)),
            H5Dclose);
    write_from_rank0(dset, H5T_NATIVE_DOUBLE, rank_, &value);
    put_attr(dset, "unit", unit);
    put_attr(dset, "doc", doc);
  });
}

void H5File::write_scalar(const std::string& group, const std::string& name, const std::string& value,
                          const std::string& doc) {
  together("write_scalar", [&] {
    require_open(file_, published_, final_path_);
    const std::string path = join_path(group, name);
    Id type = string_type(value.size());
    Id space(STRATA_CHECK_H5(H5Screate(H5S_SCALAR)), H5Sclose);
    Id lcpl = link_create_plist();
    Id dset(STRATA_CHECK_H5(H5Dcreate2(file_, path.c_str(), type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT)), H5Dclose);
    write_from_rank0(dset, type, rank_, value.c_str());
    put_attr(dset, "doc", doc);
  });
}

void H5File::write_array(const std::string& group, const std::string& name, const float* data, std::int64_t n,
                         const std::vector<std::int64_t>& shape) {
  together("write_array", [&] {
    require_open(file_, published_, final_path_);
    const std::string path = join_path(group, name);
    std::int64_t elements = 1;
    for (auto d : shape) elements *= d;
    STRATA_CHECK(!shape.empty() && n >= 0 && elements == n, "array '{}': shape holds {} elements, data has {}", path,
                 elements, n);
    const hsize_t dims = static_cast<hsize_t>(n);
    Id space(STRATA_CHECK_H5(H5Screate_simple(1, &dims, nullptr)), H5Sclose);
    Id lcpl = link_create_plist();
    Id dcpl = dataset_create_plist();
    Id dset(STRATA_CHECK_H5(H5Dcreate2(file_, path.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT)), H5Dclose);
    // n is the same on every rank, so all skip the write of an empty array together.
    if (n > 0) write_from_rank0(dset, H5T_NATIVE_FLOAT, rank_, data);

    const hsize_t rank_dims = shape.size();
    Id shape_space(STRATA_CHECK_H5(H5Screate_simple(1, &rank_dims, nullptr)), H5Sclose);
    put_attr(dset, "shape", H5T_STD_I64LE, H5T_NATIVE_INT64, shape_space, shape.data());
  });
}

void H5File::write_table(const Table& table) { put_table(table, false); }

void H5File::append_table(const Table& table) { put_table(table, true); }

void H5File::put_table(const Table& table, bool append) {
  together(append ? "append_table" : "write_table", [&] {
    require_open(file_, published_, final_path_);
    // Rank r's rows start after the rows of ranks 0..r-1. First, before
    // anything that can fail on one rank alone (see together()).
    const std::size_t rows = table.num_rows();
    const std::int64_t count = static_cast<std::int64_t>(rows);
    std::int64_t offset = 0, total = 0;
    STRATA_CHECK_MPI(MPI_Exscan(&count, &offset, 1, MPI_INT64_T, MPI_SUM, comm_));
    if (rank_ == 0) offset = 0;  // MPI leaves rank 0's Exscan result undefined
    STRATA_CHECK_MPI(MPI_Allreduce(&count, &total, 1, MPI_INT64_T, MPI_SUM, comm_));

    const auto& cols = table.columns();
    STRATA_CHECK(!cols.empty(), "table '{}' has no columns", table.name());
    double bytes = 0;  // the rows of every rank, and the columns' attributes
    for (const auto& c : cols)
      bytes += double(total) * (c.type == ColumnType::str ? c.str_len : 8) + double(c.doc.size() + c.unit.size() + 64);
    require_room(bytes);

    // Packed row layout, the same in memory and in the file; only the member
    // types differ (native in memory, little-endian in the file), which is
    // no conversion at all on x86 and ARM.
    std::vector<std::size_t> offsets;
    std::size_t row_size = 0;
    std::string names;
    for (const auto& c : cols) {
      offsets.push_back(row_size);
      row_size += c.type == ColumnType::str ? static_cast<std::size_t>(c.str_len) : 8;
      if (!names.empty()) names += ',';
      names += c.name;
    }
    Id file_type(STRATA_CHECK_H5(H5Tcreate(H5T_COMPOUND, row_size)), H5Tclose);
    Id mem_type(STRATA_CHECK_H5(H5Tcreate(H5T_COMPOUND, row_size)), H5Tclose);
    for (std::size_t i = 0; i < cols.size(); ++i) {
      const char* name = cols[i].name.c_str();
      switch (cols[i].type) {
        case ColumnType::i64:
          STRATA_CHECK_H5(H5Tinsert(file_type, name, offsets[i], H5T_STD_I64LE));
          STRATA_CHECK_H5(H5Tinsert(mem_type, name, offsets[i], H5T_NATIVE_INT64));
          break;
        case ColumnType::f64:
          STRATA_CHECK_H5(H5Tinsert(file_type, name, offsets[i], H5T_IEEE_F64LE));
          STRATA_CHECK_H5(H5Tinsert(mem_type, name, offsets[i], H5T_NATIVE_DOUBLE));
          break;
        case ColumnType::str: {
          // Null-padded, not null-terminated: a value may use every byte.
          Id str(STRATA_CHECK_H5(H5Tcopy(H5T_C_S1)), H5Tclose);
          STRATA_CHECK_H5(H5Tset_size(str, static_cast<std::size_t>(cols[i].str_len)));
          STRATA_CHECK_H5(H5Tset_strpad(str, H5T_STR_NULLPAD));
          STRATA_CHECK_H5(H5Tinsert(file_type, name, offsets[i], str));
          STRATA_CHECK_H5(H5Tinsert(mem_type, name, offsets[i], str));
          break;
        }
      }
    }

    std::vector<unsigned char> buf(rows * row_size, 0);
    for (std::size_t i = 0; i < cols.size(); ++i) {
      for (std::size_t r = 0; r < rows; ++r) {
        unsigned char* cell = buf.data() + r * row_size + offsets[i];
        switch (cols[i].type) {
          case ColumnType::i64: std::memcpy(cell, &table.i64(static_cast<int>(i))[r], 8); break;
          case ColumnType::f64: std::memcpy(cell, &table.f64(static_cast<int>(i))[r], 8); break;
          case ColumnType::str: {
            const std::string& s = table.str(static_cast<int>(i))[r];
            std::memcpy(cell, s.data(), std::min(s.size(), static_cast<std::size_t>(cols[i].str_len)));
            break;
          }
        }
      }
    }

    const std::string path = join_path("/", table.name());
    // An appended table grows by every call's rows: chunked, with no limit.
    // Its chunk is the first call's rows (at most 1 MiB of them), so a table
    // written once is one chunk of exactly its size.
    const bool exists = append && STRATA_CHECK_H5(H5Lexists(file_, path.c_str(), H5P_DEFAULT)) > 0;
    hsize_t before = 0;
    std::optional<Id> dset;
    if (exists) {
      dset.emplace(STRATA_CHECK_H5(H5Dopen2(file_, path.c_str(), H5P_DEFAULT)), H5Dclose);
      Id attr(STRATA_CHECK_H5(H5Aopen(*dset, "columns", H5P_DEFAULT)), H5Aclose);
      Id type(STRATA_CHECK_H5(H5Aget_type(attr)), H5Tclose);
      char* text = nullptr;
      STRATA_CHECK_H5(H5Aread(attr, type, &text));
      const std::string had = text != nullptr ? text : "";
      H5free_memory(text);
      STRATA_CHECK(had == names, "appending to table '{}' of columns {} rows of columns {}", table.name(), had, names);
      Id space(STRATA_CHECK_H5(H5Dget_space(*dset)), H5Sclose);
      STRATA_CHECK_H5(H5Sget_simple_extent_dims(space, &before, nullptr));
      const hsize_t after = before + static_cast<hsize_t>(total);
      STRATA_CHECK_H5(H5Dset_extent(*dset, &after));
    } else {
      const hsize_t dims = static_cast<hsize_t>(total);
      const hsize_t unlimited = H5S_UNLIMITED;
      Id file_space(STRATA_CHECK_H5(H5Screate_simple(1, &dims, append ? &unlimited : nullptr)), H5Sclose);
      Id lcpl = link_create_plist();
      Id dcpl = dataset_create_plist();
      if (append) {
        const hsize_t chunk =
            std::clamp<hsize_t>(dims, 1, std::max<hsize_t>(1, (hsize_t(1) << 20) / std::max<std::size_t>(row_size, 1)));
        STRATA_CHECK_H5(H5Pset_chunk(dcpl, 1, &chunk));
      }
      dset.emplace(STRATA_CHECK_H5(H5Dcreate2(file_, path.c_str(), file_type, file_space, lcpl, dcpl, H5P_DEFAULT)),
                   H5Dclose);
    }

    // total is the same on every rank, so an empty write is skipped on all.
    if (total > 0) {
      Id file_space(STRATA_CHECK_H5(H5Dget_space(*dset)), H5Sclose);
      const hsize_t start = before + static_cast<hsize_t>(offset), n = static_cast<hsize_t>(count);
      const hsize_t mem_dims = std::max<hsize_t>(n, 1);  // a rank with no rows still needs a dataspace
      Id mem_space(STRATA_CHECK_H5(H5Screate_simple(1, &mem_dims, nullptr)), H5Sclose);
      if (n > 0) {
        STRATA_CHECK_H5(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &start, nullptr, &n, nullptr));
      } else {
        STRATA_CHECK_H5(H5Sselect_none(file_space));
        STRATA_CHECK_H5(H5Sselect_none(mem_space));
      }
      Id dxpl = collective_transfer();
      unsigned char none = 0;  // HDF5 wants a buffer even for an empty selection
      STRATA_CHECK_H5(H5Dwrite(*dset, mem_type, mem_space, file_space, dxpl, buf.empty() ? &none : buf.data()));
    }
    if (exists) return;

    put_attr(*dset, "doc", table.doc());
    for (const auto& c : cols) {
      put_attr(*dset, "unit:" + c.name, c.unit);
      put_attr(*dset, "doc:" + c.name, c.doc);
    }
    put_attr(*dset, "columns", names);
  });
}

void H5File::flush() {
  together("flush", [&] {
    require_open(file_, published_, final_path_);
    require_room(0);
    STRATA_CHECK_H5(H5Fflush(file_, H5F_SCOPE_GLOBAL));
  });
}

void H5File::publish() {
  together("publish", [&] {
    require_open(file_, published_, final_path_);
    require_room(0);
    STRATA_CHECK_H5(H5Fflush(file_, H5F_SCOPE_GLOBAL));
    STRATA_CHECK_H5(H5Fclose(file_));
    file_ = -1;
  });
  // Every rank has closed (and so flushed) before the file changes its name.
  STRATA_CHECK_MPI(MPI_Barrier(comm_));
  int renamed = 1;
  std::string why;
  if (rank_ == 0 && std::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    renamed = 0;
    why = std::strerror(errno);
  }
  STRATA_CHECK_MPI(MPI_Bcast(&renamed, 1, MPI_INT, 0, comm_));
  if (!renamed)
    core::runtime_error("cannot rename the complete report '{}' to '{}'{}; the report is left under its temporary name",
                        temp_path_, final_path_, why.empty() ? "" : ": " + why);
  published_ = true;
  STRATA_CHECK_MPI(MPI_Barrier(comm_));
}

}  // namespace strata::report
