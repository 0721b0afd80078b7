#pragma once
// The trade-off study: pretrain one MHA model, convert it to every KV in {H, H/2, ..., 1} by
// mean pooling, first head and random init, uptrain each for α ∈ {0, 0.05, 0.1} of the
// pretraining steps, train GQA/MQA from scratch with the same compute, and measure quality
// (val loss) against decoding speed. Re-running resumes, skipping finished cells.
#include <string>
#include <vector>

#include "train/stop.h"
#include "train/train_config.h"

namespace tapelm {

struct SweepPreset {
  std::string name;
  TrainConfig pretrain;               // the MHA run (n_kv_head = n_head)
  std::vector<double> fractions{0.0, 0.05, 0.1};
  std::vector<std::string> methods{"mean", "first", "random"};
  double headline_fraction = 0.05;
  int headline_seeds = 3;             // mean pooling at headline_fraction, repeated
  int decode_iters = 3;               // timed generations per KV and batch
  std::vector<int64_t> decode_batches{1, 32};
};

/// tiny (≈10 min on 2 cores), small (≈60 min), paper (hours); micro is for tests.
SweepPreset sweep_preset(const std::string& name);

/// Runs (or resumes) the study, writing out_dir/results.csv, report.md and the plots.
/// Returns false when stopped by a signal (re-run to resume).
bool run_sweep(const SweepPreset& p, const std::string& data_path, const std::string& out_dir, bool quiet = false,
               const StopToken& stop = StopToken());

/// The KV head counts of the study: H, H/2, ... while divisible, down to 1.
std::vector<int64_t> sweep_kv_heads(int64_t H);

}  // namespace tapelm
