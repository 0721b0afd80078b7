#define BOOST_TEST_MODULE tapelm
#include <boost/test/unit_test.hpp>

#include "autograd/cpu.h"

// The tests run on the kernels a user's run gets: the BLAS core guard acts before any test, as it
// does at the top of tapelm's main() (it may re-execute this binary once).
struct BlasCoreGuard {
  BlasCoreGuard() { tapelm::guard_blas_core(boost::unit_test::framework::master_test_suite().argv); }
};
BOOST_TEST_GLOBAL_FIXTURE(BlasCoreGuard);
