// bf16 GEMMs through oneDNN's matmul primitive. A primitive is made once per
// shape (its descriptor takes microseconds to tens of microseconds to
// create, about a small GEMM's time) and kept; memory objects wrap the
// caller's buffers, so nothing is copied. alpha is the primitive's output
// scale and beta a sum post-op: C = alpha A B + beta C, accumulated in fp32
// and rounded once into a bf16 C. The primitives' scratchpads are ours, one
// per thread: oneDNN's own is shared by every primitive and safe only for
// a primitive run on the thread that made it, and attention runs its
// products on several threads at once.
#include "kernels/cpu/onednn.hpp"

#include <cstdlib>
#include <string>

#include "kernels/foundation/error.hpp"

#if STRATA_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>
#endif

namespace strata::kernels::cpu {

#if STRATA_HAVE_DNNL

namespace {

using core::Precision;

struct Shape {
  bool ta, tb;
  int M, N, K, lda, ldb, ldc;
  Precision c;
  float alpha, beta;
  bool operator==(const Shape&) const = default;
};

struct ShapeHash {
  std::size_t operator()(const Shape& s) const {
    std::size_t h = 0;
    for (std::size_t x : {std::size_t(s.ta), std::size_t(s.tb), std::size_t(s.M), std::size_t(s.N), std::size_t(s.K),
                          std::size_t(s.lda), std::size_t(s.ldb), std::size_t(s.ldc), std::size_t(s.c),
                          std::hash<float>{}(s.alpha), std::hash<float>{}(s.beta)})
      h = h * 1000003u ^ x;
    return h;
  }
};

struct Made {
  dnnl::matmul prim;
  dnnl::memory::desc scratchpad;  // what it asks of the caller's scratchpad
};

struct Primitives {
  std::mutex mutex;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::unordered_map<Shape, Made, ShapeHash> made;
};

Primitives& primitives() {
  static Primitives p;
  return p;
}

bool has_bf16_instructions() {
  const auto isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

dnnl::memory::desc matrix(int rows, int cols, int ld, bool transposed, dnnl::memory::data_type dt) {
  // Row-major [rows, cols]; transposed: stored [cols, rows] with leading dimension ld.
  return dnnl::memory::desc({rows, cols}, dt, transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
}

}  // namespace

bool onednn_gemm(Precision p) {
  // STRATA_CPU_GEMM=openblas sends every 16-bit GEMM through the widening
  // path instead: how the two are compared on one machine.
  static const bool on = [] {
    const char* env = std::getenv("STRATA_CPU_GEMM");
    return has_bf16_instructions() && !(env != nullptr && std::string(env) == "openblas");
  }();
  return p == Precision::bf16 && on;
}

const char* onednn_description() {
  static const std::string s = [] {
    const dnnl_version_t* v = dnnl_version();
    std::string out = "onednn " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                      std::to_string(v->patch);
    out += has_bf16_instructions() ? " (bf16 instructions)" : " (no bf16 instructions: unused)";
    return out;
  }();
  return s.c_str();
}

void onednn_matmul(bool ta, bool tb, int M, int N, int K, float alpha, core::CPtr A, int lda, core::CPtr B, int ldb,
                   float beta, core::Ptr C, int ldc) {
  using dt = dnnl::memory::data_type;
  const dt c_type = C.precision() == Precision::fp32 ? dt::f32 : dt::bf16;
  const auto a_md = matrix(M, K, lda, ta, dt::bf16), b_md = matrix(K, N, ldb, tb, dt::bf16),
             c_md = matrix(M, N, ldc, false, c_type);
  Primitives& p = primitives();
  Made made;
  {
    const std::lock_guard lock(p.mutex);
    const Shape key{ta, tb, M, N, K, lda, ldb, ldc, C.precision(), alpha, beta};
    auto it = p.made.find(key);
    if (it == p.made.end()) {
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (beta != 0.0f) {
        dnnl::post_ops ops;
        ops.append_sum(beta);
        attr.set_post_ops(ops);
      }
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, p.engine);
      it = p.made.emplace(key, Made{dnnl::matmul(pd), pd.scratchpad_desc()}).first;
    }
    made = it->second;
  }
  // One stream and one scratchpad per thread (the engine is the process's).
  thread_local dnnl::stream stream(p.engine);
  thread_local std::vector<std::byte> scratchpad;
  const std::size_t pad_bytes = std::max<std::size_t>(made.scratchpad.get_size(), 1);
  if (scratchpad.size() < pad_bytes) scratchpad.resize(pad_bytes);
  dnnl::memory a(a_md, p.engine, const_cast<void*>(A.get())), b(b_md, p.engine, const_cast<void*>(B.get())),
      c(c_md, p.engine, C.get()), pad(made.scratchpad, p.engine, scratchpad.data());
  made.prim.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, pad}});
  stream.wait();
}

#else

bool onednn_gemm(core::Precision) { return false; }

const char* onednn_description() { return "no onednn in this build"; }

void onednn_matmul(bool, bool, int, int, int, float, core::CPtr, int, core::CPtr, int, float, core::Ptr, int) {
  STRATA_CHECK(false, "onednn_matmul in a build without oneDNN");
}

#endif

}  // namespace strata::kernels::cpu
