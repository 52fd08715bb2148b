// Backend-independent pieces of the communicator interface: element sizes,
// used by every backend and by the profiling layer to count bytes.
#include "kernels/foundation/communicator.hpp"

#include "kernels/foundation/error.hpp"

namespace strata::comm {

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

}  // namespace strata::comm
