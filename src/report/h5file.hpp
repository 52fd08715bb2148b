// The HDF5 report file, written with parallel HDF5 (MPI-IO) from the first
// day. Every call here is collective over the communicator: HDF5 creates
// objects and writes metadata collectively, so every rank makes each call
// with the same names and values; only table rows differ per rank.
//
// The file is written under a temporary name beside the final path and
// renamed when it is complete, so a crashed run never leaves a file that
// poses as a complete report.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

#include "src/report/table.hpp"

namespace strata::report {

// "HDF5 1.10.8" (the library's, as loaded).
std::string hdf5_version();

class H5File {
 public:
  // Collective. Creates the parent directory if needed and the temporary
  // file "<final_path><temp_suffix>". Throws a runtime error naming the path
  // if the file cannot be created.
  H5File(MPI_Comm comm, const std::string& final_path, const std::string& temp_suffix = ".partial");
  // Closes and removes the temporary file if never published. (If publish()
  // closed the file but could not rename it, the complete temporary file is
  // kept and publish() threw an error naming it.) After a failed write, or
  // while the rank unwinds from an error, it closes nothing: the file stays
  // open under its temporary name (files_left_open()).
  ~H5File();
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  // Attributes on an object ("/" for the root, or a group path). Writing an
  // existing attribute replaces it (the status goes running -> complete).
  void set_attr(const std::string& object, const std::string& name, const std::string& value);
  void set_attr(const std::string& object, const std::string& name, std::int64_t value);
  void set_attr(const std::string& object, const std::string& name, double value);

  // Creates a group (and its parents) if it does not exist.
  void create_group(const std::string& path);

  // A scalar dataset "<group>/<name>" with attributes "unit" and "doc".
  void write_scalar(const std::string& group, const std::string& name, double value, const std::string& unit,
                    const std::string& doc);
  void write_scalar(const std::string& group, const std::string& name, const std::string& value,
                    const std::string& doc);

  // A 1-D float dataset "<group>/<name>" with a "shape" attribute giving the
  // logical shape; rank 0's data is written (used for weight exports).
  void write_array(const std::string& group, const std::string& name, const float* data, std::int64_t n,
                   const std::vector<std::int64_t>& shape);

  // The table as the 1-D compound dataset "/<table.name()>": every rank's
  // rows at the exclusive prefix sum of the row counts. Dataset attributes:
  // "doc", and per column "unit:<column>" and "doc:<column>".
  void write_table(const Table& table);
  // The same, but the dataset grows: the first call creates it (chunked,
  // without a limit), each later one of the same columns adds its rows after
  // those written before, every rank's at its exclusive-scan offset. A run
  // writes its per-step tables this way, a window of steps at a time.
  void append_table(const Table& table);

  // Writes HDF5's metadata and every buffered row to the temporary file, so
  // that it is a readable HDF5 file as of this call (a reader in another
  // process can open it until the next write changes it): a run calls it
  // after each window of steps.
  void flush();

  // Flushes, closes and renames the temporary file to the final path.
  void publish();

  const std::string& final_path() const { return final_path_; }
  // A call failed (on some rank; every rank knows): write nothing more.
  bool broken() const { return broken_; }

  // Reports this process left open after an agreed write error (see
  // ~H5File): the process must then end with std::_Exit, not MPI_Finalize.
  static int files_left_open() { return left_open_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  std::string final_path_, temp_path_;
  std::int64_t file_ = -1;  // hid_t
  bool published_ = false;
  bool broken_ = false;  // a call failed on some rank (all of them know it)
  static inline int left_open_ = 0;

  void put_table(const Table& table, bool append);
  template <typename Body>
  void together(const char* what, Body&& body);
  // Collective, before any collective HDF5 call of a write: refuses, on
  // every rank alike, a write of `bytes` that the file system (as rank 0
  // sees it) has no room for with kRoomMargin to spare. A disk that fills
  // inside HDF5's collective writes can fail on one rank while the others
  // wait in the same MPI-IO call: a hang no agreement afterwards can undo.
  void require_room(double bytes);
};

// Kept free beyond a table's rows for the metadata HDF5 writes with it and
// when it flushes.
inline constexpr double kRoomMargin = 1 << 20;

}  // namespace strata::report
