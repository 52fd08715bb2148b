// A report table: a flat, typed, column-described list of rows that one rank
// collects during a run. The HDF5 writer turns it into a 1-D compound dataset
// whose columns carry their unit and meaning as attributes, and where every
// rank's rows land at an exclusive-scan offset (so nothing is gathered).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace strata::report {

enum class ColumnType { i64, f64, str };

struct Column {
  std::string name;
  ColumnType type;
  std::string unit;   // "s", "B", "tokens/s", "1" for a count or a pure number
  std::string doc;    // one line: what the column holds
  int str_len = 0;    // fixed length of a str column, in bytes (longer values are an error)
};

using Cell = std::variant<std::int64_t, double, std::string>;

class Table {
 public:
  Table(std::string name, std::string doc) : name_(std::move(name)), doc_(std::move(doc)) {}

  Table& col_i64(const std::string& name, const std::string& unit, const std::string& doc);
  Table& col_f64(const std::string& name, const std::string& unit, const std::string& doc);
  Table& col_str(const std::string& name, int str_len, const std::string& unit, const std::string& doc);

  // One cell per column, in column order, of the column's type (int64 for
  // i64, double for f64, string for str). A mismatch is a bug: STRATA_CHECK.
  void add_row(const std::vector<Cell>& cells);

  const std::string& name() const { return name_; }
  const std::string& doc() const { return doc_; }
  const std::vector<Column>& columns() const { return columns_; }
  std::size_t num_rows() const { return rows_; }

  // Column storage, for the writer and for tests.
  const std::vector<std::int64_t>& i64(int col) const { return i64_[col]; }
  const std::vector<double>& f64(int col) const { return f64_[col]; }
  const std::vector<std::string>& str(int col) const { return str_[col]; }
  int column_index(const std::string& name) const;  // -1 if absent

 private:
  std::string name_, doc_;
  std::vector<Column> columns_;
  // Indexed by column; only the vector matching a column's type is used.
  std::vector<std::vector<std::int64_t>> i64_;
  std::vector<std::vector<double>> f64_;
  std::vector<std::vector<std::string>> str_;
  std::size_t rows_ = 0;
};

}  // namespace strata::report
