// Every operation of the kernel interface on every backend that was built,
// in every format a run stores tensors in (fp32, bf16, fp16), on the same
// fresh random inputs (as ggml's test-backend-ops): one case per operation of
// kernels/ops.inc, run once per backend (cpu, cuda, kokkos). In each format
// a case checks two things:
//   * the selected device's result against the CPU backend's;
//   * (16-bit formats) the CPU backend's 16-bit result against its fp32
//     kernel run on the same inputs (the 16-bit values, widened), rounded to
//     the format: a 16-bit kernel computes in fp32 and rounds what it writes
//     once, so it must be that result, to within a unit in the last place
//     where the two sum in different orders (GEMMs, reductions), and a few
//     more where it keeps 16-bit intermediates as a 16-bit kernel must
//     (attention's probabilities and score gradients).
// The list of operations is the build's (generated/kernel_ops.inc), so an
// operation without a case here fails EveryOperationHasACase, and a new
// backend is tested on every operation by adding it to backends(). The CPU
// "backend" row checks the CPU against itself in fp32 (trivially) and its
// 16-bit kernels against its fp32 ones: it runs on every build.
//
// Bounds. fp32: results within 1e-5 relative (elementwise and AdamW, whose
// per-element arithmetic is the same code, to a few ulps; reductions summed
// in another order, GEMMs, bias and embedding gradients, cross-entropy fused
// and in vocabulary-parallel pieces, to that bound: the losses relative to
// the largest, the gradient's target entry to a few ulps of the loss scale
// as well); LayerNorm's forward within the bound plus the CPU's own distance
// from a double-precision reference; LayerNorm's dx and attention's tensors
// relative to their largest entry; copies, adds, scaling, the bias add, the
// embedding lookup and the row maxima equal; conversions, the mixed-format
// adds (up to which NaN a NaN + NaN gives) and the mixed-precision AdamW step
// bit-identical (the same scalar code on both sides); the sums of squares
// within 1e-12 (fp32) and 1e-9 (16-bit). 16-bit results: the fp32 bound or
// one unit in the last place of the format (2^-7 relative for bf16, 2^-10
// for fp16), whichever is larger; the exact ones stay exact; attention within
// the ulps its cases name. A fp32 gradient (a weight's) fed by 16-bit
// operands keeps the fp32 bound against the CPU's on the same operands.
// A backend without a device here (cuda on a machine without a GPU) skips
// and says why; its kernels are still compiled and linked.
// Seed: fresh per run, printed on failure; rerun with STRATA_TEST_SEED.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
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
#include "kernels/unfused_attention.hpp"

// The device in test names and messages: "kokkos", not its bytes.
namespace strata::kernels {
void PrintTo(Device d, std::ostream* os) { *os << device_name(d); }
}  // namespace strata::kernels

namespace cpu = strata::kernels::cpu;
namespace k = strata::kernels;
namespace core = strata::core;

namespace {

using core::Precision;
using Vec = std::vector<float>;
using Bits = std::vector<std::uint16_t>;
using Tokens = std::vector<std::int32_t>;

constexpr Precision kFormats[] = {Precision::fp32, Precision::bf16, Precision::fp16};
constexpr Precision kHalves[] = {Precision::bf16, Precision::fp16};
const char* name(Precision p) { return core::precision_name(p); }

// One unit in the last place of format p, relative (the gap above 1).
double ulp(Precision p) { return p == Precision::bf16 ? 0x1p-7 : p == Precision::fp16 ? 0x1p-10 : 0x1p-23; }

// A comparison's bound at format p: fp32's, or `ulps` units in the last
// place of p, whichever is larger.
double bound(Precision p, double fp32, double ulps = 1) {
  return p == Precision::fp32 ? fp32 : std::max(fp32, ulps * ulp(p));
}

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

// A tensor of format p on the host: the values it was made from, rounded;
// values() widens them back.
class Host {
 public:
  Host(const Vec& x, Precision p) : p_(p), n_(x.size()), bytes_(x.size() * std::size_t(core::element_bytes(p)) + 4) {
    cpu::convert(ptr(), x.data(), std::int64_t(n_));
  }
  core::Ptr ptr(std::int64_t at = 0) { return core::Ptr(bytes_.data(), p_) + at; }
  core::CPtr ptr(std::int64_t at = 0) const { return core::CPtr(bytes_.data(), p_) + at; }
  float* f32() { return ptr().f32(); }
  Vec values() const {
    Vec v(n_);
    cpu::convert(v.data(), ptr(), std::int64_t(n_));
    return v;
  }
  Precision format() const { return p_; }
  std::size_t size() const { return n_; }
  const void* data() const { return bytes_.data(); }

 private:
  Precision p_;
  std::size_t n_;
  std::vector<std::byte> bytes_;
};

// x rounded to p and widened back: the fp32 inputs of a case's reference.
Vec in_format(const Vec& x, Precision p) { return Host(x, p).values(); }

// A copy of a host tensor (or of fp32 values) in the selected device's
// memory, freed with the object.
class Dev {
 public:
  explicit Dev(const Host& h)
      : p_(h.format()), n_(h.size()), bytes_(n_ * std::size_t(core::element_bytes(p_))), d_(k::device_alloc(bytes_ + 4)) {
    k::copy_bytes(d_, h.data(), bytes_);
  }
  explicit Dev(const Vec& x, Precision p = Precision::fp32) : Dev(Host(x, p)) {}
  ~Dev() { k::device_free(d_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  core::Ptr ptr(std::int64_t at = 0) { return core::Ptr(d_, p_) + at; }
  float* f32() { return ptr().f32(); }
  Vec values() const {
    k::synchronize();
    std::vector<std::byte> h(bytes_ + 4);
    k::copy_bytes(h.data(), d_, bytes_);
    Vec v(n_);
    cpu::convert(v.data(), core::CPtr(h.data(), p_), std::int64_t(n_));
    return v;
  }
  Vec host() const { return values(); }

 private:
  Precision p_;
  std::size_t n_, bytes_;
  void* d_;
};

// A copy of a host vector of T in the device's memory (token ids, raw 16-bit codes).
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

// first_difference for sums, where any NaN equals any NaN: which operand's
// payload a NaN + NaN keeps is the hardware's choice (x86 keeps the first
// operand's, and a compiler may swap the operands of an add; a GPU returns
// its canonical NaN).
std::int64_t first_difference_of_sums(const Vec& a, const Vec& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(std::isnan(a[i]) && std::isnan(b[i])))
      return std::int64_t(i);
  return -1;
}

// Half the step from the 16-bit value h to the next one away from zero:
// widen(h) plus this is an exact tie between the two.
float half_gap(std::uint16_t h, Precision p) {
  return (core::half_to_float(std::uint16_t(h + 1), p) - core::half_to_float(h, p)) / 2;
}

// fp32 values that probe rounding to format p: random bit patterns (every
// exponent, fp32 subnormals, infinities, NaNs), exact ties between
// neighbouring 16-bit values and the fp32 values either side of them, fp16's
// subnormal range, and the edges of fp16's and bf16's ranges.
Vec rounding_probes(std::mt19937& g, Precision p, std::size_t n) {
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

// ---- the cases: one per operation, each running the operation on the
// selected device (k::) and on the CPU backend (cpu::) in every format ----
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

// The two checks of a result in format p: the CPU's 16-bit result (cpu16)
// against the CPU's fp32 one on the same inputs rounded to p (want), within
// bound(p, fp32, ref_ulps); and the device's (dev) against the CPU's, within
// bound(p, fp32, dev_ulps). `measure` is max_rel-like.
template <class Measure>
void expect_close(Measure measure, const Vec& dev, const Vec& cpu16, const Vec& want32, Precision p, double fp32,
                  const std::string& what, double ref_ulps = 1, double dev_ulps = 1) {
  if (p != Precision::fp32) {
    const Vec r = in_format(want32, p);
    EXPECT_LE(measure(cpu16, r), bound(p, fp32, ref_ulps)) << what << ", cpu against rounded fp32";
  }
  EXPECT_LE(measure(dev, cpu16), bound(p, fp32, dev_ulps)) << what << ", device against cpu";
}
auto elementwise(double floor = 1e-3) {
  return [floor](const Vec& a, const Vec& b) { return max_rel(a, b, floor); };
}
auto to_max() {
  return [](const Vec& a, const Vec& b) { return rel_to_max(a, b); };
}

// Every transpose combination, packed and with leading dimensions wider
// than the matrices, alpha and beta both active; C in the operands' format
// and, 16-bit operands, in fp32 (a weight gradient).
OP_CASE(matmul) {
  const int M = 37, N = 53, K = 129;
  for (const Precision p : kFormats)
    for (const Precision pc : p == Precision::fp32 ? std::vector{p} : std::vector{p, Precision::fp32})
      for (const int pad : {0, 3})
        for (bool ta : {false, true})
          for (bool tb : {false, true}) {
            if (pc != p && (pad != 0 || ta)) continue;  // the fp32 result: one layout per tb is enough
            const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
            const Host A(uniform(t.rng, std::size_t(ta ? K : M) * lda), p),
                B(uniform(t.rng, std::size_t(tb ? N : K) * ldb), p);
            const Vec c0 = uniform(t.rng, std::size_t(M) * ldc);
            Host C(c0, pc), C32(C.values(), Precision::fp32);
            const Host A32(A.values(), Precision::fp32), B32(B.values(), Precision::fp32);
            Dev dA(A), dB(B), dC(C);
            k::matmul(ta, tb, M, N, K, 0.7f, dA.ptr(), lda, dB.ptr(), ldb, 0.3f, dC.ptr(), ldc);
            cpu::matmul(ta, tb, M, N, K, 0.7f, A.ptr(), lda, B.ptr(), ldb, 0.3f, C.ptr(), ldc);
            cpu::matmul(ta, tb, M, N, K, 0.7f, A32.ptr(), lda, B32.ptr(), ldb, 0.3f, C32.ptr(), ldc);
            // K products summed in another order: relative to the sums' scale.
            expect_close(elementwise(1.0), dC.values(), C.values(), pc == p ? C32.values() : C.values(), pc, 1e-5,
                         std::string(name(p)) + " into " + name(pc) + " trans_a " + std::to_string(ta) +
                             " trans_b " + std::to_string(tb) + " pad " + std::to_string(pad));
            if (pc != p) {  // an fp32 result keeps fp32's bound against the same products in fp32
              EXPECT_LE(max_rel(C.values(), C32.values(), 1.0), 1e-5) << name(p) << " into fp32";
            }
          }
}

// The strided batch attention uses.
OP_CASE(matmul_strided_batched) {
  const int M = 37, N = 53, K = 129, batch = 6;
  for (const Precision p : kFormats) {
    const Host A(uniform(t.rng, std::size_t(batch) * M * K), p), B(uniform(t.rng, std::size_t(batch) * N * K), p);
    const Host A32(A.values(), Precision::fp32), B32(B.values(), Precision::fp32);
    Host C(Vec(std::size_t(batch) * M * N, 0.0f), p), C32(Vec(std::size_t(batch) * M * N, 0.0f), Precision::fp32);
    Dev dA(A), dB(B), dC(C);
    k::matmul_strided_batched(false, true, M, N, K, 1.0f, dA.ptr(), K, std::int64_t(M) * K, dB.ptr(), K,
                              std::int64_t(N) * K, 0.0f, dC.ptr(), N, std::int64_t(M) * N, batch);
    cpu::matmul_strided_batched(false, true, M, N, K, 1.0f, A.ptr(), K, std::int64_t(M) * K, B.ptr(), K,
                                std::int64_t(N) * K, 0.0f, C.ptr(), N, std::int64_t(M) * N, batch);
    cpu::matmul_strided_batched(false, true, M, N, K, 1.0f, A32.ptr(), K, std::int64_t(M) * K, B32.ptr(), K,
                                std::int64_t(N) * K, 0.0f, C32.ptr(), N, std::int64_t(M) * N, batch);
    expect_close(elementwise(1.0), dC.values(), C.values(), C32.values(), p, 1e-5, name(p));
  }
}

// A linear layer's product with its bias, written or accumulated (beta 0,
// 1), with the weights and the bias at offsets that leave them aligned to
// an element only (a parameter inside the flat buffer), at GPT-like and odd
// sizes; under 16 bits the product and the bias are summed before the one
// rounding.
OP_CASE(linear_bias_forward) {
  struct Shape {
    int N, IC, OC;
  };
  for (const Precision p : kFormats)
    for (const Shape& sh : {Shape{512, 256, 768}, Shape{37, 19, 53}, Shape{1024, 128, 512}})
      for (const int offset : {0, 1})
        for (const float beta : {0.0f, 1.0f}) {
          const Host x(uniform(t.rng, std::size_t(sh.N) * sh.IC), p);
          const Host w(uniform(t.rng, std::size_t(sh.OC) * sh.IC + offset), p);
          const Host b(uniform(t.rng, std::size_t(sh.OC) + offset), p);
          Host out(uniform(t.rng, std::size_t(sh.N) * sh.OC), p);
          Host out32(out.values(), Precision::fp32);
          const Host x32(x.values(), Precision::fp32), w32(w.values(), Precision::fp32), b32(b.values(), Precision::fp32);
          Dev dx(x), dw(w), db(b), dout(out);
          k::linear_bias_forward(dout.ptr(), dx.ptr(), dw.ptr(offset), db.ptr(offset), sh.N, sh.IC, sh.OC, beta);
          cpu::linear_bias_forward(out.ptr(), x.ptr(), w.ptr(offset), b.ptr(offset), sh.N, sh.IC, sh.OC, beta);
          cpu::linear_bias_forward(out32.ptr(), x32.ptr(), w32.ptr(offset), b32.ptr(offset), sh.N, sh.IC, sh.OC, beta);
          // 16 bits: relative to the sums' scale, as matmul's (a near-zero
          // output is a cancellation whose last fp32 bits the two orders of
          // summation set differently, and which the rounding then keeps).
          expect_close(elementwise(p == Precision::fp32 ? 1e-3 : 1.0), dout.values(), out.values(), out32.values(), p,
                       1e-5,
                       std::string(name(p)) + " " + std::to_string(sh.N) + "x" + std::to_string(sh.IC) + "x" +
                           std::to_string(sh.OC) + " offset " + std::to_string(offset) + " beta " +
                           std::to_string(beta));
        }
}

OP_CASE(bias_add) {
  const int N = 37, C = 300;
  for (const Precision p : kFormats) {
    Host x(uniform(t.rng, std::size_t(N) * C), p), x32(x.values(), Precision::fp32);
    const Host bias(uniform(t.rng, C), p), bias32(bias.values(), Precision::fp32);
    Dev dx(x), db(bias);
    k::bias_add(dx.ptr(), db.ptr(), N, C);
    cpu::bias_add(x.ptr(), bias.ptr(), N, C);
    cpu::bias_add(x32.ptr(), bias32.ptr(), N, C);
    EXPECT_EQ(dx.values(), x.values()) << name(p);
    EXPECT_EQ(x.values(), in_format(x32.values(), p)) << name(p) << ": one rounding of the fp32 sum";
  }
}

// dbias (fp32) from a 16-bit dout: fp32's bound against the same sums of
// the widened values.
OP_CASE(bias_backward) {
  const int N = 513, C = 77;
  for (const Precision p : kFormats) {
    const Host dout(uniform(t.rng, std::size_t(N) * C), p), dout32(dout.values(), Precision::fp32);
    const Vec db0 = uniform(t.rng, C);
    Vec db = db0, db32 = db0;
    Dev dd(dout), ddb(db0);
    k::bias_backward(ddb.f32(), dd.ptr(), N, C);
    cpu::bias_backward(db.data(), dout.ptr(), N, C);
    cpu::bias_backward(db32.data(), dout32.ptr(), N, C);
    EXPECT_LE(max_rel(ddb.values(), db), 1e-5) << name(p);
    EXPECT_LE(max_rel(db, db32), 1e-5) << name(p) << ", against fp32 on the same values";
  }
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
// and the mean, which an elementwise bound would amplify. Under 16 bits the
// double reference takes the rounded inputs and its out is rounded too; the
// statistics are fp32 whatever the format.
OP_CASE(layernorm_forward) {
  for (const Precision p : kFormats)
    for (const auto& [N, C] : {std::pair{1, 7}, std::pair{64, 768}, std::pair{300, 1024}}) {
      // A mean far from zero: the two-pass variance must not cancel.
      const Host x(uniform(t.rng, std::size_t(N) * C, 90, 110), p), w(uniform(t.rng, C), p), b(uniform(t.rng, C), p);
      Host out(Vec(x.size()), p);
      Vec mean(N), rstd(N), exact_out(x.size()), exact_mean(N), exact_rstd(N);
      Dev dx(x), dw(w), db(b), dout(out), dmean(mean), drstd(rstd);
      k::layernorm_forward(dout.ptr(), dmean.f32(), drstd.f32(), dx.ptr(), dw.ptr(), db.ptr(), N, C);
      cpu::layernorm_forward(out.ptr(), mean.data(), rstd.data(), x.ptr(), w.ptr(), b.ptr(), N, C);
      layernorm_in_double(exact_out, exact_mean, exact_rstd, x.values(), w.values(), b.values(), N, C);
      const Vec exact = in_format(exact_out, p);
      const std::string at = std::string(name(p)) + " " + std::to_string(N) + " x " + std::to_string(C);
      EXPECT_LE(rel_to_max(dout.values(), exact), rel_to_max(out.values(), exact) + bound(p, 1e-5)) << at;
      EXPECT_LE(max_rel(dmean.values(), exact_mean), max_rel(mean, exact_mean) + 1e-6) << at;
      EXPECT_LE(max_rel(drstd.values(), exact_rstd), max_rel(rstd, exact_rstd) + 1e-5) << at;
      EXPECT_LE(rel_to_max(out.values(), exact), bound(p, 1e-4)) << at << ", cpu against double";
    }
}

OP_CASE(layernorm_backward) {
  const int N = 200, C = 384;
  for (const Precision p : kFormats) {
    const Host x(uniform(t.rng, std::size_t(N) * C, -3, 5), p), w(uniform(t.rng, C), p), b(uniform(t.rng, C), p);
    const Host dy(uniform(t.rng, x.size()), p);
    const Host x32(x.values(), Precision::fp32), w32(w.values(), Precision::fp32), b32(b.values(), Precision::fp32),
        dy32(dy.values(), Precision::fp32);
    Host out(Vec(x.size()), p);
    Vec mean(N), rstd(N);
    cpu::layernorm_forward(out.ptr(), mean.data(), rstd.data(), x.ptr(), w.ptr(), b.ptr(), N, C);
    // Accumulation: every gradient starts non-zero.
    Host dx(uniform(t.rng, x.size()), p), dx32(dx.values(), Precision::fp32);
    const Vec dw0 = uniform(t.rng, C), db0 = uniform(t.rng, C);
    Vec dw = dw0, dbias = db0, dw32 = dw0, db32 = db0;
    Dev ddx(dx), ddw(dw0), ddb(db0), ddy(dy), dxin(x), dwt(w), dmean(mean), drstd(rstd);
    k::layernorm_backward(ddx.ptr(), ddw.f32(), ddb.f32(), ddy.ptr(), dxin.ptr(), dwt.ptr(), dmean.f32(), drstd.f32(),
                          N, C);
    cpu::layernorm_backward(dx.ptr(), dw.data(), dbias.data(), dy.ptr(), x.ptr(), w.ptr(), mean.data(), rstd.data(),
                            N, C);
    cpu::layernorm_backward(dx32.ptr(), dw32.data(), db32.data(), dy32.ptr(), x32.ptr(), w32.ptr(), mean.data(),
                            rstd.data(), N, C);
    expect_close(to_max(), ddx.values(), dx.values(), dx32.values(), p, 1e-5, std::string(name(p)) + " dx");
    EXPECT_LE(max_rel(ddw.values(), dw), 1e-5) << name(p);
    EXPECT_LE(max_rel(ddb.values(), dbias), 1e-5) << name(p);
    EXPECT_LE(max_rel(dw, dw32), 1e-5) << name(p) << " dweight, against fp32 on the same values";
    EXPECT_LE(max_rel(dbias, db32), 1e-5) << name(p) << " dbias, against fp32 on the same values";
  }
}

constexpr std::int64_t kLengths[] = {1, 1000, 1 << 20};

// RMSNorm at a GPT-like and an odd width, accumulating into nonzero
// gradients; relative to the largest entry (dx is a difference of terms).
OP_CASE(rmsnorm_forward) {
  for (const Precision p : kFormats)
    for (const auto& [N, C] : {std::pair{512, 768}, std::pair{37, 301}}) {
      const Host x(uniform(t.rng, std::size_t(N) * C, -2, 3), p), w(uniform(t.rng, C, 0.5f, 1.5f), p);
      const Host x32(x.values(), Precision::fp32), w32(w.values(), Precision::fp32);
      Host out(Vec(x.size()), p), out32(Vec(x.size()), Precision::fp32);
      Vec rstd(N), rstd32(N);
      Dev dx(x), dw(w), dout(Vec(out.size(), NAN), p), drstd(Vec(rstd.size(), NAN));
      k::rmsnorm_forward(dout.ptr(), drstd.f32(), dx.ptr(), dw.ptr(), N, C);
      cpu::rmsnorm_forward(out.ptr(), rstd.data(), x.ptr(), w.ptr(), N, C);
      cpu::rmsnorm_forward(out32.ptr(), rstd32.data(), x32.ptr(), w32.ptr(), N, C);
      const std::string at = std::string(name(p)) + " " + std::to_string(N) + "x" + std::to_string(C);
      expect_close(elementwise(), dout.values(), out.values(), out32.values(), p, 1e-5, at);
      EXPECT_LE(max_rel(drstd.values(), rstd), 1e-5) << at;
      EXPECT_LE(max_rel(rstd, rstd32), 1e-5) << at << " rstd, against fp32 on the same values";
    }
}

OP_CASE(rmsnorm_backward) {
  for (const Precision p : kFormats)
    for (const auto& [N, C] : {std::pair{512, 768}, std::pair{37, 301}}) {
      const Host x(uniform(t.rng, std::size_t(N) * C, -2, 3), p), w(uniform(t.rng, C, 0.5f, 1.5f), p);
      const Host dy(uniform(t.rng, x.size()), p);
      const Host x32(x.values(), Precision::fp32), w32(w.values(), Precision::fp32), dy32(dy.values(), Precision::fp32);
      Host out(Vec(x.size()), p);
      Vec rstd(N);
      cpu::rmsnorm_forward(out.ptr(), rstd.data(), x.ptr(), w.ptr(), N, C);
      Host dx(uniform(t.rng, x.size()), p), dx32(dx.values(), Precision::fp32);
      const Vec dw0 = uniform(t.rng, C);
      Vec dw = dw0, dw32 = dw0;
      Dev ddx(dx), ddw(dw0), ddy(dy), dxin(x), dwt(w), drstd(rstd);
      k::rmsnorm_backward(ddx.ptr(), ddw.f32(), ddy.ptr(), dxin.ptr(), dwt.ptr(), drstd.f32(), N, C);
      cpu::rmsnorm_backward(dx.ptr(), dw.data(), dy.ptr(), x.ptr(), w.ptr(), rstd.data(), N, C);
      cpu::rmsnorm_backward(dx32.ptr(), dw32.data(), dy32.ptr(), x32.ptr(), w32.ptr(), rstd.data(), N, C);
      const std::string at = std::string(name(p)) + " " + std::to_string(N) + "x" + std::to_string(C);
      expect_close(to_max(), ddx.values(), dx.values(), dx32.values(), p, 1e-5, at + " dx");
      EXPECT_LE(rel_to_max(ddw.values(), dw), 1e-5) << at;
      EXPECT_LE(rel_to_max(dw, dw32), 1e-5) << at << " dweight, against fp32 on the same values";
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
  for (const Precision p : kFormats)
    for (const RopeShape r : {RopeShape{}, RopeShape{.B = 1, .T = 5, .hs = 16, .heads = 3, .kv = 1, .pos0 = 0}}) {
      Host x(uniform(t.rng, std::size_t(r.B) * r.T * std::size_t(r.ld())), p), x32(x.values(), Precision::fp32);
      Dev dx(x);
      auto turn = [&](auto op, core::Ptr v) {
        op(v, r.B, r.T, r.ld(), r.heads, r.hs, r.pos0, backward ? 1e4f : 5e5f);
      };
      if (backward) {
        turn(k::rope_backward, dx.ptr());
        turn(cpu::rope_backward, x.ptr());
        turn(cpu::rope_backward, x32.ptr());
      } else {
        turn(k::rope_forward, dx.ptr());
        turn(cpu::rope_forward, x.ptr());
        turn(cpu::rope_forward, x32.ptr());
      }
      expect_close(elementwise(1.0), dx.values(), x.values(), x32.values(), p, 1e-6,
                   std::string(name(p)) + " hs " + std::to_string(r.hs));
    }
}

OP_CASE(rope_forward) { rope_case(t, false); }
OP_CASE(rope_backward) { rope_case(t, true); }

OP_CASE(swiglu_forward) {
  for (const Precision p : kFormats)
    for (const auto& [N, F] : {std::pair{512, 688}, std::pair{37, 19}}) {
      const Host in(uniform(t.rng, std::size_t(N) * 2 * F, -6, 6), p), in32(in.values(), Precision::fp32);
      Host out(Vec(std::size_t(N) * F), p), out32(Vec(std::size_t(N) * F), Precision::fp32);
      Dev din(in), dout(Vec(out.size(), NAN), p);
      k::swiglu_forward(dout.ptr(), din.ptr(), N, F);
      cpu::swiglu_forward(out.ptr(), in.ptr(), N, F);
      cpu::swiglu_forward(out32.ptr(), in32.ptr(), N, F);
      expect_close(elementwise(), dout.values(), out.values(), out32.values(), p, 1e-5,
                   std::string(name(p)) + " " + std::to_string(N) + "x" + std::to_string(F));
    }
}

OP_CASE(swiglu_backward) {
  for (const Precision p : kFormats)
    for (const auto& [N, F] : {std::pair{512, 688}, std::pair{37, 19}}) {
      const Host in(uniform(t.rng, std::size_t(N) * 2 * F, -6, 6), p), dy(uniform(t.rng, std::size_t(N) * F), p);
      const Host in32(in.values(), Precision::fp32), dy32(dy.values(), Precision::fp32);
      Host din(uniform(t.rng, in.size()), p), din32(din.values(), Precision::fp32);
      Dev d_in(in), d_dy(dy), d_din(din);
      k::swiglu_backward(d_din.ptr(), d_in.ptr(), d_dy.ptr(), N, F);
      cpu::swiglu_backward(din.ptr(), in.ptr(), dy.ptr(), N, F);
      cpu::swiglu_backward(din32.ptr(), in32.ptr(), dy32.ptr(), N, F);
      expect_close(elementwise(), d_din.values(), din.values(), din32.values(), p, 1e-5,
                   std::string(name(p)) + " " + std::to_string(N) + "x" + std::to_string(F));
    }
}

OP_CASE(gelu_forward) {
  for (const Precision p : kFormats)
    for (const std::int64_t n : kLengths) {
      const Host a(uniform(t.rng, n, -4, 4), p), a32(a.values(), Precision::fp32);
      Host out(Vec(n), p), out32(Vec(n), Precision::fp32);
      Dev da(a), dout(out);
      k::gelu_forward(dout.ptr(), da.ptr(), n);
      cpu::gelu_forward(out.ptr(), a.ptr(), n);
      cpu::gelu_forward(out32.ptr(), a32.ptr(), n);
      expect_close(elementwise(), dout.values(), out.values(), out32.values(), p, 1e-5,
                   std::string(name(p)) + " n " + std::to_string(n));
    }
}

OP_CASE(gelu_backward) {
  for (const Precision p : kFormats)
    for (const std::int64_t n : kLengths) {
      const Host a(uniform(t.rng, n, -4, 4), p), d(uniform(t.rng, n), p);
      const Host a32(a.values(), Precision::fp32), d32(d.values(), Precision::fp32);
      Host g(uniform(t.rng, n), p), g32(g.values(), Precision::fp32);  // accumulated into
      Dev da(a), dd(d), dg(g);
      k::gelu_backward(dg.ptr(), da.ptr(), dd.ptr(), n);
      cpu::gelu_backward(g.ptr(), a.ptr(), d.ptr(), n);
      cpu::gelu_backward(g32.ptr(), a32.ptr(), d32.ptr(), n);
      expect_close(elementwise(), dg.values(), g.values(), g32.values(), p, 1e-5,
                   std::string(name(p)) + " n " + std::to_string(n));
    }
}

OP_CASE(residual_forward) {
  for (const Precision p : kFormats)
    for (const std::int64_t n : kLengths) {
      const Host a(uniform(t.rng, n, -4, 4), p), b(uniform(t.rng, n, -4, 4), p);
      Host out(Vec(n), p);
      Dev da(a), db(b), dout(out);
      k::residual_forward(dout.ptr(), da.ptr(), db.ptr(), n);
      cpu::residual_forward(out.ptr(), a.ptr(), b.ptr(), n);
      EXPECT_EQ(dout.values(), out.values()) << name(p) << " n " << n;
      Vec sum = a.values();
      const Vec bv = b.values();
      for (std::int64_t i = 0; i < n; ++i) sum[i] += bv[i];
      EXPECT_EQ(out.values(), in_format(sum, p)) << name(p) << ": one rounding of the fp32 sum";
    }
}

// y = y + x for every pair of formats (a 16-bit accumulator taking fp32 or
// 16-bit addends, an fp32 one taking 16-bit ones): the fp32 sum rounded once,
// bit for bit on every backend; random addends, addends of a similar size,
// and addends that land exactly on a tie.
OP_CASE(add_inplace) {
  for (const std::int64_t n : kLengths)
    for (const Precision py : kFormats)
      for (const Precision px : kFormats) {
        Vec x0 = uniform(t.rng, n, -4, 4);
        const Host y(uniform(t.rng, n, -4, 4), py);
        if (py != Precision::fp32) {
          // Ties of y's format where the addend can carry one (fp32 addends).
          const Vec yv = y.values();
          for (std::int64_t i = 0; i < n; i += 3) {
            const std::uint16_t h = core::float_to_half(yv[i], py);
            if (px == Precision::fp32) x0[i] = half_gap(h, py);
          }
        }
        const Host x(x0, px);
        Host got(y.values(), py);
        Dev dy(y), dx(x);
        k::add_inplace(dy.ptr(), dx.ptr(), n);
        cpu::add_inplace(got.ptr(), x.ptr(), n);
        Vec want = y.values();
        const Vec xv = x.values();
        for (std::int64_t i = 0; i < n; ++i) want[i] += xv[i];
        const std::string at = std::string(name(py)) + " += " + name(px) + " n " + std::to_string(n);
        EXPECT_EQ(first_difference_of_sums(got.values(), in_format(want, py)), -1) << at;
        EXPECT_EQ(first_difference_of_sums(dy.values(), got.values()), -1) << at;
      }
}

OP_CASE(scale_inplace) {
  for (const Precision p : kFormats)
    for (const std::int64_t n : kLengths) {
      Host a(uniform(t.rng, n, -4, 4), p);
      Vec want = a.values();
      for (auto& v : want) v *= 0.37f;
      Dev da(a);
      k::scale_inplace(da.ptr(), 0.37f, n);
      cpu::scale_inplace(a.ptr(), 0.37f, n);
      EXPECT_EQ(da.values(), a.values()) << name(p) << " n " << n;
      EXPECT_EQ(a.values(), in_format(want, p)) << name(p) << " n " << n;
    }
}

OP_CASE(fill_zero) {
  for (const Precision p : kFormats)
    for (const std::int64_t n : kLengths) {
      Dev da(uniform(t.rng, n), p);
      k::fill_zero(da.ptr(), n);
      EXPECT_EQ(da.values(), Vec(std::size_t(n), 0.0f)) << name(p) << " n " << n;
    }
}

// Between every pair of formats: every 16-bit code widened (exact), fp32
// values that probe the rounding narrowed (nearest even, the edges of the
// ranges, NaN), and one 16-bit format into the other; bit for bit on every
// backend.
OP_CASE(convert) {
  for (const Precision from : kFormats)
    for (const Precision to : kFormats) {
      Vec x;
      if (from == Precision::fp32) {
        x = rounding_probes(t.rng, to == Precision::fp32 ? Precision::bf16 : to, 1 << 14);
      } else {
        for (int c = 0; c < (1 << 16); ++c) x.push_back(core::half_to_float(std::uint16_t(c), from));
      }
      const Host src(x, from);  // exact: x holds values of `from` (or fp32 ones)
      Host got(Vec(x.size()), to);
      Dev dsrc(src), dgot(Vec(x.size()), to);
      k::convert(dgot.ptr(), dsrc.ptr(), std::int64_t(x.size()));
      cpu::convert(got.ptr(), src.ptr(), std::int64_t(x.size()));
      const std::string at = std::string(name(from)) + " to " + name(to);
      // The CPU against the scalar rounding of precision.hpp, bit for bit.
      Vec want = src.values();
      if (to != Precision::fp32)
        for (auto& v : want) v = core::half_to_float(core::float_to_half(v, to), to);
      std::vector<std::uint32_t> gb, wb, db;
      for (const float v : got.values()) gb.push_back(std::bit_cast<std::uint32_t>(v));
      for (const float v : want) wb.push_back(std::bit_cast<std::uint32_t>(v));
      for (const float v : dgot.values()) db.push_back(std::bit_cast<std::uint32_t>(v));
      EXPECT_EQ(first_difference(gb, wb), -1) << at;
      EXPECT_EQ(first_difference(db, gb), -1) << at << ", device against cpu";
    }
}

OP_CASE(sum_squares) {
  for (const Precision p : kFormats)
    for (const std::int64_t n : {0, 5, 1 << 20}) {
      const Host x(uniform(t.rng, std::size_t(n), -4, 4), p);
      Dev dx(x);
      double exact = 0;
      for (const float v : x.values()) exact += double(v) * v;
      const double want = cpu::sum_squares(x.ptr(), n);
      const double tol = p == Precision::fp32 ? 1e-12 : 1e-9;
      EXPECT_NEAR(k::sum_squares(dx.ptr(), n), want, tol * std::max(want, 1.0)) << name(p) << " n " << n;
      // Summed in another order: n 2^-53 of the sum at worst.
      EXPECT_NEAR(want, exact, 2e-10 * std::max(exact, 1.0)) << name(p) << " n " << n << ", cpu against double";
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

// Attention's bounds at 16 bits, in units in the last place of the format,
// relative to the largest entry: the CPU keeps the probabilities (and the
// backward its score gradients) in the format, one rounding each that the
// fp32 reference does not make, and its products read them; the Kokkos
// backend also writes the scores and dP there before its softmax reads them;
// the CUDA backend rounds P and dS for its tensor-core products. Over 60
// seeds of these shapes the worst was 1.7 ulps (forward, backward and ring
// blocks alike, CPU against fp32 and Kokkos against the CPU); 4 allows for
// what those seeds did not reach. The ring's blocks round out (and, in the
// format, dq and dkv) once more per block merged into them: 2 more.
constexpr double kAttentionUlps = 4, kAttentionBackwardUlps = 4;

// The state the selected device's backward needs (the CUDA backend keeps the
// rows' log-sum-exp, the others the probabilities) and the scratch.
bool fused(const Ctx& t) { return t.device == k::Device::cuda; }
std::size_t state_elements(const Ctx& t, const AttentionShape& s) {
  return std::size_t(k::attention_state_elements(fused(t), s.B, s.NH, s.T));
}
std::size_t scratch_elements(const Ctx& t, const AttentionShape& s, Precision p) {
  return std::size_t(k::attention_scratch_elements(fused(t), s.B, s.NH, s.T, s.C(), p));
}
Precision state_format(const Ctx& t, Precision p) { return k::attention_state_format(fused(t), p); }

OP_CASE(attention_forward) {
  for (const Precision p : kFormats)
    for (const AttentionShape& s : kAttentionShapes) {
      const int C = s.C();
      const std::size_t probs = std::size_t(k::attention_state_elements(false, s.B, s.NH, s.T));
      const Host qkv(uniform(t.rng, std::size_t(s.B) * s.T * s.W(), -2, 2), p), qkv32(qkv.values(), Precision::fp32);
      Host out(Vec(std::size_t(s.B) * s.T * C), p), state(Vec(probs), p);
      Host out32(Vec(out.size()), Precision::fp32), state32(Vec(probs), Precision::fp32);
      cpu::attention_forward(out.ptr(), state.ptr(), qkv.ptr(), s.B, s.T, C, s.NH, s.NKV);
      cpu::attention_forward(out32.ptr(), state32.ptr(), qkv32.ptr(), s.B, s.T, C, s.NH, s.NKV);
      Dev dqkv(qkv), dout(Vec(out.size(), NAN), p), dstate(Vec(state_elements(t, s), NAN), state_format(t, p));
      k::attention_forward(dout.ptr(), dstate.ptr(), dqkv.ptr(), s.B, s.T, C, s.NH, s.NKV);
      expect_close(to_max(), dout.values(), out.values(), out32.values(), p, 1e-5,
                   std::string(name(p)) + " B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " hs " +
                       std::to_string(s.hs) + " NKV " + std::to_string(s.NKV),
                   kAttentionUlps, kAttentionUlps);
    }
}

// The device's own forward state; the gradient accumulates into a nonzero dqkv.
OP_CASE(attention_backward) {
  for (const Precision p : kFormats)
    for (const AttentionShape& s : kAttentionShapes) {
      const int C = s.C();
      const std::size_t probs = std::size_t(k::attention_state_elements(false, s.B, s.NH, s.T));
      const Host qkv(uniform(t.rng, std::size_t(s.B) * s.T * s.W(), -2, 2), p),
          dy(uniform(t.rng, std::size_t(s.B) * s.T * C), p);
      const Host qkv32(qkv.values(), Precision::fp32), dy32(dy.values(), Precision::fp32);
      Host out(Vec(dy.size()), p), state(Vec(probs), p), scratch(Vec(probs), p);
      Host out32(Vec(dy.size()), Precision::fp32), state32(Vec(probs), Precision::fp32),
          scratch32(Vec(probs), Precision::fp32);
      Host dqkv(uniform(t.rng, qkv.size()), p), dqkv32(dqkv.values(), Precision::fp32);
      cpu::attention_forward(out.ptr(), state.ptr(), qkv.ptr(), s.B, s.T, C, s.NH, s.NKV);
      cpu::attention_forward(out32.ptr(), state32.ptr(), qkv32.ptr(), s.B, s.T, C, s.NH, s.NKV);
      const Precision sp = state_format(t, p);
      Dev d_qkv(qkv), d_out(out), d_state(Vec(state_elements(t, s), NAN), sp),
          d_scratch(Vec(scratch_elements(t, s, p), NAN), sp), d_dy(dy), d_g(dqkv);
      k::attention_forward(d_out.ptr(), d_state.ptr(), d_qkv.ptr(), s.B, s.T, C, s.NH, s.NKV);
      k::attention_backward(d_g.ptr(), d_scratch.ptr(), d_dy.ptr(), d_qkv.ptr(), d_out.ptr(), d_state.ptr(), s.B, s.T,
                            C, s.NH, s.NKV);
      cpu::attention_backward(dqkv.ptr(), scratch.ptr(), dy.ptr(), qkv.ptr(), out.ptr(), state.ptr(), s.B, s.T, C,
                              s.NH, s.NKV);
      cpu::attention_backward(dqkv32.ptr(), scratch32.ptr(), dy32.ptr(), qkv32.ptr(), out32.ptr(), state32.ptr(), s.B,
                              s.T, C, s.NH, s.NKV);
      expect_close(to_max(), d_g.values(), dqkv.values(), dqkv32.values(), p, 1e-5,
                   std::string(name(p)) + " B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " hs " +
                       std::to_string(s.hs) + " NKV " + std::to_string(s.NKV),
                   kAttentionBackwardUlps, kAttentionBackwardUlps);
    }
}

// The materialised scores' causal softmax, forward and backward: 3
// matrices of T x T for T on and off the warp and team sizes and past the
// CUDA backend's block of 256 threads a row, scores up to
// +-8 (as scaled products reach); the CPU's fp32 result against a
// double-precision reference (within 1e-6: probabilities up to 1, a few
// ulps of the vectorised exponential and of the row's sum), then the
// device's against the CPU's.
double softmax_reference(const Vec& x, std::size_t at, int t, int j) {
  double m = x[at];
  for (int i = 1; i <= t; ++i) m = std::max(m, double(x[at + i]));
  double sum = 0;
  for (int i = 0; i <= t; ++i) sum += std::exp(double(x[at + i]) - m);
  return j <= t ? std::exp(double(x[at + j]) - m) / sum : 0.0;
}

OP_CASE(causal_softmax_forward) {
  for (const Precision p : kFormats)
    for (const int T : {1, 7, 70, 300}) {
      const std::int64_t count = 3, n = count * T * T;
      Host x(uniform(t.rng, std::size_t(n), -8, 8), p), x32(x.values(), Precision::fp32);
      const Vec in = x.values();
      Dev dx(x);
      k::causal_softmax_forward(dx.ptr(), count, T);
      cpu::causal_softmax_forward(x.ptr(), count, T);
      cpu::causal_softmax_forward(x32.ptr(), count, T);
      const std::string at = std::string(name(p)) + " T " + std::to_string(T);
      if (p == Precision::fp32) {
        const Vec got = x32.values();
        for (std::int64_t r = 0; r < count * T; ++r)
          for (int j = 0; j < T; ++j)
            ASSERT_NEAR(got[std::size_t(r * T + j)], softmax_reference(in, std::size_t(r * T), int(r % T), j), 1e-6)
                << at << " row " << r << " key " << j << ", cpu against double";
      }
      expect_close(to_max(), dx.values(), x.values(), x32.values(), p, 1e-6, at);
    }
}

OP_CASE(causal_softmax_backward) {
  for (const Precision p : kFormats)
    for (const int T : {1, 7, 70, 300}) {
      const std::int64_t count = 3, n = count * T * T;
      Host probs(uniform(t.rng, std::size_t(n), -8, 8), p);
      cpu::causal_softmax_forward(probs.ptr(), count, T);  // real probabilities: rows summing to 1
      const Host probs32(probs.values(), Precision::fp32);
      Host d(uniform(t.rng, std::size_t(n)), p), d32(d.values(), Precision::fp32);
      const Vec pv = probs.values(), dv = d.values();
      Dev ddev(d), pdev(probs);
      k::causal_softmax_backward(ddev.ptr(), pdev.ptr(), count, T);
      cpu::causal_softmax_backward(d.ptr(), probs.ptr(), count, T);
      cpu::causal_softmax_backward(d32.ptr(), probs32.ptr(), count, T);
      const std::string at = std::string(name(p)) + " T " + std::to_string(T);
      if (p == Precision::fp32) {
        const Vec got = d32.values();
        for (std::int64_t r = 0; r < count * T; ++r) {
          const std::size_t a = std::size_t(r * T);
          const int tt = int(r % T);
          double dot = 0;
          for (int j = 0; j <= tt; ++j) dot += double(dv[a + j]) * pv[a + j];
          for (int j = 0; j < T; ++j) {
            const double want = j <= tt ? double(pv[a + j]) * (dv[a + j] - dot) : 0.0;
            ASSERT_NEAR(got[a + j], want, 1e-6) << at << " row " << r << " key " << j << ", cpu against double";
          }
        }
      }
      expect_close(to_max(), ddev.values(), d.values(), d32.values(), p, 1e-5, at);
    }
}

// model.attention = "unfused" (kernels/unfused_attention.hpp), composed of
// the backend's batched products and causal softmax: on every backend and
// format, forward and backward, against the CPU backend's own attention
// operation, which computes the same from the same state (the
// probabilities). At 16 bits the two round different intermediates (the
// composition rounds the scores before its softmax reads them, the CPU's
// operation keeps them in fp32), so the bound is attention's own.
void unfused_attention_case(Ctx& t) {
  for (const Precision p : kFormats)
    for (const AttentionShape& s : kAttentionShapes) {
      const int C = s.C();
      const std::size_t probs = std::size_t(k::attention_state_elements(false, s.B, s.NH, s.T));
      const Host qkv(uniform(t.rng, std::size_t(s.B) * s.T * s.W(), -2, 2), p),
          dy(uniform(t.rng, std::size_t(s.B) * s.T * C), p), g0(uniform(t.rng, qkv.size()), p);
      Host out(Vec(dy.size()), p), state(Vec(probs), p), scratch(Vec(probs), p), g(g0.values(), p);
      cpu::attention_forward(out.ptr(), state.ptr(), qkv.ptr(), s.B, s.T, C, s.NH, s.NKV);
      cpu::attention_backward(g.ptr(), scratch.ptr(), dy.ptr(), qkv.ptr(), out.ptr(), state.ptr(), s.B, s.T, C, s.NH,
                              s.NKV);
      Dev d_qkv(qkv), d_out(Vec(out.size(), NAN), p), d_state(Vec(probs, NAN), p), d_scratch(Vec(probs, NAN), p),
          d_dy(dy), d_g(g0);
      k::unfused_attention_forward(d_out.ptr(), d_state.ptr(), d_qkv.ptr(), s.B, s.T, C, s.NH, s.NKV);
      k::unfused_attention_backward(d_g.ptr(), d_scratch.ptr(), d_dy.ptr(), d_qkv.ptr(), d_state.ptr(), s.B, s.T, C,
                                    s.NH, s.NKV);
      const std::string at = std::string(name(p)) + " B " + std::to_string(s.B) + " T " + std::to_string(s.T) +
                             " hs " + std::to_string(s.hs) + " NKV " + std::to_string(s.NKV);
      EXPECT_LE(rel_to_max(d_out.values(), out.values()), bound(p, 1e-5, kAttentionUlps)) << at << " out";
      EXPECT_LE(rel_to_max(d_state.values(), state.values()), bound(p, 1e-5, kAttentionUlps)) << at << " probs";
      EXPECT_LE(rel_to_max(d_g.values(), g.values()), bound(p, 1e-5, kAttentionBackwardUlps)) << at << " dqkv";
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

// q, kv and dout of a ring in format p, and its out and lse after every key
// block (the CPU's, in p: out rounded once per merge).
struct RingInputs {
  Host qkv, kv, dy, out;
  Vec lse;
  RingInputs(std::mt19937& g, const Ring& r, Precision p)
      : qkv(uniform(g, std::size_t(r.B) * r.T() * r.W(), -2, 2), p),
        kv(Vec(std::size_t(r.B) * r.T() * 2 * r.KVC()), p),
        dy(uniform(g, std::size_t(r.B) * r.T() * r.C()), p),
        out(Vec(std::size_t(r.B) * r.T() * r.C()), p),
        lse(std::size_t(r.B) * r.NH * r.T(), 0.0f) {
    const int T = r.T();
    cpu::copy_rows(kv.ptr(), 2 * r.KVC(), qkv.ptr(r.C()), r.W(), std::int64_t(r.B) * T, 2 * r.KVC(), false);
    for (int kb : {1, 0, 2}) forward(r, kb, out.ptr(), lse.data(), qkv.ptr(), kv.ptr(), true);
  }
  // Key block kb into the middle query block.
  template <class F>
  static void each(const Ring& r, int kb, F&& f) {
    const std::size_t q_at = std::size_t(r.Tq);
    f(q_at * r.C(), q_at, q_at * r.W(), std::size_t(kb) * r.Tq * 2 * r.KVC(), kb != 1);
  }
  static void forward(const Ring& r, int kb, core::Ptr out, float* lse, core::CPtr qkv, core::CPtr kv, bool cpu_side) {
    each(r, kb, [&](std::size_t o, std::size_t l, std::size_t q, std::size_t kvo, bool acc) {
      const int C = r.C(), T = r.T();
      const auto run = cpu_side ? cpu::attention_block_forward : k::attention_block_forward;
      run(out + std::int64_t(o), lse + l, qkv + std::int64_t(q), kv + std::int64_t(kvo), r.B, r.Tq, r.Tq, C, r.NH,
          r.NKV, T, T, r.Tq, kb * r.Tq, acc);
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

// The blocks' out is rounded at each merge (three here): their bound is
// attention's plus those roundings.
OP_CASE(attention_block_forward) {
  for (const Precision p : kFormats) {
    for (const Ring& r : kRings) {
      const RingInputs in(t.rng, r, p);
      // The fp32 reference on the same rounded values.
      Host qkv32(in.qkv.values(), Precision::fp32), kv32(in.kv.values(), Precision::fp32),
          out32(Vec(in.out.size()), Precision::fp32);
      Vec lse32(in.lse.size(), 0.0f);
      for (int kb : {1, 0, 2}) RingInputs::forward(r, kb, out32.ptr(), lse32.data(), qkv32.ptr(), kv32.ptr(), true);
      Dev d_qkv(in.qkv), d_kv(in.kv), d_out(Vec(in.out.size(), NAN), p), d_lse(Vec(in.lse.size(), NAN));
      for (int kb : {1, 0, 2}) RingInputs::forward(r, kb, d_out.ptr(), d_lse.f32(), d_qkv.ptr(), d_kv.ptr(), false);
      const std::string at = std::string(name(p)) + " hs " + std::to_string(r.hs) + " NKV " + std::to_string(r.NKV);
      expect_close(to_max(), ring_rows(r, d_out.values(), r.C()), ring_rows(r, in.out.values(), r.C()),
                   ring_rows(r, out32.values(), r.C()), p, 1e-5, at, kAttentionUlps + 2, kAttentionUlps + 2);
      EXPECT_LE(rel_to_max(ring_lse_rows(r, d_lse.values()), ring_lse_rows(r, in.lse)), 1e-5) << at;
      EXPECT_LE(rel_to_max(ring_lse_rows(r, in.lse), ring_lse_rows(r, lse32)), bound(p, 1e-5, 0.5))
          << at << " lse, cpu against fp32";
    }
    // A block no query row may attend: out 0 and lse -inf.
    const Ring r{.hs = 16};
    const RingInputs in(t.rng, r, p);
    const int C = r.C(), T = r.T();
    Dev d_qkv(in.qkv), d_kv(in.kv), d_out(Vec(in.out.size(), NAN), p), d_lse(Vec(in.lse.size(), NAN));
    k::attention_block_forward(d_out.ptr(), d_lse.f32(), d_qkv.ptr(), d_kv.ptr(std::int64_t(2) * r.Tq * 2 * r.KVC()),
                               r.B, r.Tq, r.Tq, C, r.NH, r.NKV, T, T, 0, 2 * r.Tq, false);
    const Vec out = d_out.values(), lse = d_lse.values();
    EXPECT_EQ(*std::max_element(out.begin(), out.begin() + std::ptrdiff_t(r.Tq) * C), 0.0f) << name(p);
    EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity()) << name(p);
  }
}

// dq and dkv in the inputs' format, or fp32 accumulators (the ring's dkv).
OP_CASE(attention_block_backward) {
  for (const Precision p : kFormats)
    for (const Precision pd : {p, Precision::fp32}) {
      if (pd != p && p == Precision::fp16) continue;  // the fp32 accumulators: one 16-bit format is enough
      for (const Ring& r : kRings) {
        const RingInputs in(t.rng, r, p);
        const int C = r.C(), T = r.T();
        Host dq(uniform(t.rng, in.qkv.size()), pd), dkv(uniform(t.rng, in.kv.size()), pd);
        Host qkv32(in.qkv.values(), Precision::fp32), kv32(in.kv.values(), Precision::fp32),
            dy32(in.dy.values(), Precision::fp32), out32(in.out.values(), Precision::fp32);
        Host dq32(dq.values(), Precision::fp32), dkv32(dkv.values(), Precision::fp32);
        Dev d_qkv(in.qkv), d_kv(in.kv), d_dy(in.dy), d_out(in.out), d_lse(in.lse), d_dq(dq), d_dkv(dkv);
        for (int kb : {0, 1, 2}) {
          RingInputs::each(r, kb, [&](std::size_t o, std::size_t l, std::size_t q, std::size_t kvo, bool) {
            const auto at = [](auto x) { return std::int64_t(x); };
            cpu::attention_block_backward(dq.ptr(at(q)), dkv.ptr(at(kvo)), in.dy.ptr(at(o)), in.qkv.ptr(at(q)),
                                          in.kv.ptr(at(kvo)), in.out.ptr(at(o)), in.lse.data() + l, r.B, r.Tq, r.Tq, C,
                                          r.NH, r.NKV, T, T, r.Tq, kb * r.Tq);
            cpu::attention_block_backward(dq32.ptr(at(q)), dkv32.ptr(at(kvo)), dy32.ptr(at(o)), qkv32.ptr(at(q)),
                                          kv32.ptr(at(kvo)), out32.ptr(at(o)), in.lse.data() + l, r.B, r.Tq, r.Tq, C,
                                          r.NH, r.NKV, T, T, r.Tq, kb * r.Tq);
            k::attention_block_backward(d_dq.ptr(at(q)), d_dkv.ptr(at(kvo)), d_dy.ptr(at(o)), d_qkv.ptr(at(q)),
                                        d_kv.ptr(at(kvo)), d_out.ptr(at(o)), d_lse.f32() + l, r.B, r.Tq, r.Tq, C, r.NH,
                                        r.NKV, T, T, r.Tq, kb * r.Tq);
          });
        }
        const std::string at = std::string(name(p)) + " into " + name(pd) + ", hs " + std::to_string(r.hs) + " NKV " +
                               std::to_string(r.NKV);
        // The gradients' format rounds each block's sum.
        const double ulps = kAttentionBackwardUlps + (pd == p ? 2 : 0);
        expect_close(to_max(), d_dq.values(), dq.values(), pd == p ? dq32.values() : dq.values(), p, 1e-5, at + " dq",
                     ulps, ulps);
        expect_close(to_max(), d_dkv.values(), dkv.values(), pd == p ? dkv32.values() : dkv.values(), p, 1e-5,
                     at + " dk, dv", ulps, ulps);
        if (pd != p) {  // fp32 accumulators: P and dS rounded to the format, then summed in fp32
          EXPECT_LE(rel_to_max(dq.values(), dq32.values()), bound(p, 1e-5, ulps)) << at << " dq against fp32";
          EXPECT_LE(rel_to_max(dkv.values(), dkv32.values()), bound(p, 1e-5, ulps)) << at << " dkv against fp32";
        }
      }
    }
}

// Both ways: qkv's k and v columns into a packed kv, and added back; in
// every pair of formats (the ring's fp32 key-value gradients go into a
// 16-bit dqkv).
OP_CASE(copy_rows) {
  const int rows = 97, C = 48;
  for (const Precision ps : kFormats)
    for (const Precision pd : kFormats) {
      const Host qkv(uniform(t.rng, std::size_t(rows) * 3 * C), ps);
      Host kv(uniform(t.rng, std::size_t(rows) * 2 * C), pd), back(uniform(t.rng, std::size_t(rows) * 3 * C), pd);
      Dev d_qkv(qkv), d_kv(kv), d_back(back);
      k::copy_rows(d_kv.ptr(), 2 * C, d_qkv.ptr(C), 3 * C, rows, 2 * C, false);
      cpu::copy_rows(kv.ptr(), 2 * C, qkv.ptr(C), 3 * C, rows, 2 * C, false);
      const std::string at = std::string(name(ps)) + " into " + name(pd);
      EXPECT_EQ(d_kv.values(), kv.values()) << at;
      Vec want_kv;
      const Vec q = qkv.values();
      for (int r = 0; r < rows; ++r) want_kv.insert(want_kv.end(), q.begin() + r * 3 * C + C, q.begin() + (r + 1) * 3 * C);
      EXPECT_EQ(kv.values(), in_format(want_kv, pd)) << at;
      // Added back, from the source's format into the destination's.
      const Host src_kv(kv.values(), ps);
      Dev d_src_kv(src_kv);
      Vec want = back.values();
      const Vec add = src_kv.values();
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 2 * C; ++c) want[std::size_t(r) * 3 * C + C + c] += add[std::size_t(r) * 2 * C + c];
      k::copy_rows(d_back.ptr(C), 3 * C, d_src_kv.ptr(), 2 * C, rows, 2 * C, true);
      cpu::copy_rows(back.ptr(C), 3 * C, src_kv.ptr(), 2 * C, rows, 2 * C, true);
      EXPECT_EQ(d_back.values(), back.values()) << at << ", added";
      EXPECT_EQ(back.values(), in_format(want, pd)) << at << ", added";
    }
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
  for (const Precision p : kFormats)
    for (const auto& [v_begin, v_count] : kShards)
      for (bool with_wpe : {true, false}) {
        const int rows = v_count < 0 ? S::V : v_count;
        const Host wte(uniform(t.rng, std::size_t(rows) * S::C), p), wpe(uniform(t.rng, std::size_t(S::T) * S::C), p);
        const Host wte32(wte.values(), Precision::fp32), wpe32(wpe.values(), Precision::fp32);
        Host out(Vec(std::size_t(S::B) * S::T * S::C), p), out32(Vec(out.size()), Precision::fp32);
        On<std::int32_t> dt(tok);
        Dev dwte(wte), dwpe(wpe), dout(Vec(out.size(), NAN), p);
        k::embedding_forward(dout.ptr(), dt.get(), dwte.ptr(), with_wpe ? dwpe.ptr() : nullptr, S::B, S::T, S::C,
                             v_begin, v_count);
        cpu::embedding_forward(out.ptr(), tok.data(), wte.ptr(), with_wpe ? wpe.ptr() : nullptr, S::B, S::T, S::C,
                               v_begin, v_count);
        cpu::embedding_forward(out32.ptr(), tok.data(), wte32.ptr(), with_wpe ? wpe32.ptr() : nullptr, S::B, S::T,
                               S::C, v_begin, v_count);
        const std::string at = std::string(name(p)) + " v_begin " + std::to_string(v_begin) + " wpe " +
                               std::to_string(with_wpe);
        EXPECT_EQ(dout.values(), out.values()) << at;
        EXPECT_EQ(out.values(), in_format(out32.values(), p)) << at;
      }
}

// Gradients fp32 from a dout of any format.
OP_CASE(embedding_backward) {
  using S = EmbeddingShape;
  const Tokens tok = tokens(t.rng, std::size_t(S::B) * S::T, S::V);
  for (const Precision p : kFormats)
    for (const auto& [v_begin, v_count] : kShards)
      for (bool with_wpe : {true, false}) {
        const int rows = v_count < 0 ? S::V : v_count;
        const Host dout(uniform(t.rng, std::size_t(S::B) * S::T * S::C), p), dout32(dout.values(), Precision::fp32);
        const Vec dwte0 = uniform(t.rng, std::size_t(rows) * S::C), dwpe0 = uniform(t.rng, std::size_t(S::T) * S::C);
        Vec dwte = dwte0, dwpe = dwpe0, dwte32 = dwte0, dwpe32 = dwpe0;
        On<std::int32_t> dt(tok);
        Dev dd(dout), ddwte(dwte0), ddwpe(dwpe0);
        k::embedding_backward(ddwte.f32(), with_wpe ? ddwpe.f32() : nullptr, dd.ptr(), dt.get(), S::B, S::T, S::C,
                              v_begin, v_count);
        cpu::embedding_backward(dwte.data(), with_wpe ? dwpe.data() : nullptr, dout.ptr(), tok.data(), S::B, S::T,
                                S::C, v_begin, v_count);
        cpu::embedding_backward(dwte32.data(), with_wpe ? dwpe32.data() : nullptr, dout32.ptr(), tok.data(), S::B,
                                S::T, S::C, v_begin, v_count);
        const std::string at = std::string(name(p)) + " v_begin " + std::to_string(v_begin) + " wpe " +
                               std::to_string(with_wpe);
        EXPECT_LE(max_rel(ddwte.values(), dwte), 1e-5) << at;
        EXPECT_LE(max_rel(ddwpe.values(), dwpe), 1e-5) << at;
        EXPECT_EQ(dwte, dwte32) << at << ", against fp32 on the same values";
        EXPECT_EQ(dwpe, dwpe32) << at << ", against fp32 on the same values";
      }
}

// The position rows of a sequence-parallel rank's rows (starting mid-sequence
// and wrapping into the next sample), added to what the rows hold.
OP_CASE(add_position_rows) {
  const int T = 13, C = 24, rows = 30, r0 = 7;
  for (const Precision p : kFormats) {
    const Host wpe(uniform(t.rng, std::size_t(T) * C), p);
    Host out(uniform(t.rng, std::size_t(rows) * C), p);
    Vec want = out.values();
    const Vec w = wpe.values();
    for (int i = 0; i < rows; ++i)
      for (int c = 0; c < C; ++c) want[std::size_t(i) * C + c] += w[std::size_t((r0 + i) % T) * C + c];
    Dev d(out), dwpe(wpe);
    k::add_position_rows(d.ptr(), dwpe.ptr(), rows, C, T, r0);
    cpu::add_position_rows(out.ptr(), wpe.ptr(), rows, C, T, r0);
    EXPECT_EQ(d.values(), out.values()) << name(p);
    EXPECT_EQ(out.values(), in_format(want, p)) << name(p);
  }
}

// Rows of a GPT-2-sized vocabulary and a tiny one.
constexpr std::pair<int, int> kVocabularies[] = {{4, 7}, {33, 50257}};

// The losses (fp32) from logits of any format: fp32's bound against the
// same losses from the widened logits.
OP_CASE(softmax_cross_entropy_forward) {
  for (const Precision p : kFormats)
    for (const auto& [N, V] : kVocabularies) {
      const Host logits(uniform(t.rng, std::size_t(N) * V, -8, 8), p), logits32(logits.values(), Precision::fp32);
      const Tokens targets = tokens(t.rng, std::size_t(N), V);
      Vec losses(N), losses32(N);
      On<std::int32_t> dt(targets);
      Dev dl(logits), dloss(losses);
      k::softmax_cross_entropy_forward(dloss.f32(), dl.ptr(), dt.get(), N, V);
      cpu::softmax_cross_entropy_forward(losses.data(), logits.ptr(), targets.data(), N, V);
      cpu::softmax_cross_entropy_forward(losses32.data(), logits32.ptr(), targets.data(), N, V);
      // Relative to the largest loss: a row whose target is its peak has a loss
      // near 0, log(sum) with the sum near 1, where the sum's last ulp (its
      // terms added in another order) is all of the difference.
      const std::string at = std::string(name(p)) + " " + std::to_string(N) + " x " + std::to_string(V);
      EXPECT_LE(rel_to_max(dloss.values(), losses), 1e-5) << at;
      EXPECT_LE(rel_to_max(losses, losses32), 1e-5) << at << ", against fp32 on the same values";
    }
}

// In place over the logits, as the model calls it.
OP_CASE(softmax_cross_entropy_backward) {
  for (const Precision p : kFormats)
    for (const auto& [N, V] : kVocabularies) {
      Host grad(uniform(t.rng, std::size_t(N) * V, -8, 8), p), grad32(grad.values(), Precision::fp32);
      const Tokens targets = tokens(t.rng, std::size_t(N), V);
      On<std::int32_t> dt(targets);
      Dev dl(grad);
      k::softmax_cross_entropy_backward(dl.ptr(), dl.ptr(), dt.get(), 1.0f / N, N, V);
      cpu::softmax_cross_entropy_backward(grad.ptr(), grad.ptr(), targets.data(), 1.0f / N, N, V);
      cpu::softmax_cross_entropy_backward(grad32.ptr(), grad32.ptr(), targets.data(), 1.0f / N, N, V);
      // Probabilities as small as e^-16 / V: relative to the row's scale, 1 / (N V),
      // or in fp16 to its smallest normal value (below it an element keeps
      // an absolute precision of 2^-25, not a relative one).
      const double floor = std::max(1e-3 / (double(N) * V), p == Precision::fp16 ? 0x1p-14 : 0.0);
      expect_close([&](const Vec& a, const Vec& b) { return max_rel_gradient(a, b, floor, 1.0f / N); }, dl.values(),
                   grad.values(), grad32.values(), p, 1e-5,
                   std::string(name(p)) + " " + std::to_string(N) + " x " + std::to_string(V));
    }
}

// The vocabulary-parallel pieces on each of three ranks' shards of a larger
// vocabulary: row statistics that other ranks have already raised (a larger
// max, a larger sum), targets on the shard's first and last columns and just
// outside it, the rest anywhere in the vocabulary. The logits in format p,
// the statistics fp32 from the widened logits.
struct Shard {
  int N, V_full, v_begin, V;
  Vec logits, m, s;
  Tokens targets;
  std::string at;
};
template <class F>
void for_each_shard(std::mt19937& g, Precision p, F&& f) {
  for (const auto& [N, V_full] : {std::pair{5, 7}, std::pair{33, 50257}})
    for (int rank = 0; rank < 3; ++rank) {
      Shard sh;
      const int v_begin = rank * V_full / 3, v_end = (rank + 1) * V_full / 3;
      sh.N = N, sh.V_full = V_full, sh.v_begin = v_begin, sh.V = v_end - v_begin;
      sh.at = std::string(name(p)) + " " + std::to_string(N) + " x " + std::to_string(sh.V) + " from " +
              std::to_string(v_begin);
      sh.logits = in_format(uniform(g, std::size_t(N) * sh.V, -8, 8), p);
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
  for (const Precision p : kFormats)
    for_each_shard(t.rng, p, [&](const Shard& sh) {
      const Host logits(sh.logits, p);
      Vec m(sh.N), m32(sh.N);
      cpu::row_max(m.data(), logits.ptr(), sh.N, sh.V);
      cpu::row_max(m32.data(), sh.logits.data(), sh.N, sh.V);
      Dev dl(logits), dm(Vec(sh.N, NAN));
      k::row_max(dm.f32(), dl.ptr(), sh.N, sh.V);
      EXPECT_EQ(dm.values(), m) << sh.at;  // a maximum is exact
      EXPECT_EQ(m, m32) << sh.at;
    });
}

OP_CASE(row_exp_sum) {
  for (const Precision p : kFormats)
    for_each_shard(t.rng, p, [&](const Shard& sh) {
      const Host logits(sh.logits, p);
      Vec s(sh.N), s32(sh.N);
      cpu::row_exp_sum(s.data(), logits.ptr(), sh.m.data(), sh.N, sh.V);
      cpu::row_exp_sum(s32.data(), sh.logits.data(), sh.m.data(), sh.N, sh.V);
      Dev dl(logits), dm(sh.m), ds(Vec(sh.N, NAN));
      k::row_exp_sum(ds.f32(), dl.ptr(), dm.f32(), sh.N, sh.V);
      EXPECT_LE(max_rel(ds.values(), s), 1e-5) << sh.at;
      EXPECT_LE(max_rel(s, s32), 1e-5) << sh.at;
    });
}

OP_CASE(pick_target_logits) {
  for (const Precision p : kFormats)
    for_each_shard(t.rng, p, [&](const Shard& sh) {
      const Host logits(sh.logits, p);
      Vec x(sh.N), x32(sh.N);
      cpu::pick_target_logits(x.data(), logits.ptr(), sh.targets.data(), sh.v_begin, sh.N, sh.V);
      cpu::pick_target_logits(x32.data(), sh.logits.data(), sh.targets.data(), sh.v_begin, sh.N, sh.V);
      On<std::int32_t> dt(sh.targets);
      Dev dl(logits), dx(Vec(sh.N, NAN));
      k::pick_target_logits(dx.f32(), dl.ptr(), dt.get(), sh.v_begin, sh.N, sh.V);
      EXPECT_EQ(dx.values(), x) << sh.at;
      EXPECT_EQ(x, x32) << sh.at;
    });
}

OP_CASE(cross_entropy_from_parts) {
  for_each_shard(t.rng, Precision::fp32, [&](const Shard& sh) {
    Vec x(sh.N), losses(sh.N);
    cpu::pick_target_logits(x.data(), sh.logits.data(), sh.targets.data(), sh.v_begin, sh.N, sh.V);
    cpu::cross_entropy_from_parts(losses.data(), sh.m.data(), sh.s.data(), x.data(), sh.N);
    Dev dm(sh.m), ds(sh.s), dx(x), dlosses(Vec(sh.N, NAN));
    k::cross_entropy_from_parts(dlosses.f32(), dm.f32(), ds.f32(), dx.f32(), sh.N);
    EXPECT_LE(max_rel(dlosses.values(), losses), 1e-5) << sh.at;
  });
}

// In place over the logits.
OP_CASE(softmax_cross_entropy_backward_sharded) {
  for (const Precision p : kFormats)
    for_each_shard(t.rng, p, [&](const Shard& sh) {
      Host grad(sh.logits, p), grad32(sh.logits, Precision::fp32);
      cpu::softmax_cross_entropy_backward_sharded(grad.ptr(), grad.ptr(), sh.m.data(), sh.s.data(), sh.targets.data(),
                                                  sh.v_begin, 1.0f / sh.N, sh.N, sh.V);
      cpu::softmax_cross_entropy_backward_sharded(grad32.ptr(), grad32.ptr(), sh.m.data(), sh.s.data(),
                                                  sh.targets.data(), sh.v_begin, 1.0f / sh.N, sh.N, sh.V);
      On<std::int32_t> dt(sh.targets);
      Dev dl(Host(sh.logits, p)), dm(sh.m), ds(sh.s);
      k::softmax_cross_entropy_backward_sharded(dl.ptr(), dl.ptr(), dm.f32(), ds.f32(), dt.get(), sh.v_begin,
                                                1.0f / sh.N, sh.N, sh.V);
      const double floor = std::max(1e-3 / (double(sh.N) * sh.V_full), p == Precision::fp16 ? 0x1p-14 : 0.0);
      expect_close([&](const Vec& a, const Vec& b) { return max_rel_gradient(a, b, floor, 1.0f / sh.N); }, dl.values(),
                   grad.values(), grad32.values(), p, 1e-5, sh.at);
    });
}

// Several tensors at once, each divided by its divisor (a replicated
// parameter's share under tensor parallelism), fp32 and 16-bit: a gradient
// norm's local part.
OP_CASE(sum_squares_tensors) {
  const std::int64_t ns[] = {7, 0, 1 << 16, 1000};
  const double divisors[] = {1.0, 1.0, 4.0, 2.0};
  for (const Precision p : kFormats) {
    std::vector<Host> host;
    std::vector<std::unique_ptr<Dev>> dev;
    std::vector<const void*> h, d;
    double exact = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      host.emplace_back(uniform(t.rng, std::size_t(ns[i]), -3, 3), p);
      double sq = 0;
      for (const float v : host.back().values()) sq += double(v) * v;
      exact += sq / divisors[i];
    }
    for (std::size_t i = 0; i < host.size(); ++i) {
      dev.push_back(std::make_unique<Dev>(host[i]));
      h.push_back(host[i].data()), d.push_back(dev.back()->ptr().get());
    }
    const double want = cpu::sum_squares_tensors(h.data(), ns, divisors, 4, p);
    EXPECT_NEAR(k::sum_squares_tensors(d.data(), ns, divisors, 4, p), want, 1e-9 * want) << name(p);
    EXPECT_NEAR(want, exact, 2e-10 * exact) << name(p) << ", cpu against double";
  }
}

OP_CASE(adamw_update) {
  const std::int64_t n = 100003;
  Vec p = uniform(t.rng, n), m(n, 0.0f), v(n, 0.0f);
  Dev dp(p), dm(m), dv(v);
  for (int step = 1; step <= 3; ++step) {
    const Vec g = uniform(t.rng, n, -10, 10);
    Dev dg(g);
    k::adamw_update(dp.f32(), dg.f32(), dm.f32(), dv.f32(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    EXPECT_LE(max_rel(dp.values(), p), 1e-5) << "step " << step;
    EXPECT_LE(max_rel(dm.values(), m), 1e-5) << "step " << step;
    EXPECT_LE(max_rel(dv.values(), v), 1e-5) << "step " << step;
  }
}

Bits narrowed(const Vec& x, Precision p) {
  Bits h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = core::float_to_half(x[i], p);
  return h;
}

// ZeRO's mixed step: fp32 master weights and moments, 16-bit gradients
// unscaled by one factor, the 16-bit parameters rewritten. Bit-identical on
// every buffer: every backend runs the same AdamWStep on the same inputs.
OP_CASE(adamw_update_mixed) {
  const std::int64_t n = 100003;
  for (const Precision p : kHalves) {
    const std::string fmt = core::precision_name(p);
    Vec master = uniform(t.rng, n), m(n, 0.0f), v(n, 0.0f);
    Bits param = narrowed(master, p);
    Dev dmaster(master), dm(m), dv(v);
    On<std::uint16_t> dparam(param);
    for (int step = 1; step <= 3; ++step) {
      const Bits grad = narrowed(uniform(t.rng, n, -40, 40), p);  // scaled by 4, unscaled below
      On<std::uint16_t> dg(grad);
      k::adamw_update_mixed(dmaster.f32(), dparam.get(), dg.get(), 0.25f, dm.f32(), dv.f32(), n, 1e-2f, 0.9f, 0.95f,
                            1e-8f, 0.1f, step, p);
      cpu::adamw_update_mixed(master.data(), param.data(), grad.data(), 0.25f, m.data(), v.data(), n, 1e-2f, 0.9f,
                              0.95f, 1e-8f, 0.1f, step, p);
      EXPECT_EQ(first_difference(dmaster.values(), master), -1) << fmt << " master, step " << step;
      EXPECT_EQ(first_difference(dparam.host(), param), -1) << fmt << " param, step " << step;
      EXPECT_EQ(first_difference(dm.values(), m), -1) << fmt << " m, step " << step;
      EXPECT_EQ(first_difference(dv.values(), v), -1) << fmt << " v, step " << step;
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

// The backends this build has: the CPU (its 16-bit kernels against its fp32
// ones) and the device backends (against the CPU).
std::vector<k::Device> backends() {
  std::vector<k::Device> out{k::Device::cpu};
  if (k::cuda_built()) out.push_back(k::Device::cuda);
  if (k::kokkos_built()) out.push_back(k::Device::kokkos);
  return out;
}

// A case's run on backend d, the parameter P's: skipped without the device,
// else the device selected and a fresh seed recorded.
template <class P>
class OnBackend : public ::testing::TestWithParam<P> {
 protected:
  void start(k::Device d) {
    if (k::device_count(d) == 0)
      GTEST_SKIP() << "needs a " << k::device_name(d) << " device (" << k::describe_devices(d)
                   << "); the backend is compiled and linked, and runs against the CPU backend where it has one";
    ctx_.device = d;
    seed_ = test_seed();
    this->RecordProperty("seed", std::to_string(seed_));
    ctx_.rng.seed(seed_);
    k::use_device(d);
  }
  void TearDown() override { k::use_device(k::Device::cpu); }
  Ctx ctx_;
  unsigned seed_ = 0;
};

class BackendOps : public OnBackend<std::tuple<std::string, k::Device>> {
 protected:
  void SetUp() override { start(std::get<1>(GetParam())); }
};

// What the models compose from the operations, on every backend.
class Compositions : public OnBackend<k::Device> {
 protected:
  void SetUp() override { start(GetParam()); }
};

TEST_P(Compositions, UnfusedAttentionIsTheCpusAttention) {
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (rerun with STRATA_TEST_SEED)");
  unfused_attention_case(ctx_);
}

INSTANTIATE_TEST_SUITE_P(Every, Compositions, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return std::string(k::device_name(info.param)); });

TEST_P(BackendOps, MatchesTheReference) {
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

// The cases are the operations: none missing, none left over from a removed one.
TEST(BackendOpsList, EveryOperationHasACase) {
  const std::vector<std::string> ops = operations();
  EXPECT_GE(ops.size(), 30u);  // the list was read
  for (const std::string& op : ops) EXPECT_TRUE(cases().count(op)) << op << " (kernels/ops.inc) has no case";
  for (const auto& [name, c] : cases())
    EXPECT_NE(std::find(ops.begin(), ops.end(), name), ops.end()) << name << " is not an operation of kernels/ops.inc";
}

}  // namespace
