#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/bytebpe.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <tuple>
#include <atomic>
#include <climits>
#include <deque>
#include <nlohmann/json.hpp>
#include <queue>
#include <string_view>
#include <unordered_map>

#include "autograd/error.h"
#include "data/io.h"
#include "data/tokenizer.h"

namespace tapelm {

namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer pattern, which Hugging Face's ByteLevel step uses when use_regex is true.
constexpr const char* gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes for
// U+0100 onwards in byte order, so every byte has a visible, non-space character.
std::array<char32_t, 256> byte_to_char() {
  std::array<char32_t, 256> m{};
  int n = 0;
  for (int b = 0; b < 256; b++) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    m[b] = printable ? char32_t(b) : char32_t(256 + n++);
  }
  return m;
}

struct Regex {
  pcre2_code* code = nullptr;
  explicit Regex(pcre2_code* c) : code(c) {}
  ~Regex() { pcre2_code_free(code); }
};

std::string pcre2_message(int rc) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(rc, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

std::shared_ptr<Regex> compile(const std::string& pattern, bool literal, const std::string& where) {
  int err = 0;
  PCRE2_SIZE at = 0;
  pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err, &at, nullptr);
  if (!c)
    throw Error(ErrorKind::data, where + " does not compile at offset " + std::to_string(at) + ": " + pcre2_message(err));
  pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // without JIT (unsupported CPU) the interpreter runs it
  return std::make_shared<Regex>(c);
}

enum class StepKind { split, bytelevel };
struct Step {
  StepKind kind;
  std::shared_ptr<Regex> re;      // split; bytelevel with use_regex (GPT-2's pattern)
  bool add_prefix_space = false;  // bytelevel
  std::string source;             // what the file said, for describing the pre-tokenizer
};

struct Added {
  std::string content;
  int32_t id;
};

std::atomic<uint64_t> next_serial{1};

}  // namespace

struct ByteBpeModel {
  uint64_t serial = 0;  // tells the per-thread caches apart
  std::string serialized;
  std::vector<std::string> pieces;  // id -> the vocabulary's spelling
  std::vector<std::string> bytes;   // id -> what it decodes to
  std::vector<uint8_t> added_kind;  // id -> 0 vocabulary token, 1 added token, 2 added special token
  std::unordered_map<std::string, int32_t> vocab;  // spelling -> id (ignore_merges' whole-word look-up)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left << 32 | right) -> (rank, merged id)
  std::vector<std::pair<int32_t, int32_t>> merge_list;                // (left, right) by rank
  std::array<int32_t, 256> byte_id{};
  std::array<std::string, 256> byte_spelling;  // the byte's character in UTF-8
  std::vector<Added> added;
  bool nfc = false;
  bool ignore_merges = false;
  std::vector<Step> steps;
  int32_t bos = -1, eos = -1;
};

namespace {

// ---- parsing -------------------------------------------------------------------------------------

struct Parser {
  std::string what;
  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw Error(ErrorKind::data, what + ": " + field + " " + why);
  }
  std::string cut(const json& v) const {
    std::string s = v.dump();
    return s.size() > 60 ? s.substr(0, 60) + "..." : s;
  }
  const json& member(const json& o, const char* key, const std::string& field) const {
    auto it = o.find(key);
    if (it == o.end()) fail(field + "." + key, "is missing");
    return *it;
  }
  std::string type_of(const json& o, const std::string& field) const {
    if (!o.is_object()) fail(field, "is not an object: " + cut(o));
    auto it = o.find("type");
    if (it == o.end() || !it->is_string()) fail(field + ".type", "is missing or not a string");
    return it->get<std::string>();
  }
  bool flag(const json& o, const char* key, const std::string& field, bool dflt) const {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) fail(field + "." + key, "is not a boolean: " + cut(*it));
    return it->get<bool>();
  }
  // A string field that must be absent, null or "".
  void empty_string(const json& o, const char* key, const std::string& field) const {
    auto it = o.find(key);
    if (it == o.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty())) return;
    fail(field + "." + key, "is " + cut(*it) + ": only byte-level BPE without prefixes or suffixes is supported");
  }
};

void parse_normalizer(const Parser& p, const json& n, const std::string& field, ByteBpeModel& m) {
  if (n.is_null()) return;
  const std::string t = p.type_of(n, field);
  if (t == "NFC") {
    m.nfc = true;
  } else if (t == "Sequence") {
    const json& list = p.member(n, "normalizers", field);
    if (!list.is_array()) p.fail(field + ".normalizers", "is not an array");
    for (size_t i = 0; i < list.size(); i++) parse_normalizer(p, list[i], field + ".normalizers[" + std::to_string(i) + "]", m);
  } else {
    p.fail(field + ".type", "is \"" + t + "\": the supported normalizers are none and NFC");
  }
}

void parse_pre_tokenizer(const Parser& p, const json& t, const std::string& field, ByteBpeModel& m) {
  const std::string type = p.type_of(t, field);
  if (!m.steps.empty() && m.steps.back().kind == StepKind::bytelevel)
    p.fail(field, "comes after the ByteLevel step: byte-level must be the last pre-tokenizer");
  if (type == "Sequence") {
    const json& list = p.member(t, "pretokenizers", field);
    if (!list.is_array()) p.fail(field + ".pretokenizers", "is not an array");
    for (size_t i = 0; i < list.size(); i++)
      parse_pre_tokenizer(p, list[i], field + ".pretokenizers[" + std::to_string(i) + "]", m);
  } else if (type == "ByteLevel") {
    Step s{StepKind::bytelevel, nullptr, p.flag(t, "add_prefix_space", field, true), "ByteLevel"};
    if (p.flag(t, "use_regex", field, true)) s.re = compile(gpt2_pattern, false, "GPT-2's pattern"), s.source += " use_regex";
    if (s.add_prefix_space) s.source += " add_prefix_space";
    m.steps.push_back(std::move(s));
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
    m.steps.push_back({StepKind::split, compile(pattern, literal, p.what + ": " + field + ".pattern"), false,
                       std::string(literal ? "Split String " : "Split Regex ") + pattern});
  } else if (type == "Digits") {
    const bool each = p.flag(t, "individual_digits", field, false);
    m.steps.push_back({StepKind::split, compile(each ? R"(\p{N})" : R"(\p{N}+)", false, "the digits pattern"), false,
                       each ? "Digits individual" : "Digits"});
  } else {
    p.fail(field + ".type", "is \"" + type + "\": byte-level BPE needs Split, Digits and ByteLevel pre-tokenizers");
  }
}

int32_t id_value(const Parser& p, const json& v, const std::string& field) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX - 1)
    p.fail(field, "is not an id in [0, 2^31 - 1): " + p.cut(v));
  return static_cast<int32_t>(v.get<int64_t>());
}

void parse_model(const Parser& p, const json& mo, ByteBpeModel& m) {
  if (!mo.is_object()) p.fail("model", "is not an object");
  auto ty = mo.find("type");
  if (ty != mo.end() && !(ty->is_string() && ty->get<std::string>() == "BPE"))
    p.fail("model.type", "is " + p.cut(*ty) + ", expected \"BPE\"");
  if (auto d = mo.find("dropout"); d != mo.end() && !d->is_null() && !(d->is_number() && d->get<double>() == 0))
    p.fail("model.dropout", "is " + p.cut(*d) + ": BPE dropout is for training, not supported");
  if (p.flag(mo, "byte_fallback", "model", false))
    p.fail("model.byte_fallback", "is true: that is sentencepiece-style BPE, not byte-level");
  p.empty_string(mo, "continuing_subword_prefix", "model");
  p.empty_string(mo, "end_of_word_suffix", "model");
  m.ignore_merges = p.flag(mo, "ignore_merges", "model", false);
  const json& vocab = p.member(mo, "vocab", "model");
  if (!vocab.is_object()) p.fail("model.vocab", "is not an object");
  std::vector<int8_t> seen;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = id_value(p, it.value(), "model.vocab[" + json(it.key()).dump() + "]");
    if (id >= static_cast<int64_t>(vocab.size()) + (1 << 20))
      p.fail("model.vocab[" + json(it.key()).dump() + "]", "is " + std::to_string(id) + ", far beyond the vocabulary's size");
    if (static_cast<size_t>(id) >= m.pieces.size()) {
      m.pieces.resize(id + 1);
      seen.resize(id + 1, 0);
    }
    if (seen[id]) p.fail("model.vocab", "gives id " + std::to_string(id) + " to two tokens");
    seen[id] = 1;
    m.pieces[id] = it.key();
    m.vocab.emplace(it.key(), id);
  }
  if (m.pieces.empty()) p.fail("model.vocab", "is empty");
  const auto chars = byte_to_char();
  for (int b = 0; b < 256; b++) {
    std::string s;
    utf8_append(s, chars[b]);
    auto it = m.vocab.find(s);
    if (it == m.vocab.end())
      p.fail("model.vocab", "lacks the byte-level token for byte " + std::to_string(b) + " (\"" + s + "\"): not a byte-level vocabulary");
    m.byte_id[b] = it->second;
    m.byte_spelling[b] = s;
  }
  const json& merges = p.member(mo, "merges", "model");
  if (!merges.is_array()) p.fail("model.merges", "is not an array");
  m.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); r++) {
    const json& e = merges[r];
    const std::string field = "model.merges[" + std::to_string(r) + "]";
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        p.fail(field, "is " + p.cut(e) + ", not two tokens separated by one space");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    } else {
      p.fail(field, "is " + p.cut(e) + ", not \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = m.vocab.find(a), ib = m.vocab.find(b), iab = m.vocab.find(a + b);
    if (ia == m.vocab.end() || ib == m.vocab.end() || iab == m.vocab.end())
      p.fail(field, "(" + p.cut(e) + ") names a token not in model.vocab");
    const uint64_t key = uint64_t(uint32_t(ia->second)) << 32 | uint32_t(ib->second);
    m.merges[key] = {static_cast<int32_t>(r), iab->second};  // a repeated pair: the later rank, as Hugging Face's map keeps
    m.merge_list.emplace_back(ia->second, ib->second);
  }
}

void parse_added(const Parser& p, const json& list, ByteBpeModel& m) {
  if (list.is_null()) return;
  if (!list.is_array()) p.fail("added_tokens", "is not an array");
  for (size_t i = 0; i < list.size(); i++) {
    const json& a = list[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object()) p.fail(field, "is not an object");
    const int32_t id = id_value(p, p.member(a, "id", field), field + ".id");
    const json& c = p.member(a, "content", field);
    if (!c.is_string() || c.get<std::string>().empty()) p.fail(field + ".content", "is not a non-empty string");
    const std::string content = c.get<std::string>();
    for (const char* k : {"single_word", "lstrip", "rstrip"})
      if (p.flag(a, k, field, false)) p.fail(field + "." + k, "is true: only added tokens matched as they are are supported");
    if (auto v = m.vocab.find(content); v != m.vocab.end() && v->second != id)
      p.fail(field, "gives " + json(content).dump() + " id " + std::to_string(id) + " but model.vocab gives it " + std::to_string(v->second));
    if (id >= static_cast<int64_t>(m.pieces.size()) + (1 << 20)) p.fail(field + ".id", "is far beyond the vocabulary's size");
    if (static_cast<size_t>(id) >= m.pieces.size()) m.pieces.resize(id + 1);
    if (!m.pieces[id].empty() && m.pieces[id] != content)
      p.fail(field + ".id", "is " + std::to_string(id) + ", already the id of " + json(m.pieces[id]).dump());
    m.pieces[id] = content;
    if (m.added_kind.size() < m.pieces.size()) m.added_kind.resize(m.pieces.size(), 0);
    m.added_kind[id] = p.flag(a, "special", field, false) ? 2 : 1;
    for (const Added& o : m.added)
      if (o.content == content) p.fail(field + ".content", "repeats " + json(content).dump());
    m.added.push_back({content, id});
  }
}

// The bytes a token decodes to: each character through the byte map, or, when one is not a
// byte character, the token's own UTF-8 (Hugging Face's ByteLevel decoder).
std::string decoded_bytes(const std::string& piece, const std::unordered_map<char32_t, uint8_t>& char_byte) {
  std::string out;
  std::vector<char32_t> cps;
  try {
    cps = utf8_decode(piece);
  } catch (const Error&) {
    return piece;
  }
  for (char32_t c : cps) {
    auto it = char_byte.find(c);
    if (it == char_byte.end()) return piece;
    out += static_cast<char>(it->second);
  }
  return out;
}

int32_t resolve(const Parser& p, const ByteBpeModel& m, const std::string& token, const char* role) {
  if (token.empty()) return -1;
  for (const Added& a : m.added)
    if (a.content == token) return a.id;
  auto it = m.vocab.find(token);
  if (it == m.vocab.end()) p.fail(std::string("the ") + role + " token", json(token).dump() + " is neither an added token nor in model.vocab");
  return it->second;
}

void build(ByteBpeModel& m, const json& j, const std::string& what, const std::string& bos, const std::string& eos) {
  const Parser p{what};
  if (!j.is_object()) p.fail("the file", "is not a JSON object");
  parse_model(p, p.member(j, "model", "tokenizer"), m);
  parse_added(p, j.contains("added_tokens") ? j["added_tokens"] : json(nullptr), m);
  m.added_kind.resize(m.pieces.size(), 0);
  for (size_t id = 0; id < m.pieces.size(); id++)
    if (m.pieces[id].empty()) p.fail("the vocabulary", "has no token with id " + std::to_string(id) + " (ids must be dense)");
  parse_normalizer(p, j.contains("normalizer") ? j["normalizer"] : json(nullptr), "normalizer", m);
  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
    p.fail("pre_tokenizer", "is missing: byte-level BPE needs a ByteLevel pre-tokenizer");
  parse_pre_tokenizer(p, j["pre_tokenizer"], "pre_tokenizer", m);
  if (m.steps.empty() || m.steps.back().kind != StepKind::bytelevel)
    p.fail("pre_tokenizer", "has no ByteLevel step: not a byte-level tokenizer");
  if (!j.contains("decoder") || p.type_of(j["decoder"], "decoder") != "ByteLevel")
    p.fail("decoder", "is not ByteLevel: not a byte-level tokenizer");
  std::unordered_map<char32_t, uint8_t> char_byte;
  const auto chars = byte_to_char();
  for (int b = 0; b < 256; b++) char_byte[chars[b]] = static_cast<uint8_t>(b);
  m.bytes.resize(m.pieces.size());
  for (size_t id = 0; id < m.pieces.size(); id++) m.bytes[id] = decoded_bytes(m.pieces[id], char_byte);
  // Longest first: at one position the longest added token wins (leftmost-longest matching).
  std::stable_sort(m.added.begin(), m.added.end(), [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
  m.bos = resolve(p, m, bos, "begin-of-document");
  m.eos = resolve(p, m, eos, "end-of-document");
  m.serial = next_serial.fetch_add(1);
}

// ---- encoding ------------------------------------------------------------------------------------

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

// Splits text[begin, end) at the regex's matches, keeping matches and the text between them.
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

// The merge of the adjacent pair (left, right) as (rank, merged id), or null.
const std::pair<int32_t, int32_t>* merge_of(const ByteBpeModel& m, int32_t left, int32_t right) {
  auto it = m.merges.find(uint64_t(uint32_t(left)) << 32 | uint32_t(right));
  return it == m.merges.end() ? nullptr : &it->second;
}

struct Hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct Eq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

// Merged ids of one pre-token, cached per thread (words repeat: most of a corpus is hits).
struct WordCache {
  uint64_t serial = 0;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, Eq> map;
};

void merge_small(const ByteBpeModel& m, std::vector<int32_t>& syms) {
  // ranks[i]: the rank of pair (i, i+1), or INT_MAX. Each round merges the leftmost lowest rank.
  std::vector<int32_t> ranks(syms.size(), INT_MAX), merged(syms.size(), -1);
  auto look = [&](size_t i) {
    if (i + 1 >= syms.size()) {
      ranks[i] = INT_MAX;
      return;
    }
    const auto* mg = merge_of(m, syms[i], syms[i + 1]);
    ranks[i] = mg ? mg->first : INT_MAX;
    merged[i] = mg ? mg->second : -1;
  };
  for (size_t i = 0; i < syms.size(); i++) look(i);
  while (syms.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < syms.size(); i++)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == INT_MAX) break;
    syms[best] = merged[best];
    syms.erase(syms.begin() + best + 1);
    ranks.erase(ranks.begin() + best + 1);
    merged.erase(merged.begin() + best + 1);
    look(best);
    if (best > 0) look(best - 1);
  }
}

// The same merges in O(n log n) for long pre-tokens (a megabyte of letters is one GPT-2 pre-token).
void merge_large(const ByteBpeModel& m, std::vector<int32_t>& syms) {
  const int n = static_cast<int>(syms.size());
  std::vector<int> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (int i = 0; i < n; i++) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  using Item = std::tuple<int32_t, int, int32_t>;  // rank, position, merged id
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    if (const auto* mg = merge_of(m, syms[i], syms[next[i]])) heap.emplace(mg->first, i, mg->second);
  };
  for (int i = 0; i < n; i++) push(i);
  while (!heap.empty()) {
    const auto [rank, i, id] = heap.top();
    heap.pop();
    if (!alive[i] || next[i] < 0) continue;
    const auto* mg = merge_of(m, syms[i], syms[next[i]]);
    if (!mg || mg->second != id) continue;
    const int j = next[i];
    syms[i] = id;
    alive[j] = 0;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  std::vector<int32_t> out;
  for (int i = 0; i >= 0 && i < n; i = next[i]) out.push_back(syms[i]);
  syms.swap(out);
}

void bpe_word(const ByteBpeModel& m, std::string_view w, std::vector<int32_t>& out) {
  if (m.ignore_merges) {
    std::string spelled;
    for (unsigned char b : w) spelled += m.byte_spelling[b];
    if (auto it = m.vocab.find(spelled); it != m.vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(w.size());
  for (unsigned char b : w) syms.push_back(m.byte_id[b]);
  if (syms.size() <= 64)
    merge_small(m, syms);
  else
    merge_large(m, syms);
  out.insert(out.end(), syms.begin(), syms.end());
}

void encode_words(const ByteBpeModel& m, std::string_view text, std::vector<int32_t>& out) {
  thread_local WordCache cache;
  if (cache.serial != m.serial) {
    cache.map.clear();
    cache.serial = m.serial;
  }
  std::vector<std::string_view> pieces{text}, next;
  std::deque<std::string> owned;  // pre-tokens given a prefix space
  for (const Step& s : m.steps) {
    next.clear();
    for (std::string_view piece : pieces) {
      if (s.kind == StepKind::bytelevel && s.add_prefix_space && !piece.empty() && piece[0] != ' ') {
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
  for (std::string_view w : pieces) {
    if (w.empty()) continue;
    auto it = cache.map.find(w);
    if (it != cache.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      continue;
    }
    const size_t at = out.size();
    bpe_word(m, w, out);
    if (w.size() <= 64) {
      if (cache.map.size() >= (1 << 18)) cache.map.clear();
      cache.map.emplace(std::string(w), std::vector<int32_t>(out.begin() + at, out.end()));
    }
  }
}

std::string nfc(const std::string& s) {
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return s;
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                                          &dst, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) throw Error(ErrorKind::data, std::string("NFC normalization failed: ") + utf8proc_errmsg(n));
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

}  // namespace

ByteBpe::ByteBpe() : m_(std::make_unique<ByteBpeModel>()) {}
ByteBpe::~ByteBpe() = default;

std::shared_ptr<const ByteBpe> ByteBpe::from_json(const std::string& tokenizer_json, const std::string& what,
                                                  const std::string& bos, const std::string& eos) {
  json j;
  try {
    j = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::data, what + ": does not parse as JSON: " + e.what());
  }
  return from_parsed(std::move(j), what, bos, eos);
}

std::shared_ptr<const ByteBpe> ByteBpe::from_parsed(nlohmann::json tokenizer, const std::string& what, const std::string& bos,
                                                    const std::string& eos) {
  std::shared_ptr<ByteBpe> t(new ByteBpe());
  build(*t->m_, tokenizer, what, bos, eos);
  json s;
  s["type"] = "byte_bpe";
  s["bos"] = bos;
  s["eos"] = eos;
  s["tokenizer"] = std::move(tokenizer);
  t->m_->serialized = s.dump();
  return t;
}

std::shared_ptr<const ByteBpe> ByteBpe::deserialize(const std::string& bytes) {
  json s;
  try {
    s = json::parse(bytes);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::data, std::string("byte-level BPE tokenizer does not parse as JSON: ") + e.what());
  }
  if (!s.is_object() || s.value("type", json()) != "byte_bpe" || !s.contains("tokenizer") || !s["bos"].is_string() ||
      !s["eos"].is_string())
    throw Error(ErrorKind::data, "byte-level BPE tokenizer: expected {\"type\":\"byte_bpe\",\"bos\",\"eos\",\"tokenizer\"}");
  const std::string bos = s["bos"], eos = s["eos"];
  return from_parsed(std::move(s["tokenizer"]), "byte-level BPE tokenizer", bos, eos);
}

namespace {

json gpt2_tokenizer(const std::string& vocab_json, const std::string& merges_txt, const std::string& vocab_what,
                    const std::string& merges_what) {
  json vocab;
  try {
    vocab = json::parse(vocab_json);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::data, vocab_what + ": does not parse as JSON: " + e.what());
  }
  if (!vocab.is_object()) throw Error(ErrorKind::data, vocab_what + ": is not a JSON object of token -> id");
  json merges = json::array();
  size_t line_no = 0;
  for (size_t pos = 0; pos < merges_txt.size();) {
    size_t nl = merges_txt.find('\n', pos);
    if (nl == std::string::npos) nl = merges_txt.size();
    std::string line = merges_txt.substr(pos, nl - pos);
    pos = nl + 1;
    line_no++;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    if (utf8_first_invalid(line) != std::string::npos)
      throw Error(ErrorKind::data, merges_what + ": line " + std::to_string(line_no) + " is not valid UTF-8");
    merges.push_back(line);
  }
  json added = json::array();
  if (auto it = vocab.find("<|endoftext|>"); it != vocab.end())
    added.push_back({{"id", *it}, {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", true}, {"special", true}});
  json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return ByteBpe::assemble(std::move(vocab), std::move(merges), std::move(added), bl, false, false);
}

}  // namespace

json ByteBpe::assemble(json vocab, json merges, json added_tokens, json pre_tokenizer, bool nfc, bool ignore_merges) {
  const json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added_tokens)},
          {"normalizer", nfc ? json{{"type", "NFC"}} : json(nullptr)},
          {"pre_tokenizer", std::move(pre_tokenizer)},
          {"post_processor", bl},
          {"decoder", bl},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", ignore_merges},
            {"vocab", std::move(vocab)},
            {"merges", std::move(merges)}}}};
}

std::string ByteBpe::gpt2_tokenizer_json(const std::string& vocab_json, const std::string& merges_txt,
                                         const std::string& vocab_what, const std::string& merges_what) {
  return gpt2_tokenizer(vocab_json, merges_txt, vocab_what, merges_what).dump();
}

std::vector<int32_t> ByteBpe::encode(const std::string& utf8) const {
  utf8_check(utf8);
  const ByteBpeModel& m = *m_;
  const std::string normalized = m.nfc ? nfc(utf8) : std::string();
  const std::string_view text = m.nfc ? std::string_view(normalized) : std::string_view(utf8);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  if (m.added.empty()) {
    encode_words(m, text, out);
    return out;
  }
  // Added tokens first: the leftmost occurrence, the longest at one position.
  std::vector<size_t> at(m.added.size(), 0);
  for (size_t k = 0; k < m.added.size(); k++) at[k] = text.find(m.added[k].content);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best = std::string::npos, best_at = std::string::npos;
    for (size_t k = 0; k < m.added.size(); k++) {
      if (at[k] != std::string::npos && at[k] < pos) at[k] = text.find(m.added[k].content, pos);
      if (at[k] < best_at) best = k, best_at = at[k];  // longest first in m.added: ties keep the longer
    }
    if (best == std::string::npos) {
      encode_words(m, text.substr(pos), out);
      break;
    }
    if (best_at > pos) encode_words(m, text.substr(pos, best_at - pos), out);
    out.push_back(m.added[best].id);
    pos = best_at + m.added[best].content.size();
  }
  return out;
}

const std::string& ByteBpe::token_bytes(int32_t id) const { return m_->bytes.at(static_cast<size_t>(id)); }
int32_t ByteBpe::vocab_size() const { return static_cast<int32_t>(m_->pieces.size()); }
int32_t ByteBpe::bos_id() const { return m_->bos; }
int32_t ByteBpe::eos_id() const { return m_->eos; }
const std::string& ByteBpe::piece(int32_t id) const { return m_->pieces.at(static_cast<size_t>(id)); }
bool ByteBpe::is_special(int32_t id) const { return m_->added_kind.at(static_cast<size_t>(id)) == 2; }
bool ByteBpe::is_added(int32_t id) const { return m_->added_kind.at(static_cast<size_t>(id)) != 0; }
const std::string& ByteBpe::serialized() const { return m_->serialized; }
std::vector<std::string> ByteBpe::merges() const {
  std::vector<std::string> out;
  out.reserve(m_->merge_list.size());
  for (const auto& [a, b] : m_->merge_list) out.push_back(m_->pieces[a] + " " + m_->pieces[b]);
  return out;
}

std::string ByteBpe::pre_tokenizer() const {
  std::string out;
  for (const Step& s : m_->steps) out += (out.empty() ? "" : " | ") + s.source;
  return out;
}

std::string ByteBpe::describe_pre_tokenizer(const nlohmann::json& pre_tokenizer) {
  ByteBpeModel m;
  parse_pre_tokenizer(Parser{"pre-tokenizer"}, pre_tokenizer, "pre_tokenizer", m);
  std::string out;
  for (const Step& s : m.steps) out += (out.empty() ? "" : " | ") + s.source;
  return out;
}

std::string ByteBpe::tokenizer_json() const { return json::parse(m_->serialized)["tokenizer"].dump(); }

std::string utf8_repair(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = u(i);
    if (b < 0x80) {
      out += static_cast<char>(b);
      i++;
      continue;
    }
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (excludes overlongs and surrogates)
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b >= 0xE0 && b <= 0xEF) len = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) len = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;
    if (len > 0) {
      for (; k < static_cast<size_t>(len) && i + k < s.size(); k++) {
        const unsigned char c = u(i + k);
        if (k == 1 ? (c < lo || c > hi) : (c & 0xC0) != 0x80) break;
      }
      if (k == static_cast<size_t>(len)) {
        out.append(s, i, len);
        i += len;
        continue;
      }
    }
    out += "\xEF\xBF\xBD";  // U+FFFD for the maximal invalid subpart s[i, i + k)
    i += k;
  }
  return out;
}

namespace {

// A JSON file beside a tokenizer, or null when absent; hostile like the rest.
json sibling_json(const std::filesystem::path& p, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) return json();
  require_regular_file(p.string(), what);
  if (std::filesystem::file_size(p, ec) > (64u << 20)) throw Error(ErrorKind::data, what + " " + p.string() + ": larger than 64 MiB");
  try {
    return json::parse(read_file_bytes(p.string(), what));
  } catch (const json::exception& e) {
    throw Error(ErrorKind::data, what + " " + p.string() + ": does not parse as JSON: " + e.what());
  }
}

// tokenizer_config.json's bos_token / eos_token: a string, {"content": ...}, or null.
bool config_token(const json& cfg, const char* key, const std::string& where, std::string& out) {
  if (!cfg.is_object() || !cfg.contains(key)) return false;
  const json& v = cfg[key];
  if (v.is_null()) out.clear();
  else if (v.is_string()) out = v.get<std::string>();
  else if (v.is_object() && v.contains("content") && v["content"].is_string()) out = v["content"].get<std::string>();
  else throw Error(ErrorKind::data, where + ": " + key + " is not a string, {\"content\": ...} or null: " + v.dump().substr(0, 60));
  return true;
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  namespace fs = std::filesystem;
  require_regular_file(path, "tokenizer file");
  std::error_code ec;
  if (fs::file_size(path, ec) > (1ull << 30)) throw Error(ErrorKind::data, "tokenizer file " + path + ": larger than 1 GiB");
  const std::string bytes = read_file_bytes(path, "tokenizer file");
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || (bytes[first] != '{' && bytes[first] != '[')) {
    try {
      return from_sentencepiece(bytes);
    } catch (const Error& e) {
      throw Error(ErrorKind::data, "tokenizer file " + path + ": is not JSON (a tokenizer.json or vocab.json) and " + e.what());
    }
  }
  const fs::path dir = fs::path(path).parent_path();
  json probe;
  try {
    probe = json::parse(bytes);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::data, "tokenizer file " + path + ": does not parse as JSON: " + e.what());
  }
  if (!probe.is_object()) throw Error(ErrorKind::data, "tokenizer file " + path + ": is not a JSON object");
  if (!probe.contains("model") || !probe["model"].is_object()) {  // GPT-2's vocab.json: merges.txt beside it
    const fs::path merges = dir / "merges.txt";
    if (!fs::exists(merges, ec))
      throw Error(ErrorKind::data, "tokenizer file " + path + ": has no \"model\" (not a tokenizer.json) and no merges.txt beside it (not GPT-2's vocab.json)");
    probe = gpt2_tokenizer(bytes, read_file_bytes(merges.string(), "merges file"), "vocab file " + path,
                           "merges file " + merges.string());
  }
  // BOS/EOS: tokenizer_config.json, then config.json's ids, then GPT-2's <|endoftext|>.
  std::string bos, eos, unresolved;
  bool have_bos = false, have_eos = false;
  const fs::path tc_path = dir / "tokenizer_config.json";
  const json tc = sibling_json(tc_path, "tokenizer config");
  have_bos = config_token(tc, "bos_token", tc_path.string(), bos);
  have_eos = config_token(tc, "eos_token", tc_path.string(), eos);
  if (!have_bos || !have_eos) {
    const fs::path c_path = dir / "config.json";
    const json c = sibling_json(c_path, "model config");
    // Ids name tokens through the vocabulary and the added tokens.
    auto token_of = [&](const char* key, std::string& out) {
      if (!c.is_object() || !c.contains(key) || c[key].is_null()) return false;
      if (!c[key].is_number_integer())
        throw Error(ErrorKind::data, "model config " + c_path.string() + ": " + key + " is not an integer: " + c[key].dump().substr(0, 60));
      const int64_t id = c[key].get<int64_t>();
      if (probe.contains("added_tokens") && probe["added_tokens"].is_array())
        for (const json& a : probe["added_tokens"])
          if (a.is_object() && a.value("id", json()) == id && a.contains("content") && a["content"].is_string()) {
            out = a["content"].get<std::string>();
            return true;
          }
      if (probe.contains("model") && probe["model"].is_object() && probe["model"].contains("vocab") && probe["model"]["vocab"].is_object())
        for (auto it = probe["model"]["vocab"].begin(); it != probe["model"]["vocab"].end(); ++it)
          if (it.value() == id) {
            out = it.key();
            return true;
          }
      // Reported once the tokenizer itself has passed its checks: a broken tokenizer.json is named first.
      unresolved = "model config " + c_path.string() + ": " + key + " " + std::to_string(id) + " is not a token of " + path;
      return true;
    };
    if (!have_bos) have_bos = token_of("bos_token_id", bos);
    if (!have_eos) have_eos = token_of("eos_token_id", eos);
  }
  bool has_eot = false;
  if (probe["model"].contains("vocab") && probe["model"]["vocab"].is_object()) has_eot = probe["model"]["vocab"].contains("<|endoftext|>");
  if (probe.contains("added_tokens") && probe["added_tokens"].is_array())
    for (const json& a : probe["added_tokens"]) has_eot = has_eot || (a.is_object() && a.value("content", json()) == "<|endoftext|>");
  if (!have_bos && has_eot) bos = "<|endoftext|>";
  if (!have_eos && has_eot) eos = "<|endoftext|>";
  if (bos.empty()) bos = eos;  // no BOS: the previous document's EOS starts each document
  Tokenizer t = from_byte_bpe(ByteBpe::from_parsed(std::move(probe), "tokenizer file " + path, bos, eos));
  if (!unresolved.empty()) throw Error(ErrorKind::data, unresolved);
  return t;
}

}  // namespace tapelm
