#pragma once
// Helpers shared by the test suites.
#include <boost/test/unit_test.hpp>
#include <string>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"

namespace tapelm::test {

/// Gradient-checks f on the inputs and reports the worst element when it fails.
inline void check_grad(const std::string& what, const std::function<Var(const std::vector<Var>&)>& f,
                       const std::vector<Tensor>& inputs, GradCheckOptions opt = {}) {
  GradCheckResult r = gradcheck(f, inputs, opt);
  BOOST_TEST(r.ok, what << ": worst ratio " << r.worst_ratio << " at " << r.detail);
}

/// The directory holding the project's test data.
inline std::string data_path(const std::string& rel) { return std::string(TAPELM_SOURCE_DIR) + "/tests/data/" + rel; }

}  // namespace tapelm::test
