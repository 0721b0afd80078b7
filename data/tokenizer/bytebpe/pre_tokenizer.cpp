#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/tokenizer/bytebpe/pre_tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "data/tokenizer/bytebpe/normalizer.h"
#include "data/tokenizer/bytebpe/onig_classes.h"
#include "data/tokenizer/utf8.h"

namespace tapelm::bytebpe {

namespace {

// GPT-2's pre-tokenizer pattern, which Hugging Face's ByteLevel step uses when use_regex is true.
constexpr const char* gpt2_pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The split patterns a cut may be proven safe for (docs/tokenizers.md), as tokenizer.json files
// write them. Word patterns split before a space or newline that sits between two ASCII letters
// and cover every character (so Removed with invert keeps what Isolated keeps); the others never
// match an ASCII letter, space or newline.
constexpr const char* kWordPatterns[] = {
    gpt2_pattern,
    // cl100k (GPT-4, Llama 3)
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    // Qwen2, Qwen2.5, Qwen3
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    // o200k (GPT-4o, gpt-oss)
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
// DeepSeek V3's third split: every character but digits and CJK, which its first two split out.
constexpr const char* kDeepSeekWords =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kRunPatterns[] = {
    R"(\p{N})", R"(\p{N}+)", R"(\p{N}{1,3})",
    // DeepSeek V3's CJK runs
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
};

std::string pcre2_message(int rc) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(rc, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

struct Regex {
  pcre2_code* code = nullptr;
  std::string where;  // the pattern as messages name it
  Regex(pcre2_code* c, std::string w) : code(c), where(std::move(w)) {}
  ~Regex() { pcre2_code_free(code); }
};

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// The code points of an Oniguruma class (kOnigClasses: "\\s", "\\p{L}", ...), or null.
const OnigClass* onig_class(const std::string& name) {
  for (const OnigClass& c : kOnigClasses)
    if (name == c.name) return &c;
  return nullptr;
}

Ranges ranges_of(const OnigClass& c) {
  Ranges r;
  for (size_t i = 0; i < c.n; i++) r.emplace_back(c.ranges[i][0], c.ranges[i][1]);
  return r;
}

// Every code point not in r (surrogates left out: UTF-8 text never holds them).
Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  auto add = [&](uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    if (lo < 0xD800 && hi >= 0xD800) out.emplace_back(lo, 0xD7FF), lo = 0xE000;
    if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
    if (lo <= hi) out.emplace_back(lo, hi);
  };
  for (const auto& [lo, hi] : r) {
    if (lo > next) add(next, lo - 1);
    next = hi + 1;
  }
  add(next, 0x10FFFF);
  return out;
}

// Ranges as the members of a PCRE2 character class: \x{41}-\x{5A}\x{5F}...
std::string members(const Ranges& r) {
  std::string s;
  char b[40];
  for (const auto& [lo, hi] : r) {
    if (lo == hi) std::snprintf(b, sizeof b, "\\x{%X}", lo);
    else std::snprintf(b, sizeof b, "\\x{%X}-\\x{%X}", lo, hi);
    s += b;
  }
  return s;
}

// The class an escape names, Oniguruma's way (Ruby syntax: \h is a hex digit), and whether it is
// negated; "" for an escape that is no class. pos is just past the backslash; it is moved past the
// escape.
std::string class_escape(const std::string& p, size_t& pos, bool& negated, const std::string& where) {
  const char e = pos < p.size() ? p[pos] : '\0';
  negated = std::isupper(static_cast<unsigned char>(e)) != 0;
  switch (e) {
    case 's': case 'S': pos++; return "\\s";
    case 'd': case 'D': pos++; return "\\d";
    case 'w': case 'W': pos++; return "\\w";
    case 'h': case 'H': pos++; return "hex";
    case 'p': case 'P': break;
    default: return "";
  }
  std::string name;
  if (pos + 1 < p.size() && p[pos + 1] == '{') {
    const size_t close = p.find('}', pos + 2);
    if (close == std::string::npos) throw Error(ErrorKind::data, where + ": \\" + std::string(1, e) + "{ is not closed");
    name = p.substr(pos + 2, close - pos - 2);
    pos = close + 1;
  } else if (pos + 1 < p.size()) {
    name = p.substr(pos + 1, 1);
    pos += 2;
  }
  if (!name.empty() && name[0] == '^') negated = !negated, name.erase(0, 1);
  const std::string full = "\\p{" + name + "}";
  if (!onig_class(full))
    throw Error(ErrorKind::data, where + ": uses \\p{" + cut_for_message(name, 20) +
                                     "}, a class tapelm has no Oniguruma table for (it reads L, Lu, Ll, Lt, Lm, Lo, M, N, Nd, P, S)");
  return full;
}

Ranges class_ranges(const std::string& name) {
  if (name == "hex") return {{'0', '9'}, {'A', 'F'}, {'a', 'f'}};
  return ranges_of(*onig_class(name));
}

}  // namespace

std::string onig_to_pcre2(const std::string& pattern, const std::string& where) {
  std::string out;
  bool in_class = false;
  size_t class_start = 0;  // where the open class's members begin in the pattern
  for (size_t i = 0; i < pattern.size();) {
    const char c = pattern[i];
    if (c == '\\') {
      size_t pos = i + 1;
      bool negated = false;
      const std::string name = class_escape(pattern, pos, negated, where);
      if (name.empty()) {  // another escape: as it is, but Ruby's \uHHHH, which PCRE2 spells \x{HHHH}
        if (pos < pattern.size() && pattern[pos] == 'u' && pos + 5 <= pattern.size()) {
          out += "\\x{" + pattern.substr(pos + 1, 4) + "}";
          i = pos + 5;
        } else {
          out += pattern.substr(i, std::min<size_t>(2, pattern.size() - i));
          i += 2;
        }
        continue;
      }
      const Ranges r = negated ? complement(class_ranges(name)) : class_ranges(name);
      out += in_class ? members(r) : "[" + members(r) + "]";
      i = pos;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      i++;
      if (i < pattern.size() && pattern[i] == '^') out += pattern[i++];
      if (i < pattern.size() && pattern[i] == ']') out += pattern[i++];  // a literal ] first
      class_start = i;
      continue;
    }
    if (in_class && c == '[')
      throw Error(ErrorKind::data, where + ": a nested character class or POSIX class at offset " + std::to_string(i) +
                                       " (Oniguruma's and PCRE2's differ; tapelm reads neither)");
    if (in_class && c == '&' && i + 1 < pattern.size() && pattern[i + 1] == '&')
      throw Error(ErrorKind::data, where + ": a class intersection (&&) at offset " + std::to_string(i) + ", which PCRE2 does not have");
    if (in_class && c == ']' && i > class_start) in_class = false;
    out += c;
    i++;
  }
  return out;
}

namespace {

std::shared_ptr<Regex> compile(const std::string& source, bool literal, const std::string& where) {
  const std::string pattern = literal ? source : onig_to_pcre2(source, where);
  int err = 0;
  PCRE2_SIZE at = 0;
  // PCRE2_LITERAL takes none of UTF's companions but PCRE2_UTF itself.
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err, &at, nullptr);
  if (!c) throw Error(ErrorKind::data, where + " does not compile at offset " + std::to_string(at) + ": " + pcre2_message(err));
  pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // without JIT (unsupported CPU) the interpreter runs it
  return std::make_shared<Regex>(c, where);
}

// Per-thread matching state: PCRE2's JIT needs a stack larger than its 32 KiB default for long
// runs of whitespace under patterns like \s+(?!\S).
struct MatchState {
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_data* md = nullptr;
  MatchState() {
    ctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 << 10, 64 << 20, nullptr);
    pcre2_jit_stack_assign(ctx, nullptr, stack);
    md = pcre2_match_data_create(4, nullptr);
  }
  ~MatchState() {
    pcre2_match_data_free(md);
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
  }
};

using Parts = std::vector<std::pair<std::pair<size_t, size_t>, bool>>;  // (range, is a match)

// The pieces a Split behavior keeps of its parts, as tokenizers' NormalizedString::split applies them.
const std::vector<std::pair<size_t, size_t>>& with_behavior(const Parts& parts, SplitBehavior behavior) {
  thread_local std::vector<std::pair<size_t, size_t>> kept;  // reused: one call per pre-token piece
  kept.clear();
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const auto& [r, m] : parts) kept.push_back(r);
      break;
    case SplitBehavior::removed:
      for (const auto& [r, m] : parts)
        if (!m) kept.push_back(r);
      break;
    case SplitBehavior::merged_with_previous: {
      bool previous_match = false;
      for (const auto& [r, m] : parts) {
        if (m && !previous_match && !kept.empty()) kept.back().second = r.second;
        else kept.push_back(r);
        previous_match = m;
      }
      break;
    }
    case SplitBehavior::merged_with_next: {
      bool previous_match = false;
      for (size_t i = parts.size(); i-- > 0;) {
        const auto& [r, m] = parts[i];
        if (m && !previous_match && !kept.empty()) kept.back().first = r.first;
        else kept.push_back(r);
        previous_match = m;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case SplitBehavior::contiguous: {
      bool previous_match = false;
      for (const auto& [r, m] : parts) {
        if (m == previous_match && !kept.empty()) kept.back().second = r.second;
        else kept.push_back(r);
        previous_match = m;
      }
      break;
    }
  }
  return kept;
}

// Hugging Face's Split: the text cut into the regex's matches and the text between them, as
// tokenizers' Pattern::find_matches lists them (Oniguruma's find_iter: after an empty match the
// search moves one character on, and an empty match right where the previous match ended is
// skipped), each flagged as a match (flipped by `invert`); then the behavior joins or drops
// pieces, and empty pieces are dropped (PreTokenizedString::split).
// The work PCRE2 may spend on one text, in its match-limit steps: a floor and a share per byte,
// over every Split of the text together. Each search runs under a small limit first and, when it
// reaches it, again under four times as much, each try charged in full (its work is at most its
// limit), so the charge is within a small factor of the work done. A per-search limit that grew
// with the piece let (?:a+)+b|. spend 2^20 steps on each run of 20 letters: 37 s for 160 KB.
constexpr uint64_t kRegexFloor = 65536, kRegexPerByte = 1000, kRegexFirstTry = 100;

void split_pieces(const Regex& re, SplitBehavior behavior, bool invert, std::string_view text, std::vector<std::string_view>& out,
                  uint64_t& budget, size_t text_bytes) {
  if (text.empty()) return;
  thread_local MatchState st;
  thread_local Parts parts;
  parts.clear();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, prev = 0;
  bool matched_before = false;
  // the depth limit bounds memory, not time: generous, as before
  pcre2_set_depth_limit(st.ctx, static_cast<uint32_t>(std::min<size_t>(UINT32_MAX, std::max<size_t>(1 << 20, 64 * text.size()))));
  while (pos <= text.size()) {
    int rc = 0;
    for (uint64_t want = kRegexFirstTry;; want *= 4) {
      const uint64_t limit = std::min<uint64_t>({want, budget, UINT32_MAX});
      pcre2_set_match_limit(st.ctx, static_cast<uint32_t>(limit));
      rc = pcre2_match(re.code, s, text.size(), pos, PCRE2_NO_UTF_CHECK, st.md, st.ctx);
      budget -= limit;
      if (rc != PCRE2_ERROR_MATCHLIMIT || limit < want || budget == 0) break;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT)
      throw Error(ErrorKind::data, re.where + " backtracks too much: the work allowed for a " + std::to_string(text_bytes) + "-byte text (" +
                                       std::to_string(kRegexFloor) + " + " + std::to_string(kRegexPerByte) +
                                       " steps a byte) ran out at byte " + std::to_string(pos) + " of a " + std::to_string(text.size()) +
                                       "-byte piece (" + pcre2_message(rc) + ")");
    if (rc < 0) throw Error(ErrorKind::data, re.where + " failed at byte " + std::to_string(pos) + ": " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    const size_t b = ov[0], e = ov[1];
    if (b == e) {
      pos = e + 1;  // the next character
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) pos++;
      if (matched_before && e == prev) continue;
    } else {
      pos = e;
    }
    if (b != prev) parts.push_back({{prev, b}, invert});
    parts.push_back({{b, e}, !invert});
    prev = e;
    matched_before = true;
  }
  if (prev != text.size()) parts.push_back({{prev, text.size()}, invert});
  for (const auto& [b, e] : with_behavior(parts, behavior))
    if (e > b) out.push_back(text.substr(b, e - b));
}

}  // namespace

bool PreTokenizer::is_letter(uint32_t cp) {
  static const OnigClass* letters = onig_class("\\p{L}");
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  const auto* end = letters->ranges + letters->n;
  const auto* it = std::upper_bound(letters->ranges, end, cp, [](uint32_t c, const uint32_t(&r)[2]) { return c < r[0]; });
  return it != letters->ranges && cp <= (*(it - 1))[1];
}

PreTokenizer PreTokenizer::parse(const Parser& p, const json& t, const std::string& field, bool byte_level) {
  PreTokenizer r;
  if (!byte_level && t.is_null()) return r;  // none: the whole text is one pre-token (Llama 2's, Gemma's)
  if (t.is_null()) p.fail(field, "is missing: byte-level BPE needs a ByteLevel pre-tokenizer");
  r.add(p, t, field);
  if (byte_level && (r.steps_.empty() || r.steps_.back().kind != Kind::bytelevel))
    p.fail(field, "has no ByteLevel step: not a byte-level tokenizer (and model.byte_fallback is false)");
  for (const Step& s : r.steps_) {
    if (!byte_level && s.kind == Kind::bytelevel)
      p.fail(field, "has a ByteLevel step, which a byte_fallback model's vocabulary does not spell");
    if (byte_level && s.kind == Kind::metaspace) p.fail(field, "has a Metaspace step in a byte-level tokenizer");
  }
  if (byte_level) r.decide_cuts();  // byte fallback: never cut (as sentencepiece's own models)
  return r;
}

bool PreTokenizer::prepends() const {
  for (const Step& s : steps_)
    if (s.kind == Kind::metaspace && s.prepend != Prepend::never) return true;
  return false;
}

void PreTokenizer::decide_cuts() {
  auto in = [](const std::string& p, const auto& list) {
    return std::any_of(std::begin(list), std::end(list), [&](const char* x) { return p == x; });
  };
  bool words = false, known = true, prefix_space = false;
  for (const Step& s : steps_) {
    if (s.kind == Kind::bytelevel) {
      prefix_space = s.add_prefix_space;
      if (s.re) words = true;  // GPT-2's pattern, isolated
      continue;
    }
    const bool isolated = s.behavior == SplitBehavior::isolated;
    if ((in(s.pattern, kWordPatterns) && (isolated || (s.behavior == SplitBehavior::removed && s.invert))) ||
        (s.pattern == kDeepSeekWords && isolated))
      words = true;
    else if (!(in(s.pattern, kRunPatterns) && isolated))
      known = false;
  }
  cut_space_ = known && words;
  cut_newline_ = cut_space_ && !prefix_space;
}

void PreTokenizer::add(const Parser& p, const json& t, const std::string& field) {
  const std::string type = p.type_of(t, field);
  if (!steps_.empty() && steps_.back().kind == Kind::bytelevel)
    p.fail(field, "comes after the ByteLevel step: byte-level must be the last pre-tokenizer");
  if (type == "Sequence") {
    const json& list = p.member(t, "pretokenizers", field);
    if (!list.is_array()) p.fail(field + ".pretokenizers", "is not an array");
    for (size_t i = 0; i < list.size(); i++) add(p, list[i], field + ".pretokenizers[" + std::to_string(i) + "]");
  } else if (type == "ByteLevel") {
    Step s{Kind::bytelevel, nullptr, p.flag(t, "add_prefix_space", field, true), "ByteLevel"};
    if (p.flag(t, "use_regex", field, true)) s.re = compile(gpt2_pattern, false, "GPT-2's pattern"), s.source += " use_regex";
    if (s.add_prefix_space) s.source += " add_prefix_space";
    steps_.push_back(std::move(s));
  } else if (type == "Split") {
    const json& pat = p.member(t, "pattern", field);
    bool literal = false;
    std::string pattern;
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      pattern = pat["Regex"].get<std::string>();
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      pattern = pat["String"].get<std::string>();
      literal = true;
    } else {
      p.fail(field + ".pattern", "is not {\"Regex\": ...} or {\"String\": ...}: " + p.cut(pat));
    }
    const json& behavior = p.member(t, "behavior", field);
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Isolated", SplitBehavior::isolated}, {"Removed", SplitBehavior::removed},
        {"MergedWithPrevious", SplitBehavior::merged_with_previous}, {"MergedWithNext", SplitBehavior::merged_with_next},
        {"Contiguous", SplitBehavior::contiguous}};
    const auto* b = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                                 [&](const auto& x) { return behavior.is_string() && behavior.get<std::string>() == x.first; });
    if (b == std::end(kBehaviors))
      p.fail(field + ".behavior", "is " + p.cut(behavior) + ": not Isolated, Removed, MergedWithPrevious, MergedWithNext or Contiguous");
    const bool invert = p.flag(t, "invert", field, false);
    if (pattern.empty()) p.fail(field + ".pattern", "is empty");
    Step step{Kind::split, compile(pattern, literal, p.what + ": " + field + ".pattern"), false,
              std::string(literal ? "Split String " : "Split Regex ") + pattern};
    step.behavior = b->second;
    step.invert = invert;
    if (!literal) step.pattern = pattern;
    if (step.behavior != SplitBehavior::isolated) step.source += std::string(" ") + b->first;
    if (invert) step.source += " invert";
    steps_.push_back(std::move(step));
  } else if (type == "Digits") {
    const bool each = p.flag(t, "individual_digits", field, false);
    Step step{Kind::split, compile(each ? R"(\p{N})" : R"(\p{N}+)", false, "the digits pattern"), false,
              each ? "Digits individual" : "Digits"};
    step.pattern = each ? R"(\p{N})" : R"(\p{N}+)";
    steps_.push_back(std::move(step));
  } else if (type == "Metaspace") {
    // {replacement, prepend_scheme, split}; files older than tokenizers 0.19 say add_prefix_space
    const json& r = p.member(t, "replacement", field);
    // (a parsed JSON string is valid UTF-8)
    if (!r.is_string() || utf8_decode(r.get<std::string>()).size() != 1) p.fail(field + ".replacement", "is not one character: " + p.cut(r));
    Step step{Kind::metaspace, nullptr, false, "Metaspace " + r.get<std::string>()};
    step.replacement = r.get<std::string>();
    const bool legacy_prefix = p.flag(t, "add_prefix_space", field, true);
    step.prepend = legacy_prefix ? Prepend::always : Prepend::never;
    if (auto ps = t.find("prepend_scheme"); ps != t.end() && !ps->is_null()) {
      static const std::pair<const char*, Prepend> kSchemes[] = {{"always", Prepend::always}, {"first", Prepend::first}, {"never", Prepend::never}};
      const auto* k = std::find_if(std::begin(kSchemes), std::end(kSchemes), [&](const auto& x) { return ps->is_string() && ps->get<std::string>() == x.first; });
      if (k == std::end(kSchemes)) p.fail(field + ".prepend_scheme", "is " + p.cut(*ps) + ": not \"always\", \"first\" or \"never\"");
      step.prepend = k->second;
      step.source += std::string(" ") + k->first;
    } else {
      step.source += legacy_prefix ? " always" : " never";
    }
    if (p.flag(t, "split", field, true)) {
      step.re = compile(step.replacement, true, p.what + ": " + field + ".replacement");
      step.behavior = SplitBehavior::merged_with_next;
      step.source += " split";
    }
    steps_.push_back(std::move(step));
  } else {
    p.fail(field + ".type", "is \"" + type + "\": the supported pre-tokenizers are Split, Digits, ByteLevel, Metaspace and Sequence");
  }
}

std::string PreTokenizer::describe() const {
  std::string out;
  for (const Step& s : steps_) out += (out.empty() ? "" : " | ") + s.source;
  return out;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out, std::deque<std::string>& owned, bool at_start) const {
  std::vector<std::string_view> pieces{text}, next;
  uint64_t budget = kRegexFloor + kRegexPerByte * static_cast<uint64_t>(text.size());
  for (const Step& s : steps_) {
    next.clear();
    for (std::string_view piece : pieces) {
      if (s.kind == Kind::bytelevel && s.add_prefix_space && !piece.empty() && piece[0] != ' ') {
        owned.push_back(" " + std::string(piece));
        piece = owned.back();
      }
      if (s.kind == Kind::metaspace) {
        // Hugging Face's Metaspace: every ' ' becomes the replacement, which is prepended unless
        // the piece starts with it ("first": only a piece where the whole text starts).
        const bool first = at_start && piece.data() == text.data();
        std::string t = replace_all(std::string(piece), " ", s.replacement);
        if (!t.empty() && (s.prepend == Prepend::always || (s.prepend == Prepend::first && first)) &&
            t.compare(0, s.replacement.size(), s.replacement) != 0)
          t.insert(0, s.replacement);
        owned.push_back(std::move(t));
        piece = owned.back();
      }
      if (s.re)
        split_pieces(*s.re, s.behavior, s.invert, piece, next, budget, text.size());
      else
        next.push_back(piece);
    }
    pieces.swap(next);
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

}  // namespace tapelm::bytebpe
