#pragma once
// BPE as Hugging Face's tokenizers library runs it from a tokenizer.json: byte-level (GPT-2,
// Llama 3, Qwen2, SmolLM; kind byte_bpe) or with byte fallback (the sentencepiece-style files of
// Llama 2, Mistral and Gemma; kind fallback_bpe). The pipeline: added tokens split out first,
// normalizer.h on each piece between them, pre_tokenizer.h, bpe.h, and the decoder (byte-level:
// byte_level.h; byte fallback: "▁" for a space, <0xAB> tokens as bytes, a space stripped where a
// document starts). What a file asks for that this code cannot run exactly is refused, naming the
// field, instead of tokenizing differently.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer.h"

namespace tapelm {

namespace bytebpe {
struct Pipeline;  // the parsed stages (byte_bpe.cpp)
}

class ByteBpe : public TokenizerModel {
 public:
  /// Parses a tokenizer.json. `what` names the file in errors. bos/eos: the begin- and
  /// end-of-document tokens as strings ("" for none), each a vocabulary or added token.
  /// Anything malformed or not byte-level BPE -> data Error naming the file and the field.
  static std::shared_ptr<const ByteBpe> from_json(const std::string& tokenizer_json, const std::string& what,
                                                  const std::string& bos, const std::string& eos);
  /// from_json on a parsed document.
  static std::shared_ptr<const ByteBpe> from_parsed(nlohmann::json tokenizer, const std::string& what, const std::string& bos,
                                                    const std::string& eos);
  /// Rebuilds one from serialized().
  static std::shared_ptr<const ByteBpe> deserialize(const std::string& bytes);
  /// The tokenizer.json of GPT-2's vocab.json + merges.txt, as Hugging Face converts them:
  /// byte-level pre-tokenizer with GPT-2's pattern, no normalizer, <|endoftext|> (when in the
  /// vocabulary) an added special token.
  static nlohmann::json gpt2_tokenizer(const std::string& vocab_json, const std::string& merges_txt, const std::string& vocab_what,
                                       const std::string& merges_what);
  /// A byte-level BPE tokenizer.json from its parts, as Hugging Face's converters write one: the
  /// vocabulary {token: id}, the merges ["left right", ...] by rank, the added tokens, the
  /// pre-tokenizer, and whether it normalizes to NFC and ignores merges for whole-token words.
  static nlohmann::json assemble(nlohmann::json vocab, nlohmann::json merges, nlohmann::json added_tokens,
                                 nlohmann::json pre_tokenizer, bool nfc, bool ignore_merges);
  /// What pre_tokenizer() says of a tokenizer.json's "pre_tokenizer" value; malformed -> data Error.
  static std::string describe_pre_tokenizer(const nlohmann::json& pre_tokenizer);

  /// byte_bpe, or fallback_bpe when model.byte_fallback is true.
  TokenizerKind kind() const override;
  /// True for a byte fallback file whose normalizer or Metaspace prepends "▁" (Llama 2's).
  bool adds_dummy_prefix() const override;
  /// Ids of valid UTF-8 text (no BOS/EOS added); invalid UTF-8 -> data Error. Added tokens in the
  /// text become their ids, as in Hugging Face's encode.
  std::vector<int32_t> encode(const std::string& utf8) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string decode_next(int32_t prev, int32_t id) const override;
  /// Number of ids: the largest id + 1 (an id with no token is unused: PieceKind::unused, decodes
  /// to nothing).
  int32_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  /// The token as the vocabulary spells it ("Ġthe"), or the added token's text.
  std::string piece(int32_t id) const override;
  PieceKind piece_kind(int32_t id) const override;
  /// {"type":"byte_bpe" or "fallback_bpe","bos":"...","eos":"...","tokenizer":{tokenizer.json}}.
  const std::string& serialized() const override;
  /// Byte-level: before a ' ' (or '\n') between two letters, when the pre-tokenizer is one that
  /// splits there (PreTokenizer::cuts_at_space) and no added token's text spans the cut. Byte
  /// fallback: never.
  bool can_cut_before(std::string_view text, size_t i) const override;

  /// The bytes one id stands for (added tokens: their text), before any UTF-8 repair.
  const std::string& token_bytes(int32_t id) const;
  /// True for added tokens marked special.
  bool is_special(int32_t id) const;
  /// True for ids from tokenizer.json's added_tokens (special or not).
  bool is_added(int32_t id) const;
  /// The merges by rank, "left right" as tokenizer.json spells them.
  std::vector<std::string> merges() const;
  /// The pre-tokenizer steps as the file gives them, e.g. "Digits individual | ByteLevel use_regex".
  std::string pre_tokenizer() const;
  /// The tokenizer.json itself, for export.
  std::string tokenizer_json() const;

  ~ByteBpe() override;
  ByteBpe(const ByteBpe&) = delete;
  ByteBpe& operator=(const ByteBpe&) = delete;

 private:
  ByteBpe();
  std::unique_ptr<bytebpe::Pipeline> m_;
};

}  // namespace tapelm
