// Deck parsing and validation: TOML text -> typed keys (via the key table) ->
// --set overrides -> cross-key checks -> what this build can run. Every error
// names where the value came from (FILE:LINE or the --set text) and the key.
#include "src/deck/deck.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "kernels/foundation/error.hpp"
#include "kernels/foundation/input_file.hpp"
#include "kernels/foundation/memory.hpp"
#include "models/model.hpp"
#include "plan/keys.hpp"
#include "strategies/registry.hpp"

namespace strata::deck {
namespace fs = std::filesystem;
using namespace plan;

namespace {

std::string trim(std::string_view s) {
  const char* ws = " \t\r\n";
  auto b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  auto e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string describe_node(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "string " + toml_quote(*n.value<std::string>());
    case toml::node_type::integer: return fmt::format("integer {}", *n.value<std::int64_t>());
    case toml::node_type::floating_point: return "float " + toml_literal(*n.value<double>());
    case toml::node_type::boolean: return *n.value<bool>() ? "boolean true" : "boolean false";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

// The node as the key's type, or why it is not one ("expects an integer, got ...").
std::variant<Value, std::string> typed_value(const KeySpec& key, const toml::node& node) {
  auto mismatch = [&] { return fmt::format("expects {}, got {}", expected_phrase(key.type), describe_node(node)); };
  switch (key.type) {
    case KeyType::integer:
      // A float is refused even when whole (4.0): a count written as a float is
      // usually a slip, and silently truncating 4.5 would be worse.
      if (auto v = node.value_exact<std::int64_t>()) return Value(*v);
      return mismatch();
    case KeyType::unsigned_:
      if (auto v = node.value_exact<std::int64_t>()) {
        if (*v < 0) return fmt::format("must be >= 0, got {}", *v);
        return Value(static_cast<std::uint64_t>(*v));
      }
      return mismatch();
    case KeyType::bytes:
      if (auto v = node.value_exact<std::int64_t>()) {
        if (*v < 0) return fmt::format("must be >= 0, got {}", *v);
        return Value(static_cast<std::uint64_t>(*v));
      }
      if (auto s = node.value_exact<std::string>()) {
        auto bytes = parse_bytes(*s);
        if (auto* n = std::get_if<std::uint64_t>(&bytes)) return Value(*n);
        return "expects a byte count: " + std::get<std::string>(bytes);
      }
      return mismatch();
    case KeyType::floating:
      if (auto v = node.value_exact<double>()) return Value(*v);
      if (auto v = node.value_exact<std::int64_t>()) return Value(static_cast<double>(*v));
      return mismatch();
    case KeyType::boolean:
      if (auto v = node.value_exact<bool>()) return Value(*v);
      return mismatch();
    case KeyType::string:
      if (auto v = node.value_exact<std::string>()) return Value(*v);
      return mismatch();
  }
  return mismatch();
}

std::vector<std::string> names_in_section(std::string_view section) {
  std::vector<std::string> out;
  for (const KeySpec& k : key_table())
    if (k.section == section) out.emplace_back(k.name);
  return out;
}

std::vector<std::string> all_sections() {
  std::vector<std::string> out;
  for (std::string_view s : section_names()) out.emplace_back(s);
  return out;
}

std::vector<std::string> all_full_names() {
  std::vector<std::string> out;
  for (const KeySpec& k : key_table()) out.push_back(k.full_name());
  return out;
}

// Sections that have a key of this name ("steps" -> "run").
std::vector<std::string> sections_with_key(std::string_view name) {
  std::vector<std::string> out;
  for (const KeySpec& k : key_table())
    if (k.name == name) out.emplace_back(k.section);
  return out;
}

// Builds a Plan from defaults, the deck and overrides, collecting every error
// so that one run of the tool reports all the mistakes in a deck at once.
class Resolver : public plan::PlanChecks {
 public:
  explicit Resolver(std::string path) : path_(std::move(path)) {}

  Plan config;

  void apply_file(const toml::table& root);
  void apply_override(const std::string& text, int index);
  void check_cross_keys();
  void check_sizes();
  void check_text_source();
  void throw_if_errors();

  // Where a key's value came from, inside a message that already names the
  // file: "line 7", "--set model.heads=8" or "default".
  std::string at(const std::string& key) const {
    auto it = origin_.find(key);
    if (it == origin_.end()) return "default";
    return it->second.line ? fmt::format("line {}", it->second.line) : it->second.where;
  }
  // The place to start a message about several keys ("deck.toml:7" or the
  // --set text): the first of them that was set explicitly, else the file.
  std::string primary(const std::vector<std::string_view>& keys) const {
    for (std::string_view k : keys)
      if (auto it = origin_.find(std::string(k)); it != origin_.end()) return it->second.where;
    return path_;
  }
  // "model.heads = 8 (line 7)"
  std::string show(std::string_view key) const override {
    auto dot = key.find('.');
    const KeySpec* spec = find_key(key.substr(0, dot), key.substr(dot + 1));
    return fmt::format("{} = {} ({})", key, toml_literal(spec->get(config)), at(std::string(key)));
  }
  std::string show(const char* key) const { return show(std::string_view(key)); }
  void error(std::string msg) { add_error(kCrossPhase, cross_count_++, 0, std::move(msg)); }
  // A registry row's finding, placed at the first of its keys the deck sets.
  void error(const std::vector<std::string_view>& keys, std::string message) override {
    error(primary(keys) + ": " + message);
  }
  bool sized() const override { return sized_; }

 private:
  static constexpr int kFilePhase = 0, kOverridePhase = 1, kCrossPhase = 2;

  void add_error(int phase, long a, long b, std::string msg) {
    errors_.push_back({std::make_tuple(phase, a, b), std::move(msg)});
  }
  std::string file_where(const toml::source_region& src) const {
    return src.begin.line ? fmt::format("{}:{}", path_, src.begin.line) : path_;
  }
  void apply(const KeySpec& spec, const toml::node& node, const std::string& where, long line, int phase, long a,
             long b);
  void apply_section(std::string_view section, const toml::table& table);

  std::string path_;
  struct Origin {
    std::string where;  // "deck.toml:7" or "--set model.heads=8"
    long line = 0;      // 0 for an override
  };
  std::map<std::string, Origin> origin_;
  std::vector<std::pair<std::tuple<int, long, long>, std::string>> errors_;
  bool sized_ = false;  // the model's checks and size checks passed (sized())
  long cross_count_ = 0;
};

void Resolver::apply(const KeySpec& spec, const toml::node& node, const std::string& where, long line, int phase,
                     long a, long b) {
  auto typed = typed_value(spec, node);
  if (auto* why = std::get_if<std::string>(&typed)) {
    add_error(phase, a, b, fmt::format("{}: key '{}' {}", where, spec.full_name(), *why));
    return;
  }
  const Value& value = std::get<Value>(typed);
  if (auto why = check_value(spec, value)) {
    add_error(phase, a, b, fmt::format("{}: key '{}' {}", where, spec.full_name(), *why));
    return;
  }
  spec.set(config, value);
  origin_[spec.full_name()] = Origin{where, line};
}

void Resolver::apply_file(const toml::table& root) {
  const std::vector<std::string> sections = all_sections();
  for (auto&& [k, node] : root) {
    const std::string name(k.str());
    const toml::source_region& src = k.source();
    const std::string where = file_where(src);
    auto fail = [&](std::string msg) { add_error(kFilePhase, src.begin.line, src.begin.column, where + ": " + msg); };

    // [sweep] describes the points of a sweep (src/sweep); a run is the base point.
    if (name == "sweep") continue;
    if (std::find(sections.begin(), sections.end(), name) == sections.end()) {
      if (!node.is_table()) {
        // A key written above the first [section] header.
        std::vector<std::string> homes = sections_with_key(name);
        if (!homes.empty())
          fail(fmt::format("key '{}' is outside any section; it belongs under [{}]", name, homes.front()));
        else
          fail(fmt::format("key '{}' is outside any section; keys go under a [section]: {}", name, join(sections, ", ")));
      } else if (auto near = closest_name(name, sections)) {
        fail(fmt::format("unknown section '{}' (did you mean '{}'?)", name, *near));
      } else {
        fail(fmt::format("unknown section '{}'; known sections: {}", name, join(sections, ", ")));
      }
      continue;
    }
    if (!node.is_table()) {
      fail(fmt::format("'{}' must be a section ([{}]), got {}", name, name, describe_node(node)));
      continue;
    }
    apply_section(name, *node.as_table());
  }
}

void Resolver::apply_section(std::string_view section, const toml::table& table) {
  const std::vector<std::string> known = names_in_section(section);
  for (auto&& [k, node] : table) {
    const std::string name(k.str());
    const toml::source_region& src = k.source().begin.line ? k.source() : node.source();
    const std::string where = file_where(src);
    const KeySpec* spec = find_key(section, name);
    if (!spec) {
      std::string msg = fmt::format("{}: unknown key '{}.{}'", where, section, name);
      std::vector<std::string> homes = sections_with_key(name);
      if (auto near = closest_name(name, known))
        msg += fmt::format(" (did you mean '{}'?)", *near);
      else if (!homes.empty())
        msg += fmt::format(": '{}' belongs in [{}]", name, homes.front());
      else
        msg += fmt::format("; known keys in [{}]: {}", section, join(known, ", "));
      add_error(kFilePhase, src.begin.line, src.begin.column, std::move(msg));
      continue;
    }
    apply(*spec, node, where, src.begin.line, kFilePhase, src.begin.line, src.begin.column);
  }
}

void Resolver::apply_override(const std::string& text, int index) {
  const std::string where = "--set " + text;
  auto fail = [&](std::string msg) { add_error(kOverridePhase, index, 0, where + ": " + msg); };
  const auto eq = text.find('=');
  const std::string name = trim(text.substr(0, eq));
  if (eq == std::string::npos || name.empty()) {
    fail("expected section.key=value, e.g. --set model.layers=4");
    return;
  }
  const auto dot = name.find('.');
  const KeySpec* spec = dot == std::string::npos ? nullptr : find_key(name.substr(0, dot), name.substr(dot + 1));
  if (!spec) {
    std::string msg = fmt::format("unknown key '{}'", name);
    const std::vector<std::string> sections = all_sections();
    const std::string section = dot == std::string::npos ? "" : name.substr(0, dot);
    if (auto near = closest_name(name, all_full_names()))
      msg += fmt::format(" (did you mean '{}'?)", *near);
    else if (std::find(sections.begin(), sections.end(), section) != sections.end())
      msg += fmt::format("; known keys in [{}]: {}", section, join(names_in_section(section), ", "));
    else
      msg += fmt::format("; keys are written section.key, with sections {}", join(sections, ", "));
    fail(std::move(msg));
    return;
  }

  // The value is TOML when it parses as one (4, 1e-3, true, "quoted"); anything
  // else is taken as a bare string, so --set data.source=text works. A string
  // key takes the text as written even when it looks like a number or a bool
  // (--set run.name=2024 names the run "2024").
  const std::string raw = trim(text.substr(eq + 1));
  toml::table parsed;
  const toml::node* node = nullptr;
  try {
    parsed = toml::parse("x = " + raw);
    if (parsed.size() == 1) node = parsed.get("x");
  } catch (const toml::parse_error&) {
    node = nullptr;
  }
  toml::value<std::string> bare(raw);
  if (!node || (spec->type == KeyType::string && !node->is_string())) node = &bare;
  apply(*spec, *node, where, 0, kOverridePhase, index, 0);
}

// Sizes in long double before any is computed in integers: a deck whose
// counts would overflow them (or that no machine could hold) is bad input
// now, not a std::bad_alloc or a wrapped size later.
// Sizes in long double before any is computed in integers: a deck whose
// counts would overflow them (or that no machine could hold) is bad input
// now, not a std::bad_alloc or a wrapped size later.
void Resolver::check_sizes() {
  const Plan& c = config;
  using R = long double;
  const R params = models::family(c).parameters(c);
  // 2^53: counted exactly in a double; a thousand times the largest models
  // trained. Beyond it a deck is a typo, and int64 products of it overflow.
  constexpr R kMaxParams = R(std::uint64_t(1) << 53);
  if (params > kMaxParams)
    error(fmt::format("{}: the model would have {:.3g} parameters ({}, {}): more than 2^53, the most Strata counts",
                      primary({"model.layers", "model.d_model"}), double(params), show("model.layers"),
                      show("model.d_model")));
  // The largest buffer of a micro-batch: the attention scores B x heads x T x T.
  const R scores = R(c.data.micro_batch) * c.model.heads * c.model.seq_len * c.model.seq_len;
  if (scores > kMaxParams)
    error(fmt::format("{}: a micro-batch's attention scores would hold {:.3g} elements ({}, {}, {}): more than 2^53",
                      primary({"model.seq_len", "data.micro_batch"}), double(scores), show("data.micro_batch"),
                      show("model.heads"), show("model.seq_len")));
}

void Resolver::check_cross_keys() {
  const Plan& c = config;
  if (c.model.d_model % c.model.heads != 0)
    error(fmt::format("{}: {} is not a multiple of {}: each head takes d_model / heads channels",
                      primary({"model.d_model", "model.heads"}), show("model.d_model"), show("model.heads")));
  if (c.data.global_batch % c.data.micro_batch != 0)
    error(fmt::format("{}: {} is not a multiple of {}: a step accumulates global_batch / micro_batch micro-batches",
                      primary({"data.global_batch", "data.micro_batch"}), show("data.global_batch"),
                      show("data.micro_batch")));
  if (c.backend.comm == CommChoice::nccl && c.backend.device != kernels::Device::cuda)
    error(fmt::format("{}: {} needs backend.device = \"cuda\" ({}): NCCL moves GPU memory",
                      primary({"backend.comm", "backend.device"}), show("backend.comm"), show("backend.device")));
  if (c.model.attention == plan::Attention::fused && c.backend.device != kernels::Device::cuda)
    error(fmt::format("{}: {} needs backend.device = \"cuda\" ({}): the CPU's and Kokkos' attention materialises "
                      "the scores; use \"unfused\" or \"auto\"",
                      primary({"model.attention", "backend.device"}), show("model.attention"), show("backend.device")));
  if (c.backend.device == kernels::Device::cuda && c.model.heads > 0 && c.model.d_model / c.model.heads > 256)
    error(fmt::format("{}: {} with a head size of {} (model.d_model / model.heads): the attention kernels of "
                      "the CUDA backend take head sizes up to 256",
                      primary({"backend.device", "model.d_model", "model.heads"}), show("backend.device"),
                      c.model.d_model / c.model.heads));
  // run.name names the default outputs (results/<name>.h5, -sim.h5,
  // -plan.h5): one file name, not a path out of results/.
  if (!is_file_name(c.run.name))
    error(fmt::format("{}: {} must be a file name: not empty, not . or .., without '/', NUL or other control "
                      "characters but tab (it names the default report, results/<run.name>.h5)",
                      primary({"run.name"}), show("run.name")));
  if (c.run.warmup_steps >= c.run.steps)
    error(fmt::format("{}: {} must be less than {}: warm-up steps are left out of the timing, so at least one "
                      "step must remain",
                      primary({"run.warmup_steps", "run.steps"}), show("run.warmup_steps"), show("run.steps")));
  if (c.data.source == DataSource::text) check_text_source();
  // A key of another model family than the deck's, set to anything but its
  // default, would be ignored: refused. (A resolved deck lists every key.)
  const models::Family& family = models::family(c);
  const Plan defaults{};
  for (const auto& [name, where] : origin_) {
    if (name.rfind("model.", 0) != 0) continue;
    const std::string_view key = std::string_view(name).substr(6);
    const std::vector<std::string_view> owners = models::families_taking(key);
    if (owners.empty() || models::takes_key(family, key)) continue;
    const KeySpec* spec = find_key("model", key);
    if (toml_literal(spec->get(c)) == toml_literal(spec->get(defaults))) continue;
    std::vector<std::string> quoted;
    for (std::string_view o : owners) quoted.push_back(fmt::format("\"{}\"", o));
    error(fmt::format("{}: {} needs model.kind = {} ({}): the key is that family's, and this one would ignore it",
                      where.where, show(name), fmt::join(quoted, " or "), show("model.kind")));
  }
  // The model family's own constraints, then the size checks its
  // parameter count makes, then the strategies' (each from its row).
  const std::size_t before = errors_.size();
  if (family.check != nullptr) family.check(c, *this);
  if (errors_.size() == before) check_sizes();
  sized_ = errors_.size() == before;
  strategies::check_plan(c, *this);
}

// A text source reads the file's bytes as tokens. A relative data.path is
// looked up in the current directory first, then next to the deck; the path
// that opened is written back, so the resolved deck names the file actually
// read and re-resolves to it.
void Resolver::check_text_source() {
  Plan& c = config;
  if (c.model.vocab < 256)
    error(fmt::format("{}: {} needs model.vocab >= 256 (text is read as byte-level tokens); got {}",
                      primary({"model.vocab", "data.source"}), show("data.source"), show("model.vocab")));
  if (c.data.path.empty()) {
    error(fmt::format("{}: {} requires data.path, the text file to read", primary({"data.source", "data.path"}),
                      show("data.source")));
    return;
  }
  const std::string where = primary({"data.path", "data.source"});
  const fs::path given(c.data.path);
  std::vector<fs::path> candidates{given};
  const fs::path deck_dir = fs::path(path_).parent_path();
  if (given.is_relative() && !deck_dir.empty()) {
    fs::path beside_deck = (deck_dir / given).lexically_normal();
    if (beside_deck != given.lexically_normal()) candidates.push_back(std::move(beside_deck));
  }

  std::error_code ec;
  const fs::path* found = nullptr;
  for (const fs::path& p : candidates)
    if (fs::exists(p, ec)) {
      found = &p;
      break;
    }
  if (!found) {
    std::vector<std::string> looked;
    for (const fs::path& p : candidates) looked.push_back(toml_quote(p.string()));
    error(fmt::format("{}: {}: no such file (looked for {})", where, show("data.path"), join(looked, " and ")));
    return;
  }
  if (fs::is_directory(*found, ec)) {
    error(fmt::format("{}: {}: {} is a directory, not a text file", where, show("data.path"), found->string()));
    return;
  }
  // The data is read at random offsets, and opening a FIFO would wait for a
  // writer: only a regular file will do.
  if (!fs::is_regular_file(*found, ec)) {
    error(fmt::format("{}: {}: {} is not a regular file (a FIFO, socket or device); the text is read at random "
                      "offsets, so it must be a file",
                      where, show("data.path"), found->string()));
    return;
  }
  std::FILE* f = std::fopen(found->c_str(), "rb");
  if (!f) {
    error(fmt::format("{}: {}: cannot read {}: {}", where, show("data.path"), found->string(), std::strerror(errno)));
    return;
  }
  std::fclose(f);
  const auto size = fs::file_size(*found, ec);
  const auto need = static_cast<std::uintmax_t>(c.model.seq_len) + 1;
  if (ec || size <= need) {
    error(fmt::format("{}: {}: the file has {} bytes; {} needs more than {} (one sequence and its next-token "
                      "targets)",
                      where, show("data.path"), ec ? 0 : size, show("model.seq_len"), need));
    return;
  }
  c.data.path = found->string();
}

void Resolver::throw_if_errors() {
  if (errors_.empty()) return;
  std::stable_sort(errors_.begin(), errors_.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::string> lines;
  for (const auto& e : errors_) lines.push_back(e.second);
  core::input_error("{}", join(lines, "\n"));
}

std::string resolved_toml(const Plan& c) {
  std::string out = "# Resolved deck: every key with its final value (defaults, deck, --set).\n";
  std::string_view section;
  for (const KeySpec& k : key_table()) {
    if (k.section != section) {
      out += fmt::format("{}[{}]\n", section.empty() ? "" : "\n", k.section);
      section = k.section;
    }
    out += fmt::format("{} = {}\n", k.name, toml_literal(k.get(c)));
  }
  return out;
}

}  // namespace

bool is_file_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos &&
         std::none_of(n.begin(), n.end(), [](unsigned char ch) { return (ch < 32 && ch != '\t') || ch == 127; });
}

std::string read_deck_text(const std::string& path) { return core::read_input_file(path, "deck", core::Pipes::read); }

Deck load_deck(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_deck(path, read_deck_text(path), overrides);
}

Deck parse_deck(const std::string& path, const std::string& text, const std::vector<std::string>& overrides) {
  Deck deck;
  deck.path = path;
  deck.text = text;
  deck.overrides = overrides;

  const toml::table root = parse_toml(path, text);

  Resolver r(path);
  r.apply_file(root);
  for (std::size_t i = 0; i < overrides.size(); ++i) r.apply_override(overrides[i], static_cast<int>(i));
  // Cross-key checks read the final values, so they wait until every key is valid.
  r.throw_if_errors();
  r.check_cross_keys();
  r.throw_if_errors();

  deck.config = r.config;
  deck.resolved_toml = resolved_toml(deck.config);
  return deck;
}

std::vector<std::string> describe_keys() {
  struct Row {
    std::string name, type, def, allowed, doc;
  };
  const Plan defaults;
  std::vector<Row> rows;
  std::size_t w[4] = {0, 0, 0, 0};
  for (const KeySpec& k : key_table()) {
    Row row{k.full_name(), std::string(type_name(k.type)), toml_literal(k.get(defaults)), describe_allowed(k),
            std::string(k.doc)};
    w[0] = std::max(w[0], row.name.size());
    w[1] = std::max(w[1], row.type.size());
    w[2] = std::max(w[2], row.def.size());
    w[3] = std::max(w[3], row.allowed.size());
    rows.push_back(std::move(row));
  }
  std::vector<std::string> out;
  for (const Row& r : rows)
    out.push_back(fmt::format("{:<{}}  {:<{}}  {:<{}}  {:<{}}  {}", r.name, w[0], r.type, w[1], r.def, w[2],
                              r.allowed, w[3], r.doc));
  return out;
}

toml::table parse_toml(const std::string& path, const std::string& text) {
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    core::input_error("{}:{}:{}: TOML syntax error: {}", path, e.source().begin.line, e.source().begin.column,
                      e.description());
  }
}

}  // namespace strata::deck
