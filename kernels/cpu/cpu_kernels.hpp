// The CPU backend (OpenMP + OpenBLAS): every operation of kernels/ops.inc on
// host memory. Called through strata::kernels when the device is the CPU, and
// directly for work that stays on the host (an offloaded optimizer).
#pragma once

#include <cstdint>

#include "kernels/foundation/ptr.hpp"

namespace strata::kernels::cpu {

#include "kernels/ops.inc"

}  // namespace strata::kernels::cpu
