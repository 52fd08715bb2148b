// The "points" table that a sweep's index and a plan both write: one row per
// point (a sweep point, a plan's candidate) that starts with the same eleven
// columns, so that strata-report, compare and the Pareto front read either
// file alike. Declared here once; each writer describes what its columns
// mean (measured or predicted) and may append columns of its own.
#pragma once

#include <string>

#include "src/report/table.hpp"

namespace strata::report {

// What each shared column means to its writer, in the table's order.
struct PointColumns {
  std::string point, overrides, world, status, reason, report;
  std::string tokens_per_s, mfu, step_time, peak_bytes, final_loss;
};

// The width of the overrides column: a layout search names a dozen keys.
inline constexpr int kOverridesWidth = 1024;

// The table "points" with the shared columns: point (i64), overrides (1024),
// world (i64), status (16), reason (512), report (256), then tokens_per_s,
// mfu, step_time, peak_bytes and final_loss (f64).
Table points_table(const std::string& doc, const PointColumns& what);

}  // namespace strata::report
