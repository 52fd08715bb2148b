// The meta backend: every operation of kernels/ops.inc "run" on the meta
// device of a dry run, which has no memory: it does nothing but count what
// the operation would do, its FLOPs and the bytes it reads and writes once,
// under the thread's current work (prof::current_work: layer and phase), for
// kernels::meta_costs(). So a step run on the meta device declares its
// compute exactly as it declares its memory and communication: by being run.
#pragma once

#include <cstdint>

#include "kernels/foundation/ptr.hpp"

namespace strata::kernels::meta {

#include "kernels/ops.inc"

}  // namespace strata::kernels::meta
