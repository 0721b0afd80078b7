#include "train/train_config.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

#include "train/eval.h"
#include "train/formats/registry.h"

namespace tapelm {

namespace {
bool is_train_key(const std::string& k) {
#define TAPELM_IS_KEY(type, key, def, check, max) \
  if (k == #key) return true;
  TAPELM_TRAIN_FIELDS(TAPELM_IS_KEY)
#undef TAPELM_IS_KEY
  return false;
}
}  // namespace

TrainConfig TrainConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw Error(ErrorKind::config, "training config must be a JSON object, got " + echo_json(j));
  nlohmann::json model = nlohmann::json::object();
  for (const auto& [k, v] : j.items()) {
    if (GPTConfig::is_key(k)) model[k] = v;
    else if (!is_train_key(k)) throw Error(ErrorKind::config, "unknown config key '" + cut_for_message(k) + "'");
  }
  TrainConfig c;
  c.model = GPTConfig::from_json(model);
#define TAPELM_GET(type, key, def, check, max) config_get(j, #key, c.key);
  TAPELM_TRAIN_FIELDS(TAPELM_GET)
#undef TAPELM_GET
  if (!j.contains("lr_decay_iters")) c.lr_decay_iters = c.max_iters;
  c.validate();
  return c;
}

void TrainConfig::apply_overrides(nlohmann::json& j, const std::vector<std::string>& sets) {
  for (const std::string& s : sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(ErrorKind::config, "--set expects key=value, got '" + cut_for_message(s) + "'");
    const std::string k = s.substr(0, eq), v = s.substr(eq + 1);
    if (!GPTConfig::is_key(k) && !is_train_key(k))
      throw Error(ErrorKind::config, "unknown config key '" + cut_for_message(k) + "' in --set");
    if (nlohmann::json::accept(v)) j[k] = parse_config_json(v, "--set " + k);
    else j[k] = v;  // a bare word such as rmsnorm
  }
}

nlohmann::json TrainConfig::to_json() const {
  nlohmann::json j = model.to_json();
#define TAPELM_PUT(type, key, def, check, max) j[#key] = config_value(key);
  TAPELM_TRAIN_FIELDS(TAPELM_PUT)
#undef TAPELM_PUT
  return j;
}

void TrainConfig::validate() const {
  model.validate();
#define TAPELM_CHECK(type, key, def, check, max) \
  config_check(#key, key, Check::check, max);
  TAPELM_TRAIN_FIELDS(TAPELM_CHECK)
#undef TAPELM_CHECK
  if (optimizer != "adamw" && optimizer != "sgd")
    throw Error(ErrorKind::config, "config optimizer must be \"adamw\" or \"sgd\", got \"" + cut_for_message(optimizer) + "\"");
  if (moments != Moments::f32 && optimizer != "adamw")
    throw Error(ErrorKind::config, "config moments \"" + to_string(moments) + "\" is AdamW's; optimizer \"" +
                                       cut_for_message(optimizer) + "\" keeps float32 state");
  if (distill_lambda > 1)
    throw Error(ErrorKind::config, "config distill_lambda must be in [0, 1], got " + echo_json(distill_lambda));
  if (!(distill_temperature >= min_distill_temperature && distill_temperature <= max_distill_temperature))
    throw Error(ErrorKind::config, "config distill_temperature must be " + distill_temperature_range() + ", got " + echo_json(distill_temperature));
  // the attention-output term reads each block's attention output, which a recomputed block does
  // not keep: one or the other, said (the forward would otherwise store every activation unasked)
  if (recompute == Recompute::blocks && distill_attention > 0)
    throw Error(ErrorKind::config, "config recompute \"blocks\" with distill_attention " + echo_json(distill_attention) +
                                       ": the attention-output term needs every block's activations; set one of them off");
}

std::string distill_temperature_range() {
  char s[64];
  std::snprintf(s, sizeof s, "from %g to %g", min_distill_temperature, max_distill_temperature);
  return s;
}

bool is_trained(Trainable t, const std::string& name) {
  switch (t) {
    case Trainable::all: return true;
    case Trainable::attention: return name.find(".attn.") != std::string::npos;  // wq, wk, wv, wo (and q_norm, k_norm)
    case Trainable::kv: return name.find(".attn.wk.") != std::string::npos || name.find(".attn.wv.") != std::string::npos;
  }
  return true;
}

NamedParams trained_parameters(GPT& model, Trainable t) {
  NamedParams out;
  for (auto& [name, p] : model.named_parameters()) {
    p.set_requires_grad(is_trained(t, name));
    if (p.requires_grad()) out.emplace_back(name, p);
  }
  return out;
}

int64_t TrainConfig::trained_params() const {
  const ModelCost m = model_cost(model);
  return trainable == Trainable::all ? m.params : trainable == Trainable::attention ? m.attention_params : m.kv_params;
}

double TrainConfig::train_flops_per_token() const {
  const ModelCost m = model_cost(model);
  if (trainable == Trainable::all) return m.train_flops_per_token;
  // a frozen matrix's weight gradient (2 FLOPs per weight and token, as its forward) is not computed
  const double frozen = static_cast<double>(m.matmul_weights - trained_params());
  return m.train_flops_per_token - 2 * std::max(frozen, 0.0);
}

bool is_block_parameter(const std::string& name) { return block_index(name) >= 0; }

std::map<std::string, int> deal_out(const TrainConfig& cfg, int world) {
  const std::vector<std::pair<std::string, Shape>> shapes = parameter_shapes(cfg.model);
  std::vector<size_t> order;
  for (size_t i = 0; i < shapes.size(); i++)
    if (is_trained(cfg.trainable, shapes[i].first)) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return shape_numel(shapes[a].second) > shape_numel(shapes[b].second); });
  if (cfg.shard == Shard::parameters)
    for (size_t i = 0; i < shapes.size(); i++)
      if (is_block_parameter(shapes[i].first) && !is_trained(cfg.trainable, shapes[i].first)) order.push_back(i);
  std::vector<int64_t> load(static_cast<size_t>(std::max(world, 1)), 0);
  std::map<std::string, int> keeper;
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    keeper[shapes[i].first] = r;
    load[static_cast<size_t>(r)] += shape_numel(shapes[i].second);
  }
  return keeper;
}

BlockParams block_params(const GPTConfig& c) {
  BlockParams b;
  std::vector<double> per_layer(static_cast<size_t>(c.n_layer), 0.0);
  for (const auto& [name, shape] : parameter_shapes(c)) {
    const int64_t l = block_index(name);
    if (l < 0) continue;
    per_layer.at(static_cast<size_t>(l)) += static_cast<double>(shape_numel(shape));
  }
  for (double n : per_layer) {
    b.all += n;
    b.largest = std::max(b.largest, n);
  }
  return b;
}

bool is_frozen_block_parameter(const TrainConfig& c, const std::string& name) {
  return is_block_parameter(name) && !is_trained(c.trainable, name);
}

void check_frozen_weights(const TrainConfig& c, int world) {
  if (c.trainable != Trainable::all && c.shard == Shard::parameters && world > 1 &&
      (c.frozen_weights == FrozenWeights::bf16 || c.frozen_weights == FrozenWeights::f16))
    throw Error(ErrorKind::config, "config frozen_weights \"" + to_string(c.frozen_weights) +
                                       "\" is not combined with shard \"parameters\" (a rank keeps its share of the blocks in float32): use frozen_weights \"f32\" or \"auto\"");
}

NarrowedBlocks::HeldAs frozen_weights_held_as(const TrainConfig& c, int world) {
  const bool sharded = c.shard == Shard::parameters && world > 1;
  const FrozenWeights f = c.trainable == Trainable::all || sharded ? FrozenWeights::f32 : c.frozen_weights;
  const WeightType asked = f == FrozenWeights::bf16 ? WeightType::bf16 : f == FrozenWeights::f16 ? WeightType::f16 : WeightType::f32;
  const bool exact = f == FrozenWeights::automatic;
  return [c, asked, exact](const std::string& name, const Tensor& value) {
    if (!is_frozen_block_parameter(c, name)) return WeightType::f32;
    return exact ? exact_16bit_type(value) : asked;
  };
}

BlockParams frozen_block_params(const TrainConfig& c) {
  std::vector<double> frozen(static_cast<size_t>(c.model.n_layer), 0.0);
  for (const auto& [name, shape] : parameter_shapes(c.model))
    if (is_frozen_block_parameter(c, name)) frozen[static_cast<size_t>(block_index(name))] += static_cast<double>(shape_numel(shape));
  return {std::accumulate(frozen.begin(), frozen.end(), 0.0), *std::max_element(frozen.begin(), frozen.end())};
}

TrainingMemory training_memory(const TrainConfig& c, int world, double teacher_params, const HeldNarrowed* held) {
  const GPTConfig& m = c.model;
  const double params = static_cast<double>(model_cost(m).params), trained = static_cast<double>(c.trained_params());
  // float weights; gradients and AdamW's two moments of the trained ones (the moments a rank's
  // share when sharded); in bf16 also the buffer each weight is rounded into where a product uses
  // it, as large as the largest (2 bytes a value, 4 when emulated: the bf16 values held in float32)
  const double rounded = c.precision == Precision::bf16 ? 2 : c.precision == Precision::bf16_emulated ? 4 : 0;
  const double largest_matrix = std::max({static_cast<double>(m.vocab_size) * static_cast<double>(m.n_embd),
                                          static_cast<double>(m.mlp_hidden) * static_cast<double>(m.n_embd),
                                          static_cast<double>((m.n_head + 2 * m.n_kv_head) * m.head_dim() * m.n_embd)});
  const double shards = c.shard != Shard::none ? std::max(world, 1) : 1;
  const bool sharded_grads = shards_gradients(c.shard) && world > 1;
  TrainingMemory b;
  b.weights = 4 * params + rounded * largest_matrix;
  if (c.shard == Shard::parameters && world > 1) {
    // the block weights of the rank that keeps the most (deal_out balances every trained
    // parameter, the embedding too, so a rank without it keeps more than an even share) and one
    // block gathered whole (forward and backward gather one at a time); the embedding, the final
    // norm and the head stay whole on every rank
    const BlockParams bp = block_params(m);
    std::vector<double> kept(static_cast<size_t>(world), 0.0);
    const std::vector<std::pair<std::string, Shape>> shapes = parameter_shapes(m);
    const std::map<std::string, int> keepers = deal_out(c, world);
    for (const auto& [name, shape] : shapes)
      if (is_block_parameter(name)) kept[static_cast<size_t>(keepers.at(name))] += static_cast<double>(shape_numel(shape));
    b.weights = 4 * (params - bp.all + *std::max_element(kept.begin(), kept.end()) + bp.largest) + rounded * largest_matrix;
  }
  HeldNarrowed narrowed;
  if (held) {
    narrowed = *held;
  } else if (const bool narrow = c.frozen_weights == FrozenWeights::bf16 || c.frozen_weights == FrozenWeights::f16;
             narrow && c.trainable != Trainable::all && !(c.shard == Shard::parameters && world > 1)) {
    // `auto` counts float32: what it holds is known once the weights are (held, and the trainer prints it)
    const BlockParams frozen = frozen_block_params(c);
    narrowed = {frozen.all, frozen.largest, false};
  }
  if (narrowed.values > 0) {
    // the frozen block weights in 16 bits, and one block's of them widened to float32 while it runs
    if (!narrowed.since_start) b.start = b.weights;  // the model is built (or read, or taken over) in float32, then narrowed
    b.weights -= 2 * narrowed.values - 4 * narrowed.largest_block;
  }
  // Sharded gradients: a rank keeps its share; every rank fills each gradient until it is reduced
  // to its keeper, which for the (tied) embedding is all of backward, from the head's use to the
  // input's; with only attention trained, one layer's q|k|v projection at a time.
  const double in_flight = c.trainable == Trainable::all
                               ? static_cast<double>(m.vocab_size) * static_cast<double>(m.n_embd)
                               : static_cast<double>((m.n_head + 2 * m.n_kv_head) * m.head_dim() * m.n_embd);
  b.gradients = sharded_grads ? 4 * (trained / shards + in_flight) : 4 * trained;
  b.optimizer = (c.moments == Moments::bf16 ? 4 : 8) * trained / shards;
  if (b.start > 0) b.start += b.optimizer;  // a resumed run has read its state before the weights are narrowed
  // Per token and layer, what the tape keeps for backward: 16·d (the norms' outputs, q, k and v
  // and their rotated and head-major copies, the attention and projection outputs, the residual
  // sums), the MLP's hidden layer before and after its activation (four of them gated: gate, up,
  // silu(gate), their product), one row of attention scores; then the logits with their softmax.
  // The 16 is measured (bench/SHARD_MEMORY.md: 2.8 MB a token on GPT-2-medium's shape, where
  // 4·d counted 0.75 of it).
  // recompute blocks: one block's activations (the block recomputed in backward) and one hidden
  // state per block
  const bool recompute = c.recompute == Recompute::blocks;
  const double T = static_cast<double>(m.block_size), d = static_cast<double>(m.n_embd), L = static_cast<double>(m.n_layer);
  const double kept = recompute ? 1 : L;
  const double hidden = (m.gated() ? 4 : 2) * static_cast<double>(m.mlp_hidden);
  const double per_token = kept * (16 * d + hidden + static_cast<double>(m.n_head) * T) + (recompute ? L * d : 0) +
                           2 * static_cast<double>(m.vocab_size);
  // bf16: every linear layer also keeps its rounded input for the backward (q|k|v, wo, the MLP's
  // two and the head's: L·(3d + mlp_hidden) + d values per token), at the rounded copy's bytes
  const double rounded_inputs = rounded * (kept * (3 * d + static_cast<double>(m.mlp_hidden)) + d);
  b.activations = (4 * per_token + rounded_inputs) * static_cast<double>(c.batch_size) * T;
  b.windows = 2 * 8 * static_cast<double>(c.eval_iters) * static_cast<double>(c.batch_size);
  b.evaluation = 2 * 4 * static_cast<double>(split_eval_batch(m)) * T * static_cast<double>(m.vocab_size);
  // OpenMPI's in-place MPI_Allreduce of B bytes allocates B/2 more in every rank (bench/allreduce_memory.c:
  // 200 MB for 400 MB at N = 2, 3 and 4; 20 MB for 40 MB), beside the flat buffer itself
  b.reduce = world > 1 && !sharded_grads ? 1.5 * 4 * trained : 0;
  b.teacher = 4 * teacher_params;
  return b;
}

std::string TrainingMemory::str() const {
  return byte_size_str(total()) + ": weights " + byte_size_str(weights) + ", gradients " + byte_size_str(gradients) + ", optimizer state " +
         byte_size_str(optimizer) + (reduce > 0 ? ", all-reduce buffers " + byte_size_str(reduce) : "") + ", activations " +
         byte_size_str(activations) + ", final evaluation " + byte_size_str(evaluation) +
         (teacher > 0 ? ", distillation teacher " + byte_size_str(teacher) : "") +
         (start > 0 ? "; as it starts, every weight in float32 (and a resumed state) " + byte_size_str(start) : "");
}

double training_state_bytes(const TrainConfig& c, int world) {
  const TrainingMemory b = training_memory(c, world);
  return b.weights + b.gradients + b.optimizer;
}

void check_training_memory(const TrainConfig& c, double available, int world, const HeldNarrowed* held) {
  const GPTConfig& m = c.model;
  const double params = static_cast<double>(model_cost(m).params);
  const bool rounded = c.precision != Precision::f32;  // a bf16 copy of the weights and of the linear layers' inputs
  const TrainingMemory b = training_memory(c, world, 0, held);
  char n[32];
  std::snprintf(n, sizeof n, "%.3g", params);
  check_memory(b.weights + b.gradients + b.optimizer, available, "the model's " + std::string(n) + " parameters (n_layer " + std::to_string(m.n_layer) +
                                       ", n_embd " + std::to_string(m.n_embd) + ") with gradients and optimizer state" +
                                       (c.trainable == Trainable::all ? "" : " of the " + to_string(c.trainable) + " ones trained") +
                                       (c.shard != Shard::none && world > 1 ? " (a rank's share of " + std::to_string(world) + ")" : "") +
                                       (rounded ? " and the " + to_string(c.precision) + " copy of the largest weight" : ""));
  check_memory(b.activations, available, "config batch_size " + std::to_string(c.batch_size) + " at block_size " +
                                           std::to_string(m.block_size) + ": one step's activations" +
                                           (rounded ? " with the " + to_string(c.precision) + " copies of the linear layers' inputs" : ""));
  check_memory(b.windows, available, "config eval_iters " + std::to_string(c.eval_iters) + " at batch_size " +
                                       std::to_string(c.batch_size) + ": the evaluation windows");
  if (b.start > 0)
    check_memory(b.start, available, "the model's " + std::string(n) + " parameters in float32 as the run starts (frozen_weights " +
                                         to_string(c.frozen_weights) + " holds the frozen ones in 16 bits once it has started)");
  check_memory(b.total(), available, "training this config");
}

LrSchedule TrainConfig::schedule() const {
  LrSchedule s;
  s.lr = learning_rate;
  s.min_lr = min_lr;
  s.warmup_iters = warmup_iters;
  s.lr_decay_iters = lr_decay_iters;
  s.decay = decay_lr;
  return s;
}

std::string TrainConfig::optimizer_hparams_json() const {
  // Only the keys of the chosen optimizer: make_optimizer rejects the others' (SGD's dampening
  // is not a config key and stays at its default 0). JSON doubles round-trip exactly.
  nlohmann::json j{{"lr", learning_rate}, {"weight_decay", weight_decay}};
  if (optimizer == "sgd") {
    j["momentum"] = momentum;
    j["nesterov"] = nesterov;
  } else {
    j["beta1"] = beta1;
    j["beta2"] = beta2;
    j["eps"] = eps;
    if (moments != Moments::f32) j["moments"] = to_string(moments);
  }
  return j.dump();
}

std::unique_ptr<Optimizer> TrainConfig::make_optimizer(const NamedParams& params) const {
  return tapelm::make_optimizer(optimizer, params, optimizer_hparams_json());
}


TrainConfig config_for_weights_only(const GPTConfig& model, nlohmann::json config, const std::string& config_path,
                                    const std::string& model_path) {
  const nlohmann::json model_keys = model.to_json();  // items() does not keep a temporary alive
  for (const auto& [k, v] : model_keys.items()) {
    if (config.contains(k) && k != "dropout" && config[k] != v)
      throw Error(ErrorKind::config, config_path + ": " + k + " " + echo_json(config[k]) + " differs from " + model_path +
                                         "'s " + echo_json(v));
    if (!config.contains(k)) config[k] = v;
  }
  return TrainConfig::from_json(config);
}

void save_training_checkpoint(const std::string& path, const GPT& model, const Optimizer& opt, const TrainConfig& cfg,
                              const TrainState& st, const Tokenizer& tok, const OptimStateSource* elsewhere) {
  write_training_checkpoint(path, model, opt, cfg.to_json(), st, tok, elsewhere);
}

TrainConfig read_train_config(const H5File& f) {
  const nlohmann::json j = read_train_config_json(f);
  try {
    return TrainConfig::from_json(j);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::checkpoint, f.path() + ": bad training config: " + e.what());
  }
}

TrainConfig source_train_config(const std::string& checkpoint, const std::string& config_path, const std::string& user) {
  if (!formats::starts_with_hdf5(checkpoint)) {  // another program's model (an HF directory, a GGUF file): weights only
    const formats::OpenedModel m = formats::open_model(checkpoint);
    if (config_path.empty())
      throw Error(ErrorKind::usage, checkpoint + ": " + m.what + " holds weights only, without a training config: give one with --config F.json");
    return config_for_weights_only(m.config, read_config_file(config_path), config_path, checkpoint);
  }
  const H5File f = H5File::open_read(checkpoint);
  const GPTConfig model = read_model_config(f);
  if (has_train_config(f)) {
    if (!config_path.empty())
      throw Error(ErrorKind::usage, "--config: " + checkpoint + " holds its own training config, which " + user + " uses");
    return read_train_config(f);
  }
  if (config_path.empty())
    throw Error(ErrorKind::usage, checkpoint + ": weights only, without a training config (an imported model): give one with --config F.json");
  return config_for_weights_only(model, read_config_file(config_path), config_path, checkpoint);
}

TrainConfig with_train_overrides(const TrainConfig& c, const std::vector<std::string>& sets, const std::string& what) {
  nlohmann::json j = c.to_json();
  for (const std::string& s : sets)
    if (const std::string k = s.substr(0, s.find('=')); GPTConfig::is_key(k) && k != "dropout")  // dropout: a training choice
      throw Error(ErrorKind::config, what + ": '" + cut_for_message(k) + "' is a key of the model, which is the source's");
  TrainConfig::apply_overrides(j, sets);
  return TrainConfig::from_json(j);
}

TrainConfig build_train_config(const std::string& config_path, bool resume, const std::string& run_dir,
                               const std::vector<std::string>& sets, int64_t tokenizer_vocab, int threads) {
  nlohmann::json j = nlohmann::json::object();
  if (!config_path.empty()) j = read_config_file(config_path);
  else if (resume) j = read_train_config(H5File::open_read((std::filesystem::path(run_dir) / "checkpoint.h5").string())).to_json();
  else throw Error(ErrorKind::config, "train needs --config FILE.json (or --resume with a run directory)");
  TrainConfig::apply_overrides(j, sets);
  if (!j.contains("vocab_size")) j["vocab_size"] = tokenizer_vocab;
  if (threads > 0) j["threads"] = threads;
  return TrainConfig::from_json(j);
}

}  // namespace tapelm
