#define BOOST_TEST_MODULE tapelm
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <string>

#include "autograd/cpu.h"

// The tests run on the kernels a user's run gets: the BLAS core guard acts before any test, as it
// does at the top of tapelm's main() (it may re-execute this binary once).
// An OPENBLAS_CORETYPE from the environment (a machine set up to stand in for an older CPU) is
// kept, with the guard's warning; the tapelm binaries the tests start inherit it and would print
// that warning again on every run, a second stderr line the one-line checks count. Naming the same
// core in TAPELM_BLAS_CORE makes them run the same kernels as this process, silently.
struct BlasCoreGuard {
  BlasCoreGuard() {
    tapelm::guard_blas_core(boost::unit_test::framework::master_test_suite().argv);
    const char* user = std::getenv("OPENBLAS_CORETYPE");
    if (user && *user && !std::getenv("TAPELM_BLAS_CORE")) {
      const std::string core = tapelm::canonical_blas_core(user);
      if (!core.empty()) ::setenv("TAPELM_BLAS_CORE", core.c_str(), 1);
    }
  }
};
BOOST_TEST_GLOBAL_FIXTURE(BlasCoreGuard);
