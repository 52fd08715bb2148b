#include "models/context_seam.hpp"

#include "kernels/kernels.hpp"

namespace strata::models {

std::int64_t ContextSeam::state_floats(bool fused, int B, int NH, int, int Tl, int) const {
  return kernels::attention_state_elements(fused, B, NH, Tl);
}

std::int64_t ContextSeam::scratch_floats(bool fused, int B, int NH, int, int Tl, int C) const {
  return kernels::attention_scratch_elements(fused, B, NH, Tl, C);
}

void ContextSeam::attention_forward(float* out, float* state, float*, const float* qkv, int B, int Tl, int C, int NH,
                                    int NKV) {
  kernels::attention_forward(out, state, qkv, B, Tl, C, NH, NKV);
}

void ContextSeam::attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                     const float* out, const float* state, int B, int Tl, int C, int NH, int NKV) {
  kernels::attention_backward(dqkv, scratch, dout, qkv, out, state, B, Tl, C, NH, NKV);
}

ContextSeam& whole_sequence() {
  static WholeSequence seam;
  return seam;
}

}  // namespace strata::models
