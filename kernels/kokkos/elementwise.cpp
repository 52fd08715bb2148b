// Pointwise kernels: bias, GELU, SwiGLU, residual adds, scaling, zeroing,
// conversions, row copies and the sum of squares behind gradient-norm
// clipping. Flat loops are a range policy; row-wise ones a team per row, its
// threads over the columns. GELU and SwiGLU use the CPU backend's formulas
// and exponential (kernels/vec_math.hpp), so the two agree to rounding.
// Each is a template over the element type: fp32 inside, each element
// rounded once as it is written.
#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"
#include "kernels/vec_math.hpp"

namespace strata::kernels::kokkos {

namespace {

using core::CPtr;
using core::Ptr;

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

template <typename E>
void bias_add_(E* out, const E* bias, int N, int C) {
  Kokkos::parallel_for(
      "strata::bias_add", rows_policy(N), KOKKOS_LAMBDA(const Member& m) {
        E* y = out + std::int64_t(m.league_rank()) * C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C),
                             [&](int c) { y[c] = from_float<E>(to_float(y[c]) + to_float(bias[c])); });
      });
}

template <typename E>
void bias_backward_(float* db, const E* dy, int N, int C) {
  // Blocks of columns, each summing its N rows in double (as the CPU backend).
  Kokkos::parallel_for(
      "strata::bias_backward", column_blocks(C), KOKKOS_LAMBDA(std::int64_t blk) {
        const int c0 = int(blk) * kColumnBlock, width = C - c0 < kColumnBlock ? C - c0 : kColumnBlock;
        double acc[kColumnBlock] = {};
        for (int n = 0; n < N; ++n)
          for (int l = 0; l < width; ++l) acc[l] += to_float(dy[std::int64_t(n) * C + c0 + l]);
        for (int l = 0; l < width; ++l) db[c0 + l] += float(acc[l]);
      });
}

// GELU with the tanh approximation, as x sigmoid(2u) (see kernels/cpu/elementwise.cpp).
template <typename E>
void gelu_forward_(E* y, const E* x, std::int64_t n) {
  Kokkos::parallel_for(
      "strata::gelu_forward", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        const float v = to_float(x[i]);
        const float u = kGeluS * (v + kGeluA * v * v * v);
        y[i] = from_float<E>(v / (1.0f + exp_vec(-2.0f * u)));
      });
}

template <typename E>
void gelu_backward_(E* dx, const E* x, const E* dy, std::int64_t n) {
  Kokkos::parallel_for(
      "strata::gelu_backward", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        const float v = to_float(x[i]);
        const float u = kGeluS * (v + kGeluA * v * v * v);
        const float du = kGeluS * (1.0f + 3.0f * kGeluA * v * v);
        const float e = exp_vec(-2.0f * u);
        const float sig = 1.0f / (1.0f + e);
        dx[i] = from_float<E>(to_float(dx[i]) + (sig + 2.0f * v * du * (e * sig) * sig) * to_float(dy[i]));
      });
}

// SwiGLU: out = silu(gate) up, silu(x) = x sigmoid(x) = x / (1 + e^-x); one
// index per output element (n, f), reading columns f and F + f of row n.
template <typename E>
void swiglu_forward_(E* y, const E* x, int N, int F) {
  Kokkos::parallel_for(
      "strata::swiglu_forward", Range(0, std::int64_t(N) * F), KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t n = i / F, f = i % F;
        const float g = to_float(x[n * 2 * F + f]), u = to_float(x[n * 2 * F + F + f]);
        y[i] = from_float<E>(g / (1.0f + exp_vec(-g)) * u);
      });
}

// d gate = dout up silu'(gate), silu'(x) = sig (1 + x (1 - sig)); d up =
// dout silu(gate), in the CPU backend's order of operations. Each (n, f)
// alone writes its two dinp entries.
template <typename E>
void swiglu_backward_(E* dx, const E* x, const E* dy, int N, int F) {
  Kokkos::parallel_for(
      "strata::swiglu_backward", Range(0, std::int64_t(N) * F), KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t n = i / F, f = i % F, g_at = n * 2 * F + f, u_at = g_at + F;
        const float g = to_float(x[g_at]), u = to_float(x[u_at]), d = to_float(dy[i]);
        const float sig = 1.0f / (1.0f + exp_vec(-g));
        dx[g_at] = from_float<E>(to_float(dx[g_at]) + d * u * sig * (1.0f + g * (1.0f - sig)));
        dx[u_at] = from_float<E>(to_float(dx[u_at]) + d * g * sig);
      });
}

template <typename E>
void residual_forward_(E* y, const E* a, const E* b, std::int64_t n) {
  Kokkos::parallel_for(
      "strata::residual_forward", Range(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { y[i] = from_float<E>(to_float(a[i]) + to_float(b[i])); });
}

template <typename Y, typename X>
void add_inplace_(Y* y, const X* x, std::int64_t n) {
  Kokkos::parallel_for(
      "strata::add_inplace", Range(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { y[i] = from_float<Y>(to_float(y[i]) + to_float(x[i])); });
}

template <typename Y, typename X>
void convert_(Y* y, const X* x, std::int64_t n) {
  Kokkos::parallel_for(
      "strata::convert", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { y[i] = from_float<Y>(to_float(x[i])); });
}

template <typename D, typename S>
void copy_rows_(D* dst, std::int64_t ld_dst, const S* src, std::int64_t ld_src, std::int64_t rows, std::int64_t cols,
                bool add) {
  Kokkos::parallel_for(
      "strata::copy_rows", rows_policy(rows), KOKKOS_LAMBDA(const Member& m) {
        D* d = dst + m.league_rank() * ld_dst;
        const S* x = src + m.league_rank() * ld_src;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, cols), [&](std::int64_t c) {
          d[c] = from_float<D>(add ? to_float(d[c]) + to_float(x[c]) : to_float(x[c]));
        });
      });
}

template <typename E>
void scale_inplace_(E* x, float s, std::int64_t n) {
  Kokkos::parallel_for(
      "strata::scale_inplace", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { x[i] = from_float<E>(to_float(x[i]) * s); });
}

template <typename E>
double sum_squares_(const E* x, std::int64_t n) {
  return range_sum<double>("strata::sum_squares", n, KOKKOS_LAMBDA(std::int64_t i) {
    const double v = to_float(x[i]);
    return v * v;
  });
}

}  // namespace

void bias_add(Ptr out, CPtr bias, int N, int C) { STRATA_BY_FORMAT(out, bias_add_(out.as<E>(), bias.as<E>(), N, C)); }

void bias_backward(float* dbias, CPtr dout, int N, int C) {
  STRATA_BY_FORMAT(dout, bias_backward_(dbias, dout.as<E>(), N, C));
}

void gelu_forward(Ptr out, CPtr inp, std::int64_t n) { STRATA_BY_FORMAT(out, gelu_forward_(out.as<E>(), inp.as<E>(), n)); }

void gelu_backward(Ptr dinp, CPtr inp, CPtr dout, std::int64_t n) {
  STRATA_BY_FORMAT(dinp, gelu_backward_(dinp.as<E>(), inp.as<E>(), dout.as<E>(), n));
}

void swiglu_forward(Ptr out, CPtr inp, int N, int F) {
  STRATA_BY_FORMAT(out, swiglu_forward_(out.as<E>(), inp.as<E>(), N, F));
}

void swiglu_backward(Ptr dinp, CPtr inp, CPtr dout, int N, int F) {
  STRATA_BY_FORMAT(dinp, swiglu_backward_(dinp.as<E>(), inp.as<E>(), dout.as<E>(), N, F));
}

void residual_forward(Ptr out, CPtr a, CPtr b, std::int64_t n) {
  STRATA_BY_FORMAT(out, residual_forward_(out.as<E>(), a.as<E>(), b.as<E>(), n));
}

void add_inplace(Ptr y, CPtr x, std::int64_t n) {
  core::with_formats(y.precision(), x.precision(),
             [&](auto yt, auto xt) { add_inplace_(y.as<decltype(yt)>(), x.as<decltype(xt)>(), n); });
}

void convert(Ptr y, CPtr x, std::int64_t n) {
  core::with_formats(y.precision(), x.precision(),
             [&](auto yt, auto xt) { convert_(y.as<decltype(yt)>(), x.as<decltype(xt)>(), n); });
}

void copy_rows(Ptr dst, std::int64_t ld_dst, CPtr src, std::int64_t ld_src, std::int64_t rows, std::int64_t cols,
               bool add) {
  core::with_formats(dst.precision(), src.precision(), [&](auto dt, auto st) {
    copy_rows_(dst.as<decltype(dt)>(), ld_dst, src.as<decltype(st)>(), ld_src, rows, cols, add);
  });
}

void scale_inplace(Ptr x, float s, std::int64_t n) { STRATA_BY_FORMAT(x, scale_inplace_(x.as<E>(), s, n)); }

// Zero is all-zero bits in every format.
void fill_zero(Ptr x, std::int64_t n) { zero_bytes(x.get(), std::size_t(n) * std::size_t(x.element_bytes())); }

double sum_squares(CPtr x, std::int64_t n) {
  double s = 0;
  STRATA_BY_FORMAT(x, s = sum_squares_(x.as<E>(), n));
  return s;
}

}  // namespace strata::kernels::kokkos
