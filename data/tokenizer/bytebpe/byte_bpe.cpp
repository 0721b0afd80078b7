#include "data/tokenizer/bytebpe/byte_bpe.h"

#include <algorithm>
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
  std::string content;
  int32_t id;
};

struct Pipeline {
  std::string serialized;
  Normalizer normalizer;
  std::vector<Added> added;         // longest first: at one position the longest wins
  std::vector<uint8_t> added_kind;  // id -> 0 vocabulary token, 1 added token, 2 added special token, 3 no token
  PreTokenizer pre;
  Bpe bpe;
  std::vector<std::string> bytes;  // id -> what it decodes to
  int32_t bos = -1, eos = -1;
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
    for (const Added& o : m.added)
      if (o.content == content) p.fail(field + ".content", "repeats " + json(content).dump());
    m.added.push_back({content, id});
  }
}

int32_t resolve(const Parser& p, const Pipeline& m, const std::string& token, const char* role) {
  if (token.empty()) return -1;
  for (const Added& a : m.added)
    if (a.content == token) return a.id;
  const int32_t id = m.bpe.id_of(token);
  if (id < 0) p.fail(std::string("the ") + role + " token", json(token).dump() + " is neither an added token nor in model.vocab");
  return id;
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
  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
    p.fail("pre_tokenizer", "is missing: byte-level BPE needs a ByteLevel pre-tokenizer");
  m.pre = PreTokenizer::parse(p, j["pre_tokenizer"], "pre_tokenizer");
  if (!j.contains("decoder") || p.type_of(j["decoder"], "decoder") != "ByteLevel")
    p.fail("decoder", "is not ByteLevel: not a byte-level tokenizer");
  m.bytes.resize(pieces.size());
  for (size_t id = 0; id < pieces.size(); id++) m.bytes[id] = decoded_bytes(pieces[id]);
  std::stable_sort(m.added.begin(), m.added.end(), [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
  m.bos = resolve(p, m, bos, "begin-of-document");
  m.eos = resolve(p, m, eos, "end-of-document");
}

namespace {

// The ids of text without added tokens: pre-tokens, each merged.
void encode_words(const Pipeline& m, std::string_view text, std::vector<int32_t>& out) {
  std::vector<std::string_view> words;
  std::deque<std::string> owned;  // pre-tokens given a prefix space
  m.pre.split(text, words, owned);
  for (std::string_view w : words) m.bpe.encode_word(w, out);
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
  s["type"] = "byte_bpe";
  s["bos"] = bos;
  s["eos"] = eos;
  s["tokenizer"] = std::move(tokenizer);
  t->m_->serialized = s.dump();
  return t;
}

std::shared_ptr<const ByteBpe> ByteBpe::deserialize(const std::string& bytes) {
  json s = bytebpe::parse_json(bytes, "byte-level BPE tokenizer");
  if (!s.is_object() || s.value("type", json()) != "byte_bpe" || !s.contains("tokenizer") || !s["bos"].is_string() ||
      !s["eos"].is_string())
    throw Error(ErrorKind::data, "byte-level BPE tokenizer: expected {\"type\":\"byte_bpe\",\"bos\",\"eos\",\"tokenizer\"}");
  const std::string bos = s["bos"], eos = s["eos"];
  return from_parsed(std::move(s["tokenizer"]), "byte-level BPE tokenizer", bos, eos);
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
  const std::string normalized = m.normalizer.active() ? m.normalizer.apply(utf8) : std::string();
  const std::string_view text = m.normalizer.active() ? std::string_view(normalized) : std::string_view(utf8);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  if (m.added.empty()) {
    bytebpe::encode_words(m, text, out);
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
      bytebpe::encode_words(m, text.substr(pos), out);
      break;
    }
    if (best_at > pos) bytebpe::encode_words(m, text.substr(pos, best_at - pos), out);
    out.push_back(m.added[best].id);
    pos = best_at + m.added[best].content.size();
  }
  return out;
}

std::string ByteBpe::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (int32_t id : ids)
    if (id != m_->bos && id != m_->eos) bytes += m_->bytes[static_cast<size_t>(id)];
  return utf8_repair(bytes);
}

std::string ByteBpe::decode_next(int32_t, int32_t id) const {
  return id == m_->bos || id == m_->eos ? std::string() : m_->bytes[static_cast<size_t>(id)];
}

PieceKind ByteBpe::piece_kind(int32_t id) const {
  if (m_->added_kind.at(static_cast<size_t>(id)) == 3) return PieceKind::unused;
  if (is_special(id) || id == m_->bos || id == m_->eos) return PieceKind::control;
  return is_added(id) ? PieceKind::user_defined : PieceKind::normal;
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
  if (i == 0 || i + 1 >= text.size()) return false;
  size_t b = i - 1;
  while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) b--;
  utf8proc_int32_t left = -1, right = -1;
  const auto* u = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  if (utf8proc_iterate(u + b, static_cast<utf8proc_ssize_t>(i - b), &left) != static_cast<utf8proc_ssize_t>(i - b) ||
      utf8proc_iterate(u + i + 1, static_cast<utf8proc_ssize_t>(text.size() - i - 1), &right) <= 0)
    return false;
  if (!bytebpe::PreTokenizer::is_letter(static_cast<uint32_t>(left)) || !bytebpe::PreTokenizer::is_letter(static_cast<uint32_t>(right))) return false;
  if (!(text[i] == ' ' ? m_->pre.cuts_at_space() : text[i] == '\n' && m_->pre.cuts_at_newline())) return false;
  // The normalizer (none or NFC) never joins across an ASCII space or newline; an added token,
  // matched in the raw text first, may: no occurrence may start before i and end after it, and
  // the text must show every byte such an occurrence could cover (m_->added is longest first).
  const size_t longest = m_->added.empty() ? 0 : m_->added.front().content.size();
  if (longest > 1 && (i + 1 < longest || i + longest > text.size() + 1)) return false;
  for (const bytebpe::Added& a : m_->added) {
    const size_t n = a.content.size();
    const size_t from = i >= n ? i - n + 1 : 0;
    const size_t to = std::min(i + n - 1, text.size());
    if (n > 1 && to > from && text.substr(from, to - from).find(a.content) != std::string_view::npos) return false;
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
