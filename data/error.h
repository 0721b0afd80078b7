#pragma once
// The error every data function throws for bad input: one line naming the file or value at fault.
#include <stdexcept>

namespace tapelm {

/// Bad or unreadable data: missing files, malformed token files, unknown characters, short corpora.
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace tapelm
