#include "data/tokenizer/tokenizer.h"

#include "data/tokenizer/bytebpe/byte_bpe.h"
#include "data/tokenizer/char.h"
#include "data/tokenizer/sentencepiece.h"

namespace tapelm {

namespace {

// The registry: one row per kind, the only place that lists them.
struct KindRow {
  TokenizerKind kind;
  const char* name;
  const char* corpus_file;  // what prepare names it in a corpus directory
  Tokenizer (*deserialize)(const std::string& bytes);
};

const KindRow kinds[] = {
    {TokenizerKind::char_level, "char", "tokenizer.json", [](const std::string& b) { return Tokenizer::of(CharTokenizer::from_json(b)); }},
    {TokenizerKind::sentencepiece, "sentencepiece", "tokenizer.model", &SentencePiece::load},
    {TokenizerKind::byte_bpe, "byte_bpe", "tokenizer.byte_bpe.json", [](const std::string& b) { return Tokenizer(ByteBpe::deserialize(b)); }},
    {TokenizerKind::fallback_bpe, "fallback_bpe", "tokenizer.fallback_bpe.json",
     [](const std::string& b) { return Tokenizer(ByteBpe::deserialize(b)); }},
};

}  // namespace

const char* to_string(TokenizerKind k) {
  for (const KindRow& r : kinds)
    if (r.kind == k) return r.name;
  return "none";
}

const char* corpus_file_name(TokenizerKind k) {
  for (const KindRow& r : kinds)
    if (r.kind == k) return r.corpus_file;
  return "tokenizer";
}

Tokenizer Tokenizer::deserialize(const std::string& kind, const std::string& bytes) {
  for (const KindRow& r : kinds)
    if (kind == r.name) {
      Tokenizer t = r.deserialize(bytes);
      if (t.kind() != r.kind)
        throw Error(ErrorKind::data, "tokenizer stored as kind \"" + kind + "\" is a " + t.kind_name() + " tokenizer");
      return t;
    }
  std::string names;
  for (const KindRow& r : kinds) names += std::string(names.empty() ? "" : ", ") + r.name;
  throw Error(ErrorKind::data, "unknown tokenizer kind \"" + cut_for_message(kind, 40) + "\" (expected " + names + ")");
}

const TokenizerModel& Tokenizer::model(const char* what) const {
  if (!m_) throw Error(ErrorKind::data, std::string(what) + " with an empty tokenizer");
  return *m_;
}

void Tokenizer::check_id(int32_t id, const std::string& at) const {
  if (id < 0 || id >= vocab_size())
    throw Error(ErrorKind::data, "token id " + std::to_string(id) + at + " is outside the vocabulary [0, " +
                                     std::to_string(vocab_size()) + ")");
}

TokenizerKind Tokenizer::kind() const { return model("kind").kind(); }

std::string Tokenizer::kind_name() const { return m_ ? to_string(m_->kind()) : "none"; }

std::string Tokenizer::serialized() const { return m_ ? m_->serialized() : std::string(); }

std::vector<int32_t> Tokenizer::encode(const std::string& utf8) const { return model("encode").encode(utf8); }

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const TokenizerModel& m = model("decode");
  for (size_t i = 0; i < ids.size(); i++) check_id(ids[i], " at position " + std::to_string(i));
  return m.decode(ids);
}

std::string Tokenizer::decode_next(int32_t prev, int32_t id) const {
  const TokenizerModel& m = model("decode");
  check_id(id);
  return m.decode_next(prev, id);
}

std::string Tokenizer::piece(int32_t id) const {
  check_id(id);
  return m_->piece(id);
}

float Tokenizer::score(int32_t id) const {
  check_id(id);
  return m_->score(id);
}

bool Tokenizer::is_byte(int32_t id) const { return m_ && id >= 0 && id < vocab_size() && m_->piece_kind(id) == PieceKind::byte; }

PieceKind Tokenizer::piece_kind(int32_t id) const {
  check_id(id);
  return m_->piece_kind(id);
}

bool Tokenizer::operator==(const Tokenizer& o) const {
  if (!m_ || !o.m_) return !m_ && !o.m_;
  return m_->kind() == o.m_->kind() && m_->serialized() == o.m_->serialized();
}

}  // namespace tapelm
