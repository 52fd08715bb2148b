// The linear layer y = x W^T + b with W stored [out, in] as torch.nn.Linear
// stores it, forward and backward. It is the unit that tensor parallelism
// will split (column-parallel: rows of W; row-parallel: columns of W).
#pragma once

#include "kernels/kernels.hpp"

namespace strata::models {

// out[N, OC] = (accumulate ? out : 0) + inp[N, IC] W[OC, IC]^T + b[OC]
inline void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC,
                           int OC, bool accumulate = false) {
  const float beta = accumulate ? 1.0f : 0.0f;
  if (bias != nullptr)
    kernels::linear_bias_forward(out, inp, weight, bias, N, IC, OC, beta);
  else
    kernels::matmul(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
}

// dinp = (accumulate_dinp ? dinp : 0) + dout W: the input gradient.
inline void linear_backward_input(float* dinp, const float* dout, const float* weight, int N, int IC, int OC,
                                  bool accumulate_dinp = false) {
  kernels::matmul(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, accumulate_dinp ? 1.0f : 0.0f, dinp, IC);
}

// dweight += dout^T inp; dbias += colsum(dout) (skipped when dbias is null):
// the weight gradient, which a zero-bubble schedule runs later than the input
// gradient, from the same dout.
inline void linear_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp, int N, int IC,
                                   int OC) {
  kernels::matmul(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  if (dbias != nullptr) kernels::bias_backward(dbias, dout, N, OC);
}

// Both: dinp is skipped when null.
inline void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int N, int IC, int OC, bool accumulate_dinp = false) {
  if (dinp != nullptr) linear_backward_input(dinp, dout, weight, N, IC, OC, accumulate_dinp);
  linear_backward_weight(dweight, dbias, dout, inp, N, IC, OC);
}

}  // namespace strata::models
