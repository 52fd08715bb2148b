// The global deck keys and the small pieces that read any key: value checks,
// byte sizes, TOML literals and "did you mean" hints. Defaults are not
// written here: they are read back from a default-constructed Plan.
#include "plan/keys.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <type_traits>

#include <fmt/format.h>

namespace strata::plan {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool in_range(double v, const Range& r) {
  bool lo_ok = r.lo_open ? v > r.lo : v >= r.lo;
  bool hi_ok = r.hi_open ? v < r.hi : v <= r.hi;
  return lo_ok && hi_ok;
}

bool bounded_below(const Range& r) { return std::isfinite(r.lo); }
bool bounded_above(const Range& r) { return std::isfinite(r.hi); }

std::string describe_range(const Range& r, bool integer) {
  if (bounded_below(r) && bounded_above(r)) {
    if (integer && !r.lo_open && !r.hi_open) return fmt::format("{}..{}", r.lo, r.hi);
    return fmt::format("{}{}, {}{}", r.lo_open ? "(" : "[", r.lo, r.hi, r.hi_open ? ")" : "]");
  }
  if (bounded_below(r)) return fmt::format("{} {}", r.lo_open ? ">" : ">=", r.lo);
  if (bounded_above(r)) return fmt::format("{} {}", r.hi_open ? "<" : "<=", r.hi);
  return "";
}

std::string quoted_list(const std::vector<std::string_view>& values) {
  std::string out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    out += toml_quote(values[i]);
  }
  return out;
}

}  // namespace

KeySpec KeySpec::at_least(double lo) const {
  KeySpec k = *this;
  k.range.lo = lo;
  return k;
}

KeySpec KeySpec::above(double lo) const {
  KeySpec k = *this;
  k.range.lo = lo;
  k.range.lo_open = true;
  return k;
}

KeySpec KeySpec::between(double lo, double hi) const {
  KeySpec k = *this;
  k.range = Range{lo, hi, false, false};
  return k;
}

KeySpec KeySpec::from_below(double lo, double hi) const {
  KeySpec k = *this;
  k.range = Range{lo, hi, false, true};
  return k;
}

KeySpec KeySpec::one_of(std::vector<std::string_view> values, std::vector<std::string_view> not_yet) const {
  KeySpec k = *this;
  k.allowed = std::move(values);
  k.later = std::move(not_yet);
  return k;
}

KeySpec KeySpec::as_bytes() const {
  KeySpec k = *this;
  k.type = KeyType::bytes;
  return k;
}

// The keys of the whole run. A strategy's keys are in its registry row
// (strategies/registry.cpp); constraints between keys are checked there and,
// for the global ones, in src/deck/deck.cpp. Values listed under `later` are
// part of the design but refused by this build with "not available yet".
const std::vector<KeySpec>& global_keys() {
  static const std::vector<KeySpec> table = {
      // [run]
      key<&Plan::run, &RunSection::name>("run", "name", "name of the run; labels the report and the default output path"),
      key<&Plan::run, &RunSection::steps>("run", "steps", "optimizer steps to run").at_least(1),
      key<&Plan::run, &RunSection::warmup_steps>("run", "warmup_steps", "first steps left out of timing figures (must be < steps)").at_least(0),
      key<&Plan::run, &RunSection::seed>("run", "seed", "seed for initial weights and synthetic data"),
      key<&Plan::run, &RunSection::output>("run", "output", "report path; empty: results/<name>.h5"),
      key<&Plan::run, &RunSection::profile>("run", "profile", "record per-layer timeline spans"),
      key<&Plan::run, &RunSection::log_every>("run", "log_every", "print a table row every N steps; 0: never").at_least(0),
      key<&Plan::run, &RunSection::flush_every>("run", "flush_every", "write the per-step records (steps, memory, timeline, communication) to the report every N steps and drop them, so that a rank's memory does not grow with run.steps; 0: as many steps as fit in 64 MiB of records per rank").at_least(0),
      key<&Plan::run, &RunSection::repeats>("run", "repeats", "strata sweep: runs of each point, whose median and spread the sweep's index shows; strata run: ignored").at_least(1),
      key<&Plan::run, &RunSection::keep_checkpoints>("run", "keep_checkpoints", "with --checkpoint-every: the latest checkpoints kept in the checkpoint directory, earlier ones removed once a newer one is complete; 0: keep every one").at_least(0),
      key<&Plan::run, &RunSection::on_divergence>("run", "on_divergence", "a non-finite loss or gradient norm (not an fp16 overflow the loss scale skips): stop the run there with status diverged and exit 3, or continue"),
      // [model]
      key<&Plan::model, &ModelSection::layers>("model", "layers", "transformer blocks (at most 4096: the deepest published models have under 200, and a dry run describes every block of a stage)").between(1, 4096),
      key<&Plan::model, &ModelSection::d_model>("model", "d_model", "width of the residual stream (a multiple of heads)").at_least(1),
      key<&Plan::model, &ModelSection::heads>("model", "heads", "attention heads per block").at_least(1),
      key<&Plan::model, &ModelSection::vocab>("model", "vocab", "vocabulary size (>= 256 for text data: byte-level tokens)").at_least(2),
      key<&Plan::model, &ModelSection::seq_len>("model", "seq_len", "tokens per sequence").at_least(1),
      key<&Plan::model, &ModelSection::attention>("model", "attention", "attention kernels: fused (FlashAttention-style, the scores kept on chip: the CUDA backend's), unfused (the scores materialised, masked and softmaxed in memory and the probabilities kept, as Megatron-LM before FlashAttention: the CPU's and Kokkos', and on cuda batched products around a causal softmax), auto (fused on cuda, else unfused)"),
      // [data]
      key<&Plan::data, &DataSection::source>("data", "source", "where tokens come from: random tokens, or the bytes of a text file"),
      key<&Plan::data, &DataSection::path>("data", "path", "text file for source = \"text\" (see docs/decks.md for how it is found)"),
      key<&Plan::data, &DataSection::global_batch>("data", "global_batch", "sequences per optimizer step (a multiple of micro_batch)").at_least(1),
      key<&Plan::data, &DataSection::micro_batch>("data", "micro_batch", "sequences per forward/backward pass").at_least(1),
      // [optim]
      key<&Plan::optim, &OptimSection::lr>("optim", "lr", "peak learning rate (AdamW)").above(0),
      key<&Plan::optim, &OptimSection::schedule>("optim", "schedule", "learning-rate schedule after warm-up"),
      key<&Plan::optim, &OptimSection::warmup>("optim", "warmup", "linear warm-up steps of the learning rate").at_least(0),
      key<&Plan::optim, &OptimSection::min_lr>("optim", "min_lr", "floor of the cosine schedule").at_least(0),
      key<&Plan::optim, &OptimSection::weight_decay>("optim", "weight_decay", "decoupled weight decay").at_least(0),
      key<&Plan::optim, &OptimSection::beta1>("optim", "beta1", "AdamW first-moment decay").from_below(0, 1),
      key<&Plan::optim, &OptimSection::beta2>("optim", "beta2", "AdamW second-moment decay").from_below(0, 1),
      key<&Plan::optim, &OptimSection::eps>("optim", "eps", "AdamW denominator epsilon").above(0),
      key<&Plan::optim, &OptimSection::grad_clip>("optim", "grad_clip", "clip the global gradient norm to this; 0: no clipping").at_least(0),
      // [backend]
      key<&Plan::backend, &BackendSection::device>("backend", "device", "where kernels run: the CPU, one GPU per rank (the CUDA backend), or Kokkos' default execution space (the Kokkos backend)"),
      key<&Plan::backend, &BackendSection::comm>("backend", "comm", "collectives: auto (nccl on cuda, mpi on cpu), mpi (device buffers staged through the host), nccl (cuda only)"),
      key<&Plan::backend, &BackendSection::precision>("backend", "precision", "fp32, or mixed precision: 16-bit parameters, gradients and collectives, fp32 master weights and optimizer"),
      key<&Plan::backend, &BackendSection::loss_scale>("backend", "loss_scale", "fp16: initial dynamic loss scale (halved on overflow, the step skipped)").at_least(1),
      key<&Plan::backend, &BackendSection::loss_scale_window>("backend", "loss_scale_window", "fp16: good steps in a row before the loss scale doubles").at_least(1),
      key<&Plan::backend, &BackendSection::threads>("backend", "threads", "compute threads per rank; 0: OMP_NUM_THREADS or all cores").at_least(0),
      key<&Plan::backend, &BackendSection::memory_limit>("backend", "memory_limit", "memory budget per rank in bytes (or \"512MiB\", \"2GB\"); 0: no limit").as_bytes(),
      key<&Plan::backend, &BackendSection::host_memory_limit>("backend", "host_memory_limit", "host arena budget per rank for parallel.offload = \"host\" (bytes, or \"8GiB\"); 0: no limit").as_bytes(),
      key<&Plan::backend, &BackendSection::peak_tflops>("backend", "peak_tflops", "peak TFLOP/s per rank for utilisation figures; 0: backend.machine's, else measured once per host and cached").at_least(0),
      key<&Plan::backend, &BackendSection::machine>("backend", "machine", "a machine description (name or path) whose device peak at the run's precision MFU is measured against; \"\": none"),
  };
  return table;
}

std::optional<std::string> check_value(const KeySpec& key, const Value& value) {
  switch (key.type) {
    case KeyType::integer: {
      std::int64_t v = std::get<std::int64_t>(value);
      if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
        return fmt::format("must fit a 32-bit integer, got {}", v);
      if (!in_range(static_cast<double>(v), key.range))
        return fmt::format("must be {}{}, got {}", bounded_below(key.range) && bounded_above(key.range) ? "in " : "",
                           describe_range(key.range, true), v);
      return std::nullopt;
    }
    case KeyType::unsigned_:
    case KeyType::bytes: {
      std::uint64_t v = std::get<std::uint64_t>(value);
      if (!in_range(static_cast<double>(v), key.range))
        return fmt::format("must be {}{}, got {}", bounded_below(key.range) && bounded_above(key.range) ? "in " : "",
                           describe_range(key.range, true), v);
      return std::nullopt;
    }
    case KeyType::floating: {
      double v = std::get<double>(value);
      if (!std::isfinite(v)) return fmt::format("must be a finite number, got {}", toml_literal(value));
      if (!in_range(v, key.range))
        return fmt::format("must be {}{}, got {}", bounded_below(key.range) && bounded_above(key.range) ? "in " : "",
                           describe_range(key.range, false), toml_literal(value));
      return std::nullopt;
    }
    case KeyType::boolean:
      return std::nullopt;
    case KeyType::string: {
      const std::string& v = std::get<std::string>(value);
      if (key.allowed.empty()) return std::nullopt;
      if (std::find(key.allowed.begin(), key.allowed.end(), v) != key.allowed.end()) return std::nullopt;
      if (std::find(key.later.begin(), key.later.end(), v) != key.later.end())
        return fmt::format("{} is not available in this build yet; allowed now: {}", toml_quote(v),
                           quoted_list(key.allowed));
      std::vector<std::string> known(key.allowed.begin(), key.allowed.end());
      known.insert(known.end(), key.later.begin(), key.later.end());
      std::string msg = fmt::format("must be one of {}; got {}", quoted_list(key.allowed), toml_quote(v));
      if (auto near = closest_name(v, known)) msg += fmt::format(" (did you mean {}?)", toml_quote(*near));
      return msg;
    }
  }
  return std::nullopt;
}

std::variant<std::uint64_t, std::string> parse_bytes(std::string_view text) {
  static constexpr const char* kUnits =
      "units: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)";
  auto refuse = [&] {
    return fmt::format("{} is not a byte size: expected a non-negative number and an optional unit, e.g. \"512MiB\"; {}",
                       toml_quote(text), kUnits);
  };
  std::size_t i = 0;
  auto is_digit = [&](std::size_t j) { return j < text.size() && std::isdigit(static_cast<unsigned char>(text[j])); };
  while (i < text.size() && text[i] == ' ') ++i;
  std::string whole_digits, frac_digits;
  while (is_digit(i)) whole_digits += text[i++];
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (is_digit(i)) frac_digits += text[i++];
  }
  if (whole_digits.empty() && frac_digits.empty()) return refuse();
  while (i < text.size() && text[i] == ' ') ++i;
  std::string_view unit_text = text.substr(i);
  while (!unit_text.empty() && unit_text.back() == ' ') unit_text.remove_suffix(1);

  struct Unit {
    const char* name;
    std::uint64_t scale;
  };
  static constexpr Unit kScales[] = {
      {"", 1}, {"b", 1},
      {"kb", 1000ull}, {"mb", 1000ull * 1000}, {"gb", 1000ull * 1000 * 1000}, {"tb", 1000ull * 1000 * 1000 * 1000},
      {"kib", 1ull << 10}, {"mib", 1ull << 20}, {"gib", 1ull << 30}, {"tib", 1ull << 40},
  };
  std::string unit = lower(unit_text);
  const Unit* found = nullptr;
  for (const Unit& u : kScales)
    if (unit == u.name) found = &u;
  if (!found) return fmt::format("unknown unit {} in {}; {}", toml_quote(unit_text), toml_quote(text), kUnits);

  // Exact decimal arithmetic, so "1.5GB" is 1500000000 and not a rounded double.
  using u128 = unsigned __int128;
  const u128 max = std::numeric_limits<std::uint64_t>::max();
  auto too_large = [&] { return fmt::format("{} is larger than 2^64 - 1 bytes", toml_quote(text)); };
  whole_digits.erase(0, std::min(whole_digits.find_first_not_of('0'), whole_digits.size()));
  if (whole_digits.size() > 20) return too_large();
  if (frac_digits.size() > 18) frac_digits.resize(18);  // below a byte at any unit we accept
  u128 whole = 0;
  for (char c : whole_digits) whole = whole * 10 + static_cast<unsigned>(c - '0');
  u128 frac = 0, frac_scale = 1;
  for (char c : frac_digits) {
    frac = frac * 10 + static_cast<unsigned>(c - '0');
    frac_scale *= 10;
  }
  if (whole > max) return too_large();
  u128 total = whole * found->scale + frac * found->scale / frac_scale;  // fractions round down
  if (total > max) return too_large();
  return static_cast<std::uint64_t>(total);
}

std::string toml_quote(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) out += fmt::format("\\u{:04X}", static_cast<unsigned>(c));
        else out += ch;  // UTF-8 passes through: TOML strings are UTF-8
    }
  }
  out += '"';
  return out;
}

Value value_of(const KeySpec& key, const std::string& text) {
  switch (key.type) {
    case KeyType::integer: return std::int64_t(std::stoll(text));
    case KeyType::unsigned_:
    case KeyType::bytes: return std::uint64_t(std::stoull(text));
    case KeyType::floating: return std::stod(text);
    case KeyType::boolean: return text == "true";
    case KeyType::string: break;
  }
  return text;
}

std::string toml_literal(const Value& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return toml_quote(v);
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, double>) {
          // Shortest text that reads back to the same double; TOML needs a '.'
          // or an exponent for it to stay a float.
          std::string s = fmt::format("{}", v);
          if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
          return s;
        } else {
          return fmt::format("{}", v);
        }
      },
      value);
}

std::string_view type_name(KeyType type) {
  switch (type) {
    case KeyType::integer: return "int";
    case KeyType::unsigned_: return "uint";
    case KeyType::bytes: return "bytes";
    case KeyType::floating: return "float";
    case KeyType::boolean: return "bool";
    case KeyType::string: return "string";
  }
  return "?";
}

std::string expected_phrase(KeyType type) {
  switch (type) {
    case KeyType::integer: return "an integer";
    case KeyType::unsigned_: return "a non-negative integer";
    case KeyType::bytes: return "a byte count (an integer, or a string such as \"512MiB\")";
    case KeyType::floating: return "a number";
    case KeyType::boolean: return "a boolean (true or false)";
    case KeyType::string: return "a string";
  }
  return "?";
}

std::string describe_allowed(const KeySpec& key) {
  switch (key.type) {
    case KeyType::integer:
    case KeyType::floating: {
      std::string r = describe_range(key.range, key.type == KeyType::integer);
      return r.empty() ? "any" : r;
    }
    case KeyType::unsigned_:
    case KeyType::bytes:
      return ">= 0";
    case KeyType::boolean:
      return "true, false";
    case KeyType::string: {
      if (key.allowed.empty()) return "any";
      std::string out = quoted_list(key.allowed);
      if (!key.later.empty()) out += fmt::format(" (later {})", quoted_list(key.later));
      return out;
    }
  }
  return "";
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::optional<std::string> closest_name(std::string_view name, const std::vector<std::string>& known) {
  const std::string n = lower(name);
  std::optional<std::string> best;
  std::size_t best_distance = 3;
  for (const std::string& k : known) {
    std::size_t d = edit_distance(n, lower(k));
    // A distance as long as the name itself would "correct" anything ("ab" -> "dp").
    if (d < best_distance && d < n.size()) {
      best = k;
      best_distance = d;
    }
  }
  if (best) return best;
  if (n.size() < 2) return std::nullopt;
  for (const std::string& k : known) {
    const std::string lk = lower(k);
    if (lk.starts_with(n) || n.starts_with(lk)) return k;
  }
  return std::nullopt;
}

}  // namespace strata::plan
