// Deck keys: what a deck may say. Each key carries its type, range or allowed
// values, a one-line doc and how it reads from and writes into the Plan. The
// table of them (key_table) is the keys of the whole run (global_keys: run,
// the model's shape, data, optim, backend), those each model family's row
// declares (models/model.hpp) and those each strategy's row declares
// (strategies/registry.hpp); the parser, the docs and describe_keys() all
// read it, so adding a key is adding one entry where it belongs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <type_traits>
#include <utility>

#include "plan/plan.hpp"

namespace strata::plan {

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
  void (*set)(Plan&, const Value&) = nullptr;
  Value (*get)(const Plan&) = nullptr;

  std::string full_name() const { return std::string(section) + "." + std::string(name); }

  // Builders used by the table (each returns a modified copy).
  KeySpec at_least(double lo) const;
  KeySpec above(double lo) const;
  KeySpec between(double lo, double hi) const;        // lo <= v <= hi
  KeySpec from_below(double lo, double hi) const;     // lo <= v < hi
  KeySpec one_of(std::vector<std::string_view> values, std::vector<std::string_view> not_yet = {}) const;
  KeySpec as_bytes() const;
};

// Binds a key to one field of the Plan, so no key needs a hand-written
// setter: key<&Plan::model, &ModelSection::layers>("model", "layers", doc).
// A field of a Choice type (an enum, a registry row) is a string key whose
// allowed values are the choice's names.
template <typename T>
concept Chosen = requires(T v) { Choice<T>::names(); };

template <auto section_member, auto field_member>
struct Field {
  using SectionT = std::remove_cvref_t<decltype(std::declval<Plan&>().*section_member)>;
  using T = std::remove_cvref_t<decltype(std::declval<SectionT&>().*field_member)>;

  static constexpr KeyType natural_type() {
    if constexpr (std::is_same_v<T, int>) return KeyType::integer;
    else if constexpr (std::is_same_v<T, std::uint64_t>) return KeyType::unsigned_;
    else if constexpr (std::is_same_v<T, double>) return KeyType::floating;
    else if constexpr (std::is_same_v<T, bool>) return KeyType::boolean;
    else {
      static_assert(std::is_same_v<T, std::string> || Chosen<T>,
                    "a deck key must be int, uint64, double, bool, string or a Choice");
      return KeyType::string;
    }
  }

  static void set(Plan& c, const Value& v) {
    T& f = (c.*section_member).*field_member;
    // check_value has already proven the value fits the field.
    if constexpr (std::is_same_v<T, int>) f = static_cast<int>(std::get<std::int64_t>(v));
    else if constexpr (std::is_same_v<T, std::uint64_t>) f = std::get<std::uint64_t>(v);
    else if constexpr (std::is_same_v<T, double>) f = std::get<double>(v);
    else if constexpr (std::is_same_v<T, bool>) f = std::get<bool>(v);
    else if constexpr (std::is_same_v<T, std::string>) f = std::get<std::string>(v);
    else {
      const auto names = Choice<T>::names();
      const auto it = std::find(names.begin(), names.end(), std::get<std::string>(v));
      f = Choice<T>::at(std::size_t(it - names.begin()));
    }
  }

  static Value get(const Plan& c) {
    const T& f = (c.*section_member).*field_member;
    if constexpr (std::is_same_v<T, int>) return Value(static_cast<std::int64_t>(f));
    else if constexpr (Chosen<T>) return Value(std::string(name_of(f)));
    else return Value(f);
  }
};

template <auto section_member, auto field_member>
KeySpec key(std::string_view section, std::string_view name, std::string_view doc) {
  using F = Field<section_member, field_member>;
  KeySpec k;
  k.section = section;
  k.name = name;
  k.type = F::natural_type();
  k.doc = doc;
  k.set = &F::set;
  k.get = &F::get;
  if constexpr (Chosen<typename F::T>) k.allowed = Choice<typename F::T>::names();
  return k;
}

// The keys of the whole run, not of one family or strategy: [run], the
// [model] shape every family has (layers, d_model, heads, vocab, seq_len),
// [data], [optim], [backend].
const std::vector<KeySpec>& global_keys();
// Every key: model.kind, global_keys(), the families' and every registry
// row's, grouped by section in the order the docs and resolved decks use.
// These three are defined where the rows are (strategies/registry.cpp).
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

// A key's value from its plain text ("4", "true", "1f1b"; bytes as a count):
// what the layout search's rows offer. The text must be one (a program's
// own value, not input): check_value judges it afterwards.
Value value_of(const KeySpec& key, const std::string& text);

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

}  // namespace strata::plan
