#pragma once
// The training configuration (docs/formats.md §4): the model keys of §1 plus the optimisation keys,
// from one flat JSON object with `--set key=value` overrides; unknown keys are rejected.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "nn/accounting.h"
#include "nn/config.h"
#include "optim/optim.h"
#include "train/formats/checkpoint.h"

namespace tapelm {

/// The rule for every seed and thread count, flag or config key: seeds 0..2^63-1, threads
/// 0 (all cores)..max_threads.
inline constexpr uint64_t max_seed = 9223372036854775807ULL;
inline constexpr int64_t max_threads = 4096;
/// The distillation temperature's range, for the config key, --distill-temperature and the sweep:
/// the soft targets' term is scaled by T², so a T near 0 drops it from the loss without a word.
inline constexpr double min_distill_temperature = 0.1, max_distill_temperature = 100;
/// "from 0.1 to 100", as messages say the range.
std::string distill_temperature_range();

/// What a training forward keeps for backward: every activation (none recomputed), or one hidden
/// state per transformer block, each block recomputed in backward (GPT::recompute_blocks).
enum class Recompute { none, blocks };
template <> struct EnumNames<Recompute> {
  static constexpr std::array<std::pair<Recompute, const char*>, 2> values{{{Recompute::none, "none"}, {Recompute::blocks, "blocks"}}};
};

/// Which parameters a run trains (uptrain --train): every one; the attention projections (q, k, v
/// and output, biases included); or only the key and value projections, what a conversion
/// changed. The others are frozen: no gradient is computed for them and they have no optimizer
/// state.
enum class Trainable { all, attention, kv };
template <> struct EnumNames<Trainable> {
  static constexpr std::array<std::pair<Trainable, const char*>, 3> values{
      {{Trainable::all, "all"}, {Trainable::attention, "attention"}, {Trainable::kv, "kv"}}};
};
/// Whether the parameter of this name (GPT::named_parameters) is trained under t.
bool is_trained(Trainable t, const std::string& param_name);
/// The model's parameters trained under t; the others are frozen (requires_grad off, so backward
/// computes no gradient for them).
NamedParams trained_parameters(GPT& model, Trainable t);

/// What a run holds its frozen block weights in between uses (trainable attention or kv): float32;
/// bf16 or f16 (rounded to nearest where a value is not one), each block widened to float32 while
/// it runs (NarrowedBlocks, nn/gpt.h); or `auto`, the 16-bit type that holds every one of them
/// exactly (the values of a bf16 or f16 source, as uptrain converts it), else float32.
enum class FrozenWeights { automatic, f32, bf16, f16 };
template <> struct EnumNames<FrozenWeights> {
  static constexpr std::array<std::pair<FrozenWeights, const char*>, 4> values{
      {{FrozenWeights::automatic, "auto"}, {FrozenWeights::f32, "f32"}, {FrozenWeights::bf16, "bf16"}, {FrozenWeights::f16, "f16"}}};
};

/// What a multi-rank run splits over its ranks (ZeRO's stages): nothing, the optimizer's state
/// (stage 1), the optimizer's state and the gradients (stage 2), or also the blocks' parameters,
/// each block's gathered just before its forward and its backward and freed after (stage 3).
enum class Shard { none, optimizer, gradients, parameters };
template <> struct EnumNames<Shard> {
  static constexpr std::array<std::pair<Shard, const char*>, 4> values{{{Shard::none, "none"},
                                                                        {Shard::optimizer, "optimizer"},
                                                                        {Shard::gradients, "gradients"},
                                                                        {Shard::parameters, "parameters"}}};
};
/// Stages 2 and 3 reduce each gradient to the rank that keeps it.
inline bool shards_gradients(Shard s) { return s == Shard::gradients || s == Shard::parameters; }

// type, key, default, check, max: the training keys, declared once (see TAPELM_GPT_FIELDS).
// lr_decay_iters defaults to max_iters when not given.
#define TAPELM_TRAIN_FIELDS(X)                                    \
  X(int64_t, batch_size, 12, positive, count_max)                 \
  X(int64_t, max_iters, 2000, non_negative, count_max)            \
  X(double, learning_rate, 1e-3, positive, none)                  \
  X(double, min_lr, 1e-4, non_negative, none)                     \
  X(int64_t, warmup_iters, 100, non_negative, count_max)          \
  X(int64_t, lr_decay_iters, 2000, any, count_max)                \
  X(bool, decay_lr, true, any, none)                              \
  X(double, weight_decay, 0.1, any, none)                         \
  X(double, beta1, 0.9, unit_interval, none)                      \
  X(double, beta2, 0.99, unit_interval, none)                     \
  X(double, eps, 1e-8, any, none)                                 \
  X(double, momentum, 0.9, any, none)       /* SGD */             \
  X(bool, nesterov, false, any, none)       /* SGD */             \
  X(double, grad_clip, 1.0, non_negative, none) /* 0: off */      \
  X(int64_t, grad_accum, 1, positive, count_max)                  \
  X(std::string, optimizer, "adamw", any, none)                   \
  X(int64_t, eval_interval, 250, positive, count_max)             \
  X(int64_t, eval_iters, 20, positive, count_max)                 \
  X(int64_t, final_eval_tokens, 0, non_negative, count_max) /* the closing evaluation: the val split's first tokens; 0: all */ \
  X(int64_t, log_interval, 10, positive, count_max)               \
  X(int64_t, checkpoint_interval, 500, positive, count_max)       \
  X(uint64_t, seed, 1337, any, max_seed)                          \
  X(int64_t, threads, 0, non_negative, max_threads) /* 0: all cores */ \
  X(double, peak_flops, 0, any, none) /* for MFU; 0: measure this machine's sgemm peak */ \
  X(Precision, precision, Precision::f32, any, none) /* f32, bf16, bf16-emulated (autograd/autocast.h) */ \
  X(Recompute, recompute, Recompute::none, any, none) /* none, blocks: activation checkpointing per block */ \
  X(Trainable, trainable, Trainable::all, any, none) /* all, attention, kv: the parameters trained, the others frozen */ \
  X(Shard, shard, Shard::none, any, none) /* none, optimizer, gradients, parameters: what is split over the ranks (ZeRO stage 1, 2, 3) */ \
  X(Moments, moments, Moments::f32, any, none) /* f32, bf16: AdamW's moments (bf16 rounded stochastically) */ \
  X(FrozenWeights, frozen_weights, FrozenWeights::automatic, any, none) /* auto, f32, bf16, f16: what the frozen block weights are held in */ \
  X(double, distill_lambda, 0, non_negative, none) /* weight of the teacher's soft targets, at most 1; 0: off */ \
  X(double, distill_temperature, 2.0, positive, none)                                              \
  X(double, distill_attention, 0, non_negative, none) /* weight of the per-layer attention-output term; 0: off */

struct TrainConfig {
  GPTConfig model;
  TAPELM_TRAIN_FIELDS(TAPELM_MEMBER)

  /// From a JSON object (model keys and training keys side by side). Validates.
  static TrainConfig from_json(const nlohmann::json& j);
  /// Applies "key=value" overrides (value parsed as JSON, else taken as a string) to a JSON object.
  static void apply_overrides(nlohmann::json& j, const std::vector<std::string>& sets);
  nlohmann::json to_json() const;
  void validate() const;
  LrSchedule schedule() const;
  /// The hyper-parameters of the chosen optimizer, in the form tapelm::make_optimizer reads.
  std::string optimizer_hparams_json() const;
  /// The optimizer this config describes, over the given parameters (via tapelm::make_optimizer).
  std::unique_ptr<Optimizer> make_optimizer(const NamedParams& params) const;
  /// The number of parameters trained (the others frozen: `trainable`).
  int64_t trained_params() const;
  /// FLOPs of one training token: forward, the backward to every input, and the weight gradients
  /// of the trained matrices only (3 × forward when every parameter is trained).
  double train_flops_per_token() const;
};


/// The training config of a weights-only model (an imported one): the training keys from
/// `config` (read from config_path), the model keys from `model`; a model key the config gives
/// with another value is a config Error naming both files (dropout is a training choice and may differ).
TrainConfig config_for_weights_only(const GPTConfig& model, nlohmann::json config, const std::string& config_path,
                                    const std::string& model_path);

/// One rank's memory for training c in a run of `world` ranks, by part, in bytes (the estimate
/// check_training_memory checks and the trainer prints).
struct TrainingMemory {
  double weights = 0;      // float32, and in bf16 the buffer the largest is rounded into
  double gradients = 0;    // of the trained parameters: the rank's share when sharded, and the one in flight
  double optimizer = 0;    // AdamW's two moments of the trained parameters (4 or 2 bytes each): the rank's share when sharded
  double activations = 0;  // one micro-batch's (a lower bound)
  double evaluation = 0;   // the final evaluation's forward: its logits and their softmax (split_eval_batch windows)
  double reduce = 0;       // a multi-rank run's flat all-reduce buffer of the gradients and MPI's own half of it
                           // (none when they are sharded)
  double windows = 0;      // the fixed evaluation windows
  double teacher = 0;      // distillation's teacher: its float32 weights, held beside the model trained
  double start = 0;        // frozen_weights bf16 | f16: every weight in float32 as the run starts, before the frozen go to 16 bits
  /// The peak: the state, the all-reduce's buffer, and the larger of a step's activations and the
  /// final evaluation's (the gradients stay allocated through it); or the start's, when larger.
  double total() const {
    return std::max(weights + gradients + optimizer + reduce + std::max(activations, evaluation), start) + windows + teacher;
  }
  /// "4.25 GB: weights 1.42 GB, gradients 1.42 GB, optimizer state 1.42 GB, activations 0.12 GB"
  std::string str() const;
};
/// Whether name is one of a block's parameters ("blocks.L.…").
bool is_block_parameter(const std::string& name);
/// Which rank keeps what in a sharded run of cfg on `world` ranks: each trained parameter, the
/// largest first, goes to the least loaded rank, which keeps its optimizer state (and gradient)
/// and updates it; under shard parameters each frozen block parameter then goes, in order, to the
/// least loaded rank, which keeps its value. A function of the config and N alone, so every rank
/// deals alike before any model is built.
std::map<std::string, int> deal_out(const TrainConfig& cfg, int world);
/// The parameters of c's blocks: all of them, and the largest block's (what ZeRO stage 3 gathers).
struct BlockParams {
  double all = 0, largest = 0;
};
BlockParams block_params(const GPTConfig& c);
/// Whether the parameter of this name is a frozen block weight under c (what frozen_weights holds).
bool is_frozen_block_parameter(const TrainConfig& c, const std::string& name);
/// c's frozen block weights: all of them, and the largest block's.
BlockParams frozen_block_params(const TrainConfig& c);
/// What c's run holds each block weight in on `world` ranks (NarrowedBlocks::HeldAs): float32 for
/// the trained ones and under frozen_weights f32; the frozen ones in bf16 or f16 as frozen_weights
/// asks, or under `auto` in the 16-bit type that holds the weight's values exactly (a bf16 or f16
/// source's), else float32; under shard parameters on more ranks than one: float32.
NarrowedBlocks::HeldAs frozen_weights_held_as(const TrainConfig& c, int world);
/// A config Error when c asks for a 16-bit type of frozen_weights under shard parameters on more
/// ranks than one (a rank keeps its share of the blocks in float32).
void check_frozen_weights(const TrainConfig& c, int world);
/// The frozen block weights a run holds in 16 bits, once they are known (NarrowedBlocks' counts):
/// `values` of them, `largest_block` in the block that has the most; `since_start` when they came
/// narrowed (uptrain's conversion narrows block by block), so the run never holds them in float32.
struct HeldNarrowed {
  double values = 0, largest_block = 0;
  bool since_start = false;
};
/// teacher_params: the parameters of a distillation teacher held beside the model (0: none).
/// held: what is known to be held in 16 bits (else frozen_weights' bf16 or f16 are counted, and
/// `auto` as float32).
TrainingMemory training_memory(const TrainConfig& c, int world = 1, double teacher_params = 0, const HeldNarrowed* held = nullptr);
/// Weights, gradients and optimizer state together (TrainingMemory's first three).
double training_state_bytes(const TrainConfig& c, int world);
/// Throws a config Error naming the keys at fault when training c cannot fit in `available`
/// bytes: weights, gradients and optimizer state (a rank's share in a run of `world` ranks), one
/// micro-batch's activations (a lower bound) and the evaluation windows. Called before anything is
/// allocated.
void check_training_memory(const TrainConfig& c, double available = available_memory_bytes(), int world = 1, const HeldNarrowed* held = nullptr);

// ---- a training checkpoint's config (train/formats/checkpoint.h stores it as JSON) ----------

/// write_training_checkpoint with cfg's JSON.
void save_training_checkpoint(const std::string& path, const GPT& model, const Optimizer& opt, const TrainConfig& cfg,
                              const TrainState& st, const Tokenizer& tok, const OptimStateSource* elsewhere = nullptr);
/// The training config stored in a full checkpoint (checkpoint Error if there is none or it is bad).
TrainConfig read_train_config(const H5File& f);

/// The training config a checkpoint runs on with (uptrain, sweep --from): its own /train config,
/// or, for a weights-only checkpoint (an imported model), config_path's training keys with the
/// checkpoint's model keys. A usage Error when config_path is given for a checkpoint with its own
/// config or missing for one without; `user` names who runs it in messages ("uptraining").
TrainConfig source_train_config(const std::string& checkpoint, const std::string& config_path, const std::string& user);
/// `c` with `--set key=value` overrides of its training keys and dropout (as `train --set`); another
/// model key is a config Error naming `what`: the model is the source's.
TrainConfig with_train_overrides(const TrainConfig& c, const std::vector<std::string>& sets, const std::string& what);

/// What `train` runs with: config_path's JSON (or, resuming without one, the run directory's
/// checkpoint's config), then the --set overrides, the tokenizer's vocab_size when the config
/// gives none, and threads when > 0.
TrainConfig build_train_config(const std::string& config_path, bool resume, const std::string& run_dir,
                               const std::vector<std::string>& sets, int64_t tokenizer_vocab, int threads);

}  // namespace tapelm
