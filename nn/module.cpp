#include "nn/module.h"

#include <algorithm>

namespace tapelm {

NamedParams Module::named_parameters() const {
  NamedParams out;
  std::vector<const void*> seen;
  collect("", out, seen);
  return out;
}

void Module::collect(const std::string& prefix, NamedParams& out, std::vector<const void*>& seen) const {
  for (const auto& [name, v] : params_) {
    if (std::find(seen.begin(), seen.end(), v.id()) != seen.end()) continue;
    seen.push_back(v.id());
    out.emplace_back(prefix + name, v);
  }
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, seen);
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, v] : named_parameters()) n += v.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

Var Module::register_parameter(const std::string& name, Tensor init) {
  Var v(std::move(init), true);
  params_.emplace_back(name, v);
  return v;
}

Var Module::register_parameter(const std::string& name, const Var& shared) {
  params_.emplace_back(name, shared);
  return shared;
}

}  // namespace tapelm
