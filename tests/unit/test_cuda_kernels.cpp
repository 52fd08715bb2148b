// The CUDA kernels against the CPU backend on the same fresh random inputs:
// fp32 results within 1e-5 relative (elementwise and AdamW, whose per-element
// arithmetic is the same code, to a few ulps; reductions summed in another
// order, LayerNorm, GEMMs, bias and embedding gradients, cross-entropy fused
// and in vocabulary-parallel pieces, to that bound); the 16-bit conversions,
// the 16-bit adds and the mixed-precision AdamW step bit-identical (the same
// scalar code on both sides), the 16-bit sum of squares within 1e-9. Needs a
// GPU: without one every test skips and says why (the kernels are still
// compiled and linked).
// Seed: fresh per run, printed on failure; rerun with STRATA_TEST_SEED.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "tests/unit/cuda_test_support.hpp"
#include "kernels/kernels.hpp"

namespace cu = strata::kernels::cuda;
namespace cpu = strata::kernels::cpu;
namespace k = strata::kernels;
namespace core = strata::core;

namespace {

using strata::test::Device;
using strata::test::DeviceOf;
using strata::test::test_seed;
using strata::test::uniform;
using strata::test::Vec;


// Largest |a - b| / max(|b|, floor) over the elements.
double max_rel(const Vec& a, const Vec& b, double floor = 1e-3) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(double(a[i]) - b[i]) / std::max(std::fabs(double(b[i])), floor));
  return worst;
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

using Bits = std::vector<std::uint16_t>;

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

class CudaKernels : public strata::test::CudaTest {};

}  // namespace

TEST_F(CudaKernels, ElementwiseMatchTheCpuBackend) {
  SCOPED_TRACE(trace());
  for (const std::int64_t n : {1, 1000, 1 << 20}) {
    const Vec a = uniform(rng_, n, -4, 4), b = uniform(rng_, n, -4, 4), d = uniform(rng_, n);
    Vec out(n), ref(n);
    {  // residual, add, scale
      Device da(a), db(b), dout(out);
      cu::residual_forward(dout.get(), da.get(), db.get(), n);
      k::residual_forward(ref.data(), a.data(), b.data(), n);
      EXPECT_EQ(dout.host(), ref);
      cu::add_inplace(da.get(), db.get(), n);
      cu::scale_inplace(da.get(), 0.37f, n);
      Vec r = a;
      k::add_inplace(r.data(), b.data(), n);
      k::scale_inplace(r.data(), 0.37f, n);
      EXPECT_EQ(da.host(), r);
      cu::fill_zero(da.get(), n);
      EXPECT_EQ(da.host(), Vec(std::size_t(n), 0.0f));
    }
    {  // GELU forward and backward (accumulating)
      Device da(a), dd(d), dout(out), dg(d);
      cu::gelu_forward(dout.get(), da.get(), n);
      k::gelu_forward(ref.data(), a.data(), n);
      EXPECT_LE(max_rel(dout.host(), ref), 1e-5) << "n " << n;
      cu::gelu_backward(dg.get(), da.get(), dd.get(), n);
      Vec g = d;
      k::gelu_backward(g.data(), a.data(), d.data(), n);
      EXPECT_LE(max_rel(dg.host(), g), 1e-5) << "n " << n;
    }
  }
  const int N = 37, C = 300;
  const Vec x = uniform(rng_, std::size_t(N) * C), bias = uniform(rng_, C);
  Device dx(x), db(bias);
  cu::bias_add(dx.get(), db.get(), N, C);
  Vec r = x;
  k::bias_add(r.data(), bias.data(), N, C);
  EXPECT_EQ(dx.host(), r);
}

TEST_F(CudaKernels, BiasBackwardAndSumOfSquaresMatchTheCpuBackend) {
  SCOPED_TRACE(trace());
  const int N = 513, C = 77;
  const Vec dout = uniform(rng_, std::size_t(N) * C), db0 = uniform(rng_, C);
  Vec ref = db0;
  Device dd(dout), ddb(db0);
  cu::bias_backward(ddb.get(), dd.get(), N, C);
  k::bias_backward(ref.data(), dout.data(), N, C);
  EXPECT_LE(max_rel(ddb.host(), ref), 1e-5);
  for (const std::int64_t n : {0, 5, 1 << 20}) {
    const Vec x = uniform(rng_, std::size_t(n));
    Device dx(x);
    const double want = k::sum_squares(x.data(), n);
    EXPECT_NEAR(cu::sum_squares(dx.get(), n), want, 1e-12 * std::max(want, 1.0)) << n;
  }
}

TEST_F(CudaKernels, LayerNormForwardMatchesTheCpuBackend) {
  SCOPED_TRACE(trace());
  for (const auto& [N, C] : {std::pair{1, 7}, std::pair{64, 768}, std::pair{300, 1024}}) {
    // A mean far from zero: the two-pass variance must not cancel.
    const Vec x = uniform(rng_, std::size_t(N) * C, 90, 110), w = uniform(rng_, C), b = uniform(rng_, C);
    Vec out(x.size()), mean(N), rstd(N), rout(x.size()), rmean(N), rrstd(N);
    Device dx(x), dw(w), db(b), dout(out), dmean(mean), drstd(rstd);
    cu::layernorm_forward(dout.get(), dmean.get(), drstd.get(), dx.get(), dw.get(), db.get(), N, C);
    k::layernorm_forward(rout.data(), rmean.data(), rrstd.data(), x.data(), w.data(), b.data(), N, C);
    EXPECT_LE(max_rel(dout.host(), rout), 1e-5) << N << " x " << C;
    EXPECT_LE(max_rel(dmean.host(), rmean), 1e-6) << N << " x " << C;
    EXPECT_LE(max_rel(drstd.host(), rrstd), 1e-5) << N << " x " << C;
  }
}

TEST_F(CudaKernels, AdamWMatchesTheCpuBackend) {
  SCOPED_TRACE(trace());
  const std::int64_t n = 100003;
  Vec p = uniform(rng_, n), m(n, 0.0f), v(n, 0.0f);
  Device dp(p), dm(m), dv(v);
  for (int step = 1; step <= 3; ++step) {
    const Vec g = uniform(rng_, n, -10, 10);
    Device dg(g);
    cu::adamw_update(dp.get(), dg.get(), dm.get(), dv.get(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    k::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    EXPECT_LE(max_rel(dp.host(), p), 1e-5) << "step " << step;
    EXPECT_LE(max_rel(dm.host(), m), 1e-5) << "step " << step;
    EXPECT_LE(max_rel(dv.host(), v), 1e-5) << "step " << step;
  }
}

// Every transpose combination, leading dimensions wider than the matrices,
// alpha and beta both active; and the strided batch attention uses.
TEST_F(CudaKernels, MatmulMatchesTheCpuBackend) {
  SCOPED_TRACE(trace());
  const int M = 37, N = 53, K = 129, pad = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
      const Vec A = uniform(rng_, std::size_t(ta ? K : M) * lda), B = uniform(rng_, std::size_t(tb ? N : K) * ldb);
      Vec C = uniform(rng_, std::size_t(M) * ldc), ref = C;
      Device dA(A), dB(B), dC(C);
      cu::matmul(ta, tb, M, N, K, 0.7f, dA.get(), lda, dB.get(), ldb, 0.3f, dC.get(), ldc);
      k::matmul(ta, tb, M, N, K, 0.7f, A.data(), lda, B.data(), ldb, 0.3f, ref.data(), ldc);
      // K products summed in another order: relative to the sums' scale.
      EXPECT_LE(max_rel(dC.host(), ref, 1.0), 1e-5) << "trans_a " << ta << " trans_b " << tb;
    }
  const int batch = 6;
  const Vec A = uniform(rng_, std::size_t(batch) * M * K), B = uniform(rng_, std::size_t(batch) * N * K);
  Vec C(std::size_t(batch) * M * N, 0.0f), ref = C;
  Device dA(A), dB(B), dC(C);
  cu::matmul_strided_batched(false, true, M, N, K, 1.0f, dA.get(), K, std::int64_t(M) * K, dB.get(), K,
                             std::int64_t(N) * K, 0.0f, dC.get(), N, std::int64_t(M) * N, batch);
  k::matmul_strided_batched(false, true, M, N, K, 1.0f, A.data(), K, std::int64_t(M) * K, B.data(), K,
                            std::int64_t(N) * K, 0.0f, ref.data(), N, std::int64_t(M) * N, batch);
  EXPECT_LE(max_rel(dC.host(), ref, 1.0), 1e-5);
}

TEST_F(CudaKernels, LayerNormBackwardMatchesTheCpuBackend) {
  SCOPED_TRACE(trace());
  const int N = 200, C = 384;
  const Vec x = uniform(rng_, std::size_t(N) * C, -3, 5), w = uniform(rng_, C), b = uniform(rng_, C);
  const Vec dy = uniform(rng_, x.size());
  Vec out(x.size()), mean(N), rstd(N);
  k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  // Accumulation: every gradient starts non-zero.
  Vec dx = uniform(rng_, x.size()), dw = uniform(rng_, C), dbias = uniform(rng_, C);
  Device ddx(dx), ddw(dw), ddb(dbias), ddy(dy), dxin(x), dwt(w), dmean(mean), drstd(rstd);
  cu::layernorm_backward(ddx.get(), ddw.get(), ddb.get(), ddy.get(), dxin.get(), dwt.get(), dmean.get(), drstd.get(), N,
                         C);
  k::layernorm_backward(dx.data(), dw.data(), dbias.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                        C);
  EXPECT_LE(max_rel(ddx.host(), dx), 1e-5);
  EXPECT_LE(max_rel(ddw.host(), dw), 1e-5);
  EXPECT_LE(max_rel(ddb.host(), dbias), 1e-5);
}

// A linear layer's product with its bias in the epilogue (cuBLASLt), written
// or accumulated (beta 0, 1), with the weights and the bias at offsets that
// leave them 4-byte aligned only (a parameter inside the flat buffer; the
// bias then takes the unfused path), at GPT-like and odd sizes.
TEST_F(CudaKernels, LinearWithBiasMatchesTheCpuBackend) {
  SCOPED_TRACE(trace());
  struct Shape {
    int N, IC, OC;
  };
  for (const Shape& sh : {Shape{512, 256, 768}, Shape{37, 19, 53}, Shape{1024, 128, 512}})
    for (const int offset : {0, 1})
      for (const float beta : {0.0f, 1.0f}) {
        const Vec x = uniform(rng_, std::size_t(sh.N) * sh.IC);
        const Vec w = uniform(rng_, std::size_t(sh.OC) * sh.IC + offset), b = uniform(rng_, std::size_t(sh.OC) + offset);
        Vec out = uniform(rng_, std::size_t(sh.N) * sh.OC);
        Device dx(x), dw(w), db(b), dout(out);
        cu::linear_bias_forward(dout.get(), dx.get(), dw.get() + offset, db.get() + offset, sh.N, sh.IC, sh.OC, beta);
        k::linear_bias_forward(out.data(), x.data(), w.data() + offset, b.data() + offset, sh.N, sh.IC, sh.OC, beta);
        EXPECT_LE(max_rel(dout.host(), out), 1e-5) << sh.N << "x" << sh.IC << "x" << sh.OC << " offset " << offset
                                                     << " beta " << beta;
      }
}

// Whole and vocabulary-sharded tables (tokens outside the shard add 0), with
// and without the position table; repeated tokens exercise the atomics.
TEST_F(CudaKernels, EmbeddingMatchesTheCpuBackend) {
  SCOPED_TRACE(trace());
  const int B = 3, T = 17, C = 40, V = 50;
  std::vector<std::int32_t> tokens(std::size_t(B) * T);
  std::uniform_int_distribution<int> tok(0, V - 1);
  for (auto& t : tokens) t = tok(rng_);
  for (const auto& [v_begin, v_count] : {std::pair{0, -1}, std::pair{20, 15}}) {
    const int rows = v_count < 0 ? V : v_count;
    const Vec wte = uniform(rng_, std::size_t(rows) * C), wpe = uniform(rng_, std::size_t(T) * C);
    const Vec dout = uniform(rng_, std::size_t(B) * T * C);
    for (bool with_wpe : {true, false}) {
      Vec out(std::size_t(B) * T * C), ref = out, dwte = uniform(rng_, wte.size()), dwpe = uniform(rng_, wpe.size());
      DeviceOf<std::int32_t> dt(tokens);
      Device dwte_in(wte), dwpe_in(wpe), dout_d(out), dgrad(dout), ddwte(dwte), ddwpe(dwpe);
      cu::embedding_forward(dout_d.get(), dt.get(), dwte_in.get(), with_wpe ? dwpe_in.get() : nullptr, B, T, C, v_begin,
                            v_count);
      k::embedding_forward(ref.data(), tokens.data(), wte.data(), with_wpe ? wpe.data() : nullptr, B, T, C, v_begin,
                           v_count);
      EXPECT_EQ(dout_d.host(), ref) << "v_begin " << v_begin << " wpe " << with_wpe;
      cu::embedding_backward(ddwte.get(), with_wpe ? ddwpe.get() : nullptr, dgrad.get(), dt.get(), B, T, C, v_begin,
                             v_count);
      k::embedding_backward(dwte.data(), with_wpe ? dwpe.data() : nullptr, dout.data(), tokens.data(), B, T, C, v_begin,
                            v_count);
      EXPECT_LE(max_rel(ddwte.host(), dwte), 1e-5) << "v_begin " << v_begin;
      EXPECT_LE(max_rel(ddwpe.host(), dwpe), 1e-5) << "v_begin " << v_begin;
    }
  }
}

// The position rows of a sequence-parallel rank's rows (starting mid-sequence
// and wrapping into the next sample), added to what the rows hold.
TEST_F(CudaKernels, PositionRowsMatchTheCpuBackend) {
  SCOPED_TRACE(trace());
  const int T = 13, C = 24, rows = 30, r0 = 7;
  const Vec wpe = uniform(rng_, std::size_t(T) * C);
  Vec out = uniform(rng_, std::size_t(rows) * C);
  Device d(out), dwpe(wpe);
  cu::add_position_rows(d.get(), dwpe.get(), rows, C, T, r0);
  k::add_position_rows(out.data(), wpe.data(), rows, C, T, r0);
  EXPECT_EQ(d.host(), out);
}

// Rows of a GPT-2-sized vocabulary and a tiny one; the backward in place
// over the logits, as the model calls it.
TEST_F(CudaKernels, CrossEntropyMatchesTheCpuBackend) {
  SCOPED_TRACE(trace());
  for (const auto& [N, V] : {std::pair{4, 7}, std::pair{33, 50257}}) {
    const Vec logits = uniform(rng_, std::size_t(N) * V, -8, 8);
    std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
    std::uniform_int_distribution<int> tok(0, V - 1);
    for (auto& t : targets) t = tok(rng_);
    Vec losses(N), ref(N);
    DeviceOf<std::int32_t> dt(targets);
    Device dl(logits), dloss(losses);
    cu::softmax_cross_entropy_forward(dloss.get(), dl.get(), dt.get(), N, V);
    k::softmax_cross_entropy_forward(ref.data(), logits.data(), targets.data(), N, V);
    EXPECT_LE(max_rel(dloss.host(), ref), 1e-5) << N << " x " << V;
    Vec grad = logits;
    cu::softmax_cross_entropy_backward(dl.get(), dl.get(), dt.get(), 1.0f / N, N, V);
    k::softmax_cross_entropy_backward(grad.data(), grad.data(), targets.data(), 1.0f / N, N, V);
    // Probabilities as small as e^-16 / V: relative to the row's scale, 1 / (N V).
    EXPECT_LE(max_rel(dl.host(), grad, 1e-3 / (double(N) * V)), 1e-5) << N << " x " << V;
  }
}

// The vocabulary-parallel pieces on one rank's shard of a larger vocabulary:
// row statistics that other ranks have already raised (a larger max, a larger
// sum), targets on the shard's first and last columns and just outside it,
// the rest anywhere in the vocabulary; the backward in place.
TEST_F(CudaKernels, ShardedCrossEntropyPiecesMatchTheCpuBackend) {
  SCOPED_TRACE(trace());
  for (const auto& [N, V_full] : {std::pair{5, 7}, std::pair{33, 50257}}) {
    for (int rank = 0; rank < 3; ++rank) {
      const int v_begin = rank * V_full / 3, v_end = (rank + 1) * V_full / 3, V = v_end - v_begin;
      const std::string at = std::to_string(N) + " x " + std::to_string(V) + " from " + std::to_string(v_begin);
      const Vec logits = uniform(rng_, std::size_t(N) * V, -8, 8);
      std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
      std::uniform_int_distribution<int> tok(0, V_full - 1);
      for (auto& t : targets) t = tok(rng_);
      targets[0] = v_begin;
      targets[1] = v_end - 1;
      targets[2] = std::max(v_begin - 1, 0);
      targets[3] = std::min(v_end, V_full - 1);
      DeviceOf<std::int32_t> dt(targets);
      Device dl(logits);

      Vec m(N), got(N);
      cpu::row_max(m.data(), logits.data(), N, V);
      Device dm(got);
      cu::row_max(dm.get(), dl.get(), N, V);
      EXPECT_EQ(dm.host(), m) << at;  // a maximum is exact

      const Vec raise = uniform(rng_, N, 0, 2);
      for (int n = 0; n < N; ++n) m[n] += raise[n];
      Vec s(N);
      cpu::row_exp_sum(s.data(), logits.data(), m.data(), N, V);
      Device dm2(m), ds(got);
      cu::row_exp_sum(ds.get(), dl.get(), dm2.get(), N, V);
      EXPECT_LE(max_rel(ds.host(), s), 1e-5) << at;

      Vec x(N);
      cpu::pick_target_logits(x.data(), logits.data(), targets.data(), v_begin, N, V);
      Device dx(got);
      cu::pick_target_logits(dx.get(), dl.get(), dt.get(), v_begin, N, V);
      EXPECT_EQ(dx.host(), x) << at;

      const Vec scale = uniform(rng_, N, 1, 3);
      for (int n = 0; n < N; ++n) s[n] *= scale[n];
      Vec losses(N);
      cpu::cross_entropy_from_parts(losses.data(), m.data(), s.data(), x.data(), N);
      Device ds2(s), dlosses(got);
      cu::cross_entropy_from_parts(dlosses.get(), dm2.get(), ds2.get(), dx.get(), N);
      EXPECT_LE(max_rel(dlosses.host(), losses), 1e-5) << at;

      Vec grad = logits;
      cpu::softmax_cross_entropy_backward_sharded(grad.data(), grad.data(), m.data(), s.data(), targets.data(),
                                                  v_begin, 1.0f / N, N, V);
      cu::softmax_cross_entropy_backward_sharded(dl.get(), dl.get(), dm2.get(), ds2.get(), dt.get(), v_begin, 1.0f / N,
                                                 N, V);
      EXPECT_LE(max_rel(dl.host(), grad, 1e-3 / (double(N) * V_full)), 1e-5) << at;
    }
  }
}

TEST_F(CudaKernels, PrecisionConversionsAreBitIdenticalToTheCpuBackend) {
  SCOPED_TRACE(trace());
  for (const core::Precision p : {core::Precision::bf16, core::Precision::fp16}) {
    const std::string fmt = core::precision_name(p);
    {  // every 16-bit pattern widened
      Bits all(1 << 16);
      for (std::size_t i = 0; i < all.size(); ++i) all[i] = std::uint16_t(i);
      Vec want(all.size());
      cpu::widen(want.data(), all.data(), std::int64_t(all.size()), p);
      DeviceOf<std::uint16_t> dh(all);
      Device dy(Vec(all.size()));
      cu::widen(dy.get(), dh.get(), std::int64_t(all.size()), p);
      EXPECT_EQ(first_difference(dy.host(), want), -1) << fmt << " widen";
    }
    {  // narrowed
      const Vec x = rounding_probes(rng_, p, 1 << 16);
      Bits want(x.size());
      cpu::narrow(want.data(), x.data(), std::int64_t(x.size()), p);
      Device dx(x);
      DeviceOf<std::uint16_t> dy(Bits(x.size()));
      cu::narrow(dy.get(), dx.get(), std::int64_t(x.size()), p);
      EXPECT_EQ(first_difference(dy.host(), want), -1) << fmt << " narrow";
    }
    // 16-bit accumulators: random addends, addends of a similar size, and
    // addends that land exactly on a tie.
    const std::size_t n = 1 << 16;
    const Bits y = random_bits(rng_, n);
    Vec addend = uniform(rng_, n, -2, 2);
    std::uniform_int_distribution<int> kind(0, 2);
    const Vec probes = rounding_probes(rng_, p, n);
    for (std::size_t i = 0; i < n; ++i) {
      const int c = kind(rng_);
      addend[i] = c == 0 ? probes[i] : c == 1 ? core::half_to_float(y[i], p) * addend[i] : half_gap(y[i], p);
    }
    {
      Bits want = y;
      cpu::narrow_add(want.data(), addend.data(), std::int64_t(n), p);
      DeviceOf<std::uint16_t> dy(y);
      Device da(addend);
      cu::narrow_add(dy.get(), da.get(), std::int64_t(n), p);
      EXPECT_EQ(first_difference(dy.host(), want), -1) << fmt << " narrow_add";
    }
    {
      const Bits x = narrowed(addend, p);
      Bits want = y;
      cpu::add_half(want.data(), x.data(), std::int64_t(n), p);
      DeviceOf<std::uint16_t> dy(y), dx(x);
      cu::add_half(dy.get(), dx.get(), std::int64_t(n), p);
      EXPECT_EQ(first_difference(dy.host(), want), -1) << fmt << " add_half";
    }
  }
}

TEST_F(CudaKernels, SumOfSquaresOfHalvesMatchesTheCpuBackend) {
  SCOPED_TRACE(trace());
  for (const core::Precision p : {core::Precision::bf16, core::Precision::fp16})
    for (const std::int64_t n : {0, 5, 1 << 20}) {
      const Bits x = narrowed(uniform(rng_, std::size_t(n), -4, 4), p);
      DeviceOf<std::uint16_t> dx(x);
      const double want = cpu::sum_squares_half(x.data(), n, p);
      EXPECT_NEAR(cu::sum_squares_half(dx.get(), n, p), want, 1e-9 * want) << core::precision_name(p) << " n " << n;
    }
}

// Several tensors at once, each divided by its divisor (a replicated
// parameter's share under tensor parallelism), fp32 and 16-bit: a gradient
// norm's local part.
TEST_F(CudaKernels, SumOfSquaresOfTensorsMatchesTheCpuBackend) {
  SCOPED_TRACE(trace());
  const std::int64_t ns[] = {7, 0, 1 << 16, 1000};
  const double divisors[] = {1.0, 1.0, 4.0, 2.0};
  for (const core::Precision p : {core::Precision::fp32, core::Precision::bf16}) {
    std::vector<Vec> host;
    std::vector<Bits> halves;
    std::vector<std::unique_ptr<Device>> dev32;
    std::vector<std::unique_ptr<DeviceOf<std::uint16_t>>> dev16;
    std::vector<const void*> h, d;
    for (const std::int64_t n : ns) {
      host.push_back(uniform(rng_, std::size_t(n), -3, 3));
      halves.push_back(narrowed(host.back(), p));
    }
    for (std::size_t k = 0; k < host.size(); ++k) {
      if (p == core::Precision::fp32) {
        dev32.push_back(std::make_unique<Device>(host[k]));
        h.push_back(host[k].data()), d.push_back(dev32.back()->get());
      } else {
        dev16.push_back(std::make_unique<DeviceOf<std::uint16_t>>(halves[k]));
        h.push_back(halves[k].data()), d.push_back(dev16.back()->get());
      }
    }
    const double want = cpu::sum_squares_tensors(h.data(), ns, divisors, 4, p);
    EXPECT_NEAR(cu::sum_squares_tensors(d.data(), ns, divisors, 4, p), want, 1e-9 * want) << core::precision_name(p);
  }
}

// ZeRO's mixed step: fp32 master weights and moments, 16-bit gradients
// unscaled by one factor, the 16-bit parameters rewritten. Bit-identical on
// every buffer: both backends run the same AdamWStep on the same inputs.
TEST_F(CudaKernels, MixedPrecisionAdamWIsBitIdenticalToTheCpuBackend) {
  SCOPED_TRACE(trace());
  const std::int64_t n = 100003;
  for (const core::Precision p : {core::Precision::bf16, core::Precision::fp16}) {
    const std::string fmt = core::precision_name(p);
    Vec master = uniform(rng_, n), m(n, 0.0f), v(n, 0.0f);
    Bits param = narrowed(master, p);
    Device dmaster(master), dm(m), dv(v);
    DeviceOf<std::uint16_t> dparam(param);
    for (int step = 1; step <= 3; ++step) {
      const Bits grad = narrowed(uniform(rng_, n, -40, 40), p);  // scaled by 4, unscaled below
      DeviceOf<std::uint16_t> dg(grad);
      cu::adamw_update_mixed(dmaster.get(), dparam.get(), dg.get(), 0.25f, dm.get(), dv.get(), n, 1e-2f, 0.9f, 0.95f,
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
