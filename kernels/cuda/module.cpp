// The CUDA kernels' module entry point: the table kernels/dispatch.cpp calls
// through (kernels/backend_table.hpp).
#include "kernels/cuda/cuda_kernels.hpp"

#define STRATA_BACKEND_NS cuda
#include "kernels/backend_module.inc"
