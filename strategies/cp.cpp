#include "strategies/cp.hpp"

#include <fmt/format.h>

#include <vector>

#include "kernels/kernels.hpp"
#include "plan/plan.hpp"

namespace strata::strategies {

namespace {

using plan::key, plan::Plan, plan::ParallelSection;

// Tags of the ring's two exchanges on the cp communicator.
constexpr int kKvTag = 31, kGradTag = 32;

std::int64_t kv_elements(int B, int Tl, int KVC) { return 2 * std::int64_t(B) * Tl * KVC; }

// Chunk c of 2 cp: the first half of rank r's tokens is chunk r, the second
// chunk 2 cp - 1 - r.
int chunk_of(int half, int rank, int cp) { return half == 0 ? rank : 2 * cp - 1 - rank; }

void check_cp(const Plan& p, PlanChecks& checks) {
  const int cp = p.parallel.cp;
  if (cp == 1) return;
  if (p.model.seq_len % (2 * cp) != 0)
    checks.error({"model.seq_len", "parallel.cp"},
                 fmt::format("{} is not a multiple of 2 x {}: context parallelism cuts each sequence into 2 cp "
                             "chunks, two per rank",
                             checks.show("model.seq_len"), checks.show("parallel.cp")));
  else if (p.parallel.sequence_parallel && (p.model.seq_len / cp) % p.parallel.tp != 0)
    checks.error({"model.seq_len", "parallel.cp", "parallel.tp", "parallel.sequence_parallel"},
                 fmt::format("{} / {} is not a multiple of {}: sequence parallelism splits each rank's tokens over "
                             "tp ranks",
                             checks.show("model.seq_len"), checks.show("parallel.cp"), checks.show("parallel.tp")));
}

// The cp dim (between dp and tp: the ring's neighbours share a node after
// tp's), its ring, and dp x cp, the ranks holding the same parameters.
void cp_axes(const Plan& p, mesh::Layout& l) {
  const bool on = p.parallel.cp > 1;
  mesh::add_dim(l, {.name = "cp", .size = p.parallel.cp, .nest = 300, .doc = "context-parallel index", .shown = on});
  mesh::add_group(l, {.name = "cp", .dims = {"cp"}, .same_params = true, .shown = on,
                      .doc = "context parallelism's ring: send and recv of key-value blocks and their gradients"});
  mesh::add_group(l, {.name = "dp_cp", .dims = {"dp", "cp"}, .shown = on,
                      .doc = "dp x cp under context parallelism: the gradient and ZeRO traffic, and the loss"});
}

void cp_parts(const Plan&, const MeshGroups& mesh, Parallel& out) {
  comm::Communicator* cp = several(mesh.group("cp"));
  out.cp = make_context_seam(cp);
  if (cp != nullptr) out.same_params = mesh.group("dp_cp");
}

// cp ranks each taking two of the 2 cp chunks of a sequence.
std::vector<std::string> cp_sizes(const Space& s, const Plan& p) {
  std::vector<std::string> out;
  for (int cp : divisors(devices_left(s, p)))
    if (p.model.seq_len % (2 * cp) == 0) out.push_back(std::to_string(cp));
  return out;
}

}  // namespace

const Row& context_parallel_row() {
  static const Row row{
      "cp",
      "context parallelism (ring attention): each sequence split over cp ranks as 2 cp chunks, two per rank; keys "
      "and values passed around the ring while each block is computed; parameter gradients reduced over dp x cp",
      {key<&Plan::parallel, &ParallelSection::cp>(
           "parallel", "cp", "context-parallel ranks splitting each sequence (ring attention); seq_len a multiple of 2 cp")
           .at_least(1)},
      cp_axes,
      check_cp,
      "activations 1/cp (every buffer holds seq_len / cp tokens of each sequence; attention keeps the rows' "
      "log-sum-exp, B NH T / cp floats); workspace seven key-value blocks of 2 B (T / cp) KVC / tp elements (five in "
      "the compute precision, two fp32); per block and micro-batch cp - 1 sends of 2 B (T / cp) KVC / tp elements "
      "forward, 2 (cp - 1) + 1 backward (keys and values, then their gradients), in the compute precision",
      cp_parts,
      {{30, "parallel.cp", cp_sizes, false, "cp", "1"}}};
  return row;
}

int RingAttention::position(int t, int T) const {
  const int Tc = T / (2 * size());
  return t < Tc ? rank() * Tc + t : chunk_of(1, rank(), size()) * Tc + (t - Tc);
}

int RingAttention::run_from(int t, int T) const {
  // Two chunks of Tc tokens each, each at consecutive positions.
  const int Tc = T / (2 * size());
  return t < Tc ? Tc - t : 2 * Tc - t;
}

std::int64_t RingAttention::state_elements(bool, int B, int NH, int, int Tl, int) const {
  return std::int64_t(B) * NH * Tl;
}

core::Precision RingAttention::state_format(bool, core::Precision) const { return core::Precision::fp32; }

std::int64_t RingAttention::scratch_bytes(bool, int B, int NH, int NKV, int Tl, int C, core::Precision act) const {
  const std::int64_t n = kv_elements(B, Tl, C / NH * NKV);
  return n * (5 * core::element_bytes(act) + 2 * 4);
}

namespace {

// The ring's buffers, carved from its scratch: the key-value blocks in use
// and arriving, and (backward) this rank's gradients of a block in fp32, their
// rounding as sent, and the gradient arriving from the rank before.
struct RingBuffers {
  core::Ptr kv[2], dkv_sent[2], dkv_in;
  float* dkv_mine[2];
  RingBuffers(std::byte* scratch, std::int64_t n, core::Precision act) {
    const std::int64_t e = core::element_bytes(act) * n;
    for (int i = 0; i < 2; ++i) kv[i] = core::Ptr(scratch + i * e, act);
    for (int i = 0; i < 2; ++i) dkv_sent[i] = core::Ptr(scratch + (2 + i) * e, act);
    dkv_in = core::Ptr(scratch + 4 * e, act);
    for (int i = 0; i < 2; ++i) dkv_mine[i] = reinterpret_cast<float*>(scratch + 5 * e) + i * n;
  }
};

}  // namespace

void RingAttention::attention_forward(core::Ptr out, core::Ptr lse, std::byte* scratch, core::CPtr qkv, int B, int Tl,
                                      int C, int NH, int NKV) {
  const int p = size(), r = rank(), Tc = Tl / 2;
  const std::int64_t KVC = std::int64_t(C) / NH * NKV, n = kv_elements(B, Tl, int(KVC)), C2 = 2 * KVC, C3 = C + 2 * KVC;
  const RingBuffers buf(scratch, n, qkv.precision());
  const core::Ptr* kv = buf.kv;
  kernels::copy_rows(kv[0], C2, qkv + C, C3, std::int64_t(B) * Tl, C2, false);
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  bool first[2] = {true, true};  // a query chunk's first block sets its rows, the rest merge into them
  for (int s = 0; s < p; ++s) {
    // The next block travels while this one is computed.
    std::vector<comm::RequestPtr> ring;
    if (s + 1 < p) {
      ring.push_back(comm::isend(cp_, kv[s % 2], n, next, kKvTag));
      ring.push_back(comm::irecv(cp_, kv[(s + 1) % 2], n, prev, kKvTag));
    }
    const int src = (r + p - s) % p;  // whose keys and values these are
    for (int qh = 0; qh < 2; ++qh)
      for (int kh = 0; kh < 2; ++kh) {
        const int cq = chunk_of(qh, r, p), ck = chunk_of(kh, src, p);
        if (ck > cq) continue;  // the keys all come after the queries
        kernels::attention_block_forward(out + std::int64_t(qh) * Tc * C, lse.f32() + std::int64_t(qh) * Tc,
                                         qkv + std::int64_t(qh) * Tc * C3, kv[s % 2] + std::int64_t(kh) * Tc * C2, B,
                                         Tc, Tc, C, NH, NKV, Tl, Tl, cq * Tc, ck * Tc, !first[qh]);
        first[qh] = false;
      }
    for (auto& q : ring) q->wait();
  }
}

void RingAttention::attention_backward(core::Ptr dqkv, std::byte* scratch, core::CPtr dout, core::CPtr qkv,
                                       core::CPtr out, core::CPtr lse, int B, int Tl, int C, int NH, int NKV) {
  const int p = size(), r = rank(), Tc = Tl / 2;
  const std::int64_t KVC = std::int64_t(C) / NH * NKV, n = kv_elements(B, Tl, int(KVC)), C2 = 2 * KVC, C3 = C + 2 * KVC;
  const RingBuffers buf(scratch, n, qkv.precision());
  const core::Ptr* kv = buf.kv;
  kernels::copy_rows(kv[0], C2, qkv + C, C3, std::int64_t(B) * Tl, C2, false);
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  // One receive of a block's gradient is always posted before any send is
  // waited for, so the ring cannot wait on itself.
  comm::RequestPtr incoming = comm::irecv(cp_, buf.dkv_in, n, prev, kGradTag);
  comm::RequestPtr sent[2];
  for (int s = 0; s < p; ++s) {
    std::vector<comm::RequestPtr> ring;
    if (s + 1 < p) {
      ring.push_back(comm::isend(cp_, kv[s % 2], n, next, kKvTag));
      ring.push_back(comm::irecv(cp_, kv[(s + 1) % 2], n, prev, kKvTag));
    }
    const int src = (r + p - s) % p;
    // This step's gradient of the block in hand, in fp32, plus what came
    // with it: two, so that one travels on while the next step computes into
    // the other.
    float* mine = buf.dkv_mine[s % 2];
    if (sent[s % 2]) sent[s % 2]->wait();  // two steps ago's gradient has left its buffer
    kernels::fill_zero(mine, n);
    for (int qh = 0; qh < 2; ++qh)
      for (int kh = 0; kh < 2; ++kh) {
        const int cq = chunk_of(qh, r, p), ck = chunk_of(kh, src, p);
        if (ck > cq) continue;
        kernels::attention_block_backward(dqkv + std::int64_t(qh) * Tc * C3, mine + std::int64_t(kh) * Tc * C2,
                                          dout + std::int64_t(qh) * Tc * C, qkv + std::int64_t(qh) * Tc * C3,
                                          kv[s % 2] + std::int64_t(kh) * Tc * C2, out + std::int64_t(qh) * Tc * C,
                                          lse.f32() + std::int64_t(qh) * Tc, B, Tc, Tc, C, NH, NKV, Tl, Tl, cq * Tc,
                                          ck * Tc);
      }
    if (s > 0) {
      incoming->wait();
      kernels::add_inplace(mine, buf.dkv_in, n);
      incoming = comm::irecv(cp_, buf.dkv_in, n, prev, kGradTag);
    }
    // On to the next rank, which meets this block at the next step; after
    // the last step the next rank is the block's owner. Rounded once.
    kernels::convert(buf.dkv_sent[s % 2], mine, n);
    sent[s % 2] = comm::isend(cp_, buf.dkv_sent[s % 2], n, next, kGradTag);
    for (auto& q : ring) q->wait();
  }
  for (auto& q : sent)
    if (q) q->wait();
  incoming->wait();  // this rank's own keys and values' gradient, summed over the ring
  kernels::copy_rows(dqkv + C, C3, buf.dkv_in, C2, std::int64_t(B) * Tl, C2, true);
}

std::unique_ptr<models::ContextSeam> make_context_seam(comm::Communicator* cp) {
  if (cp == nullptr || cp->size() == 1) return std::make_unique<models::WholeSequence>();
  return std::make_unique<RingAttention>(*cp);
}

}  // namespace strata::strategies
