#pragma once
// The one way autograd reports a shape, value or argument it cannot take: ShapeError("op: what").
// Private to autograd's sources; layers above catch ShapeError (autograd/tensor.h).
#include <string>

#include "autograd/tensor.h"

namespace tapelm {

/// Throws ShapeError(op + ": " + what); `what` names the offending shapes or values.
[[noreturn]] inline void fail(const std::string& op, const std::string& what) { throw ShapeError(op + ": " + what); }

}  // namespace tapelm
