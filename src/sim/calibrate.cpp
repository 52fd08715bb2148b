#include "src/sim/calibrate.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/foundation/clock.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/foundation/trace.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/kernels.hpp"
#include "kernels/foundation/median.hpp"
#include "src/comm/backend.hpp"
#include "src/comm/mpi_check.hpp"
#include "src/report/output_path.hpp"
#include "src/sim/machine.hpp"
#include "src/sim/simulator.hpp"

namespace strata::sim {
namespace fs = std::filesystem;

namespace {

using core::median;

// Seconds per call: the median over batches of the batch's mean, each batch
// long enough to be read off the clock; every rank runs at once, and the
// slowest rank's figure is every rank's (a synchronous step goes at the pace
// of its slowest rank, and a node's devices are not always alike). With
// `spread`, how far the kept round's batches were apart.
double time_kernel(const std::function<void()>& f, double min_batch_s, MPI_Comm comm, double* spread = nullptr) {
  f();  // warm caches, pages and any lazy set-up
  kernels::synchronize();
  int reps = 1;
  for (;;) {
    const double t0 = prof::now_seconds();
    for (int i = 0; i < reps; ++i) f();
    kernels::synchronize();
    // Every rank decides alike: `f` may be a collective, called as often on each.
    double elapsed = prof::now_seconds() - t0;
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, comm));
    if (elapsed >= min_batch_s || reps >= (1 << 20)) break;
    reps *= 2;
  }
  // Up to three rounds of five batches while the batches spread beyond
  // kTrustedSpread (a moment's noise passes), the round that spread least
  // kept: its median, and its spread, the slowest rank's.
  double kept[2] = {0, 1e300};
  for (int round = 0; round < 3 && kept[1] > kTrustedSpread; ++round) {
    std::vector<double> batches;
    STRATA_CHECK_MPI(MPI_Barrier(comm));
    for (int b = 0; b < 5; ++b) {
      const double t0 = prof::now_seconds();
      for (int i = 0; i < reps; ++i) f();
      kernels::synchronize();
      batches.push_back((prof::now_seconds() - t0) / reps);
    }
    const double med = median(batches);
    double t[2] = {med, med > 0 ? (*std::max_element(batches.begin(), batches.end()) -
                                   *std::min_element(batches.begin(), batches.end())) / med
                                : 0};
    // Every rank decides alike whether to go on.
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, t, 2, MPI_DOUBLE, MPI_MAX, comm));
    if (t[1] < kept[1]) kept[0] = t[0], kept[1] = t[1];
  }
  if (spread != nullptr) *spread = kept[1];
  return kept[0];
}

// The bytes of operand sets a product's calibration cycles through: past a
// CPU core's private caches (1-2 MiB), as a step's working set is.
constexpr std::int64_t kColdBytes = std::int64_t(8) << 20;

// Device buffers of floats, freed at the end of calibration.
struct Buffers {
  std::vector<void*> all;
  ~Buffers() {
    for (void* p : all) kernels::device_free(p);
  }
  float* floats(std::int64_t n) {
    void* p = kernels::device_alloc(std::size_t(std::max<std::int64_t>(n, 1)) * sizeof(float));
    kernels::zero_bytes(p, std::size_t(std::max<std::int64_t>(n, 1)) * sizeof(float));
    all.push_back(p);
    return static_cast<float*>(p);
  }
};

// The cost the meta device declares for one call of `f` (its last kernel).
prof::TraceEvent declared_cost(const std::function<void()>& f) {
  const kernels::Device saved = kernels::device();
  const int ordinal = kernels::device_ordinal();
  prof::Trace t;
  {
    const prof::TraceScope scope(&t);
    kernels::use_device(kernels::Device::meta);
    f();
    kernels::use_device(saved, ordinal);
  }
  STRATA_CHECK(!t.events.empty(), "calibrate: a kernel declared no cost");
  return t.events.back();
}

// Least squares of t = a + x / b, relative (weights 1 / t^2): latency a,
// bandwidth b, and the RMS relative residual.
struct LineFit {
  double latency = 0, bandwidth = 0, residual = 0;
};
LineFit fit_line(const std::vector<double>& x, const std::vector<double>& t) {
  double sw = 0, sx = 0, st = 0, sxx = 0, sxt = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double w = 1.0 / (t[i] * t[i]);
    sw += w, sx += w * x[i], st += w * t[i], sxx += w * x[i] * x[i], sxt += w * x[i] * t[i];
  }
  const double det = sw * sxx - sx * sx;
  double slope = det != 0 ? (sw * sxt - sx * st) / det : 0, a = det != 0 ? (st - slope * sx) / sw : 0;
  if (slope <= 0) slope = 1e-15;  // no size dependence seen: a very fast link
  if (a < 0) {  // refit through the origin
    a = 0;
    slope = sxt / sxx;
  }
  LineFit f{a, 1.0 / slope, 0};
  double ss = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double r = (a + x[i] * slope - t[i]) / t[i];
    ss += r * r;
  }
  f.residual = std::sqrt(ss / double(x.size()));
  return f;
}

std::string host_name() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  return name;
}

// Write and read back `bytes` in a file under `dir`: the storage's bandwidth
// as offload to NVMe sees it (the page cache dropped before reading).
double measure_storage(const fs::path& dir, std::size_t bytes) {
  const fs::path p = dir / fmt::format(".strata-calibrate-{}.tmp", ::getpid());
  std::vector<char> buf(bytes, 1);
  const double t0 = prof::now_seconds();
  int fd = ::open(p.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  if (fd < 0) return 0;
  const bool wrote = ::write(fd, buf.data(), bytes) == ssize_t(bytes) && ::fsync(fd) == 0;
  ::close(fd);
  const double t1 = prof::now_seconds();
  fd = ::open(p.c_str(), O_RDONLY);
  double t2 = t1, t3 = t1;
  bool read_ok = false;
  if (fd >= 0) {
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    t2 = prof::now_seconds();
    read_ok = ::read(fd, buf.data(), bytes) == ssize_t(bytes);
    t3 = prof::now_seconds();
    ::close(fd);
  }
  std::error_code ec;
  fs::remove(p, ec);
  if (!wrote || !read_ok) return 0;
  return 2.0 * double(bytes) / ((t1 - t0) + (t3 - t2));
}

// The 1-minute load average (-1 where unknown).
double load_average() {
  double load = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  return load;
}

}  // namespace

std::vector<std::string> trust_problems(const Machine& m, const std::vector<Spread>& spreads, double load, int cores,
                                        int busy) {
  std::vector<std::string> out;
  if (load >= 0 && cores > 0 && load - busy > 0.5 * cores)
    out.push_back(fmt::format("the node was busy: a load average of {:.1f} on {} core(s) besides this job's {} thread(s); "
                              "measure again with nothing else running",
                              load, cores, busy));
  // One line for every noisy measurement, naming the worst.
  int noisy = 0;
  const Spread* worst = nullptr;
  for (const Spread& s : spreads) {
    if (s.spread <= kTrustedSpread) continue;
    ++noisy;
    if (worst == nullptr || s.spread > worst->spread) worst = &s;
  }
  if (worst != nullptr)
    out.push_back(fmt::format("{} of {} measurement(s) spread beyond {:.0f}% over three rounds of repeats (the "
                              "widest: {}, {:.0f}%); measure again on an idle machine",
                              noisy, spreads.size(), 100 * kTrustedSpread, worst->what, 100 * worst->spread));
  for (const CommFit& f : m.fits) {
    const std::string what = fmt::format("{} {}{} of {} rank(s)", f.level, f.nonblocking ? "non-blocking " : "", f.op,
                                         f.group_size);
    if (f.level == "node" && m.memory_bandwidth > 0 && f.bandwidth > m.memory_bandwidth)
      out.push_back(fmt::format("{}: {:.3f} GB/s of bus bandwidth, above the memory's {:.3f} GB/s, which it moves "
                                "through: the fit is wrong; measure again (without --quick for more sizes)",
                                what, f.bandwidth / 1e9, m.memory_bandwidth / 1e9));
    if (f.level == "node" && f.latency > kTrustedLatency)
      out.push_back(fmt::format("{}: a latency of {:.0f} us, more than {:.0f} us inside a node: other work had the "
                                "cores; measure again on an idle machine",
                                what, f.latency * 1e6, kTrustedLatency * 1e6));
    if (f.residual > kTrustedResidual)
      out.push_back(fmt::format("{}: the fit's residual is {:.0f}% (more than {:.0f}%): its times are not a latency "
                                "and a bandwidth; measure again",
                                what, 100 * f.residual, 100 * kTrustedResidual));
  }
  return out;
}

int calibrate(const CalibrateOptions& o, MPI_Comm comm) {
  int rank = 0, world = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &world));
  const auto [local, on_node] = comm::node_place(comm);
  // A GPU build on a node with GPUs measures them, a rank per GPU (as a run
  // places its ranks); otherwise the CPU, a rank per device.
  if (kernels::cuda_built() && kernels::gpu_count() > 0) kernels::use_device(kernels::Device::cuda, local % kernels::gpu_count());
  if (o.threads < 1) core::input_error("--threads {}: at least 1 thread per rank", o.threads);
  kernels::set_num_threads(o.threads);
  const double batch = o.quick ? 0.01 : 0.05;
  const std::string host = host_name();
  const std::string out = !o.output.empty() ? o.output : fmt::format("results/machine-{}.toml", host);
  // Before minutes of measuring: rank 0 judges the path, every rank ends on it.
  const std::string problem = comm::broadcast_string(
      rank == 0 ? report::output_file_problem(out, "machine description") : std::string(), comm);
  if (!problem.empty()) core::input_error("machine description path {}: {} (--output DIR/NAME.toml)", out, problem);
  auto say = [&](const std::string& s) {
    if (rank == 0) {
      fmt::print("{}", s);
      std::fflush(stdout);
    }
  };
  say(fmt::format("strata calibrate: {} rank(s), {} on this node, {} thread(s) each, {} ({})\n", world, on_node,
                  o.threads, kernels::backend_name(), o.quick ? "quick" : "full"));

  // Before anything runs: what else the node is doing.
  double load = rank == 0 ? load_average() : -1;
  STRATA_CHECK_MPI(MPI_Bcast(&load, 1, MPI_DOUBLE, 0, comm));
  std::vector<Spread> spreads;
  double spread = 0;

  Machine m;
  m.name = "machine-" + host;
  m.devices_per_node = on_node;
  m.gpu = kernels::device() == kernels::Device::cuda;
  m.matmul_efficiency = 1;  // peak is the best fitted rate: the CPU has no published one per rank
  Buffers buf;

  // ---- products: t = flops / (P d / (d + h)) over shapes, fitted in log space ----
  std::vector<std::array<int, 3>> shapes = {{64, 64, 64},   {128, 128, 128}, {256, 256, 256}, {512, 128, 128},
                                            {512, 512, 128}, {512, 128, 512}, {32, 512, 512}, {384, 384, 384}};
  if (!o.quick) shapes.insert(shapes.end(), {{512, 512, 512}, {1024, 256, 256}, {768, 768, 768}, {16, 1024, 1024}});
  std::vector<double> flops, dims, secs;
  say("  products (M N K: GFLOP/s):");
  for (const auto& [M, N, K] : shapes) {
    // A step's products read operands that other kernels wrote since (the
    // activations) or that were last read a layer ago (the weights): not in
    // the core's cache. Each call takes the next of several operand sets,
    // together past a core's cache, and so runs as a step's products run.
    const std::int64_t floats = std::int64_t(M) * K + std::int64_t(K) * N + std::int64_t(M) * N;
    const int sets = int(std::clamp<std::int64_t>(kColdBytes / (4 * floats), 1, 64));
    std::vector<std::array<float*, 3>> ops;
    for (int i = 0; i < sets; ++i)
      ops.push_back({buf.floats(std::int64_t(M) * K), buf.floats(std::int64_t(K) * N), buf.floats(std::int64_t(M) * N)});
    int next = 0;
    const double t = time_kernel(
        [&] {
          const auto [A, B, C] = ops[std::size_t(next)];
          next = (next + 1) % sets;
          kernels::matmul(false, false, M, N, K, 1.f, A, K, B, N, 0.f, C, N);
        },
        batch, comm, &spread);
    spreads.push_back({fmt::format("the {}x{}x{} product", M, N, K), spread});
    flops.push_back(2.0 * M * N * K), dims.push_back(std::min({M, N, K})), secs.push_back(t);
    say(fmt::format(" {}x{}x{}: {:.1f}", M, N, K, flops.back() / t / 1e9));
  }
  say("\n");
  double best_err = 1e300;
  for (double h = 0; h <= 1024; h += 1) {
    double lp = 0;
    for (std::size_t i = 0; i < secs.size(); ++i) lp += std::log(flops[i] * (dims[i] + h) / dims[i] / secs[i]);
    const double P = std::exp(lp / double(secs.size()));
    double err = 0;
    for (std::size_t i = 0; i < secs.size(); ++i) {
      const double r = std::log(flops[i] / (P * dims[i] / (dims[i] + h)) / secs[i]);
      err += r * r;
    }
    if (err < best_err) best_err = err, m.matmul_half_dim = h, m.peak_fp32 = P;
  }
  // The CPU computes every precision's products in fp32.
  m.peak_bf16 = m.peak_fp16 = m.peak_fp32;
  if (m.gpu) {
    // A GPU's 16-bit rate: the tensor cores' products, measured as large as fits.
    m.peak_bf16 = kernels::measure_gemm_flops(4096, o.quick ? 3 : 10, core::Precision::bf16);
    m.peak_fp16 = m.peak_bf16;
  }

  // ---- memory bandwidth, other arithmetic, launch latency ----
  const std::int64_t big = o.quick ? (std::int64_t(4) << 20) : (std::int64_t(16) << 20);
  {
    float* x = buf.floats(big);
    float* y = buf.floats(big);
    const double t = time_kernel([&] { kernels::add_inplace(y, x, big); }, batch, comm, &spread);
    spreads.push_back({"the memory bandwidth", spread});
    m.memory_bandwidth = 3.0 * 4 * double(big) / t;
    const std::int64_t small = 1 << 14;
    const double tg = time_kernel([&] { kernels::gelu_forward(y, x, small); }, batch, comm);
    m.vector_flops = 12.0 * double(small) / tg;
    m.launch_latency = time_kernel([&] { kernels::add_inplace(y, x, 16); }, batch, comm);
  }
  if (m.gpu) {
    // The host's share per GPU, for offloaded work, and the link to it.
    std::vector<float> hx(std::size_t(big), 1.0f), hy(std::size_t(big), 1.0f);
    const double th = time_kernel([&] { kernels::cpu::add_inplace(hy.data(), hx.data(), big); }, batch, comm);
    m.host_memory_bandwidth = 3.0 * 4 * double(big) / th;
    const std::int64_t small = 1 << 14;
    const double tg = time_kernel([&] { kernels::cpu::gelu_forward(hy.data(), hx.data(), small); }, batch, comm);
    m.host_vector_flops = 12.0 * double(small) / tg;
    float* d = buf.floats(big);
    const double tl = time_kernel([&] { kernels::copy_bytes(d, hx.data(), std::size_t(big) * 4); }, batch, comm);
    m.host_link_bandwidth = 4.0 * double(big) / tl;
  } else {
    m.host_memory_bandwidth = m.memory_bandwidth;
    m.host_vector_flops = m.vector_flops;
  }
  say(fmt::format("  fitted product peak {:.2f} GFLOP/s, half at d = {:.0f}; memory {:.2f} GB/s; other arithmetic "
                  "{:.2f} GFLOP/s; launch {:.2f} us\n",
                  m.peak_fp32 / 1e9, m.matmul_half_dim, m.memory_bandwidth / 1e9, m.vector_flops / 1e9,
                  m.launch_latency * 1e6));

  // ---- each kernel of a step against the model of its declared cost ----
  {
    const int B = 8, T = 64, C = 128, NH = 4, V = 256, N = B * T;
    const bool fused = kernels::device() == kernels::Device::cuda;
    float* in = buf.floats(std::int64_t(N) * 4 * C);
    float* out = buf.floats(std::int64_t(N) * 4 * C);
    float* g = buf.floats(std::int64_t(N) * 4 * C);
    float* w = buf.floats(std::int64_t(4 * C) * 4 * C);
    float* vec = buf.floats(4 * C);
    float* vec2 = buf.floats(4 * C);
    float* stats = buf.floats(N);
    float* stats2 = buf.floats(N);
    float* qkv = buf.floats(std::int64_t(N) * 3 * C);
    float* dqkv = buf.floats(std::int64_t(N) * 3 * C);
    float* att = buf.floats(kernels::attention_state_elements(fused, B, NH, T));
    float* datt = buf.floats(kernels::attention_scratch_elements(fused, B, NH, T, C, core::Precision::fp32));
    float* logits = buf.floats(std::int64_t(N) * V);
    float* wte = buf.floats(std::int64_t(V) * C);
    float* mm = buf.floats(std::int64_t(N) * V);
    auto* tokens = reinterpret_cast<std::int32_t*>(buf.floats(N));  // zeros: valid token ids
    const std::int64_t P = std::int64_t(4 * C) * 4 * C;
    const std::vector<std::pair<const char*, std::function<void()>>> ops = {
        {"linear_bias_forward", [&] { kernels::linear_bias_forward(out, in, w, vec, N, C, 4 * C, 0.f); }},
        {"bias_backward", [&] { kernels::bias_backward(vec, g, N, 4 * C); }},
        {"layernorm_forward", [&] { kernels::layernorm_forward(out, stats, stats2, in, vec, vec2, N, C); }},
        {"layernorm_backward", [&] { kernels::layernorm_backward(g, vec, vec2, out, in, vec, stats, stats2, N, C); }},
        {"rmsnorm_forward", [&] { kernels::rmsnorm_forward(out, stats, in, vec, N, C); }},
        {"rmsnorm_backward", [&] { kernels::rmsnorm_backward(g, vec, out, in, vec, stats, N, C); }},
        {"rope_forward", [&] { kernels::rope_forward(qkv, B, T, 3 * C, 2 * NH, C / NH, 0, 1e4f); }},
        {"rope_backward", [&] { kernels::rope_backward(dqkv, B, T, 3 * C, 2 * NH, C / NH, 0, 1e4f); }},
        {"swiglu_forward", [&] { kernels::swiglu_forward(out, in, N, 2 * C); }},
        {"swiglu_backward", [&] { kernels::swiglu_backward(g, in, out, N, 2 * C); }},
        {"gelu_forward", [&] { kernels::gelu_forward(out, in, std::int64_t(N) * 4 * C); }},
        {"gelu_backward", [&] { kernels::gelu_backward(g, in, out, std::int64_t(N) * 4 * C); }},
        {"residual_forward", [&] { kernels::residual_forward(out, in, g, std::int64_t(N) * C); }},
        {"add_inplace", [&] { kernels::add_inplace(out, in, std::int64_t(N) * C); }},
        {"scale_inplace", [&] { kernels::scale_inplace(out, 0.5f, std::int64_t(N) * C); }},
        {"fill_zero", [&] { kernels::fill_zero(g, std::int64_t(N) * C); }},
        {"attention_forward", [&] { kernels::attention_forward(out, att, qkv, B, T, C, NH, NH); }},
        {"attention_backward", [&] { kernels::attention_backward(dqkv, datt, g, qkv, out, att, B, T, C, NH, NH); }},
        {"embedding_forward", [&] { kernels::embedding_forward(out, tokens, wte, wte, B, T, C); }},
        {"embedding_backward", [&] { kernels::embedding_backward(g, g, in, tokens, B, T, C); }},
        {"softmax_cross_entropy_forward", [&] { kernels::softmax_cross_entropy_forward(stats, logits, tokens, N, V); }},
        {"softmax_cross_entropy_backward",
         [&] { kernels::softmax_cross_entropy_backward(mm, logits, tokens, 1.f / N, N, V); }},
        {"sum_squares", [&] { (void)kernels::sum_squares(w, P); }},
        {"adamw_update", [&] { kernels::adamw_update(w, g, out, in, std::min<std::int64_t>(P, std::int64_t(N) * 4 * C), 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1); }},
    };
    Machine plain = m;  // factors of 1
    say("  kernels (measured / modelled):");
    for (const auto& [name, f] : ops) {
      // The factor scales the model's time past the launch (simulator.hpp).
      const double t = time_kernel(f, batch, comm);
      const double model = kernel_time(plain, declared_cost(f), core::Precision::fp32) - plain.launch_latency;
      m.kernel_factors[name] = model > 0 ? std::max(0.01, (t - plain.launch_latency) / model) : 1.0;
      say(fmt::format(" {} {:.2f}", name, m.kernel_factors[name]));
    }
    say("\n");
  }

  // ---- collectives per group size, and the overlap of a non-blocking one ----
  const comm::Backend backend = m.gpu ? comm::Backend::nccl : comm::Backend::mpi;
  std::vector<int> sizes;
  for (int n = 2; n < world; n *= 2) sizes.push_back(n);
  if (world >= 2) sizes.push_back(world);
  const std::vector<double> bytes_list = o.quick ? std::vector<double>{4096, 16384, 65536, 262144, 1 << 20, 4 << 20}
                                                 : std::vector<double>{1024, 4096, 16384, 65536, 262144, 1 << 20,
                                                                       4 << 20, 16 << 20};
  const double max_bytes = bytes_list.back();
  float* a = buf.floats(std::int64_t(max_bytes / 4) * std::max(world, 2));
  float* b = buf.floats(std::int64_t(max_bytes / 4) * std::max(world, 2));
  std::map<int, int> most_per_node;  // group size -> the most of its ranks on one node
  for (int n : sizes) {
    MPI_Comm sub = MPI_COMM_NULL;
    STRATA_CHECK_MPI(MPI_Comm_split(comm, rank < n ? 0 : 1, rank, &sub));
    // The level: whether the group's ranks share a node.
    const int here = comm::node_place(sub).size;  // collective over sub: every rank calls it
    int most = rank < n ? here : 0;
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_INT, MPI_MAX, comm));
    most_per_node[n] = most;
    const std::string level = most < n ? "cluster" : "node";
    const auto c = comm::make_communicator(backend, sub, "calibrate");
    // The non-blocking forms the strategies issue (dp's buckets, ZeRO's
    // gathers and reduce-scatters), issued and waited for at once: MPI's
    // schedules for them are not its blocking algorithms.
    const std::vector<const char*> ops = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
                                          "send", "iall_reduce", "ireduce_scatter", "iall_gather"};
    for (const char* op_name : ops) {
      const bool nonblocking = op_name[0] == 'i';
      const char* op = nonblocking ? op_name + 1 : op_name;
      if (std::string(op) == "send" && n != 2) continue;  // point to point: one pair
      std::vector<double> xs, ts, sizes_moved;
      for (double bytes : bytes_list) {
        const std::int64_t count = std::int64_t(bytes / 4);
        std::function<void()> call;
        const std::string s = op;
        if (s == "all_reduce") call = [&] { c->all_reduce(a, count, comm::DType::f32, comm::ReduceOp::sum); };
        if (s == "reduce_scatter") call = [&] { c->reduce_scatter(a, b, count / n, comm::DType::f32, comm::ReduceOp::sum); };
        if (s == "all_gather") call = [&] { c->all_gather(a, b, count / n, comm::DType::f32); };
        if (nonblocking && s == "all_reduce")
          call = [&] { c->iall_reduce(a, count, comm::DType::f32, comm::ReduceOp::sum)->wait(); };
        if (nonblocking && s == "reduce_scatter")
          call = [&] { c->ireduce_scatter(a, b, count / n, comm::DType::f32, comm::ReduceOp::sum)->wait(); };
        if (nonblocking && s == "all_gather") call = [&] { c->iall_gather(a, b, count / n, comm::DType::f32)->wait(); };
        if (s == "all_to_all") call = [&] { c->all_to_all(a, b, count / n, comm::DType::f32); };
        if (s == "broadcast") call = [&] { c->broadcast(a, count, comm::DType::f32, 0); };
        if (s == "send")  // a ping-pong: half its round trip is one message
          call = [&] {
            if (c->rank() == 0) c->send(a, count, comm::DType::f32, 1, 7), c->recv(a, count, comm::DType::f32, 1, 7);
            if (c->rank() == 1) c->recv(a, count, comm::DType::f32, 0, 7), c->send(a, count, comm::DType::f32, 0, 7);
          };
        double t = 0;
        spread = 0;
        if (rank < n) t = time_kernel(call, batch, sub, &spread);
        STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &spread, 1, MPI_DOUBLE, MPI_MAX, comm));
        spreads.push_back({fmt::format("{} of {:.0f} B on {} rank(s)", op_name, bytes, n), spread});
        if (s == "send") t /= 2;
        STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm));  // the group's time
        const double moved = (s == "all_reduce" || s == "broadcast" || s == "send") ? double(count) * 4 : double(count / n * n) * 4;
        sizes_moved.push_back(moved);
        xs.push_back(moved * (s == "send" ? 1.0 : comm::busbw_factor(s, n)));
        ts.push_back(t);
      }
      const LineFit f = fit_line(xs, ts);
      m.fits.push_back({level, op, n, f.latency, f.bandwidth, f.residual, nonblocking, sizes_moved, ts});
      if (std::string(op) == "send")
        m.fits.push_back({level, "recv", n, f.latency, f.bandwidth, f.residual, false, sizes_moved, ts});
      say(fmt::format("  {:<16} n {:>3}: {:8.2f} us + bytes / {:8.3f} GB/s (residual {:.1f}%)\n", op_name, n,
                      f.latency * 1e6, f.bandwidth / 1e9, 100 * f.residual));
    }
    STRATA_CHECK_MPI(MPI_Comm_free(&sub));
  }
  // The node level's generic figures: the widest group's all-reduce.
  m.node.bandwidth = m.memory_bandwidth;
  // The levels' generic figures: the widest group's blocking all-reduce of
  // each; across nodes, as a node's injection bandwidth (docs/machines.md:
  // a group gets the share of its members on a node).
  for (const CommFit& f : m.fits) {
    if (f.op != "all_reduce" || f.nonblocking) continue;
    const double per_step = f.latency / (2.0 * (f.group_size - 1));
    if (f.level == "node") m.node.bandwidth = f.bandwidth, m.node.latency = per_step;
    if (f.level == "cluster")
      m.cluster.bandwidth = f.bandwidth * on_node / most_per_node[f.group_size], m.cluster.latency = per_step;
  }
  m.overlap = 1;
  if (world >= 2) {
    // Overlap: a 4 MiB all-reduce beside products of about the same length.
    const auto c = comm::make_communicator(backend, comm, "calibrate");
    const std::int64_t count = std::int64_t(4) << 18;
    const int d = 256;
    float* A = buf.floats(d * d);
    float* C = buf.floats(d * d);
    const double t_mm = time_kernel([&] { kernels::matmul(false, false, d, d, d, 1.f, A, d, A, d, 0.f, C, d); }, batch, comm);
    const double t_ar =
        time_kernel([&] { c->iall_reduce(a, count, comm::DType::f32, comm::ReduceOp::sum)->wait(); }, batch, comm);
    const int reps = std::max(1, int(t_ar / t_mm));
    auto compute = [&] {
      for (int i = 0; i < reps; ++i) kernels::matmul(false, false, d, d, d, 1.f, A, d, A, d, 0.f, C, d);
    };
    const double t_c = time_kernel(compute, batch, comm);
    const double t_both = time_kernel([&] {
      auto r = c->iall_reduce(a, count, comm::DType::f32, comm::ReduceOp::sum);
      compute();
      r->wait();
    }, batch, comm);
    double v[3] = {t_c, t_ar, t_both};
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_DOUBLE, MPI_MAX, comm));
    // The simulator's rule: both take t_c + max(0, t_ar - overlap x t_c).
    m.overlap = v[2] <= v[0] ? 1.0 : std::clamp((v[0] + v[1] - v[2]) / v[0], 0.0, 1.0);
    say(fmt::format("  overlap: all-reduce {:.2f} ms beside {:.2f} ms of products took {:.2f} ms: {:.2f}\n",
                    v[1] * 1e3, v[0] * 1e3, v[2] * 1e3, m.overlap));
    // Compute beside communication, at the full rate: the same products
    // while an all-reduce four times as large (it outlasts them) is in
    // flight, issued and left as in the overlap's measurement, timed to the
    // products' end; the median of seven over the products' time alone is
    // the slowdown at the overlap share, scaled to the full rate. Where
    // under half of a call moves beside compute (MPI without a progress
    // thread) there is no full-rate figure to scale to: 1.
    std::vector<double> runs;
    float* large = buf.floats(4 * count);
    for (int k = 0; k < 7; ++k) {
      STRATA_CHECK_MPI(MPI_Barrier(comm));
      auto r = c->iall_reduce(large, 4 * count, comm::DType::f32, comm::ReduceOp::sum);
      const double t0 = prof::now_seconds();
      compute();
      kernels::synchronize();
      runs.push_back(prof::now_seconds() - t0);
      r->wait();
    }
    double beside = median(runs);
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &beside, 1, MPI_DOUBLE, MPI_MAX, comm));
    m.compute_slowdown = m.overlap < 0.5 ? 1.0 : std::clamp(1 + (beside / v[0] - 1) / m.overlap, 1.0, 10.0);
    say(fmt::format("  compute beside communication: {:.2f} ms of products took {:.2f} ms at overlap {:.2f}: "
                    "slowdown at the full rate {:.3f}{}\n",
                    v[0] * 1e3, beside * 1e3, m.overlap, m.compute_slowdown,
                    m.overlap < 0.5 ? " (under half moves beside compute: none measured)" : ""));
  }

  // ---- memory sizes and storage ----
  const double phys = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
  m.host_memory = phys;
  m.memory = m.gpu ? double(kernels::device_memory().total) : phys / on_node;
  fs::path dir = fs::path(out).parent_path();
  if (dir.empty()) dir = ".";
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    m.nvme_bandwidth = measure_storage(dir, std::size_t(o.quick ? 32 : 256) << 20);
  }

  // Whether to trust it: said, and written into the file, with what to do.
  const std::vector<std::string> problems = trust_problems(m, spreads, load, int(::sysconf(_SC_NPROCESSORS_ONLN)),
                                                           on_node * o.threads);
  double worst = 0;
  for (const Spread& s : spreads) worst = std::max(worst, s.spread);
  say(fmt::format("  repeats: {} measurement(s), the widest spread {:.0f}%{}\n", spreads.size(), 100 * worst,
                  problems.empty() ? "; nothing found that makes the figures doubtful" : ""));
  for (const std::string& p : problems) say(fmt::format("  NOT TO BE TRUSTED: {}\n", p));

  if (rank == 0) {
    char when[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::string t;
    t += fmt::format("# Machine description measured by strata calibrate{} on {} at {}:\n# {}\n# {} rank(s), {} per node, {} thread(s) each. Every figure below was measured here;\n# docs/machines.md says what each means.\n",
                     o.quick ? " --quick" : "", host, when, o.command_line, world, on_node, o.threads);
    for (const std::string& p : problems) t += fmt::format("# NOT TO BE TRUSTED: {}\n", p);
    t += fmt::format("name = \"{}\"\ndescription = \"{} ({}, {} thread(s) per rank)\"\ndevices_per_node = {}\n\n", m.name,
                     host, kernels::backend_name(), o.threads, m.devices_per_node);
    t += "[device]\n";
    t += fmt::format("kind = \"{}\"\n", m.gpu ? "gpu" : "cpu");
    t += fmt::format("memory_gib = {:.3f}  # {}\n", m.memory / double(1ull << 30),
                     m.gpu ? "the device's" : "host memory over the ranks of the node");
    t += fmt::format("host_memory_gib = {:.3f}\n", m.host_memory / double(1ull << 30));
    t += fmt::format("peak_tflops_fp32 = {:.6f}  # fitted: products of every shape measured, as peak x d / (d + half_dim)\n", m.peak_fp32 / 1e12);
    t += fmt::format("peak_tflops_bf16 = {:.6f}\npeak_tflops_fp16 = {:.6f}\n", m.peak_bf16 / 1e12, m.peak_fp16 / 1e12);
    t += fmt::format("matmul_efficiency = {:.3f}\nmatmul_half_dim = {:.1f}\n", m.matmul_efficiency, m.matmul_half_dim);
    t += fmt::format("vector_tflops = {:.6f}  # gelu_forward in cache: 12 FLOP per element\n", m.vector_flops / 1e12);
    t += fmt::format("memory_bandwidth_gbs = {:.3f}  # add_inplace streaming {} MiB\n", m.memory_bandwidth / 1e9, 12 * big >> 20);
    t += fmt::format("launch_latency_us = {:.3f}  # add_inplace of 16 elements\n", m.launch_latency * 1e6);
    t += fmt::format("host_link_gbs = {:.3f}\n", m.host_link_bandwidth / 1e9);
    t += fmt::format("nvme_gbs = {:.3f}  # a file written (fsync) and read back in {}\n\n", m.nvme_bandwidth / 1e9, dir.string());
    if (m.gpu)
      t += fmt::format("[host]  # this node's cores and memory, measured by every rank at once\nvector_tflops = {:.6f}\n"
                       "memory_bandwidth_gbs = {:.3f}\n\n",
                       m.host_vector_flops / 1e12, m.host_memory_bandwidth / 1e9);
    t += "[kernels]  # measured time past the launch over the model's, for the kernel's declared cost\n";
    for (const auto& [k, v] : m.kernel_factors) t += fmt::format("{} = {:.4f}\n", k, v);
    t += fmt::format("\n[network]\noverlap = {:.3f}  # share of a non-blocking all-reduce made while computing\n"
                     "compute_slowdown = {:.3f}  # products beside a non-blocking all-reduce at the full rate, over "
                     "alone (1 where under half of one moves beside compute)\n\n",
                     m.overlap, m.compute_slowdown);
    t += fmt::format("[network.node]  # the widest group's all-reduce\nbandwidth_gbs = {:.4f}\nlatency_us = {:.3f}\n",
                     m.node.bandwidth / 1e9, m.node.latency * 1e6);
    if (m.cluster.bandwidth > 0)
      t += fmt::format("\n[network.cluster]  # the widest group across nodes: its all-reduce\nbandwidth_gbs = {:.4f}\n"
                       "latency_us = {:.3f}\n",
                       m.cluster.bandwidth / 1e9, m.cluster.latency * 1e6);
    for (const CommFit& f : m.fits) {
      t += fmt::format("\n[[network.fit]]\nlevel = \"{}\"\nop = \"{}\"\nnonblocking = {}\ngroup_size = {}\nlatency_us = {:.3f}\nbandwidth_gbs = {:.4f}\nresidual = {:.4f}\n",
                       f.level, f.op, f.nonblocking, f.group_size, f.latency * 1e6, f.bandwidth / 1e9, f.residual);
      std::vector<std::string> us;
      for (double x : f.seconds) us.push_back(fmt::format("{:.3f}", x * 1e6));
      t += fmt::format("bytes = [{:.0f}]\ntime_us = [{}]\n", fmt::join(f.bytes, ", "), fmt::join(us, ", "));
    }
    (void)parse_machine(out, t);  // what it writes, it can read
    const std::string partial = out + ".partial";
    {
      std::ofstream f(partial, std::ios::binary);
      f << t;
      if (!f) core::runtime_error("{}: cannot write the machine description", partial);
    }
    fs::rename(partial, out);
    fmt::print("machine description: {} (strata simulate DECK --machine {}){}\n", out, out,
               problems.empty() ? "" : fmt::format("; {} problem(s) above make its predictions doubtful", problems.size()));
  }
  return 0;
}

}  // namespace strata::sim
