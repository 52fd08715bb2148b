// The fused causal attention of the CUDA backend (kernels/cuda/attention.cu)
// against the CPU backend's unfused one on the same fresh random inputs, for
// sequence lengths on and off the kernels' 64-row tiles and head sizes from 8
// to 128: out and the gradient within 1e-5 of the CPU's, relative to the
// largest |entry| of the tensor (of each of dq, dk, dv for the gradient, and
// at least 0.1: attention's outputs have entries near zero, where an
// elementwise relative error means nothing), and the saved log-sum-exp within
// 1e-5 relative of one computed here in double. Also: out and state are
// written (they start as NaN), scratch is overwritten (it starts as NaN), the
// backward accumulates (dqkv starts nonzero; a second call adds the same
// increment again), and large scores do not overflow. bf16 tensors run on
// tensor cores: out and the gradient (each rounded once to bf16) within 2e-2
// of the CPU's fp32 on the same bf16 inputs (same measure), the log-sum-exp
// within 1e-4 of one computed in double from the bf16 q and k and within
// 2e-2 (absolute) of the one from the unrounded values; a head size the
// tensor cores do not tile (24) runs the CUDA-core kernels, within 1e-2 (the
// rounding of out and the gradient to bf16). fp16 tensors run the CUDA-core
// kernels: within 2e-3. Grouped-query attention (NKV key-value heads for NH
// query heads; NKV 1: multi-query) is held to the same bounds, with dk and
// dv summed over the query heads that share them. Needs
// a GPU: without one the GPU tests skip and say why (the kernels are still
// compiled and linked).
// Seed: fresh per run, printed on failure; rerun with STRATA_TEST_SEED.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/foundation/precision.hpp"
#include "kernels/kernels.hpp"
#include "tests/unit/cuda_test_support.hpp"

namespace cu = strata::kernels::cuda;
namespace cpu = strata::kernels::cpu;

namespace {

using strata::core::Precision;
using strata::test::Device;
using strata::test::DeviceOf;
using strata::test::rounded;
using strata::test::Tensor;
using strata::test::test_seed;
using strata::test::uniform;
using strata::test::Vec;

Vec nans(std::size_t n) { return Vec(n, std::numeric_limits<float>::quiet_NaN()); }

// NKV key-value heads; 0: as many as query heads (multi-head attention).
struct Shape {
  int B, T, NH, hs, NKV = 0;
  int C() const { return NH * hs; }
  int kv_heads() const { return NKV > 0 ? NKV : NH; }
  int KVC() const { return kv_heads() * hs; }
  int width() const { return C() + 2 * KVC(); }  // of a qkv row
  std::size_t rows() const { return std::size_t(B) * T; }
  std::size_t heads_rows() const { return std::size_t(B) * NH * T; }
  // The backward's scratch: D per head row, then (16-bit tensors) an fp32
  // dq accumulator: enough for every format.
  std::size_t scratch() const {
    return std::size_t(strata::kernels::attention_scratch_elements(true, B, NH, T, C(), strata::core::Precision::bf16));
  }
};

std::string describe(const Shape& s) {
  return "B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " NH " + std::to_string(s.NH) + " NKV " +
         std::to_string(s.kv_heads()) + " hs " + std::to_string(s.hs);
}

// max |a - b| / max |b| (a NaN in a fails the comparison: the result is NaN).
// The scale is at least 0.1: at T = 1, dq and dk are exactly zero (one key:
// dS = dP - D = 0), and what the GPU returns is dP's rounding, about 1e-7;
// elsewhere the tensors' largest entries are about 1 to 3.
double rel_to_max(const Vec& a, const Vec& b) {
  double diff = 0, scale = 0.1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - b[i]);
    diff = std::isnan(d) ? d : std::max(diff, d);
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

bool all_finite(const Vec& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// The columns of one part of the [N, C + 2 KVC] gradient (0: dq, its C
// columns; 1: dk, 2: dv, KVC each), less the same columns of `base`: what a
// backward call added.
Vec increment(const Vec& g, const Vec& base, const Shape& s, int part) {
  const std::size_t C = s.C(), KVC = s.KVC(), W = s.width();
  const std::size_t first = part == 0 ? 0 : C + (part - 1) * KVC, cols = part == 0 ? C : KVC;
  Vec d;
  d.reserve(s.rows() * cols);
  for (std::size_t n = 0; n < s.rows(); ++n)
    for (std::size_t c = 0; c < cols; ++c) {
      const std::size_t i = n * W + first + c;
      d.push_back(g[i] - base[i]);
    }
  return d;
}

// Each row's log-sum-exp of its scaled causal scores, [B, NH, T], in double.
std::vector<double> lse_reference(const Vec& qkv, const Shape& s) {
  const int C = s.C();
  const std::size_t W = s.width();
  const int group = s.NH / s.kv_heads();
  const double scale = 1.0 / std::sqrt(double(s.hs));
  std::vector<double> lse(s.heads_rows());
  std::vector<double> row;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const float* q = qkv.data() + (std::size_t(b) * s.T + t) * W + h * s.hs;
        row.assign(t + 1, 0.0);
        double m = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const float* k = qkv.data() + (std::size_t(b) * s.T + j) * W + C + (h / group) * s.hs;
          double dot = 0;
          for (int d = 0; d < s.hs; ++d) dot += double(q[d]) * k[d];
          row[j] = dot * scale;
          m = std::max(m, row[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; ++j) sum += std::exp(row[j] - m);
        lse[(std::size_t(b) * s.NH + h) * s.T + t] = m + std::log(sum);
      }
  return lse;
}

// Largest |a - b| / max(|b|, 1) (the log-sum-exp is a log, of order log T).
double lse_error(const Vec& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]) / std::max(std::fabs(b[i]), 1.0);
    worst = std::isnan(d) ? d : std::max(worst, d);
  }
  return worst;
}

// T off and on the 64-row tiles (1, 7, 65, 130; 64, 128), head sizes 8 to
// 128 (24: not a power of two, 40: not a multiple of 16), B * NH > 1.
const Shape kShapes[] = {
    {1, 1, 1, 8}, {2, 7, 3, 16}, {1, 65, 2, 24}, {2, 64, 2, 40}, {2, 130, 2, 64}, {1, 128, 3, 8}, {1, 200, 2, 128},
    {1, 67, 2, 160}, {2, 40, 1, 256},  // the wide path (ring attention's kernels)
};

// Grouped-query attention: groups of 2 and 4 query heads (NKV 1:
// multi-query), T off and on the tiles, head sizes on (16, 64, 128) and off
// (24) the tensor cores' tiles, B > 1.
const Shape kGroupedShapes[] = {
    {2, 7, 4, 16, 2}, {1, 65, 4, 24, 1}, {2, 64, 4, 64, 2}, {2, 130, 4, 64, 1}, {1, 200, 4, 128, 2}, {2, 1, 4, 16, 1},
    {1, 67, 4, 160, 2},
};

// Under bf16 math the tensor-core kernels run for head sizes that are
// multiples of 16: T off and on the 64-row tiles, head sizes 16, 64, 128.
const Shape kTensorCoreShapes[] = {
    {2, 1, 2, 16},  {2, 7, 2, 16},  {1, 64, 3, 16},  {2, 65, 2, 16},  {1, 130, 2, 16},  {1, 200, 2, 16},
    {2, 1, 2, 64},  {1, 7, 3, 64},  {2, 64, 2, 64},  {1, 65, 2, 64},  {2, 130, 2, 64},  {1, 200, 2, 64},
    {2, 1, 1, 128}, {1, 7, 2, 128}, {1, 64, 2, 128}, {2, 65, 2, 128}, {1, 130, 2, 128}, {1, 200, 2, 128},
};

// Forward and backward (twice, to check that it accumulates) on `s` with
// tensors of `format`: out and the gradient against the CPU backend's fp32
// on the same (rounded) inputs within `tol` (rel_to_max), the twice-added
// increment within `tol` of twice the first (1e-5 in fp32); the
// log-sum-exp within `lse_tol` (lse_error) of the double one from the
// rounded qkv, and within `lse_fp32_tol` (absolute) of the one from the
// unrounded values.
void check_against_cpu(std::mt19937& rng, const Shape& s, Precision format, double tol, double lse_tol,
                       double lse_fp32_tol) {
  const char* names[] = {"dq", "dk", "dv"};
  const int C = s.C(), NKV = s.kv_heads();
  const Vec raw = uniform(rng, s.rows() * s.width(), -2, 2);
  const Vec qkv = rounded(raw, format), dy = rounded(uniform(rng, s.rows() * C), format);
  const Vec g0 = rounded(uniform(rng, s.rows() * s.width(), -0.25f, 0.25f), format);

  Vec out(s.rows() * C), probs(s.heads_rows() * s.T), dprobs(s.heads_rows() * s.T), ref = g0;
  cpu::attention_forward(out.data(), probs.data(), qkv.data(), s.B, s.T, C, s.NH, NKV);
  cpu::attention_backward(ref.data(), dprobs.data(), dy.data(), qkv.data(), out.data(), probs.data(), s.B, s.T, C,
                          s.NH, NKV);

  Tensor dqkv(qkv, format), ddy(dy, format), dout(nans(s.rows() * C), format), dg(g0, format);
  Device dstate(nans(s.heads_rows())), dscratch(nans(s.scratch()));
  cu::attention_forward(dout.ptr(), dstate.get(), dqkv.ptr(), s.B, s.T, C, s.NH, NKV);
  EXPECT_LE(rel_to_max(dout.host(), out), tol) << "out, " << describe(s);
  const Vec lse = dstate.host();
  EXPECT_LE(lse_error(lse, lse_reference(qkv, s)), lse_tol) << "lse, " << describe(s);
  double worst = 0;
  const std::vector<double> exact = lse_reference(raw, s);
  for (std::size_t i = 0; i < lse.size(); ++i) {
    const double d = std::fabs(lse[i] - exact[i]);
    worst = std::isnan(d) ? d : std::max(worst, d);
  }
  EXPECT_LE(worst, lse_fp32_tol) << "lse against fp32 q and k, " << describe(s);

  cu::attention_backward(dg.ptr(), dscratch.get(), ddy.ptr(), dqkv.ptr(), dout.ptr(), dstate.get(), s.B, s.T, C,
                         s.NH, NKV);
  const Vec once = dg.host();
  for (int part = 0; part < 3; ++part)
    EXPECT_LE(rel_to_max(increment(once, g0, s, part), increment(ref, g0, s, part)), tol)
        << names[part] << ", " << describe(s);
  cu::attention_backward(dg.ptr(), dscratch.get(), ddy.ptr(), dqkv.ptr(), dout.ptr(), dstate.get(), s.B, s.T, C,
                         s.NH, NKV);
  const Vec twice = dg.host();
  for (int part = 0; part < 3; ++part) {
    Vec doubled = increment(once, g0, s, part);
    for (auto& x : doubled) x *= 2;
    EXPECT_LE(rel_to_max(increment(twice, g0, s, part), doubled), format == Precision::fp32 ? 1e-5 : tol)
        << names[part] << " twice, " << describe(s);
  }
}

class CudaAttention : public strata::test::CudaTest {};

}  // namespace

// fp32: out, the log-sum-exp and the gradient within 1e-5; scores of
// standard deviation about 1.3 (qkv in [-2, 2]) give peaked rows, and row
// maxima that move from key tile to key tile (the online softmax rescales).
// The backward accumulates: a second call adds the same increment again
// (dq's atomic additions may come in another order: equal to rounding).
TEST_F(CudaAttention, ForwardAndBackwardMatchTheCpuBackend) {
  SCOPED_TRACE(trace());
  for (const Shape& s : kShapes) check_against_cpu(rng_, s, Precision::fp32, 1e-5, 1e-5, 1e-4);
}

// Scores of about a hundred (qkv in [-12, 12]): their exp overflows fp32
// without the running maximum. Summed in fp32, such scores are off by a few
// 1e-4 (the log-sum-exp was seen 4e-6 relative from the double one), so out
// and the log-sum-exp are held to 1e-4; the gradient to being finite.
TEST_F(CudaAttention, LargeScoresStayFinite) {
  SCOPED_TRACE(trace());
  const Shape s{2, 130, 2, 64};
  const int C = s.C();
  const Vec qkv = uniform(rng_, s.rows() * 3 * C, -12, 12), dy = uniform(rng_, s.rows() * C);
  Vec ref(s.rows() * C), probs(s.heads_rows() * s.T);
  cpu::attention_forward(ref.data(), probs.data(), qkv.data(), s.B, s.T, C, s.NH, s.NH);

  Device dqkv(qkv), ddy(dy), dout(nans(s.rows() * C)), dstate(nans(s.heads_rows()));
  Device dscratch(nans(s.scratch())), dg(Vec(s.rows() * 3 * C, 0.0f));
  cu::attention_forward(dout.get(), dstate.get(), dqkv.get(), s.B, s.T, C, s.NH, s.NH);
  EXPECT_LE(rel_to_max(dout.host(), ref), 1e-4);
  EXPECT_LE(lse_error(dstate.host(), lse_reference(qkv, s)), 1e-4);
  cu::attention_backward(dg.get(), dscratch.get(), ddy.get(), dqkv.get(), dout.get(), dstate.get(), s.B, s.T, C,
                         s.NH, s.NH);
  EXPECT_TRUE(all_finite(dg.host()));
}

// Head sizes the kernels do not handle are refused before anything runs
// (no GPU needed).
TEST(CudaAttentionShapes, HeadSizesAbove256AreRefused) {
  const float* none = nullptr;
  EXPECT_THROW(cu::attention_forward(nullptr, nullptr, none, 1, 4, 2 * 264, 2, 2), std::invalid_argument);
  EXPECT_THROW(cu::attention_backward(nullptr, nullptr, none, none, none, none, 1, 4, 2 * 264, 2, 2),
               std::invalid_argument);
  EXPECT_THROW(cu::attention_forward(nullptr, nullptr, none, 1, 4, 100, 3, 3), std::invalid_argument);
}

// So are key-value head counts that do not divide the query heads, or are
// not positive (no GPU needed).
TEST(CudaAttentionShapes, KeyValueHeadsThatDoNotDivideAreRefused) {
  for (const int nkv : {0, -2, 3, 8}) {
    const float* none = nullptr;
    EXPECT_THROW(cu::attention_forward(nullptr, nullptr, none, 1, 4, 64, 4, nkv), std::invalid_argument) << nkv;
    EXPECT_THROW(cu::attention_backward(nullptr, nullptr, none, none, none, none, 1, 4, 64, 4, nkv),
                 std::invalid_argument)
        << nkv;
  }
}

// bf16 tensors, on tensor cores: P and dS rounded to bf16 for their
// products, out and the gradient rounded to bf16 as written, within 2e-2 of
// the CPU's fp32 on the same bf16 inputs (seen, with fp32 storage: 6e-3).
// The log-sum-exp is held to 1e-4 of the one from the same bf16 inputs (the
// kernels' own arithmetic, fp32), and to 2e-2 absolute of the one from the
// unrounded inputs: rounding q and k alone moves a run's worst row by 8e-3
// typically and by more than 1e-2 in about one run of a hundred (measured
// in double over 200 runs of these shapes), so 1e-2 there would fail at
// random.
TEST_F(CudaAttention, Bf16RunsOnTensorCoresWithinBf16Rounding) {
  SCOPED_TRACE(trace());
  for (const Shape& s : kTensorCoreShapes) check_against_cpu(rng_, s, Precision::bf16, 2e-2, 1e-4, 2e-2);
}

// fp16 tensors run the CUDA-core kernels (and, past head size 128, the wide
// ones) on fp16 inputs: out and the gradient rounded once to fp16 (11
// significant bits), within 2e-3.
TEST_F(CudaAttention, Fp16RunsWithinFp16Rounding) {
  SCOPED_TRACE(trace());
  for (const Shape& s : kShapes) check_against_cpu(rng_, s, Precision::fp16, 2e-3, 1e-4, 2e-2);
}

// Grouped-query attention against the CPU backend's, in fp32 and under bf16
// math (on tensor cores where the head size tiles, 24 in fp32): the same
// bounds as multi-head attention. dk and dv sum over the group's query heads
// (in the CUDA backward, one block per key tile of a key-value head walks
// them all); a second call adds the same increment again.
TEST_F(CudaAttention, GroupedQueryAttentionMatchesTheCpuBackend) {
  SCOPED_TRACE(trace());
  for (const Shape& s : kGroupedShapes) check_against_cpu(rng_, s, Precision::fp32, 1e-5, 1e-5, 1e-4);
  for (const Shape& s : kGroupedShapes) check_against_cpu(rng_, s, Precision::bf16, 2e-2, 1e-4, 2e-2);
}

// A head size the tensor-core kernels do not tile (not a multiple of 16)
// runs the CUDA-core kernels on bf16 tensors: fp32 arithmetic, out and the
// gradient rounded to bf16 once as written.
TEST_F(CudaAttention, Bf16WithAnUntiledHeadSizeRunsOnCudaCores) {
  SCOPED_TRACE(trace());
  for (const Shape& s : {Shape{1, 65, 2, 24}, Shape{2, 130, 1, 24}})
    check_against_cpu(rng_, s, Precision::bf16, 1e-2, 1e-4, 2e-2);
}
