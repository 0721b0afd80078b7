#include "train/checkpoint.h"

#include <map>
#include <set>

namespace tapelm {

GPTConfig read_model_config(const H5File& f) {
  const std::string& p = f.path();
  if (!f.has_attr("/", "format") || f.read_attr_string("/", "format") != "tapelm")
    throw CheckpointError(p + ": not a tapelm checkpoint (root attribute format is not \"tapelm\")");
  if (!f.has_attr("/", "format_version"))
    throw CheckpointError(p + ": missing root attribute format_version");
  const int64_t v = f.read_attr_int("/", "format_version");
  if (v != kFormatVersion)
    throw CheckpointError(p + ": format_version " + std::to_string(v) + " is not supported (expected " +
                          std::to_string(kFormatVersion) + ")");
  if (!f.has_attr("/", "config")) throw CheckpointError(p + ": missing root attribute config");
  try {
    return GPTConfig::from_json_string(f.read_attr_string("/", "config"));
  } catch (const ConfigError& e) {
    throw CheckpointError(p + ": bad model config: " + e.what());
  }
}

void write_model(H5File& f, const GPT& model, const std::string& group) {
  f.write_attr("/", "format", std::string("tapelm"));
  f.write_attr("/", "format_version", kFormatVersion);
  f.write_attr("/", "config", model.config().to_json().dump());
  f.create_group(group);
  for (const auto& [name, p] : model.named_parameters()) f.write_tensor(group + "/" + name, p.val());
}

void read_model_weights(const H5File& f, GPT& model, const std::string& group) {
  const std::string& path = f.path();
  if (!f.exists(group)) throw CheckpointError(path + ": missing group " + group);
  std::map<std::string, Shape> want;
  NamedParams params = model.named_parameters();
  for (const auto& [name, p] : params) want[name] = p.shape();
  std::vector<std::string> have = f.list_datasets_recursive(group);
  std::string missing, extra, misshaped;
  std::set<std::string> seen;
  for (const std::string& n : have) {
    seen.insert(n);
    auto it = want.find(n);
    if (it == want.end()) {
      extra += (extra.empty() ? "" : ", ") + n;
      continue;
    }
    Shape s = f.dataset_shape(group + "/" + n);
    if (s != it->second)
      misshaped += (misshaped.empty() ? "" : ", ") + n + " " + shape_str(s) + " (expected " + shape_str(it->second) + ")";
  }
  for (const auto& [n, s] : want)
    if (!seen.count(n)) missing += (missing.empty() ? "" : ", ") + n;
  if (!missing.empty() || !extra.empty() || !misshaped.empty()) {
    std::string msg = path + ": parameters do not match the model:";
    if (!missing.empty()) msg += " missing " + missing + ";";
    if (!extra.empty()) msg += " extra " + extra + ";";
    if (!misshaped.empty()) msg += " mis-shaped " + misshaped + ";";
    msg.pop_back();
    throw CheckpointError(msg);
  }
  // Read everything first, so a failing read leaves the model untouched.
  std::vector<Tensor> loaded;
  for (const auto& [name, p] : params) loaded.push_back(f.read_tensor(group + "/" + name));
  for (size_t i = 0; i < params.size(); i++) params[i].second.val() = loaded[i];
}

std::unique_ptr<GPT> load_model(const std::string& path) {
  H5File f = H5File::open_read(path);
  auto model = std::make_unique<GPT>(read_model_config(f));
  read_model_weights(f, *model);
  return model;
}

void save_model(const std::string& path, const GPT& model) {
  write_h5_atomic(path, [&](H5File& f) { write_model(f, model); });
}

}  // namespace tapelm
