// Unit tests of the report layer on one rank: Table's checks, and H5File's
// files read back with plain HDF5 calls (as any reader would), including the
// temporary-name-then-rename rule. Runs under tests/mpi/mpi_main.cpp.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/foundation/error.hpp"
#include "src/report/h5file.hpp"
#include "src/report/table.hpp"
#include "tests/h5_read.hpp"

namespace fs = std::filesystem;
using strata::core::Error;
using strata::report::Cell;
using strata::report::ColumnType;
using strata::report::H5File;
using strata::report::Table;
using namespace strata::h5_test;

namespace {

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata-test-report-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

Table sample_table() {
  Table t("steps", "one row per training step");
  t.col_i64("rank", "1", "MPI rank that wrote the row")
      .col_f64("time", "s", "wall time of the step")
      .col_str("op", 8, "", "what ran");
  t.add_row({std::int64_t{0}, 0.5, std::string("fwd")});
  t.add_row({std::int64_t{0}, 1.25, std::string("backward")});  // exactly 8 bytes: no terminator needed
  t.add_row({std::int64_t{0}, -3.0, std::string("")});
  return t;
}

}  // namespace

// ---- Table ----

TEST(ReportTable, StoresColumnsAndRows) {
  Table t = sample_table();
  EXPECT_EQ(t.name(), "steps");
  ASSERT_EQ(t.columns().size(), 3u);
  EXPECT_EQ(t.columns()[2].type, ColumnType::str);
  EXPECT_EQ(t.columns()[2].str_len, 8);
  EXPECT_EQ(t.columns()[1].unit, "s");
  EXPECT_EQ(t.num_rows(), 3u);
  EXPECT_EQ(t.column_index("time"), 1);
  EXPECT_EQ(t.column_index("nope"), -1);
  EXPECT_EQ(t.f64(1), (std::vector<double>{0.5, 1.25, -3.0}));
  EXPECT_EQ(t.str(2), (std::vector<std::string>{"fwd", "backward", ""}));
}

TEST(ReportTable, RejectsBadRows) {
  Table t = sample_table();
  // Wrong type: an int where a double belongs, a double where an int64 belongs.
  EXPECT_THROW(t.add_row({std::int64_t{0}, std::int64_t{1}, std::string("x")}), Error);
  EXPECT_THROW(t.add_row({1.0, 1.0, std::string("x")}), Error);
  EXPECT_THROW(t.add_row({std::int64_t{0}, 1.0}), Error);  // too few cells
  try {
    t.add_row({std::int64_t{0}, 1.0, std::string("too long!")});
    ADD_FAILURE() << "a 9-byte value in an 8-byte column was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), strata::core::ErrorKind::runtime);
    EXPECT_NE(std::string(e.what()).find("op"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.num_rows(), 3u);  // rejected rows leave the table unchanged
  EXPECT_EQ(t.i64(0).size(), 3u);
}

TEST(ReportTable, RejectsBadColumns) {
  Table t("t", "doc");
  t.col_i64("a", "1", "a");
  EXPECT_THROW(t.col_f64("a", "1", "again"), Error);
  EXPECT_THROW(t.col_f64("b,c", "1", "comma"), Error);
  EXPECT_THROW(t.col_str("s", 0, "1", "no width"), Error);
  t.add_row({std::int64_t{1}});
  EXPECT_THROW(t.col_f64("late", "1", "after rows"), Error);
}

// ---- H5File ----

TEST_F(ReportTest, TableRoundTrip) {
  const fs::path path = dir_ / "run.h5";
  {
    H5File f(MPI_COMM_WORLD, path.string());
    EXPECT_EQ(f.temp_path(), path.string() + ".partial");
    f.set_attr("/", "status", std::string("running"));
    f.write_table(sample_table());
    EXPECT_TRUE(fs::exists(f.temp_path()));
    EXPECT_FALSE(fs::exists(path));
    f.publish();
    EXPECT_FALSE(fs::exists(f.temp_path()));
    EXPECT_TRUE(fs::exists(path));
  }
  EXPECT_TRUE(fs::exists(path));  // the destructor leaves a published file alone

  ReadFile file(path);
  ASSERT_GE(file.id, 0);
  Object dset(file.id, "/steps");
  ASSERT_GE(dset.id, 0);
  EXPECT_EQ(num_rows(dset.id), 3u);
  EXPECT_EQ(read_i64(dset.id, "rank"), (std::vector<std::int64_t>{0, 0, 0}));
  EXPECT_EQ(read_f64(dset.id, "time"), (std::vector<double>{0.5, 1.25, -3.0}));
  EXPECT_EQ(read_str(dset.id, "op", 8), (std::vector<std::string>{"fwd", "backward", ""}));

  EXPECT_EQ(read_str_attr(dset.id, "doc"), "one row per training step");
  EXPECT_EQ(read_str_attr(dset.id, "columns"), "rank,time,op");
  EXPECT_EQ(read_str_attr(dset.id, "unit:time"), "s");
  EXPECT_EQ(read_str_attr(dset.id, "unit:rank"), "1");
  EXPECT_EQ(read_str_attr(dset.id, "doc:op"), "what ran");
  EXPECT_EQ(read_str_attr(dset.id, "unit:op"), "");  // strings have no unit

  // The file type is packed, little-endian and fixed-width.
  hid_t type = H5Dget_type(dset.id);
  EXPECT_EQ(H5Tget_class(type), H5T_COMPOUND);
  EXPECT_EQ(H5Tget_size(type), 8u + 8u + 8u);
  ASSERT_EQ(H5Tget_nmembers(type), 3);
  EXPECT_EQ(H5Tget_member_offset(type, 2), 16u);
  hid_t op = H5Tget_member_type(type, 2);
  EXPECT_EQ(H5Tget_class(op), H5T_STRING);
  EXPECT_EQ(H5Tget_strpad(op), H5T_STR_NULLPAD);
  H5Tclose(op);
  H5Tclose(type);
}

TEST_F(ReportTest, EmptyTable) {
  const fs::path path = dir_ / "empty.h5";
  {
    H5File f(MPI_COMM_WORLD, path.string());
    Table t("comm", "no communication happened");
    t.col_i64("rank", "1", "rank").col_str("op", 16, "", "collective");
    f.write_table(t);
    f.publish();
  }
  ReadFile file(path);
  Object dset(file.id, "/comm");
  ASSERT_GE(dset.id, 0);
  EXPECT_EQ(num_rows(dset.id), 0u);
  EXPECT_EQ(read_str_attr(dset.id, "columns"), "rank,op");
  EXPECT_EQ(read_str_attr(dset.id, "doc:op"), "collective");
}

TEST_F(ReportTest, UnpublishedFileIsRemoved) {
  const fs::path path = dir_ / "crashed.h5";
  {
    H5File f(MPI_COMM_WORLD, path.string());
    f.set_attr("/", "status", std::string("running"));
    f.write_table(sample_table());
    EXPECT_TRUE(fs::exists(f.temp_path()));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path.string() + ".partial"));
}

TEST_F(ReportTest, AttributesAreReplaced) {
  const fs::path path = dir_ / "status.h5";
  {
    H5File f(MPI_COMM_WORLD, path.string());
    f.set_attr("/", "status", std::string("running"));
    f.set_attr("/", "status", std::string("complete"));  // longer: a new type, not an overwrite
    f.set_attr("/", "status", std::string("failed"));    // shorter
    f.set_attr("/", "empty", std::string(""));
    f.set_attr("/", "host", std::string("n\u0153ud-\u00e9"));  // UTF-8 bytes pass through unchanged
    f.set_attr("/", "world", std::int64_t{4});
    f.set_attr("/", "world", std::int64_t{-7});
    f.set_attr("/", "peak", 1.5e12);
    f.set_attr("/", "peak", 2.5);
    f.set_attr("/", "changes_type", std::int64_t{1});
    f.set_attr("/", "changes_type", std::string("now a string"));
    f.create_group("/provenance/host");
    f.set_attr("/provenance", "version", std::string("0.1.0"));
    f.publish();
  }
  ReadFile file(path);
  Object root(file.id, "/");
  EXPECT_EQ(read_str_attr(root.id, "status"), "failed");
  EXPECT_EQ(read_str_attr(root.id, "empty"), "");
  EXPECT_EQ(read_str_attr(root.id, "host"), "n\u0153ud-\u00e9");
  EXPECT_EQ(read_i64_attr(root.id, "world"), -7);
  EXPECT_EQ(read_f64_attr(root.id, "peak"), 2.5);
  EXPECT_EQ(read_str_attr(root.id, "changes_type"), "now a string");
  Object prov(file.id, "/provenance");
  ASSERT_GE(prov.id, 0);
  EXPECT_EQ(read_str_attr(prov.id, "version"), "0.1.0");
  Object host(file.id, "/provenance/host");
  EXPECT_GE(host.id, 0);

  // Attribute types as documented: int64 and double little-endian, strings
  // variable-length UTF-8 (h5py reads str).
  hid_t attr = H5Aopen(root.id, "world", H5P_DEFAULT);
  hid_t type = H5Aget_type(attr);
  EXPECT_GT(H5Tequal(type, H5T_STD_I64LE), 0);
  H5Tclose(type);
  H5Aclose(attr);
  attr = H5Aopen(root.id, "host", H5P_DEFAULT);
  type = H5Aget_type(attr);
  EXPECT_GT(H5Tis_variable_str(type), 0);
  EXPECT_EQ(H5Tget_cset(type), H5T_CSET_UTF8);
  H5Tclose(type);
  H5Aclose(attr);
}

TEST_F(ReportTest, CreateGroupIsIdempotent) {
  const fs::path path = dir_ / "groups.h5";
  H5File f(MPI_COMM_WORLD, path.string());
  f.create_group("/");
  f.create_group("a/b/c");
  f.create_group("/a/b");
  f.create_group("/a/b/c/");
  f.write_scalar("/a", "x", 1.0, "1", "a number");
  EXPECT_THROW(f.create_group("/a/x"), Error);  // a dataset is not a group
  EXPECT_THROW(f.create_group("/a/x/y"), Error);
  f.publish();
}

TEST_F(ReportTest, ScalarsAndArraysRoundTrip) {
  const fs::path path = dir_ / "arrays.h5";
  const std::vector<float> w = {1.0f, -2.5f, 3.25f, 0.0f, 1e-8f, 7.0f};
  {
    H5File f(MPI_COMM_WORLD, path.string());
    f.write_scalar("/summary", "tokens_per_s", 12345.5, "tokens/s", "median throughput");
    f.write_scalar("/", "deck", std::string("[model]\nlayers = 2\n"), "the deck as given");
    f.write_array("/weights", "wte", w.data(), 6, {2, 3});
    f.write_array("/weights", "none", nullptr, 0, {0, 4});
    EXPECT_THROW(f.write_array("/weights", "bad", w.data(), 6, {4, 2}), Error);
    f.publish();
  }
  ReadFile file(path);
  {
    Object d(file.id, "/summary/tokens_per_s");
    ASSERT_GE(d.id, 0);
    double v = 0;
    EXPECT_GE(H5Dread(d.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v), 0);
    EXPECT_EQ(v, 12345.5);
    EXPECT_EQ(read_str_attr(d.id, "unit"), "tokens/s");
    EXPECT_EQ(read_str_attr(d.id, "doc"), "median throughput");
  }
  {
    Object d(file.id, "/deck");
    ASSERT_GE(d.id, 0);
    hid_t type = H5Dget_type(d.id);
    std::string v(H5Tget_size(type) + 1, '\0');
    EXPECT_GE(H5Dread(d.id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
    H5Tclose(type);
    EXPECT_EQ(v.substr(0, v.find('\0')), "[model]\nlayers = 2\n");
    EXPECT_EQ(read_str_attr(d.id, "doc"), "the deck as given");
  }
  {
    Object d(file.id, "/weights/wte");
    ASSERT_GE(d.id, 0);
    EXPECT_EQ(num_rows(d.id), 6u);
    std::vector<float> back(6);
    EXPECT_GE(H5Dread(d.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, back.data()), 0);
    EXPECT_EQ(back, w);
    hid_t attr = H5Aopen(d.id, "shape", H5P_DEFAULT);
    std::vector<std::int64_t> shape(2);
    H5Aread(attr, H5T_NATIVE_INT64, shape.data());
    H5Aclose(attr);
    EXPECT_EQ(shape, (std::vector<std::int64_t>{2, 3}));
  }
  {
    Object d(file.id, "/weights/none");
    ASSERT_GE(d.id, 0);
    EXPECT_EQ(num_rows(d.id), 0u);
  }
}

TEST_F(ReportTest, CreatesParentDirectory) {
  const fs::path path = dir_ / "results" / "deep" / "run.h5";
  H5File f(MPI_COMM_WORLD, path.string());
  f.publish();
  EXPECT_TRUE(fs::exists(path));
}

TEST_F(ReportTest, ErrorsNameTheProblem) {
  // The parent "directory" is a regular file: nothing can be created there.
  std::ofstream(dir_ / "file") << "x";
  try {
    H5File f(MPI_COMM_WORLD, (dir_ / "file" / "run.h5").string());
    ADD_FAILURE() << "created a report under a regular file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.h5"), std::string::npos) << e.what();
  }

  H5File f(MPI_COMM_WORLD, (dir_ / "ok.h5").string());
  try {
    f.set_attr("/no/such/group", "x", std::int64_t{1});
    ADD_FAILURE() << "set an attribute on a missing object";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), strata::core::ErrorKind::runtime);
    EXPECT_NE(std::string(e.what()).find("/no/such/group"), std::string::npos) << e.what();
  }
  f.write_table(sample_table());
  EXPECT_THROW(f.write_table(sample_table()), Error);  // the name is taken
  f.publish();
  EXPECT_THROW(f.publish(), Error);
  EXPECT_THROW(f.set_attr("/", "late", std::int64_t{1}), Error);
}

TEST_F(ReportTest, RenameFailureKeepsTheCompleteFile) {
  // The final path is an existing directory, so the rename must fail.
  const fs::path path = dir_ / "taken";
  fs::create_directories(path / "inside");
  {
    H5File f(MPI_COMM_WORLD, path.string());
    f.set_attr("/", "status", std::string("complete"));
    EXPECT_THROW(f.publish(), Error);
  }
  EXPECT_TRUE(fs::exists(path.string() + ".partial"));
  EXPECT_TRUE(fs::is_directory(path));
}
