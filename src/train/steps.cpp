#include "src/train/steps.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "kernels/foundation/clock.hpp"
#include "kernels/foundation/error.hpp"
#include "src/train/run_control.hpp"

namespace strata::train {

namespace {

// STRATA_INJECT_FAILURE="RANK:STEP" makes that rank fail at the start of that
// step: how the tests (and a user checking a cluster's launcher) see that one
// failing rank ends the whole job with its message instead of a hang.
struct InjectedFailure {
  int rank = -1, step = -1;
};
InjectedFailure injected_failure() {
  InjectedFailure f;
  if (const char* v = std::getenv("STRATA_INJECT_FAILURE")) {
    if (std::sscanf(v, "%d:%d", &f.rank, &f.step) != 2)
      core::input_error("STRATA_INJECT_FAILURE={}: expected RANK:STEP, e.g. 1:3", v);
  }
  return f;
}

}  // namespace

void StepLoop::run(int first, LoopEnd& end) {
  using Outcome = LoopEnd::Outcome;
  console.first_step = first;
  console.started = prof::now_seconds();
  const InjectedFailure inject = injected_failure();
  for (int s = first; s < cfg.run.steps; ++s) {
    if (rank == inject.rank && s == inject.step)
      core::runtime_error("failure injected by STRATA_INJECT_FAILURE at step {}", s);
    log.set_step(s);
    tracker.reset_peaks();
    const std::size_t first_call = log.records().size();
    StepRecord& r = records.keep(trainer.step(s), trainer, tracker, first_call);
    // The step boundary: signals, divergence and the step's time, agreed.
    // An fp16 overflow that the loss scale skipped is not divergence; its
    // loss is finite.
    const Boundary b = agree_at_boundary(session.control(),
                                         !std::isfinite(r.loss) || (!std::isfinite(r.grad_norm) && !r.skipped),
                                         r.rank_step_time, double(records.last_device_peak()));
    r.set_time(b.slowest_step_time, job_peak);
    const int every = cfg.run.log_every;
    if (rank == 0) {
      console.add(r, b.largest_device_peak);
      if (every > 0 && ((s + 1) % every == 0 || s == cfg.run.steps - 1)) console.line(r);
    }
    if (b.diverged && end.diverged_at < 0) {
      end.diverged_at = s;
      if (rank == 0)
        fmt::print("step {}: the loss or the gradient norm is not finite{}\n", s,
                   cfg.run.on_divergence == plan::OnDivergence::stop ? "; stopping (run.on_divergence = \"stop\")"
                                                                     : "; continuing (run.on_divergence = \"continue\")");
    }
    if (b.diverged && cfg.run.on_divergence == plan::OnDivergence::stop) {
      end.outcome = Outcome::diverged;  // no checkpoint of diverged weights
      return;
    }
    const bool stopping = b.signal != 0 && s + 1 < cfg.run.steps;
    if (session.checkpoint_due(s + 1, stopping)) {
      const std::string path =
          session.checkpoint(s + 1, trainer.strategy(), trainer.registry(), global_writer, trainer.scaler());
      if (rank == 0) fmt::print("checkpoint: {}\n", path);
    }
    if (!stopping && records.window_full()) records.flush(session.report());
    if (stopping) {
      end.outcome = Outcome::interrupted;
      end.stopped_by = b.signal;
      if (rank == 0)
        fmt::print("{}: stopped after step {} of {}{}\n", signal_name(b.signal), s, cfg.run.steps,
                   session.checkpoints() ? "" : " (no checkpoint: --checkpoint-every is 0)");
      return;
    }
  }
}

}  // namespace strata::train
