#include "data/prepare.h"


#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "autograd/runtime.h"
#include "data/io.h"
#include "data/outdir.h"
#include "data/shards.h"
#include "data/tokenizer/char.h"
#include "data/tokenizer/sentencepiece.h"
#include "data/tokenizer/bytebpe/byte_bpe.h"

namespace tapelm {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A document: bytes [begin, end) of one file.
struct Doc {
  size_t file;
  int64_t begin, end;
};

// Bytes [at, at + n) of a file (fewer at its end).
std::string read_range(const std::string& path, int64_t at, int64_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::data, "data file " + path + ": cannot open");
  in.seekg(at);
  std::string s(static_cast<size_t>(n), '\0');
  in.read(s.data(), n);
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

void check_utf8(const std::string& text, const std::string& path, int64_t base) {
  const size_t bad = utf8_first_invalid(text);
  if (bad != std::string::npos)
    throw Error(ErrorKind::data, "data file " + path + ": invalid UTF-8 at byte offset " +
                                     std::to_string(base + static_cast<int64_t>(bad)) + " (the text must be UTF-8)");
}

// The documents of the files: each file, or the pieces between occurrences of sep (empty ones dropped).
std::vector<Doc> find_documents(const std::vector<std::string>& files, const std::vector<int64_t>& sizes,
                                const std::string& sep, bool* sep_found) {
  std::vector<Doc> docs;
  *sep_found = false;
  const int64_t block = 16 << 20;
  for (size_t f = 0; f < files.size(); f++) {
    if (sep.empty()) {
      docs.push_back({f, 0, sizes[f]});
      continue;
    }
    int64_t doc_start = 0;
    for (int64_t at = 0; at < sizes[f];) {
      const std::string s = read_range(files[f], at, block + static_cast<int64_t>(sep.size()) - 1);
      size_t from = 0;
      for (size_t p; (p = s.find(sep, from)) != std::string::npos && at + static_cast<int64_t>(p) < at + block;) {
        const int64_t pos = at + static_cast<int64_t>(p);
        if (pos >= doc_start) {
          if (pos > doc_start) docs.push_back({f, doc_start, pos});
          doc_start = pos + static_cast<int64_t>(sep.size());
          *sep_found = true;
        }
        from = p + 1;
      }
      at += block;
    }
    if (sizes[f] > doc_start) docs.push_back({f, doc_start, sizes[f]});
  }
  return docs;
}

// The sentences a sentencepiece model trains on: lines of evenly spaced blocks of the documents,
// about `budget` bytes in all (everything when the text is smaller); long lines cut at spaces.
std::vector<std::string> training_sample(const std::vector<std::string>& files, const std::vector<Doc>& docs,
                                         int64_t total, int64_t budget) {
  std::vector<std::string> out;
  const int64_t block = 1 << 20;
  const int64_t n_blocks = std::max<int64_t>(1, budget / block);
  const double stride = total <= budget ? 0 : static_cast<double>(total) / static_cast<double>(n_blocks);
  auto add_text = [&](const std::string& s) {
    size_t from = 0;
    while (from < s.size()) {
      size_t nl = s.find('\n', from);
      if (nl == std::string::npos) nl = s.size();
      std::string_view line(s.data() + from, nl - from);
      while (line.size() > 16384) {  // sentencepiece skips sentences longer than its max (llama2.c bounds them too)
        size_t cut = line.rfind(' ', 16384);
        if (cut == std::string_view::npos || cut == 0) cut = 16384;
        while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) cut--;
        out.emplace_back(line.substr(0, cut));
        line.remove_prefix(cut);
      }
      if (!line.empty()) out.emplace_back(line);
      from = nl + 1;
    }
  };
  if (stride == 0) {
    for (const Doc& d : docs) {
      std::string s = read_range(files[d.file], d.begin, d.end - d.begin);
      check_utf8(s, files[d.file], d.begin);
      add_text(s);
    }
    return out;
  }
  // block k starts at k * stride in the concatenation of the documents, cut to whole lines
  size_t di = 0;
  int64_t doc_off = 0;  // offset of docs[di] in the concatenation
  for (int64_t k = 0; k < n_blocks; k++) {
    const auto want = static_cast<int64_t>(static_cast<double>(k) * stride);
    while (di < docs.size() && doc_off + (docs[di].end - docs[di].begin) <= want) {
      doc_off += docs[di].end - docs[di].begin;
      di++;
    }
    if (di == docs.size()) break;
    const Doc& d = docs[di];
    const int64_t at = d.begin + (want - doc_off);
    std::string s = read_range(files[d.file], at, std::min(block, d.end - at));
    // Whole lines; a text without newlines (one long line) is cut at spaces instead, and one
    // without either at character boundaries, so that any valid text gives a sample.
    const bool to_end = at + static_cast<int64_t>(s.size()) == d.end;
    const char cut = s.find('\n') != std::string::npos ? '\n' : ' ';
    size_t begin = at == d.begin ? 0 : s.find(cut), end = to_end ? s.size() : s.rfind(cut);
    if (begin == std::string::npos) begin = 0;  // no boundary at all
    else if (at != d.begin) begin++;
    if (end == std::string::npos || end <= begin) end = s.size();
    while (begin < end && (static_cast<unsigned char>(s[begin]) & 0xC0) == 0x80) begin++;
    while (end < s.size() && end > begin && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) end--;
    if (end <= begin) continue;
    s = s.substr(begin, end - begin);
    check_utf8(s, files[d.file], at + static_cast<int64_t>(begin));
    add_text(s);
  }
  return out;
}

// One piece of text to encode: a document's bytes, whole or in part.
struct Piece {
  size_t file;
  int64_t at;
  std::string text;
  bool bos = false;        // the document starts here: BOS first (sentencepiece)
  bool drop_space = false; // a continuation that starts at a space the dummy prefix stands for
};

// Text held whole when no cut is safe (Tokenizer::can_cut_before): a run of text that long with no
// place to cut is refused.
constexpr int64_t kMaxUncut = int64_t(1) << 30;

// The last i in (from, s.size()) where tok may cut s, or npos.
size_t last_cut(const Tokenizer& tok, std::string_view s, size_t from = 0) {
  for (size_t i = s.size(); i-- > from + 1;)
    if (tok.can_cut_before(s, i)) return i;
  return std::string::npos;
}

Error no_cut(const Tokenizer& tok, const std::string& file, int64_t at) {
  return Error(ErrorKind::data, "data file " + file + ": no place within " + std::to_string(kMaxUncut >> 20) + " MiB from byte " +
                                    std::to_string(at) + " where the " + tok.kind_name() +
                                    " tokenizer's ids of the parts equal those of the whole (docs/tokenizers.md): split the text into documents (--doc-sep)");
}

// Splits [begin, end) of a file into pieces of about `chunk` bytes, each cut where the tokenizer
// says encoding the parts equals encoding the whole (Tokenizer::can_cut_before); where no such
// place is near, the piece grows until there is one (or the segment ends).
class Chunker {
 public:
  Chunker(const std::vector<std::string>& files, const Tokenizer& tok, int64_t chunk)
      : files_(files), tok_(tok), chunk_(chunk) {}
  // The next piece of the segment, or false at its end.
  void start(size_t file, int64_t begin, int64_t end, bool doc_start) {
    file_ = file, pos_ = begin, end_ = end, first_ = true, doc_start_ = doc_start;
    continues_ = false;
  }
  bool next(Piece& p) {
    if (pos_ >= end_) return false;
    std::string s;
    for (int64_t window = chunk_;; window *= 2) {
      s = read_range(files_[file_], pos_, std::min(window, end_ - pos_));
      if (pos_ + static_cast<int64_t>(s.size()) >= end_) break;  // the rest of the segment, whole
      const size_t cut = last_cut(tok_, s);
      if (cut != std::string::npos) {
        s.resize(cut);
        break;
      }
      if (window >= kMaxUncut) throw no_cut(tok_, files_[file_], pos_);
    }
    check_utf8(s, files_[file_], pos_);
    p.file = file_;
    p.at = pos_;
    p.bos = first_ && doc_start_ && tok_.bos_id() >= 0;
    p.drop_space = continues_ && tok_.adds_dummy_prefix() && !s.empty() && s[0] == ' ';
    if (p.drop_space) s.erase(0, 1);
    p.text = std::move(s);
    pos_ += static_cast<int64_t>(p.text.size()) + (p.drop_space ? 1 : 0);
    first_ = false;
    continues_ = true;
    return true;
  }

 private:
  const std::vector<std::string>& files_;
  const Tokenizer& tok_;
  int64_t chunk_;
  size_t file_ = 0;
  int64_t pos_ = 0, end_ = 0;
  bool first_ = true, doc_start_ = true, continues_ = false;
};

// A tokenizer's ids for text, encoded about `step` bytes at a time, cut where the tasks are
// (Tokenizer::can_cut_before), so the ids are those of one call: sentencepiece's encoder slows
// down on long inputs.
std::vector<int32_t> encode_in_steps(const Tokenizer& tok, const std::string& text, size_t step) {
  if (tok.as<CharTokenizer>() || text.size() <= step) return tok.encode(text);
  std::vector<int32_t> out;
  size_t pos = 0;
  bool continues = false;
  while (pos < text.size()) {
    size_t end = text.size();
    if (pos + step < text.size()) {
      end = last_cut(tok, std::string_view(text).substr(0, pos + step + 1), pos);
      if (end == std::string::npos) {  // none before: the next one, or the end
        for (size_t i = pos + step + 1; i < text.size() && end == std::string::npos; i++)
          if (tok.can_cut_before(text, i)) end = i;
        if (end == std::string::npos) end = text.size();
      }
    }
    size_t from = pos;
    if (continues && tok.adds_dummy_prefix() && text[from] == ' ') from++;  // the dummy prefix stands for it
    const std::vector<int32_t> ids = tok.encode(text.substr(from, end - from));
    out.insert(out.end(), ids.begin(), ids.end());
    pos = end;
    continues = true;
  }
  return out;
}

// ---- the stages of prepare_corpus ----------------------------------------------------------------

void check_options(const PrepareOptions& o) {
  if (o.texts.empty()) throw Error(ErrorKind::usage, "prepare needs at least one text file");
  if (o.tokenizer != "char" && o.tokenizer != "bpe" && o.tokenizer != "unigram")
    throw Error(ErrorKind::usage, "tokenizer \"" + cut_for_message(o.tokenizer) + "\" is not char, bpe or unigram");
  if (!(o.val_fraction >= 0 && o.val_fraction < 1))
    throw Error(ErrorKind::usage, "val fraction " + std::to_string(o.val_fraction) + " is not in [0, 1)");
  if (o.sample_bytes <= 0) throw Error(ErrorKind::usage, "the tokenizer's sample must be positive");
  if (o.tokenizer == "char" && !o.given.empty())
    throw Error(ErrorKind::usage, "a tokenizer model is a subword tokenizer: use it with the bpe or unigram tokenizer");
  if (utf8_first_invalid(o.doc_sep) != std::string::npos)
    throw Error(ErrorKind::usage, "the document separator is not valid UTF-8");
}

/// The input files (regular, not empty) and their documents.
struct Inputs {
  std::vector<int64_t> sizes;
  std::vector<Doc> docs;
  int64_t doc_bytes = 0;  // the documents' bytes, separators excluded
};

Inputs read_inputs(const PrepareOptions& o, PrepareResult& r) {
  Inputs in;
  for (const std::string& f : o.texts) {
    require_regular_file(f, "data file");
    std::error_code ec;
    in.sizes.push_back(static_cast<int64_t>(fs::file_size(f, ec)));
    if (in.sizes.back() == 0) throw Error(ErrorKind::data, "data file " + f + ": is empty");
    r.text_bytes += in.sizes.back();
  }
  bool sep_found = false;
  in.docs = find_documents(o.texts, in.sizes, o.doc_sep, &sep_found);
  if (!o.doc_sep.empty() && !sep_found)
    std::fprintf(stderr, "tapelm: warning: the document separator \"%s\" never occurs in the text: each file is one document\n",
                 cut_for_message(o.doc_sep).c_str());
  if (in.docs.empty()) throw Error(ErrorKind::data, "data file " + o.texts[0] + ": holds no text besides the separator");
  for (const Doc& d : in.docs) in.doc_bytes += d.end - d.begin;
  return in;
}

/// The char tokenizer of the documents: their distinct code points.
Tokenizer char_tokenizer(const PrepareOptions& o, const std::vector<Doc>& docs) {
  std::set<char32_t> seen;
  for (const Doc& d : docs)
    for (int64_t at = d.begin; at < d.end;) {
      std::string s = read_range(o.texts[d.file], at, std::min<int64_t>(16 << 20, d.end - at));
      size_t cut = s.size();
      if (at + static_cast<int64_t>(cut) < d.end)
        while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) cut--;
      s.resize(cut);
      check_utf8(s, o.texts[d.file], at);
      for (char32_t cp : utf8_decode(s)) seen.insert(cp);
      at += static_cast<int64_t>(cut);
    }
  return Tokenizer::of(CharTokenizer::from_symbols(std::vector<char32_t>(seen.begin(), seen.end())));
}

/// The tokenizer: the given one, the char tokenizer, or a sentencepiece model trained on a sample.
Tokenizer make_tokenizer(const PrepareOptions& o, const Inputs& in) {
  if (!o.given.empty()) return o.given;
  if (o.tokenizer == "char") return char_tokenizer(o, in.docs);
  SentencePieceOptions so;
  so.model_type = o.tokenizer;
  so.vocab_size = o.vocab_size;
  so.threads = get_num_threads();
  if (o.vocab_size < 259)
    throw Error(ErrorKind::usage, "vocab size " + std::to_string(o.vocab_size) +
                                      " is below 259, the 256 byte pieces of byte fallback plus unk, bos and eos");
  const std::vector<std::string> sample = training_sample(o.texts, in.docs, in.doc_bytes, o.sample_bytes);
  if (o.progress)
    std::printf("prepare: training a %s tokenizer of %d pieces on %zu lines of the text\n", o.tokenizer.c_str(),
                o.vocab_size, sample.size());
  try {
    return SentencePiece::train(sample, so);
  } catch (const Error& e) {
    std::string files;
    for (const std::string& f : o.texts) files += (files.empty() ? "" : ", ") + f;
    throw Error(ErrorKind::data, "data file " + cut_for_message(files, 200) + ": vocab size " + std::to_string(o.vocab_size) +
                                     ": " + e.what());
  }
}

/// A stretch of a file to encode; doc_start: the document begins here (BOS first).
struct Segment {
  size_t file;
  int64_t begin, end;
  bool doc_start;
};
struct Split {
  std::vector<Segment> train, val;
};

/// Where one document splits into train and val: nanoGPT's int(n * 0.9) code points for the char
/// tokenizer (a single file splits as it always has), else by bytes, moved on to the next place
/// where the parts encode as the whole did (Tokenizer::can_cut_before); none: all is train.
int64_t one_document_cut(const PrepareOptions& o, const Doc& d, const Tokenizer& tok) {
  if (!(o.val_fraction > 0)) return d.end;
  const std::string& path = o.texts[d.file];
  if (!tok.as<CharTokenizer>()) {
    const int64_t cut = d.begin + static_cast<int64_t>(static_cast<double>(d.end - d.begin) * (1.0 - o.val_fraction));
    // windows of 1 MiB overlapping by 64 KiB: a cut is judged with the bytes around it in view
    constexpr int64_t window = 1 << 20, overlap = 64 << 10;
    for (int64_t at = std::max(d.begin, cut - overlap);; at += window - 2 * overlap) {
      const std::string s = read_range(path, at, std::min(window, d.end - at));
      const bool last = at + static_cast<int64_t>(s.size()) >= d.end;
      const size_t stop = last ? s.size() : s.size() - overlap;
      for (size_t i = static_cast<size_t>(std::max<int64_t>(1, cut - at)); i < stop; i++)
        if (tok.can_cut_before(s, i)) return at + static_cast<int64_t>(i);
      if (last) return d.end;
    }
  }
  int64_t n = 0;  // code points = tokens
  for (int64_t at = d.begin; at < d.end; at += 16 << 20)
    for (char c : read_range(path, at, std::min<int64_t>(16 << 20, d.end - at))) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  const auto n_train = static_cast<int64_t>(static_cast<double>(n) * (1.0 - o.val_fraction));
  int64_t seen = 0;
  for (int64_t at = d.begin; at < d.end; at += 16 << 20) {
    const std::string s = read_range(path, at, std::min<int64_t>(16 << 20, d.end - at));
    for (size_t i = 0; i < s.size(); i++)
      if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && seen++ == n_train) return at + static_cast<int64_t>(i);
  }
  return d.end;
}

/// The split: the last val_fraction of the documents, or of one document's tokens.
Split split_documents(const PrepareOptions& o, const std::vector<Doc>& docs, const Tokenizer& tok, PrepareResult& r) {
  Split sp;
  if (docs.size() == 1) {
    const Doc& d = docs[0];
    const int64_t cut = one_document_cut(o, d, tok);
    if (o.val_fraction > 0 && cut >= d.end)  // the val split was empty without a word
      std::fprintf(stderr,
                   "tapelm: warning: %s: no place after the first %.0f%% of this one document where the tokenizer's pieces allow a cut: "
                   "the val split is empty (give several documents with --doc-sep, or --val-fraction 0)\n",
                   o.texts[d.file].c_str(), 100.0 * (1.0 - o.val_fraction));
    sp.train.push_back({d.file, d.begin, cut, true});
    if (cut < d.end) sp.val.push_back({d.file, cut, d.end, false});
    r.train_docs = 1;
    return sp;
  }
  auto n_val = static_cast<int64_t>(static_cast<double>(docs.size()) * o.val_fraction);
  if (o.val_fraction > 0) n_val = std::clamp<int64_t>(n_val, 1, static_cast<int64_t>(docs.size()) - 1);
  const size_t n_train = docs.size() - static_cast<size_t>(n_val);
  for (size_t i = 0; i < docs.size(); i++) (i < n_train ? sp.train : sp.val).push_back({docs[i].file, docs[i].begin, docs[i].end, true});
  r.train_docs = static_cast<int64_t>(n_train);
  r.val_docs = n_val;
  return sp;
}

/// Progress of the encoding pass: MB done of the documents' MB, rate and ETA, once a second.
struct EncodeProgress {
  bool on;
  int64_t total, done = 0;
  Clock::time_point t0 = Clock::now(), last = Clock::now();
  void add(int64_t bytes) {
    done += bytes;
    if (!on || since(last) < 1.0) return;
    last = Clock::now();
    const double mb = done / 1e6, rate = mb / std::max(since(t0), 1e-9);
    std::printf("prepare: %.1f / %.1f MB (%.0f%%), %.1f MB/s, ETA %.0fs\n", mb, total / 1e6,
                100.0 * done / std::max<int64_t>(total, 1), rate, (total / 1e6 - mb) / std::max(rate, 1e-9));
    std::fflush(stdout);
  }
};

/// Encodes one split's segments into dir/<name>_NNNNNN.bin: batches of pieces read in order,
/// encoded on every thread. Returns the shards as meta.json lists them.
nlohmann::json encode_split(const PrepareOptions& o, const Tokenizer& tok, const std::vector<Segment>& segs,
                            const std::string& name, DirectoryCommit& out, EncodeProgress& progress, int64_t* tokens) {
  const size_t batch = static_cast<size_t>(4 * std::max(1, get_num_threads()));
  ShardWriter w([&out](const std::string& file) { return out.path(file); }, name, tok.vocab_size() > 65536, o.shard_tokens);
  Chunker chunker(o.texts, tok, o.chunk_bytes);
  std::vector<Piece> pieces;
  std::vector<std::vector<int32_t>> ids;
  size_t si = 0;
  bool in_segment = false;
  for (;;) {
    pieces.clear();
    while (pieces.size() < batch) {
      if (!in_segment) {
        if (si == segs.size()) break;
        chunker.start(segs[si].file, segs[si].begin, segs[si].end, segs[si].doc_start);
        si++;
        in_segment = true;
      }
      Piece p;
      if (chunker.next(p)) pieces.push_back(std::move(p));
      else in_segment = false;
    }
    if (pieces.empty()) break;
    ids.assign(pieces.size(), {});
    parallel_for(static_cast<int64_t>(pieces.size()), [&](int64_t i) {
      const Piece& p = pieces[i];
      if (p.bos) ids[i].push_back(tok.bos_id());
      try {
        const std::vector<int32_t> e = encode_in_steps(tok, p.text, static_cast<size_t>(std::max<int64_t>(2, o.encode_bytes)));
        ids[i].insert(ids[i].end(), e.begin(), e.end());
      } catch (const Error& e) {
        throw Error(ErrorKind::data, "data file " + o.texts[p.file] + " (the text from byte " + std::to_string(p.at) + "): " + e.what());
      }
    });
    for (size_t i = 0; i < pieces.size(); i++) {
      w.write(ids[i]);
      progress.add(static_cast<int64_t>(pieces[i].text.size()) + (pieces[i].drop_space ? 1 : 0));
    }
  }
  w.finish();
  *tokens = w.total();
  nlohmann::json shards = nlohmann::json::array();
  for (const auto& [file, n] : w.shards()) shards.push_back({{"file", file}, {"tokens", n}});
  return shards;
}

/// meta.json of the corpus. File names that are not UTF-8 are kept with U+FFFD in their place:
/// they only say where the text came from.
std::string corpus_meta(const PrepareOptions& o, const PrepareResult& r, const nlohmann::json& train_shards,
                        const nlohmann::json& val_shards, const std::string& tok_file) {
  std::vector<std::string> files;
  for (const std::string& f : o.texts) files.push_back(fs::path(f).filename().string());
  const nlohmann::json meta = {
      {"format", "tapelm-corpus"},
      {"version", 1},
      {"tokenizer", {{"kind", r.tok.kind_name()}, {"file", tok_file}, {"vocab_size", r.tok.vocab_size()},
                     {"bos_id", r.tok.bos_id()}, {"eos_id", r.tok.eos_id()}, {"type", o.tokenizer}}},
      {"header", true},
      {"token_bytes", r.tok.vocab_size() > 65536 ? 4 : 2},
      {"train", {{"shards", train_shards}, {"tokens", r.train_tokens}, {"documents", r.train_docs}}},
      {"val", {{"shards", val_shards}, {"tokens", r.val_tokens}, {"documents", r.val_docs}}},
      {"source", {{"files", files}, {"bytes", r.text_bytes}, {"doc_sep", o.doc_sep}, {"val_fraction", o.val_fraction}}}};
  return meta.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

/// The files of a corpus in its directory: what a new corpus replaces.
bool corpus_file(const std::string& n) {
  const bool shard = (n.rfind("train_", 0) == 0 || n.rfind("val_", 0) == 0) && n.ends_with(".bin");
  return shard || n == "train.bin" || n == "val.bin" || n == "tokenizer.json" || n == "tokenizer.model" ||
         n == "tokenizer.byte_bpe.json" || n == "tokenizer.fallback_bpe.json" ||
         n == "meta.json";
}

}  // namespace

PrepareResult prepare_corpus(const PrepareOptions& o) {
  const auto t0 = Clock::now();
  check_options(o);
  PrepareResult r;
  const Inputs in = read_inputs(o, r);
  DirectoryCommit out(o.out_dir, "corpus", corpus_file, ErrorKind::data);  // one writer: a second prepare fails here
  r.tok = make_tokenizer(o, in);
  const Split sp = split_documents(o, in.docs, r.tok, r);
  const auto t_enc = Clock::now();
  EncodeProgress progress{o.progress, in.doc_bytes};
  const nlohmann::json train = encode_split(o, r.tok, sp.train, "train", out, progress, &r.train_tokens);
  const nlohmann::json val = encode_split(o, r.tok, sp.val, "val", out, progress, &r.val_tokens);
  r.shards = static_cast<int64_t>(train.size() + val.size());
  r.encode_seconds = since(t_enc);
  const std::string tok_file = corpus_file_name(r.tok.kind());
  write_files_atomic({{out.path(tok_file), r.tok.as<CharTokenizer>() ? r.tok.serialized() + "\n" : r.tok.serialized()},
                      {out.path("meta.json"), corpus_meta(o, r, train, val, tok_file)}});
  out.commit();
  r.seconds = since(t0);
  return r;
}

}  // namespace tapelm
