// Decks: TOML input files that describe a run. A deck is parsed, overridden by
// `--set section.key=value`, and validated against one table of known keys
// (types, defaults, allowed values, ranges: the global keys and the
// strategies' registry rows', strategies/keys.hpp) into a typed plan; then
// the global cross-key checks and every row's run. Any error names the file,
// line, key, what was expected and what is allowed, and is an input error
// (exit 2).
#pragma once

#include <string>
#include <vector>

#include <toml++/toml.h>

#include "plan/plan.hpp"

namespace strata::deck {

struct Deck {
  std::string path;                     // where the text came from
  std::string text;                     // the deck exactly as read
  std::vector<std::string> overrides;   // "section.key=value", in order
  plan::Plan config;                    // resolved and validated
  std::string resolved_toml;            // every key with its final value, as TOML
};

// The bytes of a deck file or pipe (`<(...)`, /dev/stdin); bad input (exit
// 2) if it is neither (a directory, a device) or cannot be read.
std::string read_deck_text(const std::string& path);
// Whether `name` can name one file of a directory (run.name, sweep.name name
// results/<name>...): not empty, not "." or "..", no '/', NUL or other
// control characters but tab.
bool is_file_name(const std::string& name);
// Reads the file (input error if it cannot be read) and resolves it.
Deck load_deck(const std::string& path, const std::vector<std::string>& overrides);
// Same, from text already in memory (what other ranks do after a broadcast).
Deck parse_deck(const std::string& path, const std::string& text, const std::vector<std::string>& overrides);

// TOML text as a table; a syntax error is bad input naming path, line and
// column (decks and machine descriptions alike).
toml::table parse_toml(const std::string& path, const std::string& text);

// The documented key table, one line per key: "section.key  type  default  allowed  doc".
std::vector<std::string> describe_keys();

}  // namespace strata::deck
