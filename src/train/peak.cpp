#include "src/train/peak.hpp"

#include <fmt/format.h>

#include "kernels/kernels.hpp"

namespace strata::train {

Peak resolve_peak(double peak_tflops_from_deck, core::Precision precision) {
  if (peak_tflops_from_deck > 0) return {peak_tflops_from_deck * 1e12, "deck"};
  const bool gpu = kernels::device() == kernels::Device::cuda;
  // A GPU needs large products to reach its rate; the CPU's is reached at 1024.
  const int n = gpu ? 8192 : 1024, reps = 5;
  const char* what = !gpu                                  ? "sgemm"
                     : precision == core::Precision::bf16 ? "cuBLAS bf16 GEMM"
                     : precision == core::Precision::fp16 ? "cuBLAS fp16 GEMM"
                                                          : "cuBLAS sgemm";
  return {kernels::measure_gemm_flops(n, reps, precision),
          fmt::format("measured: {} {}^3, best of {}", what, n, reps)};
}

}  // namespace strata::train
