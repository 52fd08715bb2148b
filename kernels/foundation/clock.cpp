#include "kernels/foundation/clock.hpp"

#include <cmath>

#include <fmt/format.h>

namespace strata::prof {

std::string format_duration(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  if (s < 1) return fmt::format("{:.0f} ms", s * 1e3);
  if (s < 60) return fmt::format("{:.1f} s", s);
  const long t = std::lround(s);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}h{:02}m", t / 3600, t % 3600 / 60);
}

}  // namespace strata::prof
