// What the Kokkos backend's sources share: the execution and memory spaces,
// unmanaged views over the pointers the kernel interface hands in, and the
// policies. Internal to kernels/kokkos.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "kernels/foundation/ptr.hpp"

namespace strata::kernels::kokkos {

// Elements of any format (float, core::Bf16, core::Fp16) read as fp32 and
// written rounded once: host and device functions (kernels/foundation/ptr.hpp).
using core::from_float;
using core::to_float;

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;

// A 1-D and a row-major 2-D view of memory the caller owns.
template <class T>
using Vec = Kokkos::View<T*, Mem, Unmanaged>;
template <class T>
using Mat = Kokkos::View<T**, Kokkos::LayoutRight, Mem, Unmanaged>;

using Range = Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>;
using Team = Kokkos::TeamPolicy<Exec>;
using Member = Team::member_type;

// The host may read the memory space: true on Serial and OpenMP.
inline constexpr bool kHostMemory = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;

// Kokkos' math functions: in namespace Kokkos from 4.0, Kokkos::Experimental before.
#if KOKKOS_VERSION >= 40000
namespace kmath = ::Kokkos;
#else
namespace kmath = ::Kokkos::Experimental;
#endif

// One team per row of a row-wise kernel (a softmax, a LayerNorm), its
// threads over the row's columns.
inline Team rows_policy(std::int64_t rows) { return Team(int(rows), Kokkos::AUTO); }

// Column-wise work is done 8 columns per thread: a row's 8 contiguous
// elements are a vector on a host space, and no element has two writers.
inline constexpr int kColumnBlock = 8;
inline Range column_blocks(int C) { return Range(0, (C + kColumnBlock - 1) / kColumnBlock); }

// Reductions over a row, in groups of 8 consecutive elements combined as a
// tree: across the groups the running value takes one dependent operation
// per 8 elements, where an element-by-element reduction (a team of one
// thread on a host space) waits on every add. Each element is visited once,
// by one thread (the last group holds the n % 8 left over), so f may write
// its element.
template <class T, class Op, class F>
KOKKOS_INLINE_FUNCTION T group_of_8(std::int64_t i, const F& f, Op op) {
  T v[8];
  for (int l = 0; l < 8; ++l) v[l] = f(i + l);  // a loop a host compiler vectorises
  return op(op(op(v[0], v[1]), op(v[2], v[3])), op(op(v[4], v[5]), op(v[6], v[7])));
}

// Group g of [0, n) folded into acc with op.
template <class T, class Op, class F>
KOKKOS_INLINE_FUNCTION void fold_group(std::int64_t g, std::int64_t n, const F& f, Op op, T& acc) {
  if (8 * g + 8 <= n) {
    acc = op(acc, group_of_8<T>(8 * g, f, op));
  } else {
    for (std::int64_t i = 8 * g; i < n; ++i) acc = op(acc, f(i));
  }
}

// The sum over i in [0, n) of f(i), over the team.
template <class T, class F>
KOKKOS_INLINE_FUNCTION T team_sum(const Member& m, int n, const F& f) {
  T s = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(m, (n + 7) / 8),
      [&](int g, T& acc) { fold_group(g, n, f, [](T a, T b) { return a + b; }, acc); }, s);
  return s;
}

// The sum over i in [0, n) of f(i) (a device function), over the execution
// space: a kernel of its own, in the same groups.
template <class T, class F>
T range_sum(const char* label, std::int64_t n, const F& f) {
  T s = 0;
  Kokkos::parallel_reduce(
      label, Range(0, (n + 7) / 8),
      KOKKOS_LAMBDA(std::int64_t g, T& acc) { fold_group(g, n, f, [](T a, T b) { return a + b; }, acc); }, s);
  return s;
}

// The largest of x[0, n), n >= 1, over the team.
template <class E>
KOKKOS_INLINE_FUNCTION float team_max(const Member& m, const E* x, int n) {
  float mx = to_float(x[0]);
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(m, (n + 7) / 8),
      [&](int g, float& v) {
        fold_group(g, n, [&](std::int64_t i) { return to_float(x[i]); }, [](float a, float b) { return a > b ? a : b; }, v);
      },
      Kokkos::Max<float>(mx));
  return mx;
}

}  // namespace strata::kernels::kokkos
