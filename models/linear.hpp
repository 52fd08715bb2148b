// The linear layer y = x W^T + b with W stored [out, in] as torch.nn.Linear
// stores it, forward and backward. It is the unit that tensor parallelism
// will split (column-parallel: rows of W; row-parallel: columns of W).
// Inputs, outputs and parameters are in the run's format; the parameter
// gradients are fp32 (a weight gradient accumulates in fp32, as Megatron's
// main gradients do).
#pragma once

#include "kernels/kernels.hpp"

namespace strata::models {

// out[N, OC] = (accumulate ? out : 0) + inp[N, IC] W[OC, IC]^T + b[OC]
inline void linear_forward(core::Ptr out, core::CPtr inp, core::CPtr weight, core::CPtr bias, int N, int IC, int OC,
                           bool accumulate = false) {
  const float beta = accumulate ? 1.0f : 0.0f;
  if (bias)
    kernels::linear_bias_forward(out, inp, weight, bias, N, IC, OC, beta);
  else
    kernels::matmul(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
}

// dinp = (accumulate_dinp ? dinp : 0) + dout W: the input gradient.
inline void linear_backward_input(core::Ptr dinp, core::CPtr dout, core::CPtr weight, int N, int IC, int OC,
                                  bool accumulate_dinp = false) {
  kernels::matmul(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, accumulate_dinp ? 1.0f : 0.0f, dinp, IC);
}

// dweight += dout^T inp; dbias += colsum(dout) (skipped when dbias is null):
// the weight gradient, which a zero-bubble schedule runs later than the input
// gradient, from the same dout.
inline void linear_backward_weight(float* dweight, float* dbias, core::CPtr dout, core::CPtr inp, int N, int IC,
                                   int OC) {
  kernels::matmul(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  if (dbias != nullptr) kernels::bias_backward(dbias, dout, N, OC);
}

// Both: dinp is skipped when null.
inline void linear_backward(core::Ptr dinp, float* dweight, float* dbias, core::CPtr dout, core::CPtr inp,
                            core::CPtr weight, int N, int IC, int OC, bool accumulate_dinp = false) {
  if (dinp) linear_backward_input(dinp, dout, weight, N, IC, OC, accumulate_dinp);
  linear_backward_weight(dweight, dbias, dout, inp, N, IC, OC);
}

// The activation between an MLP's two linears (a dense block's or an
// expert's): GELU on F hidden units, or SwiGLU (Shazeer, 2020), whose first
// linear has 2F outputs, the gate's F and the up projection's F side by
// side, and whose output is silu(gate) * up.
enum class Activation { gelu, swiglu };

// Outputs of the first linear for F hidden units.
inline int activation_inputs(Activation a, int F) { return a == Activation::swiglu ? 2 * F : F; }

// h[N, F] from the first linear's output pre[N, activation_inputs(a, F)].
inline void activation_forward(Activation a, core::Ptr h, core::CPtr pre, int N, int F) {
  if (a == Activation::swiglu)
    kernels::swiglu_forward(h, pre, N, F);
  else
    kernels::gelu_forward(h, pre, std::int64_t(N) * F);
}

// dpre += the gradient of pre, from dh[N, F].
inline void activation_backward(Activation a, core::Ptr dpre, core::CPtr pre, core::CPtr dh, int N, int F) {
  if (a == Activation::swiglu)
    kernels::swiglu_backward(dpre, pre, dh, N, F);
  else
    kernels::gelu_backward(dpre, pre, dh, std::int64_t(N) * F);
}

}  // namespace strata::models
