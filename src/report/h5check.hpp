// STRATA_CHECK_H5: every HDF5 return code is checked. HDF5 signals failure
// with a negative herr_t/hid_t/htri_t; the check turns it into a runtime
// strata::core::Error naming the call, the place and HDF5's own reason.
#pragma once

#include <hdf5.h>

#include <string>

#include "kernels/foundation/error.hpp"

namespace strata::report {

// Reads (and clears) HDF5's error stack for the message, then throws.
[[noreturn]] void h5_failed(const char* expr, const char* file, int line);

template <typename T>
inline T h5_check(T value, const char* expr, const char* file, int line) {
  if (value < 0) h5_failed(expr, file, line);
  return value;
}

// HDF5 prints its error stack to stderr on every failure by default; strata
// reports errors through exceptions instead, so that printing is turned off.
void h5_quiet_errors();

}  // namespace strata::report

// Usable as a statement or as an expression that yields the checked value:
//   hid_t space = STRATA_CHECK_H5(H5Screate(H5S_SCALAR));
#define STRATA_CHECK_H5(expr) ::strata::report::h5_check((expr), #expr, __FILE__, __LINE__)
