// strata::kernels: every operation of kernels/ops.inc forwarded to the
// backend of the selected device, and the device's runtime (selection,
// memory, copies). The one place that knows both backends: models and
// strategies call strata::kernels and never name one.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/onednn.hpp"
#include "kernels/foundation/clock.hpp"
#include "kernels/foundation/timeline.hpp"
#include "kernels/kernels.hpp"
#include "kernels/meta/meta_kernels.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/foundation/module.hpp"
#include "kernels/backend_table.hpp"

namespace strata::kernels {

namespace {
Device g_device = Device::cpu;
int g_ordinal = 0;

// The device backends, each a module (kernels/backend_table.hpp): the one
// list of them. Adding a backend is adding a row (and its folder).
struct BackendRow {
  Device device;
  const char* module;  // libstrata_<module>.so
  bool built;          // this build has it
  const char* how;     // how to get a build that has it
};
constexpr BackendRow kBackends[] = {
    {Device::cuda, "cuda", STRATA_HAVE_CUDA != 0, "STRATA_WITH_CUDA=ON, or AUTO with nvcc found"},
    {Device::kokkos, "kokkos", STRATA_HAVE_KOKKOS != 0, "STRATA_WITH_KOKKOS=ON, or AUTO with Kokkos found"},
};

const BackendRow* backend_row(Device d) {
  for (const BackendRow& r : kBackends)
    if (r.device == d) return &r;
  return nullptr;
}

// Device `d`'s module table, loaded on the first call; a runtime error if
// this build has none or it does not load.
const DeviceBackend& backend_table(Device d) {
  const BackendRow& r = *backend_row(d);
  if (!r.built)
    core::runtime_error("backend.device = \"{}\" needs a build with that backend ({}); this build has {}",
                        device_name(d), r.how, built_devices());
  static std::mutex mutex;
  static std::map<Device, const DeviceBackend*> tables;
  std::lock_guard lock(mutex);
  const DeviceBackend*& t = tables[d];
  if (t == nullptr) t = &core::module_table<DeviceBackend>(r.module, backend_entry(r.module).c_str(), kBackendAbi);
  return *t;
}

// The selected device's table; null on the CPU and the meta device.
const DeviceBackend* g_backend = nullptr;
bool on_device() { return g_backend != nullptr; }

bool on_meta() { return g_device == Device::meta; }

// guard_device_memory's region, open while any kernel or copy runs (a count,
// since the optimizer's copy threads run beside the main thread's kernels).
struct Guard {
  std::mutex mutex;
  char* base = nullptr;
  std::size_t bytes = 0;
  int open = 0;
} g_guard;

void protect(int prot) {
  if (mprotect(g_guard.base, g_guard.bytes, prot) != 0)
    core::runtime_error("mprotect of the guarded device memory: {}", std::strerror(errno));
}

class OpenGuard {
 public:
  OpenGuard() : on_(g_guard.base != nullptr) {
    if (!on_) return;
    std::lock_guard lock(g_guard.mutex);
    if (g_guard.open++ == 0) protect(PROT_READ | PROT_WRITE);
  }
  ~OpenGuard() {
    if (!on_) return;
    std::lock_guard lock(g_guard.mutex);
    if (--g_guard.open == 0) protect(PROT_NONE);
  }
  OpenGuard(const OpenGuard&) = delete;
  OpenGuard& operator=(const OpenGuard&) = delete;

 private:
  bool on_;
};
}  // namespace

// On the meta device an operation only counts its cost (kernels/meta/) and
// returns its type's zero.
#define STRATA_DISPATCH(op, ...)                      \
  if (on_meta()) return meta::op(__VA_ARGS__);        \
  if (on_device()) return g_backend->op(__VA_ARGS__); \
  const OpenGuard open_guard;                         \
  return cpu::op(__VA_ARGS__)

namespace {
struct MetaCount {
  std::mutex mutex;
  std::map<std::pair<int, std::string>, WorkCost> costs;
} g_meta;
}  // namespace

void count_meta_cost(const char* name, double matmul_flops, double other_flops, double bytes, int m, int n, int k) {
  const prof::Work& w = prof::current_work();
  if (prof::Trace* t = prof::current_trace()) {
    prof::TraceEvent e;
    e.kind = prof::TraceEvent::Kind::kernel;
    e.name = name;
    e.matmul_flops = matmul_flops, e.other_flops = other_flops, e.bytes = bytes;
    e.m = m, e.n = n, e.k = k;
    e.recompute = w.recompute;
    e.host = w.host;
    e.layer = w.layer;
    e.phase = w.phase;
    t->events.push_back(e);
  }
  const std::string phase = w.recompute ? "recompute" : prof::phase_name(w.phase);
  std::lock_guard lock(g_meta.mutex);
  WorkCost& c = g_meta.costs[{w.layer, phase}];
  c.layer = w.layer;
  c.phase = phase;
  c.matmul_flops += matmul_flops;
  c.other_flops += other_flops;
  c.bytes += bytes;
  ++c.kernels;
}

std::vector<WorkCost> meta_costs() {
  std::lock_guard lock(g_meta.mutex);
  std::vector<WorkCost> out;
  for (const auto& [key, c] : g_meta.costs) out.push_back(c);
  return out;
}

void reset_meta_costs() {
  std::lock_guard lock(g_meta.mutex);
  g_meta.costs.clear();
}

void guard_device_memory(void* base, std::size_t bytes) {
  STRATA_CHECK(!on_device(), "guard_device_memory stands in for a device on the CPU backend");
  std::lock_guard lock(g_guard.mutex);
  if (g_guard.base != nullptr) protect(PROT_READ | PROT_WRITE);
  g_guard.base = bytes > 0 ? static_cast<char*>(base) : nullptr;
  g_guard.bytes = bytes;
  g_guard.open = 0;
  if (g_guard.base != nullptr) protect(PROT_NONE);
}

const char* device_name(Device d) {
  switch (d) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
    case Device::kokkos: return "kokkos";
    case Device::meta: return "meta";
  }
  return "?";
}

bool cuda_built() { return STRATA_HAVE_CUDA != 0; }

bool kokkos_built() { return STRATA_HAVE_KOKKOS != 0; }

std::string built_devices() {
  std::string out = "cpu";
  for (const BackendRow& r : kBackends)
    if (r.built) out += std::string(", ") + device_name(r.device);
  return out;
}

void use_device(Device d, int ordinal) {
  const DeviceBackend* table = nullptr;
  if (backend_row(d) != nullptr) {
    table = &backend_table(d);
    const int n = table->device_count();
    if (ordinal < 0 || ordinal >= n)
      core::runtime_error("backend.device = \"{}\": device {} asked for, {}", device_name(d), ordinal,
                          table->describe_devices());
    table->use_device(ordinal);
  }
  g_backend = table;
  g_device = d;
  g_ordinal = ordinal;
}

Device device() { return g_device; }

int device_ordinal() { return g_ordinal; }

bool is_meta() { return on_meta(); }

bool host_memory() { return !on_device() || g_backend->host_accessible(); }

int device_count(Device d) {
  const BackendRow* r = backend_row(d);
  if (r == nullptr) return d == Device::cpu ? 1 : 0;
  return r->built ? backend_table(d).device_count() : 0;
}

std::string describe_devices(Device d) {
  const BackendRow* r = backend_row(d);
  if (r == nullptr) return device_name(d);
  return r->built ? backend_table(d).describe_devices()
                  : fmt::format("this build has no {} backend", device_name(d));
}

int gpu_count() { return device_count(Device::cuda); }

std::string describe_gpus() { return cuda_built() ? describe_devices(Device::cuda) : "this build has no CUDA backend"; }

std::string cpu_blas_version();  // kernels/cpu/runtime.cpp

std::string library_versions() {
  if (on_device()) return g_backend->describe_versions();
  return cpu_blas_version() + "; " + cpu::onednn_description();
}

const char* backend_name() { return on_device() ? g_backend->backend_name() : on_meta() ? "meta" : "cpu/openblas-openmp"; }

void* device_alloc(std::size_t bytes) {
  STRATA_CHECK(!on_meta(), "device memory on the meta device, which has none");
  if (on_device()) return g_backend->malloc_device(bytes);
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (p == nullptr) core::runtime_error("out of host memory: {} bytes", bytes);
  return p;
}

void device_free(void* p) {
  if (on_device()) return g_backend->free_device(p);
  std::free(p);
}

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (on_meta()) return count_meta_cost("copy_bytes", 0, 0, 2.0 * double(bytes));
  if (on_device()) return g_backend->copy_bytes(dst, src, bytes);
  const OpenGuard open_guard;
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

void zero_bytes(void* p, std::size_t bytes) {
  if (on_meta()) return count_meta_cost("zero_bytes", 0, 0, double(bytes));
  if (on_device()) return g_backend->zero_bytes(p, bytes);
  const OpenGuard open_guard;
  if (bytes > 0) std::memset(p, 0, bytes);
}

void synchronize() {
  if (on_device()) g_backend->synchronize();
}

DeviceMemory device_memory() {
  DeviceMemory m;
  if (on_device()) {
    g_backend->memory_info(&m.free, &m.total);
    return m;
  }
  const long page = sysconf(_SC_PAGESIZE);
  m.free = std::size_t(sysconf(_SC_AVPHYS_PAGES)) * std::size_t(page);
  m.total = std::size_t(sysconf(_SC_PHYS_PAGES)) * std::size_t(page);
  return m;
}

double measure_gemm_flops(int n, int reps, core::Precision p) {
  if (on_meta()) return 0;
  if (on_device()) return g_backend->measure_gemm_flops(n, reps, p);
  std::vector<float> a(std::size_t(n) * n), b(std::size_t(n) * n), c(std::size_t(n) * n);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = float(i % 13) * 0.01f;
    b[i] = float(i % 7) * 0.02f;
  }
  if (p == core::Precision::fp32)
    return prof::best_rate(2.0 * double(n) * n * n, reps, [&] {
      cpu::matmul(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    });
  // Under mixed precision the run's GEMMs are 16-bit: measure those.
  std::vector<std::uint16_t> ah(a.size()), bh(b.size()), ch(c.size());
  const core::Ptr A(ah.data(), p), B(bh.data(), p), C(ch.data(), p);
  cpu::convert(A, a.data(), std::int64_t(a.size()));
  cpu::convert(B, b.data(), std::int64_t(b.size()));
  return prof::best_rate(2.0 * double(n) * n * n, reps,
                         [&] { cpu::matmul(false, false, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n); });
}

std::int64_t attention_state_elements(bool fused, int B, int NH, int T) {
  return fused ? std::int64_t(B) * NH * T : std::int64_t(B) * NH * T * T;
}

std::int64_t attention_scratch_elements(bool fused, int B, int NH, int T, int C, core::Precision act) {
  if (!fused) return attention_state_elements(false, B, NH, T);
  return std::int64_t(B) * NH * T + (act == core::Precision::fp32 ? 0 : std::int64_t(B) * T * C);
}

const char* cpu_gemm_path(core::Precision p) { return cpu::onednn_gemm(p) ? "onednn" : "openblas"; }

// ---- the operations ----

void matmul(bool trans_a, bool trans_b, int M, int N, int K, float alpha, core::CPtr A, int lda, core::CPtr B, int ldb, float beta, core::Ptr C, int ldc) {
  STRATA_DISPATCH(matmul, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void matmul_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, core::CPtr A, int lda, std::int64_t stride_a, core::CPtr B, int ldb, std::int64_t stride_b, float beta, core::Ptr C, int ldc, std::int64_t stride_c, int batch) {
  STRATA_DISPATCH(matmul_strided_batched, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch);
}

void linear_bias_forward(core::Ptr out, core::CPtr inp, core::CPtr w, core::CPtr bias, int N, int IC, int OC, float beta) {
  STRATA_DISPATCH(linear_bias_forward, out, inp, w, bias, N, IC, OC, beta);
}

void bias_add(core::Ptr out, core::CPtr bias, int N, int C) {
  STRATA_DISPATCH(bias_add, out, bias, N, C);
}

void bias_backward(float* dbias, core::CPtr dout, int N, int C) {
  STRATA_DISPATCH(bias_backward, dbias, dout, N, C);
}

void layernorm_forward(core::Ptr out, float* mean, float* rstd, core::CPtr inp, core::CPtr weight, core::CPtr bias, int N, int C, float eps) {
  STRATA_DISPATCH(layernorm_forward, out, mean, rstd, inp, weight, bias, N, C, eps);
}

void layernorm_backward(core::Ptr dinp, float* dweight, float* dbias, core::CPtr dout, core::CPtr inp, core::CPtr weight, const float* mean, const float* rstd, int N, int C) {
  STRATA_DISPATCH(layernorm_backward, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

void rmsnorm_forward(core::Ptr out, float* rstd, core::CPtr inp, core::CPtr weight, int N, int C, float eps) {
  STRATA_DISPATCH(rmsnorm_forward, out, rstd, inp, weight, N, C, eps);
}

void rmsnorm_backward(core::Ptr dinp, float* dweight, core::CPtr dout, core::CPtr inp, core::CPtr weight, const float* rstd, int N, int C) {
  STRATA_DISPATCH(rmsnorm_backward, dinp, dweight, dout, inp, weight, rstd, N, C);
}

void rope_forward(core::Ptr x, int B, int T, std::int64_t ld, int heads, int hs, int pos0, float theta) {
  STRATA_DISPATCH(rope_forward, x, B, T, ld, heads, hs, pos0, theta);
}

void rope_backward(core::Ptr dx, int B, int T, std::int64_t ld, int heads, int hs, int pos0, float theta) {
  STRATA_DISPATCH(rope_backward, dx, B, T, ld, heads, hs, pos0, theta);
}

void swiglu_forward(core::Ptr out, core::CPtr inp, int N, int F) {
  STRATA_DISPATCH(swiglu_forward, out, inp, N, F);
}

void swiglu_backward(core::Ptr dinp, core::CPtr inp, core::CPtr dout, int N, int F) {
  STRATA_DISPATCH(swiglu_backward, dinp, inp, dout, N, F);
}

void gelu_forward(core::Ptr out, core::CPtr inp, std::int64_t n) {
  STRATA_DISPATCH(gelu_forward, out, inp, n);
}

void gelu_backward(core::Ptr dinp, core::CPtr inp, core::CPtr dout, std::int64_t n) {
  STRATA_DISPATCH(gelu_backward, dinp, inp, dout, n);
}

void residual_forward(core::Ptr out, core::CPtr a, core::CPtr b, std::int64_t n) {
  STRATA_DISPATCH(residual_forward, out, a, b, n);
}

void add_inplace(core::Ptr y, core::CPtr x, std::int64_t n) {
  STRATA_DISPATCH(add_inplace, y, x, n);
}

void scale_inplace(core::Ptr x, float s, std::int64_t n) {
  STRATA_DISPATCH(scale_inplace, x, s, n);
}

void fill_zero(core::Ptr x, std::int64_t n) {
  STRATA_DISPATCH(fill_zero, x, n);
}

void convert(core::Ptr y, core::CPtr x, std::int64_t n) {
  STRATA_DISPATCH(convert, y, x, n);
}

double sum_squares(core::CPtr x, std::int64_t n) {
  STRATA_DISPATCH(sum_squares, x, n);
}

void causal_softmax_forward(core::Ptr p, std::int64_t count, int T) {
  STRATA_DISPATCH(causal_softmax_forward, p, count, T);
}

void causal_softmax_backward(core::Ptr dp, core::CPtr p, std::int64_t count, int T) {
  STRATA_DISPATCH(causal_softmax_backward, dp, p, count, T);
}

void attention_forward(core::Ptr out, core::Ptr state, core::CPtr qkv, int B, int T, int C, int NH, int NKV) {
  STRATA_DISPATCH(attention_forward, out, state, qkv, B, T, C, NH, NKV);
}

void attention_backward(core::Ptr dqkv, core::Ptr scratch, core::CPtr dout, core::CPtr qkv, core::CPtr out, core::CPtr state, int B, int T, int C, int NH, int NKV) {
  STRATA_DISPATCH(attention_backward, dqkv, scratch, dout, qkv, out, state, B, T, C, NH, NKV);
}

void attention_block_forward(core::Ptr out, float* lse, core::CPtr q, core::CPtr kv, int B, int Tq, int Tk, int C, int NH, int NKV, std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0, bool accumulate) {
  STRATA_DISPATCH(attention_block_forward, out, lse, q, kv, B, Tq, Tk, C, NH, NKV, q_batch, kv_batch, q0, k0, accumulate);
}

void attention_block_backward(core::Ptr dq, core::Ptr dkv, core::CPtr dout, core::CPtr q, core::CPtr kv, core::CPtr out, const float* lse, int B, int Tq, int Tk, int C, int NH, int NKV, std::int64_t q_batch, std::int64_t kv_batch, int q0, int k0) {
  STRATA_DISPATCH(attention_block_backward, dq, dkv, dout, q, kv, out, lse, B, Tq, Tk, C, NH, NKV, q_batch, kv_batch, q0, k0);
}

void copy_rows(core::Ptr dst, std::int64_t ld_dst, core::CPtr src, std::int64_t ld_src, std::int64_t rows, std::int64_t cols, bool add) {
  STRATA_DISPATCH(copy_rows, dst, ld_dst, src, ld_src, rows, cols, add);
}

void embedding_forward(core::Ptr out, const std::int32_t* tokens, core::CPtr wte, core::CPtr wpe, int B, int T, int C, int v_begin, int v_count) {
  STRATA_DISPATCH(embedding_forward, out, tokens, wte, wpe, B, T, C, v_begin, v_count);
}

void embedding_backward(float* dwte, float* dwpe, core::CPtr dout, const std::int32_t* tokens, int B, int T, int C, int v_begin, int v_count) {
  STRATA_DISPATCH(embedding_backward, dwte, dwpe, dout, tokens, B, T, C, v_begin, v_count);
}

void add_position_rows(core::Ptr out, core::CPtr wpe, int rows, int C, int T, int r0) {
  STRATA_DISPATCH(add_position_rows, out, wpe, rows, C, T, r0);
}

void softmax_cross_entropy_forward(float* losses, core::CPtr logits, const std::int32_t* targets, int N, int V) {
  STRATA_DISPATCH(softmax_cross_entropy_forward, losses, logits, targets, N, V);
}

void softmax_cross_entropy_backward(core::Ptr dlogits, core::CPtr logits, const std::int32_t* targets, float dloss, int N, int V) {
  STRATA_DISPATCH(softmax_cross_entropy_backward, dlogits, logits, targets, dloss, N, V);
}

void row_max(float* m, core::CPtr logits, int N, int V) {
  STRATA_DISPATCH(row_max, m, logits, N, V);
}

void row_exp_sum(float* s, core::CPtr logits, const float* m, int N, int V) {
  STRATA_DISPATCH(row_exp_sum, s, logits, m, N, V);
}

void pick_target_logits(float* x, core::CPtr logits, const std::int32_t* targets, int v_begin, int N, int V) {
  STRATA_DISPATCH(pick_target_logits, x, logits, targets, v_begin, N, V);
}

void cross_entropy_from_parts(float* losses, const float* m, const float* s, const float* x, int N) {
  STRATA_DISPATCH(cross_entropy_from_parts, losses, m, s, x, N);
}

void softmax_cross_entropy_backward_sharded(core::Ptr dlogits, core::CPtr logits, const float* m, const float* s, const std::int32_t* targets, int v_begin, float dloss, int N, int V) {
  STRATA_DISPATCH(softmax_cross_entropy_backward_sharded, dlogits, logits, m, s, targets, v_begin, dloss, N, V);
}

double sum_squares_tensors(const void* const* xs, const std::int64_t* ns, const double* divisors, int count, core::Precision p) {
  STRATA_DISPATCH(sum_squares_tensors, xs, ns, divisors, count, p);
}

void adamw_update_mixed(float* master, std::uint16_t* param, const std::uint16_t* grad, float grad_scale, float* m, float* v, std::int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int step, core::Precision p) {
  STRATA_DISPATCH(adamw_update_mixed, master, param, grad, grad_scale, m, v, n, lr, beta1, beta2, eps, weight_decay, step, p);
}

void adamw_update(float* param, const float* grad, float* m, float* v, std::int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int step) {
  STRATA_DISPATCH(adamw_update, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
}

}  // namespace strata::kernels
