#include "kernels/foundation/error.hpp"
#include "kernels/foundation/ptr.hpp"

namespace strata::core {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  throw Error(ErrorKind::runtime, fmt::format("internal check `{}` failed at {}:{}: {}", expr, file, line, msg));
}

void format_mismatch(Precision have, Precision want) {
  throw Error(ErrorKind::runtime, fmt::format("internal check failed: a tensor of {} elements where {} ones are expected",
                                              precision_name(have), precision_name(want)));
}

}  // namespace strata::core
