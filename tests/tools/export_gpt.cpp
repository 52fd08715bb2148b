// Exports what the PyTorch parity test needs to rebuild strata's GPT step by
// step: the configuration, the initial weights by name, the token batches of
// every step, the loss and every gradient of step 0 (before clipping), and the
// loss trajectory and final weights of a short AdamW run through the real
// trainer (gradient accumulation, clipping, learning-rate schedule).
//
// usage: strata_export_gpt OUT.h5 [key=value ...]   (keys of the deck's
//        sections, e.g. model.layers=2 optim.lr=1e-3 run.steps=5)
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/foundation/error.hpp"
#include "src/deck/deck.hpp"
#include "src/report/h5file.hpp"
#include "src/train/trainer.hpp"

using namespace strata;

static void export_flat(report::H5File& f, const std::string& group, const std::string& prefix,
                        const models::ParamRegistry& reg, const float* flat) {
  f.create_group(group);
  for (const auto& s : reg.specs()) f.write_array(group, prefix + s.name, flat + s.offset, s.numel, s.shape);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    if (argc < 2) core::input_error("usage: strata_export_gpt OUT.h5 [section.key=value ...]");
    const std::string base =
        "[run]\nname = \"parity\"\nsteps = 5\nwarmup_steps = 0\nseed = 7\nprofile = false\nlog_every = 0\n"
        "[model]\nlayers = 2\nd_model = 32\nheads = 4\nvocab = 61\nseq_len = 12\n"
        "[data]\nsource = \"synthetic\"\nglobal_batch = 4\nmicro_batch = 2\n"
        "[optim]\nlr = 1e-3\nschedule = \"cosine\"\nwarmup = 2\nmin_lr = 1e-4\nweight_decay = 0.1\n"
        "beta1 = 0.9\nbeta2 = 0.95\neps = 1e-8\ngrad_clip = 1.0\n"
        "[backend]\nthreads = 1\n";
    std::vector<std::string> sets(argv + 2, argv + argc);
    const deck::Deck d = deck::parse_deck("parity.toml", base, sets);
    const plan::Plan& c = d.config;

    core::MemoryTracker tracker;
    train::Trainer trainer(c, tracker, nullptr, 0.0);
    models::Model& m = trainer.model();
    const auto& reg = m.registry();
    const int B = c.data.micro_batch, T = c.model.seq_len, G = c.data.global_batch;

    report::H5File f(MPI_COMM_WORLD, argv[1]);
    f.set_attr("/", "resolved_config", d.resolved_toml);
    export_flat(f, "/initial", "", reg, trainer.strategy().full_params().data());

    // Every step's global batch, as the trainer will draw it.
    std::vector<float> toks, tgts;
    std::vector<std::int32_t> tk(std::size_t(G) * T), tg(std::size_t(G) * T);
    for (int s = 0; s < c.run.steps; ++s) {
      train::fill_batch(trainer.data(), std::int64_t(s) * G, G, T, tk.data(), tg.data());
      toks.insert(toks.end(), tk.begin(), tk.end());
      tgts.insert(tgts.end(), tg.begin(), tg.end());
    }
    f.create_group("/batches");
    f.write_array("/batches", "tokens", toks.data(), std::int64_t(toks.size()), {c.run.steps, G, T});
    f.write_array("/batches", "targets", tgts.data(), std::int64_t(tgts.size()), {c.run.steps, G, T});

    // Step 0's loss and gradients, before any clipping, on a replicated copy
    // of the same initial weights.
    models::ReplicatedState st(reg, m.units(), tracker, c.run.seed);
    double loss0 = 0;
    const int nmb = G / B;
    for (int mb = 0; mb < nmb; ++mb) {
      std::vector<std::int32_t> a(std::size_t(B) * T), b(std::size_t(B) * T);
      train::fill_batch(trainer.data(), std::int64_t(mb) * B, B, T, a.data(), b.data());
      loss0 += m.forward(st, a.data(), b.data()) / nmb;
      m.backward(st, a.data(), b.data(), 1.0f / float(nmb));
    }
    export_flat(f, "/step0", "grad.", reg, st.grads());
    f.write_scalar("/step0", "loss", loss0, "nats", "mean loss of step 0");

    std::vector<float> losses, lrs, norms;
    for (int s = 0; s < c.run.steps; ++s) {
      const auto r = trainer.step(s);
      losses.push_back(float(r.loss));
      lrs.push_back(float(r.lr));
      norms.push_back(float(r.grad_norm));
    }
    f.create_group("/trajectory");
    f.write_array("/trajectory", "loss", losses.data(), std::int64_t(losses.size()), {c.run.steps});
    f.write_array("/trajectory", "lr", lrs.data(), std::int64_t(lrs.size()), {c.run.steps});
    f.write_array("/trajectory", "grad_norm", norms.data(), std::int64_t(norms.size()), {c.run.steps});
    export_flat(f, "/final", "", reg, trainer.strategy().full_params().data());
    f.set_attr("/", "status", "complete");
    f.publish();
  } catch (const core::Error& e) {
    fmt::print(stderr, "strata_export_gpt: {}\n", e.what());
    status = e.exit_code();
  }
  MPI_Finalize();
  return status;
}
