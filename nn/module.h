#pragma once
// Module: registers children and parameters by local name; named_parameters() joins the names
// with dots while walking the tree (`blocks.0.attn.wq.weight`), as PyTorch's frontend does.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/tape.h"

namespace tapelm {

using NamedParams = std::vector<std::pair<std::string, Var>>;

class Module {
 public:
  virtual ~Module() = default;
  /// Every parameter under its dotted name, in registration order; a shared (tied) parameter once.
  NamedParams named_parameters() const;
  /// Total number of parameter elements (a tied weight counted once).
  int64_t num_parameters() const;
  /// Train or eval mode for this module and all children (dropout is off in eval).
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

 protected:
  /// Registers a trainable parameter initialised to `init`.
  Var register_parameter(const std::string& name, Tensor init);
  /// Registers an existing Var (a tied weight) under this module.
  Var register_parameter(const std::string& name, const Var& shared);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, NamedParams& out, std::vector<const void*>& seen) const;
  std::vector<std::pair<std::string, Var>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace tapelm
