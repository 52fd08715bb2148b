// Deck parsing and validation: full and partial decks, every kind of error and
// what its message names (file, line, key), --set overrides, byte sizes, and
// the resolved TOML reading back to the same plan.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <toml++/toml.h>

#include "kernels/foundation/error.hpp"
#include "src/deck/deck.hpp"
#include "plan/keys.hpp"

namespace fs = std::filesystem;
using strata::plan::Plan;
using strata::plan::name_of;
using strata::deck::Deck;
using strata::deck::load_deck;
using strata::deck::parse_deck;

namespace {

// Every field of the plan, compared one by one (Plan has no operator==).
void expect_same_config(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.run.name, b.run.name);
  EXPECT_EQ(a.run.steps, b.run.steps);
  EXPECT_EQ(a.run.warmup_steps, b.run.warmup_steps);
  EXPECT_EQ(a.run.seed, b.run.seed);
  EXPECT_EQ(a.run.output, b.run.output);
  EXPECT_EQ(a.run.profile, b.run.profile);
  EXPECT_EQ(a.run.log_every, b.run.log_every);
  EXPECT_EQ(a.run.flush_every, b.run.flush_every);
  EXPECT_EQ(a.model.kind, b.model.kind);
  EXPECT_EQ(a.model.layers, b.model.layers);
  EXPECT_EQ(a.model.d_model, b.model.d_model);
  EXPECT_EQ(a.model.heads, b.model.heads);
  EXPECT_EQ(a.model.ffn_mult, b.model.ffn_mult);
  EXPECT_EQ(a.model.vocab, b.model.vocab);
  EXPECT_EQ(a.model.seq_len, b.model.seq_len);
  EXPECT_EQ(a.model.attention, b.model.attention);
  EXPECT_EQ(a.model.recompute, b.model.recompute);
  EXPECT_EQ(a.data.source, b.data.source);
  EXPECT_EQ(a.data.path, b.data.path);
  EXPECT_EQ(a.data.global_batch, b.data.global_batch);
  EXPECT_EQ(a.data.micro_batch, b.data.micro_batch);
  EXPECT_EQ(a.parallel.dp, b.parallel.dp);
  EXPECT_EQ(a.parallel.tp, b.parallel.tp);
  EXPECT_EQ(a.parallel.pp, b.parallel.pp);
  EXPECT_EQ(a.parallel.ep, b.parallel.ep);
  EXPECT_EQ(a.parallel.zero, b.parallel.zero);
  EXPECT_EQ(a.parallel.schedule, b.parallel.schedule);
  EXPECT_EQ(a.parallel.virtual_stages, b.parallel.virtual_stages);
  EXPECT_EQ(a.parallel.sequence_parallel, b.parallel.sequence_parallel);
  EXPECT_EQ(a.parallel.offload, b.parallel.offload);
  EXPECT_EQ(a.optim.lr, b.optim.lr);
  EXPECT_EQ(a.optim.schedule, b.optim.schedule);
  EXPECT_EQ(a.optim.warmup, b.optim.warmup);
  EXPECT_EQ(a.optim.min_lr, b.optim.min_lr);
  EXPECT_EQ(a.optim.weight_decay, b.optim.weight_decay);
  EXPECT_EQ(a.optim.beta1, b.optim.beta1);
  EXPECT_EQ(a.optim.beta2, b.optim.beta2);
  EXPECT_EQ(a.optim.eps, b.optim.eps);
  EXPECT_EQ(a.optim.grad_clip, b.optim.grad_clip);
  EXPECT_EQ(a.backend.device, b.backend.device);
  EXPECT_EQ(a.backend.precision, b.backend.precision);
  EXPECT_EQ(a.backend.threads, b.backend.threads);
  EXPECT_EQ(a.backend.memory_limit, b.backend.memory_limit);
  EXPECT_EQ(a.backend.peak_tflops, b.backend.peak_tflops);
}

// Every key the plan has, in the key table's order (model.kind, the global
// keys, the model families' and each registry row's, grouped by section);
// describe_keys() and docs/decks.md must list them all.
const std::vector<std::string> kAllKeys = {
    "run.name", "run.steps", "run.warmup_steps", "run.seed", "run.output", "run.profile", "run.log_every", "run.flush_every", "run.repeats", "run.keep_checkpoints", "run.on_divergence",
    "model.kind", "model.layers", "model.d_model", "model.heads", "model.vocab", "model.seq_len", "model.attention", "model.ffn_mult",
    "model.moe_experts", "model.moe_every", "model.moe_top_k", "model.moe_capacity_factor", "model.moe_drop_tokens",
    "model.moe_renormalize", "model.moe_aux_coef", "model.kv_heads", "model.ffn_dim", "model.rope_theta",
    "model.tie_embeddings", "model.recompute",
    "data.source", "data.path", "data.global_batch", "data.micro_batch",
    "parallel.dp", "parallel.bucket_mb", "parallel.overlap_grad_reduce", "parallel.grad_reduce", "parallel.zero", "parallel.dp_shard", "parallel.grad_sync", "parallel.tp", "parallel.sequence_parallel", "parallel.ep", "parallel.cp",
    "parallel.pp", "parallel.schedule", "parallel.virtual_stages", "parallel.first_stage_layers",
    "parallel.last_stage_layers", "parallel.offload",
    "optim.lr", "optim.schedule", "optim.warmup", "optim.min_lr", "optim.weight_decay", "optim.beta1",
    "optim.beta2", "optim.eps", "optim.grad_clip",
    "backend.device", "backend.comm", "backend.precision", "backend.loss_scale", "backend.loss_scale_window", "backend.threads", "backend.memory_limit", "backend.host_memory_limit", "backend.peak_tflops", "backend.machine", "offload.path", "offload.chunk_mb", "offload.params",
};

class DeckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("strata-test-deck-" + std::to_string(::getpid())) / info->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_.parent_path(), ec);
  }

  // Writes a file under the test directory and returns its path.
  std::string write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  std::string text_file(const std::string& name, std::size_t bytes) {
    std::string s;
    for (std::size_t i = 0; i < bytes; ++i) s += static_cast<char>('a' + i % 26);
    return write(name, s);
  }

  Deck load(const std::string& text, const std::vector<std::string>& overrides = {}) {
    return load_deck(write("deck.toml", text), overrides);
  }

  // Loads the deck, expects an input error, checks that the message contains
  // every piece, and returns the message.
  std::string load_error(const std::string& text, std::initializer_list<std::string> pieces,
                         const std::vector<std::string>& overrides = {}) {
    const std::string path = write("deck.toml", text);
    try {
      load_deck(path, overrides);
    } catch (const strata::core::Error& e) {
      EXPECT_EQ(e.kind(), strata::core::ErrorKind::input);
      EXPECT_EQ(e.exit_code(), 2);
      const std::string msg = e.what();
      for (const std::string& piece : pieces) EXPECT_NE(msg.find(piece), std::string::npos)
          << "message lacks \"" << piece << "\":\n" << msg;
      return msg;
    }
    ADD_FAILURE() << "no error for deck:\n" << text;
    return "";
  }

  fs::path dir_;
};

TEST_F(DeckTest, FullDeckResolvesEveryValue) {
  const std::string data = text_file("tiny.txt", 4096);
  const std::string deck_text = R"([run]
name = "full"
steps = 20
warmup_steps = 3
seed = 99
output = "out/full.h5"
profile = false
log_every = 5

[model]
kind = "gpt"
layers = 3
d_model = 96
heads = 6
ffn_mult = 2
vocab = 300
seq_len = 32

[data]
source = "text"
path = ")" + data + R"("
global_batch = 12
micro_batch = 4

[parallel]
dp = 1
tp = 1
pp = 1
ep = 1
zero = 0
schedule = "gpipe"
virtual_stages = 1
sequence_parallel = false
offload = "none"

[optim]
lr = 0.001
schedule = "cosine"
warmup = 5
min_lr = 1e-5
weight_decay = 0.1
beta1 = 0.8
beta2 = 0.99
eps = 1e-6
grad_clip = 1.0

[backend]
device = "cpu"
precision = "fp32"
threads = 2
memory_limit = "2GiB"
peak_tflops = 1.5
)";
  const Deck d = load(deck_text);
  const Plan& c = d.config;
  EXPECT_EQ(d.text, deck_text);
  EXPECT_EQ(c.run.name, "full");
  EXPECT_EQ(c.run.steps, 20);
  EXPECT_EQ(c.run.warmup_steps, 3);
  EXPECT_EQ(c.run.seed, 99u);
  EXPECT_EQ(c.run.output, "out/full.h5");
  EXPECT_FALSE(c.run.profile);
  EXPECT_EQ(c.run.log_every, 5);
  EXPECT_EQ(name_of(c.model.kind), "gpt");
  EXPECT_EQ(c.model.layers, 3);
  EXPECT_EQ(c.model.d_model, 96);
  EXPECT_EQ(c.model.heads, 6);
  EXPECT_EQ(c.model.ffn_mult, 2);
  EXPECT_EQ(c.model.vocab, 300);
  EXPECT_EQ(c.model.seq_len, 32);
  EXPECT_EQ(name_of(c.data.source), "text");
  EXPECT_EQ(c.data.path, data);
  EXPECT_EQ(c.data.global_batch, 12);
  EXPECT_EQ(c.data.micro_batch, 4);
  EXPECT_EQ(name_of(c.parallel.schedule), "gpipe");
  EXPECT_EQ(name_of(c.parallel.offload), "none");
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.001);
  EXPECT_EQ(name_of(c.optim.schedule), "cosine");
  EXPECT_EQ(c.optim.warmup, 5);
  EXPECT_DOUBLE_EQ(c.optim.min_lr, 1e-5);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.optim.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c.optim.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.optim.grad_clip, 1.0);
  EXPECT_EQ(name_of(c.backend.device), "cpu");
  EXPECT_EQ(name_of(c.backend.precision), "fp32");
  EXPECT_EQ(c.backend.threads, 2);
  EXPECT_EQ(c.backend.memory_limit, 2ull << 30);
  EXPECT_DOUBLE_EQ(c.backend.peak_tflops, 1.5);
}

TEST_F(DeckTest, EmptyDeckIsAllDefaults) {
  const Deck d = load("");
  expect_same_config(d.config, Plan{});
  EXPECT_EQ(d.text, "");
}

TEST_F(DeckTest, DefaultsFillMissingKeys) {
  const Deck d = load("[model]\nlayers = 5\n\n[optim]\nlr = 1\n");
  Plan expected;
  expected.model.layers = 5;
  expected.optim.lr = 1.0;  // an integer where a float is expected is fine
  expect_same_config(d.config, expected);
}

TEST_F(DeckTest, TextIsKeptExactlyAsRead) {
  const std::string text = "# comment\r\n[run]\r\nsteps = 4   # trailing\r\n";
  const Deck d = load(text);
  EXPECT_EQ(d.text, text);
  EXPECT_EQ(d.config.run.steps, 4);
  const Deck m = parse_deck("memory.toml", text, {});
  EXPECT_EQ(m.text, text);
  EXPECT_EQ(m.path, "memory.toml");
}

TEST_F(DeckTest, UnknownKeySuggestsTheClosest) {
  load_error("[model]\nlayers = 2\nlayer = 4\n", {"deck.toml:3:", "unknown key 'model.layer'", "did you mean 'layers'?"});
  // A prefix counts as close.
  load_error("[run]\nwarm = 1\n", {"deck.toml:2:", "'run.warm'", "did you mean 'warmup_steps'?"});
  // Nothing close: the known keys of the section are listed.
  load_error("[optim]\nmomentum = 0.9\n", {"deck.toml:2:", "'optim.momentum'", "known keys in [optim]: lr, schedule"});
  // A key of another section says where it belongs.
  load_error("[model]\nsteps = 4\n", {"deck.toml:2:", "'model.steps'", "'steps' belongs in [run]"});
}

TEST_F(DeckTest, UnknownSectionSuggestsTheClosest) {
  load_error("[run]\nsteps = 3\n\n[modle]\nlayers = 2\n", {"deck.toml:4:", "unknown section 'modle'", "did you mean 'model'?"});
  load_error("[sweeep_xyz]\n", {"deck.toml:1:", "unknown section 'sweeep_xyz'", "known sections: run, model, data"});
  // A key above the first header.
  load_error("steps = 3\n", {"deck.toml:1:", "key 'steps' is outside any section", "[run]"});
  // A section written as a plain value.
  load_error("model = 4\n", {"deck.toml:1:", "'model' must be a section", "integer 4"});
}

TEST_F(DeckTest, WrongTypeNamesExpectedAndGot) {
  load_error("[model]\nlayers = \"four\"\n", {"deck.toml:2: key 'model.layers' expects an integer, got string \"four\""});
  // A float is not an integer, even a whole one.
  load_error("[model]\n\nlayers = 4.0\n", {"deck.toml:3: key 'model.layers' expects an integer, got float 4.0"});
  load_error("[run]\nprofile = 1\n", {"deck.toml:2: key 'run.profile' expects a boolean", "got integer 1"});
  load_error("[optim]\nlr = \"fast\"\n", {"deck.toml:2: key 'optim.lr' expects a number, got string \"fast\""});
  load_error("[data]\nsource = 3\n", {"deck.toml:2: key 'data.source' expects a string, got integer 3"});
  load_error("[model]\nlayers = [1, 2]\n", {"deck.toml:2: key 'model.layers' expects an integer, got an array"});
  load_error("[run]\nseed = -1\n", {"deck.toml:2: key 'run.seed' must be >= 0, got -1"});
}

TEST_F(DeckTest, OutOfRangeNamesTheRange) {
  load_error("[model]\nlayers = 0\n", {"deck.toml:2: key 'model.layers' must be in 1..4096, got 0"});
  load_error("[model]\nvocab = 1\n", {"deck.toml:2: key 'model.vocab' must be >= 2, got 1"});
  load_error("[parallel]\nzero = 4\n", {"deck.toml:2: key 'parallel.zero' must be in 0..3, got 4"});
  load_error("[optim]\nlr = 0\n", {"deck.toml:2: key 'optim.lr' must be > 0, got 0.0"});
  load_error("[optim]\nbeta2 = 1.0\n", {"deck.toml:2: key 'optim.beta2' must be in [0, 1), got 1.0"});
  load_error("[optim]\nweight_decay = -0.1\n", {"deck.toml:2: key 'optim.weight_decay' must be >= 0, got -0.1"});
  load_error("[optim]\neps = nan\n", {"deck.toml:2: key 'optim.eps' must be a finite number"});
  load_error("[run]\nsteps = 3000000000\n", {"deck.toml:2: key 'run.steps' must fit a 32-bit integer"});
  load_error("[backend]\nthreads = -1\n", {"deck.toml:2: key 'backend.threads' must be >= 0, got -1"});
}

TEST_F(DeckTest, StringNotAllowedNamesTheAllowedValues) {
  load_error("[data]\nsource = \"txt\"\n",
             {"deck.toml:2: key 'data.source' must be one of \"synthetic\", \"text\"; got \"txt\"", "did you mean \"text\"?"});
  load_error("[parallel]\nschedule = \"pipedream\"\n",
             {"deck.toml:2:", "'parallel.schedule'", "\"1f1b\", \"gpipe\", \"interleaved\", \"zb-h1\""});
  load_error("[backend]\ncomm = \"gloo\"\n", {"deck.toml:2:", "'backend.comm'", "\"auto\", \"mpi\", \"nccl\""});
  // NCCL needs the GPU; the CUDA attention takes head sizes up to 256.
  load_error("[backend]\ncomm = \"nccl\"\n", {"backend.comm", "needs backend.device = \"cuda\""});
  load_error("[model]\nd_model = 1024\nheads = 2\n[backend]\ndevice = \"cuda\"\n",
             {"backend.device", "head size of 512", "up to 256"});
  load_error("[backend]\nprecision = \"fp8\"\n",
             {"deck.toml:2:", "'backend.precision'", "\"fp32\", \"bf16\", \"fp16\""});
  load_error("[backend]\nloss_scale = 0.5\n", {"deck.toml:2:", "'backend.loss_scale'", ">= 1"});
  // A moe model needs experts, and experts need a moe model; top_k at most the experts.
  load_error("[model]\nkind = \"moe\"\n", {"deck.toml:2:", "model.kind = \"moe\"", "needs model.moe_experts >= 1"});
  load_error("[model]\nmoe_experts = 4\n", {"model.moe_experts = 4", "needs model.kind = \"moe\""});
  load_error("[model]\nkind = \"moe\"\nmoe_experts = 1\n", {"model.moe_top_k = 2", "exceeds model.moe_experts = 1"});
  load_error("[model]\nkind = \"moe\"\nmoe_experts = 4\nmoe_capacity_factor = 0\n",
             {"key 'model.moe_capacity_factor' must be > 0"});
  EXPECT_NO_THROW(load("[model]\nkind = \"moe\"\nmoe_experts = 4\n"));
  // A key of another family, set to other than its default, would be ignored.
  load_error("[model]\nkv_heads = 2\n", {"deck.toml:2:", "model.kv_heads = 2", "needs model.kind = \"llama\""});
  load_error("[model]\nkind = \"llama\"\nffn_mult = 3\n",
             {"model.ffn_mult = 3", "needs model.kind = \"gpt\" or \"moe\"", "model.kind = \"llama\" (line 2)"});
  // Llama: key-value heads dividing the heads and (with the MLP) split over
  // tp; rotary positions turn pairs of channels; Mixtral's experts.
  load_error("[model]\nkind = \"llama\"\nheads = 4\nkv_heads = 3\nd_model = 64\n",
             {"model.kv_heads = 3", "does not divide model.heads = 4"});
  load_error("[model]\nkind = \"llama\"\nheads = 4\nd_model = 36\n", {"head size", "= 9 is odd"});
  load_error("[model]\nkind = \"llama\"\nheads = 8\nkv_heads = 2\nd_model = 64\n[parallel]\ntp = 4\n",
             {"model.kv_heads = 2", "not a multiple of parallel.tp = 4", "Megatron-LM"});
  load_error("[model]\nkind = \"llama\"\nheads = 4\nffn_dim = 90\n[parallel]\ntp = 4\n",
             {"MLP width 90", "not a multiple of parallel.tp = 4"});
  load_error("[model]\nkind = \"llama\"\nmoe_experts = 1\n", {"model.moe_top_k = 2", "exceeds model.moe_experts = 1"});
  EXPECT_NO_THROW(load("[model]\nkind = \"llama\"\nkv_heads = 2\nmoe_experts = 8\n"));
}

TEST_F(DeckTest, RecomputationIsCheckedAgainstTheSchedule) {
  EXPECT_NO_THROW(load("[model]\nrecompute = \"full\"\n"));
  EXPECT_NO_THROW(load("[model]\nrecompute = \"selective\"\n[data]\nglobal_batch = 8\nmicro_batch = 2\n"
                       "[parallel]\npp = 2\nschedule = \"1f1b\"\n"));
  load_error("[model]\nrecompute = \"some\"\n", {"'model.recompute'", "\"full\"", "\"none\"", "\"selective\""});
  load_error("[model]\nrecompute = \"full\"\n[data]\nglobal_batch = 8\nmicro_batch = 2\n"
             "[parallel]\npp = 2\nschedule = \"zb-h1\"\n",
             {"model.recompute = \"full\"", "parallel.schedule = \"zb-h1\"", "zero-bubble"});
  load_error("[model]\nrecompute = \"selective\"\nlayers = 4\n[data]\nglobal_batch = 8\nmicro_batch = 2\n"
             "[parallel]\npp = 2\nschedule = \"zb-v\"\nvirtual_stages = 2\n",
             {"model.recompute = \"selective\"", "parallel.schedule = \"zb-v\"", "zero-bubble"});
}

// ZB-V holds exactly two chunks per rank, placed as a V: one chunk points to
// zb-h1, three are refused by its row's shape check.
TEST_F(DeckTest, ZbvNeedsTwoChunksPerRank) {
  EXPECT_NO_THROW(load("[model]\nlayers = 4\n[data]\nglobal_batch = 8\nmicro_batch = 2\n"
                       "[parallel]\npp = 2\nschedule = \"zb-v\"\nvirtual_stages = 2\n"));
  load_error("[model]\nlayers = 4\n[data]\nglobal_batch = 8\nmicro_batch = 2\n[parallel]\npp = 2\nschedule = \"zb-v\"\n",
             {"parallel.schedule = \"zb-v\"", "parallel.virtual_stages = 1", "zb-h1 for zb-v"});
  load_error("[model]\nlayers = 6\n[data]\nglobal_batch = 8\nmicro_batch = 2\n"
             "[parallel]\npp = 2\nschedule = \"zb-v\"\nvirtual_stages = 3\n",
             {"the zb-v schedule", "placed as a V", "must be 2, not 3"});
}

TEST_F(DeckTest, HybridShardingIsChecked) {
  const std::string batch = "[data]\nglobal_batch = 16\nmicro_batch = 2\n";
  EXPECT_NO_THROW(load(batch + "[parallel]\ndp = 4\nzero = 3\ndp_shard = 2\n"));
  EXPECT_NO_THROW(load(batch + "[parallel]\ndp = 4\nzero = 1\ndp_shard = 1\n"));
  EXPECT_NO_THROW(load(batch + "[parallel]\ndp = 4\ndp_shard = 4\n")) << "one group: plain dp";
  load_error(batch + "[parallel]\ndp = 4\nzero = 2\ndp_shard = 3\n",
             {"parallel.dp_shard = 3", "does not divide parallel.dp = 4", "groups of dp_shard ranks"});
  load_error(batch + "[parallel]\ndp = 4\ndp_shard = 2\n",
             {"parallel.dp_shard = 2", "shards ZeRO's state", "parallel.zero = 0 (default)"});
  load_error("[model]\nkind = \"moe\"\nmoe_experts = 4\n" + batch + "[parallel]\ndp = 4\nep = 2\nzero = 1\ndp_shard = 2\n",
             {"parallel.dp_shard = 2", "parallel.ep = 2", "expert-data-parallel"});
  load_error(batch + "[parallel]\ndp = 4\nzero = 1\ndp_shard = -1\n", {"parallel.dp_shard", "-1"});
}

// Reducing every micro-batch into the gradient shard needs one (ZeRO 2 or
// 3); once a step suits every stage; auto resolves by the stage.
TEST_F(DeckTest, GradientSyncIsChecked) {
  const std::string batch = "[data]\nglobal_batch = 16\nmicro_batch = 2\n";
  for (const char* zero : {"2", "3"})
    for (const char* sync : {"step", "micro_batch", "auto"})
      EXPECT_NO_THROW(load(batch + "[parallel]\ndp = 4\nzero = " + zero + "\ngrad_sync = \"" + sync + "\"\n"));
  EXPECT_NO_THROW(load(batch + "[parallel]\ndp = 4\nzero = 1\ngrad_sync = \"step\"\n"));
  load_error(batch + "[parallel]\ndp = 4\nzero = 1\ngrad_sync = \"micro_batch\"\n",
             {"parallel.grad_sync = \"micro_batch\"", "parallel.zero = 1", "holds whole gradients", "2 or 3"});
  load_error(batch + "[parallel]\ndp = 4\ngrad_sync = \"micro_batch\"\n", {"parallel.zero = 0 (default)"});
  load_error(batch + "[parallel]\ndp = 4\nzero = 2\ngrad_sync = \"sometimes\"\n",
             {"parallel.grad_sync", "sometimes", "micro_batch"});
  EXPECT_FALSE(load(batch + "[parallel]\ndp = 4\nzero = 1\n").config.parallel.reduce_every_micro_batch());
  EXPECT_TRUE(load(batch + "[parallel]\ndp = 4\nzero = 2\n").config.parallel.reduce_every_micro_batch());
  EXPECT_FALSE(load(batch + "[parallel]\ndp = 4\nzero = 3\ngrad_sync = \"step\"\n").config.parallel.reduce_every_micro_batch());
}

TEST_F(DeckTest, ContextParallelismIsChecked) {
  const std::string batch = "[data]\nglobal_batch = 8\nmicro_batch = 2\n";
  EXPECT_NO_THROW(load("[model]\nseq_len = 16\n" + batch + "[parallel]\ncp = 4\n"));
  EXPECT_NO_THROW(load("[model]\nseq_len = 16\n" + batch + "[parallel]\ncp = 2\ntp = 2\nsequence_parallel = true\n"));
  load_error("[model]\nseq_len = 12\n" + batch + "[parallel]\ncp = 4\n",
             {"model.seq_len = 12", "not a multiple of 2 x parallel.cp = 4", "2 cp chunks"});
  load_error("[model]\nseq_len = 24\nheads = 4\nd_model = 16\n" + batch +
                 "[parallel]\ncp = 4\ntp = 4\nsequence_parallel = true\n",
             {"model.seq_len = 24", "parallel.cp = 4", "not a multiple of parallel.tp = 4"});
  load_error("[model]\nseq_len = 16\nkind = \"moe\"\nmoe_experts = 4\n" + batch + "[parallel]\ncp = 2\n",
             {"parallel.cp = 2", "Mixture-of-Experts", "use cp = 1"});
  load_error("[model]\nseq_len = 16\n[data]\nglobal_batch = 8\nmicro_batch = 1\n[parallel]\ncp = 2\ndp = 2\nzero = 3\n"
             "dp_shard = 1\n",
             {"parallel.cp = 2", "parallel.dp_shard = 1", "dp_shard = 0"});
}

TEST_F(DeckTest, ExpertParallelLayoutsAreChecked) {
  const std::string moe = "[model]\nkind = \"moe\"\nmoe_experts = 4\nheads = 4\nvocab = 256\n";
  const std::string batch = "[data]\nglobal_batch = 16\nmicro_batch = 2\n";
  EXPECT_NO_THROW(load(moe + batch + "[parallel]\ndp = 4\nep = 2\n"));
  EXPECT_NO_THROW(load(moe + batch + "[parallel]\ndp = 4\nep = 4\nzero = 3\n"));
  EXPECT_NO_THROW(load(moe + batch + "[parallel]\ndp = 2\nep = 2\ntp = 2\nsequence_parallel = true\n"));
  EXPECT_NO_THROW(load(moe + batch + "[parallel]\ndp = 2\nep = 2\npp = 2\n"));
  // ep divides dp; experts split evenly over ep; ep needs experts.
  load_error(moe + batch + "[parallel]\ndp = 4\nep = 3\n",
             {"parallel.ep = 3", "does not divide parallel.dp = 4", "part of each data-parallel group"});
  load_error(moe + batch + "[parallel]\ndp = 2\nep = 4\n", {"parallel.ep = 4", "does not divide parallel.dp = 2"});
  load_error("[model]\nkind = \"moe\"\nmoe_experts = 6\n" + batch + "[parallel]\ndp = 4\nep = 4\n",
             {"model.moe_experts = 6", "not a multiple of parallel.ep = 4"});
  load_error(batch + "[parallel]\ndp = 2\nep = 2\n",
             {"parallel.ep = 2", "needs a Mixture-of-Experts model", "model.moe_experts = 0 (default)"});
  // top_k and capacity, with ep as without.
  load_error("[model]\nkind = \"moe\"\nmoe_experts = 2\nmoe_top_k = 3\n" + batch + "[parallel]\ndp = 2\nep = 2\n",
             {"'model.moe_top_k'"});
  load_error(moe + "moe_capacity_factor = -1\n" + batch + "[parallel]\ndp = 2\nep = 2\n",
             {"key 'model.moe_capacity_factor' must be > 0"});
}

TEST_F(DeckTest, TomlSyntaxErrorNamesLineAndColumn) {
  const std::string msg = load_error("[run]\nsteps = 3\nlayers = = 4\n", {"deck.toml:3:", "TOML syntax error"});
  EXPECT_NE(msg.find("deck.toml:3:10"), std::string::npos) << msg;
  load_error("[run]\nsteps = 3\nsteps = 4\n", {"deck.toml:3:", "TOML syntax error"});
}

TEST_F(DeckTest, DModelMustBeAMultipleOfHeads) {
  load_error("[model]\nd_model = 60\nheads = 8\n",
             {"deck.toml:2: model.d_model = 60 (line 2) is not a multiple of model.heads = 8 (line 3)"});
  // One key from the defaults: the message starts at the key that was set.
  load_error("[model]\nheads = 5\n", {"deck.toml:2:", "model.d_model = 64 (default)", "model.heads = 5 (line 2)"});
}

TEST_F(DeckTest, GlobalBatchMustBeAMultipleOfMicroBatch) {
  load_error("[data]\nglobal_batch = 10\nmicro_batch = 4\n",
             {"deck.toml:2:", "data.global_batch = 10 (line 2)", "not a multiple of data.micro_batch = 4 (line 3)"});
}

TEST_F(DeckTest, WarmupMustBeLessThanSteps) {
  load_error("[run]\nsteps = 5\nwarmup_steps = 5\n",
             {"deck.toml:3:", "run.warmup_steps = 5 (line 3) must be less than run.steps = 5 (line 2)"});
  // The default warmup_steps (2) against steps = 2.
  load_error("[run]\nsteps = 2\n", {"deck.toml:2:", "run.warmup_steps = 2 (default)", "run.steps = 2 (line 2)"});
}

TEST_F(DeckTest, TextSourceNeedsAReadableLongEnoughFile) {
  load_error("[data]\nsource = \"text\"\n", {"deck.toml:2:", "data.source = \"text\"", "requires data.path"});
  load_error("[data]\nsource = \"text\"\npath = \"nope.txt\"\n",
             {"deck.toml:3:", "data.path = \"nope.txt\" (line 3)", "no such file", "nope.txt"});
  // seq_len = 64 needs more than 65 bytes.
  text_file("short.txt", 65);
  load_error("[data]\nsource = \"text\"\npath = \"short.txt\"\n",
             {"deck.toml:3:", "data.path", "has 65 bytes", "model.seq_len = 64 (default)", "more than 65"});
  load_error("[data]\nsource = \"text\"\npath = \".\"\n", {"deck.toml:3:", "data.path", "is a directory"});
  text_file("ok.txt", 1000);
  load_error("[model]\nvocab = 100\n[data]\nsource = \"text\"\npath = \"ok.txt\"\n",
             {"deck.toml:2:", "model.vocab = 100 (line 2)", ">= 256", "data.source = \"text\" (line 4)"});
}

TEST_F(DeckTest, RelativeDataPathIsFoundNextToTheDeck) {
  // The test runs from the build tree: the file is not in the current
  // directory, so it must be found beside the deck, and the path written back.
  const std::string data = text_file("sub/tiny.txt", 1000);
  const std::string deck = write("sub/deck.toml", "[data]\nsource = \"text\"\npath = \"tiny.txt\"\n");
  const Deck d = load_deck(deck, {});
  EXPECT_EQ(fs::path(d.config.data.path), fs::path(data).lexically_normal());
  EXPECT_TRUE(fs::exists(d.config.data.path));
  // A synthetic source does not look at data.path at all.
  EXPECT_NO_THROW(load("[data]\nsource = \"synthetic\"\npath = \"missing.txt\"\n"));
}

TEST_F(DeckTest, ParallelLayoutConstraintsAreChecked) {
  load_error("[parallel]\noffload = \"nvme\"\n",
             {"deck.toml:2: parallel.offload = \"nvme\" (line 2) needs offload.path, the directory each rank's"});
  EXPECT_NO_THROW(load("[parallel]\noffload = \"nvme\"\n[offload]\npath = \"/tmp\"\nchunk_mb = 0.5\n"));
  load_error("[offload]\nchunk_mb = 0\n", {"deck.toml:2:", "'offload.chunk_mb' must be > 0"});
  load_error("[parallel]\noffload = \"nvme\"\nzero = 2\n[offload]\npath = \"/tmp\"\nparams = true\n",
             {"offload.params = true needs parallel.offload = \"nvme\" and parallel.zero = 3", "parallel.zero = 2"});
  EXPECT_NO_THROW(load("[parallel]\noffload = \"nvme\"\nzero = 3\n[offload]\npath = \"/tmp\"\nparams = true\n"));
  EXPECT_NO_THROW(load("[parallel]\noffload = \"host\"\n[backend]\nhost_memory_limit = \"1GiB\"\n"));
  EXPECT_NO_THROW(load("[model]\nseq_len = 8\n[parallel]\ntp = 2\nsequence_parallel = true\n"));
  load_error("[model]\nseq_len = 9\nheads = 4\n[parallel]\ntp = 2\nsequence_parallel = true\n",
             {"model.seq_len = 9", "parallel.tp = 2"});
  // Tensor parallelism splits heads and vocabulary.
  EXPECT_NO_THROW(load("[model]\nheads = 4\nvocab = 256\n[parallel]\ntp = 2\n"));
  load_error("[model]\nheads = 4\nd_model = 64\n[parallel]\ntp = 3\n", {"model.heads = 4", "parallel.tp = 3"});
  load_error("[model]\nheads = 2\nvocab = 255\n[parallel]\ntp = 2\n", {"model.vocab = 255", "parallel.tp = 2"});
  // Pipelines: every schedule, with every ZeRO stage; layers split evenly
  // over pp x virtual_stages; 1F1B, interleaved and ZB-H1 need m >= pp.
  EXPECT_NO_THROW(load("[model]\nlayers = 4\n[data]\nglobal_batch = 8\nmicro_batch = 2\n[parallel]\npp = 2\n"));
  EXPECT_NO_THROW(load("[model]\nlayers = 4\n[data]\nglobal_batch = 8\nmicro_batch = 2\n[parallel]\npp = 2\n"
                       "zero = 1\nschedule = \"zb-h1\"\n"));
  EXPECT_NO_THROW(load("[model]\nlayers = 4\n[data]\nglobal_batch = 8\nmicro_batch = 2\n[parallel]\npp = 2\n"
                       "schedule = \"interleaved\"\nvirtual_stages = 2\n"));
  load_error("[model]\nlayers = 3\n[parallel]\npp = 2\nschedule = \"gpipe\"\n", {"model.layers = 3", "parallel.pp = 2"});
  load_error("[model]\nlayers = 4\n[data]\nglobal_batch = 12\nmicro_batch = 2\n[parallel]\npp = 2\n"
             "schedule = \"interleaved\"\nvirtual_stages = 4\n",
             {"model.layers = 4", "is not a multiple of parallel.pp = 2", "x parallel.virtual_stages = 4"});
  load_error("[model]\nlayers = 4\n[data]\nglobal_batch = 4\nmicro_batch = 2\n[parallel]\npp = 4\n",
             {"at least as many micro-batches", "= 2 < parallel.pp = 4"});
  load_error("[model]\nlayers = 4\n[data]\nglobal_batch = 4\nmicro_batch = 2\n[parallel]\npp = 4\n"
             "schedule = \"zb-h1\"\n",
             {"parallel.schedule = \"zb-h1\"", "needs at least as many micro-batches"});
  load_error("[model]\nlayers = 4\n[data]\nglobal_batch = 6\nmicro_batch = 2\n[parallel]\npp = 2\n"
             "schedule = \"interleaved\"\nvirtual_stages = 2\n",
             {"runs micro-batches in groups of pp", "= 3 is not a multiple of parallel.pp = 2"});
  load_error("[model]\nlayers = 4\n[data]\nglobal_batch = 8\nmicro_batch = 2\n[parallel]\npp = 2\n"
             "schedule = \"interleaved\"\n",
             {"needs parallel.virtual_stages = 1", ">= 2 model chunks"});
  // An explicit split: the first and last stages fixed, the rest even.
  EXPECT_NO_THROW(load("[model]\nlayers = 6\n[data]\nglobal_batch = 8\nmicro_batch = 2\n[parallel]\npp = 4\n"
                       "first_stage_layers = 0\nlast_stage_layers = 2\n"));
  load_error("[model]\nlayers = 6\n[data]\nglobal_batch = 8\nmicro_batch = 2\n[parallel]\npp = 4\n"
             "first_stage_layers = 1\n",
             {"leaves 5 layer(s) for the other 3 of parallel.pp = 4", "split evenly, at least one each"});
  load_error("[parallel]\nfirst_stage_layers = 1\n", {"split a pipeline", "parallel.pp = 1"});
  load_error("[parallel]\nvirtual_stages = 2\n", {"deck.toml:2: parallel.virtual_stages = 2", "needs the interleaved or zb-v schedule with pp > 1"});
  load_error("", {"--set parallel.ep=2: parallel.ep = 2 (--set parallel.ep=2) needs a Mixture-of-Experts model"},
             {"parallel.ep=2"});
  // Data parallelism and every ZeRO stage run; the global batch must split over dp.
  EXPECT_NO_THROW(load("[data]\nglobal_batch = 8\nmicro_batch = 2\n[parallel]\ndp = 4\nzero = 3\n"));
  load_error("[data]\nglobal_batch = 8\nmicro_batch = 4\n[parallel]\ndp = 4\n",
             {"data.global_batch = 8", "parallel.dp = 4", "data.micro_batch = 4"});
  load_error("[parallel]\nbucket_mb = 0\n", {"deck.toml:2: key 'parallel.bucket_mb' must be > 0"});
  // The layout keys themselves accept the full design range.
  load_error("[parallel]\ndp = 0\n", {"deck.toml:2: key 'parallel.dp' must be >= 1, got 0"});
}

TEST_F(DeckTest, MemoryLimitTakesBytesOrSizes) {
  struct Case {
    std::string value;
    std::uint64_t bytes;
  };
  const std::vector<Case> good = {
      {"0", 0},
      {"1024", 1024},
      {"\"0\"", 0},
      {"\"512MiB\"", 512ull << 20},
      {"\"2GiB\"", 2ull << 30},
      {"\"1.5GB\"", 1500000000ull},
      {"\"100 KB\"", 100000ull},
      {"\"3kib\"", 3072ull},
      {"\"1TiB\"", 1ull << 40},
      {"\"2TB\"", 2000000000000ull},
      {"\"64B\"", 64ull},
      {"\"1.5KiB\"", 1536ull},
      {"\"0.0001KiB\"", 0ull},  // fractions round down to a whole byte
  };
  for (const Case& c : good) {
    SCOPED_TRACE(c.value);
    EXPECT_EQ(load("[backend]\nmemory_limit = " + c.value + "\n").config.backend.memory_limit, c.bytes);
  }
  load_error("[backend]\nmemory_limit = \"12XB\"\n",
             {"deck.toml:2: key 'backend.memory_limit' expects a byte count: unknown unit \"XB\"", "KiB, MiB, GiB, TiB"});
  load_error("[backend]\nmemory_limit = \"-1GiB\"\n", {"deck.toml:2: key 'backend.memory_limit'", "not a byte size"});
  load_error("[backend]\nmemory_limit = \"GiB\"\n", {"deck.toml:2: key 'backend.memory_limit'", "not a byte size"});
  load_error("[backend]\nmemory_limit = \"\"\n", {"deck.toml:2: key 'backend.memory_limit'", "not a byte size"});
  load_error("[backend]\nmemory_limit = \"99999999999TiB\"\n", {"deck.toml:2: key 'backend.memory_limit'", "larger than"});
  load_error("[backend]\nmemory_limit = 1.5\n",
             {"deck.toml:2: key 'backend.memory_limit' expects a byte count", "got float 1.5"});
  load_error("[backend]\nmemory_limit = -5\n", {"deck.toml:2: key 'backend.memory_limit' must be >= 0, got -5"});
  load_error("[backend]\nmemory_limit = true\n", {"deck.toml:2: key 'backend.memory_limit'", "got boolean true"});
}

TEST_F(DeckTest, OverridesApplyAfterTheDeck) {
  text_file("data.txt", 1000);
  const std::string deck = write("deck.toml", "[model]\nlayers = 2\n[data]\npath = \"" + (dir_ / "data.txt").string() + "\"\n");
  const Deck d = load_deck(deck, {
                                     "model.layers=6",          // int, over the deck's value
                                     "optim.lr=0.001",          // float
                                     "optim.min_lr=0",          // int where a float is expected
                                     "data.source=text",        // bare string
                                     "run.name=\"quoted run\"", // quoted string
                                     "run.output = 2024",       // string key keeps the text as written
                                     "run.profile=false",       // bool
                                     "backend.memory_limit=2GiB",
                                     "model.heads=2",
                                     "model.heads=8",           // the last one wins
                                 });
  EXPECT_EQ(d.config.model.layers, 6);
  EXPECT_DOUBLE_EQ(d.config.optim.lr, 0.001);
  EXPECT_EQ(d.config.optim.min_lr, 0.0);
  EXPECT_EQ(name_of(d.config.data.source), "text");
  EXPECT_EQ(d.config.run.name, "quoted run");
  EXPECT_EQ(d.config.run.output, "2024");
  EXPECT_FALSE(d.config.run.profile);
  EXPECT_EQ(d.config.backend.memory_limit, 2ull << 30);
  EXPECT_EQ(d.config.model.heads, 8);
  EXPECT_EQ(d.overrides.size(), 10u);
}

TEST_F(DeckTest, OverrideErrorsNameTheSetText) {
  load_error("", {"--set model.layer=3: unknown key 'model.layer' (did you mean 'model.layers'?)"}, {"model.layer=3"});
  load_error("", {"--set modle.heads=3: unknown key 'modle.heads' (did you mean 'model.heads'?)"}, {"modle.heads=3"});
  load_error("", {"--set optim.momentum=0.9: unknown key", "known keys in [optim]"}, {"optim.momentum=0.9"});
  load_error("", {"--set layers=3: unknown key 'layers'"}, {"layers=3"});
  load_error("", {"--set model.layers=four: key 'model.layers' expects an integer, got string \"four\""},
             {"model.layers=four"});
  load_error("", {"--set model.layers=2.5: key 'model.layers' expects an integer, got float 2.5"}, {"model.layers=2.5"});
  load_error("", {"--set model.layers=0: key 'model.layers' must be in 1..4096, got 0"}, {"model.layers=0"});
  load_error("", {"--set run.profile=yes: key 'run.profile' expects a boolean"}, {"run.profile=yes"});
  load_error("", {"--set data.source=texts: key 'data.source' must be one of"}, {"data.source=texts"});
  load_error("", {"--set backend.memory_limit=2GB2: key 'backend.memory_limit'", "unknown unit"},
             {"backend.memory_limit=2GB2"});
  load_error("", {"--set model.layers: expected section.key=value"}, {"model.layers"});
  // Cross-key errors name the --set that made them.
  load_error("[model]\nd_model = 64\n", {"deck.toml:2:", "model.heads = 5 (--set model.heads=5)"}, {"model.heads=5"});
}

TEST_F(DeckTest, AllErrorsAreReportedInLineOrder) {
  const std::string msg = load_error("[run]\nsteps = 0\n[model]\nlayers = \"x\"\nheds = 2\n",
                                     {"deck.toml:2:", "deck.toml:4:", "deck.toml:5:"}, {"model.vocab=1"});
  EXPECT_LT(msg.find("deck.toml:2:"), msg.find("deck.toml:4:"));
  EXPECT_LT(msg.find("deck.toml:4:"), msg.find("deck.toml:5:"));
  EXPECT_LT(msg.find("deck.toml:5:"), msg.find("--set model.vocab=1"));
}

TEST_F(DeckTest, ResolvedTomlReparsesToTheSameConfig) {
  const std::string data = text_file("d.txt", 500);
  const Deck d = load(
      "[run]\nname = \"a \\\"quoted\\\" name\\twith tab\"\nsteps = 7\nseed = 18446744073709551\n"
      "[model]\nlayers = 3\nd_model = 48\nheads = 3\n"
      "[data]\nsource = \"text\"\npath = \"" + data + "\"\nglobal_batch = 6\nmicro_batch = 3\n"
      "[optim]\nlr = 0.1\nmin_lr = 1e-7\nbeta1 = 0.3333333333333333\neps = 1\n"
      "[backend]\nmemory_limit = \"1.5GB\"\npeak_tflops = 123.456\n",
      {"parallel.schedule=zb-h1", "optim.grad_clip=2"});
  // Valid TOML on its own.
  EXPECT_NO_THROW(toml::parse(d.resolved_toml)) << d.resolved_toml;
  for (const std::string& key : kAllKeys) {
    const std::string name = key.substr(key.find('.') + 1);
    EXPECT_NE(d.resolved_toml.find("\n" + name + " = "), std::string::npos) << key;
  }
  const Deck again = parse_deck((dir_ / "resolved.toml").string(), d.resolved_toml, {});
  expect_same_config(again.config, d.config);
  EXPECT_EQ(again.resolved_toml, d.resolved_toml);
  // The defaults round-trip too.
  const Deck defaults = parse_deck("defaults.toml", load("").resolved_toml, {});
  expect_same_config(defaults.config, Plan{});
}

TEST_F(DeckTest, LoadDeckRefusesUnreadableFiles) {
  const std::string missing = (dir_ / "missing.toml").string();
  try {
    load_deck(missing, {});
    ADD_FAILURE() << "no error";
  } catch (const strata::core::Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find(missing + ": cannot read deck"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_deck(dir_.string(), {}), strata::core::Error);
}

TEST_F(DeckTest, DescribeKeysListsEveryKeyOnce) {
  const std::vector<std::string> lines = strata::deck::describe_keys();
  ASSERT_EQ(lines.size(), kAllKeys.size());
  for (std::size_t i = 0; i < kAllKeys.size(); ++i) EXPECT_EQ(lines[i].rfind(kAllKeys[i] + " ", 0), 0u) << lines[i];
  // Defaults come from the Plan.
  for (const std::string& line : lines) {
    if (line.rfind("model.layers ", 0) == 0) {
      EXPECT_NE(line.find(" 2 "), std::string::npos) << line;
    }
  }
}

TEST_F(DeckTest, DocsListEveryKey) {
  // docs/decks.md, found from this source file's path; skipped when the source
  // tree is not at hand (an installed test binary).
  const fs::path docs = fs::path(__FILE__).parent_path().parent_path().parent_path() / "docs" / "decks.md";
  if (!fs::exists(docs)) GTEST_SKIP() << docs << " not found";
  std::ifstream in(docs);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Each key's row must carry the type and default the code has:
  // "| `layers` | int | `2` |".
  for (const std::string& line : strata::deck::describe_keys()) {
    std::vector<std::string> columns;
    std::size_t at = 0;
    while (columns.size() < 3) {
      const std::size_t end = line.find("  ", at);
      columns.push_back(line.substr(at, end - at));
      at = line.find_first_not_of(' ', end);
    }
    const std::string name = columns[0].substr(columns[0].find('.') + 1);
    const std::string row = "| `" + name + "` | " + columns[1] + " | `" + columns[2] + "` |";
    EXPECT_NE(text.find(row), std::string::npos) << "docs/decks.md lacks the row " << row;
  }
}

TEST(DeckKeys, ByteSizesAndHints) {
  using strata::plan::closest_name;
  using strata::plan::edit_distance;
  using strata::plan::parse_bytes;
  EXPECT_EQ(std::get<std::uint64_t>(parse_bytes("1.5GB")), 1500000000ull);
  EXPECT_EQ(std::get<std::uint64_t>(parse_bytes("18446744073709551615")), 18446744073709551615ull);
  EXPECT_TRUE(std::holds_alternative<std::string>(parse_bytes("18446744073709551616")));
  EXPECT_TRUE(std::holds_alternative<std::string>(parse_bytes("1.2.3GB")));
  EXPECT_EQ(edit_distance("layer", "layers"), 1u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(closest_name("lyers", {"kind", "layers"}).value_or(""), "layers");
  EXPECT_FALSE(closest_name("ab", {"dp", "tp"}).has_value());
  EXPECT_EQ(strata::plan::toml_literal(strata::plan::Value(1.0)), "1.0");
  EXPECT_EQ(strata::plan::toml_literal(strata::plan::Value(3e-4)), "0.0003");
  EXPECT_EQ(strata::plan::toml_quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
}

}  // namespace
