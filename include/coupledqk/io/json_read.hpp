// The one way the project reads a JSON document (study plans and results, checkpoint metadata,
// corpus chapters, safetensors headers; Python's coupledqk.safetensors applies the same rules):
//
//     const nlohmann::json j = coupledqk::io::read_json(text, "plan 'p.json'", {4 << 20, 16});
//
// Limits, checked before anything is built: at most `max_bytes` of text, `max_depth` levels of
// nesting (the root is level 1), so that neither the parser nor anything that walks or prints the
// value (dump, destruction, messages) recurses without bound, and at most `max_members` keys in one
// object or elements in one array; a key that appears twice in one object is an error (a DOM would
// keep one of them silently). Errors name the source, the key path
// ("groups[2].set.dim") and what is accepted; quoted keys and values are cut to a bounded length
// (detail::quote, detail::excerpt). Time and memory are linear in the text's size.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "quote.hpp"  // detail::quote, detail::excerpt

namespace coupledqk::io {

struct json_limits {
  std::size_t max_bytes = 16u << 20;  ///< longest text accepted
  int max_depth = 16;                 ///< deepest nesting of arrays and objects (root: 1)
  std::size_t max_members = static_cast<std::size_t>(-1);  ///< most keys of one object / elements of one array
};

namespace detail {

/// SAX pass of read_json(): builds nothing; stops at the first level past the depth limit or the
/// first duplicated key, and knows the key path of where it stopped.
struct bounded_json_scan {
  struct frame {
    bool object = false;
    std::unordered_set<std::string> keys;
    std::string key;        // object: the last key read
    std::size_t index = 0;  // array: elements started so far; object: keys read so far
  };
  int max_depth = 16;
  std::size_t max_members = static_cast<std::size_t>(-1);
  std::vector<frame> frames;
  bool too_deep = false, duplicate = false, too_many = false;
  std::string where, duplicate_key, error;

  /// "groups[2].set" -- the path of the value inside the first `n` frames (keys quoted, bounded).
  std::string path_of(std::size_t n) const {
    std::string out;
    for (std::size_t i = 0; i < n && i < frames.size(); ++i) {
      const frame& f = frames[i];
      if (f.object)
        out += (out.empty() ? "" : ".") + quote(f.key);
      else
        out += "[" + std::to_string(f.index == 0 ? 0 : f.index - 1) + "]";
    }
    return out.empty() ? std::string("the top level") : out;
  }
  /// One more member (key or element) of the innermost container; false past max_members.
  bool count_member() {
    if (++frames.back().index <= max_members) return true;
    too_many = true;
    where = path_of(frames.size() - 1);
    return false;
  }
  /// A value starts; false when it is one element too many of its array.
  bool element() { return frames.empty() || frames.back().object || count_member(); }
  bool value() { return element(); }
  bool open(bool object) {
    if (!element()) return false;
    if (frames.size() >= static_cast<std::size_t>(max_depth)) {
      too_deep = true;
      where = path_of(frames.size());
      return false;
    }
    frame f;
    f.object = object;
    frames.push_back(std::move(f));
    return true;
  }
  bool close() {
    if (!frames.empty()) frames.pop_back();
    return true;
  }
  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(std::int64_t) { return value(); }
  bool number_unsigned(std::uint64_t) { return value(); }
  bool number_float(double, const std::string&) { return value(); }
  bool string(std::string&) { return value(); }
  bool binary(std::vector<std::uint8_t>&) { return value(); }
  bool start_object(std::size_t) { return open(true); }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(false); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    if (!count_member()) return false;
    frame& f = frames.back();
    if (!f.keys.insert(k).second) {
      duplicate = true;
      duplicate_key = k;
      where = path_of(frames.size() - 1);
      return false;
    }
    f.key = k;
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    error = e.what();
    return false;
  }
};

}  // namespace detail

/// Parses the text [first, last) under `limits`; `what` names the source in messages ("plan
/// 'studies/x.json'", "safetensors file 'm.safetensors': the 120-byte header"), `expected` (may be
/// empty) says what the text should be when it is not JSON. Throws Error (io_error by default)
/// saying what was wrong, where (the key path), and what is accepted. Json: nlohmann::json or
/// nlohmann::ordered_json.
template <class Error = io_error, class Json = nlohmann::json>
Json read_json(const char* first, const char* last, const std::string& what, const json_limits& limits = {},
               const std::string& expected = {}) {
  using json = Json;
  const auto size = static_cast<std::size_t>(last - first);
  if (size > limits.max_bytes)
    throw Error(what + " is " + std::to_string(size) + " bytes long; at most " + std::to_string(limits.max_bytes) +
                " bytes are accepted (is it the right file?)");
  detail::bounded_json_scan scan;
  scan.max_depth = limits.max_depth;
  scan.max_members = limits.max_members;
  const bool valid = json::sax_parse(first, last, &scan);
  const std::string at = " (at " + scan.where + ")";
  if (scan.too_deep)
    throw Error(what + " nests JSON arrays or objects more than " + std::to_string(limits.max_depth) +
                " levels deep" + at + "; at most " + std::to_string(limits.max_depth) + " are accepted");
  if (scan.too_many)
    throw Error(what + " has more than " + std::to_string(limits.max_members) + " members in one object or array" +
                at + "; at most " + std::to_string(limits.max_members) + " are accepted");
  if (scan.duplicate)
    throw Error(what + " has the key '" + detail::quote(scan.duplicate_key) + "' twice (in " + scan.where +
                "); every key may appear only once in an object");
  const std::string hint = expected.empty() ? std::string() : "; expected " + expected;
  if (!valid) throw Error(what + " is not valid JSON (" + detail::quote(scan.error) + ")" + hint);
  try {
    return json::parse(first, last);  // valid and bounded: the first pass said so
  } catch (const typename json::exception& e) {
    throw Error(what + " is not valid JSON (" + detail::quote(e.what()) + ")" + hint);
  }
}

/// read_json() of a whole string.
template <class Error = io_error, class Json = nlohmann::json>
Json read_json(const std::string& text, const std::string& what, const json_limits& limits = {},
               const std::string& expected = {}) {
  return read_json<Error, Json>(text.data(), text.data() + text.size(), what, limits, expected);
}

/// A value from a file, fit for a message: its compact text, cut to a bounded length. Safe on any
/// value read_json() returned (its depth is bounded).
inline std::string json_excerpt(const nlohmann::json& v) { return detail::excerpt(v); }

}  // namespace coupledqk::io
