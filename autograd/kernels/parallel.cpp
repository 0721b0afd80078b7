#include <exception>
#include <mutex>

#include "autograd/runtime.h"

namespace tapelm {

void parallel_for(int64_t n, const std::function<void(int64_t)>& body) {
  std::exception_ptr first;
  std::mutex mu;
  // An exception may not leave an OpenMP region: each task's is caught, the first one kept.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; i++) {
    try {
      body(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace tapelm
