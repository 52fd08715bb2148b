// What the Kokkos backend's sources share: the execution and memory spaces,
// unmanaged views over the pointers the kernel interface hands in, and the
// policies. Internal to kernels/kokkos.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace strata::kernels::kokkos {

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

}  // namespace strata::kernels::kokkos
