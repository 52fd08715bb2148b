// The parallel write path of the report on 2 and 3 ranks: every rank writes a
// different number of rows (one rank none), and the published file holds them
// in rank order at the exclusive-scan offsets. Rank 0 reads the file back.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/mpi/mpi_world.hpp"
#include "src/report/h5file.hpp"
#include "src/report/table.hpp"

namespace fs = std::filesystem;
using strata::report::H5File;
using strata::report::Table;

namespace {

using strata::mpi_test::world_rank;
using strata::mpi_test::world_size;

// Every rank must name the same file: rank 0 picks it and broadcasts it.
fs::path shared_dir(const std::string& test) {
  long pid = getpid();
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  return fs::temp_directory_path() / ("strata-test-report-mpi-" + std::to_string(pid)) / test;
}

std::string tag(int rank, int row) { return fmt::format("r{}-{}", rank, row); }

// The rows of one rank, with values derived from the rank and the row index.
Table rank_table(int rank, int rows) {
  Table t("steps", "rows from every rank");
  t.col_i64("rank", "1", "MPI rank that wrote the row")
      .col_i64("row", "1", "row index on its rank")
      .col_f64("value", "s", "rank + row / 10")
      .col_str("tag", 12, "", "r<rank>-<row>");
  for (int i = 0; i < rows; ++i)
    t.add_row({std::int64_t{rank}, std::int64_t{i}, rank + i / 10.0, tag(rank, i)});
  return t;
}

struct Rows {
  std::vector<std::int64_t> rank, row;
  std::vector<double> value;
  std::vector<std::string> tag;
};

// The whole table read through a packed memory compound type.
Rows read_rows(const fs::path& path, std::string* columns) {
  Rows out;
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(file, 0);
  if (file < 0) return out;
  hid_t dset = H5Dopen2(file, "/steps", H5P_DEFAULT);
  hid_t space = H5Dget_space(dset);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);

  struct Row {
    std::int64_t rank, row;
    double value;
    char tag[12];
  };
  hid_t str = H5Tcopy(H5T_C_S1);
  H5Tset_size(str, 12);
  H5Tset_strpad(str, H5T_STR_NULLPAD);
  hid_t mem = H5Tcreate(H5T_COMPOUND, sizeof(Row));
  H5Tinsert(mem, "rank", HOFFSET(Row, rank), H5T_NATIVE_INT64);
  H5Tinsert(mem, "row", HOFFSET(Row, row), H5T_NATIVE_INT64);
  H5Tinsert(mem, "value", HOFFSET(Row, value), H5T_NATIVE_DOUBLE);
  H5Tinsert(mem, "tag", HOFFSET(Row, tag), str);
  std::vector<Row> rows(n);
  if (n > 0) {
    EXPECT_GE(H5Dread(dset, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()), 0);
  }
  for (const Row& r : rows) {
    out.rank.push_back(r.rank);
    out.row.push_back(r.row);
    out.value.push_back(r.value);
    out.tag.push_back(std::string(r.tag, strnlen(r.tag, sizeof r.tag)));
  }

  hid_t attr = H5Aopen(dset, "columns", H5P_DEFAULT);
  hid_t atype = H5Aget_type(attr);
  char* names = nullptr;  // a variable-length UTF-8 string
  H5Aread(attr, atype, &names);
  *columns = names != nullptr ? names : "";
  H5free_memory(names);
  H5Tclose(atype);
  H5Aclose(attr);
  H5Tclose(mem);
  H5Tclose(str);
  H5Sclose(space);
  H5Dclose(dset);
  H5Fclose(file);
  return out;
}

// Writes the table with rows_of(r) rows on rank r and checks the file on
// rank 0; the other ranks only take part in the collective calls.
template <typename RowsOf>
void write_and_check(const std::string& test, RowsOf rows_of) {
  const int rank = world_rank(), size = world_size();
  const fs::path path = shared_dir(test) / "run.h5";
  {
    H5File f(MPI_COMM_WORLD, path.string());
    f.set_attr("/", "status", std::string("running"));
    f.write_table(rank_table(rank, rows_of(rank)));
    f.set_attr("/", "status", std::string("complete"));
    f.publish();
  }
  if (rank == 0) {
    EXPECT_TRUE(fs::exists(path));
    EXPECT_FALSE(fs::exists(path.string() + ".partial"));
    std::string columns;
    const Rows got = read_rows(path, &columns);
    EXPECT_EQ(columns, "rank,row,value,tag");

    Rows want;
    for (int r = 0; r < size; ++r) {
      for (int i = 0; i < rows_of(r); ++i) {
        want.rank.push_back(r);
        want.row.push_back(i);
        want.value.push_back(r + i / 10.0);
        want.tag.push_back(tag(r, i));
      }
    }
    EXPECT_EQ(got.rank, want.rank);
    EXPECT_EQ(got.row, want.row);
    EXPECT_EQ(got.value, want.value);
    EXPECT_EQ(got.tag, want.tag);
    fs::remove_all(path.parent_path().parent_path());
  }
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0's checks and cleanup finish before the next test
}

}  // namespace

TEST(ReportMpi, RowsLandAtExclusiveScanOffsets) {
  // Rank r writes r + 1 rows: rank r's first row sits at r(r+1)/2.
  write_and_check("uneven", [](int r) { return r + 1; });
}

TEST(ReportMpi, RankWithoutRows) {
  // The middle rank (rank 1) writes nothing; rank 0 writes 2, the last writes 3.
  write_and_check("one_empty", [](int r) { return r == 1 ? 0 : (r == 0 ? 2 : 3); });
}

TEST(ReportMpi, NoRowsAnywhere) {
  write_and_check("all_empty", [](int) { return 0; });
}

TEST(ReportMpi, UnpublishedFileIsRemoved) {
  const fs::path path = shared_dir("crashed") / "run.h5";
  {
    H5File f(MPI_COMM_WORLD, path.string());
    f.write_table(rank_table(world_rank(), 2));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path.string() + ".partial"));
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(path.parent_path().parent_path());
  MPI_Barrier(MPI_COMM_WORLD);
}
