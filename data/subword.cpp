#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <mutex>

#include "data/bytebpe.h"
#include "data/tokenizer.h"

// Exported by libsentencepiece (its logging.h is not installed): the trainer's progress lines
// are INFO and its warnings go to stderr too; its errors come back as a status, and tapelm
// prints one line.
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}

namespace tapelm {

struct SentencePieceModel {
  sentencepiece::SentencePieceProcessor sp;
  std::string bytes;
  bool dummy_prefix = false;
};

namespace {

// One line: sentencepiece's messages may hold newlines.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

std::shared_ptr<const SentencePieceModel> load_sp(const std::string& bytes) {
  auto m = std::make_shared<SentencePieceModel>();
  const auto st = m->sp.LoadFromSerializedProto(bytes);
  if (!st.ok()) throw Error(ErrorKind::data, "not a sentencepiece model: " + one_line(st.ToString()));
  if (m->sp.GetPieceSize() <= 0) throw Error(ErrorKind::data, "sentencepiece model has no pieces");
  m->bytes = bytes;
  // add_dummy_prefix is in the model's normalizer spec, which the processor does not expose:
  // a model with it encodes "a" as a piece that starts with U+2581 (the space mark).
  std::vector<std::string> pieces;
  if (m->sp.Encode("a", &pieces).ok() && !pieces.empty())
    m->dummy_prefix = pieces[0].rfind("\xE2\x96\x81", 0) == 0;
  return m;
}

class VectorSentences : public sentencepiece::SentenceIterator {
 public:
  explicit VectorSentences(const std::vector<std::string>& s) : s_(s) {}
  bool done() const override { return i_ >= s_.size(); }
  void Next() override { i_++; }
  const std::string& value() const override { return s_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& s_;
  size_t i_ = 0;
};

}  // namespace

Tokenizer Tokenizer::from_char(CharTokenizer c) {
  Tokenizer t;
  t.ch_ = std::make_shared<const CharTokenizer>(std::move(c));
  return t;
}

Tokenizer Tokenizer::from_sentencepiece(const std::string& model_bytes) {
  Tokenizer t;
  t.sp_ = load_sp(model_bytes);
  return t;
}

Tokenizer Tokenizer::train_sentencepiece(const std::vector<std::string>& sentences, const SentencePieceOptions& o) {
  if (o.model_type != "bpe" && o.model_type != "unigram")
    throw Error(ErrorKind::usage, "tokenizer type " + o.model_type + " is not bpe or unigram");
  if (o.vocab_size < 259)
    throw Error(ErrorKind::data, "--vocab-size " + std::to_string(o.vocab_size) +
                                     " is below 259, the 256 byte pieces of byte fallback plus unk, bos and eos");
  if (sentences.empty()) throw Error(ErrorKind::data, "no text to train a sentencepiece model on");
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"self_test_sample_size", "0"},
      {"input_format", "text"},
      {"character_coverage", "1.0"},
      {"num_threads", std::to_string(std::max(1, o.threads))},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"byte_fallback", "true"},
      {"unk_surface", " \xE2\x81\x87 "},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"max_sentence_length", "65536"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"input_sentence_size", "0"},
      {"train_extremely_large_corpus", "false"}};
  static std::mutex log_mu;  // the log level is global to the library
  std::string bytes;
  VectorSentences it(sentences);
  sentencepiece::util::Status st;
  {
    std::lock_guard<std::mutex> lock(log_mu);
    sentencepiece::logging::SetMinLogLevel(2);
    st = sentencepiece::SentencePieceTrainer::Train(args, &it, &bytes);
    sentencepiece::logging::SetMinLogLevel(0);
  }
  if (!st.ok()) throw Error(ErrorKind::data, "sentencepiece training failed: " + one_line(st.ToString()));
  return from_sentencepiece(bytes);
}

Tokenizer Tokenizer::from_byte_bpe(std::shared_ptr<const ByteBpe> b) {
  Tokenizer t;
  t.bb_ = std::move(b);
  return t;
}

Tokenizer Tokenizer::deserialize(const std::string& kind, const std::string& bytes) {
  if (kind == "char") return from_char(CharTokenizer::from_json(bytes));
  if (kind == "sentencepiece") return from_sentencepiece(bytes);
  if (kind == "byte_bpe") return from_byte_bpe(ByteBpe::deserialize(bytes));
  throw Error(ErrorKind::data, "unknown tokenizer kind \"" + kind.substr(0, 40) + "\" (expected char, sentencepiece or byte_bpe)");
}

std::string Tokenizer::kind_name() const { return ch_ ? "char" : sp_ ? "sentencepiece" : bb_ ? "byte_bpe" : "none"; }

std::string Tokenizer::serialized() const {
  return ch_ ? ch_->to_json() : sp_ ? sp_->bytes : bb_ ? bb_->serialized() : std::string();
}

std::vector<int32_t> Tokenizer::encode(const std::string& utf8) const {
  if (ch_) return ch_->encode(utf8);
  if (bb_) return bb_->encode(utf8);
  if (!sp_) throw Error(ErrorKind::data, "encode with an empty tokenizer");
  utf8_check(utf8);  // sentencepiece would map invalid bytes to unk silently
  std::vector<int> ids;
  const auto st = sp_->sp.Encode(utf8, &ids);
  if (!st.ok()) throw Error(ErrorKind::data, "sentencepiece cannot encode: " + one_line(st.ToString()));
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  if (ch_) return ch_->decode(ids);
  if (!sp_ && !bb_) throw Error(ErrorKind::data, "decode with an empty tokenizer");
  const int32_t V = vocab_size();
  for (size_t i = 0; i < ids.size(); i++)
    if (ids[i] < 0 || ids[i] >= V)
      throw Error(ErrorKind::data, "token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                       " is outside the vocabulary [0, " + std::to_string(V) + ")");
  if (bb_) {
    std::string bytes;
    for (int32_t id : ids)
      if (id != bb_->bos_id() && id != bb_->eos_id()) bytes += bb_->token_bytes(id);
    return utf8_repair(bytes);
  }
  std::string out;
  const auto st = sp_->sp.Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  if (!st.ok()) throw Error(ErrorKind::data, "sentencepiece cannot decode: " + one_line(st.ToString()));
  return out;
}

std::string Tokenizer::decode_next(int32_t prev, int32_t id) const {
  if (ch_) return piece(id);
  const std::string p = piece(id);  // range check
  if (bb_) return id == bb_->bos_id() || id == bb_->eos_id() ? std::string() : bb_->token_bytes(id);
  const auto& sp = sp_->sp;
  if (sp.IsControl(id) || sp.IsUnused(id)) return "";
  if (sp.IsByte(id)) return std::string(1, static_cast<char>(std::stoi(p.substr(3, 2), nullptr, 16)));  // <0xAB>
  if (sp.IsUnknown(id)) return " \xE2\x81\x87 ";
  std::string out;
  for (size_t i = 0; i < p.size();) {
    if (p.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 3;
    } else {
      out += p[i++];
    }
  }
  if ((prev < 0 || prev == sp.bos_id()) && sp_->dummy_prefix && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

int32_t Tokenizer::vocab_size() const {
  return ch_ ? ch_->vocab_size() : sp_ ? sp_->sp.GetPieceSize() : bb_ ? bb_->vocab_size() : 0;
}
int32_t Tokenizer::bos_id() const { return sp_ ? sp_->sp.bos_id() : bb_ ? bb_->bos_id() : -1; }
int32_t Tokenizer::eos_id() const { return sp_ ? sp_->sp.eos_id() : bb_ ? bb_->eos_id() : -1; }

std::string Tokenizer::piece(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw Error(ErrorKind::data, "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                     std::to_string(vocab_size()) + ")");
  if (ch_) {
    std::string s;
    utf8_append(s, ch_->symbols()[id]);
    return s;
  }
  if (bb_) return bb_->piece(id);
  return sp_->sp.IdToPiece(id);
}

float Tokenizer::score(int32_t id) const {
  piece(id);  // range check
  return sp_ ? sp_->sp.GetScore(id) : 0.f;
}

bool Tokenizer::is_byte(int32_t id) const { return sp_ && id >= 0 && id < vocab_size() && sp_->sp.IsByte(id); }

Tokenizer::PieceKind Tokenizer::piece_kind(int32_t id) const {
  piece(id);  // range check
  if (bb_) {
    if (bb_->is_special(id) || id == bb_->bos_id() || id == bb_->eos_id()) return PieceKind::control;
    return bb_->is_added(id) ? PieceKind::user_defined : PieceKind::normal;
  }
  if (!sp_) return PieceKind::normal;
  const auto& sp = sp_->sp;
  if (sp.IsControl(id)) return PieceKind::control;
  if (sp.IsUnknown(id)) return PieceKind::unknown;
  if (sp.IsUnused(id)) return PieceKind::unused;
  if (sp.IsByte(id)) return PieceKind::byte;
  return PieceKind::normal;
}

bool Tokenizer::adds_dummy_prefix() const { return sp_ && sp_->dummy_prefix; }

bool Tokenizer::operator==(const Tokenizer& o) const {
  if (kind_name() != o.kind_name()) return false;
  if (ch_) return *ch_ == *o.ch_;
  if (bb_) return bb_->serialized() == o.bb_->serialized();
  return !sp_ || sp_->bytes == o.sp_->bytes;
}

}  // namespace tapelm
