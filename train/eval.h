#pragma once
// Evaluation, in one place for train, eval, uptraining and the sweep: batches of windows, the
// mean loss weighted by the number of targets (targets of -1 do not count), eval mode without a
// tape, the split of the batches over ranks, and the gradient `tapelm eval --grad-out` writes.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/shards.h"
#include "data/tokenizer/tokenizer.h"
#include "nn/gpt.h"
#include "train/formats/model_source.h"

namespace tapelm {

/// A mean loss and the number of target positions it is the mean over.
struct EvalResult {
  double loss = 0;
  int64_t targets = 0;
};

/// The batches one evaluation runs over, built one at a time so a whole split costs one batch of
/// memory: windows of a token sequence, or ready-made [B, T] batches (a parity file's rows).
class EvalBatches {
 public:
  /// Windows of T tokens of `data` at `starts`, `batch` per forward pass; mapped pages a batch
  /// read are released after it, so walking a whole split costs no memory.
  EvalBatches(TokenSeq data, std::vector<int64_t> starts, int64_t T, int64_t batch);
  /// These (inputs, targets) pairs as they are.
  explicit EvalBatches(std::vector<std::pair<Index, Index>> ready);
  /// The number of batches.
  size_t size() const;
  /// Writes batch i into x and y.
  void fill(size_t i, Index& x, Index& y) const;

 private:
  TokenSeq data_;
  bool windows_ = false;
  std::vector<int64_t> starts_;
  int64_t T_ = 0, batch_ = 1;
  std::vector<std::pair<Index, Index>> ready_;
};

/// Mean loss over every target of the batches, in eval mode, no tape. With split_across_ranks (a
/// collective in a multi-rank job) each rank evaluates every N-th batch and the sums are reduced,
/// so every rank gets the number one process would.
EvalResult evaluate(GPT& model, const EvalBatches& batches, bool split_across_ranks = false);

/// evaluate() on a model opened but not loaded (StreamedModel): every batch's hidden state goes
/// through one block at a time, so the memory is one block and the hidden states of all the
/// batches (tokens × d floats), not the model. The same ops as GPT::loss on each batch: the same
/// loss, bit for bit.
EvalResult evaluate_streamed(const formats::OpenedModel& m, const EvalBatches& batches);

/// The peak memory of evaluate_streamed, in bytes, on `tokens` tokens in passes of at most
/// `pass_rows` rows (batch x T): the model's tensors outside the blocks and one block in float32,
/// the hidden state of every token, the larger of one pass's block forward and its logits, the
/// largest block's bytes as its file stores them (the pages mapped while it is read) and the
/// process itself. bench/EVAL_MEMORY.md checks it against the peak RSS of HF, GGUF and checkpoint
/// forms of one model.
double streamed_eval_bytes(const formats::OpenedModel& m, double tokens, double pass_rows);

/// As evaluate, recording the tape: adds d(mean loss)/d(parameter) into every parameter's grad.
EvalResult evaluate_with_grads(GPT& model, const EvalBatches& batches);

/// Loss of `model` on the given windows of `data` (mean over targets). With split_across_ranks,
/// a collective (see evaluate).
double evaluate_windows(GPT& model, const TokenSeq& data, const std::vector<int64_t>& starts, int64_t T,
                        int64_t batch, bool split_across_ranks = false);

/// Windows per forward pass of evaluate_split: 32, fewer when their logits (windows × T × V floats)
/// would pass 256 MiB — a GPT-2-sized vocabulary at T 256 takes 5, where 32 held 1.6 GB of logits
/// beside the model after training's last step.
int64_t split_eval_batch(const GPTConfig& c);

/// Loss of the model on the whole split in non-overlapping windows of block_size, the figure
/// `tapelm eval` reports (split_eval_batch windows per forward pass); max_tokens > 0 bounds it to
/// the split's first ⌈max_tokens / block_size⌉ windows, as `eval --tokens` (config key final_eval_tokens).
/// With split_across_ranks, a collective.
double evaluate_split(GPT& model, const TokenSeq& split, bool split_across_ranks = false, int64_t max_tokens = 0);
/// What evaluate_split with max_tokens covers of a split of n tokens at block size T, for messages:
/// "the whole val split" or "the first 8192 tokens of the val split".
std::string split_eval_what(int64_t max_tokens, int64_t n, int64_t T);

/// What `tapelm eval --data` reads: token ids in non-overlapping windows of T, or (a parity file)
/// ready-made batches.
struct EvalData {
  TokenSeq ids;
  std::vector<int64_t> starts;
  int64_t T = 0;
  std::vector<std::pair<Index, Index>> ready;
  /// The windows in batches of `batch` (ready-made batches as they are); refers to this object.
  EvalBatches batches(int64_t batch) const;
};

/// Reads `path` for a model of config c: a parity .h5 with /tokens [B, T+1] (-1 targets ignored),
/// an llm.c .bin token file, a run or corpus directory, or a text file (tokenized with `tok`, or
/// its own characters when null). A corpus or text file gives its `split`: train, val or all.
/// Ids outside the vocabulary or a file shorter than one window -> an error naming `path`.
EvalData load_eval_data(const std::string& path, const std::string& split, const GPTConfig& c,
                        const Tokenizer* tok);

}  // namespace tapelm
