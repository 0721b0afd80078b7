#include "data/tokenizer/bytebpe/byte_bpe.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utf8proc.h>

#include "data/tokenizer/bytebpe/bpe.h"
#include "data/tokenizer/bytebpe/byte_level.h"
#include "data/tokenizer/bytebpe/normalizer.h"
#include "data/tokenizer/bytebpe/pre_tokenizer.h"
#include "data/tokenizer/utf8.h"

namespace tapelm {

namespace bytebpe {

struct Added {
  std::string content;  // as matched: a normalized token's content normalized
  int32_t id;
};

struct Pipeline {
  std::string serialized;
  Normalizer normalizer;
  // Added tokens, longest first (at one position the longest wins): those matched in the text as
  // given, and those ("normalized": true) matched in each normalized piece between them.
  std::vector<Added> added, added_normalized;
  std::vector<uint8_t> added_kind;  // id -> 0 vocabulary token, 1 added token, 2 added special token, 3 no token
  PreTokenizer pre;
  Bpe bpe;
  std::vector<std::string> bytes;  // id -> what it decodes to
  int32_t bos = -1, eos = -1;
  size_t strip_spaces = 0;  // byte fallback: spaces the decoder's Strip drops where a document starts
  std::vector<uint8_t> byte_token;  // byte fallback: id -> 1 for a token ByteFallback decodes to one byte
};

namespace {

void parse_added(const Parser& p, const json& list, Pipeline& m) {
  if (list.is_null()) return;
  if (!list.is_array()) p.fail("added_tokens", "is not an array");
  for (size_t i = 0; i < list.size(); i++) {
    const json& a = list[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object()) p.fail(field, "is not an object");
    const int32_t id = p.id(p.member(a, "id", field), field + ".id");
    const json& c = p.member(a, "content", field);
    if (!c.is_string() || c.get<std::string>().empty()) p.fail(field + ".content", "is not a non-empty string");
    const std::string content = c.get<std::string>();
    for (const char* k : {"single_word", "lstrip", "rstrip"})
      if (p.flag(a, k, field, false)) p.fail(field + "." + k, "is true: only added tokens matched as they are are supported");
    if (const int32_t v = m.bpe.id_of(content); v >= 0 && v != id)
      p.fail(field, "gives " + json(content).dump() + " id " + std::to_string(id) + " but model.vocab gives it " + std::to_string(v));
    if (id >= static_cast<int64_t>(m.bpe.pieces().size()) + (1 << 20)) p.fail(field + ".id", "is far beyond the vocabulary's size");
    if (static_cast<size_t>(id) >= m.bpe.pieces().size()) m.bpe.pieces().resize(id + 1);
    if (!m.bpe.pieces()[id].empty() && m.bpe.pieces()[id] != content)
      p.fail(field + ".id", "is " + std::to_string(id) + ", already the id of " + json(m.bpe.pieces()[id]).dump());
    m.bpe.pieces()[id] = content;
    if (m.added_kind.size() < m.bpe.pieces().size()) m.added_kind.resize(m.bpe.pieces().size(), 0);
    m.added_kind[id] = p.flag(a, "special", field, false) ? 2 : 1;
    for (const auto* list : {&m.added, &m.added_normalized})
      for (const Added& o : *list)
        if (m.bpe.pieces()[o.id] == content) p.fail(field + ".content", "repeats " + json(content).dump());
    (p.flag(a, "normalized", field, false) ? m.added_normalized : m.added).push_back({content, id});
  }
}

int32_t resolve(const Parser& p, const Pipeline& m, const std::string& token, const char* role) {
  if (token.empty()) return -1;
  for (const auto* list : {&m.added, &m.added_normalized})
    for (const Added& a : *list)
      if (m.bpe.pieces()[a.id] == token) return a.id;
  const int32_t id = m.bpe.id_of(token);
  if (id < 0) p.fail(std::string("the ") + role + " token", json(token).dump() + " is neither an added token nor in model.vocab");
  return id;
}

// The decoder of a byte_fallback file, as Llama 2's and Gemma's spell it: Replace steps of a
// string (the "▁" for a space), ByteFallback (an <0xAB> token is its byte), Fuse, and a Strip of
// leading spaces, in that order. Sets each id's bytes and the spaces stripped where a document
// starts. A normalized added token decodes from its normalized content, as the library's does.
void fallback_decoder(const Parser& p, const json& d, Pipeline& m) {
  if (d.is_null()) p.fail("decoder", "is missing: a byte_fallback tokenizer needs ByteFallback in its decoder");
  std::vector<json> steps;
  std::string field = "decoder";
  if (p.type_of(d, "decoder") == "Sequence") {
    const json& list = p.member(d, "decoders", "decoder");
    if (!list.is_array()) p.fail("decoder.decoders", "is not an array");
    steps.assign(list.begin(), list.end());
    field = "decoder.decoders";
  } else {
    steps.push_back(d);
  }
  std::vector<std::pair<std::string, std::string>> replaces;
  bool byte_fallback = false, fused = false, stripped = false;
  for (size_t i = 0; i < steps.size(); i++) {
    const std::string f = field + (field == "decoder" ? "" : "[" + std::to_string(i) + "]");
    const std::string t = p.type_of(steps[i], f);
    const char* order = "comes out of order: tapelm runs Replace, ByteFallback, Fuse, Strip in that order";
    if (t == "Replace") {
      if (byte_fallback) p.fail(f, order);
      const json& pat = p.member(steps[i], "pattern", f);
      const json& c = p.member(steps[i], "content", f);
      if (!pat.is_object() || !pat.contains("String") || !pat["String"].is_string() || pat["String"].get<std::string>().empty())
        p.fail(f + ".pattern", "is " + p.cut(pat) + ": only a non-empty {\"String\": ...} pattern is supported");
      if (!c.is_string()) p.fail(f + ".content", "is not a string: " + p.cut(c));
      replaces.emplace_back(pat["String"].get<std::string>(), c.get<std::string>());
    } else if (t == "ByteFallback") {
      if (byte_fallback) p.fail(f, order);
      byte_fallback = true;
    } else if (t == "Fuse") {
      if (!byte_fallback || fused || stripped) p.fail(f, order);
      fused = true;
    } else if (t == "Strip") {
      if (!byte_fallback || stripped) p.fail(f, order);
      const json& c = p.member(steps[i], "content", f);
      const json& start = p.member(steps[i], "start", f);
      const json& stop = p.member(steps[i], "stop", f);
      if (c != " ") p.fail(f + ".content", "is " + p.cut(c) + ": only \" \" is supported");
      if (!start.is_number_unsigned() || start.get<uint64_t>() > 64) p.fail(f + ".start", "is not a count up to 64: " + p.cut(start));
      if (stop != 0) p.fail(f + ".stop", "is " + p.cut(stop) + ": only 0 is supported");
      // Before Fuse it would strip every token; after, the text's start.
      if (!fused && start.get<uint64_t>() > 0) p.fail(f, "comes before Fuse: it would strip every token's spaces, which tapelm does not run");
      m.strip_spaces = start.get<uint64_t>();
      stripped = true;
    } else {
      p.fail(f + ".type", "is \"" + t + "\": a byte_fallback tokenizer's decoder may hold Replace, ByteFallback, Fuse and Strip");
    }
  }
  if (!byte_fallback) p.fail("decoder", "has no ByteFallback step: the <0xAB> tokens would decode as their spelling");
  std::vector<std::string> spelled = m.bpe.pieces();
  for (const Added& a : m.added_normalized) spelled[a.id] = a.content;
  m.bytes.resize(spelled.size());
  for (size_t id = 0; id < spelled.size(); id++) {
    std::string t = spelled[id];
    for (const auto& [a, b] : replaces) t = replace_all(t, a, b);
    // Hugging Face's ByteFallback: a token of six bytes "<0x" two hex digits ">" is that byte
    auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex(t[3]) && hex(t[4])) {
      t = std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
      if (m.byte_token.size() < spelled.size()) m.byte_token.resize(spelled.size(), 0);
      m.byte_token[id] = 1;
    }
    m.bytes[id] = std::move(t);
  }
}

std::vector<Added> normalized_contents(const std::vector<Added>& added, const Normalizer& n) {
  std::vector<Added> out;
  for (const Added& a : added) {
    std::string c = n.active() ? n.apply(a.content) : a.content;
    if (!c.empty()) out.push_back({std::move(c), a.id});
  }
  return out;
}

}  // namespace

void build(Pipeline& m, const json& j, const std::string& what, const std::string& bos, const std::string& eos) {
  const Parser p{what};
  if (!j.is_object()) p.fail("the file", "is not a JSON object");
  m.bpe = Bpe::parse(p, p.member(j, "model", "tokenizer"));
  parse_added(p, j.contains("added_tokens") ? j["added_tokens"] : json(nullptr), m);
  std::vector<std::string>& pieces = m.bpe.pieces();
  m.added_kind.resize(pieces.size(), 0);
  // An id with no token (the tiktoken conversions have a few below their special tokens) is
  // never produced and decodes to nothing, as in Hugging Face's library.
  for (size_t id = 0; id < pieces.size(); id++)
    if (pieces[id].empty()) m.added_kind[id] = 3;
  m.normalizer = Normalizer::parse(p, j.contains("normalizer") ? j["normalizer"] : json(nullptr), "normalizer");
  const bool byte_level = !m.bpe.byte_fallback();
  m.pre = PreTokenizer::parse(p, j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(nullptr), "pre_tokenizer", byte_level);
  m.added_normalized = normalized_contents(m.added_normalized, m.normalizer);
  if (byte_level) {
    if (!j.contains("decoder") || p.type_of(j["decoder"], "decoder") != "ByteLevel")
      p.fail("decoder", "is not ByteLevel: not a byte-level tokenizer (and model.byte_fallback is false)");
    m.bytes.resize(pieces.size());
    for (size_t id = 0; id < pieces.size(); id++) m.bytes[id] = decoded_bytes(pieces[id]);
  } else {
    fallback_decoder(p, j.contains("decoder") ? j["decoder"] : json(nullptr), m);
  }
  for (auto* list : {&m.added, &m.added_normalized})
    std::stable_sort(list->begin(), list->end(), [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
  m.bos = resolve(p, m, bos, "begin-of-document");
  m.eos = resolve(p, m, eos, "end-of-document");
}

namespace {

// The ids of text without added tokens: pre-tokens, each merged. at_start: text begins the whole.
void encode_words(const Pipeline& m, std::string_view text, std::vector<int32_t>& out, bool at_start) {
  std::vector<std::string_view> words;
  std::deque<std::string> owned;  // pre-tokens given a prefix space
  m.pre.split(text, words, owned, at_start);
  for (std::string_view w : words) m.bpe.encode_word(w, out);
}

// Calls gap(from, to) for the text between the added tokens' occurrences and token(id) for each:
// the leftmost occurrence, the longest at one position (Hugging Face's leftmost-longest match).
template <class Gap, class Token>
void split_added(const std::vector<Added>& added, std::string_view text, Gap gap, Token token) {
  if (added.empty()) {
    if (!text.empty()) gap(size_t{0}, text.size());
    return;
  }
  std::vector<size_t> at(added.size(), 0);
  for (size_t k = 0; k < added.size(); k++) at[k] = text.find(added[k].content);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best = std::string::npos, best_at = std::string::npos;
    for (size_t k = 0; k < added.size(); k++) {
      if (at[k] != std::string::npos && at[k] < pos) at[k] = text.find(added[k].content, pos);
      if (at[k] < best_at) best = k, best_at = at[k];  // longest first in the list: ties keep the longer
    }
    if (best == std::string::npos) {
      gap(pos, text.size());
      break;
    }
    if (best_at > pos) gap(pos, best_at);
    token(added[best].id);
    pos = best_at + added[best].content.size();
  }
}

}  // namespace

}  // namespace bytebpe

using bytebpe::json;
using bytebpe::Pipeline;

ByteBpe::ByteBpe() : m_(std::make_unique<Pipeline>()) {}
ByteBpe::~ByteBpe() = default;

std::shared_ptr<const ByteBpe> ByteBpe::from_json(const std::string& tokenizer_json, const std::string& what,
                                                  const std::string& bos, const std::string& eos) {
  return from_parsed(bytebpe::parse_json(tokenizer_json, what), what, bos, eos);
}

std::shared_ptr<const ByteBpe> ByteBpe::from_parsed(nlohmann::json tokenizer, const std::string& what, const std::string& bos,
                                                    const std::string& eos) {
  std::shared_ptr<ByteBpe> t(new ByteBpe());
  bytebpe::build(*t->m_, tokenizer, what, bos, eos);
  json s;
  s["type"] = to_string(t->kind());
  s["bos"] = bos;
  s["eos"] = eos;
  s["tokenizer"] = std::move(tokenizer);
  t->m_->serialized = s.dump();
  return t;
}

std::shared_ptr<const ByteBpe> ByteBpe::deserialize(const std::string& bytes) {
  json s = bytebpe::parse_json(bytes, "byte-level BPE tokenizer");
  const json type = s.is_object() ? s.value("type", json()) : json();
  if (!s.is_object() || (type != "byte_bpe" && type != "fallback_bpe") || !s.contains("tokenizer") || !s["bos"].is_string() ||
      !s["eos"].is_string())
    throw Error(ErrorKind::data, "BPE tokenizer: expected {\"type\":\"byte_bpe\" or \"fallback_bpe\",\"bos\",\"eos\",\"tokenizer\"}");
  const std::string bos = s["bos"], eos = s["eos"];
  auto t = from_parsed(std::move(s["tokenizer"]), type == "byte_bpe" ? "byte-level BPE tokenizer" : "byte-fallback BPE tokenizer", bos, eos);
  if (to_string(t->kind()) != type.get<std::string>())
    throw Error(ErrorKind::data, "BPE tokenizer: stored as " + type.get<std::string>() + " but its tokenizer.json is " + to_string(t->kind()));
  return t;
}

json ByteBpe::gpt2_tokenizer(const std::string& vocab_json, const std::string& merges_txt, const std::string& vocab_what,
                             const std::string& merges_what) {
  json vocab = bytebpe::parse_json(vocab_json, vocab_what);
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

std::vector<int32_t> ByteBpe::encode(const std::string& utf8) const {
  utf8_check(utf8);
  const bytebpe::Pipeline& m = *m_;
  std::vector<int32_t> out;
  out.reserve(utf8.size() / 3 + 1);
  auto push = [&](int32_t id) { out.push_back(id); };
  // As Hugging Face's AddedVocabulary::extract_and_normalize: the added tokens matched as they
  // are, in the text as given; each piece between them normalized on its own (Llama 2's Prepend
  // gives every piece its "▁"); the normalized added tokens matched in that; the rest pre-tokenized.
  const std::string_view text(utf8);
  bytebpe::split_added(m.added, text, [&](size_t from, size_t to) {
    const std::string_view raw = text.substr(from, to - from);
    std::string normalized;
    if (m.normalizer.active()) normalized = m.normalizer.apply(std::string(raw));
    const std::string_view piece = m.normalizer.active() ? std::string_view(normalized) : raw;
    bytebpe::split_added(m.added_normalized, piece, [&](size_t a, size_t b) {
      bytebpe::encode_words(m, piece.substr(a, b - a), out, from == 0 && a == 0);
    }, push);
  }, push);
  return out;
}

namespace {

// The decoder's Strip: up to n spaces dropped where a document starts.
void strip_start(std::string& s, size_t n) {
  size_t k = 0;
  while (k < n && k < s.size() && s[k] == ' ') k++;
  s.erase(0, k);
}

}  // namespace

std::string ByteBpe::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  if (m_->bpe.byte_fallback()) {
    // Hugging Face's ByteFallback: a run of byte tokens that is not valid UTF-8 as a whole is one
    // U+FFFD per token; every other token is text already.
    std::string run;
    size_t run_tokens = 0;
    auto flush = [&] {
      if (utf8_first_invalid(run) == std::string::npos) bytes += run;
      else
        for (size_t k = 0; k < run_tokens; k++) bytes += "\xEF\xBF\xBD";
      run.clear(), run_tokens = 0;
    };
    for (int32_t id : ids) {
      if (id == m_->bos || id == m_->eos) continue;
      const size_t i = static_cast<size_t>(id);
      if (i < m_->byte_token.size() && m_->byte_token[i]) {
        run += m_->bytes[i], run_tokens++;
        continue;
      }
      flush();
      bytes += m_->bytes[i];
    }
    flush();
    strip_start(bytes, m_->strip_spaces);
    return bytes;
  }
  for (int32_t id : ids)
    if (id != m_->bos && id != m_->eos) bytes += m_->bytes[static_cast<size_t>(id)];
  return utf8_repair(bytes);
}

std::string ByteBpe::decode_next(int32_t prev, int32_t id) const {
  if (id == m_->bos || id == m_->eos) return std::string();
  std::string s = m_->bytes[static_cast<size_t>(id)];
  if (prev < 0 || prev == m_->bos) strip_start(s, m_->strip_spaces);
  return s;
}

TokenizerKind ByteBpe::kind() const { return m_->bpe.byte_fallback() ? TokenizerKind::fallback_bpe : TokenizerKind::byte_bpe; }

bool ByteBpe::adds_dummy_prefix() const { return m_->bpe.byte_fallback() && (m_->normalizer.prepends() || m_->pre.prepends()); }

PieceKind ByteBpe::piece_kind(int32_t id) const {
  if (m_->added_kind.at(static_cast<size_t>(id)) == 3) return PieceKind::unused;
  if (is_special(id) || id == m_->bos || id == m_->eos) return PieceKind::control;
  if (is_added(id)) return PieceKind::user_defined;
  if (id == m_->bpe.unk_id()) return PieceKind::unknown;
  if (static_cast<size_t>(id) < m_->byte_token.size() && m_->byte_token[static_cast<size_t>(id)]) return PieceKind::byte;
  return PieceKind::normal;
}

const std::string& ByteBpe::token_bytes(int32_t id) const { return m_->bytes.at(static_cast<size_t>(id)); }
int32_t ByteBpe::vocab_size() const { return static_cast<int32_t>(m_->bpe.pieces().size()); }
int32_t ByteBpe::bos_id() const { return m_->bos; }
int32_t ByteBpe::eos_id() const { return m_->eos; }
std::string ByteBpe::piece(int32_t id) const {
  const std::string& s = m_->bpe.pieces().at(static_cast<size_t>(id));
  return s.empty() ? "[PAD" + std::to_string(id) + "]" : s;  // no token: named as llama.cpp's converter names it
}
bool ByteBpe::is_special(int32_t id) const { return m_->added_kind.at(static_cast<size_t>(id)) == 2; }
bool ByteBpe::is_added(int32_t id) const {
  const uint8_t k = m_->added_kind.at(static_cast<size_t>(id));
  return k == 1 || k == 2;
}
const std::string& ByteBpe::serialized() const { return m_->serialized; }

bool ByteBpe::can_cut_before(std::string_view text, size_t i) const {
  // letters of any script on both sides (Russian or Arabic prose was never cut: one thread, and
  // memory growing with the document), each a whole code point inside the text
  // byte fallback: never (as sentencepiece's models); byte-level, when the normalizer leaves spaces be
  if (i == 0 || i + 1 >= text.size() || m_->bpe.byte_fallback() || !m_->normalizer.keeps_spaces()) return false;
  size_t b = i - 1;
  while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) b--;
  utf8proc_int32_t left = -1, right = -1;
  const auto* u = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  if (utf8proc_iterate(u + b, static_cast<utf8proc_ssize_t>(i - b), &left) != static_cast<utf8proc_ssize_t>(i - b) ||
      utf8proc_iterate(u + i + 1, static_cast<utf8proc_ssize_t>(text.size() - i - 1), &right) <= 0)
    return false;
  if (!bytebpe::PreTokenizer::is_letter(static_cast<uint32_t>(left)) || !bytebpe::PreTokenizer::is_letter(static_cast<uint32_t>(right))) return false;
  if (!(text[i] == ' ' ? m_->pre.cuts_at_space() : text[i] == '\n' && m_->pre.cuts_at_newline())) return false;
  // The normalizer (none or NFC) never joins across an ASCII space or newline; an added token
  // may: no occurrence may start before i and end after it, and the text must show every byte
  // such an occurrence could cover (each list is longest first). A normalized token is matched
  // in NFC text, which around ASCII is the text itself.
  for (const auto* list : {&m_->added, &m_->added_normalized}) {
    const size_t longest = list->empty() ? 0 : list->front().content.size();
    if (longest > 1 && (i + 1 < longest || i + longest > text.size() + 1)) return false;
    for (const bytebpe::Added& a : *list) {
      const size_t n = a.content.size();
      const size_t from = i >= n ? i - n + 1 : 0;
      const size_t to = std::min(i + n - 1, text.size());
      if (n > 1 && to > from && text.substr(from, to - from).find(a.content) != std::string_view::npos) return false;
    }
  }
  return true;
}
std::vector<std::string> ByteBpe::merges() const { return m_->bpe.merges(); }
std::string ByteBpe::pre_tokenizer() const { return m_->pre.describe(); }

std::string ByteBpe::describe_pre_tokenizer(const nlohmann::json& pre_tokenizer) {
  return bytebpe::PreTokenizer::parse(bytebpe::Parser{"pre-tokenizer"}, pre_tokenizer, "pre_tokenizer").describe();
}

std::string ByteBpe::tokenizer_json() const { return json::parse(m_->serialized)["tokenizer"].dump(); }

}  // namespace tapelm
