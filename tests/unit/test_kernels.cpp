// Unit tests of the CPU kernels. Every kernel is compared with a plain
// double-precision reference written here; every backward kernel is also
// checked against central finite differences of that reference, and against
// the accumulate (+=) convention of kernels.hpp. Inputs are random with a
// fresh seed per run, printed on failure: rerun with STRATA_TEST_SEED=<seed>.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/foundation/module.hpp"
#include "kernels/kernels.hpp"

namespace k = strata::kernels;

namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;
using IVec = std::vector<std::int32_t>;

// Tolerances, in the form |got - want| <= rtol * |want| + floor * max|want|.
//
// Float kernel vs double reference: a float sum of K terms errs by up to
// K * 2^-24 of the sum of |terms|; with K <= ~130 here and rounding errors of
// random sign, the observed worst error stays below half of 1e-5 over
// hundreds of seeds (the closest: LayerNorm rows with |mean| > std, and the
// GELU tail). The floor (1e-6 of the largest value) covers entries that are
// small only through cancellation, where a relative bound means nothing.
constexpr double kRtol = 1e-5;
constexpr double kFloor = 1e-6;
// Float backward vs finite differences of the double reference. With h = 1e-5
// in double, truncation (~h^2) and rounding (~1e-16 / h) errors are < 1e-9,
// so the difference is the float backward's own error, the same size as
// above: this is the same 1e-5 test, not a looser one.
constexpr double kFdH = 1e-5;
// The double reference backward vs finite differences: both are exact to
// ~1e-9, so this checks the reference itself.
constexpr double kRefRtol = 1e-7;
constexpr double kRefFloor = 1e-8;

unsigned test_seed() {
  if (const char* s = std::getenv("STRATA_TEST_SEED")) return unsigned(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

// A seeded generator whose seed shows up in every failure message of the
// test and in the XML report.
#define SEEDED_RNG(rng)                                                                                        \
  const unsigned rng##_seed = test_seed();                                                                     \
  SCOPED_TRACE(::testing::Message() << "seed " << rng##_seed << " (rerun with STRATA_TEST_SEED=" << rng##_seed \
                                    << ")");                                                                   \
  ::testing::Test::RecordProperty("seed", std::to_string(rng##_seed));                                         \
  std::mt19937 rng(rng##_seed)

Vec uniform(std::mt19937& g, std::size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

IVec randint(std::mt19937& g, std::size_t n, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  IVec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

DVec to_double(const Vec& v) { return DVec(v.begin(), v.end()); }

double max_abs(const DVec& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

::testing::AssertionResult all_close(const float* got, const double* want, std::size_t n, double rtol, double floor) {
  double scale = 0.0;
  for (std::size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(want[i]));
  std::size_t bad = 0, first = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    const double tol = rtol * std::fabs(want[i]) + floor * scale;
    if (!(err <= tol)) {
      if (bad == 0) first = i;
      ++bad;
    }
    if (tol > 0) worst = std::max(worst, err / tol);
  }
  if (bad == 0) return ::testing::AssertionSuccess() << "worst error/tolerance " << worst;
  return ::testing::AssertionFailure() << bad << " of " << n << " elements out of tolerance (rtol " << rtol
                                       << ", floor " << floor << " * " << scale << "); first at " << first << ": got "
                                       << got[first] << ", want " << want[first] << "; worst error/tolerance " << worst;
}

::testing::AssertionResult all_close(const Vec& got, const DVec& want, double rtol = kRtol, double floor = kFloor) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  return all_close(got.data(), want.data(), got.size(), rtol, floor);
}

// Indices to perturb: all of them when few (and not forced to sample), else
// a random subset of 60.
std::vector<std::size_t> fd_indices(std::mt19937& g, std::size_t n, bool sample = false) {
  std::vector<std::size_t> idx(n);
  std::iota(idx.begin(), idx.end(), std::size_t(0));
  if (sample || n > 600) {
    std::shuffle(idx.begin(), idx.end(), g);
    idx.resize(std::min<std::size_t>(n, 60));
  }
  return idx;
}

// Compares a float gradient (and its double reference) with central
// differences of `loss` with respect to x, at the given indices.
void check_fd(const char* what, DVec& x, const Vec& grad, const DVec& grad_ref, const std::function<double()>& loss,
              const std::vector<std::size_t>& idx, double ref_floor = kRefFloor) {
  SCOPED_TRACE(what);
  Vec got;
  DVec want, ref;
  for (std::size_t i : idx) {
    const double x0 = x[i];
    x[i] = x0 + kFdH;
    const double lp = loss();
    x[i] = x0 - kFdH;
    const double lm = loss();
    x[i] = x0;
    want.push_back((lp - lm) / (2 * kFdH));
    got.push_back(grad[i]);
    ref.push_back(grad_ref[i]);
  }
  EXPECT_TRUE(all_close(got, want, kRtol, kFloor)) << "float backward vs finite differences";
  double scale = max_abs(want), worst = 0.0;
  for (std::size_t j = 0; j < want.size(); ++j) {
    const double err = std::fabs(ref[j] - want[j]);
    worst = std::max(worst, err / (kRefRtol * std::fabs(want[j]) + ref_floor * scale));
  }
  EXPECT_LE(worst, 1.0) << "double reference backward vs finite differences (error/tolerance)";
}

double dot(const DVec& a, const DVec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ---------------------------------------------------------------- references

void ref_matmul(bool ta, bool tb, int M, int N, int K, double alpha, const DVec& A, int lda, const DVec& B, int ldb,
                double beta, DVec& C, int ldc) {
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double s = 0.0;
      for (int p = 0; p < K; ++p) {
        const double a = ta ? A[std::size_t(p) * lda + i] : A[std::size_t(i) * lda + p];
        const double b = tb ? B[std::size_t(j) * ldb + p] : B[std::size_t(p) * ldb + j];
        s += a * b;
      }
      C[std::size_t(i) * ldc + j] = alpha * s + beta * C[std::size_t(i) * ldc + j];
    }
  }
}

void ref_layernorm_forward(DVec& out, DVec& mean, DVec& rstd, const DVec& x, const DVec& w, const DVec& b, int N, int C,
                           double eps) {
  for (int n = 0; n < N; ++n) {
    const double* xr = &x[std::size_t(n) * C];
    double m = 0.0, v = 0.0;
    for (int c = 0; c < C; ++c) m += xr[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + eps);
    for (int c = 0; c < C; ++c) out[std::size_t(n) * C + c] = (xr[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void ref_layernorm_backward(DVec& dx, DVec& dw, DVec& db, const DVec& dy, const DVec& x, const DVec& w, int N, int C,
                            double eps) {
  DVec out(x.size()), mean(N), rstd(N);
  ref_layernorm_forward(out, mean, rstd, x, w, DVec(C, 0.0), N, C, eps);
  for (int n = 0; n < N; ++n) {
    const std::size_t o = std::size_t(n) * C;
    double a = 0.0, bsum = 0.0;
    for (int c = 0; c < C; ++c) {
      const double norm = (x[o + c] - mean[n]) * rstd[n];
      a += dy[o + c] * w[c];
      bsum += dy[o + c] * w[c] * norm;
      dw[c] += dy[o + c] * norm;
      db[c] += dy[o + c];
    }
    a /= C;
    bsum /= C;
    for (int c = 0; c < C; ++c) {
      const double norm = (x[o + c] - mean[n]) * rstd[n];
      dx[o + c] += (dy[o + c] * w[c] - a - norm * bsum) * rstd[n];
    }
  }
}

// GELU in double. 0.5 (1 + tanh(u)) is evaluated as sigmoid(2u): the same
// function, but without the cancellation of 1 + tanh(u) -> 0 in the negative
// tail (at x = -7 that cancellation already costs double 15% of the value).
// Gelu.ReferenceMatchesTanhForm checks the identity where tanh is accurate.
double ref_gelu(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return x / (1.0 + std::exp(-2.0 * u));
}
double ref_gelu_grad(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  const double u = s * (x + 0.044715 * x * x * x);
  const double e = std::exp(-2.0 * u), sig = 1.0 / (1.0 + e);
  // 0.5 (1 - tanh^2 u) = 2 sig (1 - sig), and 1 - sig = e sig.
  return sig + x * 2.0 * sig * (e * sig) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// Grouped-query attention: NKV key-value heads, query head h reading key-value
// head h / (NH / NKV); qkv rows are C + 2 KVC wide.
int h_group(int NH, int NKV) { return NH / NKV; }

void ref_attention_forward(DVec& out, DVec& probs, const DVec& qkv, int B, int T, int C, int NH, int NKV) {
  const int hs = C / NH, KVC = NKV * hs, C3 = C + 2 * KVC, g = h_group(NH, NKV);
  const double scale = 1.0 / std::sqrt(double(hs));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double* p = &probs[((std::size_t(b) * NH + h) * T + t) * T];
        const double* q = &qkv[(std::size_t(b) * T + t) * C3 + h * hs];
        double m = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < T; ++j) {
          if (j > t) {
            p[j] = 0.0;
            continue;
          }
          const double* kk = &qkv[(std::size_t(b) * T + j) * C3 + C + (h / g) * hs];
          double s = 0.0;
          for (int i = 0; i < hs; ++i) s += q[i] * kk[i];
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (int j = 0; j <= t; ++j) p[j] /= sum;
        double* y = &out[(std::size_t(b) * T + t) * C + h * hs];
        for (int i = 0; i < hs; ++i) {
          double s = 0.0;
          for (int j = 0; j <= t; ++j) s += p[j] * qkv[(std::size_t(b) * T + j) * C3 + C + KVC + (h / g) * hs + i];
          y[i] = s;
        }
      }
}

void ref_attention_backward(DVec& dqkv, const DVec& dout, const DVec& qkv, int B, int T, int C, int NH, int NKV) {
  const int hs = C / NH, KVC = NKV * hs, C3 = C + 2 * KVC, g = h_group(NH, NKV);
  const double scale = 1.0 / std::sqrt(double(hs));
  DVec out(std::size_t(B) * T * C), probs(std::size_t(B) * NH * T * T);
  ref_attention_forward(out, probs, qkv, B, T, C, NH, NKV);
  DVec dp(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const double* p = &probs[((std::size_t(b) * NH + h) * T + t) * T];
        const double* dy = &dout[(std::size_t(b) * T + t) * C + h * hs];
        // part 0: q of head h; 1, 2: k, v of its key-value head.
        auto at = [&](int row, int part) {
          return (std::size_t(b) * T + row) * C3 + (part == 0 ? h * hs : C + (part - 1) * KVC + (h / g) * hs);
        };
        for (int j = 0; j <= t; ++j) {
          double s = 0.0;
          for (int i = 0; i < hs; ++i) s += dy[i] * qkv[at(j, 2) + i];
          dp[j] = s;
          for (int i = 0; i < hs; ++i) dqkv[at(j, 2) + i] += p[j] * dy[i];
        }
        double d = 0.0;
        for (int j = 0; j <= t; ++j) d += p[j] * dp[j];
        for (int j = 0; j <= t; ++j) {
          const double ds = p[j] * (dp[j] - d) * scale;
          for (int i = 0; i < hs; ++i) {
            dqkv[at(t, 0) + i] += ds * qkv[at(j, 1) + i];
            dqkv[at(j, 1) + i] += ds * qkv[at(t, 0) + i];
          }
        }
      }
}

double ref_ce_loss(const double* x, int V, int target) {
  double m = x[0];
  for (int i = 1; i < V; ++i) m = std::max(m, x[i]);
  double s = 0.0;
  for (int i = 0; i < V; ++i) s += std::exp(x[i] - m);
  return m + std::log(s) - x[target];
}

// ------------------------------------------------------------------- runtime

// The CUDA kernels' module is loaded by the first question about GPUs, not
// before (a CPU run never loads it), and loads whole, with or without a GPU,
// into a program of the kernel floor alone: every symbol it takes from the
// program resolves (RTLD_NOW).
TEST(CudaModule, LoadsOnFirstUse) {
  if (!k::cuda_built()) {
    EXPECT_EQ(k::gpu_count(), 0);
    EXPECT_EQ(k::describe_gpus(), "this build has no CUDA backend");
    return;
  }
  EXPECT_EQ(strata::core::module_path("cuda"), "");
  const int gpus = k::gpu_count();
  EXPECT_GE(gpus, 0);
  const std::string path = strata::core::module_path("cuda");
  EXPECT_NE(path.find("libstrata_cuda.so"), std::string::npos) << path;
  const std::string gpu = k::describe_gpus();
  if (gpus == 0) {
    EXPECT_EQ(gpu.rfind("no ", 0), 0u) << gpu;  // "no usable CUDA device: ..." or "no CUDA device"
  } else {
    EXPECT_NE(gpu.find("CUDA device(s)"), std::string::npos) << gpu;
  }
}

// The Kokkos kernels' module likewise: not loaded until the kokkos device
// is asked for, then whole, reporting Kokkos' default execution space.
TEST(KokkosModule, LoadsOnFirstUse) {
  if (!k::kokkos_built()) {
    EXPECT_EQ(k::device_count(k::Device::kokkos), 0);
    EXPECT_EQ(k::describe_devices(k::Device::kokkos), "this build has no kokkos backend");
    EXPECT_EQ(k::built_devices().find("kokkos"), std::string::npos);
    return;
  }
  EXPECT_EQ(strata::core::module_path("kokkos"), "");
  EXPECT_NE(k::built_devices().find("kokkos"), std::string::npos) << k::built_devices();
  EXPECT_GE(k::device_count(k::Device::kokkos), 1);
  const std::string path = strata::core::module_path("kokkos");
  EXPECT_NE(path.find("libstrata_kokkos.so"), std::string::npos) << path;
  k::use_device(k::Device::kokkos);
  EXPECT_EQ(std::string(k::backend_name()).rfind("kokkos/", 0), 0u) << k::backend_name();
  EXPECT_NE(k::library_versions().find("Kokkos "), std::string::npos) << k::library_versions();
  // A buffer of the device, written and read back through the interface.
  float* d = static_cast<float*>(k::device_alloc(4 * sizeof(float)));
  const float in[4] = {1, 2, 3, 4};
  float out[4] = {};
  k::copy_bytes(d, in, sizeof in);
  k::scale_inplace(d, 2.0f, 4);
  k::copy_bytes(out, d, sizeof out);
  k::device_free(d);
  k::use_device(k::Device::cpu);
  EXPECT_EQ(out[3], 8.0f);
  EXPECT_STREQ(k::backend_name(), "cpu/openblas-openmp");
}

TEST(Runtime, ThreadsAndName) {
  const int before = k::num_threads();
  k::set_num_threads(3);
  EXPECT_EQ(k::num_threads(), 3);
  k::set_num_threads(1);
  EXPECT_EQ(k::num_threads(), 1);
  k::set_num_threads(before);
  EXPECT_EQ(k::num_threads(), before);
  EXPECT_STREQ(k::backend_name(), "cpu/openblas-openmp");
}

// -------------------------------------------------------------------- matmul

TEST(Matmul, AllTransposesAgainstDouble) {
  SEEDED_RNG(rng);
  const int M = 13, N = 17, K = 19;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE(::testing::Message() << "trans_a " << ta << " trans_b " << tb);
      // Stored shapes, each with a leading dimension larger than needed.
      const int a_rows = ta ? K : M, a_cols = ta ? M : K, lda = a_cols + 3;
      const int b_rows = tb ? N : K, b_cols = tb ? K : N, ldb = b_cols + 2;
      const int ldc = N + 5;
      Vec A = uniform(rng, std::size_t(a_rows) * lda), B = uniform(rng, std::size_t(b_rows) * ldb);
      Vec C = uniform(rng, std::size_t(M) * ldc);
      const float alpha = 0.7f, beta = -1.3f;
      DVec Cref = to_double(C);
      ref_matmul(ta, tb, M, N, K, alpha, to_double(A), lda, to_double(B), ldb, beta, Cref, ldc);
      k::matmul(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
      // The padding columns of C are compared too: they must be untouched.
      EXPECT_TRUE(all_close(C, Cref));
    }
  }
}

TEST(Matmul, BetaZeroIgnoresGarbageInC) {
  // Kernels pass uninitialised scratch as C with beta = 0.
  SEEDED_RNG(rng);
  const int M = 9, N = 11, K = 5;
  Vec A = uniform(rng, M * K), B = uniform(rng, K * N);
  Vec C(M * N, std::numeric_limits<float>::quiet_NaN());
  DVec Cref(M * N, 0.0);
  ref_matmul(false, false, M, N, K, 1.0, to_double(A), K, to_double(B), N, 0.0, Cref, N);
  k::matmul(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  EXPECT_TRUE(all_close(C, Cref));
}

TEST(Matmul, StridedBatchedBothThreadingPaths) {
  SEEDED_RNG(rng);
  const int M = 7, N = 10, K = 6, batch = 5;
  const int lda = M + 1, ldb = K + 2, ldc = N + 3;  // A stored transposed (K x M), B transposed (N x K)
  const std::int64_t sa = std::int64_t(K) * lda + 4, sb = std::int64_t(N) * ldb + 1, sc = std::int64_t(M) * ldc + 2;
  Vec A = uniform(rng, sa * batch), B = uniform(rng, sb * batch), C0 = uniform(rng, sc * batch);
  DVec Cref = to_double(C0);
  const DVec Ad = to_double(A), Bd = to_double(B);
  for (int i = 0; i < batch; ++i) {
    DVec Ai(Ad.begin() + i * sa, Ad.begin() + (i + 1) * sa), Bi(Bd.begin() + i * sb, Bd.begin() + (i + 1) * sb);
    DVec Ci(Cref.begin() + i * sc, Cref.begin() + (i + 1) * sc);
    ref_matmul(true, true, M, N, K, 0.5, Ai, lda, Bi, ldb, 2.0, Ci, ldc);
    std::copy(Ci.begin(), Ci.end(), Cref.begin() + i * sc);
  }
  const int before = k::num_threads();
  for (int threads : {1, 2, 3}) {  // 1: serial loop; 2, 3: parallel over the batch
    SCOPED_TRACE(::testing::Message() << "threads " << threads);
    k::set_num_threads(threads);
    Vec C = C0;
    k::matmul_strided_batched(true, true, M, N, K, 0.5f, A.data(), lda, sa, B.data(), ldb, sb, 2.0f, C.data(), ldc, sc,
                              batch);
    EXPECT_TRUE(all_close(C, Cref));
  }
  k::set_num_threads(before);
}

// ---------------------------------------------------------------------- bias

TEST(Bias, ForwardBackwardAgainstDoubleAndFiniteDifferences) {
  SEEDED_RNG(rng);
  const int N = 14, C = 12;
  Vec x = uniform(rng, N * C), bias = uniform(rng, C), R = uniform(rng, N * C);
  Vec out = x;
  k::bias_add(out.data(), bias.data(), N, C);
  DVec want(N * C);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) want[n * C + c] = double(x[n * C + c]) + bias[c];
  EXPECT_TRUE(all_close(out, want));

  // L = sum((x + bias) * R): dbias = column sums of R.
  DVec dref(C, 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) dref[c] += R[n * C + c];
  Vec dbias(C, 0.0f);
  k::bias_backward(dbias.data(), R.data(), N, C);
  EXPECT_TRUE(all_close(dbias, dref));
  DVec xd = to_double(x), bd = to_double(bias), Rd = to_double(R);
  auto loss = [&] {
    double s = 0.0;
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) s += (xd[n * C + c] + bd[c]) * Rd[n * C + c];
    return s;
  };
  check_fd("dbias", bd, dbias, dref, loss, fd_indices(rng, C));

  // Accumulates: twice onto a non-zero start.
  Vec g0 = uniform(rng, C), g = g0;
  k::bias_backward(g.data(), R.data(), N, C);
  k::bias_backward(g.data(), R.data(), N, C);
  DVec want2(C);
  for (int c = 0; c < C; ++c) want2[c] = g0[c] + 2 * dref[c];
  EXPECT_TRUE(all_close(g, want2));
}

TEST(Bias, BackwardLargeEnoughForThreads) {
  SEEDED_RNG(rng);
  const int N = 517, C = 131;  // past the threshold for the column-split parallel path
  const int before = k::num_threads();
  k::set_num_threads(3);
  Vec R = uniform(rng, std::size_t(N) * C), dbias(C, 0.0f);
  k::bias_backward(dbias.data(), R.data(), N, C);
  k::set_num_threads(before);
  DVec dref(C, 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) dref[c] += R[std::size_t(n) * C + c];
  // Double accumulation: the only error is the final rounding to float.
  EXPECT_TRUE(all_close(dbias, dref, 1e-7, 1e-7));
}

// ---------------------------------------------------------------- layernorm

void layernorm_case(std::mt19937& rng, int N, int C, bool with_fd) {
  const float eps = 1e-5f;
  // Offset and scaled rows: a non-zero mean is where a one-pass variance fails.
  Vec x = uniform(rng, std::size_t(N) * C, 1.0f, 3.0f), w = uniform(rng, C, 0.5f, 1.5f), b = uniform(rng, C);
  Vec R = uniform(rng, std::size_t(N) * C);
  Vec out(x.size()), mean(N), rstd(N);
  k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, eps);
  DVec xd = to_double(x), wd = to_double(w), bd = to_double(b), Rd = to_double(R);
  DVec oref(x.size()), mref(N), sref(N);
  ref_layernorm_forward(oref, mref, sref, xd, wd, bd, N, C, eps);
  EXPECT_TRUE(all_close(out, oref));
  EXPECT_TRUE(all_close(mean, mref));
  EXPECT_TRUE(all_close(rstd, sref));

  DVec dxr(x.size(), 0.0), dwr(C, 0.0), dbr(C, 0.0);
  ref_layernorm_backward(dxr, dwr, dbr, Rd, xd, wd, N, C, eps);
  Vec dx(x.size(), 0.0f), dw(C, 0.0f), db(C, 0.0f);
  k::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  EXPECT_TRUE(all_close(dx, dxr));
  EXPECT_TRUE(all_close(dw, dwr));
  EXPECT_TRUE(all_close(db, dbr));

  if (with_fd) {
    auto loss = [&] {
      DVec o(xd.size()), m(N), s(N);
      ref_layernorm_forward(o, m, s, xd, wd, bd, N, C, eps);
      return dot(o, Rd);
    };
    check_fd("dinp", xd, dx, dxr, loss, fd_indices(rng, xd.size()));
    check_fd("dweight", wd, dw, dwr, loss, fd_indices(rng, wd.size()));
    check_fd("dbias", bd, db, dbr, loss, fd_indices(rng, bd.size()));
  }

  // Accumulates into all three outputs.
  Vec gx = uniform(rng, x.size()), gw = uniform(rng, C), gb = uniform(rng, C);
  DVec wx(x.size()), ww(C), wb(C);
  for (std::size_t i = 0; i < x.size(); ++i) wx[i] = gx[i] + 2 * dxr[i];
  for (int c = 0; c < C; ++c) ww[c] = gw[c] + 2 * dwr[c], wb[c] = gb[c] + 2 * dbr[c];
  for (int rep = 0; rep < 2; ++rep)
    k::layernorm_backward(gx.data(), gw.data(), gb.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                          C);
  EXPECT_TRUE(all_close(gx, wx));
  EXPECT_TRUE(all_close(gw, ww));
  EXPECT_TRUE(all_close(gb, wb));
}

TEST(LayerNorm, AgainstDoubleAndFiniteDifferences) {
  SEEDED_RNG(rng);
  layernorm_case(rng, 14, 12, true);
}

TEST(LayerNorm, LargeEnoughForThreads) {
  SEEDED_RNG(rng);
  const int before = k::num_threads();
  k::set_num_threads(3);
  layernorm_case(rng, 331, 101, false);
  k::set_num_threads(before);
}

// --------------------------------------------------------------------- GELU

void gelu_case(std::mt19937& rng, std::size_t n, bool with_fd) {
  // Wide enough to reach both tails, plus exact zeros.
  Vec x = uniform(rng, n, -7.0f, 7.0f), R = uniform(rng, n);
  x[0] = 0.0f;
  x[1] = -12.0f;  // far tail: exp(-2u) saturates
  x[2] = 12.0f;
  Vec y(n);
  k::gelu_forward(y.data(), x.data(), std::int64_t(n));
  DVec yref(n), gref(n);
  for (std::size_t i = 0; i < n; ++i) yref[i] = ref_gelu(x[i]), gref[i] = ref_gelu_grad(x[i]) * R[i];
  EXPECT_TRUE(all_close(y, yref));

  Vec dx(n, 0.0f);
  k::gelu_backward(dx.data(), x.data(), R.data(), std::int64_t(n));
  EXPECT_TRUE(all_close(dx, gref));

  if (with_fd) {
    DVec xd = to_double(x), Rd = to_double(R);
    auto loss = [&] {
      double s = 0.0;
      for (std::size_t i = 0; i < n; ++i) s += ref_gelu(xd[i]) * Rd[i];
      return s;
    };
    check_fd("dinp", xd, dx, gref, loss, fd_indices(rng, n));
  }

  Vec g0 = uniform(rng, n), g = g0;
  k::gelu_backward(g.data(), x.data(), R.data(), std::int64_t(n));
  k::gelu_backward(g.data(), x.data(), R.data(), std::int64_t(n));
  DVec want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = g0[i] + 2 * gref[i];
  EXPECT_TRUE(all_close(g, want));
}

TEST(Gelu, ReferenceMatchesTanhForm) {
  const double s = std::sqrt(2.0 / M_PI);
  for (double x = -3.0; x <= 3.0; x += 0.01) {
    const double t = std::tanh(s * (x + 0.044715 * x * x * x));
    EXPECT_NEAR(ref_gelu(x), 0.5 * x * (1.0 + t), 1e-14);
    const double grad = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
    EXPECT_NEAR(ref_gelu_grad(x), grad, 1e-14);
  }
}

TEST(Gelu, AgainstDoubleAndFiniteDifferences) {
  SEEDED_RNG(rng);
  gelu_case(rng, 301, true);
}

TEST(Gelu, LargeEnoughForThreads) {
  SEEDED_RNG(rng);
  const int before = k::num_threads();
  k::set_num_threads(3);
  gelu_case(rng, 70001, false);
  k::set_num_threads(before);
}

TEST(Gelu, RelativeAccuracyInTheNegativeTail) {
  // The floor of all_close would hide errors in tiny outputs; the tail of
  // GELU (down to about -9, where exp(-2u) stays below its clamp) must be
  // right relative to its own size.
  Vec x;
  for (float v = -9.0f; v <= 0.0f; v += 0.0625f) x.push_back(v);
  Vec y(x.size()), d(x.size(), 0.0f), ones(x.size(), 1.0f);
  k::gelu_forward(y.data(), x.data(), std::int64_t(x.size()));
  k::gelu_backward(d.data(), x.data(), ones.data(), std::int64_t(x.size()));
  DVec yref(x.size()), dref(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) yref[i] = ref_gelu(x[i]), dref[i] = ref_gelu_grad(x[i]);
  EXPECT_TRUE(all_close(y, yref, kRtol, 0.0));
  // The derivative crosses zero near x = -0.75; allow the floor there only.
  EXPECT_TRUE(all_close(d, dref, kRtol, 1e-7));
}

// -------------------------------------------------------------- elementwise

TEST(Elementwise, ResidualAddScaleFillAgainstDouble) {
  SEEDED_RNG(rng);
  for (std::size_t n : {std::size_t(37), std::size_t(70001)}) {  // below and above the threads threshold
    SCOPED_TRACE(::testing::Message() << "n " << n);
    Vec a = uniform(rng, n), b = uniform(rng, n);
    DVec sum(n), scaled(n);
    for (std::size_t i = 0; i < n; ++i) sum[i] = double(a[i]) + b[i], scaled[i] = double(a[i]) * -0.37;

    Vec out(n);
    k::residual_forward(out.data(), a.data(), b.data(), std::int64_t(n));
    EXPECT_TRUE(all_close(out, sum));
    Vec alias_a = a, alias_b = b;  // out may be a or b
    k::residual_forward(alias_a.data(), alias_a.data(), b.data(), std::int64_t(n));
    k::residual_forward(alias_b.data(), a.data(), alias_b.data(), std::int64_t(n));
    EXPECT_TRUE(all_close(alias_a, sum));
    EXPECT_TRUE(all_close(alias_b, sum));

    Vec y = a;
    k::add_inplace(y.data(), b.data(), std::int64_t(n));
    EXPECT_TRUE(all_close(y, sum));

    Vec s = a;
    k::scale_inplace(s.data(), -0.37f, std::int64_t(n));
    EXPECT_TRUE(all_close(s, scaled));

    Vec z = a;
    k::fill_zero(z.data(), std::int64_t(n));
    EXPECT_TRUE(std::all_of(z.begin(), z.end(), [](float v) { return v == 0.0f; }));
  }
}

TEST(Elementwise, SumSquaresInDouble) {
  SEEDED_RNG(rng);
  for (std::size_t n : {std::size_t(37), std::size_t(100003)}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    Vec x = uniform(rng, n, -3.0f, 3.0f);
    x[n / 2] = 1e-20f;  // squares below float range must still count
    double want = 0.0;
    for (float v : x) want += double(v) * double(v);
    // Only the order of a double summation differs: ~n * 2^-53.
    EXPECT_NEAR(k::sum_squares(x.data(), std::int64_t(n)), want, 1e-12 * want);
  }
  // 1e-30 squared underflows in float but not in double.
  Vec tiny(1000, 1e-30f);
  EXPECT_NEAR(k::sum_squares(tiny.data(), 1000), 1000 * double(1e-30f) * double(1e-30f), 1e-72);
}

// ---------------------------------------------------------------- attention

// NKV 0: multi-head (NKV = NH).
struct AttentionShape {
  int B, T, C, NH, NKV = 0;
  int kv_heads() const { return NKV > 0 ? NKV : NH; }
  int W() const { return C + 2 * C / NH * kv_heads(); }  // a qkv row
};

void attention_case(std::mt19937& rng, AttentionShape s, bool fd_all) {
  const int B = s.B, T = s.T, C = s.C, NH = s.NH, NKV = s.kv_heads();
  SCOPED_TRACE(::testing::Message() << "B " << B << " T " << T << " C " << C << " NH " << NH << " NKV " << NKV);
  const std::size_t nqkv = std::size_t(B) * T * s.W(), nout = std::size_t(B) * T * C,
                    nprobs = std::size_t(B) * NH * T * T;
  Vec qkv = uniform(rng, nqkv, -1.5f, 1.5f), R = uniform(rng, nout);
  // Scratch starts as garbage: the kernels must overwrite it.
  Vec out(nout, std::numeric_limits<float>::quiet_NaN()), probs(nprobs, std::numeric_limits<float>::quiet_NaN());
  k::attention_forward(out.data(), probs.data(), qkv.data(), B, T, C, NH, NKV);
  DVec qd = to_double(qkv), Rd = to_double(R);
  DVec oref(nout), pref(nprobs);
  ref_attention_forward(oref, pref, qd, B, T, C, NH, NKV);
  EXPECT_TRUE(all_close(out, oref));
  EXPECT_TRUE(all_close(probs, pref));

  DVec dref(nqkv, 0.0);
  ref_attention_backward(dref, Rd, qd, B, T, C, NH, NKV);
  Vec dqkv(nqkv, 0.0f), scratch(nprobs, std::numeric_limits<float>::quiet_NaN());
  k::attention_backward(dqkv.data(), scratch.data(), R.data(), qkv.data(), out.data(), probs.data(), B, T, C, NH, NKV);
  EXPECT_TRUE(all_close(dqkv, dref));

  auto loss = [&] {
    DVec o(nout), p(nprobs);
    ref_attention_forward(o, p, qd, B, T, C, NH, NKV);
    return dot(o, Rd);
  };
  check_fd("dqkv", qd, dqkv, dref, loss, fd_indices(rng, nqkv, !fd_all));

  Vec g0 = uniform(rng, nqkv), g = g0;
  for (int rep = 0; rep < 2; ++rep)
    k::attention_backward(g.data(), scratch.data(), R.data(), qkv.data(), out.data(), probs.data(), B, T, C, NH, NKV);
  DVec want(nqkv);
  for (std::size_t i = 0; i < nqkv; ++i) want[i] = g0[i] + 2 * dref[i];
  EXPECT_TRUE(all_close(g, want));
}

// Ring attention's blocks (context parallelism): the sequence cut into
// query blocks and key blocks (uneven, one key block larger than a 64-row
// block), every query block run against every key block in a shuffled
// order, the first overwriting and the rest merging; the rows' outputs and
// log-sum-exp equal the whole-sequence double reference, and the block
// backward passes, summed, its gradient. The key blocks travel as a ring
// passes them on: [B, Tk, 2 KVC], keys then values.
void ring_blocks_case(std::mt19937& rng, AttentionShape s, const std::vector<int>& cuts) {
  const int B = s.B, T = s.T, C = s.C, NH = s.NH, NKV = s.kv_heads(), hs = C / NH, KVC = NKV * hs, W = s.W();
  SCOPED_TRACE(::testing::Message() << "B " << B << " T " << T << " C " << C << " NH " << NH << " NKV " << NKV);
  const std::size_t nqkv = std::size_t(B) * T * W, nout = std::size_t(B) * T * C;
  Vec qkv = uniform(rng, nqkv, -1.5f, 1.5f), R = uniform(rng, nout);
  DVec qd = to_double(qkv), Rd = to_double(R);
  DVec oref(nout), pref(std::size_t(B) * NH * T * T);
  ref_attention_forward(oref, pref, qd, B, T, C, NH, NKV);
  // The reference log-sum-exp of each row, from the scores.
  DVec lref(std::size_t(B) * NH * T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double m = -1e300, sum = 0;
        std::vector<double> sc(std::size_t(t) + 1);
        for (int j = 0; j <= t; ++j) {
          double x = 0;
          for (int i = 0; i < hs; ++i)
            x += qd[(std::size_t(b) * T + t) * W + h * hs + i] *
                 qd[(std::size_t(b) * T + j) * W + C + (h / (NH / NKV)) * hs + i];
          sc[std::size_t(j)] = x / std::sqrt(double(hs));
          m = std::max(m, sc[std::size_t(j)]);
        }
        for (double x : sc) sum += std::exp(x - m);
        lref[(std::size_t(b) * NH + h) * T + t] = m + std::log(sum);
      }
  // kv [B, T, 2 KVC]: the keys and values of the whole sequence.
  Vec kv(std::size_t(B) * T * 2 * KVC);
  k::copy_rows(kv.data(), 2 * KVC, qkv.data() + C, W, std::int64_t(B) * T, 2 * KVC, false);
  std::vector<std::pair<int, int>> blocks;  // [begin, end) of each cut
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) blocks.push_back({cuts[i], cuts[i + 1]});
  std::vector<std::size_t> order(blocks.size());
  std::iota(order.begin(), order.end(), 0);
  // Garbage first: the first block of every row must overwrite it.
  Vec out(nout, std::numeric_limits<float>::quiet_NaN()), lse(std::size_t(B) * NH * T, 123.0f);
  for (const auto& [q0, q1] : blocks) {
    std::shuffle(order.begin(), order.end(), rng);
    bool first = true;
    for (std::size_t o : order) {
      const auto [k0, k1] = blocks[o];
      k::attention_block_forward(out.data() + std::size_t(q0) * C, lse.data() + q0, qkv.data() + std::size_t(q0) * W,
                                 kv.data() + std::size_t(k0) * 2 * KVC, B, q1 - q0, k1 - k0, C, NH, NKV, T, T, q0,
                                 k0, !first);
      first = false;
    }
  }
  EXPECT_TRUE(all_close(out, oref));
  EXPECT_TRUE(all_close(lse, lref));

  DVec dref(nqkv, 0.0);
  ref_attention_backward(dref, Rd, qd, B, T, C, NH, NKV);
  Vec dq(nqkv, 0.0f), dkv(std::size_t(B) * T * 2 * KVC, 0.0f);
  for (const auto& [q0, q1] : blocks)
    for (const auto& [k0, k1] : blocks)
      k::attention_block_backward(dq.data() + std::size_t(q0) * W, dkv.data() + std::size_t(k0) * 2 * KVC,
                                  R.data() + std::size_t(q0) * C, qkv.data() + std::size_t(q0) * W,
                                  kv.data() + std::size_t(k0) * 2 * KVC, out.data() + std::size_t(q0) * C,
                                  lse.data() + q0, B, q1 - q0, k1 - k0, C, NH, NKV, T, T, q0, k0);
  // dk and dv back into their qkv columns (added: dq holds the q columns).
  k::copy_rows(dq.data() + C, W, dkv.data(), 2 * KVC, std::int64_t(B) * T, 2 * KVC, true);
  EXPECT_TRUE(all_close(dq, dref));
}

TEST(Attention, RingBlocksMergeToTheWholeSequence) {
  SEEDED_RNG(rng);
  ring_blocks_case(rng, {2, 12, 12, 3}, {0, 3, 5, 9, 12});          // uneven blocks, hs 4
  ring_blocks_case(rng, {1, 150, 8, 2}, {0, 10, 85, 150});          // a 75-row block: two row blocks
  ring_blocks_case(rng, {2, 12, 16, 4, 2}, {0, 5, 12});              // grouped-query: 2 heads per key-value head
  ring_blocks_case(rng, {1, 70, 12, 3, 1}, {0, 30, 70});             // multi-query
}

TEST(Elementwise, CopyRowsSetsAndAdds) {
  SEEDED_RNG(rng);
  const Vec src = uniform(rng, 5 * 7), base = uniform(rng, 5 * 9);
  Vec dst = base;
  k::copy_rows(dst.data() + 1, 9, src.data() + 2, 7, 5, 4, false);
  Vec added = dst;
  k::copy_rows(added.data() + 1, 9, src.data() + 2, 7, 5, 4, true);
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 9; ++c) {
      const bool in = c >= 1 && c < 5;
      const float x = in ? src[std::size_t(r) * 7 + 2 + c - 1] : 0.0f;
      EXPECT_EQ(dst[std::size_t(r) * 9 + c], in ? x : base[std::size_t(r) * 9 + c]);
      EXPECT_EQ(added[std::size_t(r) * 9 + c], in ? x + x : base[std::size_t(r) * 9 + c]);
    }
}

TEST(Attention, SmallAgainstDoubleAndFiniteDifferences) {
  SEEDED_RNG(rng);
  attention_case(rng, {2, 7, 12, 3}, true);  // hs = 4, one row block
}

TEST(Attention, SeveralRowBlocks) {
  SEEDED_RNG(rng);
  attention_case(rng, {2, 67, 10, 2}, false);  // T past one block of 64 rows, hs = 5
}

// Grouped-query attention: a key-value head's gradient sums over the query
// heads of its group.
TEST(Attention, GroupedQueryAgainstDoubleAndFiniteDifferences) {
  SEEDED_RNG(rng);
  attention_case(rng, {2, 7, 16, 4, 2}, true);   // two query heads per key-value head
  attention_case(rng, {1, 9, 12, 3, 1}, true);   // multi-query
  attention_case(rng, {3, 70, 24, 6, 3}, false);  // several row blocks, threads over (b, kv head)
}

TEST(Attention, OneHeadRunsSerially) {
  SEEDED_RNG(rng);
  attention_case(rng, {1, 9, 6, 1}, true);  // B * NH = 1 < threads: the other threading path
}

TEST(Attention, CausalMask) {
  SEEDED_RNG(rng);
  const int B = 2, T = 9, C = 12, NH = 3, C3 = 3 * C;
  Vec qkv = uniform(rng, std::size_t(B) * T * C3, -1.5f, 1.5f);
  Vec out(std::size_t(B) * T * C), probs(std::size_t(B) * NH * T * T);
  k::attention_forward(out.data(), probs.data(), qkv.data(), B, T, C, NH, NH);
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < T; ++t) {
      double row = 0.0;
      for (int j = 0; j < T; ++j) {
        const float p = probs[(std::size_t(bh) * T + t) * T + j];
        if (j > t) {
          EXPECT_EQ(p, 0.0f) << "above the diagonal at " << t << ", " << j;
        }
        row += p;
      }
      EXPECT_NEAR(row, 1.0, 1e-6);
    }
  // Changing q, k and v of every position after t0 leaves rows 0..t0 bitwise unchanged.
  for (int t0 = 0; t0 < T - 1; ++t0) {
    Vec changed = qkv;
    std::uniform_real_distribution<float> d(-5.0f, 5.0f);
    for (int b = 0; b < B; ++b)
      for (int t = t0 + 1; t < T; ++t)
        for (int c = 0; c < C3; ++c) changed[(std::size_t(b) * T + t) * C3 + c] = d(rng);
    Vec out2(out.size()), probs2(probs.size());
    k::attention_forward(out2.data(), probs2.data(), changed.data(), B, T, C, NH, NH);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t <= t0; ++t)
        for (int c = 0; c < C; ++c) {
          const std::size_t i = (std::size_t(b) * T + t) * C + c;
          ASSERT_EQ(out[i], out2[i]) << "out at b " << b << " t " << t << " depends on positions > " << t0;
        }
  }
}

// ---------------------------------------------------------------- RMSNorm

void ref_rmsnorm_forward(DVec& out, DVec& rstd, const DVec& x, const DVec& w, int N, int C, double eps) {
  for (int n = 0; n < N; ++n) {
    const double* xr = &x[std::size_t(n) * C];
    double ms = 0.0;
    for (int c = 0; c < C; ++c) ms += xr[c] * xr[c];
    const double s = 1.0 / std::sqrt(ms / C + eps);
    for (int c = 0; c < C; ++c) out[std::size_t(n) * C + c] = xr[c] * s * w[c];
    rstd[n] = s;
  }
}

void ref_rmsnorm_backward(DVec& dx, DVec& dw, const DVec& dy, const DVec& x, const DVec& w, int N, int C, double eps) {
  DVec out(x.size()), rstd(N);
  ref_rmsnorm_forward(out, rstd, x, w, N, C, eps);
  for (int n = 0; n < N; ++n) {
    const std::size_t o = std::size_t(n) * C;
    double a = 0.0;
    for (int c = 0; c < C; ++c) {
      a += dy[o + c] * w[c] * x[o + c] * rstd[n];
      dw[c] += dy[o + c] * x[o + c] * rstd[n];
    }
    a /= C;
    for (int c = 0; c < C; ++c) dx[o + c] += (dy[o + c] * w[c] - x[o + c] * rstd[n] * a) * rstd[n];
  }
}

void rmsnorm_case(std::mt19937& rng, int N, int C, bool with_fd) {
  const float eps = 1e-5f;
  Vec x = uniform(rng, std::size_t(N) * C, -2.0f, 3.0f), w = uniform(rng, C, 0.5f, 1.5f);
  Vec R = uniform(rng, std::size_t(N) * C);
  Vec out(x.size()), rstd(N);
  k::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  DVec xd = to_double(x), wd = to_double(w), Rd = to_double(R);
  DVec oref(x.size()), sref(N);
  ref_rmsnorm_forward(oref, sref, xd, wd, N, C, eps);
  EXPECT_TRUE(all_close(out, oref));
  EXPECT_TRUE(all_close(rstd, sref));

  DVec dxr(x.size(), 0.0), dwr(C, 0.0);
  ref_rmsnorm_backward(dxr, dwr, Rd, xd, wd, N, C, eps);
  Vec dx(x.size(), 0.0f), dw(C, 0.0f);
  k::rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  EXPECT_TRUE(all_close(dx, dxr));
  EXPECT_TRUE(all_close(dw, dwr));
  if (with_fd) {
    auto loss = [&] {
      DVec o(xd.size()), st(N);
      ref_rmsnorm_forward(o, st, xd, wd, N, C, eps);
      return dot(o, Rd);
    };
    check_fd("dinp", xd, dx, dxr, loss, fd_indices(rng, xd.size()));
    check_fd("dweight", wd, dw, dwr, loss, fd_indices(rng, wd.size()));
  }
  // Accumulates into both outputs.
  Vec gx = uniform(rng, x.size()), gw = uniform(rng, C);
  DVec wx(x.size()), ww(C);
  for (std::size_t i = 0; i < x.size(); ++i) wx[i] = gx[i] + 2 * dxr[i];
  for (int c = 0; c < C; ++c) ww[c] = gw[c] + 2 * dwr[c];
  for (int rep = 0; rep < 2; ++rep)
    k::rmsnorm_backward(gx.data(), gw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  EXPECT_TRUE(all_close(gx, wx));
  EXPECT_TRUE(all_close(gw, ww));
}

TEST(RmsNorm, AgainstDoubleAndFiniteDifferences) {
  SEEDED_RNG(rng);
  rmsnorm_case(rng, 5, 24, true);
}

TEST(RmsNorm, LargeEnoughForThreads) {
  SEEDED_RNG(rng);
  rmsnorm_case(rng, 300, 257, false);
}

// ---------------------------------------------------------------- RoPE

// Rows (b, t) of ld doubles, `heads` head vectors of hs from each row's
// start turned by (pos0 + t) theta^(-2i / hs), pair (2i, 2i + 1); sign -1
// turns back.
void ref_rope(DVec& x, int B, int T, int ld, int heads, int hs, int pos0, double theta, double sign) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < hs / 2; ++i) {
          const double a = (pos0 + t) * std::pow(theta, -2.0 * i / hs), c = std::cos(a), sn = sign * std::sin(a);
          double* v = &x[(std::size_t(b) * T + t) * ld + std::size_t(h) * hs + 2 * i];
          const double x0 = v[0], x1 = v[1];
          v[0] = x0 * c - x1 * sn;
          v[1] = x0 * sn + x1 * c;
        }
}

// In place on the first `heads` heads of rows wider than them (a qkv row's
// q and k heads, its v untouched), at an offset position (a context-parallel
// rank's chunk), against double; the backward is the turn's transpose
// (finite differences of <rope(x), R>), and turning forward then back is
// the identity.
TEST(Rope, AgainstDoubleAndFiniteDifferences) {
  SEEDED_RNG(rng);
  const int B = 2, T = 5, hs = 8, heads = 3, ld = heads * hs + 2 * hs, pos0 = 7;
  const float theta = 500000.0f;
  const Vec x0 = uniform(rng, std::size_t(B) * T * ld);
  Vec x = x0;
  k::rope_forward(x.data(), B, T, ld, heads, hs, pos0, theta);
  DVec ref = to_double(x0);
  ref_rope(ref, B, T, ld, heads, hs, pos0, theta, 1.0);
  EXPECT_TRUE(all_close(x, ref));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = heads * hs; c < ld; ++c) {
        const std::size_t i = (std::size_t(b) * T + t) * ld + c;
        ASSERT_EQ(x[i], x0[i]) << "a column past the heads changed";
      }
  // Backward: d<rope(x), R>/dx = rope_backward(R).
  const Vec R = uniform(rng, x0.size());
  Vec g = R;
  k::rope_backward(g.data(), B, T, ld, heads, hs, pos0, theta);
  DVec gref = to_double(R);
  ref_rope(gref, B, T, ld, heads, hs, pos0, theta, -1.0);
  EXPECT_TRUE(all_close(g, gref));
  DVec xd = to_double(x0);
  const DVec Rd = to_double(R);
  auto loss = [&] {
    DVec y = xd;
    ref_rope(y, B, T, ld, heads, hs, pos0, theta, 1.0);
    return dot(y, Rd);
  };
  check_fd("dx", xd, g, gref, loss, fd_indices(rng, xd.size(), true));
  // Forward then back: x again, within rounding.
  k::rope_backward(x.data(), B, T, ld, heads, hs, pos0, theta);
  EXPECT_TRUE(all_close(x, to_double(x0), 1e-6, 1e-6));
}

// Large positions (a 128k context, Llama 3's theta): the angles are taken in
// double, so a pair turns exactly as the double reference turns it.
TEST(Rope, LargePositionsAgainstDouble) {
  SEEDED_RNG(rng);
  const int B = 1, T = 3, hs = 128, heads = 2, ld = heads * hs;
  const Vec x0 = uniform(rng, std::size_t(B) * T * ld);
  Vec x = x0;
  k::rope_forward(x.data(), B, T, ld, heads, hs, 131069, 500000.0f);
  DVec ref = to_double(x0);
  ref_rope(ref, B, T, ld, heads, hs, 131069, 500000.0, 1.0);
  EXPECT_TRUE(all_close(x, ref));
}

// ---------------------------------------------------------------- SwiGLU

double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }

void ref_swiglu_forward(DVec& out, const DVec& in, int N, int F) {
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < F; ++i)
      out[std::size_t(n) * F + i] = ref_silu(in[std::size_t(n) * 2 * F + i]) * in[std::size_t(n) * 2 * F + F + i];
}

void swiglu_case(std::mt19937& rng, int N, int F, bool with_fd) {
  const Vec in = uniform(rng, std::size_t(N) * 2 * F, -6.0f, 6.0f), R = uniform(rng, std::size_t(N) * F);
  Vec out(std::size_t(N) * F);
  k::swiglu_forward(out.data(), in.data(), N, F);
  DVec ind = to_double(in), Rd = to_double(R), oref(out.size());
  ref_swiglu_forward(oref, ind, N, F);
  EXPECT_TRUE(all_close(out, oref));
  DVec dref(in.size(), 0.0);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < F; ++i) {
      const std::size_t gi = std::size_t(n) * 2 * F + i, o = std::size_t(n) * F + i;
      const double g = ind[gi], u = ind[gi + F], sig = 1.0 / (1.0 + std::exp(-g));
      dref[gi] += Rd[o] * u * sig * (1.0 + g * (1.0 - sig));
      dref[gi + F] += Rd[o] * ref_silu(g);
    }
  Vec g0 = uniform(rng, in.size()), d = g0;
  k::swiglu_backward(d.data(), in.data(), R.data(), N, F);
  DVec want(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) want[i] = g0[i] + dref[i];
  EXPECT_TRUE(all_close(d, want)) << "accumulated into a nonzero gradient";
  if (with_fd) {
    Vec d1(in.size(), 0.0f);
    k::swiglu_backward(d1.data(), in.data(), R.data(), N, F);
    auto loss = [&] {
      DVec o(out.size());
      ref_swiglu_forward(o, ind, N, F);
      return dot(o, Rd);
    };
    check_fd("dinp", ind, d1, dref, loss, fd_indices(rng, ind.size()));
  }
}

TEST(SwiGlu, AgainstDoubleAndFiniteDifferences) {
  SEEDED_RNG(rng);
  swiglu_case(rng, 4, 9, true);
}

TEST(SwiGlu, LargeEnoughForThreads) {
  SEEDED_RNG(rng);
  swiglu_case(rng, 257, 300, false);
}

// ---------------------------------------------------------------- embedding

void embedding_case(std::mt19937& rng, int B, int T, int C, int V, bool with_fd) {
  IVec tokens = randint(rng, std::size_t(B) * T, 0, V - 1);
  tokens[1] = tokens[0];  // a repeated token: two writers to one dwte row
  Vec wte = uniform(rng, std::size_t(V) * C), wpe = uniform(rng, std::size_t(T) * C),
      R = uniform(rng, std::size_t(B) * T * C);
  Vec out(std::size_t(B) * T * C);
  k::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  DVec ted = to_double(wte), ped = to_double(wpe), Rd = to_double(R);
  auto forward = [&](DVec& o) {
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < C; ++c) {
          const std::size_t n = std::size_t(b) * T + t;
          o[n * C + c] = ted[std::size_t(tokens[n]) * C + c] + ped[std::size_t(t) * C + c];
        }
  };
  DVec oref(out.size());
  forward(oref);
  EXPECT_TRUE(all_close(out, oref));

  DVec dte_ref(wte.size(), 0.0), dpe_ref(wpe.size(), 0.0);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        const std::size_t n = std::size_t(b) * T + t;
        dte_ref[std::size_t(tokens[n]) * C + c] += Rd[n * C + c];
        dpe_ref[std::size_t(t) * C + c] += Rd[n * C + c];
      }
  Vec dte(wte.size(), 0.0f), dpe(wpe.size(), 0.0f);
  k::embedding_backward(dte.data(), dpe.data(), R.data(), tokens.data(), B, T, C);
  EXPECT_TRUE(all_close(dte, dte_ref));
  EXPECT_TRUE(all_close(dpe, dpe_ref));

  if (with_fd) {
    auto loss = [&] {
      DVec o(out.size());
      forward(o);
      return dot(o, Rd);
    };
    check_fd("dwte", ted, dte, dte_ref, loss, fd_indices(rng, ted.size()));
    check_fd("dwpe", ped, dpe, dpe_ref, loss, fd_indices(rng, ped.size()));
  }

  Vec g0 = uniform(rng, wte.size()), p0 = uniform(rng, wpe.size()), g = g0, p = p0;
  for (int rep = 0; rep < 2; ++rep) k::embedding_backward(g.data(), p.data(), R.data(), tokens.data(), B, T, C);
  DVec wg(g.size()), wp(p.size());
  for (std::size_t i = 0; i < g.size(); ++i) wg[i] = g0[i] + 2 * dte_ref[i];
  for (std::size_t i = 0; i < p.size(); ++i) wp[i] = p0[i] + 2 * dpe_ref[i];
  EXPECT_TRUE(all_close(g, wg));
  EXPECT_TRUE(all_close(p, wp));
}

TEST(Embedding, AgainstDoubleAndFiniteDifferences) {
  SEEDED_RNG(rng);
  embedding_case(rng, 2, 7, 12, 37, true);
}

TEST(Embedding, LargeEnoughForThreads) {
  SEEDED_RNG(rng);
  const int before = k::num_threads();
  k::set_num_threads(3);
  embedding_case(rng, 3, 113, 97, 41, false);  // few tokens: many repeats
  k::set_num_threads(before);
}

// ------------------------------------------------------------ cross-entropy

void cross_entropy_case(std::mt19937& rng, int N, int V, bool with_fd) {
  Vec logits = uniform(rng, std::size_t(N) * V, -4.0f, 4.0f);
  // One row with a large offset and spread: needs the max subtraction.
  for (int i = 0; i < V; ++i) logits[i] = logits[i] * 20.0f + 1000.0f;
  IVec targets = randint(rng, N, 0, V - 1);
  const float dloss = 1.0f / N;
  DVec ld = to_double(logits);

  Vec losses(N);
  k::softmax_cross_entropy_forward(losses.data(), logits.data(), targets.data(), N, V);
  DVec lref(N);
  for (int n = 0; n < N; ++n) lref[n] = ref_ce_loss(&ld[std::size_t(n) * V], V, targets[n]);
  // A loss is a difference of two O(1000) numbers on the offset row: the
  // relative bound uses the size of the terms, not of the (small) loss.
  for (int n = 0; n < N; ++n) {
    const double terms = std::fabs(ld[std::size_t(n) * V + targets[n]]) + lref[n];
    EXPECT_NEAR(losses[n], lref[n], kRtol * terms) << "row " << n;
  }

  DVec gref(logits.size());
  for (int n = 0; n < N; ++n) {
    const double* x = &ld[std::size_t(n) * V];
    const double lse = ref_ce_loss(x, V, 0) + x[0];
    for (int i = 0; i < V; ++i) gref[std::size_t(n) * V + i] = (std::exp(x[i] - lse) - (i == targets[n])) * dloss;
  }
  // WRITES: garbage already in dlogits must not leak in.
  Vec dlogits(logits.size(), std::numeric_limits<float>::quiet_NaN());
  k::softmax_cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), dloss, N, V);
  EXPECT_TRUE(all_close(dlogits, gref));
  Vec again = dlogits;
  k::softmax_cross_entropy_backward(again.data() /* written, not added to */, logits.data(), targets.data(), dloss, N,
                                    V);
  EXPECT_EQ(again, dlogits);
  // In place: dlogits == logits gives the same bits as separate buffers.
  Vec inplace = logits;
  k::softmax_cross_entropy_backward(inplace.data(), inplace.data(), targets.data(), dloss, N, V);
  EXPECT_EQ(inplace, dlogits);

  if (with_fd) {
    auto loss = [&] {
      double s = 0.0;
      for (int n = 0; n < N; ++n) s += dloss * ref_ce_loss(&ld[std::size_t(n) * V], V, targets[n]);
      return s;
    };
    // The offset row puts terms of size ~1000 into the loss: each evaluation
    // rounds at ~1e-13 absolute, i.e. ~1e-8 after dividing by 2h, which is
    // ~1e-7 of the largest gradient here (dloss = 1/N).
    check_fd("dlogits", ld, dlogits, gref, loss, fd_indices(rng, ld.size()), 1e-6);
  }
}

TEST(CrossEntropy, AgainstDoubleAndFiniteDifferences) {
  SEEDED_RNG(rng);
  cross_entropy_case(rng, 14, 37, true);
}

TEST(CrossEntropy, LargeEnoughForThreads) {
  SEEDED_RNG(rng);
  const int before = k::num_threads();
  k::set_num_threads(3);
  cross_entropy_case(rng, 29, 1201, false);
  k::set_num_threads(before);
}

// The vocabulary-parallel pieces, with the columns split over two "ranks"
// (unevenly, and with the combination done as the model does it: max, then
// sums), give the double-precision loss and gradient of the whole row.
TEST(CrossEntropy, ShardedPiecesMatchTheWholeRow) {
  SEEDED_RNG(rng);
  const int N = 11, V = 37, split = 20;
  Vec logits = uniform(rng, std::size_t(N) * V, -4.0f, 4.0f);
  for (int i = 0; i < V; ++i) logits[i] = logits[i] * 20.0f + 1000.0f;
  IVec targets = randint(rng, N, 0, V - 1);
  const float dloss = 1.0f / N;
  DVec ld = to_double(logits);
  // Column blocks [0, split) and [split, V), stored contiguously per block.
  const int lo[2] = {0, split}, width[2] = {split, V - split};
  Vec block[2];
  for (int b = 0; b < 2; ++b) {
    block[b].resize(std::size_t(N) * width[b]);
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < width[b]; ++i) block[b][std::size_t(n) * width[b] + i] = logits[std::size_t(n) * V + lo[b] + i];
  }
  Vec m(N), mb(N), s(N, 0.0f), sb(N), x(N, 0.0f), xb(N), losses(N);
  k::row_max(m.data(), block[0].data(), N, width[0]);
  k::row_max(mb.data(), block[1].data(), N, width[1]);
  for (int n = 0; n < N; ++n) m[n] = std::max(m[n], mb[n]);  // the all-reduce MAX
  for (int b = 0; b < 2; ++b) {
    k::row_exp_sum(sb.data(), block[b].data(), m.data(), N, width[b]);
    k::pick_target_logits(xb.data(), block[b].data(), targets.data(), lo[b], N, width[b]);
    for (int n = 0; n < N; ++n) {  // the all-reduce SUMs
      s[n] += sb[n];
      x[n] += xb[n];
    }
  }
  k::cross_entropy_from_parts(losses.data(), m.data(), s.data(), x.data(), N);
  for (int n = 0; n < N; ++n) {
    const double want = ref_ce_loss(&ld[std::size_t(n) * V], V, targets[n]);
    EXPECT_NEAR(losses[n], want, kRtol * (std::fabs(ld[std::size_t(n) * V + targets[n]]) + want)) << "row " << n;
  }
  for (int b = 0; b < 2; ++b) {
    Vec d(block[b].size(), std::numeric_limits<float>::quiet_NaN());
    k::softmax_cross_entropy_backward_sharded(d.data(), block[b].data(), m.data(), s.data(), targets.data(), lo[b],
                                              dloss, N, width[b]);
    DVec want(d.size());
    for (int n = 0; n < N; ++n) {
      const double* row = &ld[std::size_t(n) * V];
      const double lse = ref_ce_loss(row, V, 0) + row[0];
      for (int i = 0; i < width[b]; ++i)
        want[std::size_t(n) * width[b] + i] = (std::exp(row[lo[b] + i] - lse) - (lo[b] + i == targets[n])) * dloss;
    }
    EXPECT_TRUE(all_close(d, want)) << "block " << b;
    // In place over the logits, as the model runs it.
    Vec inplace = block[b];
    k::softmax_cross_entropy_backward_sharded(inplace.data(), inplace.data(), m.data(), s.data(), targets.data(),
                                              lo[b], dloss, N, width[b]);
    EXPECT_EQ(inplace, d);
  }
}

// Vocabulary-parallel embedding: the partial rows of two shards, summed, plus
// the position rows added once (add_position_rows), are the whole lookup (bit for bit: exactly one
// shard contributes each row); the backward scatters each token's gradient
// into the one shard that holds its row.
TEST(Embedding, VocabularyShardsComposeToTheWhole) {
  SEEDED_RNG(rng);
  const int B = 2, T = 5, C = 6, V = 14, half = V / 2;
  Vec wte = uniform(rng, std::size_t(V) * C), wpe = uniform(rng, std::size_t(T) * C), dout = uniform(rng, B * T * C);
  IVec tok = randint(rng, B * T, 0, V - 1);
  Vec whole(B * T * C), sum(B * T * C, 0.0f), part(B * T * C);
  k::embedding_forward(whole.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  for (int r = 0; r < 2; ++r) {
    k::embedding_forward(part.data(), tok.data(), wte.data() + std::size_t(r) * half * C, nullptr, B, T, C, r * half,
                         half);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  // The position rows in two pieces, as two sequence-parallel ranks add
  // them: rows [0, 4) and [4, 10), the second starting mid-sample.
  k::add_position_rows(sum.data(), wpe.data(), 4, C, T, 0);
  k::add_position_rows(sum.data() + 4 * C, wpe.data(), B * T - 4, C, T, 4);
  EXPECT_EQ(sum, whole);
  Vec dwte(std::size_t(V) * C, 0.0f), dwpe(std::size_t(T) * C, 0.0f), dshards(std::size_t(V) * C, 0.0f);
  k::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
  for (int r = 0; r < 2; ++r)
    k::embedding_backward(dshards.data() + std::size_t(r) * half * C, nullptr, dout.data(), tok.data(), B, T, C,
                          r * half, half);
  EXPECT_EQ(dshards, dwte);
}

// -------------------------------------------------------------------- AdamW

void adamw_case(std::mt19937& rng, float beta1) {
  const std::size_t n = 1003;
  const float lr = 1e-2f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  SCOPED_TRACE(::testing::Message() << "beta1 " << beta1);
  Vec p = uniform(rng, n), m(n, 0.0f), v(n, 0.0f);
  DVec pd = to_double(p), md(n, 0.0), vd(n, 0.0);
  for (int step = 1; step <= 3; ++step) {
    Vec g = uniform(rng, n, -2.0f, 2.0f);
    k::adamw_update(p.data(), g.data(), m.data(), v.data(), std::int64_t(n), lr, beta1, beta2, eps, wd, step);
    // The header's formula, in double, with the same float hyperparameters.
    const double b1 = beta1, b2 = beta2;
    for (std::size_t i = 0; i < n; ++i) {
      pd[i] *= 1.0 - double(lr) * double(wd);
      md[i] = b1 * md[i] + (1 - b1) * g[i];
      vd[i] = b2 * vd[i] + (1 - b2) * double(g[i]) * g[i];
      pd[i] -= double(lr) / (1 - std::pow(b1, step)) * md[i] /
               (std::sqrt(vd[i]) / std::sqrt(1 - std::pow(b2, step)) + double(eps));
    }
    SCOPED_TRACE(::testing::Message() << "step " << step);
    // A handful of float roundings per element per step, on O(1) values.
    EXPECT_TRUE(all_close(m, md, 1e-6, 1e-7));
    EXPECT_TRUE(all_close(v, vd, 1e-6, 1e-7));
    EXPECT_TRUE(all_close(p, pd, 1e-6, 1e-7));
  }
}

TEST(AdamW, ThreeStepsAgainstDouble) {
  SEEDED_RNG(rng);
  adamw_case(rng, 0.9f);
  adamw_case(rng, 0.3f);  // 1 - beta1 >= 0.5: the other branch of torch's lerp
}

// ---- mixed precision: 16-bit formats against a reference decoder in double ----

// The value of a 16-bit code, decoded from the format's definition (not
// from the implementation): bf16 has 8 exponent and 7 mantissa bits, fp16
// 5 and 10. NaN for NaN codes.
double reference_decode(std::uint16_t c, strata::core::Precision p) {
  const bool bf = p == strata::core::Precision::bf16;
  const int man_bits = bf ? 7 : 10, exp_bits = bf ? 8 : 5, bias = bf ? 127 : 15;
  const int e = (c >> man_bits) & ((1 << exp_bits) - 1), m = c & ((1 << man_bits) - 1);
  const double sign = (c & 0x8000) ? -1.0 : 1.0;
  if (e == (1 << exp_bits) - 1)
    return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(double(m), 1 - bias - man_bits);
  return sign * std::ldexp(1.0 + std::ldexp(double(m), -man_bits), e - bias);
}

// Round to nearest, ties to even, of x onto the format's finite values (the
// positive ones, sorted, as codes 0..max in order); past the largest finite
// value by half an ulp or more: infinity.
std::uint16_t reference_round(double x, strata::core::Precision p) {
  const bool bf = p == strata::core::Precision::bf16;
  const std::uint16_t max_finite = bf ? 0x7f7f : 0x7bff, inf = bf ? 0x7f80 : 0x7c00;
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  const double top = reference_decode(max_finite, p);
  const double ulp_top = top - reference_decode(max_finite - 1, p);
  if (a >= top + ulp_top / 2) return sign | inf;
  // Largest code whose value is <= a (positive codes increase with value).
  std::uint16_t lo = 0, hi = max_finite;
  while (lo < hi) {
    const std::uint16_t mid = std::uint16_t((lo + hi + 1) / 2);
    if (reference_decode(mid, p) <= a) lo = mid; else hi = std::uint16_t(mid - 1);
  }
  if (lo == max_finite) return sign | lo;
  const double below = reference_decode(lo, p), above = reference_decode(std::uint16_t(lo + 1), p);
  std::uint16_t pick = lo;
  if (a - below > above - a || (a - below == above - a && (lo & 1))) pick = std::uint16_t(lo + 1);
  return sign | pick;
}

const strata::core::Precision kHalves[] = {strata::core::Precision::bf16, strata::core::Precision::fp16};

TEST(Precision, EveryCodeWidensToItsValueAndNarrowsBack) {
  for (const auto p : kHalves) {
    std::vector<std::uint16_t> codes(65536);
    std::iota(codes.begin(), codes.end(), std::uint16_t(0));
    Vec wide(codes.size());
    k::convert(wide.data(), strata::core::CPtr(codes.data(), p), std::int64_t(codes.size()));
    std::vector<std::uint16_t> back(codes.size());
    k::convert(strata::core::Ptr(back.data(), p), wide.data(), std::int64_t(codes.size()));
    for (std::size_t c = 0; c < codes.size(); ++c) {
      const double want = reference_decode(std::uint16_t(c), p);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(wide[c])) << c;
        ASSERT_TRUE(std::isnan(reference_decode(back[c], p))) << "NaN stays NaN: " << c;
      } else {
        ASSERT_EQ(double(wide[c]), want) << "code " << c;
        ASSERT_EQ(back[c], c) << "code " << c;
      }
    }
  }
}

TEST(Precision, NarrowingRoundsToNearestEvenOnFreshInputs) {
  SEEDED_RNG(rng);
  for (const auto p : kHalves) {
    const bool bf = p == strata::core::Precision::bf16;
    // Magnitudes spread over the whole range, subnormals included, and the
    // exact midpoints between neighbours (the ties).
    std::uniform_real_distribution<double> expo(bf ? -135.0 : -26.0, bf ? 128.5 : 16.5), unit(-1.0, 1.0);
    std::uniform_int_distribution<int> code(0, bf ? 0x7f7e : 0x7bfe);
    Vec x;
    for (int i = 0; i < 20000; ++i) x.push_back(float(unit(rng) * std::exp2(expo(rng))));
    for (int i = 0; i < 2000; ++i) {
      const auto c = std::uint16_t(code(rng));
      x.push_back(float((reference_decode(c, p) + reference_decode(std::uint16_t(c + 1), p)) / 2));
    }
    for (float v : {65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e30f, std::numeric_limits<float>::infinity(), 0.0f, -0.0f,
                    std::numeric_limits<float>::denorm_min(), 5.96e-8f, 2.98e-8f, 2.99e-8f})
      x.push_back(v);
    std::vector<std::uint16_t> y(x.size());
    k::convert(strata::core::Ptr(y.data(), p), x.data(), std::int64_t(x.size()));
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(y[i], reference_round(double(x[i]), p)) << strata::core::precision_name(p) << " x = " << x[i];
  }
}

TEST(Precision, SumsRoundOnceAndReductionsSeeTheWidenedValues) {
  SEEDED_RNG(rng);
  for (const auto p : kHalves) {
    const std::size_t n = 5000;
    Vec a = uniform(rng, n, -4.0f, 4.0f), b = uniform(rng, n, -4.0f, 4.0f);
    std::vector<std::uint16_t> ha(n), hb(n);
    using strata::core::CPtr, strata::core::Ptr;
    k::convert(Ptr(ha.data(), p), a.data(), std::int64_t(n));
    k::convert(Ptr(hb.data(), p), b.data(), std::int64_t(n));
    std::vector<std::uint16_t> acc = ha, sum = ha;
    Vec wide = b;
    k::add_inplace(Ptr(acc.data(), p), b.data(), std::int64_t(n));          // 16-bit += fp32
    k::add_inplace(Ptr(sum.data(), p), CPtr(hb.data(), p), std::int64_t(n));  // 16-bit += 16-bit
    k::add_inplace(wide.data(), CPtr(ha.data(), p), std::int64_t(n));       // fp32 += 16-bit
    double sq = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double da = reference_decode(ha[i], p), db = reference_decode(hb[i], p);
      // The addend is fp32 (the kernels' accumulation precision); the sum of
      // two fp32 values in fp32, then one rounding to the format.
      ASSERT_EQ(acc[i], reference_round(double(float(da) + b[i]), p)) << i;
      ASSERT_EQ(sum[i], reference_round(double(float(da) + float(db)), p)) << i;
      ASSERT_EQ(wide[i], b[i] + float(da)) << i;
      sq += da * da;
    }
    EXPECT_NEAR(k::sum_squares(CPtr(ha.data(), p), std::int64_t(n)), sq, 1e-12 * sq);
  }
  // fp16 overflows where bf16 does not: 70000 is past 65504.
  const float big = 70000.0f;
  EXPECT_FALSE(std::isfinite(strata::core::fp16_to_float(strata::core::float_to_fp16(big))));
  EXPECT_TRUE(std::isfinite(strata::core::bf16_to_float(strata::core::float_to_bf16(big))));
}

// The mixed AdamW is fp32 AdamW on the master weights, given the widened
// gradients times grad_scale, bit for bit; the 16-bit parameters are the
// master weights rounded.
TEST(AdamW, MixedUpdatesTheMasterAsFp32AndRoundsTheParameters) {
  SEEDED_RNG(rng);
  for (const auto p : kHalves) {
    const std::size_t n = 3000;
    Vec master = uniform(rng, n), g = uniform(rng, n, -100.0f, 100.0f), m(n, 0.0f), v(n, 0.0f);
    std::vector<std::uint16_t> g16(n), p16(n);
    k::convert(strata::core::Ptr(g16.data(), p), g.data(), std::int64_t(n));
    Vec ref = master, rm = m, rv = v, rg(n);
    const float scale = 1.0f / 1024.0f;
    for (int step = 1; step <= 3; ++step) {
      k::adamw_update_mixed(master.data(), p16.data(), g16.data(), scale, m.data(), v.data(), std::int64_t(n), 1e-2f,
                            0.9f, 0.95f, 1e-8f, 0.1f, step, p);
      for (std::size_t i = 0; i < n; ++i) rg[i] = float(reference_decode(g16[i], p)) * scale;
      k::adamw_update(ref.data(), rg.data(), rm.data(), rv.data(), std::int64_t(n), 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f,
                      step);
      ASSERT_EQ(master, ref) << "step " << step;
      ASSERT_EQ(m, rm);
      ASSERT_EQ(v, rv);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(p16[i], reference_round(double(master[i]), p)) << i;
    }
  }
}

}  // namespace
