#include "data/tokenizer/bytebpe/bpe.h"

#include <atomic>
#include <climits>
#include <queue>
#include <tuple>

#include "data/tokenizer/bytebpe/byte_level.h"
#include "data/tokenizer/utf8.h"

namespace tapelm::bytebpe {

namespace {

std::atomic<uint64_t> next_serial{1};

struct Hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct Eq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

// Merged ids of one pre-token, cached per thread (words repeat: most of a corpus is hits).
struct WordCache {
  uint64_t serial = 0;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, Eq> map;
};

}  // namespace

Bpe Bpe::parse(const Parser& p, const json& mo) {
  Bpe m;
  if (!mo.is_object()) p.fail("model", "is not an object");
  auto ty = mo.find("type");
  if (ty != mo.end() && !(ty->is_string() && ty->get<std::string>() == "BPE"))
    p.fail("model.type", "is " + p.cut(*ty) + ", expected \"BPE\"");
  if (auto d = mo.find("dropout"); d != mo.end() && !d->is_null() && !(d->is_number() && d->get<double>() == 0))
    p.fail("model.dropout", "is " + p.cut(*d) + ": BPE dropout is for training, not supported");
  m.byte_fallback_ = p.flag(mo, "byte_fallback", "model", false);
  m.fuse_unk_ = p.flag(mo, "fuse_unk", "model", false);
  p.empty_string(mo, "continuing_subword_prefix", "model");
  p.empty_string(mo, "end_of_word_suffix", "model");
  m.ignore_merges_ = p.flag(mo, "ignore_merges", "model", false);
  const json& vocab = p.member(mo, "vocab", "model");
  if (!vocab.is_object()) p.fail("model.vocab", "is not an object");
  std::vector<int8_t> seen;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = p.id(it.value(), "model.vocab[" + json(it.key()).dump() + "]");
    if (id >= static_cast<int64_t>(vocab.size()) + (1 << 20))
      p.fail("model.vocab[" + json(it.key()).dump() + "]", "is " + std::to_string(id) + ", far beyond the vocabulary's size");
    if (static_cast<size_t>(id) >= m.pieces_.size()) {
      m.pieces_.resize(id + 1);
      seen.resize(id + 1, 0);
    }
    if (seen[id]) p.fail("model.vocab", "gives id " + std::to_string(id) + " to two tokens");
    seen[id] = 1;
    m.pieces_[id] = it.key();
    m.vocab_.emplace(it.key(), id);
  }
  if (m.pieces_.empty()) p.fail("model.vocab", "is empty");
  // The unknown token matters with byte fallback alone (a byte-level vocabulary spells every byte).
  const json unk = m.byte_fallback_ && mo.contains("unk_token") ? mo["unk_token"] : json(nullptr);
  if (!unk.is_null()) {
    if (!unk.is_string()) p.fail("model.unk_token", "is not a string or null: " + p.cut(unk));
    auto it = m.vocab_.find(unk.get<std::string>());
    if (it == m.vocab_.end()) p.fail("model.unk_token", "is " + p.cut(unk) + ", not in model.vocab");
    m.unk_ = it->second;
  }
  if (m.byte_fallback_) {
    // Hugging Face spells byte b as format!("<{b:#04X}>"): "<0x0A>"; a vocabulary may lack some.
    static const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
      const std::string s = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
      auto it = m.vocab_.find(s);
      m.byte_id_[b] = it == m.vocab_.end() ? -1 : it->second;
    }
  } else {
    const auto& chars = byte_to_char();
    for (int b = 0; b < 256; b++) {
      std::string s;
      utf8_append(s, chars[b]);
      auto it = m.vocab_.find(s);
      if (it == m.vocab_.end())
        p.fail("model.vocab", "lacks the byte-level token for byte " + std::to_string(b) + " (\"" + s +
                                  "\"): not a byte-level vocabulary, and model.byte_fallback is false");
      m.byte_id_[b] = it->second;
      m.byte_spelling_[b] = s;
    }
  }
  const json& merges = p.member(mo, "merges", "model");
  if (!merges.is_array()) p.fail("model.merges", "is not an array");
  m.merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); r++) {
    const json& e = merges[r];
    const std::string field = "model.merges[" + std::to_string(r) + "]";
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        p.fail(field, "is " + p.cut(e) + ", not two tokens separated by one space");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    } else {
      p.fail(field, "is " + p.cut(e) + ", not \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = m.vocab_.find(a), ib = m.vocab_.find(b), iab = m.vocab_.find(a + b);
    if (ia == m.vocab_.end() || ib == m.vocab_.end() || iab == m.vocab_.end())
      p.fail(field, "(" + p.cut(e) + ") names a token not in model.vocab");
    const uint64_t key = uint64_t(uint32_t(ia->second)) << 32 | uint32_t(ib->second);
    m.merges_[key] = {static_cast<int32_t>(r), iab->second};  // a repeated pair: the later rank, as Hugging Face's map keeps
    m.merge_list_.emplace_back(ia->second, ib->second);
  }
  m.serial_ = next_serial.fetch_add(1);
  return m;
}

int32_t Bpe::id_of(const std::string& spelling) const {
  auto it = vocab_.find(spelling);
  return it == vocab_.end() ? -1 : it->second;
}

std::vector<std::string> Bpe::merges() const {
  std::vector<std::string> out;
  out.reserve(merge_list_.size());
  for (const auto& [a, b] : merge_list_) out.push_back(pieces_[a] + " " + pieces_[b]);
  return out;
}

// The merge of the adjacent pair (left, right) as (rank, merged id), or null.
const std::pair<int32_t, int32_t>* Bpe::merge_of(int32_t left, int32_t right) const {
  auto it = merges_.find(uint64_t(uint32_t(left)) << 32 | uint32_t(right));
  return it == merges_.end() ? nullptr : &it->second;
}

void Bpe::merge_small(std::vector<int32_t>& syms) const {
  // ranks[i]: the rank of pair (i, i+1), or INT_MAX. Each round merges the leftmost lowest rank.
  std::vector<int32_t> ranks(syms.size(), INT_MAX), merged(syms.size(), -1);
  auto look = [&](size_t i) {
    if (i + 1 >= syms.size()) {
      ranks[i] = INT_MAX;
      return;
    }
    const auto* mg = merge_of(syms[i], syms[i + 1]);
    ranks[i] = mg ? mg->first : INT_MAX;
    merged[i] = mg ? mg->second : -1;
  };
  for (size_t i = 0; i < syms.size(); i++) look(i);
  while (syms.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < syms.size(); i++)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == INT_MAX) break;
    syms[best] = merged[best];
    syms.erase(syms.begin() + best + 1);
    ranks.erase(ranks.begin() + best + 1);
    merged.erase(merged.begin() + best + 1);
    look(best);
    if (best > 0) look(best - 1);
  }
}

// The same merges in O(n log n) for long pre-tokens (a megabyte of letters is one GPT-2 pre-token).
void Bpe::merge_large(std::vector<int32_t>& syms) const {
  const int n = static_cast<int>(syms.size());
  std::vector<int> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (int i = 0; i < n; i++) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  using Item = std::tuple<int32_t, int, int32_t>;  // rank, position, merged id
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    if (const auto* mg = merge_of(syms[i], syms[next[i]])) heap.emplace(mg->first, i, mg->second);
  };
  for (int i = 0; i < n; i++) push(i);
  while (!heap.empty()) {
    const auto [rank, i, id] = heap.top();
    heap.pop();
    if (!alive[i] || next[i] < 0) continue;
    const auto* mg = merge_of(syms[i], syms[next[i]]);
    if (!mg || mg->second != id) continue;
    const int j = next[i];
    syms[i] = id;
    alive[j] = 0;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  std::vector<int32_t> out;
  for (int i = 0; i >= 0 && i < n; i = next[i]) out.push_back(syms[i]);
  syms.swap(out);
}

// The symbols merging starts from. byte_fallback: each character's token; a character not in the
// vocabulary is its bytes' <0xAB> tokens when all exist, else the unknown token (one for a run of
// them with fuse_unk), none without one: Hugging Face's BPE::merge_word, whose pending unknown
// token is written when the next character found in the vocabulary comes or the word ends.
void Bpe::first_symbols(std::string_view w, std::vector<int32_t>& syms) const {
  syms.reserve(w.size());
  if (!byte_fallback_) {
    for (unsigned char b : w) syms.push_back(byte_id_[b]);
    return;
  }
  bool unk_pending = false;
  std::string ch;
  for (size_t i = 0; i < w.size();) {
    size_t n = 1;
    while (i + n < w.size() && (static_cast<unsigned char>(w[i + n]) & 0xC0) == 0x80) n++;
    ch.assign(w.substr(i, n));
    i += n;
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      if (unk_pending) syms.push_back(unk_), unk_pending = false;
      syms.push_back(it->second);
      continue;
    }
    bool all = true;
    for (unsigned char b : ch) all = all && byte_id_[b] >= 0;
    if (all) {
      for (unsigned char b : ch) syms.push_back(byte_id_[b]);
      continue;
    }
    if (unk_ < 0) continue;  // no unknown token: the character is dropped, as Hugging Face's BPE does
    if (unk_pending && !fuse_unk_) syms.push_back(unk_);
    unk_pending = true;
  }
  if (unk_pending) syms.push_back(unk_);
}

void Bpe::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    std::string spelled;
    if (byte_fallback_) spelled = w;
    else
      for (unsigned char b : w) spelled += byte_spelling_[b];
    if (auto it = vocab_.find(spelled); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> syms;
  first_symbols(w, syms);
  if (syms.size() <= 64)
    merge_small(syms);
  else
    merge_large(syms);
  out.insert(out.end(), syms.begin(), syms.end());
}

void Bpe::encode_word(std::string_view w, std::vector<int32_t>& out) const {
  thread_local WordCache cache;
  if (cache.serial != serial_) {
    cache.map.clear();
    cache.serial = serial_;
  }
  if (w.empty()) return;
  auto it = cache.map.find(w);
  if (it != cache.map.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t at = out.size();
  merge_word(w, out);
  if (w.size() <= 64) {
    if (cache.map.size() >= (1 << 18)) cache.map.clear();
    cache.map.emplace(std::string(w), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(at), out.end()));
  }
}

}  // namespace tapelm::bytebpe
