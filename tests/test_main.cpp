#define BOOST_TEST_MODULE tapelm
#include <boost/test/unit_test.hpp>
