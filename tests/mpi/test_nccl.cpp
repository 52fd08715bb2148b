// Tests of the CUDA-aware communicators (1 and 2 ranks, CUDA builds only):
// NcclCommunicator and HostStagedCommunicator on device buffers give what
// MpiCommunicator gives on the same data in host buffers, in f32 and bf16
// (integer-valued data, so sums are exact in any order and compare with ==);
// host buffers through either take the MPI path; both work under the Mesh.
// Without a GPU every test skips, saying why. NCCL cannot put two ranks of a
// communicator on one GPU, so its tests skip where ranks outnumber a node's
// GPUs; the staged ones still run.
// All ranks decide alike (see mpi_main.cpp): conditions are reduced first.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "src/comm/comm_log.hpp"
#include "src/comm/cuda_support.hpp"
#include "src/comm/mpi_communicator.hpp"
#include "src/comm/nccl_communicator.hpp"
#include "src/comm/staged_communicator.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/foundation/precision.hpp"
#include "src/mesh/mesh.hpp"
#include "kernels/foundation/clock.hpp"
#include "tests/mpi/mpi_world.hpp"

namespace {

using namespace strata;
using comm::DType;
using comm::ReduceOp;

using strata::mpi_test::DupWorld;

// What every rank agrees on: the fewest GPUs any rank sees, and whether
// every node has a GPU for each of its ranks. Selects this rank's GPU
// (node rank mod count, as the program does).
struct Gpus {
  int fewest = 0;
  bool one_per_rank = false;
  int ranks_per_node = 1;
};

Gpus find_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0, local_size = 1;
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  if (n > 0) {
    EXPECT_EQ(cudaSetDevice(local % n), cudaSuccess);
  }
  int mine[3] = {n, local_size <= n ? 1 : 0, -local_size}, all[3] = {};
  MPI_Allreduce(mine, all, 3, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return Gpus{all[0], all[1] != 0, -all[2]};
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    gpus_ = find_gpus();
    if (gpus_.fewest == 0) GTEST_SKIP() << "no usable CUDA GPU on some rank: the GPU paths are not tested here";
  }
  // Call first in a test that needs NCCL.
  bool nccl_fits() const { return gpus_.one_per_rank; }
  Gpus gpus_;
};

#define SKIP_WITHOUT_GPU_PER_RANK()                                                                            \
  do {                                                                                                         \
    if (!nccl_fits())                                                                                          \
      GTEST_SKIP() << "NCCL needs a GPU per rank; a node has " << gpus_.ranks_per_node << " ranks and "        \
                   << gpus_.fewest << " GPU(s)";                                                               \
  } while (0)

// A device copy of a host vector.
template <typename T>
struct DeviceVec {
  T* p = nullptr;
  std::size_t n = 0;
  explicit DeviceVec(const std::vector<T>& h) : n(h.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), (n > 0 ? n : 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  ~DeviceVec() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// Small integers, different per seed, rank and index.
int val(int seed, int r, int i) { return (seed * 31 + r * 131 + i * 17 + (r * i) % 5) % 29 - 14; }

float as_f32(int v) { return float(v); }
std::uint16_t as_bf16(int v) { return core::float_to_half(float(v), core::Precision::bf16); }

template <typename T>
std::vector<T> values(T (*make)(int), int seed, int r, int count) {
  std::vector<T> v(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) v[std::size_t(i)] = make(val(seed, r, i));
  return v;
}

// Every operation of `dev` on device buffers against `ref` (MPI, the same
// group) on host buffers holding the same data.
template <typename T>
void compare_collectives(comm::Communicator& dev, comm::Communicator& ref, DType t, T (*make)(int), int seed) {
  const int n = ref.size(), r = ref.rank();
  ASSERT_EQ(dev.size(), n);
  ASSERT_EQ(dev.rank(), r);
  const std::string on = dev.axis();
  {  // all_reduce: blocking, waited, polled; f32 also max
    const int count = 1000;
    std::vector<T> h = values(make, seed, r, count);
    DeviceVec<T> a(h), b(h), c(h);
    ref.all_reduce(h.data(), count, t, ReduceOp::sum);
    dev.all_reduce(a.p, count, t, ReduceOp::sum);
    dev.iall_reduce(b.p, count, t, ReduceOp::sum)->wait();
    auto q = dev.iall_reduce(c.p, count, t, ReduceOp::sum);
    while (!q->test()) {
    }
    EXPECT_EQ(a.get(), h) << "all_reduce on " << on;
    EXPECT_EQ(b.get(), h) << "iall_reduce (wait) on " << on;
    EXPECT_EQ(c.get(), h) << "iall_reduce (test) on " << on;
    if (t == DType::f32) {
      std::vector<T> m = values(make, seed + 1, r, count);
      DeviceVec<T> d(m);
      ref.all_reduce(m.data(), count, t, ReduceOp::max);
      dev.all_reduce(d.p, count, t, ReduceOp::max);
      EXPECT_EQ(d.get(), m) << "all_reduce max on " << on;
    }
  }
  {  // reduce_scatter
    const int k = 37;
    std::vector<T> s = values(make, seed + 2, r, n * k), h(std::size_t(k), make(-99));
    DeviceVec<T> ds(s), dr(h), dr2(h);
    ref.reduce_scatter(s.data(), h.data(), k, t, ReduceOp::sum);
    dev.reduce_scatter(ds.p, dr.p, k, t, ReduceOp::sum);
    dev.ireduce_scatter(ds.p, dr2.p, k, t, ReduceOp::sum)->wait();
    EXPECT_EQ(dr.get(), h) << "reduce_scatter on " << on;
    EXPECT_EQ(dr2.get(), h) << "ireduce_scatter on " << on;
  }
  {  // all_gather: out of place, in place, non-blocking
    const int k = 29;
    std::vector<T> s = values(make, seed + 3, r, k), h(std::size_t(n * k), make(-99));
    std::vector<T> in_place(std::size_t(n * k), make(-99));
    for (int i = 0; i < k; ++i) in_place[std::size_t(r * k + i)] = s[std::size_t(i)];
    DeviceVec<T> ds(s), dr(h), dr2(h), dip(in_place);
    ref.all_gather(s.data(), h.data(), k, t);
    dev.all_gather(ds.p, dr.p, k, t);
    dev.all_gather(dip.p + r * k, dip.p, k, t);
    dev.iall_gather(ds.p, dr2.p, k, t)->wait();
    EXPECT_EQ(dr.get(), h) << "all_gather on " << on;
    EXPECT_EQ(dip.get(), h) << "all_gather in place on " << on;
    EXPECT_EQ(dr2.get(), h) << "iall_gather on " << on;
  }
  {  // broadcast from the last rank, ibroadcast from rank 0
    const int k = 23;
    std::vector<T> h = values(make, seed + 4, r, k), h2 = values(make, seed + 5, r, k);
    DeviceVec<T> d(h), d2(h2);
    ref.broadcast(h.data(), k, t, n - 1);
    ref.ibroadcast(h2.data(), k, t, 0)->wait();
    dev.broadcast(d.p, k, t, n - 1);
    dev.ibroadcast(d2.p, k, t, 0)->wait();
    EXPECT_EQ(d.get(), h) << "broadcast on " << on;
    EXPECT_EQ(d2.get(), h2) << "ibroadcast on " << on;
  }
  {  // all_to_all
    const int k = 5;
    std::vector<T> s = values(make, seed + 6, r, n * k), h(std::size_t(n * k), make(-99));
    DeviceVec<T> ds(s), dr(h);
    ref.all_to_all(s.data(), h.data(), k, t);
    dev.all_to_all(ds.p, dr.p, k, t);
    EXPECT_EQ(dr.get(), h) << "all_to_all on " << on;
  }
  {  // all_to_allv: uneven counts, zeros, gaps that must stay untouched
    auto cnt = [&](int s, int d) { return (s + 2 * d + seed) % 4; };
    std::vector<std::int64_t> sc(n), sd(n), rc(n), rd(n);
    std::int64_t stotal = 0, rtotal = 0;
    for (int p = 0; p < n; ++p) {
      sc[p] = cnt(r, p), sd[p] = stotal, stotal += sc[p] + 1;
      rc[p] = cnt(p, r), rd[p] = rtotal, rtotal += rc[p] + 2;
    }
    std::vector<T> s = values(make, seed + 7, r, int(stotal)), h(std::size_t(rtotal), make(-7));
    DeviceVec<T> ds(s), dr(h);
    ref.all_to_allv(s.data(), sc.data(), sd.data(), h.data(), rc.data(), rd.data(), t);
    dev.all_to_allv(ds.p, sc.data(), sd.data(), dr.p, rc.data(), rd.data(), t);
    EXPECT_EQ(dr.get(), h) << "all_to_allv on " << on;
  }
  dev.barrier();
}

// Point-to-point in a ring (a rank's own GPU when alone): what the previous
// rank sent arrives. Patterns MPI allows with its buffered sends: each rank
// sends before it receives, as the pipeline schedules do.
template <typename T>
void check_point_to_point(comm::Communicator& dev, DType t, T (*make)(int), int seed) {
  const int n = dev.size(), r = dev.rank(), k = 101;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const std::vector<T> want = values(make, seed, prev, k), out = values(make, seed, r, k);
  const std::vector<T> blank(std::size_t(k), make(-99));
  DeviceVec<T> d_out(out), a(blank), b(blank), c(blank), e(blank), f(blank);
  {  // isend, then a blocking recv
    auto s = dev.isend(d_out.p, k, t, next, 1);
    dev.recv(a.p, k, t, prev, 1);
    s->wait();
  }
  {  // irecv and isend, waited in either order
    auto rr = dev.irecv(b.p, k, t, prev, 2);
    auto sr = dev.isend(d_out.p, k, t, next, 2);
    rr->wait();
    sr->wait();
  }
  EXPECT_EQ(a.get(), want) << "isend + recv on " << dev.axis();
  EXPECT_EQ(b.get(), want) << "irecv + isend on " << dev.axis();
  if (n < 2) return;
  // Blocking both ways: even ranks send first, odd ranks receive first.
  if (r % 2 == 0) {
    dev.send(d_out.p, k, t, next, 3);
    dev.recv(c.p, k, t, prev, 3);
  } else {
    dev.recv(c.p, k, t, prev, 3);
    dev.send(d_out.p, k, t, next, 3);
  }
  EXPECT_EQ(c.get(), want) << "send / recv on " << dev.axis();
  if (n != 2) return;
  // One step of 1F1B between two stages: rank 0 sends two activations and
  // then waits for a gradient; rank 1 receives the first activation, sends
  // the gradient, receives the second.
  if (r == 0) {
    auto s1 = dev.isend(d_out.p, k, t, 1, 4);
    auto s2 = dev.isend(d_out.p, k, t, 1, 5);
    dev.recv(e.p, k, t, 1, 6);
    s1->wait(), s2->wait();
    EXPECT_EQ(e.get(), want) << "gradient of the 1F1B step";
  } else {
    dev.recv(e.p, k, t, 0, 4);
    auto g = dev.isend(d_out.p, k, t, 0, 6);
    dev.recv(f.p, k, t, 0, 5);
    g->wait();
    EXPECT_EQ(e.get(), want) << "first activation of the 1F1B step";
    EXPECT_EQ(f.get(), want) << "second activation of the 1F1B step";
  }
}

// Host buffers take the MPI path: the trainer's loss and gradient norm.
void check_host_buffers(comm::Communicator& c) {
  const int n = c.size(), r = c.rank();
  double loss = r + 1;
  c.all_reduce(&loss, 1, DType::f64, ReduceOp::sum);
  EXPECT_EQ(loss, n * (n + 1) / 2.0) << "host all_reduce on " << c.axis();
  std::vector<float> v(8, float(r + 1));
  c.iall_reduce(v.data(), 8, DType::f32, ReduceOp::max)->wait();
  EXPECT_EQ(v, std::vector<float>(8, float(n))) << "host iall_reduce on " << c.axis();
  std::vector<std::int32_t> all(std::size_t(n), -1);
  const std::int32_t mine = r;
  c.all_gather(&mine, all.data(), 1, DType::i32);
  for (int p = 0; p < n; ++p) EXPECT_EQ(all[std::size_t(p)], p) << "host all_gather on " << c.axis();
}

TEST_F(Gpu, PointerClassification) {
  std::vector<float> host(4);
  DeviceVec<float> dev(host);
  float* managed = nullptr;
  ASSERT_EQ(cudaMallocManaged(reinterpret_cast<void**>(&managed), 16), cudaSuccess);
  EXPECT_TRUE(comm::is_device_memory(dev.p));
  EXPECT_TRUE(comm::is_device_memory(dev.p + 2));
  EXPECT_TRUE(comm::is_device_memory(managed));
  EXPECT_FALSE(comm::is_device_memory(host.data()));
  EXPECT_FALSE(comm::is_device_memory(nullptr));
  double scalar = 0;
  EXPECT_FALSE(comm::is_device_memory(&scalar));
  cudaFree(managed);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // no error left behind
}

TEST_F(Gpu, NcclMatchesMpi) {
  SKIP_WITHOUT_GPU_PER_RANK();
  DupWorld w;
  comm::MpiCommunicator ref(w.c, "world");
  comm::NcclCommunicator nccl(w.c, "world");
  EXPECT_EQ(nccl.axis(), "world");
  compare_collectives(nccl, ref, DType::f32, as_f32, 1);
  compare_collectives(nccl, ref, DType::bf16, as_bf16, 2);
  check_point_to_point(nccl, DType::f32, as_f32, 3);
  check_point_to_point(nccl, DType::bf16, as_bf16, 4);
  check_host_buffers(nccl);
  // The MPI path and the NCCL path interleave on one communicator.
  compare_collectives(nccl, ref, DType::f32, as_f32, 5);
  nccl.barrier();
}

TEST_F(Gpu, NcclRefusesMixedBuffersAndBadCounts) {
  SKIP_WITHOUT_GPU_PER_RANK();
  DupWorld w;
  comm::NcclCommunicator nccl(w.c, "world");
  const int n = nccl.size();
  std::vector<float> host(std::size_t(n) * 4, 1.f);
  DeviceVec<float> dev(host);
  // Refused before anything is posted, on every rank alike.
  std::string msg;
  try {
    nccl.reduce_scatter(host.data(), dev.p, 4, DType::f32, ReduceOp::sum);
  } catch (const core::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("device memory"), std::string::npos) << msg;
  EXPECT_THROW(nccl.all_reduce(dev.p, -1, DType::f32, ReduceOp::sum), core::Error);
  nccl.all_reduce(dev.p, 4, DType::f32, ReduceOp::sum);  // still usable
  EXPECT_EQ(dev.get()[0], float(n));
}

// A deferred isend is launched by wait(), by start_pending(), or by the next
// operation; test() alone does not launch it.
TEST_F(Gpu, NcclDeferredPointToPoint) {
  SKIP_WITHOUT_GPU_PER_RANK();
  DupWorld w;
  comm::NcclCommunicator nccl(w.c, "world");
  const int n = nccl.size(), r = nccl.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<float> out(64, float(r + 1)), blank(64, -1.f);
  DeviceVec<float> d_out(out), in(blank), in2(blank);
  auto rr = nccl.irecv(in.p, 64, DType::f32, prev, 0);
  auto sr = nccl.isend(d_out.p, 64, DType::f32, next, 0);
  EXPECT_FALSE(rr->test());
  nccl.start_pending();
  while (!rr->test()) {
  }
  sr->wait();
  EXPECT_EQ(in.get(), std::vector<float>(64, float(prev + 1)));
  // Launched by a collective that follows them.
  auto rr2 = nccl.irecv(in2.p, 64, DType::f32, prev, 0);
  auto sr2 = nccl.isend(d_out.p, 64, DType::f32, next, 0);
  nccl.barrier();
  EXPECT_TRUE(rr2->test());
  EXPECT_TRUE(sr2->test());
  EXPECT_EQ(in2.get(), std::vector<float>(64, float(prev + 1)));
}

// Operations on the device report their span from the stream's events, on
// the profiling clock and inside the host's window around them; host buffers
// (the MPI path) report none.
TEST_F(Gpu, NcclTimesOperationsWithEvents) {
  SKIP_WITHOUT_GPU_PER_RANK();
  DupWorld w;
  comm::NcclCommunicator nccl(w.c, "world");
  std::vector<float> host(1 << 20, 1.f);
  DeviceVec<float> dev(host);
  double s = 0, e = 0;
  const double t0 = prof::now_seconds();
  auto r = nccl.iall_reduce(dev.p, std::int64_t(host.size()), DType::f32, ReduceOp::sum);
  EXPECT_FALSE(r->device_span(&s, &e));  // not before it completed
  r->wait();
  const double t1 = prof::now_seconds();
  ASSERT_TRUE(r->device_span(&s, &e));
  // The clocks are matched at construction to within the event's latency.
  EXPECT_LE(s, e);
  EXPECT_GE(s, t0 - 1e-3);
  EXPECT_LE(e, t1 + 1e-3);
  nccl.all_reduce(dev.p, 8, DType::f32, ReduceOp::sum);
  EXPECT_TRUE(nccl.last_device_span(&s, &e));
  nccl.all_reduce(host.data(), 8, DType::f32, ReduceOp::sum);
  EXPECT_FALSE(nccl.last_device_span(&s, &e));
}

TEST_F(Gpu, StagedMatchesMpi) {
  DupWorld w;
  comm::MpiCommunicator ref(w.c, "world");
  comm::HostStagedCommunicator staged(std::make_unique<comm::MpiCommunicator>(w.c, "world"));
  EXPECT_EQ(staged.axis(), "world");
  compare_collectives(staged, ref, DType::f32, as_f32, 1);
  compare_collectives(staged, ref, DType::bf16, as_bf16, 2);
  check_point_to_point(staged, DType::f32, as_f32, 3);
  check_point_to_point(staged, DType::bf16, as_bf16, 4);
  check_host_buffers(staged);
  // Mixed: host input, device output, and the reverse.
  const int n = staged.size(), r = staged.rank(), k = 6;
  std::vector<float> s = values(as_f32, 9, r, n * k), h(std::size_t(k), -99.f);
  DeviceVec<float> ds(s), dr(h);
  ref.reduce_scatter(s.data(), h.data(), k, DType::f32, ReduceOp::sum);
  staged.reduce_scatter(s.data(), dr.p, k, DType::f32, ReduceOp::sum);
  EXPECT_EQ(dr.get(), h);
  std::vector<float> g(std::size_t(k), -99.f);
  staged.ireduce_scatter(ds.p, g.data(), k, DType::f32, ReduceOp::sum)->wait();
  EXPECT_EQ(g, h);
}

// The Mesh with each CUDA-aware backend: profiled, every axis usable.
TEST_F(Gpu, MeshBackends) {
  const int n = mpi_test::world_size();
  for (comm::Backend b : {comm::Backend::mpi_staged, comm::Backend::nccl}) {
    if (b == comm::Backend::nccl && !nccl_fits()) {
      if (mpi_test::world_rank() == 0)
        std::printf("[ SKIPPED  ] Mesh with nccl: a node has %d ranks and %d GPU(s)\n", gpus_.ranks_per_node,
                    gpus_.fewest);
      continue;
    }
    SCOPED_TRACE(comm::describe_backend(b));
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh m(MPI_COMM_WORLD, mpi_test::grid(1, n, 1), log, b);
    EXPECT_EQ(m.backend(), b);
    DupWorld w;
    comm::MpiCommunicator ref(w.c, "world");
    compare_collectives(m.axis("dp"), ref, DType::f32, as_f32, 11);  // dp is the world here, in the same order
    check_point_to_point(m.world(), DType::f32, as_f32, 12);
    check_host_buffers(m.world());
    // Axes of one rank work too.
    std::vector<float> one(3, 2.f);
    DeviceVec<float> d(one);
    m.axis("tp").all_reduce(d.p, 3, DType::f32, ReduceOp::sum);
    m.axis("pp").all_reduce(d.p, 3, DType::f32, ReduceOp::sum);
    EXPECT_EQ(d.get(), one);
    // Recorded like any other communicator's calls.
    std::size_t dp = 0;
    for (const comm::CommRecord& rec : log.records()) dp += rec.axis == "dp";
    EXPECT_GT(dp, 10u);
    EXPECT_EQ(log.records().back().op, "all_reduce");
    EXPECT_EQ(log.records().back().bytes, 12);
  }
}

// Without any GPU the NCCL backend is refused on every rank alike (no rank is
// left in NCCL's initialisation), directly and through the Mesh; the staged
// one still serves host buffers.
TEST(NoGpu, NcclRefusedOnEveryRank) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  int most = 0;
  MPI_Allreduce(&n, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (most > 0) GTEST_SKIP() << "a rank has a GPU: this tests machines without one";
  DupWorld w;
  std::string msg;
  try {
    comm::NcclCommunicator nccl(w.c, "world");
  } catch (const core::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("NCCL communicator 'world'"), std::string::npos) << msg;
  comm::CommLog log(0.0);
  const int size = mpi_test::world_size();
  EXPECT_THROW(mesh::Mesh(MPI_COMM_WORLD, mpi_test::grid(1, size, 1), log, comm::Backend::nccl), core::Error);
  comm::HostStagedCommunicator staged(std::make_unique<comm::MpiCommunicator>(w.c, "world"));
  check_host_buffers(staged);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
