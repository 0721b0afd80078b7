#include "train/state.h"

#include <cstring>

namespace tapelm {

void save_training_checkpoint(const std::string& path, const GPT& model, const Optimizer& opt,
                              const TrainConfig& cfg, const TrainState& st, const CharTokenizer& tok) {
  write_h5_atomic(path, [&](H5File& f) {
    write_model(f, model);
    f.create_group("/optim");
    f.write_attr("/optim", "type", opt.type());
    f.write_attr("/optim", "step", opt.steps());
    f.write_attr("/optim", "hparams", opt.hparams_json());
    for (const std::string& key : opt.state_keys()) {
      f.create_group("/optim/" + key);
      for (const auto& [name, t] : opt.state(key)) f.write_tensor("/optim/" + key + "/" + name, t);
    }
    f.create_group("/train");
    f.write_attr("/train", "step", st.step);
    f.write_attr("/train", "tokens_seen", st.tokens_seen);
    f.write_attr("/train", "config", cfg.to_json().dump());
    f.write_attr("/train", "dropout_rng", std::to_string(st.dropout_rng));
    f.write_attr("/train", "extra", st.extra_json);
    f.write_bytes("/train/sampler_state", std::vector<uint8_t>(st.sampler_state.begin(), st.sampler_state.end()));
    if (st.world_size > 1) {  // written only by multi-rank runs, so one-process files are as before
      f.write_attr("/train", "world_size", static_cast<int64_t>(st.world_size));
      for (int r = 1; r < st.world_size; r++) {
        const std::string g = "/train/rank_" + std::to_string(r);
        f.create_group(g);
        f.write_attr(g, "dropout_rng", std::to_string(st.rank_dropout_rngs.at(r - 1)));
        const std::string& ss = st.rank_sampler_states.at(r - 1);
        f.write_bytes(g + "/sampler_state", std::vector<uint8_t>(ss.begin(), ss.end()));
      }
    }
    f.create_group("/tokenizer");
    f.write_attr("/tokenizer", "json", tok.to_json());
  });
}

TrainConfig read_train_config(const H5File& f) {
  if (!f.exists("/train") || !f.has_attr("/train", "config"))
    throw CheckpointError(f.path() + ": no training state (/train) in this checkpoint");
  try {
    return TrainConfig::from_json(nlohmann::json::parse(f.read_attr_string("/train", "config")));
  } catch (const std::exception& e) {
    throw CheckpointError(f.path() + ": bad training config: " + e.what());
  }
}

CharTokenizer read_tokenizer(const H5File& f) {
  if (!f.exists("/tokenizer") || !f.has_attr("/tokenizer", "json"))
    throw CheckpointError(f.path() + ": no tokenizer (/tokenizer) in this checkpoint");
  try {
    return CharTokenizer::from_json(f.read_attr_string("/tokenizer", "json"));
  } catch (const std::exception& e) {
    throw CheckpointError(f.path() + ": bad tokenizer: " + e.what());
  }
}

void load_training_checkpoint(const H5File& f, GPT& model, Optimizer& opt, TrainState& st) {
  const std::string& p = f.path();
  if (!f.exists("/optim") || !f.exists("/train")) throw CheckpointError(p + ": not a full training checkpoint (no /optim or /train)");
  const std::string type = f.read_attr_string("/optim", "type");
  if (type != opt.type())
    throw CheckpointError(p + ": optimizer state is " + type + " but the run uses " + opt.type());
  TrainState s;
  s.step = f.read_attr_int("/train", "step");
  s.tokens_seen = f.read_attr_int("/train", "tokens_seen");
  try {
    s.dropout_rng = std::stoull(f.read_attr_string("/train", "dropout_rng"));
  } catch (const std::exception&) {
    throw CheckpointError(p + ": bad /train dropout_rng attribute");
  }
  if (f.has_attr("/train", "extra")) s.extra_json = f.read_attr_string("/train", "extra");
  std::vector<uint8_t> ss = f.read_bytes("/train/sampler_state");
  s.sampler_state.assign(ss.begin(), ss.end());
  if (f.has_attr("/train", "world_size")) {
    const int64_t n = f.read_attr_int("/train", "world_size");
    if (n < 1 || n > 1000000) throw CheckpointError(p + ": bad /train world_size " + std::to_string(n));
    s.world_size = static_cast<int>(n);
    for (int r = 1; r < s.world_size; r++) {
      const std::string g = "/train/rank_" + std::to_string(r);
      if (!f.exists(g)) throw CheckpointError(p + ": world_size is " + std::to_string(n) + " but " + g + " is missing");
      try {
        s.rank_dropout_rngs.push_back(std::stoull(f.read_attr_string(g, "dropout_rng")));
      } catch (const std::logic_error&) {
        throw CheckpointError(p + ": bad " + g + " dropout_rng attribute");
      }
      std::vector<uint8_t> rs = f.read_bytes(g + "/sampler_state");
      s.rank_sampler_states.emplace_back(rs.begin(), rs.end());
    }
  }
  // Read every optimizer tensor before touching anything, so a bad file changes nothing.
  std::map<std::string, std::map<std::string, Tensor>> states;
  std::map<std::string, Shape> shapes;
  for (const auto& [name, v] : model.named_parameters()) shapes[name] = v.shape();
  for (const std::string& key : opt.state_keys()) {
    const std::string g = "/optim/" + key;
    if (!f.exists(g)) continue;
    for (const std::string& name : f.list_datasets_recursive(g)) {
      auto it = shapes.find(name);
      if (it == shapes.end()) throw CheckpointError(p + ": optimizer state " + g + "/" + name + " names no parameter");
      Tensor t = f.read_tensor(g + "/" + name);
      if (t.shape() != it->second)
        throw CheckpointError(p + ": optimizer state " + g + "/" + name + " is " + shape_str(t.shape()) +
                              ", parameter is " + shape_str(it->second));
      states[key][name] = t;
    }
  }
  const int64_t opt_step = f.read_attr_int("/optim", "step");
  read_model_weights(f, model);
  for (auto& [key, m] : states)
    for (auto& [name, t] : m) opt.state(key)[name] = t;
  opt.set_steps(opt_step);
  model.dropout_rng().set_state(s.dropout_rng);
  st = s;
}

}  // namespace tapelm
