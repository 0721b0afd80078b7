#include "data/tokenizer/sentencepiece.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "data/io.h"

// Exported by libsentencepiece (its logging.h is not installed): the trainer's progress lines
// are INFO and its warnings go to stderr too; its errors come back as a status, and tapelm
// prints one line.
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}

namespace tapelm {

struct SentencePiece::Processor {
  sentencepiece::SentencePieceProcessor sp;
};

namespace {

// One line: sentencepiece's messages may hold newlines.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
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

// sentencepiece's ModelProto in protobuf's wire format, written field by field.
void pb_varint(std::string& b, uint64_t v) {
  while (v >= 0x80) b += static_cast<char>((v & 0x7F) | 0x80), v >>= 7;
  b += static_cast<char>(v);
}
void pb_tag(std::string& b, int field, int wire) { pb_varint(b, static_cast<uint64_t>(field) << 3 | wire); }
void pb_bytes(std::string& b, int field, const std::string& s) { pb_tag(b, field, 2), pb_varint(b, s.size()), b += s; }
void pb_int(std::string& b, int field, int64_t v) { pb_tag(b, field, 0), pb_varint(b, static_cast<uint64_t>(v)); }
void pb_float(std::string& b, int field, float f) {
  pb_tag(b, field, 5);
  b.append(reinterpret_cast<const char*>(&f), 4);
}

}  // namespace

Tokenizer SentencePiece::load_file(const std::string& path) {
  const std::string bytes = read_file_bytes(path, "sentencepiece model");
  try {
    return load(bytes);
  } catch (const Error& e) {
    throw Error(ErrorKind::data, path + ": " + e.what());
  }
}

SentencePiece::SentencePiece() : sp_(std::make_unique<Processor>()) {}
SentencePiece::~SentencePiece() = default;

Tokenizer SentencePiece::load(const std::string& bytes) {
  std::shared_ptr<SentencePiece> m(new SentencePiece());
  const auto st = m->sp_->sp.LoadFromSerializedProto(bytes);
  // sentencepiece's status names its own source line ("Internal: ./src/…cc(232) [model_proto->…]"),
  // which tells a user nothing: say what failed.
  if (!st.ok()) throw Error(ErrorKind::data, "not a sentencepiece model (its bytes are no ModelProto sentencepiece can read)");
  if (m->sp_->sp.GetPieceSize() <= 0) throw Error(ErrorKind::data, "sentencepiece model has no pieces");
  m->bytes_ = bytes;
  // add_dummy_prefix is in the model's normalizer spec, which the processor does not expose:
  // a model with it encodes "a" as a piece that starts with U+2581 (the space mark).
  std::vector<std::string> pieces;
  if (m->sp_->sp.Encode("a", &pieces).ok() && !pieces.empty()) m->dummy_prefix_ = pieces[0].rfind("\xE2\x96\x81", 0) == 0;
  return Tokenizer(std::move(m));
}

// The proto's fields: pieces 1 {piece 1, score 2, type 3 (PieceKind + 1)}; trainer_spec 2
// {model_type 3 (BPE = 2), vocab_size 4, byte_fallback 35, unk/bos/eos/pad ids 40-43};
// normalizer_spec 3 {name 1, add_dummy_prefix 3, remove_extra_whitespaces 4, escape_whitespaces 5}.
Tokenizer SentencePiece::from_pieces(const std::vector<SentencePiecePiece>& pieces, int64_t unk, int64_t bos, int64_t eos,
                                     bool add_dummy_prefix) {
  std::string proto;
  bool byte_fallback = false;
  for (const SentencePiecePiece& p : pieces) {
    byte_fallback = byte_fallback || p.kind == PieceKind::byte;
    std::string e;
    pb_bytes(e, 1, p.piece);
    pb_float(e, 2, p.score);
    pb_int(e, 3, static_cast<int>(p.kind) + 1);
    pb_bytes(proto, 1, e);
  }
  std::string trainer;
  pb_int(trainer, 3, 2);
  pb_int(trainer, 4, static_cast<int64_t>(pieces.size()));
  pb_int(trainer, 35, byte_fallback);
  pb_int(trainer, 40, unk < 0 ? 0 : unk);
  pb_int(trainer, 41, bos);
  pb_int(trainer, 42, eos);
  pb_int(trainer, 43, -1);
  pb_bytes(proto, 2, trainer);
  std::string norm;
  pb_bytes(norm, 1, "identity");
  pb_int(norm, 3, add_dummy_prefix);
  pb_int(norm, 4, 0);
  pb_int(norm, 5, 1);
  pb_bytes(proto, 3, norm);
  return load(proto);
}

Tokenizer SentencePiece::train(const std::vector<std::string>& sentences, const SentencePieceOptions& o) {
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
  return load(bytes);
}

std::vector<int32_t> SentencePiece::encode(const std::string& utf8) const {
  utf8_check(utf8);  // sentencepiece would map invalid bytes to unk silently
  std::vector<int> ids;
  const auto st = sp_->sp.Encode(utf8, &ids);
  if (!st.ok()) throw Error(ErrorKind::data, "sentencepiece cannot encode: " + one_line(st.ToString()));
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePiece::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  const auto st = sp_->sp.Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  if (!st.ok()) throw Error(ErrorKind::data, "sentencepiece cannot decode: " + one_line(st.ToString()));
  return out;
}

std::string SentencePiece::decode_next(int32_t prev, int32_t id) const {
  const auto& sp = sp_->sp;
  const std::string p = sp.IdToPiece(id);
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
  if ((prev < 0 || prev == sp.bos_id()) && dummy_prefix_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

int32_t SentencePiece::vocab_size() const { return sp_->sp.GetPieceSize(); }
int32_t SentencePiece::bos_id() const { return sp_->sp.bos_id(); }
int32_t SentencePiece::eos_id() const { return sp_->sp.eos_id(); }
std::string SentencePiece::piece(int32_t id) const { return sp_->sp.IdToPiece(id); }
float SentencePiece::score(int32_t id) const { return sp_->sp.GetScore(id); }

PieceKind SentencePiece::piece_kind(int32_t id) const {
  const auto& sp = sp_->sp;
  if (sp.IsControl(id)) return PieceKind::control;
  if (sp.IsUnknown(id)) return PieceKind::unknown;
  if (sp.IsUnused(id)) return PieceKind::unused;
  if (sp.IsByte(id)) return PieceKind::byte;
  return PieceKind::normal;
}

}  // namespace tapelm
