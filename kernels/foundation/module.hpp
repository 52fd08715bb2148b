// Modules: parts of Strata built as shared objects and loaded when a run
// first needs them, so that a run which does not need them never maps their
// libraries. The CUDA backend is one (libstrata_cuda.so: its kernels, the
// NCCL and host-staged communicators, and with them the CUDA runtime,
// cuBLAS, cuBLASLt and NCCL, which take about half a second to load).
//
// A module takes Strata's own code (errors, the communicator interface, the
// MPI communicator) from the program that loads it: the programs are linked
// with their symbols exported (ENABLE_EXPORTS), and a module links only the
// outside libraries it adds. One copy of each of Strata's globals therefore
// exists in the process, whichever side touches it.
#pragma once

#include <cstddef>
#include <string>

namespace strata::core {

// The address of `symbol` in module `name` (file libstrata_<name>.so), which
// is loaded, once per process, on the first call. Looked for, in order:
// $STRATA_<NAME>_MODULE (a path to the file), beside the running program, in
// ../lib/strata from it (an installed layout), and in the build tree the
// program was built in. Thread-safe. Throws a runtime Error naming the
// places looked in, or the loader's message (an undefined symbol, a missing
// library) when the file is there but does not load.
void* module_symbol(const std::string& name, const char* symbol);

// Where module `name` was loaded from; "" while it is not loaded.
std::string module_path(const std::string& name);

// A runtime Error unless a table's `abi` and `size` fields are the ones this
// program was built with (see module_table).
void check_module_table(const std::string& name, const char* entry, int abi, std::size_t size, int want_abi,
                        std::size_t want_size);

// The table module `name`'s function `entry` (`const Table* entry()`)
// returns. Tables start with `int abi; std::size_t size;`: a module from
// another build, whose slots may differ, is refused instead of called.
template <class Table>
const Table& module_table(const std::string& name, const char* entry, int abi) {
  auto* get = reinterpret_cast<const Table* (*)()>(module_symbol(name, entry));
  const Table* t = get();
  check_module_table(name, entry, t->abi, t->size, abi, sizeof(Table));
  return *t;
}

}  // namespace strata::core
