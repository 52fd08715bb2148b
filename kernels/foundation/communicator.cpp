// Backend-independent pieces of the communicator interface: element sizes,
// used by every backend and by the profiling layer to count bytes.
#include "kernels/foundation/communicator.hpp"

#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include "kernels/foundation/error.hpp"

namespace strata::comm {

DType dtype_of(core::Precision p) {
  return p == core::Precision::bf16 ? DType::bf16 : p == core::Precision::fp16 ? DType::f16 : DType::f32;
}

core::Precision precision_of(DType t) {
  switch (t) {
    case DType::f32: return core::Precision::fp32;
    case DType::bf16: return core::Precision::bf16;
    case DType::f16: return core::Precision::fp16;
    default: break;
  }
  STRATA_CHECK(false, "DType {} is not a floating-point training format", int(t));
  return core::Precision::fp32;
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  STRATA_CHECK(false, "unknown DType {}", int(t));
  return 0;
}

void finish_in_destructor(Request& r, const char* what) {
  try {
    if (std::uncaught_exceptions() == 0) {
      r.wait();
      return;
    }
    using clock = std::chrono::steady_clock;
    // One window per failure: a later failure (a test process meets several)
    // opens its own.
    static clock::time_point deadline;
    if (clock::now() > deadline + std::chrono::seconds(10)) deadline = clock::now() + std::chrono::seconds(2);
    while (!r.test()) {
      if (clock::now() >= deadline) {
        std::fprintf(stderr, "strata: abandoned an unfinished %s while this rank fails\n", what);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: finishing an unfinished %s failed: %s\n", what, e.what());
  }
}

}  // namespace strata::comm
