#pragma once
// The BPE model of a tokenizer.json: the vocabulary, the merges by rank, and the merging of one
// pre-token (leftmost lowest rank first, as Hugging Face's BPE does; ignore_merges takes a
// pre-token that is a whole vocabulary entry as it is, as Llama 3's does). Its first symbols are
// the pre-token's bytes, each through GPT-2's byte alphabet (byte-level: GPT-2, Llama 3, Qwen2),
// or its characters, a character missing from the vocabulary spelled by its bytes' <0xAB> tokens
// (byte_fallback: the sentencepiece-style files of Llama 2, Mistral and Gemma) or else by the
// unknown token.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizer/bytebpe/parse.h"

namespace tapelm::bytebpe {

class Bpe {
 public:
  /// The "model" object of a tokenizer.json: type BPE, no dropout, no prefixes or suffixes.
  static Bpe parse(const Parser& p, const json& model);
  /// True for byte_fallback's character alphabet, false for the byte-level one.
  bool byte_fallback() const { return byte_fallback_; }
  /// The unknown token's id, or -1.
  int32_t unk_id() const { return unk_; }

  /// Appends the ids of one pre-token (its bytes) to out; cached per thread.
  void encode_word(std::string_view w, std::vector<int32_t>& out) const;
  /// The vocabulary's spelling of each id; added tokens not in the vocabulary are empty until set.
  std::vector<std::string>& pieces() { return pieces_; }
  const std::vector<std::string>& pieces() const { return pieces_; }
  /// The id of a spelling, or -1.
  int32_t id_of(const std::string& spelling) const;
  /// The merges by rank, "left right" as tokenizer.json spells them.
  std::vector<std::string> merges() const;
  bool ignores_merges() const { return ignore_merges_; }

 private:
  void merge_small(std::vector<int32_t>& syms) const;
  void merge_large(std::vector<int32_t>& syms) const;
  void merge_word(std::string_view w, std::vector<int32_t>& out) const;
  const std::pair<int32_t, int32_t>* merge_of(int32_t left, int32_t right) const;

  uint64_t serial_ = 0;  // tells the per-thread caches apart
  std::vector<std::string> pieces_;                                   // id -> spelling
  std::unordered_map<std::string, int32_t> vocab_;                    // spelling -> id
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left << 32 | right) -> (rank, merged id)
  std::vector<std::pair<int32_t, int32_t>> merge_list_;               // (left, right) by rank
  void first_symbols(std::string_view w, std::vector<int32_t>& syms) const;
  std::array<int32_t, 256> byte_id_{};          // byte-level: the byte's token; byte_fallback: <0xAB>'s or -1
  std::array<std::string, 256> byte_spelling_;  // byte-level: the byte's character in UTF-8
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  int32_t unk_ = -1;
};

}  // namespace tapelm::bytebpe
