// Pointwise kernels: bias, GELU, SwiGLU, residual adds, scaling, zeroing, row
// copies and the sum of squares behind gradient-norm clipping. Flat loops are
// a range policy; row-wise ones a team per row, its threads over the columns.
// GELU and SwiGLU use the CPU backend's formulas and exponential
// (kernels/vec_math.hpp), so the two agree to rounding.
#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"
#include "kernels/vec_math.hpp"

namespace strata::kernels::kokkos {

namespace {
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

void bias_add(float* out, const float* bias, int N, int C) {
  const Mat<float> y(out, N, C);
  const Vec<const float> b(bias, C);
  Kokkos::parallel_for(
      "strata::bias_add", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        const int n = m.league_rank();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) { y(n, c) += b(c); });
      });
}

void bias_backward(float* dbias, const float* dout, int N, int C) {
  // Blocks of columns, each summing its N rows in double (as the CPU backend).
  const Mat<const float> dy(dout, N, C);
  const Vec<float> db(dbias, C);
  Kokkos::parallel_for(
      "strata::bias_backward", column_blocks(C), KOKKOS_LAMBDA(std::int64_t blk) {
        const int c0 = int(blk) * kColumnBlock, width = C - c0 < kColumnBlock ? C - c0 : kColumnBlock;
        double acc[kColumnBlock] = {};
        for (int n = 0; n < N; ++n)
          for (int l = 0; l < width; ++l) acc[l] += dy(n, c0 + l);
        for (int l = 0; l < width; ++l) db(c0 + l) += float(acc[l]);
      });
}

// GELU with the tanh approximation, as x sigmoid(2u) (see kernels/cpu/elementwise.cpp).
void gelu_forward(float* out, const float* inp, std::int64_t n) {
  const Vec<float> y(out, n);
  const Vec<const float> x(inp, n);
  Kokkos::parallel_for(
      "strata::gelu_forward", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        const float v = x(i);
        const float u = kGeluS * (v + kGeluA * v * v * v);
        y(i) = v / (1.0f + exp_vec(-2.0f * u));
      });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  const Vec<float> dx(dinp, n);
  const Vec<const float> x(inp, n), dy(dout, n);
  Kokkos::parallel_for(
      "strata::gelu_backward", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        const float v = x(i);
        const float u = kGeluS * (v + kGeluA * v * v * v);
        const float du = kGeluS * (1.0f + 3.0f * kGeluA * v * v);
        const float e = exp_vec(-2.0f * u);
        const float sig = 1.0f / (1.0f + e);
        dx(i) += (sig + 2.0f * v * du * (e * sig) * sig) * dy(i);
      });
}

// SwiGLU: out = silu(gate) up, silu(x) = x sigmoid(x) = x / (1 + e^-x); one
// index per output element (n, f), reading columns f and F + f of row n.
void swiglu_forward(float* out, const float* inp, int N, int F) {
  const Mat<float> y(out, N, F);
  const Mat<const float> x(inp, N, 2 * std::int64_t(F));
  Kokkos::parallel_for(
      "strata::swiglu_forward", Range(0, std::int64_t(N) * F), KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t n = i / F, f = i % F;
        const float g = x(n, f), u = x(n, F + f);
        y(n, f) = g / (1.0f + exp_vec(-g)) * u;
      });
}

// d gate = dout up silu'(gate), silu'(x) = sig (1 + x (1 - sig)); d up =
// dout silu(gate), in the CPU backend's order of operations. Each (n, f)
// alone writes its two dinp entries.
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
  const Mat<float> dx(dinp, N, 2 * std::int64_t(F));
  const Mat<const float> x(inp, N, 2 * std::int64_t(F)), dy(dout, N, F);
  Kokkos::parallel_for(
      "strata::swiglu_backward", Range(0, std::int64_t(N) * F), KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t n = i / F, f = i % F;
        const float g = x(n, f), u = x(n, F + f), d = dy(n, f);
        const float sig = 1.0f / (1.0f + exp_vec(-g));
        dx(n, f) += d * u * sig * (1.0f + g * (1.0f - sig));
        dx(n, F + f) += d * g * sig;
      });
}

void residual_forward(float* out, const float* a, const float* b, std::int64_t n) {
  const Vec<float> y(out, n);
  const Vec<const float> x1(a, n), x2(b, n);
  Kokkos::parallel_for("strata::residual_forward", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { y(i) = x1(i) + x2(i); });
}

void add_inplace(float* y, const float* x, std::int64_t n) {
  const Vec<float> yv(y, n);
  const Vec<const float> xv(x, n);
  Kokkos::parallel_for("strata::add_inplace", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { yv(i) += xv(i); });
}

void scale_inplace(float* x, float s, std::int64_t n) {
  const Vec<float> xv(x, n);
  Kokkos::parallel_for("strata::scale_inplace", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { xv(i) *= s; });
}

void fill_zero(float* x, std::int64_t n) {
  const Vec<float> xv(x, n);
  Kokkos::parallel_for("strata::fill_zero", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { xv(i) = 0.0f; });
}

double sum_squares(const float* x, std::int64_t n) {
  return range_sum<double>("strata::sum_squares", n, KOKKOS_LAMBDA(std::int64_t i) { return double(x[i]) * double(x[i]); });
}

void copy_rows(float* dst, std::int64_t ld_dst, const float* src, std::int64_t ld_src, std::int64_t rows,
               std::int64_t cols, bool add) {
  Kokkos::parallel_for(
      "strata::copy_rows", rows_policy(rows), KOKKOS_LAMBDA(const Member& m) {
        float* d = dst + m.league_rank() * ld_dst;
        const float* x = src + m.league_rank() * ld_src;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, cols), [&](std::int64_t c) { d[c] = add ? d[c] + x[c] : x[c]; });
      });
}

}  // namespace strata::kernels::kokkos
