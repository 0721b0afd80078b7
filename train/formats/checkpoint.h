#pragma once
// The checkpoint format (docs/formats.md §2), in one place: this module and its .cpp are the only code
// that names the file's groups and attributes.
//
//   /            attrs format = "tapelm", format_version, config (model config JSON)
//   /model/<name>                 one float32 dataset per parameter
//   /optim       attrs type, step, hparams; /optim/<state key>/<name> (exp_avg, ...)
//   /train       attrs step, tokens_seen, config, dropout_rng, extra [, world_size];
//                sampler_state [, rank_<r>/...]
//   /tokenizer   attr kind (char|sentencepiece); char: attr json; sentencepiece: dataset model
//                (the .model file's bytes). No kind attribute: char (older files).
//   /imported/<name>              tensors an imported file held beside the weights
//
// A file with only / and /model is a valid (weights-only) checkpoint. Other files written
// beside the format (eval's gradients, convert's output) are written here too.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tokenizer/tokenizer.h"
#include "nn/gpt.h"
#include "optim/optim.h"
#include "train/formats/h5file.h"
#include "train/formats/model_sink.h"
#include "train/formats/tensor_source.h"

namespace tapelm {

constexpr int64_t kFormatVersion = 1;

// ---- weights --------------------------------------------------------------------------------

/// Checks the root attributes and returns the model config they hold.
GPTConfig read_model_config(const H5File& f);
/// Throws a checkpoint Error naming the first parameter (or, given opt, optimizer state tensor)
/// holding a NaN or Inf, after `when` (e.g. "step 12") and with path, so that non-finite weights
/// are never written; every saver here calls it first.
void check_savable(const std::string& path, const GPT& model, const Optimizer* opt, const std::string& when);
/// Writes the root attributes and every parameter under `group` (default /model).
void write_model(H5File& f, const GPT& model, const std::string& group = "/model",
                 const std::function<Tensor(const Var& p, const Shape& shape)>& weight = nullptr);
/// A checkpoint's tensors under `group` (tapelm's parameter names), read one at a time; a NaN or
/// Inf value is a checkpoint Error naming the dataset.
class CheckpointSource : public formats::TensorSource {
 public:
  CheckpointSource(const H5File& f, const std::string& group = "/model");
  std::string what() const override;
  const std::vector<Info>& tensors() const override { return infos_; }
  const Info* find(const std::string& name) const override;
  void read_f32(const Info& t, float* out) const override;

 private:
  const H5File& f_;
  std::string group_;
  std::vector<Info> infos_;
  std::map<std::string, size_t> at_;
};
/// Loads every parameter from `group`, first checking the exact set of names and shapes: a
/// mismatch names every missing, extra or mis-shaped parameter, and nothing is loaded; so does a
/// NaN or Inf value (named with its dataset). With `only`, the parameters it does not name are
/// neither read nor checked, and keep what they hold.
void read_model_weights(const H5File& f, GPT& model, const std::string& group = "/model",
                        const std::function<bool(const std::string& name)>& only = {});
/// A model read from a checkpoint, with the tokenizer the file holds (none for a weights-only file
/// without one).
struct LoadedModel {
  std::unique_ptr<GPT> model;
  std::optional<Tokenizer> tok;
};
/// Builds the model a checkpoint file describes and loads its weights and tokenizer. A model whose
/// parameters at `bytes_per_param` bytes each (4: the weights once) exceed the memory available is
/// refused before anything is allocated, naming the file and the parameter count.
/// With held_as, the block weights are read one block at a time, each block narrowed to what
/// held_as gives as soon as it is read (NarrowedBlocks, set as the model's residency): the float32
/// model is never whole. bytes_per_param then counts what is expected to be held.
LoadedModel load_model(const std::string& path, double bytes_per_param = 4, const NarrowedBlocks::HeldAs& held_as = nullptr);
/// Writes a weights-only checkpoint atomically.
void save_model(const std::string& path, const GPT& model);

// ---- full training checkpoints ----------------------------------------------------------------

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
  // Set by load_training_checkpoint, never saved: the optimizer hyper-parameters this run
  // changed relative to the checkpoint's, e.g. "lr 0.001 -> 0.0003"; empty when they agree.
  std::string optim_hparams_changed;
};

/// Optimizer state held elsewhere (by the ranks of a sharded run): for each state key in order and
/// each of `names` in order, fetch(key, i) gives the tensor to write, or an undefined one when
/// there is none; each is written before the next is fetched, so one is in memory at a time.
struct OptimStateSource {
  std::vector<std::string> names;
  /// When set, the state of names[i] under key (a sharded optimizer's, from the rank that keeps it);
  /// unset: the optimizer's own.
  std::function<StateBuf(const std::string& key, size_t i)> fetch;
  /// When set, each model parameter's value to write, called in named_parameters() order with the
  /// parameter and its shape (ZeRO stage 3: a block's weights come from the rank that keeps them;
  /// frozen weights held in 16 bits are widened).
  std::function<Tensor(const Var& p, const Shape& shape)> weight;
};

/// Writes everything atomically to path (temp file, sync, rename); train_config is the training
/// config's JSON (TrainConfig::to_json; train_config.h's save_training_checkpoint passes it). The
/// optimizer's state comes from `elsewhere` when given, else from opt.
void write_training_checkpoint(const std::string& path, const GPT& model, const Optimizer& opt, const nlohmann::json& train_config,
                               const TrainState& st, const Tokenizer& tok, const OptimStateSource* elsewhere = nullptr);
/// Restores model weights, optimizer state and training state from a full checkpoint (NaN or Inf
/// anywhere in them is an error naming the dataset, and nothing is restored). The optimizer
/// keeps the hyper-parameters it was built with; see optim_hparams_changed. `keep`, when given,
/// names the parameters whose optimizer state is read (a rank's share of a sharded run); the
/// others' is not read at all. `keep_weight`, when given, names the weights read likewise (ZeRO
/// stage 3: the blocks' weights another rank keeps are neither read nor checked here).
void load_training_checkpoint(const H5File& f, GPT& model, Optimizer& opt, TrainState& st,
                              const std::function<bool(const std::string& name)>& keep = {},
                              const std::function<bool(const std::string& name)>& keep_weight = {});

/// True if the file holds a training config (/train), as a full training checkpoint does.
bool has_train_config(const H5File& f);
/// The training config's JSON stored in a full checkpoint, read with the config reader's limits
/// (checkpoint Error if there is none or it does not parse).
nlohmann::json read_train_config_json(const H5File& f);
/// True if the file holds a tokenizer.
bool has_tokenizer(const H5File& f);
/// The tokenizer stored in a checkpoint (checkpoint Error if there is none).
Tokenizer read_tokenizer(const H5File& f);

/// What `inspect` shows of a checkpoint besides the model config.
struct CheckpointInfo {
  GPTConfig config;
  bool has_train = false;  // a full training checkpoint: step and tokens_seen are set
  int64_t step = 0;
  int64_t tokens_seen = 0;
  bool has_tokenizer = false;
};
/// Reads the config and the training progress of a checkpoint, checking the root attributes.
CheckpointInfo inspect_checkpoint(const std::string& path);

// ---- files derived from a checkpoint ------------------------------------------------------------

/// Writes a weights-only checkpoint of a converted model atomically, with the source's tokenizer
/// when tok is not null and the root attribute converted_from (a JSON description).
void write_converted(const std::string& path, const GPT& model, const Tokenizer* tok,
                     const std::string& converted_from_json);
/// Receives a converted model's parameters one at a time (write_streamed).
class ModelWriter : public formats::ModelSink {
 public:
  /// dtype: f32, or bf16 / f16 (H5File::write_tensor_16: stored as 16-bit bits, widened when
  /// read); q8_0 is a usage Error (a checkpoint does not hold it).
  ModelWriter(H5File& f, const std::string& path, const GPTConfig& c, WeightType dtype = WeightType::f32);
  /// Writes parameter `name` (as named_parameters() names it, of its config shape); a NaN or Inf
  /// value is a checkpoint Error naming it, and nothing is committed.
  void tensor(const std::string& name, const Tensor& t) override;
  /// Throws unless every parameter of the config was written once.
  void check_complete() const;

 private:
  H5File& f_;
  std::string path_;
  WeightType dtype_;
  std::map<std::string, Shape> pending_;
};
/// A weights-only checkpoint of a model that is never whole in memory (a conversion or an import
/// streamed block by block): the root attributes, the note (a root attribute: converted_from or
/// imported_from, and its JSON) and the tokenizer, then the parameters `fill` hands to the writer
/// as they are ready; committed atomically when fill returns with every parameter written.
/// extras: tensors the file held that are no parameter, kept under /imported (write_imported).
void write_streamed(const std::string& path, const GPTConfig& c, const Tokenizer* tok, const std::pair<std::string, std::string>& note,
                    WeightType dtype, const formats::SinkFill& fill, const std::vector<std::pair<std::string, Tensor>>& extras = {});
/// Writes a weights-only checkpoint of a model imported from another format atomically, with the
/// tokenizer when tok is not null, the root attribute imported_from (a JSON description) and, under /imported, the tensors the file
/// held that are no parameter (llama2.c version 0's RoPE tables), so that exporting the model
/// unchanged writes the same bytes. Other commands ignore /imported; convert drops it.
void write_imported(const std::string& path, const GPT& model, const Tokenizer* tok, const std::string& imported_from_json,
                    const std::vector<std::pair<std::string, Tensor>>& extras);
/// The /imported tensors of a checkpoint by name (none for a checkpoint that was not imported).
std::map<std::string, Tensor> read_imported(const H5File& f);
/// Writes d loss / d param as /grad/<name> (zeros for parameters without a gradient) and the root
/// attribute loss, atomically (docs/formats.md §4, eval --grad-out).
void write_gradients(const std::string& path, const GPT& model, double loss);

}  // namespace tapelm
