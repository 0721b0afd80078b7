#pragma once
// The pre-tokenizer of a byte-level tokenizer.json: regex splits (Split, Digits) and the byte-level
// step (GPT-2's pattern when use_regex, an optional prefix space), run in order. The patterns run
// on PCRE2 (UTF, UCP, JIT) as the file gives them.
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/bytebpe/parse.h"

namespace tapelm::bytebpe {

struct Regex;  // a compiled pattern (pre_tokenizer.cpp)

class PreTokenizer {
 public:
  /// The steps a tokenizer.json's "pre_tokenizer" value asks for; the last must be ByteLevel.
  /// Anything tapelm cannot run exactly -> data Error naming the field.
  static PreTokenizer parse(const Parser& p, const json& t, const std::string& field);
  /// What the steps are, e.g. "Digits individual | ByteLevel use_regex" (export matches on it).
  std::string describe() const;
  /// Splits text into pre-tokens (views into text, or into strings kept in `owned` when the
  /// byte-level step adds a prefix space).
  void split(std::string_view text, std::vector<std::string_view>& out, std::deque<std::string>& owned) const;

 private:
  enum class Kind { split, bytelevel };
  struct Step {
    Kind kind;
    std::shared_ptr<Regex> re;      // split; bytelevel with use_regex (GPT-2's pattern)
    bool add_prefix_space = false;  // bytelevel
    std::string source;             // what the file said, for describe()
  };
  void add(const Parser& p, const json& t, const std::string& field);
  std::vector<Step> steps_;
};

}  // namespace tapelm::bytebpe
