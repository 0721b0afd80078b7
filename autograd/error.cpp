#include "autograd/error.h"

namespace tapelm {

const char* to_string(ErrorKind k) {
  switch (k) {
    case ErrorKind::usage: return "usage";
    case ErrorKind::config: return "config";
    case ErrorKind::data: return "data";
    case ErrorKind::checkpoint: return "checkpoint";
    case ErrorKind::shape: return "shape";
    case ErrorKind::io: return "io";
    case ErrorKind::train: return "train";
    case ErrorKind::internal: return "internal";
  }
  return "internal";
}

void fail(ErrorKind kind, const std::string& what) { throw Error(kind, what); }

}  // namespace tapelm
