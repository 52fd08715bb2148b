// The Kokkos backend's runtime: starting Kokkos, memory in its memory space,
// copies, and the GEMM rate.
#include <unistd.h>

#include <KokkosBlas3_gemm.hpp>
#include <KokkosKernels_config.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "kernels/foundation/clock.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/kokkos/kokkos_kernels.hpp"
#include "kernels/kokkos/views.hpp"

namespace strata::kernels::kokkos {

namespace {

// Blocks of the memory space, by address: MemorySpace::deallocate needs the
// size, and copy_bytes tells a device pointer from a host one by them.
struct Blocks {
  std::mutex mutex;
  std::map<const char*, std::size_t> sizes;
} g_blocks;

bool in_space(const void* p) {
  const char* c = static_cast<const char*>(p);
  std::lock_guard lock(g_blocks.mutex);
  auto it = g_blocks.sizes.upper_bound(c);
  if (it == g_blocks.sizes.begin()) return false;
  --it;
  return c < it->first + it->second;
}

std::string version() {
  return fmt::format("Kokkos {}.{}.{}", KOKKOS_VERSION / 10000, KOKKOS_VERSION / 100 % 100, KOKKOS_VERSION % 100);
}

}  // namespace

const char* backend_name() {
  static const std::string name = std::string("kokkos/") + Exec::name();
  return name.c_str();
}

int device_count() {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<Exec, Kokkos::Cuda>) return Kokkos::Cuda::detect_device_count();
#endif
  return 1;
}

std::string describe_devices() { return fmt::format("{}: execution space {}", version(), Exec::name()); }

std::string describe_versions() {
#if defined(KOKKOSKERNELS_ENABLE_TPL_BLAS)
  const char* blas = ", KokkosKernels with the host BLAS";
#else
  const char* blas = ", KokkosKernels";
#endif
  return fmt::format("{} ({}, memory space {}){}", version(), Exec::name(), Mem::name(), blas);
}

void use_device(int ordinal) {
  if (Kokkos::is_initialized()) return;
#if KOKKOS_VERSION >= 40000
  Kokkos::initialize(Kokkos::InitializationSettings().set_device_id(ordinal).set_disable_warnings(true));
#else
  Kokkos::InitArguments args;
  args.device_id = ordinal;
  args.disable_warnings = true;
  Kokkos::initialize(args);
#endif
  // Every block of the memory space is Strata's (allocate/deallocate, which
  // Kokkos does not track), so finalizing before the static objects that
  // still hold some are destroyed is safe.
  std::atexit([] {
    if (Kokkos::is_initialized()) Kokkos::finalize();
  });
}

void synchronize() { Kokkos::fence(); }

bool host_accessible() { return kHostMemory; }

void* malloc_device(std::size_t bytes) {
  // 256-byte blocks (cudaMalloc's alignment), at least one.
  const std::size_t rounded = std::max<std::size_t>(256, (bytes + 255) / 256 * 256);
  void* p = nullptr;
  try {
    p = Mem().allocate(rounded);
  } catch (const std::exception& e) {
    core::runtime_error("out of {} memory: {} bytes ({})", Mem::name(), bytes, e.what());
  }
  std::lock_guard lock(g_blocks.mutex);
  g_blocks.sizes[static_cast<const char*>(p)] = rounded;
  return p;
}

void free_device(void* p) {
  if (p == nullptr) return;
  std::size_t bytes = 0;
  {
    std::lock_guard lock(g_blocks.mutex);
    auto it = g_blocks.sizes.find(static_cast<const char*>(p));
    STRATA_CHECK(it != g_blocks.sizes.end(), "free_device of a pointer malloc_device did not return");
    bytes = it->second;
    g_blocks.sizes.erase(it);
  }
  Mem().deallocate(p, bytes);
}

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if constexpr (kHostMemory) {
    std::memmove(dst, src, bytes);
  } else {
    using Bytes = Kokkos::View<char*, Mem, Unmanaged>;
    using HostBytes = Kokkos::View<char*, Kokkos::HostSpace, Unmanaged>;
    char* d = static_cast<char*>(dst);
    char* s = const_cast<char*>(static_cast<const char*>(src));
    const bool d_dev = in_space(dst), s_dev = in_space(src);
    if (d_dev && s_dev) Kokkos::deep_copy(Bytes(d, bytes), Bytes(s, bytes));
    else if (d_dev) Kokkos::deep_copy(Bytes(d, bytes), HostBytes(s, bytes));
    else if (s_dev) Kokkos::deep_copy(HostBytes(d, bytes), Bytes(s, bytes));
    else std::memmove(dst, src, bytes);
  }
}

void zero_bytes(void* p, std::size_t bytes) {
  if (bytes == 0) return;
  if constexpr (kHostMemory) std::memset(p, 0, bytes);
  else Kokkos::deep_copy(Kokkos::View<char*, Mem, Unmanaged>(static_cast<char*>(p), bytes), char(0));
}

void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  *free_bytes = *total_bytes = 0;
  if constexpr (kHostMemory) {
    const long page = sysconf(_SC_PAGESIZE);
    *free_bytes = std::size_t(sysconf(_SC_AVPHYS_PAGES)) * std::size_t(page);
    *total_bytes = std::size_t(sysconf(_SC_PHYS_PAGES)) * std::size_t(page);
  }
}


double measure_gemm_flops(int n, int reps, core::Precision p) {
  if (p != core::Precision::fp32) {
    // 16-bit products go through the backend's own kernel (matmul.cpp):
    // the rate of what a run of this precision multiplies with.
    const std::size_t bytes = std::size_t(n) * std::size_t(n) * 2;
    void* a = malloc_device(bytes);
    void* b = malloc_device(bytes);
    void* c = malloc_device(bytes);
    zero_bytes(a, bytes);
    zero_bytes(b, bytes);
    const double rate = prof::best_rate(2.0 * double(n) * n * n, reps, [&] {
      matmul(false, false, n, n, n, 1.0f, core::CPtr(a, p), n, core::CPtr(b, p), n, 0.0f, core::Ptr(c, p), n);
      Kokkos::fence();
    });
    for (void* x : {a, b, c}) free_device(x);
    return rate;
  }
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> a("a", n, n), b("b", n, n), c("c", n, n);
  // Values that are not zero (zeros can run faster).
  Kokkos::parallel_for(
      "strata::gemm_inputs", Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>({0, 0}, {n, n}),
      KOKKOS_LAMBDA(int i, int j) {
        a(i, j) = float((i * n + j) % 13) * 0.01f;
        b(i, j) = float((i * n + j) % 7) * 0.02f;
      });
  return prof::best_rate(2.0 * double(n) * n * n, reps, [&] {
    KokkosBlas::gemm("N", "N", 1.0f, a, b, 0.0f, c);
    Kokkos::fence();
  });
}

}  // namespace strata::kernels::kokkos
