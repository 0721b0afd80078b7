#pragma once
// The training loop: nanoGPT's train.py in C++ — warmup + cosine schedule, gradient
// accumulation, clipping, periodic evaluation on fixed val batches, metrics.jsonl, atomic
// checkpoints, bit-exact --resume, and a clean stop on SIGINT/SIGTERM.
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "data/dataset.h"
#include "train/checkpoint/checkpoint.h"
#include "train/stop.h"

namespace tapelm {

/// Training cannot go on (a NaN loss, an unwritable run directory, ...).
struct TrainError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TrainResult {
  int64_t steps = 0;            // optimizer steps completed in total
  double last_train_loss = 0;   // of the last step
  double val_loss = 0;          // at the last evaluation (eval_iters fixed val batches)
  double val_loss_full = -1;    // on the whole val split after the last step (final_eval), else -1
  double seconds = 0;           // wall time of this call
  double tokens_per_s = 0;      // median over logged intervals
  bool interrupted = false;     // stopped by a signal, checkpoint written
  double comm_seconds = 0;      // spent in the gradient all-reduce (multi-rank runs)
};

struct TrainOptions {
  bool resume = false;                    // continue from out_dir/checkpoint.h5
  bool quiet = false;                     // no progress lines
  const GPT* init_from = nullptr;         // start from these weights instead of the init
  std::string extra_json = "{}";          // stored in the checkpoint's /train attrs
  std::string label;                      // prefix of progress lines
  bool check_sync = false;                // multi-rank: compare every rank's weights after every step
  bool final_eval = true;                 // after the last step, also the loss on the whole val split
  StopToken stop;                         // requested: save after the current step and return
};

/// Loss (mean over batches) of `model` on the given windows of `data`, in eval mode, no tape.
/// With split_across_ranks (a collective in a multi-rank job) each rank evaluates every N-th
/// batch and the sums are reduced, so every rank gets the same number as one process would.
double evaluate_windows(GPT& model, const std::vector<int32_t>& data, const std::vector<int64_t>& starts, int64_t T,
                        int64_t batch, bool split_across_ranks = false);

/// Loss of the model on the whole split in non-overlapping windows of block_size, the figure
/// `tapelm eval` reports (32 windows per forward pass). With split_across_ranks, a collective.
double evaluate_split(GPT& model, const std::vector<int32_t>& split, bool split_across_ranks = false);

/// The sgemm throughput of this machine at the current thread count (FLOP/s), measured once.
double measured_peak_flops();

/// Trains per cfg on the corpus, writing out_dir/checkpoint.h5 and out_dir/metrics.jsonl.
/// In a multi-rank job (dist::multi()) every rank calls it: each rank draws batch_size windows
/// per micro-step from its own stream, gradients are averaged over ranks before clipping, and
/// rank 0 alone writes checkpoints, metrics and progress.
TrainResult train(const TrainConfig& cfg, const Corpus& corpus, const std::string& out_dir, const TrainOptions& opt = {});

/// A collective (--check-sync): compares a checksum of every parameter across ranks and throws
/// dist::AgreedError naming the first parameter that differs.
void check_ranks_in_sync(const NamedParams& params, int64_t step);

}  // namespace tapelm
