#pragma once
// Reading a tokenizer.json's fields: each failure is a data Error naming the file and the field
// ("tokenizer file T: model.merges[3] is ...").
#include <climits>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "autograd/error.h"

namespace tapelm::bytebpe {

using json = nlohmann::json;

/// A tokenizer.json document: nested deeper than 32 levels (the deepest real layout has 5), or not
/// JSON -> data Error starting with `what`. The limit is checked as the parser opens each level,
/// before anything recursive (parsing a pipeline, freeing the document) runs over it.
inline json parse_json(const std::string& text, const std::string& what) {
  constexpr int max_depth = 32;
  auto check = [&](int depth, json::parse_event_t ev, json&) {
    if ((ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start) && depth >= max_depth)
      throw Error(ErrorKind::data, what + ": JSON nested deeper than " + std::to_string(max_depth) + " levels");
    return true;
  };
  try {
    return json::parse(text, check);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::data, what + ": does not parse as JSON: " + e.what());
  }
}

struct Parser {
  std::string what;  // the file, as messages name it
  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw Error(ErrorKind::data, what + ": " + field + " " + why);
  }
  /// A value as a message echoes it.
  std::string cut(const json& v) const { return cut_for_message(v.dump(), 63); }
  const json& member(const json& o, const char* key, const std::string& field) const {
    auto it = o.find(key);
    if (it == o.end()) fail(field + "." + key, "is missing");
    return *it;
  }
  std::string type_of(const json& o, const std::string& field) const {
    if (!o.is_object()) fail(field, "is not an object: " + cut(o));
    auto it = o.find("type");
    if (it == o.end() || !it->is_string()) fail(field + ".type", "is missing or not a string");
    return it->get<std::string>();
  }
  bool flag(const json& o, const char* key, const std::string& field, bool dflt) const {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) fail(field + "." + key, "is not a boolean: " + cut(*it));
    return it->get<bool>();
  }
  /// An id: an integer in [0, 2^31 - 1).
  int32_t id(const json& v, const std::string& field) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX - 1)
      fail(field, "is not an id in [0, 2^31 - 1): " + cut(v));
    return static_cast<int32_t>(v.get<int64_t>());
  }
  /// A string field that must be absent, null or "".
  void empty_string(const json& o, const char* key, const std::string& field) const {
    auto it = o.find(key);
    if (it == o.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty())) return;
    fail(field + "." + key, "is " + cut(*it) + ": only byte-level BPE without prefixes or suffixes is supported");
  }
};

}  // namespace tapelm::bytebpe
