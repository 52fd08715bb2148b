// A mutation fuzzer for every parser a user feeds: decks (and --set
// overrides), machine descriptions, sweep decks with their `where` clauses,
// and checkpoint manifests. Each starts from its seeds (the project's own
// inputs and tests/fuzz/regressions/<parser>/), replays every regression
// input, then mutates seeds for a bounded time: bytes flipped, inserted,
// deleted, duplicated and spliced, numbers swapped for extreme ones (NaN,
// infinity, 1e999, -1, 2^31, 2^63), deep nesting inserted.
//
// The property: a parser either accepts its input or throws an input error
// (core::Error of kind input, exit 2). Any other exception, a crash, a hang
// (SIGALRM after 20 s on one input, 120 s on a numeric-range case) or a
// sanitizer report fails the run, and the input is kept in
// <work>/finding-<parser>.txt to be added to the regressions.
//
// Then two generators of the cases mutation seldom reaches. Numeric ranges:
// every numeric key of the deck, on a tiny deck and its dp, pipeline and
// MoE variants, at values drawn from the key's own range (its edges, just
// past them) and from the extremes (0, -1, 1e-30, 1e30, 2^31 - 1, 2^53,
// NaN): each must be refused as an input error, or accepted with the dry
// run's sizing (the estimate of every rank's step and its record window)
// finishing as bounded work, neither throwing nor hanging; all of them on
// the tiny deck first, then the variants, for 8 x SECONDS_PER_PARSER. Path
// collisions: an output path that names an input (the same path, "./" and
// "d/../" spellings, a symbolic link, a hard link) or lies inside a
// directory the command reads must be refused by report::output_file_problem,
// the one check every command makes.
//
// Then the sweep driver's report reader (report::read_headline) on files of
// random structure: the root attributes it reads and the /summary scalars as
// strings, numbers, arrays of any length, groups or compounds, and one file
// in four with bytes flipped or cut off besides. It must never fail, and
// must return every value of an undamaged file that is a number where one
// belongs.
//   fuzz_parsers SOURCE_DIR WORK_DIR SECONDS_PER_PARSER [SEED]
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hdf5.h>

#include "kernels/foundation/error.hpp"
#include "src/report/h5read.hpp"
#include "src/deck/deck.hpp"
#include "src/sim/machine.hpp"
#include "src/sweep/sweep.hpp"
#include "plan/keys.hpp"
#include "src/report/output_path.hpp"
#include "src/train/checkpoint.hpp"
#include "src/train/estimate.hpp"
#include "src/train/records.hpp"

namespace fs = std::filesystem;
using namespace strata;

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// The input being tried, for a crash or a hang to leave behind.
fs::path g_current;

class Mutator {
 public:
  explicit Mutator(std::uint64_t seed) : rng_(seed) {}
  std::size_t below(std::size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

  std::string mutate(std::string s, const std::vector<std::string>& seeds) {
    const int rounds = 1 + int(below(4));
    for (int r = 0; r < rounds; ++r) s = once(std::move(s), seeds);
    if (s.size() > (1u << 20)) s.resize(1u << 20);
    return s;
  }

 private:
  std::string once(std::string s, const std::vector<std::string>& seeds) {
    static const char* kNumbers[] = {"nan", "inf", "-inf", "1e999", "-1", "0", "2147483648", "9223372036854775808",
                                     "-9223372036854775809", "1e-320", "0x7fffffff", "4294967296"};
    static const char* kTokens[] = {"[", "]", "{", "}", "\"", "'", "=", "\n", "[[", "]]", ".", ",", "#", "\\",
                                    "(", ")", "not ", " and ", " or ", "==", "\x00", "\xff", "\xc3\x28"};
    const std::size_t at = below(s.size() + 1);
    switch (below(9)) {
      case 0:  // flip a byte
        if (!s.empty()) s[below(s.size())] ^= char(1 << below(8));
        break;
      case 1:  // insert a few random bytes
        for (std::size_t k = below(8) + 1; k > 0; --k) s.insert(s.begin() + std::ptrdiff_t(below(s.size() + 1)), char(below(256)));
        break;
      case 2:  // delete a range
        if (!s.empty()) s.erase(at < s.size() ? at : 0, below(64) + 1);
        break;
      case 3: {  // duplicate a range
        if (s.empty()) break;
        const std::size_t from = below(s.size()), n = below(std::min<std::size_t>(256, s.size() - from)) + 1;
        s.insert(at, s.substr(from, n));
        break;
      }
      case 4: {  // splice in a piece of another seed
        const std::string& o = seeds[below(seeds.size())];
        if (o.empty()) break;
        const std::size_t from = below(o.size()), n = below(std::min<std::size_t>(512, o.size() - from)) + 1;
        s.insert(at, o.substr(from, n));
        break;
      }
      case 5: {  // a number swapped for an extreme one
        std::size_t d = s.find_first_of("0123456789", at);
        if (d == std::string::npos) d = s.find_first_of("0123456789");
        if (d == std::string::npos) break;
        std::size_t e = d;
        while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '.' || s[e] == 'e')) ++e;
        s.replace(d, e - d, kNumbers[below(std::size(kNumbers))]);
        break;
      }
      case 6:  // a token of the grammars
        s.insert(at, kTokens[below(std::size(kTokens))]);
        break;
      case 7: {  // deep nesting
        const char* open[] = {"[", "(", "{", "not ", "-"};
        const std::size_t k = below(std::size(open)), n = 1 + below(20000);
        std::string deep;
        for (std::size_t i = 0; i < n; ++i) deep += open[k];
        s.insert(at, deep);
        break;
      }
      default: {  // a line repeated
        const std::size_t b = s.rfind('\n', at == 0 ? 0 : at - 1), e = s.find('\n', at);
        const std::size_t from = b == std::string::npos ? 0 : b + 1;
        const std::string line = s.substr(from, (e == std::string::npos ? s.size() : e) - from);
        s.insert(from, line + "\n");
      }
    }
    return s;
  }

  std::mt19937_64 rng_;
};

struct Parser {
  std::string name;
  std::vector<fs::path> seed_files;
  std::function<void(const std::string&)> parse;  // throws what the parser throws
};

// Every regular file below `dir` (sorted), or none.
std::vector<fs::path> files_in(const fs::path& dir, const std::string& ext = "") {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && (ext.empty() || e.path().extension() == ext)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// One input: accepted, or refused as input (*refused), or a finding (its
// description returned; "" otherwise).
std::string run_one(const Parser& p, const std::string& input, bool* refused) {
  std::string why;
  *refused = false;
  write(g_current, input);
  alarm(20);
  try {
    p.parse(input);
  } catch (const core::Error& e) {
    *refused = true;
    if (e.kind() != core::ErrorKind::input) why = fmt::format("a runtime error, not an input error: {}", e.what());
  } catch (const std::exception& e) {
    why = fmt::format("an exception other than an input error: {}: {}", typeid(e).name(), e.what());
  }
  alarm(0);
  return why;
}

// One object of a random kind at `name` in `parent` (a file or group): a
// double (its value in *number), an integer, a double array of any length,
// a fixed-length string, a group, a compound, or nothing.
void random_object(hid_t parent, const char* name, Mutator& m, double* number) {
  *number = -1;  // none
  const hsize_t n = hsize_t(m.below(3) == 0 ? m.below(4096) : m.below(3));
  const hid_t scalar = H5Screate(H5S_SCALAR);
  const hid_t array = H5Screate_simple(1, &n, nullptr);
  std::vector<double> values(std::max<hsize_t>(n, 1), 7.0);
  switch (m.below(7)) {
    case 0: {
      const double v = double(m.below(1000)) / 8;
      const hid_t d = H5Dcreate2(parent, name, H5T_IEEE_F64LE, scalar, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v);
      H5Dclose(d);
      *number = v;
      break;
    }
    case 1: {
      const std::int64_t v = std::int64_t(m.below(1000));
      const hid_t d = H5Dcreate2(parent, name, H5T_STD_I64LE, scalar, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v);
      H5Dclose(d);
      *number = double(v);
      break;
    }
    case 2: {
      const hid_t d = H5Dcreate2(parent, name, H5T_IEEE_F64LE, array, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      if (n > 0) H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
      H5Dclose(d);
      break;
    }
    case 3: {
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, 1 + m.below(64));
      const hid_t d = H5Dcreate2(parent, name, t, m.below(2) ? scalar : array, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, std::string(size_t(64) * std::max<hsize_t>(n, 1), 'x').data());
      H5Dclose(d);
      H5Tclose(t);
      break;
    }
    case 4:
      H5Gclose(H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      break;
    case 5: {
      const hid_t t = H5Tcreate(H5T_COMPOUND, 16);
      H5Tinsert(t, "a", 0, H5T_NATIVE_DOUBLE);
      H5Tinsert(t, "b", 8, H5T_NATIVE_INT64);
      const hid_t d = H5Dcreate2(parent, name, t, m.below(2) ? scalar : array, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      H5Dclose(d);  // unwritten: HDF5's fill value
      H5Tclose(t);
      break;
    }
    default:
      break;
  }
  H5Sclose(array);
  H5Sclose(scalar);
}

// A root attribute of a random kind: a variable-length or fixed-length
// string, an array of strings, a number or an array of numbers, or nothing.
void random_attr(hid_t file, const char* name, Mutator& m) {
  const hsize_t n = hsize_t(m.below(5));
  const hid_t space = m.below(2) ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr);
  const std::string text(4096, 'e');
  switch (m.below(5)) {
    case 0: {
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      std::vector<const char*> p(8, text.c_str() + m.below(4096));
      const hid_t a = H5Acreate2(file, name, t, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, t, p.data());
      H5Aclose(a);
      H5Tclose(t);
      break;
    }
    case 1: {
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, 1 + m.below(300));
      const hid_t a = H5Acreate2(file, name, t, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, t, std::string(300 * 8, 'f').data());
      H5Aclose(a);
      H5Tclose(t);
      break;
    }
    case 2: {
      const std::vector<double> v(8, 3.5);
      const hid_t a = H5Acreate2(file, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, H5T_NATIVE_DOUBLE, v.data());
      H5Aclose(a);
      break;
    }
    default:
      break;
  }
  H5Sclose(space);
}

// read_headline on `seconds` of generated files; the findings.
int fuzz_headline(const fs::path& work, double seconds, std::uint64_t seed) {
  const char* kScalars[] = {"tokens_per_s", "mfu", "step_time", "final_loss", "peak_bytes_total"};
  Mutator m(seed ^ 0x4845414447ULL);
  const std::string path = (work / "headline.h5").string();
  int findings = 0;
  std::size_t runs = 0;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    double want[5] = {-1, -1, -1, -1, -1};
    const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    random_attr(f, "status", m);
    random_attr(f, "error", m);
    if (m.below(4) == 0) {
      double ignored = 0;
      random_object(f, "summary", m, &ignored);  // not a group: no scalars at all
    } else {
      const hid_t g = H5Gcreate2(f, "summary", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      for (int i = 0; i < 5; ++i) random_object(g, kScalars[i], m, &want[i]);
      H5Gclose(g);
    }
    H5Fclose(f);
    // One file in four is damaged too: bytes flipped, or cut short. HDF5
    // may fail on it in any way, a crash included; the reader must not.
    const bool damaged = m.below(4) == 0;
    if (damaged) {
      std::string bytes = read(path);
      if (m.below(3) == 0) {
        bytes.resize(m.below(bytes.size()));
      } else {
        for (std::size_t k = 1 + m.below(16); k > 0 && !bytes.empty(); --k)
          bytes[m.below(bytes.size())] ^= char(1 << m.below(8));
      }
      write(path, bytes);
    }
    alarm(20);
    std::string why;
    try {
      const std::optional<report::Headline> h = report::read_headline(path);
      if (damaged) {
        // Any answer will do.
      } else if (!h) {
        why = "a whole HDF5 file read as no report";
      } else {
        const double got[5] = {h->tokens_per_s, h->mfu, h->step_time, h->final_loss, h->peak_bytes_total};
        for (int i = 0; i < 5; ++i)
          if (want[i] >= 0 && got[i] != want[i])
            why = fmt::format("/summary/{} = {} read as {}", kScalars[i], want[i], got[i]);
      }
    } catch (const std::exception& e) {
      why = fmt::format("read_headline threw {}", e.what());
    }
    alarm(0);
    ++runs;
    if (!why.empty()) {
      const fs::path keep = work / fmt::format("finding-headline-{}.h5", findings);
      fs::copy_file(path, keep, fs::copy_options::overwrite_existing);
      std::cerr << fmt::format("FINDING headline: {} (file kept in {})\n", why, keep.string());
      ++findings;
    }
  }
  const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << fmt::format("headline: {} generated reports in {:.1f} s ({:.0f}/s)\n", runs, spent, runs / spent);
  return findings;
}

}  // namespace

// Values for a numeric key: its range's edges and just past them, and the
// extremes every size must survive.
std::vector<std::string> values_for(const plan::KeySpec& k) {
  std::vector<double> v = {0, -1, 1, 2, 3, 1e-30, 1e-5, 0.5, 1e30, 2147483647.0, 9007199254740992.0};
  for (double edge : {k.range.lo, k.range.hi})
    if (std::isfinite(edge))
      for (double d : {-1.0, 0.0, 1.0, -1e-9, 1e-9}) v.push_back(edge + d);
  std::vector<std::string> out;
  for (double x : v) {
    if (k.type == plan::KeyType::floating) {
      out.push_back(fmt::format("{:.17g}", x));
    } else {
      if (x != std::floor(x) || std::fabs(x) > 9.3e18) continue;
      if (k.type != plan::KeyType::integer && x < 0) continue;
      out.push_back(fmt::format("{:.0f}", x));
    }
  }
  if (k.type == plan::KeyType::floating) out.insert(out.end(), {"nan", "inf", "-inf"});
  std::vector<std::string> once;  // in the order above, each once
  for (const std::string& s : out)
    if (std::find(once.begin(), once.end(), s) == once.end()) once.push_back(s);
  return once;
}

// `budget` seconds at most (checked between cases), in the order: the tiny
// deck before its variants, and on each every key at its first value, then
// every key at its second, ..., so that a slow build (the sanitized one, some
// 70 times slower to size a deck) tries every key early. A case may take up
// to 120 s (a model of 4096 layers is legitimately slow to size at -O0).
int fuzz_ranges(double budget) {
  const std::string tiny =
      "[run]\nname = \"r\"\nsteps = 4\nwarmup_steps = 1\n[model]\nlayers = 2\nd_model = 16\nheads = 2\n"
      "vocab = 64\nseq_len = 16\n[data]\nglobal_batch = 8\nmicro_batch = 2\n[backend]\nthreads = 1\n";
  const std::vector<std::vector<std::string>> bases = {
      {}, {"parallel.dp=2"}, {"parallel.pp=2", "parallel.dp=2", "parallel.zero=1"},
      {"model.kind=\"moe\"", "model.moe_experts=2", "parallel.dp=2"}};
  int findings = 0;
  std::size_t tried = 0, accepted = 0, cases = 0;
  const auto start = std::chrono::steady_clock::now();
  const auto spent = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::vector<std::pair<const plan::KeySpec*, std::vector<std::string>>> keys;
  std::size_t most = 0;
  for (const plan::KeySpec& k : plan::key_table())
    if (k.type != plan::KeyType::boolean && k.type != plan::KeyType::string) {
      keys.emplace_back(&k, values_for(k));
      most = std::max(most, keys.back().second.size());
    }
  for (const auto& base : bases)
    for (std::size_t j = 0; j < most; ++j)
      for (const auto& [kp, values] : keys) {
        if (j >= values.size()) continue;
        const plan::KeySpec& k = *kp;
        const std::string& value = values[j];
        ++cases;
        if (spent() > budget) continue;
        std::vector<std::string> sets = base;
        sets.push_back(k.full_name() + "=" + value);
        std::string why;
        write(g_current, tiny + "# --set " + fmt::format("{}", fmt::join(sets, " --set ")) + "\n");
        alarm(120);
        try {
          const deck::Deck d = deck::parse_deck("ranges.toml", tiny, sets);
          train::check_record_window(d.config);
          const train::Estimate e = train::estimate(d.config);
          for (const auto& c : e.classes)
            if (!(c.record_window_bytes <= train::kMaxRecordWindowBytes || d.config.run.flush_every == 0))
              why = fmt::format("a record window of {} accepted", c.record_window_bytes);
          ++accepted;
        } catch (const core::Error& e) {
          if (e.kind() != core::ErrorKind::input) why = fmt::format("a runtime error, not an input error: {}", e.what());
        } catch (const std::exception& e) {
          why = fmt::format("an exception other than an input error: {}: {}", typeid(e).name(), e.what());
        }
        alarm(0);
        ++tried;
        if (!why.empty()) {
          std::cerr << fmt::format("FINDING ranges: --set {}: {}\n", fmt::join(sets, " --set "), why.substr(0, 400));
          ++findings;
        }
      }
  std::cout << fmt::format("  ranges: {} of {} key value(s) on {} deck(s) in {:.1f} s, {} accepted and sized\n",
                           tried, cases, bases.size(), spent(), accepted);
  return findings;
}

int fuzz_path_collisions(const fs::path& work) {
  const fs::path dir = work / "collide";
  fs::remove_all(dir);
  fs::create_directories(dir / "sub");
  fs::create_directories(dir / "ck" / "step-000001");
  write(dir / "deck.toml", "[run]\n");
  write(dir / "ck" / "step-000001" / "manifest.toml", "x");
  const std::vector<report::Input> inputs = {{(dir / "deck.toml").string(), "the deck"},
                                             {(dir / "ck" / "step-000001").string(), "--resume"},
                                             {(dir / "later").string(), "a directory made later", true}};
  int findings = 0;
  std::size_t tried = 0;
  std::error_code ec;
  for (const report::Input& in : inputs) {
    const fs::path p(in.path);
    std::vector<std::string> names = {in.path, (p.parent_path() / "." / p.filename()).string(),
                                      (p.parent_path() / "sub" / ".." / p.filename()).string()};
    const fs::path sym = dir / ("sym-" + p.filename().string());
    fs::remove(sym, ec);
    fs::create_symlink(p, sym, ec);
    names.push_back(sym.string());
    if (fs::is_regular_file(p)) {
      const fs::path hard = dir / ("hard-" + p.filename().string());
      fs::remove(hard, ec);
      fs::create_hard_link(p, hard, ec);
      names.push_back(hard.string());
    }
    if (in.directory || fs::is_directory(p)) {
      names.push_back((p / "rank-00000.bin").string());
      names.push_back((p / "manifest.toml").string());
      names.push_back((sym / "deeper" / "x.h5").string());
    }
    for (const std::string& out : names) {
      ++tried;
      if (report::output_file_problem(out, "report", inputs).empty()) {
        std::cerr << fmt::format("FINDING paths: output {} accepted though it is or lies inside {} ({})\n", out,
                                 in.what, in.path);
        ++findings;
      }
    }
  }
  // And the other way: paths beside the inputs are outputs like any other.
  for (const std::string ok : {"deck.toml.h5", "ck2/x.h5", "ck/step-0000010.h5", "sub/deck.toml"}) {
    ++tried;
    if (const std::string why = report::output_file_problem((dir / ok).string(), "report", inputs); !why.empty()) {
      std::cerr << fmt::format("FINDING paths: output {} refused: {}\n", (dir / ok).string(), why);
      ++findings;
    }
  }
  std::cout << fmt::format("   paths: {} output path(s) against {} input(s)\n", tried, inputs.size());
  return findings;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc < 4) {
    std::cerr << "usage: fuzz_parsers SOURCE_DIR WORK_DIR SECONDS_PER_PARSER [SEED]\n";
    return 2;
  }
  const fs::path src = argv[1], work = argv[2];
  const double seconds = std::stod(argv[3]);
  const std::uint64_t seed = argc > 4 ? std::stoull(argv[4]) : 20261205;
  fs::create_directories(work);
  g_current = work / "current-input.txt";
  std::signal(SIGALRM, [](int) {
    static const char msg[] = "fuzz_parsers: one input took too long (a hang): see current-input.txt\n";
    (void)!::write(2, msg, sizeof msg - 1);
    _exit(3);
  });

  const fs::path file = work / "input.toml";
  const fs::path ckdir = work / "ck", step = ckdir / "step-000001";
  const train::CheckpointLayout layout{};
  std::vector<Parser> parsers = {
      {"deck", files_in(src / "inputs", ".toml"),
       [&](const std::string& text) { deck::parse_deck("fuzz.toml", text, {}); }},
      // One --set override against the quickstart deck: the text after --set.
      {"set", {},
       [&, base = read(src / "inputs/quickstart.toml")](const std::string& text) {
         deck::parse_deck("quickstart.toml", base, {text});
       }},
      {"machine", files_in(src / "inputs/machines", ".toml"),
       [&](const std::string& text) {
         write(file, text);
         sim::load_machine(file.string());
       }},
      {"sweep", {src / "inputs/sweep-strategies.toml", src / "inputs/sweep-memory.toml"},
       [&](const std::string& text) {
         write(file, text);
         sweep::load_sweep(file.string(), {}, (work / "results").string());
       }},
      // A manifest sealed after mutation, so that its own checks are reached
      // (an unsealed one stops at its checksum).
      {"manifest", {},
       [&](const std::string& text) {
         fs::create_directories(step);
         write(step / "manifest.toml", train::seal_manifest(text));
         train::find_checkpoint(MPI_COMM_SELF, step.string(), layout);
       }},
  };
  for (Parser& p : parsers)
    for (const fs::path& f : files_in(src / "tests/fuzz/seeds" / p.name)) p.seed_files.push_back(f);

  int findings = 0;
  for (const Parser& p : parsers) {
    std::vector<std::string> seeds;
    for (const fs::path& f : p.seed_files) seeds.push_back(read(f));
    if (seeds.empty()) seeds.push_back("");
    // The regressions first: inputs that once crashed, hung or were refused wrongly.
    std::size_t replayed = 0;
    for (const fs::path& f : files_in(src / "tests/fuzz/regressions" / p.name)) {
      bool refused = false;
      if (const std::string why = run_one(p, read(f), &refused); !why.empty()) {
        std::cerr << fmt::format("FINDING {} regression {}: {}\n", p.name, f.string(), why);
        ++findings;
      }
      ++replayed;
    }
    // The first seed as it is: accepted, or the reason it is not (a seed
    // refused early would keep its mutations from reaching deeper checks).
    std::string first = "accepted";
    try {
      write(g_current, seeds.front());
      p.parse(seeds.front());
    } catch (const std::exception& e) {
      first = fmt::format("refused: {}", std::string(e.what()).substr(0, 160));
    }
    Mutator m(seed ^ std::hash<std::string>{}(p.name));
    const auto start = std::chrono::steady_clock::now();
    std::size_t runs = 0, refused = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
      const std::string input = m.mutate(seeds[m.below(seeds.size())], seeds);
      bool was_refused = false;
      const std::string why = run_one(p, input, &was_refused);
      ++runs;
      refused += was_refused;
      if (!why.empty()) {
        const fs::path keep = work / fmt::format("finding-{}-{}.txt", p.name, findings);
        write(keep, input);
        std::cerr << fmt::format("FINDING {}: {} (input kept in {})\n", p.name, why.substr(0, 400), keep.string());
        ++findings;
      }
    }
    const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << fmt::format("{:>8}: {} regression input(s) replayed; {} mutated inputs in {:.1f} s ({:.0f}/s), {} "
                             "refused as input errors, {} accepted; its first seed {}\n",
                             p.name, replayed, runs, spent, runs / spent, refused, runs - refused, first);
  }
  findings += fuzz_ranges(8 * seconds);
  findings += fuzz_path_collisions(work);
  findings += fuzz_headline(work, seconds, seed);
  fs::remove(g_current);
  std::cout << fmt::format("fuzz_parsers: seed {}, {} finding(s)\n", seed, findings);
  MPI_Finalize();
  return findings == 0 ? 0 : 1;
}
