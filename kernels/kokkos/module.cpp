// The Kokkos kernels' module entry point: the table kernels/dispatch.cpp calls
// through (kernels/backend_table.hpp).
#include "kernels/kokkos/kokkos_kernels.hpp"

#define STRATA_BACKEND_NS kokkos
#include "kernels/backend_module.inc"
