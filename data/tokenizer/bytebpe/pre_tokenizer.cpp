#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/tokenizer/bytebpe/pre_tokenizer.h"

#include <pcre2.h>

namespace tapelm::bytebpe {

namespace {

// GPT-2's pre-tokenizer pattern, which Hugging Face's ByteLevel step uses when use_regex is true.
constexpr const char* gpt2_pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string pcre2_message(int rc) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(rc, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

struct Regex {
  pcre2_code* code = nullptr;
  explicit Regex(pcre2_code* c) : code(c) {}
  ~Regex() { pcre2_code_free(code); }
};

namespace {

std::shared_ptr<Regex> compile(const std::string& pattern, bool literal, const std::string& where) {
  int err = 0;
  PCRE2_SIZE at = 0;
  pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err, &at, nullptr);
  if (!c) throw Error(ErrorKind::data, where + " does not compile at offset " + std::to_string(at) + ": " + pcre2_message(err));
  pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // without JIT (unsupported CPU) the interpreter runs it
  return std::make_shared<Regex>(c);
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

// Splits text at the regex's matches, keeping matches and the text between them.
void split_isolated(const Regex& re, std::string_view text, std::vector<std::string_view>& out) {
  thread_local MatchState st;
  const auto* s = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, last = 0;
  while (pos <= text.size()) {
    const int rc = pcre2_match(re.code, s, text.size(), pos, PCRE2_NO_UTF_CHECK, st.md, st.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw Error(ErrorKind::data, "the pre-tokenizer's pattern failed at byte " + std::to_string(pos) + ": " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    const size_t b = ov[0], e = ov[1];
    if (b > last) out.push_back(text.substr(last, b - last));
    if (e > b) {
      out.push_back(text.substr(b, e - b));
      last = e;
      pos = e;
    } else {  // an empty match: step over one character
      if (b >= text.size()) break;
      pos = b + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) pos++;
    }
  }
  if (last < text.size()) out.push_back(text.substr(last));
}

}  // namespace

PreTokenizer PreTokenizer::parse(const Parser& p, const json& t, const std::string& field) {
  PreTokenizer r;
  r.add(p, t, field);
  if (r.steps_.empty() || r.steps_.back().kind != Kind::bytelevel) p.fail(field, "has no ByteLevel step: not a byte-level tokenizer");
  return r;
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
    if (!behavior.is_string() || behavior.get<std::string>() != "Isolated")
      p.fail(field + ".behavior", "is " + p.cut(behavior) + ": only \"Isolated\" is supported");
    if (p.flag(t, "invert", field, false)) p.fail(field + ".invert", "is true: only false is supported");
    if (pattern.empty()) p.fail(field + ".pattern", "is empty");
    steps_.push_back({Kind::split, compile(pattern, literal, p.what + ": " + field + ".pattern"), false,
                      std::string(literal ? "Split String " : "Split Regex ") + pattern});
  } else if (type == "Digits") {
    const bool each = p.flag(t, "individual_digits", field, false);
    steps_.push_back({Kind::split, compile(each ? R"(\p{N})" : R"(\p{N}+)", false, "the digits pattern"), false,
                      each ? "Digits individual" : "Digits"});
  } else {
    p.fail(field + ".type", "is \"" + type + "\": byte-level BPE needs Split, Digits and ByteLevel pre-tokenizers");
  }
}

std::string PreTokenizer::describe() const {
  std::string out;
  for (const Step& s : steps_) out += (out.empty() ? "" : " | ") + s.source;
  return out;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out, std::deque<std::string>& owned) const {
  std::vector<std::string_view> pieces{text}, next;
  for (const Step& s : steps_) {
    next.clear();
    for (std::string_view piece : pieces) {
      if (s.kind == Kind::bytelevel && s.add_prefix_space && !piece.empty() && piece[0] != ' ') {
        owned.push_back(" " + std::string(piece));
        piece = owned.back();
      }
      if (s.re)
        split_isolated(*s.re, piece, next);
      else
        next.push_back(piece);
    }
    pieces.swap(next);
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

}  // namespace tapelm::bytebpe
