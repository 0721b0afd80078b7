#include "train/formats/checkpoint.h"

#include <cmath>
#include <map>
#include <set>

#include "autograd/float16.h"
#include "autograd/json_read.h"
#include "nn/accounting.h"
#include "train/formats/layout.h"
#include "train/formats/model_sink.h"
#include "data/tokenizer/char.h"

namespace tapelm {

namespace {

// Every group and attribute of the format (docs/formats.md §2) is named here and nowhere else.
const std::string kRoot = "/";
const std::string kModel = "/model";
const std::string kOptim = "/optim";
const std::string kTrain = "/train";
const std::string kTokenizer = "/tokenizer";
const std::string kGrad = "/grad";
const std::string kImported = "/imported";
const std::string kSamplerState = "sampler_state";

std::string rank_group(int r) { return kTrain + "/rank_" + std::to_string(r); }

void write_bytes(H5File& f, const std::string& obj, const std::string& s) {
  f.write_bytes(obj, std::vector<uint8_t>(s.begin(), s.end()));
}

// /tokenizer: attr kind ("char", "sentencepiece", "byte_bpe" or "fallback_bpe"); char keeps its
// JSON in attr json (as files before the kind attribute did), the others their serialized bytes in
// the dataset /tokenizer/model (sentencepiece's model proto; BPE's JSON with its tokenizer.json).
void write_tokenizer(H5File& f, const Tokenizer& tok) {
  f.create_group(kTokenizer);
  f.write_attr(kTokenizer, "kind", tok.kind_name());
  if (tok.as<CharTokenizer>()) f.write_attr(kTokenizer, "json", tok.serialized());
  else write_bytes(f, kTokenizer + "/model", tok.serialized());
}

std::string read_bytes(const H5File& f, const std::string& obj) {
  std::vector<uint8_t> b = f.read_bytes(obj);
  return std::string(b.begin(), b.end());
}

uint64_t read_u64_attr(const H5File& f, const std::string& obj, const std::string& name) {
  try {
    return std::stoull(f.read_attr_string(obj, name));
  } catch (const std::exception&) {
    throw Error(ErrorKind::checkpoint, f.path() + ": bad " + obj + " " + name + " attribute");
  }
}

// The saved hyper-parameters against the run's, key by key ("lr 0.001 -> 0.0003, ...").
std::string hparam_changes(const std::string& path, const std::string& type, const std::string& saved_json,
                           const Optimizer& opt) {
  nlohmann::json saved;
  try {
    // Parsed by the one construction path, so a file the optimizer would not accept is an error.
    make_optimizer(type, {}, saved_json);
    saved = parse_json(saved_json, "optimizer hyperparameters", ErrorKind::checkpoint);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::checkpoint, path + ": bad " + kOptim + " hparams: " + e.what());
  }
  const nlohmann::json now = nlohmann::json::parse(opt.hparams_json());
  std::set<std::string> keys;
  for (const auto& [k, v] : saved.items()) keys.insert(k);
  for (const auto& [k, v] : now.items()) keys.insert(k);
  std::string out;
  for (const std::string& k : keys) {
    const nlohmann::json a = saved.value(k, nlohmann::json()), b = now.value(k, nlohmann::json());
    if (a != b) out += (out.empty() ? "" : ", ") + k + " " + a.dump() + " -> " + b.dump();
  }
  return out;
}

using formats::non_finite;

// A tensor read from obj must be finite: a NaN or Inf weight would load and evaluate to a
// plausible or a meaningless loss, so it is refused like a corrupted file.
Tensor read_finite(const H5File& f, const std::string& obj) {
  Tensor t = f.read_tensor(obj);
  const std::string bad = non_finite(t);
  if (!bad.empty()) throw Error(ErrorKind::checkpoint, f.path() + ": " + obj + " holds " + bad + " (non-finite weights)");
  return t;
}

// "" when every parameter (and optimizer state tensor) is finite, else the first that is not.
// non_finite of a state tensor; a bf16 one read in place (no float32 copy of it at every save).
std::string non_finite_state(const StateBuf& t) {
  if (!t.is_bf16()) return non_finite(t.f32());
  const uint16_t* b = t.bf16_data();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; i++)
    if ((b[i] & 0x7F80u) == 0x7F80u) return formats::non_finite_at(bf16_to_f32(b[i]), i);  // exponent all ones
  return "";
}

std::string first_non_finite(const GPT& model, const Optimizer* opt) {
  for (const auto& [name, p] : model.named_parameters()) {
    const std::string bad = non_finite(p.val());
    if (!bad.empty()) return "parameter " + name + " holds " + bad;
  }
  if (opt)
    for (const std::string& key : opt->state_keys())
      for (const auto& [name, t] : opt->state(key)) {
        const std::string bad = non_finite_state(t);
        if (!bad.empty()) return "optimizer state " + key + "/" + name + " holds " + bad;
      }
  return "";
}

}  // namespace

// ---- weights --------------------------------------------------------------------------------

GPTConfig read_model_config(const H5File& f) {
  const std::string& p = f.path();
  if (!f.has_attr(kRoot, "format") || f.read_attr_string(kRoot, "format") != "tapelm")
    throw Error(ErrorKind::checkpoint, p + ": not a tapelm checkpoint (root attribute format is not \"tapelm\")");
  if (!f.has_attr(kRoot, "format_version"))
    throw Error(ErrorKind::checkpoint, p + ": missing root attribute format_version");
  const int64_t v = f.read_attr_int(kRoot, "format_version");
  if (v != kFormatVersion)
    throw Error(ErrorKind::checkpoint, p + ": format_version " + std::to_string(v) + " is not supported (expected " +
                          std::to_string(kFormatVersion) + ")");
  if (!f.has_attr(kRoot, "config")) throw Error(ErrorKind::checkpoint, p + ": missing root attribute config");
  try {
    return GPTConfig::from_json_string(f.read_attr_string(kRoot, "config"));
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::config) throw;
    throw Error(ErrorKind::checkpoint, p + ": bad model config: " + e.what());
  }
}

void check_savable(const std::string& path, const GPT& model, const Optimizer* opt, const std::string& when) {
  const std::string bad = first_non_finite(model, opt);
  if (!bad.empty())
    throw Error(ErrorKind::checkpoint, (when.empty() ? "" : when + ": ") + bad + "; not writing " + path +
                                           " (any checkpoint already there is kept)");
}

namespace {
void write_root(H5File& f, const GPTConfig& c) {
  f.write_attr(kRoot, "format", std::string("tapelm"));
  f.write_attr(kRoot, "format_version", kFormatVersion);
  f.write_attr(kRoot, "config", c.to_json().dump());
}
}  // namespace

void write_model(H5File& f, const GPT& model, const std::string& group,
                 const std::function<Tensor(const Var& p, const Shape& shape)>& weight) {
  write_root(f, model.config());
  f.create_group(group);
  const auto params = model.named_parameters();
  const auto shapes = weight ? parameter_shapes(model.config()) : std::vector<std::pair<std::string, Shape>>{};
  for (size_t i = 0; i < params.size(); i++) {
    // a weight another rank keeps was checked finite there before the save began (Trainer::save)
    const Tensor t = weight ? weight(params[i].second, shapes.at(i).second) : params[i].second.val();
    f.write_tensor(group + "/" + params[i].first, t);
  }
}

CheckpointSource::CheckpointSource(const H5File& f, const std::string& group) : f_(f), group_(group) {
  if (!f.exists(group)) throw Error(ErrorKind::checkpoint, f.path() + ": missing group " + group);
  for (const std::string& n : f.list_datasets_recursive(group)) {
    at_[n] = infos_.size();
    infos_.push_back({n, f.dataset_shape(group + "/" + n), f.tensor_encoding(group + "/" + n)});
  }
}

std::string CheckpointSource::what() const { return f_.path(); }

const formats::TensorSource::Info* CheckpointSource::find(const std::string& name) const {
  auto it = at_.find(name);
  return it == at_.end() ? nullptr : &infos_[it->second];
}

void CheckpointSource::read_f32(const Info& t, float* out) const {
  const std::string obj = group_ + "/" + t.name;
  const int64_t n = shape_numel(t.shape);
  f_.read_tensor_into(obj, out, n);  // into its place: no buffer of its own kept by the tensor cache
  if (const int64_t at = formats::first_non_finite(out, n); at >= 0)
    throw Error(ErrorKind::checkpoint, f_.path() + ": " + obj + " holds " + (std::isnan(out[at]) ? "NaN" : out[at] > 0 ? "Inf" : "-Inf") + " at index " +
                                           std::to_string(at) + " (non-finite weights)");
}

void read_model_weights(const H5File& f, GPT& model, const std::string& group,
                        const std::function<bool(const std::string& name)>& only) {
  const CheckpointSource src(f, group);
  // Read everything first, so a failing read leaves the model untouched.
  formats::TensorMap loaded;
  std::vector<formats::FileTensor> layout = formats::parameter_layout(model.config());
  formats::LoadRules rules{"the model", ErrorKind::checkpoint, {}};
  if (only) {
    std::erase_if(layout, [&](const formats::FileTensor& t) { return !only(t.name); });
    rules.ignorable = [&](const formats::TensorSource::Info& t) { return !only(t.name); };
  }
  formats::load(layout, src, rules, loaded);
  for (auto& [name, p] : model.named_parameters())
    if (!only || only(name)) p.val() = loaded.at(name);
}

LoadedModel load_model(const std::string& path, double bytes_per_param, const NarrowedBlocks::HeldAs& held_as) {
  H5File f = H5File::open_read(path);
  const GPTConfig cfg = read_model_config(f);
  const int64_t params = model_cost(cfg).params;
  check_memory(bytes_per_param * static_cast<double>(params), available_memory_bytes(),
               path + ": the model's " + std::to_string(params) + " parameters");
  // nothing drawn: every weight is read, and an init beside the read weights would be a second
  // float32 copy of the model in memory while they arrive
  LoadedModel l{.model = std::make_unique<GPT>(cfg, 1337, [](const std::string&) { return false; })};
  if (!held_as) {
    read_model_weights(f, *l.model);
  } else {  // what is outside the blocks, then each block, narrowed before the next is read
    // a block of the model's (a "blocks.N." of another N is outside every block: named as extra)
    const int64_t layers = static_cast<int64_t>(l.model->blocks.size());
    read_model_weights(f, *l.model, kModel, [layers](const std::string& name) {
      const int64_t b = block_index(name);
      return b < 0 || b >= layers;
    });
    auto narrowed = std::make_shared<NarrowedBlocks>(l.model->blocks.size());
    for (int64_t b = 0; b < layers; b++) {
      read_model_weights(f, *l.model, kModel, [b](const std::string& name) { return block_index(name) == b; });
      narrowed->narrow(*l.model, static_cast<size_t>(b), held_as);
    }
    if (narrowed->values() > 0) l.model->residency = narrowed;
  }
  if (has_tokenizer(f)) l.tok = read_tokenizer(f);
  return l;
}

void save_model(const std::string& path, const GPT& model) {
  check_savable(path, model, nullptr, "");
  write_h5_atomic(path, [&](H5File& f) { write_model(f, model); });
}

// ---- full training checkpoints ----------------------------------------------------------------

namespace {
// A state tensor as the optimizer keeps it: bf16 moments as bf16 (no float32 copy, half the
// bytes; read_tensor widens them back exactly), the others in float32.
void write_state(H5File& f, const std::string& obj, const StateBuf& t) {
  if (t.is_bf16())
    f.write_bf16_bits(obj, t.bf16_data(), t.shape());
  else
    f.write_tensor(obj, t.f32());
}
}  // namespace

void write_training_checkpoint(const std::string& path, const GPT& model, const Optimizer& opt, const nlohmann::json& train_config,
                               const TrainState& st, const Tokenizer& tok, const OptimStateSource* elsewhere) {
  check_savable(path, model, &opt, "step " + std::to_string(st.step));
  write_h5_atomic(path, [&](H5File& f) {
    write_model(f, model, kModel, elsewhere ? elsewhere->weight : nullptr);
    f.create_group(kOptim);
    f.write_attr(kOptim, "type", opt.type());
    f.write_attr(kOptim, "step", opt.steps());
    f.write_attr(kOptim, "hparams", opt.hparams_json());
    for (const std::string& key : opt.state_keys()) {
      f.create_group(kOptim + "/" + key);
      if (elsewhere && elsewhere->fetch) {
        for (size_t i = 0; i < elsewhere->names.size(); i++) {
          const StateBuf t = elsewhere->fetch(key, i);
          if (!t.defined()) continue;
          if (!non_finite_state(t).empty())
            throw Error(ErrorKind::checkpoint, path + ": step " + std::to_string(st.step) + ": optimizer state " + key + "/" +
                                                   elsewhere->names[i] + " is not finite; not saved");
          write_state(f, kOptim + "/" + key + "/" + elsewhere->names[i], t);
        }
        continue;
      }
      for (const auto& [name, t] : opt.state(key)) write_state(f, kOptim + "/" + key + "/" + name, t);
    }
    f.create_group(kTrain);
    f.write_attr(kTrain, "step", st.step);
    f.write_attr(kTrain, "tokens_seen", st.tokens_seen);
    f.write_attr(kTrain, "config", train_config.dump());
    f.write_attr(kTrain, "dropout_rng", std::to_string(st.dropout_rng));
    f.write_attr(kTrain, "extra", st.extra_json);
    write_bytes(f, kTrain + "/" + kSamplerState, st.sampler_state);
    if (st.world_size > 1) {  // written only by multi-rank runs, so one-process files are as before
      f.write_attr(kTrain, "world_size", static_cast<int64_t>(st.world_size));
      for (int r = 1; r < st.world_size; r++) {
        const std::string g = rank_group(r);
        f.create_group(g);
        f.write_attr(g, "dropout_rng", std::to_string(st.rank_dropout_rngs.at(r - 1)));
        write_bytes(f, g + "/" + kSamplerState, st.rank_sampler_states.at(r - 1));
      }
    }
    write_tokenizer(f, tok);
  });
}

void load_training_checkpoint(const H5File& f, GPT& model, Optimizer& opt, TrainState& st,
                              const std::function<bool(const std::string& name)>& keep,
                              const std::function<bool(const std::string& name)>& keep_weight) {
  const std::string& p = f.path();
  if (!f.exists(kOptim) || !f.exists(kTrain))
    throw Error(ErrorKind::checkpoint, p + ": not a full training checkpoint (no " + kOptim + " or " + kTrain + ")");
  const std::string type = f.read_attr_string(kOptim, "type");
  if (type != opt.type())
    throw Error(ErrorKind::checkpoint, p + ": optimizer state is " + type + " but the run uses " + opt.type());
  TrainState s;
  // As after torch's optimizer.load_state_dict followed by setting the run's hyper-parameters
  // (what nanoGPT does with lr each step): the checkpoint supplies the state, the run its
  // hyper-parameters, so `--resume --set learning_rate=...` changes them on purpose. The saved
  // ones are checked and the differences reported, so a change is never silent.
  if (f.has_attr(kOptim, "hparams"))
    s.optim_hparams_changed = hparam_changes(p, type, f.read_attr_string(kOptim, "hparams"), opt);
  s.step = f.read_attr_int(kTrain, "step");
  s.tokens_seen = f.read_attr_int(kTrain, "tokens_seen");
  s.dropout_rng = read_u64_attr(f, kTrain, "dropout_rng");
  if (f.has_attr(kTrain, "extra")) s.extra_json = f.read_attr_string(kTrain, "extra");
  s.sampler_state = read_bytes(f, kTrain + "/" + kSamplerState);
  if (f.has_attr(kTrain, "world_size")) {
    const int64_t n = f.read_attr_int(kTrain, "world_size");
    if (n < 1 || n > 1000000) throw Error(ErrorKind::checkpoint, p + ": bad " + kTrain + " world_size " + std::to_string(n));
    s.world_size = static_cast<int>(n);
    for (int r = 1; r < s.world_size; r++) {
      const std::string g = rank_group(r);
      if (!f.exists(g)) throw Error(ErrorKind::checkpoint, p + ": world_size is " + std::to_string(n) + " but " + g + " is missing");
      s.rank_dropout_rngs.push_back(read_u64_attr(f, g, "dropout_rng"));
      s.rank_sampler_states.push_back(read_bytes(f, g + "/" + kSamplerState));
    }
  }
  // Read every optimizer tensor before touching anything, so a bad file changes nothing.
  std::map<std::string, std::map<std::string, StateBuf>> states;  // as the optimizer keeps them
  std::map<std::string, Shape> shapes;
  for (const auto& [name, v] : model.named_parameters()) shapes[name] = v.shape();
  for (const std::string& key : opt.state_keys()) {
    const std::string g = kOptim + "/" + key;
    if (!f.exists(g)) continue;
    for (const std::string& name : f.list_datasets_recursive(g)) {
      auto it = shapes.find(name);
      if (it == shapes.end()) throw Error(ErrorKind::checkpoint, p + ": optimizer state " + g + "/" + name + " names no parameter");
      if (keep && !keep(name)) continue;  // another rank's share
      Tensor t = read_finite(f, g + "/" + name);
      if (t.shape() != it->second)
        throw Error(ErrorKind::checkpoint, p + ": optimizer state " + g + "/" + name + " is " + shape_str(t.shape()) +
                              ", parameter is " + shape_str(it->second));
      states[key][name] = opt.adopt_state(t);
    }
  }
  const int64_t opt_step = f.read_attr_int(kOptim, "step");
  read_model_weights(f, model, kModel, keep_weight);
  for (auto& [key, m] : states)
    for (auto& [name, t] : m) opt.state(key)[name] = t;
  opt.set_steps(opt_step);
  model.dropout_rng().set_state(s.dropout_rng);
  st = s;
}

bool has_train_config(const H5File& f) { return f.exists(kTrain) && f.has_attr(kTrain, "config"); }

nlohmann::json read_train_config_json(const H5File& f) {
  if (!has_train_config(f))
    throw Error(ErrorKind::checkpoint, f.path() + ": no training state (" + kTrain + ") in this checkpoint");
  try {
    // the config reader's limits (depth, duplicate keys), as for a config file
    return parse_config_json(f.read_attr_string(kTrain, "config"), f.path() + " " + kTrain + " config");
  } catch (const std::exception& e) {
    throw Error(ErrorKind::checkpoint, f.path() + ": bad training config: " + e.what());
  }
}

bool has_tokenizer(const H5File& f) { return f.exists(kTokenizer); }

Tokenizer read_tokenizer(const H5File& f) {
  if (!f.exists(kTokenizer))
    throw Error(ErrorKind::checkpoint, f.path() + ": no tokenizer (" + kTokenizer + ") in this checkpoint");
  // Files from before the kind attribute hold a char tokenizer's JSON.
  const std::string kind = f.has_attr(kTokenizer, "kind") ? f.read_attr_string(kTokenizer, "kind") : "char";
  try {
    // the serialized form: a char tokenizer's JSON in an attribute (as files before the kind
    // attribute held it), any other kind's bytes in a dataset; the tokenizer registry
    // (Tokenizer::deserialize) knows the kinds and names an unknown one
    if (f.exists(kTokenizer + "/model")) return Tokenizer::deserialize(kind, read_bytes(f, kTokenizer + "/model"));
    if (f.has_attr(kTokenizer, "json")) return Tokenizer::deserialize(kind, f.read_attr_string(kTokenizer, "json"));
    throw Error(ErrorKind::checkpoint, "neither a dataset " + kTokenizer + "/model nor a json attribute in " + kTokenizer);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::checkpoint, f.path() + ": bad tokenizer: " + e.what());
  }
}

CheckpointInfo inspect_checkpoint(const std::string& path) {
  H5File f = H5File::open_read(path);
  CheckpointInfo info;
  info.config = read_model_config(f);
  if (f.exists(kTrain)) {
    info.has_train = true;
    info.step = f.read_attr_int(kTrain, "step");
    info.tokens_seen = f.read_attr_int(kTrain, "tokens_seen");
  }
  info.has_tokenizer = has_tokenizer(f);
  return info;
}

// ---- files derived from a checkpoint ------------------------------------------------------------

void write_converted(const std::string& path, const GPT& model, const Tokenizer* tok,
                     const std::string& converted_from_json) {
  check_savable(path, model, nullptr, "");
  write_h5_atomic(path, [&](H5File& f) {
    write_model(f, model);
    f.write_attr(kRoot, "converted_from", converted_from_json);
    if (tok) write_tokenizer(f, *tok);
  });
}

ModelWriter::ModelWriter(H5File& f, const std::string& path, const GPTConfig& c, WeightType dtype)
    : f_(f), path_(path), dtype_(dtype) {
  if (dtype == WeightType::q8_0) throw Error(ErrorKind::usage, "--dtype q8_0: only --format gguf holds q8_0 weights");
  for (const auto& [name, shape] : parameter_shapes(c)) pending_[name] = shape;
}

void ModelWriter::tensor(const std::string& name, const Tensor& t) {
  auto it = pending_.find(name);
  if (it == pending_.end() || it->second != t.shape())
    throw Error(ErrorKind::internal, path_ + ": parameter " + name + " " + shape_str(t.shape()) + " is not one the config has yet to write");
  if (const std::string bad = non_finite(t); !bad.empty())
    throw Error(ErrorKind::checkpoint, name + " holds " + bad + "; not writing " + path_ + " (any checkpoint already there is kept)");
  if (dtype_ == WeightType::f32) f_.write_tensor(kModel + "/" + name, t);
  else f_.write_tensor_16(kModel + "/" + name, t, to_string(dtype_));
  pending_.erase(it);
}

void ModelWriter::check_complete() const {
  if (!pending_.empty()) throw Error(ErrorKind::internal, path_ + ": parameter " + pending_.begin()->first + " was never written");
}

void write_streamed(const std::string& path, const GPTConfig& c, const Tokenizer* tok, const std::pair<std::string, std::string>& note,
                    WeightType dtype, const formats::SinkFill& fill, const std::vector<std::pair<std::string, Tensor>>& extras) {
  write_h5_atomic(path, [&](H5File& f) {
    write_root(f, c);
    f.write_attr(kRoot, note.first, note.second);
    if (tok) write_tokenizer(f, *tok);
    f.create_group(kModel);
    ModelWriter w(f, path, c, dtype);
    fill(w);
    w.check_complete();
    if (extras.empty()) return;
    f.create_group(kImported);
    for (const auto& [name, t] : extras) f.write_tensor(kImported + "/" + name, t);
  });
}

void write_imported(const std::string& path, const GPT& model, const Tokenizer* tok, const std::string& imported_from_json,
                    const std::vector<std::pair<std::string, Tensor>>& extras) {
  check_savable(path, model, nullptr, "");
  for (const auto& [name, t] : extras)
    if (const std::string bad = non_finite(t); !bad.empty())
      throw Error(ErrorKind::checkpoint, kImported + "/" + name + " holds " + bad + "; not writing " + path);
  write_h5_atomic(path, [&](H5File& f) {
    write_model(f, model);
    f.write_attr(kRoot, "imported_from", imported_from_json);
    if (tok) write_tokenizer(f, *tok);
    if (extras.empty()) return;
    f.create_group(kImported);
    for (const auto& [name, t] : extras) f.write_tensor(kImported + "/" + name, t);
  });
}

std::map<std::string, Tensor> read_imported(const H5File& f) {
  std::map<std::string, Tensor> out;
  if (!f.exists(kImported)) return out;
  for (const std::string& name : f.list_datasets_recursive(kImported)) out.emplace(name, read_finite(f, kImported + "/" + name));
  return out;
}

void write_gradients(const std::string& path, const GPT& model, double loss) {
  write_h5_atomic(path, [&](H5File& f) {
    f.write_attr(kRoot, "loss", loss);
    f.create_group(kGrad);
    for (const auto& [name, p] : model.named_parameters())
      f.write_tensor(kGrad + "/" + name, p.has_grad() ? p.grad() : Tensor::zeros(p.shape()));
  });
}

}  // namespace tapelm
