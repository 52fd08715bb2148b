// No host code reads or writes device memory: the trainer, the strategies,
// the optimizer (offloaded too), the model (the MoE layer's host routing
// included) and checkpoints' state copies
// reach tracked buffers only through kernels and copies, as a GPU requires.
// Checked on the CPU: the tracker's arena is a region the host cannot touch
// except inside a kernel or a copy (kernels::guard_device_memory), so a
// stray access faults and the test dies naming it; the guarded run must also
// equal an unguarded one bit for bit (the same arithmetic either way).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "kernels/foundation/memory.hpp"
#include "src/deck/deck.hpp"
#include "src/train/trainer.hpp"

using namespace strata;

namespace {

constexpr std::size_t kRegion = std::size_t(64) << 20;
char* g_region = nullptr;

// A fault inside the guarded region is a host access to device memory: say
// so before dying (write(2) only: we are in a signal handler).
void on_fault(int, siginfo_t* info, void*) {
  const char* a = static_cast<const char*>(info->si_addr);
  const char* msg = g_region != nullptr && a >= g_region && a < g_region + kRegion
                        ? "\nFATAL: host code touched device memory (the guarded arena) outside a kernel or a copy\n"
                        : "\nFATAL: segmentation fault outside the guarded arena\n";
  [[maybe_unused]] const auto n = write(2, msg, std::strlen(msg));
  _exit(3);
}

plan::Plan config(const std::vector<std::string>& sets) {
  const std::string text =
      "[run]\nsteps = 3\nwarmup_steps = 1\nseed = 9\n"
      "[model]\nlayers = 2\nd_model = 32\nheads = 4\nvocab = 53\nseq_len = 16\n"
      "[data]\nglobal_batch = 4\nmicro_batch = 2\n"
      "[optim]\nlr = 3e-3\nweight_decay = 0.1\ngrad_clip = 1.0\n"
      "[backend]\nthreads = 1\n"
      "[offload]\nchunk_mb = 0.004\n";
  return deck::parse_deck("guard.toml", text, sets).config;
}

struct Trajectory {
  std::vector<double> loss;
  std::vector<float> params;
};

Trajectory train_run(const std::vector<std::string>& sets, bool guarded) {
  std::vector<std::string> all = sets;
  all.push_back("offload.path=" + std::filesystem::temp_directory_path().string());
  const plan::Plan c = config(all);
  Trajectory out;
  core::MemoryTracker tracker;
  if (guarded) {
    kernels::guard_device_memory(g_region, kRegion);
    tracker.use_arena(g_region, kRegion, kernels::zero_bytes);
  }
  {
    train::Trainer t(c, tracker, nullptr, 0.0);
    for (int s = 0; s < c.run.steps; ++s) out.loss.push_back(t.step(s).loss);
    // What checkpoints and parity checks read and write.
    strategies::FullState st = t.strategy().full_state();
    t.strategy().set_full_state(st);
    out.params = t.strategy().full_params();
    t.strategy().hold_state_in_memory(true);
    for (const auto& tensor : t.strategy().state_tensors()) {
      std::vector<std::byte> host(tensor.bytes());
      kernels::copy_bytes(host.data(), tensor.data, host.size());
      kernels::copy_bytes(tensor.data, host.data(), host.size());
    }
    t.strategy().hold_state_in_memory(false);
  }
  if (guarded) kernels::guard_device_memory(nullptr, 0);
  return out;
}

class DeviceMemory : public ::testing::TestWithParam<std::vector<std::string>> {
 protected:
  static void SetUpTestSuite() {
    void* p = mmap(nullptr, kRegion, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    g_region = static_cast<char*>(p);
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, nullptr);
  }
};

}  // namespace

// The guard itself: a host read of the region dies with the message, a copy
// out of it does not.
TEST_F(DeviceMemory, AHostAccessFaults) {
  kernels::guard_device_memory(g_region, kRegion);
  float x = 0;
  kernels::copy_bytes(&x, g_region, sizeof x);
  EXPECT_EQ(x, 0.0f);
  EXPECT_EXIT(
      {
        volatile const char* p = g_region;
        [[maybe_unused]] const char c = p[100];
      },
      ::testing::ExitedWithCode(3), "host code touched device memory");
  kernels::guard_device_memory(nullptr, 0);
}

TEST_P(DeviceMemory, HostNeverTouchesDeviceBuffers) {
  const Trajectory plain = train_run(GetParam(), false);
  const Trajectory guarded = train_run(GetParam(), true);
  EXPECT_EQ(guarded.loss, plain.loss);
  EXPECT_EQ(guarded.params, plain.params);
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, DeviceMemory,
    ::testing::Values(std::vector<std::string>{}, std::vector<std::string>{"model.recompute=selective"},
                      std::vector<std::string>{"model.recompute=full"},
                      std::vector<std::string>{"parallel.zero=1"}, std::vector<std::string>{"parallel.zero=2"},
                      std::vector<std::string>{"parallel.zero=3"}, std::vector<std::string>{"backend.precision=bf16"},
                      std::vector<std::string>{"backend.precision=fp16", "parallel.zero=2"},
                      std::vector<std::string>{"backend.precision=bf16", "parallel.zero=3"},
                      std::vector<std::string>{"parallel.offload=host"},
                      std::vector<std::string>{"parallel.zero=2", "parallel.offload=host", "backend.precision=bf16"},
                      std::vector<std::string>{"parallel.zero=1", "parallel.offload=nvme"},
                      std::vector<std::string>{"parallel.zero=3", "parallel.offload=nvme", "offload.params=true"},
                      std::vector<std::string>{"model.kind=moe", "model.moe_experts=4"},
                      std::vector<std::string>{"model.kind=moe", "model.moe_experts=4", "model.moe_every=2",
                                               "parallel.zero=2", "backend.precision=bf16"}));
