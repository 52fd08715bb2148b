#include "models/context_seam.hpp"

#include "kernels/kernels.hpp"

namespace strata::models {

std::int64_t ContextSeam::state_elements(bool fused, int B, int NH, int, int Tl, int) const {
  return kernels::attention_state_elements(fused, B, NH, Tl);
}

core::Precision ContextSeam::state_format(bool fused, core::Precision act) const {
  return kernels::attention_state_format(fused, act);
}

std::int64_t ContextSeam::scratch_bytes(bool fused, int B, int NH, int, int Tl, int C, core::Precision act) const {
  return kernels::attention_scratch_elements(fused, B, NH, Tl, C, act) *
         core::element_bytes(kernels::attention_state_format(fused, act));
}

void ContextSeam::attention_forward(core::Ptr out, core::Ptr state, std::byte*, core::CPtr qkv, int B, int Tl, int C,
                                    int NH, int NKV) {
  kernels::attention_forward(out, state, qkv, B, Tl, C, NH, NKV);
}

void ContextSeam::attention_backward(core::Ptr dqkv, std::byte* scratch, core::CPtr dout, core::CPtr qkv,
                                     core::CPtr out, core::CPtr state, int B, int Tl, int C, int NH, int NKV) {
  // The scratch is in the state's format: the probabilities' gradient, or
  // (fused) fp32.
  kernels::attention_backward(dqkv, core::Ptr(scratch, state.precision()), dout, qkv, out, state, B, Tl, C, NH, NKV);
}

ContextSeam& whole_sequence() {
  static WholeSequence seam;
  return seam;
}

}  // namespace strata::models
