#pragma once
// The one finite-difference checker: backprop's gradient of <w, f(x)> for a random cotangent w
// against central differences, for every element of every input.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autograd/tape.h"

namespace tapelm {

struct GradCheckOptions {
  double eps = 1e-2;    // central-difference step
  double atol = 2e-3;   // pass when |backprop - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-2;
  uint64_t seed = 1234; // for the cotangent
};

struct GradCheckResult {
  bool ok = true;
  double worst_ratio = 0;  // max over elements of |err| / (atol + rtol*|numeric|); <= 1 passes
  std::string detail;      // where the worst element is, with both values
};

/// Checks every input of f (all are treated as requiring a gradient). f must be deterministic.
GradCheckResult gradcheck(const std::function<Var(const std::vector<Var>&)>& f, const std::vector<Tensor>& inputs,
                          const GradCheckOptions& opt = {});

/// The same check for a function of existing Vars (e.g. a model's parameters), perturbed in place.
GradCheckResult gradcheck_vars(const std::function<Var()>& f, const std::vector<Var>& params,
                               const GradCheckOptions& opt = {});

/// Random tensors for tests: normal(0, std), or uniform in [lo, hi).
Tensor randn(const Shape& shape, uint64_t seed, float std = 1.f);
Tensor rand_uniform(const Shape& shape, uint64_t seed, float lo, float hi);

}  // namespace tapelm
