#include "kernels/foundation/error.hpp"

namespace strata::core {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  throw Error(ErrorKind::runtime, fmt::format("internal check `{}` failed at {}:{}: {}", expr, file, line, msg));
}

}  // namespace strata::core
