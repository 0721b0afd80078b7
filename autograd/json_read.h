#pragma once
// The one way tapelm parses JSON it did not write in this process (configs, tokenizer.json and
// its siblings, corpus and checkpoint metadata, the tokenizer a checkpoint holds): nesting bounded
// while the text is parsed, before any recursion over the value can run, so a file nested 70,000
// deep is refused in one line instead of exhausting the stack.
#include <string>

#include <nlohmann/json.hpp>

#include "autograd/error.h"

namespace tapelm {

/// Parses text; `what` (a file, a key) starts each error, of `kind`. Nesting deeper than
/// max_depth objects and arrays, a key twice in one object (when unique_keys) or text that is not
/// JSON is an Error naming it.
nlohmann::json parse_json(const std::string& text, const std::string& what, ErrorKind kind = ErrorKind::data, int max_depth = 64,
                          bool unique_keys = false);

}  // namespace tapelm
