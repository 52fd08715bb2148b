// Table: typed columns and the per-column storage of one rank's rows. The
// checks here catch schema mistakes (wrong cell type, a string longer than its
// fixed width) where the row is added, not later inside the HDF5 writer.
#include "src/report/table.hpp"

#include "kernels/foundation/error.hpp"

namespace strata::report {

namespace {

const char* type_name(ColumnType t) {
  switch (t) {
    case ColumnType::i64: return "i64";
    case ColumnType::f64: return "f64";
    case ColumnType::str: return "str";
  }
  return "?";
}

// The cell's variant index matches ColumnType's order: int64, double, string.
ColumnType cell_type(const Cell& c) { return static_cast<ColumnType>(c.index()); }

}  // namespace

int Table::column_index(const std::string& name) const {
  for (std::size_t i = 0; i < columns_.size(); ++i)
    if (columns_[i].name == name) return static_cast<int>(i);
  return -1;
}

namespace {

void check_new_column(const Table& t, const std::string& name, std::size_t rows) {
  STRATA_CHECK(rows == 0, "table '{}': column '{}' added after rows", t.name(), name);
  STRATA_CHECK(!name.empty(), "table '{}': empty column name", t.name());
  // The "columns" attribute lists names separated by commas, and HDF5
  // member names are also attribute-name suffixes ("unit:<name>").
  STRATA_CHECK(name.find_first_of(",:/") == std::string::npos,
               "table '{}': column name '{}' contains ',', ':' or '/'", t.name(), name);
  STRATA_CHECK(t.column_index(name) < 0, "table '{}': duplicate column '{}'", t.name(), name);
}

}  // namespace

Table& Table::col_i64(const std::string& name, const std::string& unit, const std::string& doc) {
  check_new_column(*this, name, rows_);
  columns_.push_back({name, ColumnType::i64, unit, doc, 0});
  i64_.emplace_back();
  f64_.emplace_back();
  str_.emplace_back();
  return *this;
}

Table& Table::col_f64(const std::string& name, const std::string& unit, const std::string& doc) {
  check_new_column(*this, name, rows_);
  columns_.push_back({name, ColumnType::f64, unit, doc, 0});
  i64_.emplace_back();
  f64_.emplace_back();
  str_.emplace_back();
  return *this;
}

Table& Table::col_str(const std::string& name, int str_len, const std::string& unit, const std::string& doc) {
  check_new_column(*this, name, rows_);
  STRATA_CHECK(str_len > 0, "table '{}': column '{}' needs a positive string length, got {}", name_, name,
               str_len);
  columns_.push_back({name, ColumnType::str, unit, doc, str_len});
  i64_.emplace_back();
  f64_.emplace_back();
  str_.emplace_back();
  return *this;
}

void Table::add_row(const std::vector<Cell>& cells) {
  STRATA_CHECK(cells.size() == columns_.size(), "table '{}': row has {} cells, the table has {} columns", name_,
               cells.size(), columns_.size());
  // Check the whole row before storing any of it, so a bad row leaves the
  // table unchanged.
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const Column& col = columns_[i];
    STRATA_CHECK(cell_type(cells[i]) == col.type, "table '{}': column '{}' holds {}, got a {} cell", name_,
                 col.name, type_name(col.type), type_name(cell_type(cells[i])));
    if (col.type == ColumnType::str) {
      const auto& s = std::get<std::string>(cells[i]);
      STRATA_CHECK(s.size() <= static_cast<std::size_t>(col.str_len),
                   "table '{}': value '{}' of column '{}' is {} bytes, longer than its {}", name_, s, col.name,
                   s.size(), col.str_len);
      // Stored null-padded: an embedded NUL would silently cut the value.
      STRATA_CHECK(s.find('\0') == std::string::npos, "table '{}': value of column '{}' contains a NUL byte",
                   name_, col.name);
    }
  }
  for (std::size_t i = 0; i < cells.size(); ++i) {
    switch (columns_[i].type) {
      case ColumnType::i64: i64_[i].push_back(std::get<std::int64_t>(cells[i])); break;
      case ColumnType::f64: f64_[i].push_back(std::get<double>(cells[i])); break;
      case ColumnType::str: str_[i].push_back(std::get<std::string>(cells[i])); break;
    }
  }
  ++rows_;
}

}  // namespace strata::report
