// Errors: one exception type that carries its context and the exit status the
// program should end with. Bad input (decks, flags, impossible layouts) exits
// with 2; everything else that goes wrong at run time exits with 1.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace strata::core {

enum class ErrorKind { input, runtime };

class Error : public std::runtime_error {
 public:
  // `agreed`: every rank of the job threw this error at the same point (they
  // agreed on it collectively), so none is left waiting for another and the
  // job can end normally instead of by MPI_Abort.
  Error(ErrorKind kind, const std::string& message, bool agreed = false)
      : std::runtime_error(message), kind_(kind), agreed_(agreed) {}
  ErrorKind kind() const { return kind_; }
  bool agreed() const { return agreed_; }
  int exit_code() const { return kind_ == ErrorKind::input ? 2 : 1; }

 private:
  ErrorKind kind_;
  bool agreed_;
};

// Bad input from the user: exit status 2, nothing written.
template <typename... Args>
[[noreturn]] void input_error(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(ErrorKind::input, fmt::format(f, std::forward<Args>(args)...));
}

// A failure while running: exit status 1.
template <typename... Args>
[[noreturn]] void runtime_error(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(ErrorKind::runtime, fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace strata::core

// An internal invariant: failing it is a bug in strata, not bad input.
#define STRATA_CHECK(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) ::strata::core::check_failed(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)
