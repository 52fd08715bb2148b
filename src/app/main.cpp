// The `strata` command line: parses arguments, reads the deck on rank 0 and
// broadcasts it, and dispatches to the train layer. Errors end the job with
// the failing rank's message: status 2 for bad input (every rank finds the
// same error, so all exit cleanly), 1 otherwise (MPI_Abort when other ranks
// could be left waiting).
#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "src/comm/abort.hpp"
#include "src/comm/mpi_check.hpp"
#include "src/core/error.hpp"
#include "src/deck/deck.hpp"
#include "src/train/run.hpp"

namespace {

using strata::core::Error;
using strata::core::ErrorKind;

// Rank 0 reads the deck file; every rank receives its text (or the reason it
// could not be read) so that all ranks parse the same bytes.
std::string read_deck_on_root(const std::string& path, MPI_Comm comm) {
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  std::string text, problem;
  if (rank == 0) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
      problem = fmt::format("{}: cannot open deck file", path);
    } else {
      std::ostringstream ss;
      ss << f.rdbuf();
      text = ss.str();
    }
  }
  std::string payload = problem.empty() ? "T" + text : "E" + problem;
  long long n = static_cast<long long>(payload.size());
  STRATA_CHECK_MPI(MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, comm));
  payload.resize(static_cast<std::size_t>(n));
  STRATA_CHECK_MPI(MPI_Bcast(payload.data(), static_cast<int>(n), MPI_CHAR, 0, comm));
  if (payload[0] == 'E') strata::core::input_error("{}", payload.substr(1));
  return payload.substr(1);
}

int run_command(const std::string& deck_path, const std::vector<std::string>& sets, const std::string& output,
                bool dry_run, const std::string& command_line) {
  const std::string text = read_deck_on_root(deck_path, MPI_COMM_WORLD);
  const strata::deck::Deck deck = strata::deck::parse_deck(deck_path, text, sets);
  strata::train::RunOptions opts{output, dry_run, command_line};
  return strata::train::run_deck(deck, opts, MPI_COMM_WORLD);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // Errors come back as return codes that STRATA_CHECK_MPI turns into
  // messages, instead of MPI's default abort without context.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);

  CLI::App app{"strata: train transformer models under parallelism strategies and record what each costs"};
  app.set_version_flag("--version", fmt::format("strata {} ({})", STRATA_VERSION, STRATA_GIT_COMMIT));
  app.require_subcommand(1);
  std::string deck_path, output;
  std::vector<std::string> sets;
  bool dry_run = false;
  CLI::App* run = app.add_subcommand("run", "run the training job a deck describes and write its HDF5 report");
  run->add_option("deck", deck_path, "TOML deck (see docs/decks.md)")->required();
  run->add_option("--set", sets, "override a deck key: --set section.key=value (repeatable)");
  run->add_option("--output,-o", output, "report path (default: run.output, else results/<run.name>.h5)");
  run->add_flag("--dry-run", dry_run, "validate the deck, print the resolved configuration and memory estimate");

  int status = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "successes"; every real parse error is bad input.
    std::ostringstream quiet;  // only rank 0 speaks
    const int code = rank == 0 ? app.exit(e) : app.exit(e, quiet, quiet);
    MPI_Finalize();
    return code == 0 ? 0 : 2;
  }

  try {
    if (*run) status = run_command(deck_path, sets, output, dry_run, command_line);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::input) {
      if (rank == 0) fmt::print(stderr, "strata: error: {}\n", e.what());
      MPI_Finalize();
      return e.exit_code();
    }
    if (world > 1) strata::comm::abort_job(MPI_COMM_WORLD, rank, e.what(), e.exit_code());
    fmt::print(stderr, "strata: rank {} failed: {}\n", rank, e.what());
    MPI_Finalize();
    return e.exit_code();
  } catch (const std::exception& e) {
    if (world > 1) strata::comm::abort_job(MPI_COMM_WORLD, rank, e.what(), 1);
    fmt::print(stderr, "strata: rank {} failed: {}\n", rank, e.what());
    MPI_Finalize();
    return 1;
  }
  MPI_Finalize();
  return status;
}
