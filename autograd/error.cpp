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

std::string cut_for_message(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max > 3 ? max - 3 : 0;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) n--;  // not inside a UTF-8 sequence
  return s.substr(0, n) + "...";
}

void fail(ErrorKind kind, const std::string& what) { throw Error(kind, what); }

}  // namespace tapelm
