#pragma once
// One table of names per enum whose values travel as text (config keys, flags, file metadata):
// specialize EnumNames<E> with `values`, an array of {value, name} pairs, and every spelling,
// parse, check and help list derives from it (to_string, enum_from_name, enum_names, enum_list).
#include <string>
#include <vector>

#include "autograd/error.h"

namespace tapelm {

template <class E> struct EnumNames;

/// The name of an enum value.
template <class E> std::string to_string(E e) {
  for (const auto& [v, name] : EnumNames<E>::values)
    if (v == e) return name;
  throw Error(ErrorKind::internal, "an enum value without a name");
}

/// Every name, in the table's order (CLI11's IsMember takes them).
template <class E> std::vector<std::string> enum_names() {
  std::vector<std::string> out;
  for (const auto& [v, name] : EnumNames<E>::values) out.push_back(name);
  return out;
}

/// "f32, bf16 or bf16-emulated": the names as help and messages list them.
template <class E> std::string enum_list(const char* last = " or ") {
  const std::vector<std::string> n = enum_names<E>();
  std::string out;
  for (size_t i = 0; i < n.size(); i++) out += (i == 0 ? "" : i + 1 == n.size() ? last : ", ") + n[i];
  return out;
}

/// The value named s; any other name is an Error of `kind`: `<what> "<s>" is not one of <names>`.
template <class E> E enum_from_name(const std::string& s, const std::string& what, ErrorKind kind = ErrorKind::usage) {
  for (const auto& [v, name] : EnumNames<E>::values)
    if (s == name) return v;
  throw Error(kind, what + " \"" + cut_for_message(s) + "\" is not one of " + enum_list<E>());
}

}  // namespace tapelm
