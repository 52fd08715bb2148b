#include "src/train/peak.hpp"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "kernels/kernels.hpp"
#include "src/comm/mpi_check.hpp"
#include "src/sim/machine.hpp"
#include "src/train/run_report.hpp"

namespace strata::train {

namespace fs = std::filesystem;

std::string peak_cache_dir() {
  if (const char* d = std::getenv("STRATA_PEAK_CACHE"); d != nullptr && *d != '\0') return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') return std::string(x) + "/strata/peak";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') return std::string(h) + "/.cache/strata/peak";
  return "";
}

namespace {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

// The precision whose GEMM rate is the device's peak for a run: its own,
// but on a CPU without a 16-bit GEMM (no oneDNN path for it) fp32's, since
// its 16-bit products are widened to sgemm there. One figure per machine and
// precision the hardware has: widening is the kernel's cost, not a slower
// peak, and a peak measured through it would raise MFU by the conversion.
core::Precision peak_precision(const plan::Plan& cfg) {
  const core::Precision p = cfg.backend.precision;
  if (p != core::Precision::fp32 && kernels::device() == kernels::Device::cpu &&
      std::string(kernels::cpu_gemm_path(p)) != "onednn")
    return core::Precision::fp32;
  return p;
}

// What multiplies a run's matrices on this device at the precision of its
// peak.
std::string gemm_name(const plan::Plan& cfg) {
  const core::Precision p = peak_precision(cfg);
  const bool half = p != core::Precision::fp32;
  switch (kernels::device()) {
    case kernels::Device::kokkos: return half ? fmt::format("Kokkos {} GEMM", core::precision_name(p)) : "KokkosBlas sgemm";
    case kernels::Device::cuda: return half ? fmt::format("cuBLAS {} GEMM", core::precision_name(p)) : "cuBLAS sgemm";
    default:
      return half ? fmt::format("oneDNN {} matmul", core::precision_name(p)) : "sgemm";
  }
}

// A file name from the parts that change the figure.
std::string cache_file(const plan::Plan& cfg) {
  std::string backend = kernels::backend_name(), gemm = gemm_name(cfg);
  for (std::string* s : {&backend, &gemm})
    for (char& c : *s)
      if (c == '/' || c == ' ') c = '_';
  return fmt::format("{}/{}.{}.{}.{}.t{}", peak_cache_dir(), host_name(), backend,
                     core::precision_name(peak_precision(cfg)), gemm, kernels::num_threads());
}

// The cached figure, or 0 when there is none (or it does not read back).
double read_cache(const std::string& path, std::string* how) {
  std::ifstream in(path);
  double flops = 0;
  if (!(in >> flops) || !(flops > 0)) return 0;
  std::getline(in >> std::ws, *how);
  return flops;
}

// Written under a temporary name and renamed, so that a run reading it
// never sees half a file; "" when written, else why not.
std::string write_cache(const std::string& path, double flops, const std::string& how) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) return ec.message();
  const std::string tmp = fmt::format("{}.{}.tmp", path, getpid());
  {
    std::ofstream out(tmp);
    out << fmt::format("{:.17g} {}\n", flops, how);
    if (!out.flush()) return "cannot write " + tmp;
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return ec.message();
  }
  return "";
}

Peak measure_or_read(const plan::Plan& cfg) {
  const std::string dir = peak_cache_dir(), path = dir.empty() ? "" : cache_file(cfg);
  const core::Precision at = peak_precision(cfg);
  const std::string widened =
      at != cfg.backend.precision
          ? fmt::format("; {} products are widened to sgemm on this CPU: its peak is fp32's",
                        core::precision_name(cfg.backend.precision))
          : "";
  std::string how;
  if (const double f = path.empty() ? 0 : read_cache(path, &how); f > 0)
    return {f, fmt::format("cached: {} ({}){}", path, how, widened)};
  const bool gpu = !kernels::host_memory();
  // A GPU needs large products to reach its rate; the CPU's is reached at 1024.
  const int n = gpu ? 8192 : 1024, reps = 5;
  const double f = kernels::measure_gemm_flops(n, reps, at);
  how = fmt::format("{} {}^3, best of {}, {} thread(s), measured {}", gemm_name(cfg), n, reps, kernels::num_threads(),
                    iso_time_utc());
  if (path.empty())
    return {f, fmt::format("measured: {} (not cached: neither STRATA_PEAK_CACHE, XDG_CACHE_HOME nor HOME is set){}",
                           how, widened)};
  const std::string why = write_cache(path, f, how);
  return {f, why.empty() ? fmt::format("measured: {} (cached to {}){}", how, path, widened)
                         : fmt::format("measured: {} (not cached: {}: {}){}", how, path, why, widened)};
}

}  // namespace

Peak resolve_peak(const plan::Plan& cfg, MPI_Comm comm) {
  if (cfg.backend.peak_tflops > 0) return {cfg.backend.peak_tflops * 1e12, "backend.peak_tflops"};
  if (!cfg.backend.machine.empty()) {
    const sim::Machine m = sim::load_machine(cfg.backend.machine);
    return {m.peak(cfg.backend.precision),
            fmt::format("machine {} ({}): device.peak_tflops_{}", m.name, m.path,
                        core::precision_name(cfg.backend.precision))};
  }
  // One rank per node measures or reads; the others sleep until it has
  // (a blocking broadcast would spin on the cores it measures).
  MPI_Comm node = MPI_COMM_NULL;
  STRATA_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(node, &local));
  Peak p;
  if (local == 0) p = measure_or_read(cfg);
  std::vector<char> text(p.source.begin(), p.source.end());
  double head[2] = {p.flops_per_s, double(text.size())};
  MPI_Request req = MPI_REQUEST_NULL;
  STRATA_CHECK_MPI(MPI_Ibcast(head, 2, MPI_DOUBLE, 0, node, &req));
  for (int done = 0;;) {
    STRATA_CHECK_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  text.resize(std::size_t(head[1]));
  STRATA_CHECK_MPI(MPI_Bcast(text.data(), int(text.size()), MPI_CHAR, 0, node));
  STRATA_CHECK_MPI(MPI_Comm_free(&node));
  return {head[0], std::string(text.begin(), text.end())};
}

}  // namespace strata::train
