#pragma once
// The training loop: nanoGPT's train.py in C++ — warmup + cosine schedule, gradient
// accumulation, clipping, periodic evaluation on fixed val batches, metrics.jsonl, atomic
// checkpoints, bit-exact --resume, and a clean stop on SIGINT/SIGTERM.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "autograd/autocast.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "nn/accounting.h"
#include "train/eval.h"
#include "train/run_dir.h"
#include "train/formats/checkpoint.h"
#include "train/stop.h"
#include "train/train_config.h"

namespace tapelm {

struct TrainResult {
  int64_t steps = 0;            // optimizer steps completed in total
  double last_train_loss = 0;   // of the last step
  double val_loss = 0;          // at the last evaluation (eval_iters fixed val batches)
  double val_loss_full = -1;    // on the val split (its first final_eval_tokens) after the last step (final_eval), else -1
  double seconds = 0;           // wall time of this call
  double tokens_per_s = 0;      // median over logged intervals
  bool interrupted = false;     // stopped by a signal, checkpoint written
  double comm_seconds = 0;      // spent in the gradient all-reduce (multi-rank runs)
};

struct TrainOptions {
  bool resume = false;                    // continue from out_dir/checkpoint.h5
  bool quiet = false;                     // no progress lines
  /// Start from these weights instead of the init. They are taken over, not copied: the run's
  /// model takes their storage and trains it in place (a second copy of a 1.3 B model is 5 GB),
  /// and init_from is left without values (so that a weight the run frees is freed). Block weights
  /// init_from holds in 16 bits (its residency a NarrowedBlocks, as uptrain's conversion leaves
  /// them) are taken over as they are, unless the run resumes.
  /// Under mpirun every rank passes its own; rank 0's values are the ones every rank starts from.
  GPT* init_from = nullptr;
  /// Under mpirun: init_from holds rank 0's values on every rank already (uptrain shares them to
  /// evaluate the conversion), so a run that does not resume starts without sending them again.
  bool init_shared = false;
  std::string extra_json = "{}";          // stored in the checkpoint's /train attrs
  std::string label;                      // prefix of progress lines
  bool check_sync = false;                // multi-rank: compare every rank's weights after every step
  bool final_eval = true;                 // after the last step, also the loss on the val split (its first final_eval_tokens when set)
  StopToken stop;                         // requested: save at the last completed step and return
  bool dir_locked = false;                // the caller holds out_dir's lock already (uptrain takes it before converting)
  /// The teacher of distillation (distill_lambda or distill_attention > 0): a model over the same
  /// vocabulary and width, run forward only on every micro-batch; its logits and attention outputs
  /// live for that micro-batch alone.
  const GPT* teacher = nullptr;
};

class GradReducer;

/// One training run: construction does the set-up (model, optimizer, sampler, the run directory,
/// --resume, and in a multi-rank job the agreement of every rank on all of it); step, evaluate
/// and save are the pieces run() loops over. In a multi-rank job every rank makes the same calls
/// in the same order: each of them is a collective.
class ShardedBlocks;

class Trainer {
 public:
  /// Sets up a run per cfg on the corpus (which must outlive the Trainer) in out_dir.
  Trainer(const TrainConfig& cfg, const Corpus& corpus, const std::string& out_dir, const TrainOptions& opt = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// What one optimizer step did.
  struct Step {
    double loss = 0;      // cross-entropy, mean over micro-batches (and ranks)
    double distill = -1;  // distillation: the soft-target loss T²·KL, mean likewise (else -1)
    double distill_attention = -1;  // the attention-output term (micro_batch_loss), mean likewise (else -1)
    double lr = 0;
    bool stop = false;    // the stop token was requested (on any rank)
    bool abandoned = false;  // stopped between micro-batches: no step taken, state as before the call
  };
  /// One optimizer step: grad_accum micro-batches, the all-reduce, the NaN check, clipping, AdamW.
  /// A stop requested between micro-batches abandons the step (Step::abandoned).
  Step step();
  /// The loss on the fixed train and val batches (the same windows at every evaluation): records
  /// train_loss_eval and val_loss in `record` and prints them.
  void evaluate(nlohmann::json& record);
  /// Writes the checkpoint: rank 0 gathers every rank's data streams, then writes alone.
  void save();
  /// Trains to max_iters or until the stop token is requested: logging, evaluation, checkpoints.
  TrainResult run();

  /// Optimizer steps completed (including those of a resumed run).
  int64_t steps_done() const { return st_.step; }
  /// The model being trained. Under `shard: parameters` in a multi-rank run a block's weights
  /// are on the rank that keeps them only, and frozen weights held in 16 bits (frozen_weights) have
  /// no float32 values between uses (model().residency gathers or widens them as the model runs).
  GPT& model() { return model_; }

 private:
  void set_up();
  /// Assigns each trained parameter to a rank (the largest first, each to the least loaded): owner_.
  void assign_owners();
  /// Zeroes every trained parameter's gradient in place (the buffers stay for the next step's
  /// backward; sharded, the optimizer holds only this rank's share).
  void zero_grads();
  /// shard parameters: the keeper of every block parameter (resident_, held_by_).
  void keep_blocks_sharded();
  /// The rank that keeps p between uses (shard parameters), or -1 when every rank holds it.
  int held_by(const Var& p) const;
  /// A collective of a sharded save: a block parameter from its keeper to every rank (rank 0 writes it).
  Tensor exchange_weight(const Var& p, const Shape& shape);
  /// A collective of a sharded save: params_[i]'s state of `key` from the rank that keeps it to
  /// every rank (rank 0 writes it); undefined where there is none (SGD without momentum).
  StateBuf exchange_state(const std::string& key, size_t i);
  bool stop_between_micro_steps();
  /// shard gradients: the norm of the whole gradient, each share's part from its keeper (a collective).
  double sharded_grad_norm();
  /// shard gradients: the first parameter, on any rank, whose gradient is not finite (a collective).
  std::string first_non_finite_share();
  /// The loss of the micro-batch in x_, y_ (its cross-entropy added to ce_sum): cross-entropy,
  /// or with a teacher (1 − λ)·CE + λ·T²·KL(teacher ‖ model) + β·A (the KL term added to
  /// distill_sum, A to attention_sum), where A = (1/L) Σ_l ‖o_l − t_l‖² / ‖t_l‖² compares each
  /// block's attention output o_l with the teacher's t_l on the same batch (β = distill_attention).
  Var micro_batch_loss(double& ce_sum, double& distill_sum, double& attention_sum);
  void print_progress(const Step& s, double tokens_per_s, int64_t first_step, bool last);

  const std::chrono::steady_clock::time_point t_start_;  // first: the wall time includes the set-up
  const TrainConfig cfg_;
  const Precision precision_;  // of the linear layers' products (cfg_.precision)
  const NarrowedBlocks::HeldAs frozen_held_as_;  // what each frozen block weight is held in (cfg_.frozen_weights)
  const Corpus& corpus_;
  const TrainOptions opt_;
  RunDir dir_;
  const int rank_, world_;
  const bool lead_, multi_, quiet_;
  GPT model_;
  NamedParams params_;  // those trained (cfg_.trainable); the others are frozen
  std::vector<Shape> param_shapes_;  // params_'s
  std::unique_ptr<Optimizer> optim_;  // over params_, or (sharded) this rank's share of them
  /// sharded (optimizer or gradients) in a multi-rank run: the rank that keeps params_[i]'s
  /// optimizer state (and gradient) and updates it (the others receive its new values); empty otherwise.
  std::vector<int> owner_;
  /// shard parameters in a multi-rank run: each block's parameters gathered around its use
  /// (model_.residency), and the rank that keeps each of them between uses (by Var::id).
  std::shared_ptr<ShardedBlocks> resident_;
  std::map<const void*, int> held_by_;
  /// The frozen block weights held in 16 bits (frozen_held_as_), widened as each block runs; null when none is.
  std::shared_ptr<NarrowedBlocks> narrowed_;
  std::optional<BatchSampler> sampler_;
  TrainState st_;
  std::vector<int64_t> val_windows_, train_windows_;
  double train_flops_;         // per token (TrainConfig::train_flops_per_token)
  double peak_flops_ = 0;      // sgemm peak of the job (or the config's peak_flops)
  double cpu_peak_flops_ = 0;  // theoretical CPU peak of the job
  double tokens_per_step_ = 0;
  std::unique_ptr<GradReducer> reducer_;
  TrainResult res_;
  Index x_, y_;
};

/// Trains per cfg on the corpus, writing out_dir/checkpoint.h5 and out_dir/metrics.jsonl.
/// In a multi-rank job (dist::multi()) every rank calls it: each rank draws batch_size windows
/// per micro-step from its own stream, gradients are averaged over ranks before clipping, and
/// rank 0 alone writes checkpoints, metrics and progress.
TrainResult train(const TrainConfig& cfg, const Corpus& corpus, const std::string& out_dir, const TrainOptions& opt = {});

/// The parameters this rank gives values to as a model of cfg is built: under `shard: parameters`
/// in a multi-rank run, the block weights it keeps while training and every other parameter; else
/// all of them (nullptr). A function of cfg and the number of ranks alone.
GPT::Keep start_keep(const TrainConfig& cfg);

/// A collective (--check-sync): compares a checksum of every parameter across ranks and throws
/// dist::AgreedError naming the first parameter that differs.
void check_ranks_in_sync(const NamedParams& params, int64_t step);

}  // namespace tapelm
