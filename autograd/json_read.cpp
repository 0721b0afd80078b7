#include "autograd/json_read.h"

#include <algorithm>
#include <vector>

namespace tapelm {

nlohmann::json parse_json(const std::string& text, const std::string& what, ErrorKind kind, int max_depth, bool unique_keys) {
  std::vector<std::vector<std::string>> keys;  // the keys seen so far in each open object
  auto check = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& v) {
    using E = nlohmann::json::parse_event_t;
    if ((ev == E::object_start || ev == E::array_start) && depth >= max_depth)
      throw Error(kind, what + ": JSON nested deeper than " + std::to_string(max_depth) + " levels");
    if (!unique_keys) return true;
    if (ev == E::object_start) keys.emplace_back();
    if (ev == E::object_end && !keys.empty()) keys.pop_back();
    if (ev == E::key && !keys.empty()) {
      const std::string k = v.get<std::string>();
      auto& seen = keys.back();
      if (std::find(seen.begin(), seen.end(), k) != seen.end()) throw Error(kind, what + ": duplicate key '" + cut_for_message(k) + "'");
      seen.push_back(k);
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, check);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(kind, what + ": not valid JSON: " + cut_for_message(e.what(), 200));
  } catch (const nlohmann::json::out_of_range& e) {  // 1e400: nlohmann's raw out_of_range.406 reached the user
    const std::string m = e.what();
    const size_t at = m.find("number overflow parsing");
    throw Error(kind, what + ": " + (at == std::string::npos ? cut_for_message(m, 200) : "a number beyond a double's range: " + cut_for_message(m.substr(at + 24), 60)));
  }
}

}  // namespace tapelm
