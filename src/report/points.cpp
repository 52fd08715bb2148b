#include "src/report/points.hpp"

namespace strata::report {

Table points_table(const std::string& doc, const PointColumns& what) {
  Table t("points", doc);
  t.col_i64("point", "1", what.point)
      .col_str("overrides", kOverridesWidth, "", what.overrides)
      .col_i64("world", "1", what.world)
      .col_str("status", 16, "", what.status)
      .col_str("reason", 512, "", what.reason)
      .col_str("report", 256, "", what.report)
      .col_f64("tokens_per_s", "tokens/s", what.tokens_per_s)
      .col_f64("mfu", "1", what.mfu)
      .col_f64("step_time", "s", what.step_time)
      .col_f64("peak_bytes", "B", what.peak_bytes)
      .col_f64("final_loss", "nats/token", what.final_loss);
  return t;
}

}  // namespace strata::report
