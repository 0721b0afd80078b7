#pragma once
// Token sequences read in place: llm.c token shards mapped with mmap (never copied into memory),
// or ids held in memory; and the writer that streams ids into shards.
//
// Shard format (llm.c): a header of 256 little-endian int32 — [0] magic, [1] version, [2] token
// count — then the tokens: 20240520 / 1 with uint16 tokens, or llm.c's wide variant 20240801 / 7
// with uint32 tokens (vocabularies above 65,536 ids). Headerless uint16 files (llama2.c's
// pretokenized shards, nanoGPT's train.bin) map too.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/error.h"

namespace tapelm {

inline constexpr int32_t wide_token_file_magic = 20240801;
inline constexpr int32_t wide_token_file_version = 7;

/// A read-only sequence of token ids: in memory, or one or more mapped shard files seen as one
/// sequence (a window may run from one shard into the next). A cheap handle: copies share the data.
class TokenSeq {
 public:
  TokenSeq() = default;
  /// These ids, in memory.
  TokenSeq(std::vector<int32_t> ids);  // NOLINT: implicit, so a vector serves wherever a sequence does
  /// Maps the files in order (llm.c shards, or headerless uint16 files with headerless = true); a
  /// missing file, a bad header, or a size that disagrees with the header's count -> data Error
  /// naming the file. Ids are not checked here: see check_below.
  static TokenSeq map_files(const std::vector<std::string>& paths, bool headerless = false);

  /// a then b, as one sequence (shards stay mapped; in-memory ids are copied).
  static TokenSeq concat(const TokenSeq& a, const TokenSeq& b);

  /// Number of ids.
  int64_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  /// Id i (0 <= i < size()).
  int32_t operator[](int64_t i) const;
  /// Writes ids [start, start + n) to out; the range must lie within the sequence.
  void copy(int64_t start, int64_t n, int32_t* out) const;
  /// Drops the mapped pages of [begin, end) from this process (they stay in the page cache), so
  /// walking or sampling a large corpus does not grow the resident set; no-op in memory.
  void release(int64_t begin, int64_t end) const;
  /// Every id, copied (for tests and small corpora).
  std::vector<int32_t> to_vector() const;
  /// Throws data Error "<file>: token id I at position P is >= vocab_size V" (the shard's file and
  /// position, or `what` for ids in memory) for the first id outside [0, vocab_size).
  void check_below(int64_t vocab_size, const std::string& what) const;
  /// What identifies the data for a multi-rank agreement: a checksum in memory, file names and
  /// counts when mapped (reading every shard on every rank would cost as much as an epoch).
  std::string fingerprint() const;
  /// Same ids.
  bool operator==(const std::vector<int32_t>& ids) const;

 private:
  struct Mapping;
  std::shared_ptr<const std::vector<int32_t>> mem_;
  std::vector<std::shared_ptr<const Mapping>> maps_;
  std::vector<int64_t> starts_;  // first id of each mapping in the sequence
  int64_t n_ = 0;
};

/// Streams ids into shard files `<prefix>_000000.bin`, ... of at most max_tokens each (uint16 when
/// wide = false, else llm.c's uint32 variant). Each file is complete when the next starts or
/// finish() returns; the caller renames them into place (see prepare).
class ShardWriter {
 public:
  /// Where the shard of a given file name is written (a corpus's DirectoryCommit::path).
  using Place = std::function<std::string(const std::string& name)>;
  ShardWriter(Place place, std::string prefix, bool wide, int64_t max_tokens);
  /// The shards written in `dir` under their names.
  ShardWriter(const std::string& dir, std::string prefix, bool wide, int64_t max_tokens);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  /// Appends ids (each must be in range for the width).
  void write(const std::vector<int32_t>& ids);
  /// Completes the last file (writes every header); an empty writer still writes one empty shard.
  void finish();
  /// (file name, token count) of each shard, in order.
  const std::vector<std::pair<std::string, int64_t>>& shards() const { return shards_; }
  /// Ids written so far.
  int64_t total() const { return total_; }

 private:
  void open_next();
  void close_current();

  Place place_;
  std::string prefix_, path_;  // path_: where the current shard is written
  bool wide_;
  int64_t max_tokens_, in_current_ = 0, total_ = 0;
  void* file_ = nullptr;  // std::FILE*
  std::vector<std::pair<std::string, int64_t>> shards_;
  std::string buf_;
};

}  // namespace tapelm
