// Reading a file the user names (a deck, a machine description, a
// checkpoint's manifest): a regular file, or where `pipe` allows it a pipe
// (a deck from `<(...)` or /dev/stdin, read to its end). Anything else is
// refused as an input error (exit 2) naming the file: a FIFO where a file is
// meant would block until a writer came, after the run's stop handlers are
// in place (so no SIGTERM could end the wait), and a device could stream
// without end.
#pragma once

#include <cstddef>
#include <string>

namespace strata::core {

// The whole text of `path`, at most `max_bytes`. Input error, naming `what`
// ("deck", "machine description"), when it is missing, a directory, not a
// regular file (nor, with `pipe`, a pipe), unreadable or larger than
// `max_bytes`.
enum class Pipes { refused, read };
std::string read_input_file(const std::string& path, const std::string& what, Pipes pipe = Pipes::refused,
                            std::size_t max_bytes = std::size_t(64) << 20);

}  // namespace strata::core
