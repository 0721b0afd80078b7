#pragma once
// The pre-tokenizer of a tokenizer.json: regex splits (Split, Digits), the byte-level step
// (GPT-2's pattern when use_regex, an optional prefix space) last in a byte-level file, and
// Metaspace (spaces as "▁", one prepended, optionally a split before each) in a byte-fallback
// one, run in order. The patterns run on PCRE2 (UTF, UCP, JIT) as the file gives them.
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/bytebpe/parse.h"

namespace tapelm::bytebpe {

struct Regex;  // a compiled pattern (pre_tokenizer.cpp)

/// What a Split step does with its matches (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior { isolated, removed, merged_with_previous, merged_with_next, contiguous };

/// A tokenizer.json pattern (Oniguruma's syntax, as Hugging Face runs it) as a PCRE2 pattern that
/// matches the same: every class escape (\s \d \w \h \p{..} and their negations) becomes the code
/// points Oniguruma gives it (onig_classes.h: PCRE2's own tables differ, e.g. \s and U+180E, and
/// follow another Unicode version). A class tapelm has no table for, a nested class or an
/// intersection -> data Error naming `where`.
std::string onig_to_pcre2(const std::string& pattern, const std::string& where);

class PreTokenizer {
 public:
  /// The steps a tokenizer.json's "pre_tokenizer" value asks for: byte_level, the last must be
  /// ByteLevel; else (byte fallback) there is none, or none is ByteLevel. Anything tapelm cannot
  /// run exactly -> data Error naming the field.
  static PreTokenizer parse(const Parser& p, const json& t, const std::string& field, bool byte_level = true);
  /// What the steps are, e.g. "Digits individual | ByteLevel use_regex" (export matches on it).
  std::string describe() const;
  /// Splits text into pre-tokens (views into text, or into strings kept in `owned` when a step
  /// adds a prefix or replaces spaces). at_start: text begins the whole text (Metaspace's
  /// prepend_scheme "first" prepends there alone).
  void split(std::string_view text, std::vector<std::string_view>& out, std::deque<std::string>& owned, bool at_start = true) const;
  /// True when a Metaspace step prepends its replacement to text at the start (scheme "first")
  /// or to every piece ("always").
  bool prepends() const;
  /// Where a text may be cut with the pre-tokens of the parts, side by side, those of the whole
  /// (docs/tokenizers.md): before a ' ' between two letters (\p{L}, of any script) when every step is a split
  /// tapelm knows (the GPT-2, cl100k/Llama 3, Qwen2, o200k and DeepSeek V3 patterns, digits, CJK
  /// runs) and one of them splits words; also before a '\n' between two letters unless the
  /// byte-level step adds a prefix space. Both false for any other pipeline.
  bool cuts_at_space() const { return cut_space_; }
  bool cuts_at_newline() const { return cut_newline_; }
  /// cp is in \p{L} as the patterns match it (Oniguruma's table, onig_classes.h).
  static bool is_letter(uint32_t cp);

 private:
  enum class Kind { split, bytelevel, metaspace };
  enum class Prepend { always, first, never };  // Metaspace's prepend_scheme
  struct Step {
    Kind kind;
    std::shared_ptr<Regex> re;      // split; bytelevel with use_regex (GPT-2's pattern)
    bool add_prefix_space = false;  // bytelevel
    std::string source;             // what the file said, for describe()
    SplitBehavior behavior = SplitBehavior::isolated;  // split
    bool invert = false;                               // split: the matches are the text between
    std::string pattern;                               // split: as the file gives it (Regex)
    std::string replacement;                           // metaspace: what a space becomes
    Prepend prepend = Prepend::always;                 // metaspace
  };
  void add(const Parser& p, const json& t, const std::string& field);
  void decide_cuts();
  std::vector<Step> steps_;
  bool cut_space_ = false, cut_newline_ = false;
};

}  // namespace tapelm::bytebpe
