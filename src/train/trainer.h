#pragma once
// The training loop: nanoGPT's train.py in C++ — warmup + cosine schedule, gradient
// accumulation, clipping, periodic evaluation on fixed val batches, metrics.jsonl, atomic
// checkpoints, bit-exact --resume, and a clean stop on SIGINT/SIGTERM.
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "data/dataset.h"
#include "train/state.h"

namespace tapelm {

/// Training cannot go on (a NaN loss, an unwritable run directory, ...).
struct TrainError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TrainResult {
  int64_t steps = 0;            // optimizer steps completed in total
  double last_train_loss = 0;   // of the last step
  double val_loss = 0;          // at the last evaluation
  double seconds = 0;           // wall time of this call
  double tokens_per_s = 0;      // median over logged intervals
  bool interrupted = false;     // stopped by a signal, checkpoint written
};

struct TrainOptions {
  bool resume = false;                    // continue from out_dir/checkpoint.h5
  bool quiet = false;                     // no progress lines
  const GPT* init_from = nullptr;         // start from these weights instead of the init
  std::string extra_json = "{}";          // stored in the checkpoint's /train attrs
  std::string label;                      // prefix of progress lines
};

/// Loss (mean over batches) of `model` on the given windows of `data`, in eval mode, no tape.
double evaluate_windows(GPT& model, const std::vector<int32_t>& data, const std::vector<int64_t>& starts, int64_t T,
                        int64_t batch);

/// The sgemm throughput of this machine at the current thread count (FLOP/s), measured once.
double measured_peak_flops();

/// Trains per cfg on the corpus, writing out_dir/checkpoint.h5 and out_dir/metrics.jsonl.
TrainResult train(const TrainConfig& cfg, const Corpus& corpus, const std::string& out_dir, const TrainOptions& opt = {});

/// Installs the SIGINT/SIGTERM handler that asks the running loop to stop after its step.
void install_stop_handler();
bool stop_requested();
/// Forgets a stop request (after the caller has acted on it).
void clear_stop_request();

}  // namespace tapelm
