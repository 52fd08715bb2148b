// A linear layer's forward product with its bias in one cuBLASLt call: the
// bias is added in the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS) instead of a
// second pass over the N x OC output, which at a GPT's sizes costs about as
// much memory traffic as the product's own. Row-major as kernels.hpp states
// it: out[N, OC] = inp[N, IC] w[OC, IC]^T is, column-major, the OC x N
// matrix w^T-as-stored (IC x OC, transposed) times inp (IC x N), and the
// bias runs along the OC rows of that result, which is what the epilogue
// adds. Every operand is in the call's format, the arithmetic the GEMMs'
// (fp32 accumulation), the result rounded once. A shape cuBLASLt has no
// algorithm for falls back to the GEMM and a bias pass.
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <utility>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/gemm.hpp"

namespace strata::kernels::cuda {

namespace {

#define STRATA_CHECK_CUBLASLT(call)                                                   \
  do {                                                                               \
    const cublasStatus_t strata_lt_rc = (call);                                      \
    if (strata_lt_rc != CUBLAS_STATUS_SUCCESS) cublas_failed(#call, int(strata_lt_rc), __FILE__, __LINE__); \
  } while (0)

// One handle and one workspace per process, made on first use (the
// workspace lets cuBLASLt pick its faster split-K algorithms; it is outside
// the tracked arena, in the reserve the arena leaves).
constexpr std::size_t kWorkspace = std::size_t(32) << 20;

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  Lt() {
    STRATA_CHECK_CUBLASLT(cublasLtCreate(&handle));
    workspace = malloc_device(kWorkspace);
  }
};

Lt& lt() {
  static Lt instance;
  return instance;
}

// A product's descriptors and the algorithm the heuristic chose, made once
// per shape, arithmetic and accumulation.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;
};

// The alignment of a pointer in bytes, up to 256: cuBLASLt's algorithms
// assume 256 unless told less, and a parameter inside the flat buffer is
// only as aligned as its offset makes it.
std::uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t n = 256;
  while (n > 1 && a % n != 0) n /= 2;
  return n;
}

// N, IC, OC, the format, and the alignments of w, inp and out.
using Key = std::tuple<int, int, int, int, std::uint32_t, std::uint32_t, std::uint32_t>;

Plan make_plan(int N, int IC, int OC, core::Precision format, std::uint32_t align_w, std::uint32_t align_inp,
               std::uint32_t align_out) {
  Plan p;
  const cudaDataType_t t = cuda_type(format);
  STRATA_CHECK_CUBLASLT(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  STRATA_CHECK_CUBLASLT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  STRATA_CHECK_CUBLASLT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  STRATA_CHECK_CUBLASLT(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  // Column-major views: w as stored is IC x OC (leading dimension IC), used
  // transposed; inp is IC x N; out is OC x N.
  STRATA_CHECK_CUBLASLT(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t));
  STRATA_CHECK_CUBLASLT(cublasLtMatrixLayoutCreate(&p.a, t, IC, OC, IC));
  STRATA_CHECK_CUBLASLT(cublasLtMatrixLayoutCreate(&p.b, t, IC, N, IC));
  STRATA_CHECK_CUBLASLT(cublasLtMatrixLayoutCreate(&p.c, t, OC, N, OC));
  cublasLtMatmulPreference_t pref = nullptr;
  STRATA_CHECK_CUBLASLT(cublasLtMatmulPreferenceCreate(&pref));
  STRATA_CHECK_CUBLASLT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &kWorkspace, sizeof kWorkspace));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> aligned[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_inp},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_out},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_out}};
  for (const auto& [attribute, bytes] : aligned)
    STRATA_CHECK_CUBLASLT(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof bytes));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t rc =
      cublasLtMatmulAlgoGetHeuristic(lt().handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.usable = rc == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.usable) p.algo = result.algo;
  return p;
}

}  // namespace

void linear_bias_forward(core::Ptr out, core::CPtr inp, core::CPtr w, core::CPtr bias, int N, int IC, int OC,
                         float beta) {
  if (N <= 0 || OC <= 0) return;
  const core::Precision format = out.precision();
  if (inp.precision() != format || w.precision() != format || bias.precision() != format)
    formats_refused("linear_bias_forward", inp.precision(), w.precision(), format);
  static std::map<Key, Plan> plans;
  const Key key{N, IC, OC, int(format), alignment(w.get()), alignment(inp.get()), alignment(out.get())};
  auto it = plans.find(key);
  if (it == plans.end())
    it = plans
             .emplace(key, make_plan(N, IC, OC, format, alignment(w.get()), alignment(inp.get()),
                                     alignment(out.get())))
             .first;
  Plan& p = it->second;
  // The GEMM, then the bias: for a shape without a fused algorithm, a bias
  // less aligned than 16 bytes (the epilogue reads it with vector loads), or
  // a plan cuBLASLt refuses at launch after all (unfused from then on; a
  // 16-bit product is then rounded before the bias is added).
  auto unfused = [&] {
    matmul(false, true, N, OC, IC, 1.0f, inp, IC, w, IC, beta, out, OC);
    bias_add(out, bias, N, OC);
  };
  if (!p.usable || alignment(bias.get()) < 16) return unfused();
  const void* bias_data = bias.get();
  STRATA_CHECK_CUBLASLT(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_data, sizeof bias_data));
  const float alpha = 1.0f;
  const cublasStatus_t rc = cublasLtMatmul(lt().handle, p.desc, &alpha, w.get(), p.a, inp.get(), p.b, &beta, out.get(),
                                           p.c, out.get(), p.c, &p.algo, lt().workspace, kWorkspace, nullptr);
  if (rc == CUBLAS_STATUS_NOT_SUPPORTED) {
    p.usable = false;
    return unfused();
  }
  if (rc != CUBLAS_STATUS_SUCCESS) cublas_failed("cublasLtMatmul", int(rc), __FILE__, __LINE__);
}

}  // namespace strata::kernels::cuda
