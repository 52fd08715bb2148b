// The data types of cuBLAS for the formats of kernels/foundation/ptr.hpp,
// for the files that call cuBLAS or cuBLASLt (internal to kernels/cuda).
#pragma once

#include <library_types.h>

#include "kernels/foundation/precision.hpp"

namespace strata::kernels::cuda {

cudaDataType_t cuda_type(core::Precision p);

}  // namespace strata::kernels::cuda
