#include "data/tokenizer/bytebpe/normalizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "data/tokenizer/bytebpe/nfc_starters.h"

namespace tapelm::bytebpe {

namespace {

std::string utf8proc_nfc(const char* s, size_t size) {
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s), static_cast<utf8proc_ssize_t>(size), &dst,
                                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) throw Error(ErrorKind::data, std::string("NFC normalization failed: ") + utf8proc_errmsg(n));
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

bool library_starter(uint32_t cp) {
  return std::binary_search(std::begin(kNfcLibraryStarters), std::end(kNfcLibraryStarters), cp);
}

std::string nfc(const std::string& s) {
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return s;
  // NFC as Hugging Face's library computes it: its tables give the marks of nfc_starters.h class 0,
  // so each is a starter with no decomposition that nothing composes with. The text is normalized
  // in the runs between them, each kept as it is (utf8proc alone reordered `a\u1ac1\u0316`).
  std::string out;
  size_t from = 0;
  for (size_t i = 0; i < s.size();) {
    utf8proc_int32_t cp = -1;
    const utf8proc_ssize_t len = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i), static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (len <= 0) break;  // invalid UTF-8: utf8proc_map below names it
    if (cp >= 0 && library_starter(static_cast<uint32_t>(cp))) {
      if (i > from) out += utf8proc_nfc(s.data() + from, i - from);
      out.append(s, i, static_cast<size_t>(len));
      from = i + static_cast<size_t>(len);
    }
    i += static_cast<size_t>(len);
  }
  if (from == 0) return utf8proc_nfc(s.data(), s.size());
  if (from < s.size()) out += utf8proc_nfc(s.data() + from, s.size() - from);
  return out;
}

}  // namespace

Normalizer Normalizer::parse(const Parser& p, const json& n, const std::string& field) {
  Normalizer r;
  r.add(p, n, field, 0);
  return r;
}

void Normalizer::add(const Parser& p, const json& n, const std::string& field, int depth) {
  if (n.is_null()) return;
  const std::string t = p.type_of(n, field);
  if (t == "NFC") {
    steps_.push_back({Kind::nfc, "", ""});
  } else if (t == "Prepend") {
    const json& v = p.member(n, "prepend", field);
    if (!v.is_string()) p.fail(field + ".prepend", "is not a string: " + p.cut(v));
    if (!v.get<std::string>().empty()) steps_.push_back({Kind::prepend, v.get<std::string>(), ""});
  } else if (t == "Replace") {
    const json& pat = p.member(n, "pattern", field);
    if (!pat.is_object() || !pat.contains("String") || !pat["String"].is_string())
      p.fail(field + ".pattern", "is " + p.cut(pat) + ": only a {\"String\": ...} pattern is supported");
    const json& c = p.member(n, "content", field);
    if (!c.is_string()) p.fail(field + ".content", "is not a string: " + p.cut(c));
    if (pat["String"].get<std::string>().empty()) p.fail(field + ".pattern.String", "is empty");
    steps_.push_back({Kind::replace, pat["String"].get<std::string>(), c.get<std::string>()});
  } else if (t == "Sequence") {
    const json& list = p.member(n, "normalizers", field);
    if (!list.is_array()) p.fail(field + ".normalizers", "is not an array");
    for (size_t i = 0; i < list.size(); i++) add(p, list[i], field + ".normalizers[" + std::to_string(i) + "]", depth + 1);
  } else {
    p.fail(field + ".type", "is \"" + t + "\": the supported normalizers are NFC, Prepend, Replace of a string and Sequence");
  }
}

std::string replace_all(const std::string& s, const std::string& a, const std::string& b) {
  std::string out;
  size_t from = 0;
  for (size_t at = s.find(a); at != std::string::npos; at = s.find(a, from)) {
    out.append(s, from, at - from);
    out += b;
    from = at + a.size();
  }
  if (from == 0) return s;
  out.append(s, from, std::string::npos);
  return out;
}

std::string Normalizer::apply(const std::string& s) const {
  std::string t = s;
  for (const Step& st : steps_) {
    if (st.kind == Kind::nfc) t = nfc(t);
    else if (st.kind == Kind::prepend) t = t.empty() ? t : st.a + t;
    else t = replace_all(t, st.a, st.b);
  }
  return t;
}

bool Normalizer::prepends() const {
  for (const Step& st : steps_)
    if (st.kind == Kind::prepend) return true;
  return false;
}

bool Normalizer::keeps_spaces() const {
  for (const Step& st : steps_)
    if (st.kind != Kind::nfc) return false;
  return true;
}

}  // namespace tapelm::bytebpe
