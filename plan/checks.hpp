// What a registry row's checks report to: the deck's resolver, which knows
// where every key's value came from (a file's line, a --set, the default).
// A row checks the constraints between its own keys and the rest of the
// plan, so the deck's central validator keeps only what is truly global.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata::plan {

struct Plan;

class PlanChecks {
 public:
  virtual ~PlanChecks() = default;
  // "parallel.tp = 4 (line 7)": the key's final value and where it came from.
  virtual std::string show(std::string_view key) const = 0;
  // A violated constraint between `keys`; the message is placed at the first
  // of them the deck sets (else at the deck).
  virtual void error(const std::vector<std::string_view>& keys, std::string message) = 0;
  // Whether the model's own checks and its size checks passed, so that its
  // dimensions can be multiplied (the parameter count computed) without
  // overflowing: a check that needs the model's sizes runs only then.
  virtual bool sized() const = 0;
};

using PlanCheck = void (*)(const plan::Plan&, PlanChecks&);

}  // namespace strata::plan
