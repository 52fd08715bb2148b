// What a training run writes to its HDF5 report (schema "strata-report",
// version 1): provenance on the root, the /steps, /memory and /timeline
// tables with a rank column, and the /summary headline figures.
// docs/report-schema.md documents every name written here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/core/memory.hpp"
#include "src/prof/timeline.hpp"
#include "src/report/h5file.hpp"
#include "src/train/trainer.hpp"

namespace strata::train {

inline constexpr const char* kSchemaName = "strata-report";
inline constexpr std::int64_t kSchemaVersion = 1;

struct Provenance {
  std::string command_line;
  std::string start_time;   // ISO 8601, UTC
  std::string hosts;        // comma-separated, unique, in rank order
  int world_size = 1;
  std::string slurm_job_id; // empty outside SLURM
  std::string deck_path;
  std::string deck_text;
  std::string resolved_config;
  std::string backend;
  int threads = 1;
  std::string data;
  std::int64_t parameters = 0;
  double peak_flops = 0;
  std::string peak_source;
};

struct MemoryRecord {
  int step;
  core::MemCategory category;
  std::uint64_t current;
  std::uint64_t peak;
};

struct Summary {
  int measured_steps = 0;
  double tokens_per_s = 0;     // median over measured steps
  double step_time = 0;        // median
  double model_flops_per_step = 0;
  double flops_per_s = 0;      // model FLOPs / median step time
  double mfu = 0;
  double initial_loss = 0, final_loss = 0;
  std::uint64_t peak_bytes[core::kNumMemCategories] = {};
  std::uint64_t peak_total = 0;
};

Summary summarise(const std::vector<StepRecord>& steps, const std::vector<MemoryRecord>& memory,
                  double model_flops_per_step, double peak_flops);

void write_provenance(report::H5File& f, const Provenance& p);
void write_tables(report::H5File& f, int rank, const std::vector<StepRecord>& steps,
                  const std::vector<MemoryRecord>& memory, const prof::Timeline* timeline);
void write_summary(report::H5File& f, const Summary& s, const Provenance& p);

}  // namespace strata::train
