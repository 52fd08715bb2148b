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
// (SIGALRM after 20 s on one input) or a sanitizer report fails the run,
// and the input is kept in <work>/finding-<parser>.txt to be added to the
// regressions.
//   fuzz_parsers SOURCE_DIR WORK_DIR SECONDS_PER_PARSER [SEED]
#include <mpi.h>
#include <unistd.h>

#include <chrono>
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

#include "kernels/foundation/error.hpp"
#include "src/deck/deck.hpp"
#include "src/sim/machine.hpp"
#include "src/sweep/sweep.hpp"
#include "src/train/checkpoint.hpp"

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

}  // namespace

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
    static const char msg[] = "fuzz_parsers: one input took more than 20 s (a hang): see current-input.txt\n";
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
  fs::remove(g_current);
  std::cout << fmt::format("fuzz_parsers: seed {}, {} finding(s)\n", seed, findings);
  MPI_Finalize();
  return findings == 0 ? 0 : 1;
}
