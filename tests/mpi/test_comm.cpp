// Tests of the communication layer under MPI (2, 3 and 4 ranks): every
// collective and its non-blocking form on the world and on each mesh axis,
// with exact integer-valued data; the mesh's groups; the profiling log.
// All ranks run every test body identically (see mpi_main.cpp): no ASSERT.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/mpi/mpi_world.hpp"
#include "src/comm/comm_log.hpp"
#include "src/comm/mpi_communicator.hpp"
#include "src/comm/profiled_communicator.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/foundation/module.hpp"
#include "kernels/foundation/precision.hpp"
#include "src/mesh/mesh.hpp"
#include "kernels/foundation/clock.hpp"

namespace {

using strata::mpi_test::world_rank;
using strata::mpi_test::world_size;

using namespace strata;
using comm::DType;
using comm::ReduceOp;

using strata::mpi_test::DupWorld;
using strata::mpi_test::grid;

// Small integers, different per seed, rank and index: sums of a few of them
// are exact in float, so results compare with ==.
int val(int seed, int r, int i) { return (seed * 31 + r * 131 + i * 17 + (r * i) % 5) % 29 - 14; }

// Every layout pp x dp x tp whose product is the world size.
std::vector<mesh::Layout> layouts_of(int n) {
  std::vector<mesh::Layout> out;
  for (int pp = 1; pp <= n; ++pp)
    for (int dp = 1; dp <= n; ++dp)
      if (n % (pp * dp) == 0) out.push_back(grid(pp, dp, n / (pp * dp)));
  return out;
}

void check_all_reduce(comm::Communicator& c, int seed) {
  const int n = c.size(), r = c.rank(), count = 257;
  std::vector<float> a(count), b(count);
  std::vector<std::int64_t> big(count);
  std::vector<double> lo(count);
  std::vector<std::int32_t> ints(count);
  for (int i = 0; i < count; ++i) {
    a[i] = b[i] = float(val(seed, r, i));
    big[i] = std::int64_t(val(seed, r, i)) * (std::int64_t(1) << 40) + r;  // beyond 32 bits
    lo[i] = val(seed, r, i) + 0.5;
    ints[i] = val(seed, r, i);
  }
  c.all_reduce(a.data(), count, DType::f32, ReduceOp::sum);
  c.iall_reduce(b.data(), count, DType::f32, ReduceOp::sum)->wait();
  c.all_reduce(big.data(), count, DType::i64, ReduceOp::max);
  c.all_reduce(lo.data(), count, DType::f64, ReduceOp::min);
  auto req = c.iall_reduce(ints.data(), count, DType::i32, ReduceOp::sum);
  while (!req->test()) {
  }
  int bad = 0;
  for (int i = 0; i < count; ++i) {
    int sum = 0, mn = INT_MAX;
    std::int64_t mx = INT64_MIN;
    for (int p = 0; p < n; ++p) {
      sum += val(seed, p, i);
      mn = std::min(mn, val(seed, p, i));
      mx = std::max(mx, std::int64_t(val(seed, p, i)) * (std::int64_t(1) << 40) + p);
    }
    bad += a[i] != float(sum);
    bad += b[i] != float(sum);
    bad += big[i] != mx;
    bad += lo[i] != mn + 0.5;
    bad += ints[i] != sum;
  }
  EXPECT_EQ(bad, 0) << "all_reduce on " << c.axis();
}

void check_reduce_scatter(comm::Communicator& c, int seed) {
  const int n = c.size(), r = c.rank(), k = 7;
  std::vector<float> send(n * k), recv(k, -99.f);
  std::vector<double> dsend(n * k), drecv(k, -99.0);
  for (int j = 0; j < n * k; ++j) send[j] = float(dsend[j] = val(seed, r, j));
  c.reduce_scatter(send.data(), recv.data(), k, DType::f32, ReduceOp::sum);
  c.ireduce_scatter(dsend.data(), drecv.data(), k, DType::f64, ReduceOp::sum)->wait();
  int bad = 0;
  for (int i = 0; i < k; ++i) {
    int sum = 0;
    for (int p = 0; p < n; ++p) sum += val(seed, p, r * k + i);
    bad += recv[i] != float(sum);
    bad += drecv[i] != double(sum);
  }
  EXPECT_EQ(bad, 0) << "reduce_scatter on " << c.axis();
}

void check_all_gather(comm::Communicator& c, int seed) {
  const int n = c.size(), r = c.rank(), k = 5;
  std::vector<float> send(k), out(n * k, -99.f), in(n * k, -99.f);
  std::vector<std::int64_t> iin(n * k, -99), iout(n * k, -99);
  for (int i = 0; i < k; ++i) {
    send[i] = in[r * k + i] = float(val(seed, r, i));
    iin[r * k + i] = val(seed, r, i);
  }
  c.all_gather(send.data(), out.data(), k, DType::f32);
  c.all_gather(in.data() + r * k, in.data(), k, DType::f32);  // in place
  c.iall_gather(iin.data() + r * k, iin.data(), k, DType::i64)->wait();  // in place
  c.iall_gather(iin.data() + r * k, iout.data(), k, DType::i64)->wait();  // out of place
  int bad = 0;
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < k; ++i) {
      const int want = val(seed, p, i);
      bad += out[p * k + i] != float(want);
      bad += in[p * k + i] != float(want);
      bad += iin[p * k + i] != want;
      bad += iout[p * k + i] != want;
    }
  EXPECT_EQ(bad, 0) << "all_gather on " << c.axis();
}

void check_broadcast(comm::Communicator& c, int seed) {
  const int n = c.size(), r = c.rank(), k = 9, root = n - 1;
  std::vector<float> a(k, -99.f);
  std::vector<std::int32_t> b(k, -99);
  for (int i = 0; i < k; ++i) {
    if (r == root) a[i] = float(val(seed, root, i));
    if (r == 0) b[i] = val(seed + 1, 0, i);
  }
  c.broadcast(a.data(), k, DType::f32, root);
  c.ibroadcast(b.data(), k, DType::i32, 0)->wait();
  int bad = 0;
  for (int i = 0; i < k; ++i) {
    bad += a[i] != float(val(seed, root, i));
    bad += b[i] != val(seed + 1, 0, i);
  }
  EXPECT_EQ(bad, 0) << "broadcast on " << c.axis();
}

// Element i of what rank s sends to rank d.
std::int64_t code(int seed, int s, int d, int i) { return seed * 100000 + s * 1000 + d * 100 + i; }

void check_all_to_all(comm::Communicator& c, int seed) {
  const int n = c.size(), r = c.rank(), k = 3;
  std::vector<float> send(n * k), recv(n * k, -1.f);
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < k; ++i) send[p * k + i] = float(code(seed, r, p, i));
  c.all_to_all(send.data(), recv.data(), k, DType::f32);
  int bad = 0;
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < k; ++i) bad += recv[p * k + i] != float(code(seed, p, r, i));
  EXPECT_EQ(bad, 0) << "all_to_all on " << c.axis();
}

// Uneven counts, zeros included, with gaps between blocks so that the
// displacements matter; the gaps must stay untouched.
void check_all_to_allv(comm::Communicator& c, int seed) {
  const int n = c.size(), r = c.rank();
  auto cnt = [&](int s, int d) { return (s + 2 * d + seed) % 4; };
  std::vector<std::int64_t> sc(n), sd(n), rc(n), rd(n);
  std::int64_t stotal = 0, rtotal = 0;
  for (int p = 0; p < n; ++p) {
    sc[p] = cnt(r, p), sd[p] = stotal, stotal += sc[p] + 1;
    rc[p] = cnt(p, r), rd[p] = rtotal, rtotal += rc[p] + 2;
  }
  const std::int64_t gap = -7;
  std::vector<std::int64_t> send(stotal, gap), recv(rtotal, gap);
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < sc[p]; ++i) send[sd[p] + i] = code(seed, r, p, i);
  c.all_to_allv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), DType::i64);
  std::vector<std::int64_t> want(rtotal, gap);
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < rc[p]; ++i) want[rd[p] + i] = code(seed, p, r, i);
  EXPECT_EQ(recv, want) << "all_to_allv on " << c.axis();
}

// A ring: each rank sends to the next and receives from the previous. Even
// ranks send first, odd ranks receive first, so blocking calls cannot cycle.
void check_ring(comm::Communicator& c, int seed) {
  const int n = c.size(), r = c.rank(), k = 11;
  if (n < 2) return;  // same on every rank of the group
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<double> out(k), in(k, -99.0), in2(k, -99.0);
  for (int i = 0; i < k; ++i) out[i] = val(seed, r, i);
  if (r % 2 == 0) {
    c.send(out.data(), k, DType::f64, next, 5);
    c.recv(in.data(), k, DType::f64, prev, 5);
  } else {
    c.recv(in.data(), k, DType::f64, prev, 5);
    c.send(out.data(), k, DType::f64, next, 5);
  }
  auto rr = c.irecv(in2.data(), k, DType::f64, prev, 6);
  auto sr = c.isend(out.data(), k, DType::f64, next, 6);
  while (!rr->test()) {
  }
  sr->wait();
  int bad = 0;
  for (int i = 0; i < k; ++i) {
    bad += in[i] != double(val(seed, prev, i));
    bad += in2[i] != double(val(seed, prev, i));
  }
  EXPECT_EQ(bad, 0) << "send/recv ring on " << c.axis();
}

void check_collectives(comm::Communicator& c, int seed) {
  check_all_reduce(c, seed);
  check_reduce_scatter(c, seed);
  check_all_gather(c, seed);
  check_broadcast(c, seed);
  check_all_to_all(c, seed);
  check_all_to_allv(c, seed);
  check_ring(c, seed);
  c.barrier();
}

TEST(Mesh, CoordsRoundTrip) {
  for (const mesh::Layout& l : {grid(1, 1, 1), grid(1, 1, 4), grid(4, 1, 1), grid(1, 4, 1), grid(2, 3, 4), grid(3, 1, 2),
                               grid(2, 2, 2), grid(2, 2, 2, 1, 0, 3)}) {
    std::vector<int> seen(l.world(), 0);
    for (int r = 0; r < l.world(); ++r) {
      const std::vector<int> c = mesh::coords_of(l, r);
      ASSERT_EQ(c.size(), l.dims.size());
      for (std::size_t d = 0; d < c.size(); ++d) EXPECT_TRUE(c[d] >= 0 && c[d] < l.dims[d].size);
      EXPECT_EQ(mesh::rank_of(l, c), r);
      seen[mesh::rank_of(l, c)]++;
    }
    for (int r = 0; r < l.world(); ++r) EXPECT_EQ(seen[r], 1);  // a bijection
  }
  // The rows nest pp, dp, cp, tp: tp varies fastest, then cp, dp and pp.
  const mesh::Layout l = grid(2, 3, 4);
  ASSERT_EQ(l.dims.size(), 4u);
  EXPECT_EQ(l.dims[0].name, "pp");
  EXPECT_EQ(l.dims[1].name, "dp");
  EXPECT_EQ(l.dims[2].name, "cp");
  EXPECT_EQ(l.dims[3].name, "tp");
  auto at = [&](int r) {
    return std::vector<int>{mesh::coord(l, r, "pp"), mesh::coord(l, r, "dp"), mesh::coord(l, r, "tp")};
  };
  EXPECT_EQ(at(1), (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(at(4), (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(at(12), (std::vector<int>{1, 0, 0}));
  EXPECT_EQ(mesh::rank_at(l, {{"pp", 1}, {"tp", 2}}), 14);
  EXPECT_THROW(mesh::coords_of(l, 24), core::Error);
}

TEST(Comm, WorldCollectives) {
  DupWorld w;
  comm::MpiCommunicator c(w.c, "world");
  EXPECT_EQ(c.size(), world_size());
  EXPECT_EQ(c.rank(), world_rank());
  EXPECT_EQ(c.axis(), "world");
  check_collectives(c, 1);
  check_collectives(c, 2);
}

// The 16-bit types: sums of values every partial sum of which is exact in
// both formats (small integers times a power of two) equal the exact sum
// whatever the reduction order, blocking and not; other ops are refused;
// elements are 2 bytes on the wire, so the profiled bytes are half fp32's.
TEST(Comm, SixteenBitSums) {
  DupWorld w;
  comm::MpiCommunicator c(w.c, "world");
  const int n = c.size(), r = c.rank();
  for (const auto& [t, p] : {std::pair{DType::bf16, core::Precision::bf16}, std::pair{DType::f16, core::Precision::fp16}}) {
    EXPECT_EQ(comm::dtype_size(t), 2u);
    const int count = 3 * n;
    std::vector<std::uint16_t> buf(static_cast<std::size_t>(count)), out(3);
    auto value = [&](int rank, int i) { return float((rank + 1) * (i % 5 + 1)) * 0.25f; };  // <= 2^6: exact sums
    for (int i = 0; i < count; ++i) buf[std::size_t(i)] = core::float_to_half(value(r, i), p);
    std::vector<std::uint16_t> in = buf;
    c.all_reduce(buf.data(), count, t, ReduceOp::sum);
    c.reduce_scatter(in.data(), out.data(), 3, t, ReduceOp::sum);
    std::vector<std::uint16_t> nb = in;
    c.iall_reduce(nb.data(), count, t, ReduceOp::sum)->wait();
    for (int i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += value(q, i);
      EXPECT_EQ(core::half_to_float(buf[std::size_t(i)], p), want) << i;
      EXPECT_EQ(nb[std::size_t(i)], buf[std::size_t(i)]) << i;
      if (i / 3 == r) {
        EXPECT_EQ(core::half_to_float(out[std::size_t(i % 3)], p), want) << i;
      }
    }
    EXPECT_THROW(c.all_reduce(buf.data(), count, t, ReduceOp::max), core::Error);
  }
  comm::CommLog log(prof::now_seconds());
  comm::ProfiledCommunicator pc(std::make_unique<comm::MpiCommunicator>(w.c, "world"), log);
  std::vector<std::uint16_t> x(10, 0);
  pc.all_reduce(x.data(), 10, DType::bf16, ReduceOp::sum);
  ASSERT_EQ(log.records().size(), 1u);
  EXPECT_EQ(log.records()[0].bytes, 20);
}

TEST(Comm, CountsBeyondIntAreRefused) {
  DupWorld w;
  comm::MpiCommunicator c(w.c, "world");
  const std::int64_t huge = std::int64_t(INT_MAX) + 1;
  // Refused before MPI is called, on every rank alike: nothing is touched.
  EXPECT_THROW(c.all_reduce(nullptr, huge, DType::f32, ReduceOp::sum), core::Error);
  EXPECT_THROW(c.all_reduce(nullptr, -1, DType::f32, ReduceOp::sum), core::Error);
  EXPECT_THROW(c.iall_gather(nullptr, nullptr, huge, DType::f64), core::Error);
  EXPECT_THROW(c.send(nullptr, huge, DType::i32, 0, 0), core::Error);
  const int n = c.size();
  std::vector<std::int64_t> counts(n, 0), displs(n, 0);
  counts[n - 1] = huge;
  EXPECT_THROW(c.all_to_allv(nullptr, counts.data(), displs.data(), nullptr, displs.data(), displs.data(), DType::f32),
               core::Error);
  c.barrier();  // still usable
}

TEST(Comm, MpiErrorsBecomeExceptions) {
  DupWorld w;
  comm::MpiCommunicator c(w.c, "world");
  float x = 0;
  // An invalid root fails argument checking on every rank: an exception naming the call.
  std::string msg;
  try {
    c.broadcast(&x, 1, DType::f32, c.size() + 3);
  } catch (const core::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("MPI_Bcast"), std::string::npos) << msg;
  // A shorter message than expected is an error, not stale data.
  const int n = c.size(), r = c.rank();
  if (n > 1) {
    float buf[5] = {1, 2, 3, 4, 5};
    if (r == 0) c.send(buf, 3, DType::f32, 1, 9);
    if (r == 1) {
      EXPECT_THROW(c.recv(buf, 5, DType::f32, 0, 9), core::Error);
    }
  }
  c.barrier();
}

TEST(Mesh, AxesCollectives) {
  const int n = world_size(), me = world_rank();
  for (const mesh::Layout& l : layouts_of(n)) {
    SCOPED_TRACE(testing::Message() << "layout " << mesh::describe(l));
    comm::CommLog log(prof::now_seconds());
    mesh::Mesh m(MPI_COMM_WORLD, l, log);
    EXPECT_EQ(m.rank(), me);
    EXPECT_EQ(m.coords(), mesh::coords_of(l, me));
    EXPECT_EQ(m.world().size(), n);
    EXPECT_EQ(m.world().rank(), me);
    // Along a dim's own group, the group rank is the coordinate.
    for (const char* dim : {"dp", "tp", "pp"}) {
      EXPECT_EQ(m.axis(dim).size(), l.size(dim)) << dim;
      EXPECT_EQ(m.axis(dim).rank(), m.coord(dim)) << dim;
    }

    // Group membership: the world ranks of each group, in group-rank order:
    // the other coordinates fixed, this one varying.
    for (const char* name : {"world", "dp", "tp", "pp"}) {
      comm::Communicator& a = m.axis(name);
      EXPECT_EQ(a.axis(), name);
      const int g = a.size();
      std::vector<std::int32_t> members(g, -1);
      std::int32_t self = me;
      a.all_gather(&self, members.data(), 1, DType::i32);
      std::vector<std::int32_t> want(g);
      for (int i = 0; i < g; ++i) {
        std::vector<int> x = m.coords();
        if (name != std::string("world")) x[std::size_t(l.dim_index(name))] = i;
        want[i] = name == std::string("world") ? i : mesh::rank_of(l, x);
      }
      EXPECT_EQ(members, want) << "members of " << name;
      EXPECT_EQ(std::vector<int>(members.begin(), members.end()), mesh::group_ranks(l, name, me)) << name;
      check_collectives(a, 3);
    }
    // Every call went into the log, under the axis it was issued on.
    std::size_t dp = 0, tp = 0, pp = 0, world = 0;
    for (const comm::CommRecord& rec : log.records()) {
      dp += rec.axis == "dp", tp += rec.axis == "tp", pp += rec.axis == "pp", world += rec.axis == "world";
      EXPECT_EQ(rec.group_size, l.group_size(rec.axis));
    }
    // Per axis: 16 calls in check_collectives plus the membership gather, and
    // the ring's 4 where the group has more than one rank.
    auto calls = [](int g) { return std::size_t(17 + (g > 1 ? 4 : 0)); };
    EXPECT_EQ(dp, calls(l.size("dp")));
    EXPECT_EQ(tp, calls(l.size("tp")));
    EXPECT_EQ(pp, calls(l.size("pp")));
    EXPECT_EQ(world, calls(n));
    EXPECT_EQ(log.records().size(), dp + tp + pp + world);
  }
}

// Expert parallelism inside dp: the ep group is ep consecutive dp ranks, the
// edp group the dp ranks ep apart; both keep pp and tp fixed.
TEST(Mesh, ExpertGroupsSplitEachDataParallelGroup) {
  const int n = world_size(), me = world_rank();
  for (const mesh::Layout& base : layouts_of(n)) {
    const int dp = base.size("dp");
    for (int ep = 2; ep <= dp; ++ep) {
      if (dp % ep != 0) continue;
      const mesh::Layout l = grid(base.size("pp"), dp, base.size("tp"), ep);
      SCOPED_TRACE(testing::Message() << mesh::describe(l));
      comm::CommLog log(prof::now_seconds());
      mesh::Mesh m(MPI_COMM_WORLD, l, log);
      const std::vector<int> c = mesh::coords_of(l, me);
      const std::size_t d = std::size_t(l.dim_index("dp"));
      for (bool expert : {true, false}) {
        comm::Communicator& g = m.axis(expert ? "ep" : "edp");
        EXPECT_EQ(g.axis(), expert ? "ep" : "edp");
        EXPECT_EQ(g.size(), expert ? ep : dp / ep);
        std::vector<std::int32_t> members(std::size_t(g.size()), -1);
        std::int32_t self = me;
        g.all_gather(&self, members.data(), 1, DType::i32);
        for (int i = 0; i < g.size(); ++i) {
          std::vector<int> x = c;
          x[d] = expert ? c[d] / ep * ep + i : i * ep + c[d] % ep;
          EXPECT_EQ(members[std::size_t(i)], mesh::rank_of(l, x)) << (expert ? "ep" : "edp") << " member " << i;
        }
      }
    }
  }
  comm::CommLog log(0.0);
  EXPECT_THROW(mesh::Mesh(MPI_COMM_WORLD, grid(1, n, 1, n + 1), log), core::Error) << "ep must divide dp";
}

TEST(Mesh, Table) {
  const int n = world_size(), me = world_rank();
  const mesh::Layout l = n % 2 == 0 ? grid(1, n / 2, 2) : grid(n, 1, 1);
  comm::CommLog log(0.0);
  mesh::Mesh m(MPI_COMM_WORLD, l, log);
  const std::string t = m.table();
  // The same text on every rank: compare with rank 0's.
  int len = int(t.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string t0(len, '\0');
  if (me == 0) t0 = t;
  MPI_Bcast(t0.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_EQ(t, t0);
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), n + 1) << t;
  if (n == 4) {
    EXPECT_NE(t.find("dp{0,2}"), std::string::npos) << t;
    EXPECT_NE(t.find("tp{2,3}"), std::string::npos) << t;
    EXPECT_NE(t.find("pp{3}"), std::string::npos) << t;
  }
  if (me == 0) std::printf("%s", t.c_str());
}

TEST(Mesh, LayoutNotMatchingTheWorldThrowsEverywhere) {
  const int n = world_size();
  comm::CommLog log(0.0);
  std::string msg;
  try {
    mesh::Mesh m(MPI_COMM_WORLD, grid(1, 1, n + 1), log);
  } catch (const core::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("world"), std::string::npos) << msg;
  EXPECT_THROW(mesh::Mesh(MPI_COMM_WORLD, grid(0, 1, n), log), core::Error);
  EXPECT_TRUE(log.records().empty());
  MPI_Barrier(MPI_COMM_WORLD);  // every rank got here: nobody hangs in a split
}

TEST(Profiling, OneRecordPerCallWithBytes) {
  DupWorld w;
  comm::CommLog log(prof::now_seconds());
  log.set_step(3);
  comm::ProfiledCommunicator c(std::make_unique<comm::MpiCommunicator>(w.c, "world"), log);
  const int n = c.size(), r = c.rank();
  EXPECT_EQ(c.axis(), "world");
  std::vector<double> buf(64 * n, 1.0), out(64 * n);
  std::vector<std::int64_t> counts(n), displs(n);
  std::int64_t sent = 0;
  for (int p = 0; p < n; ++p) counts[p] = displs[p] = p;  // p elements to/from p, from offset p (overlap-free: p <= 2p)
  for (int p = 0; p < n; ++p) sent += counts[p];
  // Each rank sends p elements to rank p, so it receives r from each.
  std::vector<std::int64_t> rcounts(n, r), rdispls(n);
  for (int p = 0; p < n; ++p) rdispls[p] = p * r;

  struct Want {
    const char* op;
    std::int64_t bytes;
    bool nonblocking;
  };
  std::vector<Want> want;
  c.all_reduce(buf.data(), 10, DType::f64, ReduceOp::sum), want.push_back({"all_reduce", 80, false});
  c.reduce_scatter(buf.data(), out.data(), 4, DType::f64, ReduceOp::sum),
      want.push_back({"reduce_scatter", 32 * n, false});
  c.all_gather(buf.data(), out.data(), 4, DType::f64), want.push_back({"all_gather", 32 * n, false});
  c.broadcast(buf.data(), 6, DType::f64, 0), want.push_back({"broadcast", 48, false});
  c.all_to_all(buf.data(), out.data(), 2, DType::f64), want.push_back({"all_to_all", 16 * n, false});
  c.all_to_allv(buf.data(), counts.data(), displs.data(), out.data(), rcounts.data(), rdispls.data(), DType::f64);
  want.push_back({"all_to_allv", 8 * sent, false});
  c.barrier(), want.push_back({"barrier", 0, false});
  c.iall_reduce(buf.data(), 5, DType::f32, ReduceOp::max)->wait(), want.push_back({"all_reduce", 20, true});
  c.ireduce_scatter(buf.data(), out.data(), 3, DType::f64, ReduceOp::sum)->wait(),
      want.push_back({"reduce_scatter", 24 * n, true});
  c.iall_gather(buf.data(), out.data(), 3, DType::f64)->wait(), want.push_back({"all_gather", 24 * n, true});
  c.ibroadcast(buf.data(), 7, DType::i32, n - 1)->wait(), want.push_back({"broadcast", 28, true});
  if (n > 1) {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    auto rr = c.irecv(out.data(), 3, DType::f64, prev, 1);
    auto sr = c.isend(buf.data(), 3, DType::f64, next, 1);
    rr->wait(), sr->wait();
    want.push_back({"recv", 24, true}), want.push_back({"send", 24, true});
    if (r == 0) {
      c.send(buf.data(), 2, DType::i64, 1, 2), want.push_back({"send", 16, false});
    } else if (r == 1) {
      c.recv(out.data(), 2, DType::i64, 0, 2), want.push_back({"recv", 16, false});
    }
  }
  const auto& recs = log.records();
  EXPECT_EQ(recs.size(), want.size());
  for (std::size_t i = 0; i < std::min(recs.size(), want.size()); ++i) {
    const comm::CommRecord& rec = recs[i];
    SCOPED_TRACE(testing::Message() << "record " << i << " (" << want[i].op << ")");
    EXPECT_EQ(rec.op, want[i].op);
    EXPECT_EQ(rec.bytes, want[i].bytes);
    EXPECT_EQ(rec.nonblocking, want[i].nonblocking);
    EXPECT_EQ(rec.axis, "world");
    EXPECT_EQ(rec.group_size, n);
    EXPECT_EQ(rec.step, 3);
    EXPECT_GE(rec.start, 0.0);
    EXPECT_GE(rec.end, rec.start);
    EXPECT_GE(rec.wait, 0.0);
    if (!rec.nonblocking) {
      EXPECT_NEAR(rec.wait, rec.end - rec.start, 1e-9);
    }
    // The transfer lies within the call; a blocking call's on the host is
    // the call, a receive's from its message's arrival.
    EXPECT_GE(rec.transfer_start, rec.start);
    EXPECT_LE(rec.transfer_end, rec.end);
    EXPECT_GE(rec.transfer(), 0.0);
    if (!rec.nonblocking) {
      EXPECT_EQ(rec.transfer_end, rec.end);
      EXPECT_NEAR(rec.transfer_start, rec.start + rec.peer_wait, 1e-9);
    }
    if (i > 0) {
      EXPECT_GE(rec.start, recs[i - 1].start);
    }
  }
}

TEST(Profiling, NonblockingRecordCompletesOnWaitOrTest) {
  DupWorld w;
  comm::CommLog log(prof::now_seconds());
  comm::ProfiledCommunicator c(std::make_unique<comm::MpiCommunicator>(w.c, "world"), log);
  std::vector<float> a(1000, 1.f), b(1000, 2.f), d(1000, 3.f);

  auto r1 = c.iall_reduce(a.data(), 1000, DType::f32, ReduceOp::sum);
  EXPECT_EQ(log.records().size(), 1u);
  EXPECT_TRUE(log.records()[0].nonblocking);
  EXPECT_EQ(log.records()[0].wait, 0.0);  // nothing waited yet
  r1->wait();
  const comm::CommRecord after_wait = log.records()[0];
  EXPECT_GE(after_wait.end, after_wait.start);
  EXPECT_GE(after_wait.wait, 0.0);
  EXPECT_LE(after_wait.wait, after_wait.end - after_wait.start + 1e-9);
  // MPI moves the data inside its calls: the transfer is the time in them
  // (the issue and the wait), ending when the wait saw it complete.
  EXPECT_EQ(after_wait.transfer_end, after_wait.end);
  EXPECT_GE(after_wait.transfer(), after_wait.wait - 1e-12);
  EXPECT_LE(after_wait.transfer(), after_wait.span() + 1e-12);
  r1->wait();  // a second wait changes nothing
  r1->test();
  EXPECT_EQ(log.records()[0].end, after_wait.end);
  EXPECT_EQ(log.records()[0].wait, after_wait.wait);

  // Through test(): end is set when test() first reports completion.
  auto r2 = c.iall_reduce(b.data(), 1000, DType::f32, ReduceOp::sum);
  int polls = 0;
  while (!r2->test()) ++polls;
  const comm::CommRecord after_test = log.records()[1];
  EXPECT_GE(after_test.end, after_test.start);
  EXPECT_GT(after_test.wait, 0.0);
  EXPECT_TRUE(r2->test());
  EXPECT_EQ(log.records()[1].end, after_test.end);

  // Destroying an unfinished request waits, and the record is completed.
  {
    auto r3 = c.iall_reduce(d.data(), 1000, DType::f32, ReduceOp::sum);
  }
  EXPECT_GE(log.records()[2].end, log.records()[2].start);
  const float n = float(c.size());
  EXPECT_EQ(a[0], n);
  EXPECT_EQ(b[999], 2 * n);
  EXPECT_EQ(d[500], 3 * n);
}

// Sets of time as sorted, disjoint intervals: joined, intersected, measured.
TEST(Profiling, IntervalSets) {
  const comm::Intervals a = comm::merged({{5, 6}, {0, 2}, {1, 3}, {3, 4}});
  EXPECT_EQ(a, (comm::Intervals{{0, 4}, {5, 6}}));  // touching intervals join too
  const comm::Intervals b{{-1, 0.5}, {1.5, 5.5}, {7, 8}};
  EXPECT_EQ(comm::intersect(a, b), (comm::Intervals{{0, 0.5}, {1.5, 4}, {5, 5.5}}));
  EXPECT_EQ(comm::intersect(b, a), comm::intersect(a, b));
  EXPECT_TRUE(comm::intersect(a, {}).empty());
  EXPECT_DOUBLE_EQ(comm::covered(a, -1, 10), 5.0);
  EXPECT_DOUBLE_EQ(comm::covered(a, 3.5, 5.25), 0.75);
  EXPECT_DOUBLE_EQ(comm::covered(a, 4, 5), 0.0);
  EXPECT_DOUBLE_EQ(comm::covered(a, 0.5, 1), 0.5);
}

// Every interval inside MPI is kept, and each call in flight gets its share
// of it by bytes, as a piece the report can later weigh again.
TEST(Profiling, HostProgressSharesByBytes) {
  comm::HostProgress p;
  p.spent(0.0, 1.0);  // nothing in flight: an interval, no piece
  p.in_flight.push_back({7, 3.0, 0.0});
  p.in_flight.push_back({9, 1.0, 0.0});
  p.spent(2.0, 4.0);
  EXPECT_EQ(p.inside, (comm::Intervals{{0, 1}, {2, 4}}));
  ASSERT_EQ(p.pieces.size(), 2u);
  EXPECT_EQ(p.pieces[0].record, 7u);
  EXPECT_DOUBLE_EQ(p.pieces[0].share, 0.75);
  EXPECT_DOUBLE_EQ(p.pieces[1].share, 0.25);
  EXPECT_DOUBLE_EQ(p.complete(7), 1.5);
  EXPECT_EQ(p.in_flight.size(), 1u);
  p.spent(5.0, 5.5);  // the rest goes to the one still in flight
  EXPECT_DOUBLE_EQ(p.complete(9), 0.5 + 0.5);
  EXPECT_DOUBLE_EQ(p.complete(9), 0.0);  // no longer in flight
}

TEST(Profiling, ReserveKeepsTheRecords) {
  comm::CommLog log(0.0);
  log.add(comm::CommRecord{1, "barrier", "world", 2, 0, false, 0.5, 0.75, 0.25});
  log.reserve(1000);
  EXPECT_EQ(log.records().size(), 1u);
  EXPECT_GE(log.records().capacity(), 1000u);
  EXPECT_EQ(log.records()[0].op, "barrier");
  EXPECT_EQ(log.records()[0].end, 0.75);
  EXPECT_EQ(log.add(comm::CommRecord{1, "send", "pp", 2, 8, true, 1.0, 1.0, 0.0}), 1u);
}

TEST(Profiling, WrapsEveryCollectiveExactly) {
  DupWorld w;
  comm::CommLog log(prof::now_seconds());
  comm::ProfiledCommunicator c(std::make_unique<comm::MpiCommunicator>(w.c, "world"), log);
  check_collectives(c, 4);
  for (const comm::CommRecord& rec : log.records()) {
    EXPECT_EQ(rec.axis, "world");
    EXPECT_GE(rec.end, rec.start);
    EXPECT_GE(rec.wait, 0.0);
  }
  EXPECT_GE(log.records().size(), 15u);
}

// The mesh's communicator backends: described for the report; without the
// CUDA backend the GPU ones are refused on every rank, naming the build
// option; with it, the staged one passes host buffers straight through to
// MPI (all it does on a machine without a GPU).
TEST(Mesh, Backends) {
  EXPECT_EQ(comm::describe_backend(comm::Backend::mpi), "mpi");
  EXPECT_EQ(comm::describe_backend(comm::Backend::nccl), "nccl");
  EXPECT_EQ(comm::describe_backend(comm::Backend::mpi_staged), "mpi (device buffers staged through host memory)");
  EXPECT_TRUE(comm::backend_built(comm::Backend::mpi));
  const int n = world_size();
  comm::CommLog log(prof::now_seconds());
  {
    mesh::Mesh m(MPI_COMM_WORLD, grid(1, n, 1), log);
    EXPECT_EQ(m.backend(), comm::Backend::mpi);
  }
#if STRATA_HAVE_CUDA
  EXPECT_TRUE(comm::backend_built(comm::Backend::nccl));
  EXPECT_TRUE(comm::backend_built(comm::Backend::mpi_staged));
  // The communicators' module is loaded by the first mesh or question that
  // needs it, into a program of the comm library alone (no kernels).
  EXPECT_EQ(core::module_path("cuda_comm"), "");
  EXPECT_NE(comm::library_versions(comm::Backend::nccl).find("; NCCL "), std::string::npos);
  EXPECT_NE(core::module_path("cuda_comm").find("libstrata_cuda_comm.so"), std::string::npos);
  mesh::Mesh m(MPI_COMM_WORLD, grid(1, n, 1), log, comm::Backend::mpi_staged);
  EXPECT_EQ(m.backend(), comm::Backend::mpi_staged);
  check_collectives(m.world(), 7);
  check_collectives(m.axis("dp"), 8);
  EXPECT_FALSE(log.records().empty());
#else
  for (comm::Backend b : {comm::Backend::nccl, comm::Backend::mpi_staged}) {
    EXPECT_FALSE(comm::backend_built(b));
    std::string msg;
    try {
      mesh::Mesh m(MPI_COMM_WORLD, grid(1, n, 1), log, b);
    } catch (const core::Error& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("STRATA_WITH_CUDA"), std::string::npos) << msg;
  }
  MPI_Barrier(MPI_COMM_WORLD);  // nobody hangs in a split
#endif
}

}  // namespace
