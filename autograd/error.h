#pragma once
// The one exception tapelm throws for bad input or a run that cannot go on: a one-line message
// naming the file, key, shape or value at fault, and a category that callers (and tests) can
// tell apart without parsing the message. The CLI prints the message and exits 1 for any kind.
// It sits in autograd, the lowest layer, so every module throws the same type.
#include <stdexcept>
#include <string>

namespace tapelm {

/// What went wrong, coarsely: enough to catch one kind and let the others pass.
enum class ErrorKind {
  usage,       // a flag or argument the command cannot take
  config,      // a model or training config key with a wrong type or value
  data,        // text, token files, prepared corpora, parity files
  checkpoint,  // HDF5 files and the checkpoint format
  shape,       // an op given tensors whose shapes do not fit
  io,          // a file or directory that cannot be written, a helper program that is missing
  train,       // a run that cannot go on (NaN loss, unwritable run directory, ...)
  internal,    // a broken invariant of tapelm itself
};

/// The category's name, as the CLI prints it under --json and tests name it.
const char* to_string(ErrorKind k);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

/// Throws Error(kind, what): the one way to fail.
[[noreturn]] void fail(ErrorKind kind, const std::string& what);
/// s cut to at most `max` bytes at a UTF-8 boundary, "..." marking a cut: how a value is echoed
/// in a message, so a 100 MB value never is.
std::string cut_for_message(const std::string& s, size_t max = 80);
/// The same for an op given shapes, values or arguments it cannot take: a shape Error
/// "op: what", where `what` names the offending shapes or values.
[[noreturn]] inline void fail(const std::string& op, const std::string& what) { fail(ErrorKind::shape, op + ": " + what); }

}  // namespace tapelm
