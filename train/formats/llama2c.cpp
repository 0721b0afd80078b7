#include "train/formats/llama2c.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <map>
#include <string_view>

#include "data/io.h"
#include "data/outdir.h"
#include "train/formats/layout.h"
#include "train/formats/model_sink.h"
#include "train/formats/model_source.h"
#include "train/formats/tensor_source.h"
#include "nn/accounting.h"
#include "train/formats/checkpoint.h"
#include "data/tokenizer/char.h"
#include "data/tokenizer/sentencepiece.h"

namespace tapelm::llama2c {

namespace {

// The files are little-endian; so is every machine tapelm builds on (x86-64, aarch64).
static_assert(std::endian::native == std::endian::little);

constexpr int64_t kHeaderBytesV0 = 7 * 4;
constexpr int64_t kIntMax = 2147483647;

// The file's tensors in the order the version writes them.
std::vector<formats::FileTensor> layout(const Header& h) {
  return formats::layout(to_config(h), formats::Family::llama, formats::Format::llama2c, {.llama2c_version = h.version});
}

// A llama2.c file read in place, its mapping owned: its tensors follow the header in the layout's order.
class Source : public formats::TensorSource {
 public:
  Source(MappedFile file, int64_t offset, const std::vector<formats::FileTensor>& layout) : file_(std::move(file)) {
    uint64_t at = static_cast<uint64_t>(offset);
    for (const formats::FileTensor& t : layout) {
      offsets_[t.name] = at;
      infos_.push_back({t.name, t.shape, "F32"});
      at += 4 * static_cast<uint64_t>(shape_numel(t.shape));
    }
  }
  std::string what() const override { return "llama2.c model " + file_.path(); }
  const std::vector<Info>& tensors() const override { return infos_; }
  const Info* find(const std::string& name) const override {
    for (const Info& i : infos_)
      if (i.name == name) return &i;
    return nullptr;
  }
  void read_f32(const Info& t, float* out) const override {
    file_.check_unchanged();
    const uint64_t at = offsets_.at(t.name), n = 4 * static_cast<uint64_t>(shape_numel(t.shape));
    std::memcpy(out, file_.data() + at, n);
    file_.check_unchanged();
    file_.release(at, at + n);  // a model larger than memory stays out of the RSS
  }

 private:
  MappedFile file_;
  std::map<std::string, uint64_t> offsets_;
  std::vector<Info> infos_;
};

int32_t get_i32(std::string_view b, int64_t off) {
  int32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}

void put_i32(std::string& b, int64_t v) {
  const int32_t x = static_cast<int32_t>(v);
  b.append(reinterpret_cast<const char*>(&x), 4);
}

// The seven ints of either version, from offset off; vocab_size's sign is the caller's business.
Header parse_ints(std::string_view b, int64_t off, int version) {
  Header h;
  h.version = version;
  h.dim = get_i32(b, off);
  h.hidden_dim = get_i32(b, off + 4);
  h.n_layers = get_i32(b, off + 8);
  h.n_heads = get_i32(b, off + 12);
  h.n_kv_heads = get_i32(b, off + 16);
  h.vocab_size = get_i32(b, off + 20);
  h.max_seq_len = get_i32(b, off + 24);
  return h;
}

std::string describe(const Header& h) {
  return "dim " + std::to_string(h.dim) + ", hidden_dim " + std::to_string(h.hidden_dim) + ", n_layers " +
         std::to_string(h.n_layers) + ", n_heads " + std::to_string(h.n_heads) + ", n_kv_heads " +
         std::to_string(h.n_kv_heads) + ", vocab_size " + std::to_string(h.vocab_size) + ", max_seq_len " +
         std::to_string(h.max_seq_len);
}

// "" when the sizes describe a model tapelm can hold, else why not.
std::string header_problem(const Header& h) {
  const std::pair<const char*, int64_t> sizes[] = {{"dim", h.dim},           {"hidden_dim", h.hidden_dim},
                                                   {"n_layers", h.n_layers}, {"n_heads", h.n_heads},
                                                   {"n_kv_heads", h.n_kv_heads}, {"vocab_size", h.vocab_size},
                                                   {"max_seq_len", h.max_seq_len}};
  for (const auto& [key, v] : sizes)
    if (v <= 0) return std::string(key) + " " + std::to_string(v) + " is not positive";
  if (h.dim % h.n_heads != 0)
    return "dim " + std::to_string(h.dim) + " is not a multiple of n_heads " + std::to_string(h.n_heads);
  if (h.n_heads % h.n_kv_heads != 0)
    return "n_heads " + std::to_string(h.n_heads) + " is not a multiple of n_kv_heads " + std::to_string(h.n_kv_heads);
  if ((h.dim / h.n_heads) % 2 != 0) return "head size " + std::to_string(h.dim / h.n_heads) + " is odd (RoPE rotates pairs)";
  return "";
}

// Bytes a file with this header holds (128-bit: a hostile header cannot overflow it).
unsigned __int128 file_bytes(const Header& h) {
  unsigned __int128 n = 0;
  for (const formats::FileTensor& e : layout(h)) {
    unsigned __int128 k = 1;
    for (int64_t s : e.shape) k *= static_cast<uint64_t>(s);
    n += k;
  }
  return (h.version == 0 ? kHeaderBytesV0 : kHeaderBytesV1) + 4 * n;
}

std::string bytes_str(unsigned __int128 n) {
  if (n > static_cast<unsigned __int128>(INT64_MAX)) return "more than 2^63";
  return std::to_string(static_cast<uint64_t>(n));
}

// Bytes the layers alone take (every layer: two norms, wq, wk, wv, wo, w1, w2, w3), in 128 bits
// and without listing them: a hostile n_layers of 2^31 − 1 would make layout() list billions of
// entries before any size check could refuse the file.
unsigned __int128 layer_bytes(const Header& h) {
  using u = unsigned __int128;
  const u d = static_cast<uint64_t>(h.dim), f = static_cast<uint64_t>(h.hidden_dim);
  const u kv_dim = d / static_cast<uint64_t>(h.n_heads) * static_cast<uint64_t>(h.n_kv_heads);
  return 4 * static_cast<u>(static_cast<uint64_t>(h.n_layers)) * (2 * d + 2 * d * d + 2 * d * kv_dim + 3 * d * f);
}

// A v0 reading that failed its size check: is it a v1 file whose magic was damaged?
bool v1_with_bad_magic(std::string_view b) {
  if (static_cast<int64_t>(b.size()) < kHeaderBytesV1 || get_i32(b, 4) != 1) return false;
  Header h = parse_ints(b, 8, 1);
  h.shared_classifier = static_cast<uint8_t>(b[36]) != 0;
  return header_problem(h).empty() && layer_bytes(h) <= b.size() && file_bytes(h) == b.size();
}

// The header's bytes: version 0's seven ints (vocab_size negative for an own classifier), or
// version 1's 256 bytes.
std::string header_bytes(const Header& h) {
  std::string b;
  if (h.version == 1) {
    const uint32_t magic = kMagic;
    b.append(reinterpret_cast<const char*>(&magic), 4);
    put_i32(b, 1);
  }
  for (int64_t v : {h.dim, h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads,
                    h.version == 0 && !h.shared_classifier ? -h.vocab_size : h.vocab_size, h.max_seq_len})
    put_i32(b, v);
  if (h.version == 1) {
    b.push_back(static_cast<char>(h.shared_classifier ? 1 : 0));
    b.resize(kHeaderBytesV1, '\0');
  }
  return b;
}

Tensor permute_rope_rows(const Tensor& w, int64_t n_heads, bool to_interleaved) {
  Tensor out = Tensor::empty(w.shape());
  formats::permute_rope_rows(w.data(), out.data(), n_heads, w.dim(0), w.dim(1), to_interleaved);
  return out;
}

}  // namespace

GPTConfig to_config(const Header& h) {
  GPTConfig c;
  c.vocab_size = h.vocab_size;
  c.block_size = h.max_seq_len;
  c.n_layer = h.n_layers;
  c.n_head = h.n_heads;
  c.n_kv_head = h.n_kv_heads;
  c.n_embd = h.dim;
  c.mlp_hidden = h.hidden_dim;
  c.norm = NormKind::RMSNorm;
  c.norm_eps = 1e-5;
  c.pos = PosKind::Rope;
  c.rope_theta = 10000.0;
  c.mlp = MlpKind::SwiGLU;
  c.bias = false;
  c.tie_embeddings = h.shared_classifier;
  c.dropout = 0.0;
  return c;
}

Tensor interleave_rope_rows(const Tensor& w, int64_t n_heads) { return permute_rope_rows(w, n_heads, true); }
Tensor half_split_rope_rows(const Tensor& w, int64_t n_heads) { return permute_rope_rows(w, n_heads, false); }

std::pair<Tensor, Tensor> rope_tables(int64_t hd, int64_t n_pos) {
  const int64_t half = hd / 2;
  Tensor c = Tensor::empty({n_pos, half}), s = Tensor::empty({n_pos, half});
  for (int64_t i = 0; i < half; i++) {
    // float32 throughout, as model.py's precompute_freqs_cis; cos and sin correctly rounded
    const float f = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(hd));
    for (int64_t p = 0; p < n_pos; p++) {
      const float a = static_cast<float>(p) * f;
      c.data()[p * half + i] = static_cast<float>(std::cos(static_cast<double>(a)));
      s.data()[p * half + i] = static_cast<float>(std::sin(static_cast<double>(a)));
    }
  }
  return {c, s};
}

namespace {

// The header of a llama2.c file of `b`'s bytes, checked against the file's size; *off is set to
// where the tensors begin.
Header read_header(std::string_view b, const std::string& path, int64_t* off) {
  const int64_t size = static_cast<int64_t>(b.size());
  auto fail_here = [&](const std::string& why) { throw Error(ErrorKind::data, "llama2.c model " + path + ": " + why); };
  if (size < kHeaderBytesV0)
    fail_here("truncated: " + std::to_string(size) + " bytes, shorter than the " + std::to_string(kHeaderBytesV0) + "-byte header");
  Header h;
  *off = kHeaderBytesV0;
  uint32_t magic;
  std::memcpy(&magic, b.data(), 4);
  if (magic == kMagic) {
    if (size < kHeaderBytesV1) fail_here("truncated: " + std::to_string(size) + " bytes, shorter than the version 1 header (256 bytes)");
    const int32_t version = get_i32(b, 4);
    if (version != 1)
      fail_here("version " + std::to_string(version) + " is not supported (tapelm reads version 0 and 1" +
                (version == 2 ? std::string("; version 2 is int8-quantized") : std::string()) + ")");
    h = parse_ints(b, 8, 1);
    const uint8_t shared = static_cast<uint8_t>(b[36]);
    if (shared > 1) fail_here("shared_classifier byte is " + std::to_string(shared) + ", not 0 or 1");
    h.shared_classifier = shared == 1;
    *off = kHeaderBytesV1;
  } else {
    h = parse_ints(b, 0, 0);
    h.shared_classifier = h.vocab_size > 0;
    h.vocab_size = std::abs(h.vocab_size);  // int64: INT32_MIN is safe
  }
  const std::string why = header_problem(h);
  // layers that cannot fit are a truncated file, said before layout() would list them
  const unsigned __int128 want = !why.empty() ? 0 : layer_bytes(h) > static_cast<unsigned __int128>(size) ? layer_bytes(h) : file_bytes(h);
  const bool fits = why.empty() && want == static_cast<unsigned __int128>(size);
  if (!fits && h.version == 0 && v1_with_bad_magic(b)) {
    char m[16];
    std::snprintf(m, sizeof m, "%08x", magic);
    fail_here("bad magic 0x" + std::string(m) + ": a version 1 header follows, but version 1 files start with 0x616b3432");
  }
  if (!why.empty()) fail_here("bad header: " + why + " (" + describe(h) + ")");
  if (!fits)
    fail_here(std::string(want > static_cast<unsigned __int128>(size) ? "truncated: " : "sizes disagree: ") + "the header (" + describe(h) +
              (h.shared_classifier ? ", shared classifier" : ", own classifier") + ") needs " + bytes_str(want) + " bytes, the file has " +
              std::to_string(size));
  return h;
}

}  // namespace


void check_exportable(const GPTConfig& c, const std::string& what) {
  std::string why;
  if (c.norm != NormKind::RMSNorm) why = "norm \"" + to_string(c.norm) + "\" (llama2.c has RMSNorm only)";
  else if (c.mlp != MlpKind::SwiGLU) why = "mlp \"" + to_string(c.mlp) + "\" (llama2.c has SwiGLU only)";
  else if (c.bias) why = "biases (llama2.c has none)";
  else if (c.per_layer_kv()) why = "key/value heads per layer " + c.kv_heads_str() + " (its header has one n_kv_heads)";
  else if (c.pos != PosKind::Rope) why = "pos \"" + to_string(c.pos) + "\" (llama2.c has RoPE only)";
  else if (c.head_dim() * c.n_head != c.n_embd) why = "a head dim that is not n_embd / n_head";
  else if (c.rope_theta != 10000.0) why = "rope_theta " + std::to_string(c.rope_theta) + " (run.c uses 10000)";
  else if (c.rope_dims() != c.head_dim()) why = "rotary_dims " + std::to_string(c.rotary_dims) + " (run.c rotates the whole head)";
  else if (c.parallel_residual) why = "parallel_residual (run.c adds the attention, then the MLP)";
  else if (c.embed_scale != 0) why = "embed_scale (run.c reads the embedding as it is)";
  else if (c.qk_norm != QkNorm::none || c.norm_position != NormPosition::pre) why = "q/k norms or norms after the sublayers (run.c has neither)";
  else if (c.norm_eps != 1e-5) why = "norm_eps " + std::to_string(c.norm_eps) + " (run.c uses 1e-5)";
  else if (c.n_embd > kIntMax || c.mlp_hidden > kIntMax || c.block_size > kIntMax || c.vocab_size > kIntMax)
    why = "sizes beyond the header's int32";
  if (!why.empty()) throw Error(ErrorKind::config, what + ": llama2.c cannot express " + why);
}

Header to_header(const GPTConfig& c) {
  Header h;
  h.dim = c.n_embd;
  h.hidden_dim = c.mlp_hidden;
  h.n_layers = c.n_layer;
  h.n_heads = c.n_head;
  h.n_kv_heads = c.n_kv_head;
  h.vocab_size = c.vocab_size;
  h.max_seq_len = c.block_size;
  h.shared_classifier = c.tie_embeddings;
  return h;
}

namespace {
// Version 0's RoPE tables: the ones given when both are of the header's shape (an imported file's,
// so that the bytes come back), else model.py's.
std::pair<Tensor, Tensor> tables_for(const Header& h, const Tensor* freq_cis_real, const Tensor* freq_cis_imag) {
  const Shape want{h.max_seq_len, h.dim / h.n_heads / 2};
  if (freq_cis_real && freq_cis_imag && freq_cis_real->shape() == want && freq_cis_imag->shape() == want) return {*freq_cis_real, *freq_cis_imag};
  return rope_tables(h.dim / h.n_heads, h.max_seq_len);
}
}  // namespace

std::string model_bytes(const GPT& model, int version, const Tensor* freq_cis_real, const Tensor* freq_cis_imag) {
  const GPTConfig& c = model.config();
  check_exportable(c, "model");
  if (version != 0 && version != 1) throw Error(ErrorKind::usage, "llama2.c version " + std::to_string(version) + " (0 or 1)");
  Header h = to_header(c);
  h.version = version;
  formats::TensorMap tensors = formats::tensors_of(model);
  if (version == 0) {
    auto [cs, sn] = tables_for(h, freq_cis_real, freq_cis_imag);
    tensors.emplace("freq_cis_real", cs);
    tensors.emplace("freq_cis_imag", sn);
  }
  std::string b = header_bytes(h);
  b.reserve(static_cast<size_t>(file_bytes(h)));
  for (const formats::FileTensor& t : layout(h)) {
    const std::vector<float> v = formats::file_values(t, tensors);
    b.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  return b;
}

std::string tokenizer_bytes(const Tokenizer& tok, const std::string& what) {
  auto refuse = [&](const std::string& why) {
    throw Error(ErrorKind::config, what + ": llama2.c cannot express " + why);
  };
  if (tok.as<CharTokenizer>()) refuse("a char tokenizer (run.c's tokenizer.bin is a sentencepiece vocabulary with byte fallback)");
  const int32_t V = tok.vocab_size();
  if (V < 259 || tok.bos_id() != 1 || tok.eos_id() != 2)
    refuse("a sentencepiece tokenizer without ids 0/1/2 = unk/bos/eos (run.c's BOS is 1, its EOS 2)");
  for (int32_t b = 0; b < 256; b++) {
    char want[8];
    std::snprintf(want, sizeof want, "<0x%02X>", b);
    if (!tok.is_byte(3 + b) || tok.piece(3 + b) != want)
      refuse("a sentencepiece tokenizer without the byte pieces <0x00>..<0xFF> at ids 3..258 (run.c's byte fallback)");
  }
  std::vector<std::string> pieces(V);
  uint32_t longest = 0;
  for (int32_t i = 0; i < V; i++) {
    std::string p = i == 1 ? "\n<s>\n" : i == 2 ? "\n</s>\n" : tok.piece(i);
    for (size_t at; (at = p.find("\xE2\x96\x81")) != std::string::npos;) p.replace(at, 3, " ");
    longest = std::max(longest, static_cast<uint32_t>(p.size()));
    pieces[i] = std::move(p);
  }
  std::string b;
  b.append(reinterpret_cast<const char*>(&longest), 4);
  for (int32_t i = 0; i < V; i++) {
    const float score = tok.score(i);
    const uint32_t len = static_cast<uint32_t>(pieces[i].size());
    b.append(reinterpret_cast<const char*>(&score), 4);
    b.append(reinterpret_cast<const char*>(&len), 4);
    b += pieces[i];
  }
  return b;
}

namespace {
// The pieces of tokenizer.bin bytes; `what` starts every error.
TokenizerBin parse_tokenizer_bin(const std::string& b, int64_t vocab_size, const std::string& what) {
  auto fail_here = [&](const std::string& why) { throw Error(ErrorKind::data, what + ": " + why); };
  TokenizerBin t;
  if (b.size() < 4) fail_here("truncated: " + std::to_string(b.size()) + " bytes, shorter than its 4-byte header");
  std::memcpy(&t.max_token_length, b.data(), 4);
  size_t off = 4;
  for (int64_t i = 0; i < vocab_size; i++) {
    if (b.size() - off < 8)
      fail_here("holds " + std::to_string(i) + " pieces, fewer than the model's vocab_size " + std::to_string(vocab_size));
    float score;
    uint32_t len;
    std::memcpy(&score, b.data() + off, 4);
    std::memcpy(&len, b.data() + off + 4, 4);
    off += 8;
    if (len > b.size() - off) fail_here("piece " + std::to_string(i) + " of " + std::to_string(len) + " bytes runs past the end");
    if (len > t.max_token_length)
      fail_here("piece " + std::to_string(i) + " has " + std::to_string(len) + " bytes, more than max_token_length " +
                std::to_string(t.max_token_length));
    t.scores.push_back(score);
    t.pieces.push_back(b.substr(off, len));
    off += len;
  }
  return t;
}
}  // namespace

TokenizerBin read_tokenizer_bin(const std::string& path, int64_t vocab_size) {
  return parse_tokenizer_bin(read_file_bytes(path, "llama2.c tokenizer"), vocab_size, "llama2.c tokenizer " + path);
}

namespace {
// A llama2.c file opened and checked but not read (formats::OpenedModel: one tensor at a time, or
// the whole model), with version 0's RoPE tables read (they are small).
struct OpenedFile {
  Header header;
  formats::OpenedModel model;
  Tensor freq_cis_real, freq_cis_imag;
};

OpenedFile open_file(const std::string& path) {
  OpenedFile o;
  int64_t off = 0;
  MappedFile file(path, "llama2.c model");  // mapped once: the header read is the file the tensors are read from
  o.header = read_header(std::string_view(reinterpret_cast<const char*>(file.data()), file.size()), path, &off);
  const Header& h = o.header;
  formats::OpenedModel& m = o.model;
  m.path = path;
  m.format = "llama2c";
  m.what = "llama2.c model " + path;
  m.config = to_config(h);
  try {
    m.config.validate();
  } catch (const Error& e) {
    throw Error(ErrorKind::data, m.what + ": tapelm cannot hold this model: " + std::string(e.what()));
  }
  // What later commands build from the header must fit: sample's KV cache of one sequence of
  // max_seq_len positions, and the RoPE tables a version 0 export writes (max_seq_len × head size).
  const double kv_cache = 4.0 * 2 * static_cast<double>(h.n_layers) * static_cast<double>(h.max_seq_len) *
                          static_cast<double>(h.dim / h.n_heads * h.n_kv_heads);
  const double rope = 4.0 * static_cast<double>(h.max_seq_len) * static_cast<double>(h.dim / h.n_heads);
  check_memory(kv_cache + rope, available_memory_bytes(),
               m.what + ": max_seq_len " + std::to_string(h.max_seq_len) + " (the KV cache and RoPE tables of that context)");
  m.layout = layout(h);
  m.src = std::make_unique<Source>(std::move(file), off, m.layout);
  m.dtypes = "F32";
  for (const formats::FileTensor& t : m.layout) {
    if (!t.extra) continue;
    Tensor v = Tensor::empty(t.shape);
    m.src->read_f32(*m.src->find(t.name), v.data());
    if (const std::string bad = formats::non_finite(v); !bad.empty()) throw Error(ErrorKind::data, m.what + ": tensor " + t.name + " holds " + bad);
    (t.name == "freq_cis_real" ? o.freq_cis_real : o.freq_cis_imag) = v;
  }
  return o;
}
}  // namespace

Model read_model(const std::string& path) {
  OpenedFile o = open_file(path);
  const double bytes = static_cast<double>(file_bytes(o.header));
  check_memory(bytes, available_memory_bytes(), path + ": the model's " + std::to_string(static_cast<int64_t>(bytes / 4)) + " weights");
  Model m;
  m.header = o.header;
  m.gpt = std::make_unique<GPT>(o.model.config);
  formats::TensorMap into = formats::tensors_of(*m.gpt);
  o.model.read(into);
  m.freq_cis_real = o.freq_cis_real, m.freq_cis_imag = o.freq_cis_imag;
  return m;
}

Header import_model(const std::string& model_path, const std::string& tokenizer_model, const std::string& tokenizer_bin,
                    const std::string& out) {
  if (!tokenizer_bin.empty() && tokenizer_model.empty())
    throw Error(ErrorKind::usage, tokenizer_bin + ": a llama2.c tokenizer is checked against a sentencepiece model, and none was given");
  const OpenedFile m = open_file(model_path);
  Tokenizer tok;
  if (!tokenizer_model.empty()) {
    tok = SentencePiece::load_file(tokenizer_model);
    if (tok.vocab_size() != m.header.vocab_size)
      throw Error(ErrorKind::data, "sentencepiece model " + tokenizer_model + " has " + std::to_string(tok.vocab_size()) +
                                       " pieces, the model's vocab_size is " + std::to_string(m.header.vocab_size));
  }
  if (!tokenizer_bin.empty()) {
    const TokenizerBin have = read_tokenizer_bin(tokenizer_bin, m.header.vocab_size);
    const std::string want_bytes = tokenizer_bytes(tok, "sentencepiece model " + tokenizer_model);
    const TokenizerBin want = parse_tokenizer_bin(want_bytes, m.header.vocab_size, "sentencepiece model " + tokenizer_model);
    for (size_t i = 0; i < want.pieces.size(); i++)
      if (have.pieces[i] != want.pieces[i] || have.scores[i] != want.scores[i])
        throw Error(ErrorKind::data, "llama2.c tokenizer " + tokenizer_bin + ": piece " + std::to_string(i) +
                                         " differs from sentencepiece model " + tokenizer_model + "'s");
  }
  std::vector<std::pair<std::string, Tensor>> extras;
  if (m.header.version == 0) extras = {{"freq_cis_real", m.freq_cis_real}, {"freq_cis_imag", m.freq_cis_imag}};
  const nlohmann::json from{{"format", "llama2c"}, {"version", m.header.version}, {"file", std::filesystem::path(model_path).filename().string()}};
  // one tensor at a time: what is held is one file tensor (wq's rows permuted back), never the model
  write_streamed(out, m.model.config, tokenizer_model.empty() ? nullptr : &tok, {"imported_from", from.dump()}, WeightType::f32,
                 [&](formats::ModelSink& sink) { m.model.push_each(sink); }, extras);
  return m.header;
}

Header export_model(const formats::OpenedModel& m, int version, const std::string& out, std::string* tokenizer_path) {
  if (version != 0 && version != 1)
    throw Error(ErrorKind::usage, "llama2.c version " + std::to_string(version) + ": the versions are 0 and 1");
  const GPTConfig& cfg = m.config;
  check_exportable(cfg, m.path);
  std::string tok_bytes, tok_path;
  if (m.tok) {
    const Tokenizer& tok = *m.tok;
    tok_bytes = tokenizer_bytes(tok, m.path);
    if (tok.vocab_size() != cfg.vocab_size)
      throw Error(ErrorKind::config, m.path + ": its tokenizer has " + std::to_string(tok.vocab_size()) +
                                         " pieces, the model's vocab_size is " + std::to_string(cfg.vocab_size) +
                                         " (run.c reads vocab_size pieces)");
    tok_path = (std::filesystem::path(out).parent_path() / "tokenizer.bin").string();
    if (std::filesystem::absolute(tok_path) == std::filesystem::absolute(out))
      throw Error(ErrorKind::usage, out + ": the model cannot be written as tokenizer.bin, where its tokenizer goes");
  }
  Header h = to_header(cfg);
  h.version = version;
  // version 0's RoPE tables: an imported file's own (kept under /imported), else model.py's
  const std::map<std::string, Tensor> kept = m.format == "tapelm" ? read_imported(H5File::open_read(m.path)) : std::map<std::string, Tensor>{};
  auto table = [&](const char* name) {
    auto it = kept.find(name);
    return it == kept.end() ? nullptr : &it->second;
  };
  const auto [cs, sn] = version == 0 ? tables_for(h, table("freq_cis_real"), table("freq_cis_imag")) : std::pair<Tensor, Tensor>{};
  // each file tensor written at its place as its parameters arrive, one at a time
  std::vector<formats::Placement> placements;
  uint64_t at = header_bytes(h).size();
  for (const formats::FileTensor& t : layout(h)) {
    const Tensor extra = t.extra ? (t.name == "freq_cis_real" ? cs : sn) : Tensor();
    placements.push_back({t, 0, at, [extra](const std::vector<float>& v) {
                            if (extra.numel() > 0) return std::string(reinterpret_cast<const char*>(extra.data()), 4 * static_cast<size_t>(extra.numel()));
                            return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
                          }});
    at += 4 * static_cast<uint64_t>(shape_numel(t.shape));
  }
  // tokenizer.bin is a name the user did not give: written where there is none, or where the one
  // there is tapelm's (the folder's manifest lists it); one holding these very bytes is left as it is.
  std::vector<std::pair<std::string, std::string>> whole;
  std::optional<OutputFolder> folder;
  if (!tok_path.empty() && !(std::filesystem::is_regular_file(tok_path) && read_file_bytes(tok_path, "tokenizer file") == tok_bytes)) {
    const std::filesystem::path parent = std::filesystem::path(tok_path).parent_path();
    folder.emplace(parent.empty() ? "." : parent.string(), "folder of " + out, ErrorKind::data);
    folder->claim({"tokenizer.bin"}, "llama2c export");
    folder->keep();
    whole.emplace_back(tok_path, std::move(tok_bytes));
  }
  formats::write_placed("llama2.c model " + out, cfg, whole, {{out, header_bytes(h)}}, placements,
                        [&](formats::ModelSink& s) { m.push_each(s); });
  if (folder) folder->record({"tokenizer.bin"});
  if (tokenizer_path) *tokenizer_path = tok_path;
  return h;
}

}  // namespace tapelm::llama2c
