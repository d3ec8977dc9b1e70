// Quoting text read from a file in a message, boundedly: what a hostile file puts in a name or a
// value reaches an error message only as printable ASCII, cut after max_quoted_bytes. Used by every
// reader (safetensors.hpp, json_read.hpp, the training example's plans and checkpoints).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace coupledqk::io::detail {

/// Longest quotation of a value taken from a file (in bytes, before escaping) in a message.
inline constexpr std::size_t max_quoted_bytes = 160;

/// `s` with control characters and non-ASCII bytes written as \xNN (for parser messages that
/// quote raw bytes of a binary file).
inline std::string printable(const std::string& s) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

/// A name or string from a file, fit for a message: printable() and cut after max_quoted_bytes
/// ("...(N bytes in all)"), so that a hostile file cannot make a message of its own size.
inline std::string quote(const std::string& s) {
  if (s.size() <= max_quoted_bytes) return printable(s);
  return printable(s.substr(0, max_quoted_bytes)) + "...(" + std::to_string(s.size()) + " bytes in all)";
}

/// A JSON value from a file, fit for a message: its compact text cut like quote(). Call it only on
/// a value of bounded depth (read_json() bounds it), so that dump() does not recurse without bound.
template <class Json>
std::string excerpt(const Json& value) {
  return quote(value.dump(-1, ' ', false, Json::error_handler_t::replace));
}

/// "a, b, c" -- at most `max_names` names, each quote()d, then ", ... (N in all)"; "(none)" when empty.
inline std::string join_names(const std::vector<std::string>& names, std::size_t max_names = 32) {
  if (names.empty()) return "(none)";
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < max_names; ++i) out += (i ? ", " : "") + quote(names[i]);
  if (names.size() > max_names) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

}  // namespace coupledqk::io::detail
