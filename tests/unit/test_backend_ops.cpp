// Every operation of the kernel interface on every device backend that was
// built, against the CPU backend, on the same fresh random inputs (as ggml's
// test-backend-ops): one case per operation of kernels/ops.inc, run once per
// backend (cuda, kokkos). The list of operations is the build's
// (generated/kernel_ops.inc), so an operation without a case here fails
// EveryOperationHasACase, and a new backend is tested on every operation by
// adding it to backends().
//
// Bounds: fp32 results within 1e-5 relative (elementwise and AdamW, whose
// per-element arithmetic is the same code, to a few ulps; reductions summed
// in another order, GEMMs, bias and embedding gradients, cross-entropy fused
// and in vocabulary-parallel pieces, to that bound: the losses relative to
// the largest, the gradient's target entry to a few ulps of the loss scale
// as well); LayerNorm's forward within the bound plus the CPU's own distance
// from a double-precision reference; LayerNorm's dx and attention's tensors
// relative to their largest entry; copies, adds, scaling and the bias add
// equal; the 16-bit conversions, the 16-bit adds (up to which NaN a NaN + NaN
// gives) and the mixed-precision AdamW step bit-identical (the same scalar
// code on both sides); the sums of squares within 1e-12 (fp32) and 1e-9
// (16-bit). A backend without a device here (cuda on a machine without a
// GPU) skips and says why; its kernels are still compiled and linked.
// Seed: fresh per run, printed on failure; rerun with STRATA_TEST_SEED.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/kernels.hpp"

// The device in test names and messages: "kokkos", not its bytes.
namespace strata::kernels {
void PrintTo(Device d, std::ostream* os) { *os << device_name(d); }
}  // namespace strata::kernels

namespace cpu = strata::kernels::cpu;
namespace k = strata::kernels;
namespace core = strata::core;

namespace {

using Vec = std::vector<float>;
using Bits = std::vector<std::uint16_t>;
using Tokens = std::vector<std::int32_t>;

unsigned test_seed() {
  if (const char* s = std::getenv("STRATA_TEST_SEED")) return unsigned(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

Vec uniform(std::mt19937& g, std::size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

Tokens tokens(std::mt19937& g, std::size_t n, int V) {
  std::uniform_int_distribution<int> d(0, V - 1);
  Tokens t(n);
  for (auto& x : t) x = d(g);
  return t;
}

Bits random_bits(std::mt19937& g, std::size_t n) {
  std::uniform_int_distribution<int> d(0, 0xffff);
  Bits v(n);
  for (auto& x : v) x = std::uint16_t(d(g));
  return v;
}

Bits narrowed(const Vec& x, core::Precision p) {
  Bits h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = core::float_to_half(x[i], p);
  return h;
}

// A copy of a host vector in the selected device's memory, freed with the object.
template <typename T>
class On {
 public:
  explicit On(const std::vector<T>& h) : n_(h.size()), p_(static_cast<T*>(k::device_alloc(h.size() * sizeof(T) + 1))) {
    k::copy_bytes(p_, h.data(), n_ * sizeof(T));
  }
  ~On() { k::device_free(p_); }
  On(const On&) = delete;
  On& operator=(const On&) = delete;
  T* get() { return p_; }
  std::vector<T> host() const {
    k::synchronize();
    std::vector<T> h(n_);
    k::copy_bytes(h.data(), p_, n_ * sizeof(T));
    return h;
  }

 private:
  std::size_t n_;
  T* p_;
};
using Dev = On<float>;

// Largest |a - b| / max(|b|, floor) over the elements.
double max_rel(const Vec& a, const Vec& b, double floor = 1e-3) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i]) && a[i] == b[i]) continue;
    const double d = std::fabs(double(a[i]) - b[i]) / std::max(std::fabs(double(b[i])), floor);
    worst = std::isnan(d) ? d : std::max(worst, d);
  }
  return worst;
}

// The cross-entropy gradient's bound: (p - onehot) dloss, whose target
// entry (p - 1) dloss is a difference that cancels as p nears 1, so a few
// ulps of dloss (the row's sum of exponentials taken in another order moves
// p by one) are allowed beside the relative bound.
double max_rel_gradient(const Vec& a, const Vec& b, double floor, float dloss) {
  const double slack = 4.0 * std::ldexp(double(dloss), -24);
  Vec shaved = a;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = double(a[i]) - b[i];
    shaved[i] = float(std::fabs(d) <= slack ? b[i] : a[i] - std::copysign(slack, d));
  }
  return max_rel(shaved, b, floor);
}

// Largest |a - b| relative to the largest |b| (at least 0.1): attention's
// outputs have entries near zero, where an elementwise relative error means
// nothing.
double rel_to_max(const Vec& a, const Vec& b) {
  double top = 0.1;
  for (const float x : b) top = std::isinf(x) ? top : std::max(top, double(std::fabs(x)));
  return max_rel(a, b, top);
}

// Index of the first element whose bits differ (NaNs compared by their
// bits), or -1: a failure names one element instead of printing buffers.
template <typename T>
std::int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return std::int64_t(i);
  return -1;
}

// first_difference for sums of 16-bit values, where any NaN equals any NaN:
// which operand's payload a NaN + NaN keeps is the hardware's choice (x86
// keeps the first operand's, and a compiler may swap the operands of an add;
// a GPU returns its canonical NaN).
std::int64_t first_difference_of_sums(const Bits& a, const Bits& b, core::Precision p) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i] && !(std::isnan(core::half_to_float(a[i], p)) && std::isnan(core::half_to_float(b[i], p))))
      return std::int64_t(i);
  return -1;
}

// Half the step from the 16-bit value h to the next one away from zero:
// widen(h) plus this is an exact tie between the two.
float half_gap(std::uint16_t h, core::Precision p) {
  return (core::half_to_float(std::uint16_t(h + 1), p) - core::half_to_float(h, p)) / 2;
}

// fp32 values that probe rounding to format p: random bit patterns (every
// exponent, fp32 subnormals, infinities, NaNs), exact ties between
// neighbouring 16-bit values and the fp32 values either side of them, fp16's
// subnormal range, and the edges of fp16's and bf16's ranges.
Vec rounding_probes(std::mt19937& g, core::Precision p, std::size_t n) {
  Vec v;
  std::uniform_int_distribution<std::uint32_t> word;
  for (std::size_t i = 0; i < n; ++i) v.push_back(std::bit_cast<float>(word(g)));
  for (const std::uint16_t h : random_bits(g, n)) {
    const float tie = core::half_to_float(h, p) + half_gap(h, p);
    v.insert(v.end(), {tie, std::nextafter(tie, -INFINITY), std::nextafter(tie, INFINITY)});
  }
  const Vec tiny = uniform(g, n, -0x1p-14f, 0x1p-14f);
  v.insert(v.end(), tiny.begin(), tiny.end());
  for (const float x : {0.0f, 65504.0f, 65519.0f, 65519.996f, 65520.0f, 65536.0f, 1e5f, 3.3e38f, FLT_MAX, INFINITY,
                        NAN, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-14f, FLT_MIN, 1e-45f}) {
    v.push_back(x);
    v.push_back(-x);
  }
  return v;
}

constexpr core::Precision kHalves[] = {core::Precision::bf16, core::Precision::fp16};

// ---- the cases: one per operation, each running the operation on the
// selected device (k::) and on the CPU backend (cpu::) ----
struct Ctx {
  std::mt19937 rng;
  k::Device device;
};
using Case = void (*)(Ctx&);

std::map<std::string, Case>& cases() {
  static std::map<std::string, Case> all;
  return all;
}

bool add_case(const char* op, Case c) {
  cases()[op] = c;
  return true;
}

#define OP_CASE(op)                                                     \
  void case_##op(Ctx& t);                                               \
  [[maybe_unused]] const bool registered_##op = add_case(#op, case_##op); \
  void case_##op(Ctx& t)

// Every transpose combination, packed and with leading dimensions wider
// than the matrices, alpha and beta both active.
OP_CASE(matmul) {
  const int M = 37, N = 53, K = 129;
  for (const int pad : {0, 3})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
        const Vec A = uniform(t.rng, std::size_t(ta ? K : M) * lda), B = uniform(t.rng, std::size_t(tb ? N : K) * ldb);
        Vec C = uniform(t.rng, std::size_t(M) * ldc);
        Dev dA(A), dB(B), dC(C);
        k::matmul(ta, tb, M, N, K, 0.7f, dA.get(), lda, dB.get(), ldb, 0.3f, dC.get(), ldc);
        cpu::matmul(ta, tb, M, N, K, 0.7f, A.data(), lda, B.data(), ldb, 0.3f, C.data(), ldc);
        // K products summed in another order: relative to the sums' scale.
        EXPECT_LE(max_rel(dC.host(), C, 1.0), 1e-5) << "trans_a " << ta << " trans_b " << tb << " pad " << pad;
      }
}

// The strided batch attention uses.
OP_CASE(matmul_strided_batched) {
  const int M = 37, N = 53, K = 129, batch = 6;
  const Vec A = uniform(t.rng, std::size_t(batch) * M * K), B = uniform(t.rng, std::size_t(batch) * N * K);
  Vec C(std::size_t(batch) * M * N, 0.0f);
  Dev dA(A), dB(B), dC(C);
  k::matmul_strided_batched(false, true, M, N, K, 1.0f, dA.get(), K, std::int64_t(M) * K, dB.get(), K,
                            std::int64_t(N) * K, 0.0f, dC.get(), N, std::int64_t(M) * N, batch);
  cpu::matmul_strided_batched(false, true, M, N, K, 1.0f, A.data(), K, std::int64_t(M) * K, B.data(), K,
                              std::int64_t(N) * K, 0.0f, C.data(), N, std::int64_t(M) * N, batch);
  EXPECT_LE(max_rel(dC.host(), C, 1.0), 1e-5);
}

// A linear layer's product with its bias, written or accumulated (beta 0,
// 1), with the weights and the bias at offsets that leave them 4-byte aligned
// only (a parameter inside the flat buffer), at GPT-like and odd sizes.
OP_CASE(linear_bias_forward) {
  struct Shape {
    int N, IC, OC;
  };
  for (const Shape& sh : {Shape{512, 256, 768}, Shape{37, 19, 53}, Shape{1024, 128, 512}})
    for (const int offset : {0, 1})
      for (const float beta : {0.0f, 1.0f}) {
        const Vec x = uniform(t.rng, std::size_t(sh.N) * sh.IC);
        const Vec w = uniform(t.rng, std::size_t(sh.OC) * sh.IC + offset);
        const Vec b = uniform(t.rng, std::size_t(sh.OC) + offset);
        Vec out = uniform(t.rng, std::size_t(sh.N) * sh.OC);
        Dev dx(x), dw(w), db(b), dout(out);
        k::linear_bias_forward(dout.get(), dx.get(), dw.get() + offset, db.get() + offset, sh.N, sh.IC, sh.OC, beta);
        cpu::linear_bias_forward(out.data(), x.data(), w.data() + offset, b.data() + offset, sh.N, sh.IC, sh.OC, beta);
        EXPECT_LE(max_rel(dout.host(), out), 1e-5)
            << sh.N << "x" << sh.IC << "x" << sh.OC << " offset " << offset << " beta " << beta;
      }
}

OP_CASE(bias_add) {
  const int N = 37, C = 300;
  Vec x = uniform(t.rng, std::size_t(N) * C);
  const Vec bias = uniform(t.rng, C);
  Dev dx(x), db(bias);
  k::bias_add(dx.get(), db.get(), N, C);
  cpu::bias_add(x.data(), bias.data(), N, C);
  EXPECT_EQ(dx.host(), x);
}

OP_CASE(bias_backward) {
  const int N = 513, C = 77;
  const Vec dout = uniform(t.rng, std::size_t(N) * C);
  Vec db = uniform(t.rng, C);
  Dev dd(dout), ddb(db);
  k::bias_backward(ddb.get(), dd.get(), N, C);
  cpu::bias_backward(db.data(), dout.data(), N, C);
  EXPECT_LE(max_rel(ddb.host(), db), 1e-5);
}

// LayerNorm's forward in double: the reference both backends are measured from.
void layernorm_in_double(Vec& out, Vec& mean, Vec& rstd, const Vec& x, const Vec& w, const Vec& b, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* r = x.data() + std::size_t(n) * C;
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += r[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (r[c] - m) * (r[c] - m);
    const double s = 1.0 / std::sqrt(v / C + 1e-5);
    for (int c = 0; c < C; ++c) out[std::size_t(n) * C + c] = float((r[c] - m) * s * w[c] + b[c]);
    mean[n] = float(m);
    rstd[n] = float(s);
  }
}

// Held to the CPU backend's own distance from a double-precision reference
// plus the bound: the CPU sums a row of C floats in float (in eight vector
// lanes when optimised, in order at -O0, where a mean of 100 drifts by
// 1.6e-6), and a backend that sums more exactly must not fail for it. out
// relative to its largest entry: an entry near zero is a difference of x
// and the mean, which an elementwise bound would amplify.
OP_CASE(layernorm_forward) {
  for (const auto& [N, C] : {std::pair{1, 7}, std::pair{64, 768}, std::pair{300, 1024}}) {
    // A mean far from zero: the two-pass variance must not cancel.
    const Vec x = uniform(t.rng, std::size_t(N) * C, 90, 110), w = uniform(t.rng, C), b = uniform(t.rng, C);
    Vec out(x.size()), mean(N), rstd(N), exact_out(x.size()), exact_mean(N), exact_rstd(N);
    Dev dx(x), dw(w), db(b), dout(out), dmean(mean), drstd(rstd);
    k::layernorm_forward(dout.get(), dmean.get(), drstd.get(), dx.get(), dw.get(), db.get(), N, C);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    layernorm_in_double(exact_out, exact_mean, exact_rstd, x, w, b, N, C);
    EXPECT_LE(rel_to_max(dout.host(), exact_out), rel_to_max(out, exact_out) + 1e-5) << N << " x " << C;
    EXPECT_LE(max_rel(dmean.host(), exact_mean), max_rel(mean, exact_mean) + 1e-6) << N << " x " << C;
    EXPECT_LE(max_rel(drstd.host(), exact_rstd), max_rel(rstd, exact_rstd) + 1e-5) << N << " x " << C;
  }
}

OP_CASE(layernorm_backward) {
  const int N = 200, C = 384;
  const Vec x = uniform(t.rng, std::size_t(N) * C, -3, 5), w = uniform(t.rng, C), b = uniform(t.rng, C);
  const Vec dy = uniform(t.rng, x.size());
  Vec out(x.size()), mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  // Accumulation: every gradient starts non-zero.
  Vec dx = uniform(t.rng, x.size()), dw = uniform(t.rng, C), dbias = uniform(t.rng, C);
  Dev ddx(dx), ddw(dw), ddb(dbias), ddy(dy), dxin(x), dwt(w), dmean(mean), drstd(rstd);
  k::layernorm_backward(ddx.get(), ddw.get(), ddb.get(), ddy.get(), dxin.get(), dwt.get(), dmean.get(), drstd.get(), N,
                        C);
  cpu::layernorm_backward(dx.data(), dw.data(), dbias.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(),
                          N, C);
  EXPECT_LE(rel_to_max(ddx.host(), dx), 1e-5);  // as the forward's out
  EXPECT_LE(max_rel(ddw.host(), dw), 1e-5);
  EXPECT_LE(max_rel(ddb.host(), dbias), 1e-5);
}

constexpr std::int64_t kLengths[] = {1, 1000, 1 << 20};

// RMSNorm at a GPT-like and an odd width, accumulating into nonzero
// gradients; relative to the largest entry (dx is a difference of terms).
OP_CASE(rmsnorm_forward) {
  for (const auto& [N, C] : {std::pair{512, 768}, std::pair{37, 301}}) {
    const Vec x = uniform(t.rng, std::size_t(N) * C, -2, 3), w = uniform(t.rng, C, 0.5f, 1.5f);
    Vec out(x.size()), rstd(N);
    Dev dx(x), dw(w), dout(Vec(out.size(), NAN)), drstd(Vec(rstd.size(), NAN));
    k::rmsnorm_forward(dout.get(), drstd.get(), dx.get(), dw.get(), N, C);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C);
    EXPECT_LE(max_rel(dout.host(), out), 1e-5) << N << "x" << C;
    EXPECT_LE(max_rel(drstd.host(), rstd), 1e-5) << N << "x" << C;
  }
}

OP_CASE(rmsnorm_backward) {
  for (const auto& [N, C] : {std::pair{512, 768}, std::pair{37, 301}}) {
    const Vec x = uniform(t.rng, std::size_t(N) * C, -2, 3), w = uniform(t.rng, C, 0.5f, 1.5f);
    const Vec dy = uniform(t.rng, x.size());
    Vec out(x.size()), rstd(N), dx = uniform(t.rng, x.size()), dw = uniform(t.rng, C);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C);
    Dev ddx(dx), ddw(dw), ddy(dy), dxin(x), dwt(w), drstd(rstd);
    k::rmsnorm_backward(ddx.get(), ddw.get(), ddy.get(), dxin.get(), dwt.get(), drstd.get(), N, C);
    cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
    EXPECT_LE(rel_to_max(ddx.host(), dx), 1e-5) << N << "x" << C;
    EXPECT_LE(rel_to_max(ddw.host(), dw), 1e-5) << N << "x" << C;
  }
}

// RoPE on a qkv buffer's q and k heads (v untouched), at an offset position
// and Llama 3's theta; forward and backward (the turn back).
struct RopeShape {
  int B = 2, T = 37, hs = 64, heads = 6, kv = 2, pos0 = 1000;
  std::int64_t ld() const { return std::int64_t(heads + kv) * hs; }  // q and k heads, then v
};

// In place on the same input, both sides; theta 500000 forward, 10000 back.
void rope_case(Ctx& t, bool backward) {
  for (const RopeShape r : {RopeShape{}, RopeShape{.B = 1, .T = 5, .hs = 16, .heads = 3, .kv = 1, .pos0 = 0}}) {
    Vec x = uniform(t.rng, std::size_t(r.B) * r.T * std::size_t(r.ld()));
    Dev dx(x);
    auto turn = [&](auto op, float* v) { op(v, r.B, r.T, r.ld(), r.heads, r.hs, r.pos0, backward ? 1e4f : 5e5f); };
    if (backward) {
      turn(k::rope_backward, dx.get());
      turn(cpu::rope_backward, x.data());
    } else {
      turn(k::rope_forward, dx.get());
      turn(cpu::rope_forward, x.data());
    }
    EXPECT_LE(max_rel(dx.host(), x, 1.0), 1e-6) << "hs " << r.hs;
  }
}

OP_CASE(rope_forward) { rope_case(t, false); }
OP_CASE(rope_backward) { rope_case(t, true); }

OP_CASE(swiglu_forward) {
  for (const auto& [N, F] : {std::pair{512, 688}, std::pair{37, 19}}) {
    const Vec in = uniform(t.rng, std::size_t(N) * 2 * F, -6, 6);
    Vec out(std::size_t(N) * F);
    Dev din(in), dout(Vec(out.size(), NAN));
    k::swiglu_forward(dout.get(), din.get(), N, F);
    cpu::swiglu_forward(out.data(), in.data(), N, F);
    EXPECT_LE(max_rel(dout.host(), out), 1e-5) << N << "x" << F;
  }
}

OP_CASE(swiglu_backward) {
  for (const auto& [N, F] : {std::pair{512, 688}, std::pair{37, 19}}) {
    const Vec in = uniform(t.rng, std::size_t(N) * 2 * F, -6, 6), dy = uniform(t.rng, std::size_t(N) * F);
    Vec din = uniform(t.rng, in.size());
    Dev d_in(in), d_dy(dy), d_din(din);
    k::swiglu_backward(d_din.get(), d_in.get(), d_dy.get(), N, F);
    cpu::swiglu_backward(din.data(), in.data(), dy.data(), N, F);
    EXPECT_LE(max_rel(d_din.host(), din), 1e-5) << N << "x" << F;
  }
}

OP_CASE(gelu_forward) {
  for (const std::int64_t n : kLengths) {
    const Vec a = uniform(t.rng, n, -4, 4);
    Vec out(n);
    Dev da(a), dout(out);
    k::gelu_forward(dout.get(), da.get(), n);
    cpu::gelu_forward(out.data(), a.data(), n);
    EXPECT_LE(max_rel(dout.host(), out), 1e-5) << "n " << n;
  }
}

OP_CASE(gelu_backward) {
  for (const std::int64_t n : kLengths) {
    const Vec a = uniform(t.rng, n, -4, 4), d = uniform(t.rng, n);
    Vec g = uniform(t.rng, n);  // accumulated into
    Dev da(a), dd(d), dg(g);
    k::gelu_backward(dg.get(), da.get(), dd.get(), n);
    cpu::gelu_backward(g.data(), a.data(), d.data(), n);
    EXPECT_LE(max_rel(dg.host(), g), 1e-5) << "n " << n;
  }
}

OP_CASE(residual_forward) {
  for (const std::int64_t n : kLengths) {
    const Vec a = uniform(t.rng, n, -4, 4), b = uniform(t.rng, n, -4, 4);
    Vec out(n);
    Dev da(a), db(b), dout(out);
    k::residual_forward(dout.get(), da.get(), db.get(), n);
    cpu::residual_forward(out.data(), a.data(), b.data(), n);
    EXPECT_EQ(dout.host(), out) << "n " << n;
  }
}

OP_CASE(add_inplace) {
  for (const std::int64_t n : kLengths) {
    Vec a = uniform(t.rng, n, -4, 4);
    const Vec b = uniform(t.rng, n, -4, 4);
    Dev da(a), db(b);
    k::add_inplace(da.get(), db.get(), n);
    cpu::add_inplace(a.data(), b.data(), n);
    EXPECT_EQ(da.host(), a) << "n " << n;
  }
}

OP_CASE(scale_inplace) {
  for (const std::int64_t n : kLengths) {
    Vec a = uniform(t.rng, n, -4, 4);
    Dev da(a);
    k::scale_inplace(da.get(), 0.37f, n);
    cpu::scale_inplace(a.data(), 0.37f, n);
    EXPECT_EQ(da.host(), a) << "n " << n;
  }
}

OP_CASE(fill_zero) {
  for (const std::int64_t n : kLengths) {
    Dev da(uniform(t.rng, n));
    k::fill_zero(da.get(), n);
    EXPECT_EQ(da.host(), Vec(std::size_t(n), 0.0f)) << "n " << n;
  }
}

OP_CASE(sum_squares) {
  for (const std::int64_t n : {0, 5, 1 << 20}) {
    const Vec x = uniform(t.rng, std::size_t(n));
    Dev dx(x);
    const double want = cpu::sum_squares(x.data(), n);
    EXPECT_NEAR(k::sum_squares(dx.get(), n), want, 1e-12 * std::max(want, 1.0)) << n;
  }
}

// Sequence lengths on and off the 64-row blocks; head sizes 8 to 64, and
// 160 and 256 (past the CUDA backend's fused kernels, on its wide path);
// multi-head, grouped-query and multi-query.
struct AttentionShape {
  int B, T, NH, hs, NKV;
  int C() const { return NH * hs; }
  int W() const { return (NH + 2 * NKV) * hs; }  // a qkv row
};
constexpr AttentionShape kAttentionShapes[] = {
    {2, 67, 4, 16, 4}, {1, 128, 2, 64, 2}, {3, 5, 1, 8, 1}, {2, 67, 4, 16, 2}, {1, 70, 4, 32, 1},
    {1, 67, 2, 160, 1}, {2, 40, 2, 256, 2}};

// The state the selected device's backward needs (the CUDA backend keeps the
// rows' log-sum-exp, the others the probabilities).
std::int64_t state_floats(const Ctx& t, const AttentionShape& s) {
  return k::attention_state_floats(t.device == k::Device::cuda, s.B, s.NH, s.T);
}

OP_CASE(attention_forward) {
  for (const AttentionShape& s : kAttentionShapes) {
    const int C = s.C();
    const Vec qkv = uniform(t.rng, std::size_t(s.B) * s.T * s.W(), -2, 2);
    Vec out(std::size_t(s.B) * s.T * C), probs(std::size_t(k::attention_state_floats(false, s.B, s.NH, s.T)));
    cpu::attention_forward(out.data(), probs.data(), qkv.data(), s.B, s.T, C, s.NH, s.NKV);
    Dev dqkv(qkv), dout(Vec(out.size(), NAN)), dstate(Vec(std::size_t(state_floats(t, s)), NAN));
    k::attention_forward(dout.get(), dstate.get(), dqkv.get(), s.B, s.T, C, s.NH, s.NKV);
    EXPECT_LE(rel_to_max(dout.host(), out), 1e-5) << "B " << s.B << " T " << s.T << " hs " << s.hs << " NKV " << s.NKV;
  }
}

// The device's own forward state; the gradient accumulates into a nonzero dqkv.
OP_CASE(attention_backward) {
  for (const AttentionShape& s : kAttentionShapes) {
    const int C = s.C();
    const Vec qkv = uniform(t.rng, std::size_t(s.B) * s.T * s.W(), -2, 2), dy = uniform(t.rng, std::size_t(s.B) * s.T * C);
    Vec out(dy.size()), probs(std::size_t(k::attention_state_floats(false, s.B, s.NH, s.T))), scratch(probs.size());
    Vec dqkv = uniform(t.rng, qkv.size());
    cpu::attention_forward(out.data(), probs.data(), qkv.data(), s.B, s.T, C, s.NH, s.NKV);
    const std::size_t state = std::size_t(state_floats(t, s));
    Dev d_qkv(qkv), d_out(out), d_state(Vec(state, NAN)), d_scratch(Vec(state, NAN)), d_dy(dy), d_g(dqkv);
    k::attention_forward(d_out.get(), d_state.get(), d_qkv.get(), s.B, s.T, C, s.NH, s.NKV);
    k::attention_backward(d_g.get(), d_scratch.get(), d_dy.get(), d_qkv.get(), d_out.get(), d_state.get(), s.B, s.T, C,
                          s.NH, s.NKV);
    cpu::attention_backward(dqkv.data(), scratch.data(), dy.data(), qkv.data(), out.data(), probs.data(), s.B, s.T, C,
                            s.NH, s.NKV);
    EXPECT_LE(rel_to_max(d_g.host(), dqkv), 1e-5) << "B " << s.B << " T " << s.T << " hs " << s.hs << " NKV " << s.NKV;
  }
}

// Ring attention's blocks: a query block (the middle one of three) against
// each key block, the diagonal first (it overwrites) and the others merged
// in; head sizes 16 to 96, and 160 and 256 (8 dimensions a lane on the CUDA
// backend); 70-row blocks; multi-head and grouped-query.
struct Ring {
  int B = 2, NH = 2, hs, NKV = 2, Tq = 70;
  int C() const { return NH * hs; }
  int KVC() const { return NKV * hs; }
  int W() const { return C() + 2 * KVC(); }
  int T() const { return 3 * Tq; }  // key blocks [0, 70), [70, 140), [140, 210)
};
constexpr Ring kRings[] = {{.hs = 16},
                           {.hs = 96},
                           {.NH = 4, .hs = 16, .NKV = 2},
                           {.NH = 2, .hs = 32, .NKV = 1},
                           {.hs = 160},
                           {.NH = 2, .hs = 256, .NKV = 1}};

// q, kv and dout of a ring, and its out and lse after every key block (the CPU's).
struct RingInputs {
  Vec qkv, kv, dy, out, lse;
  RingInputs(std::mt19937& g, const Ring& r) {
    const int T = r.T();
    qkv = uniform(g, std::size_t(r.B) * T * r.W(), -2, 2);
    dy = uniform(g, std::size_t(r.B) * T * r.C());
    kv.assign(std::size_t(r.B) * T * 2 * r.KVC(), 0.0f);
    cpu::copy_rows(kv.data(), 2 * r.KVC(), qkv.data() + r.C(), r.W(), std::int64_t(r.B) * T, 2 * r.KVC(), false);
    out.assign(std::size_t(r.B) * T * r.C(), 0.0f);
    lse.assign(std::size_t(r.B) * r.NH * T, 0.0f);
    for (int kb : {1, 0, 2}) forward(r, kb, out.data(), lse.data(), qkv.data(), kv.data(), true);
  }
  // Key block kb into the middle query block, with the kernels of namespace K.
  template <class F>
  static void each(const Ring& r, int kb, F&& f) {
    const std::size_t q_at = std::size_t(r.Tq);
    f(q_at * r.C(), q_at, q_at * r.W(), std::size_t(kb) * r.Tq * 2 * r.KVC(), kb != 1);
  }
  static void forward(const Ring& r, int kb, float* out, float* lse, const float* qkv, const float* kv, bool cpu_side) {
    each(r, kb, [&](std::size_t o, std::size_t l, std::size_t q, std::size_t kvo, bool acc) {
      const int C = r.C(), T = r.T();
      if (cpu_side)
        cpu::attention_block_forward(out + o, lse + l, qkv + q, kv + kvo, r.B, r.Tq, r.Tq, C, r.NH, r.NKV, T, T, r.Tq,
                                     kb * r.Tq, acc);
      else
        k::attention_block_forward(out + o, lse + l, qkv + q, kv + kvo, r.B, r.Tq, r.Tq, C, r.NH, r.NKV, T, T, r.Tq,
                                   kb * r.Tq, acc);
    });
  }
};

// The query block's rows of a [B, T, width] tensor, and of a [B, NH, T] one.
Vec ring_rows(const Ring& r, const Vec& v, std::size_t width) {
  Vec out;
  for (int b = 0; b < r.B; ++b)
    out.insert(out.end(), v.begin() + (std::size_t(b) * r.T() + r.Tq) * width,
               v.begin() + (std::size_t(b) * r.T() + 2 * r.Tq) * width);
  return out;
}
Vec ring_lse_rows(const Ring& r, const Vec& v) {
  Vec out;
  for (int bh = 0; bh < r.B * r.NH; ++bh)
    out.insert(out.end(), v.begin() + std::size_t(bh) * r.T() + r.Tq, v.begin() + std::size_t(bh) * r.T() + 2 * r.Tq);
  return out;
}

OP_CASE(attention_block_forward) {
  for (const Ring& r : kRings) {
    const RingInputs in(t.rng, r);
    Dev d_qkv(in.qkv), d_kv(in.kv), d_out(Vec(in.out.size(), NAN)), d_lse(Vec(in.lse.size(), NAN));
    for (int kb : {1, 0, 2}) RingInputs::forward(r, kb, d_out.get(), d_lse.get(), d_qkv.get(), d_kv.get(), false);
    EXPECT_LE(rel_to_max(ring_rows(r, d_out.host(), r.C()), ring_rows(r, in.out, r.C())), 1e-5)
        << "hs " << r.hs << " NKV " << r.NKV;
    EXPECT_LE(rel_to_max(ring_lse_rows(r, d_lse.host()), ring_lse_rows(r, in.lse)), 1e-5)
        << "hs " << r.hs << " NKV " << r.NKV;
  }
  // A block no query row may attend: out 0 and lse -inf.
  const Ring r{.hs = 16};
  const RingInputs in(t.rng, r);
  const int C = r.C(), T = r.T();
  Dev d_qkv(in.qkv), d_kv(in.kv), d_out(Vec(in.out.size(), NAN)), d_lse(Vec(in.lse.size(), NAN));
  k::attention_block_forward(d_out.get(), d_lse.get(), d_qkv.get(), d_kv.get() + std::size_t(2) * r.Tq * 2 * r.KVC(),
                             r.B, r.Tq, r.Tq, C, r.NH, r.NKV, T, T, 0, 2 * r.Tq, false);
  const Vec out = d_out.host(), lse = d_lse.host();
  EXPECT_EQ(*std::max_element(out.begin(), out.begin() + std::ptrdiff_t(r.Tq) * C), 0.0f);
  EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
}

OP_CASE(attention_block_backward) {
  for (const Ring& r : kRings) {
    const RingInputs in(t.rng, r);
    const int C = r.C(), T = r.T();
    Vec dq = uniform(t.rng, in.qkv.size()), dkv = uniform(t.rng, in.kv.size());
    Dev d_qkv(in.qkv), d_kv(in.kv), d_dy(in.dy), d_out(in.out), d_lse(in.lse), d_dq(dq), d_dkv(dkv);
    for (int kb : {0, 1, 2}) {
      RingInputs::each(r, kb, [&](std::size_t o, std::size_t l, std::size_t q, std::size_t kvo, bool) {
        cpu::attention_block_backward(dq.data() + q, dkv.data() + kvo, in.dy.data() + o, in.qkv.data() + q,
                                      in.kv.data() + kvo, in.out.data() + o, in.lse.data() + l, r.B, r.Tq, r.Tq, C,
                                      r.NH, r.NKV, T, T, r.Tq, kb * r.Tq);
        k::attention_block_backward(d_dq.get() + q, d_dkv.get() + kvo, d_dy.get() + o, d_qkv.get() + q,
                                    d_kv.get() + kvo, d_out.get() + o, d_lse.get() + l, r.B, r.Tq, r.Tq, C, r.NH,
                                    r.NKV, T, T, r.Tq, kb * r.Tq);
      });
    }
    EXPECT_LE(rel_to_max(d_dq.host(), dq), 1e-5) << "dq, hs " << r.hs << " NKV " << r.NKV;
    EXPECT_LE(rel_to_max(d_dkv.host(), dkv), 1e-5) << "dk, dv, hs " << r.hs << " NKV " << r.NKV;
  }
}

// Both ways: qkv's k and v columns into a packed kv, and added back.
OP_CASE(copy_rows) {
  const int rows = 97, C = 48;
  const Vec qkv = uniform(t.rng, std::size_t(rows) * 3 * C);
  Vec kv = uniform(t.rng, std::size_t(rows) * 2 * C), back = qkv;
  Dev d_qkv(qkv), d_kv(kv), d_back(back);
  k::copy_rows(d_kv.get(), 2 * C, d_qkv.get() + C, 3 * C, rows, 2 * C, false);
  cpu::copy_rows(kv.data(), 2 * C, qkv.data() + C, 3 * C, rows, 2 * C, false);
  EXPECT_EQ(d_kv.host(), kv);
  k::copy_rows(d_back.get() + C, 3 * C, d_kv.get(), 2 * C, rows, 2 * C, true);
  cpu::copy_rows(back.data() + C, 3 * C, kv.data(), 2 * C, rows, 2 * C, true);
  EXPECT_EQ(d_back.host(), back);
}

// Whole and vocabulary-sharded tables (tokens outside the shard add 0), with
// and without the position table; repeated tokens.
struct EmbeddingShape {
  static constexpr int B = 3, T = 17, C = 40, V = 50;
};
constexpr std::pair<int, int> kShards[] = {{0, -1}, {20, 15}};

OP_CASE(embedding_forward) {
  using S = EmbeddingShape;
  const Tokens tok = tokens(t.rng, std::size_t(S::B) * S::T, S::V);
  for (const auto& [v_begin, v_count] : kShards)
    for (bool with_wpe : {true, false}) {
      const int rows = v_count < 0 ? S::V : v_count;
      const Vec wte = uniform(t.rng, std::size_t(rows) * S::C), wpe = uniform(t.rng, std::size_t(S::T) * S::C);
      Vec out(std::size_t(S::B) * S::T * S::C);
      On<std::int32_t> dt(tok);
      Dev dwte(wte), dwpe(wpe), dout(Vec(out.size(), NAN));
      k::embedding_forward(dout.get(), dt.get(), dwte.get(), with_wpe ? dwpe.get() : nullptr, S::B, S::T, S::C,
                           v_begin, v_count);
      cpu::embedding_forward(out.data(), tok.data(), wte.data(), with_wpe ? wpe.data() : nullptr, S::B, S::T, S::C,
                             v_begin, v_count);
      EXPECT_EQ(dout.host(), out) << "v_begin " << v_begin << " wpe " << with_wpe;
    }
}

OP_CASE(embedding_backward) {
  using S = EmbeddingShape;
  const Tokens tok = tokens(t.rng, std::size_t(S::B) * S::T, S::V);
  for (const auto& [v_begin, v_count] : kShards)
    for (bool with_wpe : {true, false}) {
      const int rows = v_count < 0 ? S::V : v_count;
      const Vec dout = uniform(t.rng, std::size_t(S::B) * S::T * S::C);
      Vec dwte = uniform(t.rng, std::size_t(rows) * S::C), dwpe = uniform(t.rng, std::size_t(S::T) * S::C);
      On<std::int32_t> dt(tok);
      Dev dd(dout), ddwte(dwte), ddwpe(dwpe);
      k::embedding_backward(ddwte.get(), with_wpe ? ddwpe.get() : nullptr, dd.get(), dt.get(), S::B, S::T, S::C,
                            v_begin, v_count);
      cpu::embedding_backward(dwte.data(), with_wpe ? dwpe.data() : nullptr, dout.data(), tok.data(), S::B, S::T, S::C,
                              v_begin, v_count);
      EXPECT_LE(max_rel(ddwte.host(), dwte), 1e-5) << "v_begin " << v_begin << " wpe " << with_wpe;
      EXPECT_LE(max_rel(ddwpe.host(), dwpe), 1e-5) << "v_begin " << v_begin << " wpe " << with_wpe;
    }
}

// The position rows of a sequence-parallel rank's rows (starting mid-sequence
// and wrapping into the next sample), added to what the rows hold.
OP_CASE(add_position_rows) {
  const int T = 13, C = 24, rows = 30, r0 = 7;
  const Vec wpe = uniform(t.rng, std::size_t(T) * C);
  Vec out = uniform(t.rng, std::size_t(rows) * C);
  Dev d(out), dwpe(wpe);
  k::add_position_rows(d.get(), dwpe.get(), rows, C, T, r0);
  cpu::add_position_rows(out.data(), wpe.data(), rows, C, T, r0);
  EXPECT_EQ(d.host(), out);
}

// Rows of a GPT-2-sized vocabulary and a tiny one.
constexpr std::pair<int, int> kVocabularies[] = {{4, 7}, {33, 50257}};

OP_CASE(softmax_cross_entropy_forward) {
  for (const auto& [N, V] : kVocabularies) {
    const Vec logits = uniform(t.rng, std::size_t(N) * V, -8, 8);
    const Tokens targets = tokens(t.rng, std::size_t(N), V);
    Vec losses(N);
    On<std::int32_t> dt(targets);
    Dev dl(logits), dloss(losses);
    k::softmax_cross_entropy_forward(dloss.get(), dl.get(), dt.get(), N, V);
    cpu::softmax_cross_entropy_forward(losses.data(), logits.data(), targets.data(), N, V);
    // Relative to the largest loss: a row whose target is its peak has a loss
    // near 0, log(sum) with the sum near 1, where the sum's last ulp (its
    // terms added in another order) is all of the difference.
    EXPECT_LE(rel_to_max(dloss.host(), losses), 1e-5) << N << " x " << V;
  }
}

// In place over the logits, as the model calls it.
OP_CASE(softmax_cross_entropy_backward) {
  for (const auto& [N, V] : kVocabularies) {
    Vec grad = uniform(t.rng, std::size_t(N) * V, -8, 8);
    const Tokens targets = tokens(t.rng, std::size_t(N), V);
    On<std::int32_t> dt(targets);
    Dev dl(grad);
    k::softmax_cross_entropy_backward(dl.get(), dl.get(), dt.get(), 1.0f / N, N, V);
    cpu::softmax_cross_entropy_backward(grad.data(), grad.data(), targets.data(), 1.0f / N, N, V);
    // Probabilities as small as e^-16 / V: relative to the row's scale, 1 / (N V).
    EXPECT_LE(max_rel_gradient(dl.host(), grad, 1e-3 / (double(N) * V), 1.0f / N), 1e-5) << N << " x " << V;
  }
}

// The vocabulary-parallel pieces on each of three ranks' shards of a larger
// vocabulary: row statistics that other ranks have already raised (a larger
// max, a larger sum), targets on the shard's first and last columns and just
// outside it, the rest anywhere in the vocabulary.
struct Shard {
  int N, V_full, v_begin, V;
  Vec logits, m, s;
  Tokens targets;
  std::string at;
};
template <class F>
void for_each_shard(std::mt19937& g, F&& f) {
  for (const auto& [N, V_full] : {std::pair{5, 7}, std::pair{33, 50257}})
    for (int rank = 0; rank < 3; ++rank) {
      Shard sh;
      const int v_begin = rank * V_full / 3, v_end = (rank + 1) * V_full / 3;
      sh.N = N, sh.V_full = V_full, sh.v_begin = v_begin, sh.V = v_end - v_begin;
      sh.at = std::to_string(N) + " x " + std::to_string(sh.V) + " from " + std::to_string(v_begin);
      sh.logits = uniform(g, std::size_t(N) * sh.V, -8, 8);
      sh.targets = tokens(g, std::size_t(N), V_full);
      sh.targets[0] = v_begin;
      sh.targets[1] = v_end - 1;
      sh.targets[2] = std::max(v_begin - 1, 0);
      sh.targets[3] = std::min(v_end, V_full - 1);
      sh.m.resize(N);
      cpu::row_max(sh.m.data(), sh.logits.data(), N, sh.V);
      const Vec raise = uniform(g, N, 0, 2);
      for (int n = 0; n < N; ++n) sh.m[n] += raise[n];
      sh.s.resize(N);
      cpu::row_exp_sum(sh.s.data(), sh.logits.data(), sh.m.data(), N, sh.V);
      const Vec scale = uniform(g, N, 1, 3);
      for (int n = 0; n < N; ++n) sh.s[n] *= scale[n];
      f(sh);
    }
}

OP_CASE(row_max) {
  for_each_shard(t.rng, [&](const Shard& sh) {
    Vec m(sh.N);
    cpu::row_max(m.data(), sh.logits.data(), sh.N, sh.V);
    Dev dl(sh.logits), dm(Vec(sh.N, NAN));
    k::row_max(dm.get(), dl.get(), sh.N, sh.V);
    EXPECT_EQ(dm.host(), m) << sh.at;  // a maximum is exact
  });
}

OP_CASE(row_exp_sum) {
  for_each_shard(t.rng, [&](const Shard& sh) {
    Vec s(sh.N);
    cpu::row_exp_sum(s.data(), sh.logits.data(), sh.m.data(), sh.N, sh.V);
    Dev dl(sh.logits), dm(sh.m), ds(Vec(sh.N, NAN));
    k::row_exp_sum(ds.get(), dl.get(), dm.get(), sh.N, sh.V);
    EXPECT_LE(max_rel(ds.host(), s), 1e-5) << sh.at;
  });
}

OP_CASE(pick_target_logits) {
  for_each_shard(t.rng, [&](const Shard& sh) {
    Vec x(sh.N);
    cpu::pick_target_logits(x.data(), sh.logits.data(), sh.targets.data(), sh.v_begin, sh.N, sh.V);
    On<std::int32_t> dt(sh.targets);
    Dev dl(sh.logits), dx(Vec(sh.N, NAN));
    k::pick_target_logits(dx.get(), dl.get(), dt.get(), sh.v_begin, sh.N, sh.V);
    EXPECT_EQ(dx.host(), x) << sh.at;
  });
}

OP_CASE(cross_entropy_from_parts) {
  for_each_shard(t.rng, [&](const Shard& sh) {
    Vec x(sh.N), losses(sh.N);
    cpu::pick_target_logits(x.data(), sh.logits.data(), sh.targets.data(), sh.v_begin, sh.N, sh.V);
    cpu::cross_entropy_from_parts(losses.data(), sh.m.data(), sh.s.data(), x.data(), sh.N);
    Dev dm(sh.m), ds(sh.s), dx(x), dlosses(Vec(sh.N, NAN));
    k::cross_entropy_from_parts(dlosses.get(), dm.get(), ds.get(), dx.get(), sh.N);
    EXPECT_LE(max_rel(dlosses.host(), losses), 1e-5) << sh.at;
  });
}

// In place over the logits.
OP_CASE(softmax_cross_entropy_backward_sharded) {
  for_each_shard(t.rng, [&](const Shard& sh) {
    Vec grad = sh.logits;
    cpu::softmax_cross_entropy_backward_sharded(grad.data(), grad.data(), sh.m.data(), sh.s.data(), sh.targets.data(),
                                                sh.v_begin, 1.0f / sh.N, sh.N, sh.V);
    On<std::int32_t> dt(sh.targets);
    Dev dl(sh.logits), dm(sh.m), ds(sh.s);
    k::softmax_cross_entropy_backward_sharded(dl.get(), dl.get(), dm.get(), ds.get(), dt.get(), sh.v_begin,
                                              1.0f / sh.N, sh.N, sh.V);
    EXPECT_LE(max_rel_gradient(dl.host(), grad, 1e-3 / (double(sh.N) * sh.V_full), 1.0f / sh.N), 1e-5) << sh.at;
  });
}

// Every 16-bit pattern widened.
OP_CASE(widen) {
  for (const core::Precision p : kHalves) {
    Bits all(1 << 16);
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = std::uint16_t(i);
    Vec want(all.size());
    cpu::widen(want.data(), all.data(), std::int64_t(all.size()), p);
    On<std::uint16_t> dh(all);
    Dev dy(Vec(all.size()));
    k::widen(dy.get(), dh.get(), std::int64_t(all.size()), p);
    EXPECT_EQ(first_difference(dy.host(), want), -1) << core::precision_name(p);
  }
}

OP_CASE(narrow) {
  for (const core::Precision p : kHalves) {
    const Vec x = rounding_probes(t.rng, p, 1 << 16);
    Bits want(x.size());
    cpu::narrow(want.data(), x.data(), std::int64_t(x.size()), p);
    Dev dx(x);
    On<std::uint16_t> dy(Bits(x.size()));
    k::narrow(dy.get(), dx.get(), std::int64_t(x.size()), p);
    EXPECT_EQ(first_difference(dy.host(), want), -1) << core::precision_name(p);
  }
}

// 16-bit accumulators: random addends, addends of a similar size, and
// addends that land exactly on a tie.
struct Accumulation {
  Bits y;
  Vec addend;
  Accumulation(std::mt19937& g, core::Precision p, std::size_t n) : y(random_bits(g, n)), addend(uniform(g, n, -2, 2)) {
    std::uniform_int_distribution<int> kind(0, 2);
    const Vec probes = rounding_probes(g, p, n);
    for (std::size_t i = 0; i < n; ++i) {
      const int c = kind(g);
      addend[i] = c == 0 ? probes[i] : c == 1 ? core::half_to_float(y[i], p) * addend[i] : half_gap(y[i], p);
    }
  }
};

OP_CASE(narrow_add) {
  for (const core::Precision p : kHalves) {
    const std::size_t n = 1 << 16;
    const Accumulation a(t.rng, p, n);
    Bits want = a.y;
    cpu::narrow_add(want.data(), a.addend.data(), std::int64_t(n), p);
    On<std::uint16_t> dy(a.y);
    Dev da(a.addend);
    k::narrow_add(dy.get(), da.get(), std::int64_t(n), p);
    EXPECT_EQ(first_difference_of_sums(dy.host(), want, p), -1) << core::precision_name(p);
  }
}

OP_CASE(add_half) {
  for (const core::Precision p : kHalves) {
    const std::size_t n = 1 << 16;
    const Accumulation a(t.rng, p, n);
    const Bits x = narrowed(a.addend, p);
    Bits want = a.y;
    cpu::add_half(want.data(), x.data(), std::int64_t(n), p);
    On<std::uint16_t> dy(a.y), dx(x);
    k::add_half(dy.get(), dx.get(), std::int64_t(n), p);
    EXPECT_EQ(first_difference_of_sums(dy.host(), want, p), -1) << core::precision_name(p);
  }
}

OP_CASE(sum_squares_half) {
  for (const core::Precision p : kHalves)
    for (const std::int64_t n : {0, 5, 1 << 20}) {
      const Bits x = narrowed(uniform(t.rng, std::size_t(n), -4, 4), p);
      On<std::uint16_t> dx(x);
      const double want = cpu::sum_squares_half(x.data(), n, p);
      EXPECT_NEAR(k::sum_squares_half(dx.get(), n, p), want, 1e-9 * want) << core::precision_name(p) << " n " << n;
    }
}

// Several tensors at once, each divided by its divisor (a replicated
// parameter's share under tensor parallelism), fp32 and 16-bit: a gradient
// norm's local part.
OP_CASE(sum_squares_tensors) {
  const std::int64_t ns[] = {7, 0, 1 << 16, 1000};
  const double divisors[] = {1.0, 1.0, 4.0, 2.0};
  for (const core::Precision p : {core::Precision::fp32, core::Precision::bf16}) {
    std::vector<Vec> host;
    std::vector<Bits> halves;
    std::vector<std::unique_ptr<Dev>> dev32;
    std::vector<std::unique_ptr<On<std::uint16_t>>> dev16;
    std::vector<const void*> h, d;
    for (const std::int64_t n : ns) {
      host.push_back(uniform(t.rng, std::size_t(n), -3, 3));
      halves.push_back(narrowed(host.back(), p));
    }
    for (std::size_t i = 0; i < host.size(); ++i) {
      if (p == core::Precision::fp32) {
        dev32.push_back(std::make_unique<Dev>(host[i]));
        h.push_back(host[i].data()), d.push_back(dev32.back()->get());
      } else {
        dev16.push_back(std::make_unique<On<std::uint16_t>>(halves[i]));
        h.push_back(halves[i].data()), d.push_back(dev16.back()->get());
      }
    }
    const double want = cpu::sum_squares_tensors(h.data(), ns, divisors, 4, p);
    EXPECT_NEAR(k::sum_squares_tensors(d.data(), ns, divisors, 4, p), want, 1e-9 * want) << core::precision_name(p);
  }
}

OP_CASE(adamw_update) {
  const std::int64_t n = 100003;
  Vec p = uniform(t.rng, n), m(n, 0.0f), v(n, 0.0f);
  Dev dp(p), dm(m), dv(v);
  for (int step = 1; step <= 3; ++step) {
    const Vec g = uniform(t.rng, n, -10, 10);
    Dev dg(g);
    k::adamw_update(dp.get(), dg.get(), dm.get(), dv.get(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    EXPECT_LE(max_rel(dp.host(), p), 1e-5) << "step " << step;
    EXPECT_LE(max_rel(dm.host(), m), 1e-5) << "step " << step;
    EXPECT_LE(max_rel(dv.host(), v), 1e-5) << "step " << step;
  }
}

// ZeRO's mixed step: fp32 master weights and moments, 16-bit gradients
// unscaled by one factor, the 16-bit parameters rewritten. Bit-identical on
// every buffer: every backend runs the same AdamWStep on the same inputs.
OP_CASE(adamw_update_mixed) {
  const std::int64_t n = 100003;
  for (const core::Precision p : kHalves) {
    const std::string fmt = core::precision_name(p);
    Vec master = uniform(t.rng, n), m(n, 0.0f), v(n, 0.0f);
    Bits param = narrowed(master, p);
    Dev dmaster(master), dm(m), dv(v);
    On<std::uint16_t> dparam(param);
    for (int step = 1; step <= 3; ++step) {
      const Bits grad = narrowed(uniform(t.rng, n, -40, 40), p);  // scaled by 4, unscaled below
      On<std::uint16_t> dg(grad);
      k::adamw_update_mixed(dmaster.get(), dparam.get(), dg.get(), 0.25f, dm.get(), dv.get(), n, 1e-2f, 0.9f, 0.95f,
                            1e-8f, 0.1f, step, p);
      cpu::adamw_update_mixed(master.data(), param.data(), grad.data(), 0.25f, m.data(), v.data(), n, 1e-2f, 0.9f,
                              0.95f, 1e-8f, 0.1f, step, p);
      EXPECT_EQ(first_difference(dmaster.host(), master), -1) << fmt << " master, step " << step;
      EXPECT_EQ(first_difference(dparam.host(), param), -1) << fmt << " param, step " << step;
      EXPECT_EQ(first_difference(dm.host(), m), -1) << fmt << " m, step " << step;
      EXPECT_EQ(first_difference(dv.host(), v), -1) << fmt << " v, step " << step;
    }
  }
}

// ---- the driver ----

// The operations of kernels/ops.inc, as the build lists them.
std::vector<std::string> operations() {
  std::vector<std::string> names;
#define STRATA_OP(name) names.push_back(#name);
#include "kernel_ops.inc"
#undef STRATA_OP
  return names;
}

// The device backends this build has.
std::vector<k::Device> backends() {
  std::vector<k::Device> out;
  if (k::cuda_built()) out.push_back(k::Device::cuda);
  if (k::kokkos_built()) out.push_back(k::Device::kokkos);
  return out;
}

class BackendOps : public ::testing::TestWithParam<std::tuple<std::string, k::Device>> {
 protected:
  void SetUp() override {
    const k::Device d = std::get<1>(GetParam());
    if (k::device_count(d) == 0)
      GTEST_SKIP() << "needs a " << k::device_name(d) << " device (" << k::describe_devices(d)
                   << "); the backend is compiled and linked, and runs against the CPU backend where it has one";
    ctx_.device = d;
    seed_ = test_seed();
    RecordProperty("seed", std::to_string(seed_));
    ctx_.rng.seed(seed_);
    k::use_device(d);
  }
  void TearDown() override { k::use_device(k::Device::cpu); }
  Ctx ctx_;
  unsigned seed_ = 0;
};

TEST_P(BackendOps, MatchesTheCpuBackend) {
  const std::string& op = std::get<0>(GetParam());
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (rerun with STRATA_TEST_SEED)");
  const auto it = cases().find(op);
  ASSERT_NE(it, cases().end()) << op << " (kernels/ops.inc) has no case in this program";
  it->second(ctx_);
}

INSTANTIATE_TEST_SUITE_P(Every, BackendOps, ::testing::Combine(::testing::ValuesIn(operations()), ::testing::ValuesIn(backends())),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + k::device_name(std::get<1>(info.param));
                         });
// A build with the CPU backend alone has nothing to compare.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackendOps);

// The cases are the operations: none missing, none left over from a removed one.
TEST(BackendOpsList, EveryOperationHasACase) {
  const std::vector<std::string> ops = operations();
  EXPECT_GE(ops.size(), 30u);  // the list was read
  for (const std::string& op : ops) EXPECT_TRUE(cases().count(op)) << op << " (kernels/ops.inc) has no case";
  for (const auto& [name, c] : cases())
    EXPECT_NE(std::find(ops.begin(), ops.end(), name), ops.end()) << name << " is not an operation of kernels/ops.inc";
}

}  // namespace
