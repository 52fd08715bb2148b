// The process mesh: world = pp x dp x cp x tp with tp varying fastest
// (tensor parallel ranks are neighbours, so they share a node), then cp (the
// context-parallel ranks that split each sequence: next to share a node),
// then dp, then pp. Parameter gradients are reduced over dp x cp (the dp_cp
// group), whose every rank holds the same parameters.
// Expert parallelism divides dp: the ep consecutive dp ranks of an ep group
// hold different experts (ep coordinate dp % ep), and the dp / ep ranks that
// hold the same experts form an expert-data-parallel (edp) group (edp
// coordinate dp / ep). Hybrid sharding divides dp the same way: the
// dp_shard consecutive dp ranks of a shard group split the ZeRO state between
// them (neighbours, so inside a node where it fits), and the dp / dp_shard
// ranks holding the same shard form a replica group.
// One function maps a rank to its coordinates and back; the Mesh builds one
// communicator per axis with MPI_Comm_split, of the chosen backend (MPI,
// MPI staging device buffers through host memory, or NCCL), each wrapped in
// the profiling layer so every call on any axis is recorded.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/comm/backend.hpp"
#include "src/comm/comm_log.hpp"
#include "strategies/plan.hpp"
#include "kernels/foundation/communicator.hpp"

namespace strata::mesh {

struct Layout {
  int pp = 1, dp = 1, tp = 1;
  int ep = 1;  // divides dp
  int dp_shard = 0;  // divides dp; 0: dp (ZeRO shards over the whole dp group)
  int cp = 1;        // context-parallel ranks per sequence
  // The pipeline ranks holding the first and the last stage, whose two
  // copies of the tied word embedding form the emb group (-1: pp - 1). The
  // schedule's placement says which (layout_of).
  int emb_first = 0, emb_last = -1;
  int world() const { return pp * dp * cp * tp; }
  int shard() const { return dp_shard > 0 ? dp_shard : dp; }
  int last_stage_rank() const { return emb_last < 0 ? pp - 1 : emb_last; }
  // Whether pipeline rank `r` is in an emb group: the first or the last
  // stage's, when they are two ranks (one rank holding both, as ZB-V's V
  // places them, sums its two copies itself).
  bool in_emb_group(int r) const {
    return pp > 1 && emb_first != last_stage_rank() && (r == emb_first || r == last_stage_rank());
  }
};

// "pp 2 x dp 4 x tp 1", with " x cp C" when C > 1 and " (ep E)" and
// " (dp_shard S)" where they split dp.
std::string describe(const Layout& l);

// The layout a plan asks for: its axes, and the ranks of its first and last
// stage under its schedule's placement.
Layout layout_of(const plan::Plan& p);

struct Coords {
  int pp = 0, dp = 0, tp = 0, cp = 0;
};

Coords coords_of(const Layout& l, int rank);
int rank_of(const Layout& l, const Coords& c);

// The world ranks of `rank`'s group along `axis` ("dp", "tp", "pp", "cp",
// "dp_cp", "ep", "edp", "dp_shard", "dp_replica", "emb"; anything else: the
// world), in group-rank order (dp_cp: dp-major).
std::vector<int> group_ranks(const Layout& l, const std::string& axis, int rank);

// The mesh table of layout `l`: one line per rank with its host (hosts[r],
// or "-" where hosts is empty), its coordinates and the world ranks of each
// group it belongs to.
std::string layout_table(const Layout& l, const std::vector<std::string>& hosts = {});

// The communicators a trainer works over; null where a run has no mesh (a
// single rank) or does not use the axis.
struct Groups {
  comm::Communicator *dp = nullptr, *tp = nullptr, *pp = nullptr;
  comm::Communicator* emb = nullptr;  // the first and last stage's (null on the others)
  comm::Communicator *ep = nullptr, *edp = nullptr;
  comm::Communicator *dp_shard = nullptr, *dp_replica = nullptr;
  comm::Communicator *cp = nullptr, *dp_cp = nullptr;
};

class Mesh {
 public:
  // Collective over `world`. Requires l.world() == size of `world` (checked:
  // runtime error naming the constraint). Every axis communicator records
  // its calls into `log`. `backend` carries them: a backend this build lacks
  // (nccl, mpi_staged without the CUDA backend) is a runtime error on every
  // rank; nccl needs each rank's GPU chosen (cudaSetDevice) beforehand.
  Mesh(MPI_Comm world, const Layout& l, comm::CommLog& log, comm::Backend backend = comm::Backend::mpi);
  // The mesh as world rank `rank` of layout `l` sees it, on the meta device
  // (a dry run, one process, no MPI): every axis a MetaCommunicator of the
  // group's size in which this process plays the rank's part; calls are
  // recorded into `log` as a real rank's are.
  Mesh(const Layout& l, int rank, comm::CommLog& log);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const Layout& layout() const { return layout_; }
  const Coords& coords() const { return coords_; }
  int rank() const { return rank_; }
  comm::Backend backend() const { return backend_; }

  comm::Communicator& world() { return *world_; }
  comm::Communicator& dp() { return *dp_; }
  comm::Communicator& tp() { return *tp_; }
  comm::Communicator& pp() { return *pp_; }
  // The expert-parallel group (size ep) and the expert-data-parallel group
  // (size dp / ep) through this rank; with ep = 1, a group of one and a
  // group equal to dp's.
  comm::Communicator& ep() { return *ep_; }
  comm::Communicator& edp() { return *edp_; }
  // Hybrid sharding's shard group (size dp_shard) and replica group (size
  // dp / dp_shard); without it, a group equal to dp's and a group of one.
  comm::Communicator& dp_shard() { return *shard_; }
  comm::Communicator& dp_replica() { return *replica_; }
  // The context-parallel group (size cp) and the dp x cp group the
  // parameter gradients are reduced over (equal to dp's when cp = 1).
  comm::Communicator& cp() { return *cp_; }
  comm::Communicator& dp_cp() { return *dp_cp_; }
  // The first and last pipeline stages of this rank's (dp, tp) position,
  // which both hold the tied word embedding; null on the other stages.
  comm::Communicator* embedding() { return emb_.get(); }
  // Every group of this rank, as a trainer takes them.
  Groups groups() {
    return {dp_.get(),    tp_.get(),    pp_.get(),      emb_.get(), ep_.get(),
            edp_.get(),   shard_.get(), replica_.get(), cp_.get(),  dp_cp_.get()};
  }

  // Collective. The table --dry-run prints: one line per rank with its host,
  // coordinates and the world ranks of each group it belongs to. Every rank
  // gets the same text.
  std::string table() const;
  // The MPI communicator of an axis named as in comm::kAxes (MPI_COMM_NULL
  // where this rank has none, or on the meta device).
  MPI_Comm mpi_comm(std::string_view axis) const;

 private:
  void release();
  // Each group's MPI communicator and profiled communicator, in the order
  // mesh.cpp lists the axes (dp, tp, pp, cp, dp_cp, ep, edp, dp_shard,
  // dp_replica).
  struct Slot {
    MPI_Comm* comm;
    std::unique_ptr<comm::Communicator>* group;
  };
  std::vector<Slot> slots();

  Layout layout_;
  comm::Backend backend_;
  Coords coords_;
  int rank_ = 0;
  MPI_Comm world_comm_ = MPI_COMM_NULL, dp_comm_ = MPI_COMM_NULL, tp_comm_ = MPI_COMM_NULL, pp_comm_ = MPI_COMM_NULL,
           emb_comm_ = MPI_COMM_NULL, ep_comm_ = MPI_COMM_NULL, edp_comm_ = MPI_COMM_NULL,
           shard_comm_ = MPI_COMM_NULL, replica_comm_ = MPI_COMM_NULL, cp_comm_ = MPI_COMM_NULL,
           dp_cp_comm_ = MPI_COMM_NULL;
  std::unique_ptr<comm::Communicator> world_, dp_, tp_, pp_, emb_, ep_, edp_, shard_, replica_, cp_, dp_cp_;
};

}  // namespace strata::mesh
