// The table of known deck keys: the single source of truth for what a deck may
// say. Each entry carries its type, range or allowed values, a one-line doc and
// how it reads from and writes into Config; the parser, the docs and
// describe_keys() all read this table, so adding a key is adding one entry.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "src/deck/config.hpp"

namespace strata::deck {

enum class KeyType {
  integer,    // a 32-bit int field
  unsigned_,  // a uint64 field, written as a non-negative TOML integer
  bytes,      // a uint64 byte count: an integer, or a string such as "512MiB"
  floating,   // a double; a TOML integer is accepted too
  boolean,
  string,
};

// A value once it has the key's type: integer -> int64, unsigned_/bytes ->
// uint64, floating -> double, boolean -> bool, string -> string.
using Value = std::variant<std::int64_t, std::uint64_t, double, bool, std::string>;

// An interval on numbers; open ends exclude the bound ("lr > 0", "beta < 1").
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;
};

struct KeySpec {
  std::string_view section;
  std::string_view name;
  KeyType type = KeyType::integer;
  std::string_view doc;
  Range range;                            // numbers only
  std::vector<std::string_view> allowed;  // strings only; empty: any string
  std::vector<std::string_view> later;    // known values this build cannot run yet
  void (*set)(Config&, const Value&) = nullptr;
  Value (*get)(const Config&) = nullptr;

  std::string full_name() const { return std::string(section) + "." + std::string(name); }

  // Builders used by the table (each returns a modified copy).
  KeySpec at_least(double lo) const;
  KeySpec above(double lo) const;
  KeySpec between(double lo, double hi) const;        // lo <= v <= hi
  KeySpec from_below(double lo, double hi) const;     // lo <= v < hi
  KeySpec one_of(std::vector<std::string_view> values, std::vector<std::string_view> not_yet = {}) const;
  KeySpec as_bytes() const;
};

// Every key, grouped by section in the order the docs and resolved decks use.
const std::vector<KeySpec>& key_table();
// The sections, in table order, without repeats.
std::vector<std::string_view> section_names();
const KeySpec* find_key(std::string_view section, std::string_view name);

// Checks a typed value against the key's range or allowed values; returns why
// it is refused ("must be >= 1, got 0") or nothing when it is fine.
std::optional<std::string> check_value(const KeySpec& key, const Value& value);

// "512MiB", "2GiB", "1.5GB", "0", "100 KB": B, KB/MB/GB/TB (powers of 1000),
// KiB/MiB/GiB/TiB (powers of 1024), case-insensitive; fractions round down to a
// whole byte. Returns why the text is refused when it is not a size.
std::variant<std::uint64_t, std::string> parse_bytes(std::string_view text);

// The value as a TOML literal (strings quoted and escaped, floats always with a
// '.' or an exponent so they stay floats).
std::string toml_literal(const Value& value);
std::string toml_quote(std::string_view text);

// Words for messages and docs.
std::string_view type_name(KeyType type);            // "int", "float", ...
std::string expected_phrase(KeyType type);            // "an integer", ...
std::string describe_allowed(const KeySpec& key);     // ">= 1", "\"cpu\" (later \"cuda\")", "any"

// Edit distance, and the closest of `known` to `name` (distance <= 2, else a
// prefix either way), for "did you mean" hints.
std::size_t edit_distance(std::string_view a, std::string_view b);
std::optional<std::string> closest_name(std::string_view name, const std::vector<std::string>& known);

}  // namespace strata::deck
