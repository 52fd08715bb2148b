// Sharded checkpoints: every rank writes its own state (the strategy's
// state tensors: parameters as it holds them, optimizer moments) to its own
// file, and rank 0 a manifest with the layout; all of it under a temporary
// directory that is renamed to DIR/step-NNNNNN only once every rank's file
// and the manifest are on disk. A checkpoint directory therefore either
// exists whole under its final name or not at all: a job killed while
// writing leaves the partial directory (".step-NNNNNN.partial") behind and
// every earlier checkpoint intact.
//
// Everything else a step reads is a function of the step number (data,
// learning rate, AdamW's bias correction), so restoring the state tensors
// and continuing at the saved step reproduces the uninterrupted run bit for
// bit on the same layout.
//
// For another layout, the ranks of expert-data-parallel coordinate 0 (dp
// rank 0 without ep) also write their full state (parameters and moments,
// gathered over their groups) parameter by parameter with each one's name,
// global shape and slices (global-RRRRR.bin): a rank of any layout rebuilds
// its part from those by name and global index.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/param_registry.hpp"
#include "strategies/axes.hpp"
#include "src/train/trainer.hpp"
#include "strategies/state_strategy.hpp"

namespace strata::train {

// What a checkpoint's manifest records of the run that wrote it: a resume on
// the same layout loads each rank's own file, on another it re-shards
// through the global files. The precision belongs to it: 16-bit parameters
// and fp32 master weights are other state tensors than fp32 parameters.
struct CheckpointLayout {
  int world = 1, zero = 0, virtual_stages = 1;
  // The size of every dim and group of the mesh, by name
  // (strategies/axes.hpp): which ranks hold what.
  std::map<std::string, int> axes;
  std::string text;           // the layout described, for messages
  std::string run_name;
  std::string resolved_deck;  // the deck the run resolved to (for the record)
  std::string precision = "fp32";
  // With a pipeline, the blocks each pipeline rank's chunks hold ("pp 0:
  // blocks 1-2, 7-8; pp 1: ..."): the schedule's placement and the stages'
  // sizes decide it, and a rank's file holds those blocks. Empty without
  // one (and in checkpoints older than this key: a re-shard then).
  std::string placement;
  // An axis one of them lacks counts as different (a re-shard is always right).
  bool operator==(const CheckpointLayout& o) const {
    return world == o.world && zero == o.zero && virtual_stages == o.virtual_stages && precision == o.precision &&
           axes == o.axes && placement == o.placement;
  }
  std::string describe() const;
};

// The checkpoint layout of a run of `p` on `l`.
CheckpointLayout checkpoint_layout(const mesh::Layout& l, const plan::Plan& p, const std::string& resolved_deck);

// Collective over `comm`. Writes the state after `step` completed steps to
// `dir`/step-NNNNNN (creating `dir`); returns that path. Each rank's file is
// fsync'ed before the manifest is written, the manifest before the rename.
// `global_writer`: this rank also writes the layout-independent full state
// of its registry `reg` (one rank per distinct registry: mesh::first_copy).
// `scaler`: the loss scaler's state after `step` (the manifest keeps it).
std::string write_checkpoint(MPI_Comm comm, const std::string& dir, int step, const CheckpointLayout& layout,
                             strategies::StateStrategy& strategy, const models::ParamRegistry& reg,
                             bool global_writer, const ScalerState& scaler = {});

struct CheckpointRef {
  std::string dir;  // the checkpoint directory (with its manifest)
  int step = 0;     // completed steps: the run continues with this one
  bool reshard = false;       // written by another layout: load through the full state
  std::string saved_layout;   // its layout, described
  std::vector<std::string> global_files;
  ScalerState scaler;          // the loss scaler after `step`
  bool same_precision = true;  // its scale applies to this run (else the deck's initial one)
};

// Rank 0, after write_checkpoint of `step`: removes the complete checkpoints
// of earlier steps in `dir` but the `keep` - 1 latest (run.keep_checkpoints;
// 0 keeps every one). Later steps (another run's) and anything that is not
// a step-NNNNNN directory are left.
void prune_checkpoints(const std::string& dir, int step, int keep);

// `path`: a checkpoint directory, or a directory of them (the highest step
// is taken; partial ones are ignored). Checks that it is complete and that
// its [model] matches this run's (an input error naming the difference
// otherwise, on every rank); a different layout sets `reshard`. Collective; call before writing
// anything.
CheckpointRef find_checkpoint(MPI_Comm comm, const std::string& path, const CheckpointLayout& layout);

// A manifest's text as written: `body` and its checksum line (the fuzzer
// seals what it mutates, so that the manifest's own checks are reached).
std::string seal_manifest(const std::string& body);

// Restores this rank's state from `ref`: on the same layout its own file
// into the strategy's state tensors (checksum, names and sizes checked); on
// another, every rank rebuilds its registry's parameters and moments from
// the global files by name and global index. Collective: a failure on any
// rank is an error on every rank.
void load_checkpoint(MPI_Comm comm, const CheckpointRef& ref, strategies::StateStrategy& strategy,
                     const models::ParamRegistry& reg);

}  // namespace strata::train
