#include "data/tokenizer/bytebpe/normalizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

namespace tapelm::bytebpe {

Normalizer Normalizer::parse(const Parser& p, const json& n, const std::string& field) {
  Normalizer r;
  r.add(p, n, field, 0);
  return r;
}

void Normalizer::add(const Parser& p, const json& n, const std::string& field, int depth) {
  if (n.is_null()) return;
  const std::string t = p.type_of(n, field);
  if (t == "NFC") {
    nfc_ = true;
  } else if (t == "Sequence") {
    const json& list = p.member(n, "normalizers", field);
    if (!list.is_array()) p.fail(field + ".normalizers", "is not an array");
    for (size_t i = 0; i < list.size(); i++) add(p, list[i], field + ".normalizers[" + std::to_string(i) + "]", depth + 1);
  } else {
    p.fail(field + ".type", "is \"" + t + "\": the supported normalizers are none and NFC");
  }
}

std::string Normalizer::apply(const std::string& s) const {
  if (!nfc_ || std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return s;
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                                          &dst, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) throw Error(ErrorKind::data, std::string("NFC normalization failed: ") + utf8proc_errmsg(n));
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

}  // namespace tapelm::bytebpe
