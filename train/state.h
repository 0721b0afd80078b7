#pragma once
// Full training checkpoints (SPEC.md §2): the model, the optimizer's state by parameter name,
// the step, tokens seen, the training config, the RNG and sampler state, and the tokenizer.
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "optim/optim.h"
#include "train/checkpoint.h"
#include "train/train_config.h"

namespace tapelm {

struct TrainState {
  int64_t step = 0;          // optimizer steps completed
  int64_t tokens_seen = 0;
  uint64_t dropout_rng = 0;  // the model's dropout stream
  std::string sampler_state; // the train batch sampler
  std::string extra_json = "{}";  // e.g. how an uptraining run began
  // A multi-rank run: the streams of ranks 1..world_size-1 (rank 0's are the two fields above).
  int world_size = 1;
  std::vector<uint64_t> rank_dropout_rngs;
  std::vector<std::string> rank_sampler_states;
};

/// Writes everything atomically to path (temp file, flush, rename).
void save_training_checkpoint(const std::string& path, const GPT& model, const Optimizer& opt,
                              const TrainConfig& cfg, const TrainState& st, const CharTokenizer& tok);

/// The training config stored in a full checkpoint (CheckpointError if there is none).
TrainConfig read_train_config(const H5File& f);
/// The tokenizer stored in a checkpoint (CheckpointError if there is none).
CharTokenizer read_tokenizer(const H5File& f);
/// Restores model weights, optimizer state and training state from a full checkpoint.
void load_training_checkpoint(const H5File& f, GPT& model, Optimizer& opt, TrainState& st);

}  // namespace tapelm
