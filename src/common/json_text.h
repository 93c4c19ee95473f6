// Serialisation that cannot throw on content (design §10, isolation): nlohmann's dump() throws
// on strings that are not UTF-8, and a peer's bytes can reach a document (a refusal's reason, a
// log record, /status). Every document written to the wire, a file or the status port goes
// through json_dump, which writes such bytes as U+FFFD instead.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace xloco::common {

inline std::string json_dump(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace xloco::common
