// Strict reader and writer of the safetensors format (https://github.com/huggingface/safetensors):
//
//     [8 bytes]  N, little-endian u64: length of the header
//     [N bytes]  UTF-8 JSON object: "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}
//                for every tensor, plus an optional "__metadata__": {"key": "string value", ...}
//     [rest]     the data buffer; a tensor's row-major, little-endian bytes are buffer[b, e)
//
// The reader accepts only well-formed files: known dtypes, non-negative integer shapes, byte spans
// whose length matches the shape and that tile the data buffer exactly (no overlaps, gaps or
// trailing bytes), string metadata, no duplicate JSON keys. Anything else raises coupledqk::io_error
// naming the file, what was wrong, the value seen and what is accepted.
//
// Limits (a hostile file is refused before it can exhaust the stack or the memory): the header is
// at most max_header_bytes (100 MB) and nests at most max_header_depth (8) JSON levels (a valid
// header uses 3); at most max_tensors (100,000) tensors; every size computed from the file (the
// product of a shape's dimensions, its byte count, the offsets) is checked arithmetic, and a shape
// whose dimensions multiply past 2^63 - 1 (zeros aside) is refused. Values quoted from the file in
// messages are cut to a bounded length (detail::quote, detail::excerpt) and never printed by
// recursion.
//
// The writer pads the header with spaces to a multiple of 8 bytes, lays the tensors out in order,
// and replaces the target atomically (temporary file in the same directory, fsync, rename), so a
// failed write never leaves a partial or clobbered file behind.
//
//     coupledqk::io::file f = coupledqk::io::read("layer.safetensors");
//     coupledqk::io::load_into(f, layer->parameters());
//
// Needs nlohmann_json (target coupledqk::io).
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../core/parameters.hpp"
#include "../core/types.hpp"
#include "atomic_file.hpp"  // write_file_atomically, remove_stale_temporaries
#include "json_read.hpp"    // read_json: the header
#include "quote.hpp"        // detail::quote, detail::excerpt, detail::join_names


namespace coupledqk::io {

// ---- dtypes -------------------------------------------------------------------------------------

/// Element types of the safetensors format that this reader accepts.
enum class dtype { F64, F32, BF16, F16, I64, I32, I16, I8, U8, BOOL };

/// Every dtype, in a fixed order (used in error messages).
inline const std::vector<dtype>& all_dtypes() {
  static const std::vector<dtype> all{dtype::F64, dtype::F32, dtype::BF16, dtype::F16, dtype::I64,
                                      dtype::I32, dtype::I16, dtype::I8,   dtype::U8,  dtype::BOOL};
  return all;
}

/// The dtype's name as written in files: "F64", "BF16", "BOOL", ...
inline const char* to_string(dtype t) {
  switch (t) {
    case dtype::F64: return "F64";
    case dtype::F32: return "F32";
    case dtype::BF16: return "BF16";
    case dtype::F16: return "F16";
    case dtype::I64: return "I64";
    case dtype::I32: return "I32";
    case dtype::I16: return "I16";
    case dtype::I8: return "I8";
    case dtype::U8: return "U8";
    case dtype::BOOL: return "BOOL";
  }
  return "?";
}

/// Bytes per element.
inline std::size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::F64:
    case dtype::I64: return 8;
    case dtype::F32:
    case dtype::I32: return 4;
    case dtype::BF16:
    case dtype::F16:
    case dtype::I16: return 2;
    case dtype::I8:
    case dtype::U8:
    case dtype::BOOL: return 1;
  }
  return 0;
}

/// True for the floating-point dtypes, which tensor::to_vector converts.
inline bool is_floating(dtype t) {
  return t == dtype::F64 || t == dtype::F32 || t == dtype::BF16 || t == dtype::F16;
}

/// "F64, F32, BF16, ..." -- the accepted names, for messages.
inline std::string accepted_dtypes() {
  std::string out;
  for (dtype t : all_dtypes()) out += (out.empty() ? "" : ", ") + std::string(to_string(t));
  return out;
}

/// Sets `out` and returns true if `name` is a dtype name (exact, case-sensitive).
inline bool try_parse_dtype(const std::string& name, dtype& out) {
  for (dtype t : all_dtypes())
    if (name == to_string(t)) {
      out = t;
      return true;
    }
  return false;
}

/// The dtype named `name`; throws io_error listing the accepted names otherwise.
inline dtype parse_dtype(const std::string& name) {
  dtype t{};
  if (!try_parse_dtype(name, t))
    throw io_error("unknown safetensors dtype '" + name + "'; accepted: " + accepted_dtypes());
  return t;
}

/// The dtype a C++ element type is stored as (float -> F32, double -> F64, std::int64_t -> I64...).
template <class S>
constexpr dtype dtype_of() {
  static_assert(std::is_same_v<S, double> || std::is_same_v<S, float> || std::is_same_v<S, std::int64_t> ||
                    std::is_same_v<S, std::int32_t> || std::is_same_v<S, std::int16_t> ||
                    std::is_same_v<S, std::int8_t> || std::is_same_v<S, std::uint8_t> ||
                    std::is_same_v<S, bool>,
                "coupledqk::io: no safetensors dtype for this element type");
  if constexpr (std::is_same_v<S, double>)
    return dtype::F64;
  else if constexpr (std::is_same_v<S, float>)
    return dtype::F32;
  else if constexpr (std::is_same_v<S, std::int64_t>)
    return dtype::I64;
  else if constexpr (std::is_same_v<S, std::int32_t>)
    return dtype::I32;
  else if constexpr (std::is_same_v<S, std::int16_t>)
    return dtype::I16;
  else if constexpr (std::is_same_v<S, std::int8_t>)
    return dtype::I8;
  else if constexpr (std::is_same_v<S, std::uint8_t>)
    return dtype::U8;
  else
    return dtype::BOOL;
}

// ---- helpers ------------------------------------------------------------------------------------

namespace detail {

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

/// "[2, 3]"
template <class Int>
std::string format_shape(const std::vector<Int>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

/// a * b, or false on overflow of std::uint64_t.
inline bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return false;
  out = a * b;
  return true;
}

/// "'path': " or "" when no source is known.
inline std::string prefix(const std::string& source) {
  return source.empty() ? std::string() : "safetensors file '" + source + "': ";
}

/// The product of the dimensions, or false when it does not fit std::int64_t. A shape with a zero
/// holds no element, but the product of its other dimensions must fit too, so that code that
/// multiplies some of the dimensions (a row's length, a matrix's size) never overflows.
template <class Int>
bool checked_numel(const std::vector<Int>& shape, std::int64_t& out) {
  std::uint64_t nonzero = 1;
  bool zero = false;
  for (Int s : shape) {
    if constexpr (std::is_signed_v<Int>) {
      if (s < 0) return false;
    }
    if (s == 0) {
      zero = true;
      continue;
    }
    if (!checked_mul(nonzero, static_cast<std::uint64_t>(s), nonzero) ||
        nonzero > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return false;
  }
  out = zero ? 0 : static_cast<std::int64_t>(nonzero);
  return true;
}

inline bool host_is_little_endian() {
  const std::uint16_t probe = 1;
  unsigned char first = 0;
  std::memcpy(&first, &probe, 1);
  return first == 1;
}

/// Copies n elements of `size` bytes, converting between little-endian and the host order.
inline void copy_le(void* dst, const void* src, std::size_t n, std::size_t size) {
  if (size == 1 || host_is_little_endian()) {
    if (n) std::memcpy(dst, src, n * size);
    return;
  }
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t b = 0; b < size; ++b) d[i * size + b] = s[i * size + size - 1 - b];
}

inline std::uint16_t load_u16_le(const unsigned char* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}

inline std::uint64_t load_u64_le(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline float bits_to_float(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float bf16_to_float(std::uint16_t h) { return bits_to_float(static_cast<std::uint32_t>(h) << 16); }

inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace detail

// ---- tensor and file ----------------------------------------------------------------------------

/// One named tensor: its dtype, shape and raw little-endian, row-major bytes as in the file.
struct tensor {
  std::string name;
  dtype type = dtype::F32;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;

  /// Number of elements (1 for a scalar, shape []). Throws io_error for a negative dimension or
  /// a product past 2^63 - 1 (parse() never returns such a shape; a tensor built by hand may hold one).
  std::int64_t numel() const {
    std::int64_t n = 0;
    if (!detail::checked_numel(shape, n))
      throw io_error(detail::cat("tensor '", detail::quote(name), "': shape ", detail::format_shape(shape),
                                 " has a negative dimension or more than 2^63 - 1 elements"));
    return n;
  }

  /// Converts the elements to S (float or double) into out[0, count). F64/F32/BF16/F16 only;
  /// count must equal numel(). Throws io_error otherwise.
  template <class S>
  void copy_to(S* out, std::size_t count) const {
    static_assert(std::is_floating_point_v<S>, "tensor::copy_to: S must be float or double");
    if (!is_floating(type))
      throw io_error(detail::cat("tensor '", detail::quote(name), "' has dtype ", to_string(type),
                                 "; only floating-point tensors (F64, F32, BF16, F16) can be read as "
                                 "float or double"));
    const std::size_t n = static_cast<std::size_t>(numel());
    if (count != n || bytes.size() != n * dtype_size(type))
      throw io_error(detail::cat("tensor '", detail::quote(name), "' ", to_string(type), " ", detail::format_shape(shape),
                                 " holds ", bytes.size(), " bytes (", n, " elements); ", count,
                                 " elements were requested"));
    const unsigned char* p = bytes.data();
    switch (type) {
      case dtype::F64:
        if constexpr (std::is_same_v<S, double>) {
          detail::copy_le(out, p, n, 8);
        } else {
          for (std::size_t i = 0; i < n; ++i) {
            double v;
            detail::copy_le(&v, p + 8 * i, 1, 8);
            out[i] = static_cast<S>(v);
          }
        }
        break;
      case dtype::F32:
        if constexpr (std::is_same_v<S, float>) {
          detail::copy_le(out, p, n, 4);
        } else {
          for (std::size_t i = 0; i < n; ++i) {
            float v;
            detail::copy_le(&v, p + 4 * i, 1, 4);
            out[i] = static_cast<S>(v);
          }
        }
        break;
      case dtype::BF16:
        for (std::size_t i = 0; i < n; ++i)
          out[i] = static_cast<S>(detail::bf16_to_float(detail::load_u16_le(p + 2 * i)));
        break;
      case dtype::F16:
        for (std::size_t i = 0; i < n; ++i)
          out[i] = static_cast<S>(detail::f16_to_float(detail::load_u16_le(p + 2 * i)));
        break;
      default: break;
    }
  }

  /// The elements converted to S (float or double); see copy_to.
  template <class S>
  std::vector<S> to_vector() const {
    std::vector<S> out(is_floating(type) ? static_cast<std::size_t>(numel()) : 0);
    copy_to(out.data(), out.size());
    return out;
  }

  /// A tensor holding a copy of data[0, prod(shape)), stored as dtype_of<S>() (float -> F32,
  /// double -> F64). Throws coupledqk::invalid_argument for a negative dimension.
  template <class S>
  static tensor from(std::string name, std::vector<std::int64_t> shape, const S* data) {
    for (std::int64_t s : shape)
      require(s >= 0, "safetensors tensor '", detail::quote(name), "': shape ", detail::format_shape(shape),
              " has a negative dimension; dimensions must be >= 0");
    std::int64_t count = 0;
    require(detail::checked_numel(shape, count) &&
                static_cast<std::uint64_t>(count) <= std::numeric_limits<std::size_t>::max() / sizeof(S),
            "safetensors tensor '", detail::quote(name), "': shape ", detail::format_shape(shape), " is too large");
    const auto n = static_cast<std::uint64_t>(count);
    require(n == 0 || data != nullptr, "safetensors tensor '", name, "': data is null");
    tensor t;
    t.name = std::move(name);
    t.type = dtype_of<S>();
    t.shape = std::move(shape);
    t.bytes.resize(static_cast<std::size_t>(n) * sizeof(S));
    detail::copy_le(t.bytes.data(), data, static_cast<std::size_t>(n), sizeof(S));
    return t;
  }
};

/// The content of a safetensors file: string metadata and tensors (in file order when read).
struct file {
  std::map<std::string, std::string> metadata;
  std::vector<tensor> tensors;
  /// Where it came from (path given to read/parse), for error messages; never written.
  std::string source;

  /// The tensor called `name`, or nullptr.
  const tensor* find(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  bool contains(const std::string& name) const { return find(name) != nullptr; }

  /// The tensor called `name`; throws io_error listing the available names otherwise.
  const tensor& at(const std::string& name) const {
    if (const tensor* t = find(name)) return *t;
    throw io_error(detail::prefix(source) + "no tensor named '" + detail::quote(name) +
                   "'; the file holds: " + detail::join_names(names()));
  }

  /// Tensor names in order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) out.push_back(t.name);
    return out;
  }

  /// The metadata value of `key`; throws io_error listing the available keys otherwise.
  const std::string& meta(const std::string& key) const {
    const auto it = metadata.find(key);
    if (it != metadata.end()) return it->second;
    std::vector<std::string> keys;
    for (const auto& kv : metadata) keys.push_back(kv.first);
    throw io_error(detail::prefix(source) + "no metadata key '" + detail::quote(key) +
                   "'; the file's metadata keys: " + detail::join_names(keys));
  }
  /// The metadata value of `key`, or nullptr.
  const std::string* find_meta(const std::string& key) const {
    const auto it = metadata.find(key);
    return it == metadata.end() ? nullptr : &it->second;
  }

  /// Appends a tensor; throws io_error if the name is already used.
  void add(tensor t) {
    if (contains(t.name))
      throw io_error(detail::prefix(source) + "duplicate tensor name '" + detail::quote(t.name) + "'");
    tensors.push_back(std::move(t));
  }
};

/// Refuse header lengths above this before allocating or parsing anything.
inline constexpr std::uint64_t max_header_bytes = 100u * 1024u * 1024u;
/// Deepest nesting of JSON arrays and objects accepted in a header (the root object is level 1; a
/// valid header uses 3: root, tensor entry, shape). Enforced while parsing (read_json), so neither
/// the parser nor anything that walks the parsed value (dump, destruction) recurses deeper.
inline constexpr int max_header_depth = 8;
/// Most tensors accepted in one file (a checkpoint of the training example holds a few hundred).
inline constexpr std::size_t max_tensors = 100000;

// ---- reading ------------------------------------------------------------------------------------

/// Parses the bytes of a safetensors file. `what` names the source in error messages.
inline file parse(const std::vector<unsigned char>& bytes, const std::string& what) {
  using json = nlohmann::json;
  const std::string where = "safetensors file '" + what + "': ";
  auto fail = [&](const std::string& msg) -> void { throw io_error(where + msg); };
  const std::uint64_t size = bytes.size();
  if (size == 0)
    fail(
        "the file is empty (0 bytes); a safetensors file starts with an 8-byte little-endian header "
        "length, then the JSON header and the data");
  if (size < 8)
    fail(detail::cat("the file is only ", size,
                     " bytes long; a safetensors file starts with an 8-byte "
                     "little-endian header length"));
  const std::uint64_t header_len = detail::load_u64_le(bytes.data());
  if (header_len > max_header_bytes)
    fail(detail::cat("header length ", header_len, " bytes is larger than the ", max_header_bytes,
                     "-byte (100 MB) limit; the file is corrupt or not a safetensors file"));
  if (header_len > size - 8)
    fail(
        detail::cat("header length ", header_len, " bytes is larger than the ", size - 8,
                    " bytes after the 8-byte length field; the file is truncated or not a safetensors file"));
  if (header_len == 0) fail("header length is 0; the header must be a JSON object");

  // The project's one bounded JSON reader (json_read.hpp): a first pass of SAX events that builds
  // nothing enforces the depth and member limits and refuses a duplicated key (a DOM keeps only
  // one of them), then the DOM is built. The member limit leaves room for "__metadata__"; the
  // exact tensor count is checked below.
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  const json header = read_json<io_error, json>(
      text, text + header_len, detail::cat(where, "the ", header_len, "-byte header"),
      json_limits{max_header_bytes, max_header_depth, max_tensors + 1},
      "a JSON object mapping tensor names to {dtype, shape, data_offsets} -- is this a safetensors file?");
  if (!header.is_object())
    fail(std::string("the header is a JSON ") + header.type_name() +
         "; expected a JSON object mapping tensor names to {dtype, shape, data_offsets}");
  if (header.size() - header.count("__metadata__") > max_tensors)
    fail(detail::cat("the header lists more than ", max_tensors, " tensors; at most ", max_tensors,
                     " are accepted"));

  const std::uint64_t buffer_len = size - 8 - header_len;
  const unsigned char* buffer = bytes.data() + 8 + header_len;
  file out;
  out.source = what;

  struct span {
    std::uint64_t begin, end;
    std::size_t index;
  };
  std::vector<span> spans;
  std::vector<tensor> tensors;
  for (const auto& item : header.items()) {
    const std::string& name = item.key();
    const json& entry = item.value();
    if (name == "__metadata__") {
      if (!entry.is_object())
        fail(std::string("\"__metadata__\" is a JSON ") + entry.type_name() + " (" + detail::excerpt(entry) +
             "); expected an object of string values");
      for (const auto& kv : entry.items()) {
        if (!kv.value().is_string())
          fail("metadata value of '" + detail::quote(kv.key()) + "' is " + detail::excerpt(kv.value()) + " (a JSON " +
               kv.value().type_name() + "); metadata values must be strings");
        out.metadata[kv.key()] = kv.value().get<std::string>();
      }
      continue;
    }
    const std::string t = "tensor '" + detail::quote(name) + "': ";
    if (!entry.is_object())
      fail(t + "entry is a JSON " + entry.type_name() + " (" + detail::excerpt(entry) +
           "); expected an object with dtype, shape and data_offsets");
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(key))
        fail(t + "missing \"" + key + "\"; every tensor entry needs dtype, shape and data_offsets (got " +
             detail::excerpt(entry) + ")");
    for (const auto& kv : entry.items())
      if (kv.key() != "dtype" && kv.key() != "shape" && kv.key() != "data_offsets")
        fail(t + "unexpected key \"" + detail::quote(kv.key()) + "\"; accepted: dtype, shape, data_offsets");

    const json& jd = entry["dtype"];
    if (!jd.is_string())
      fail(t + "dtype is " + detail::excerpt(jd) + " (a JSON " + jd.type_name() + "); expected a string, one of " +
           accepted_dtypes());
    dtype type{};
    if (!try_parse_dtype(jd.get<std::string>(), type))
      fail(t + "unknown dtype " + detail::excerpt(jd) + "; accepted: " + accepted_dtypes());

    const json& js = entry["shape"];
    if (!js.is_array())
      fail(t + "shape is " + detail::excerpt(js) + " (a JSON " + js.type_name() +
           "); expected an array of non-negative integers");
    std::vector<std::int64_t> shape;
    for (const json& dim : js) {
      if (dim.is_number_integer() && !dim.is_number_unsigned())
        fail(t + "shape " + detail::excerpt(js) + " has a negative dimension (" + detail::excerpt(dim) +
             "); dimensions must be non-negative integers");
      if (!dim.is_number_unsigned())
        fail(t + "shape " + detail::excerpt(js) + " holds " + detail::excerpt(dim) + " (a JSON " +
             dim.type_name() + "); dimensions must be non-negative integers");
      const std::uint64_t v = dim.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail(t + "shape " + detail::excerpt(js) + " has a dimension above 2^63 - 1");
      shape.push_back(static_cast<std::int64_t>(v));
    }
    // Checked: the product of the non-zero dimensions must fit std::int64_t (tensor::numel and
    // anything that multiplies dimensions), whether or not a zero makes the tensor empty.
    std::int64_t count = 0;
    if (!detail::checked_numel(shape, count))
      fail(t + "shape " + detail::excerpt(js) + " is too large: its dimensions multiply past 2^63 - 1");
    const auto numel = static_cast<std::uint64_t>(count);
    std::uint64_t nbytes = 0;
    if (!detail::checked_mul(numel, dtype_size(type), nbytes))
      fail(t + "shape " + detail::excerpt(js) + " is too large: more than 2^64 bytes");

    const json& jo = entry["data_offsets"];
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
      fail(t + "data_offsets is " + detail::excerpt(jo) + "; expected [begin, end], two non-negative integers");
    const std::uint64_t begin = jo[0].get<std::uint64_t>(), end = jo[1].get<std::uint64_t>();
    if (begin > end)
      fail(detail::cat(t, "data_offsets [", begin, ", ", end, "] has begin > end; expected begin <= end"));
    if (end > buffer_len)
      fail(detail::cat(t, "data_offsets [", begin, ", ", end, "] reach past the end of the ", buffer_len,
                       "-byte data buffer; the file is truncated or the offsets are wrong"));
    if (end - begin != nbytes)
      fail(detail::cat(t, "data_offsets [", begin, ", ", end, "] span ", end - begin, " bytes, but ",
                       to_string(type), " ", detail::format_shape(shape), " needs ", numel, " x ",
                       dtype_size(type), " = ", nbytes, " bytes"));
    tensor tn;
    tn.name = name;
    tn.type = type;
    tn.shape = std::move(shape);
    spans.push_back(span{begin, end, tensors.size()});
    tensors.push_back(std::move(tn));
  }

  // The spans must tile the data buffer exactly: no overlaps, no gaps, no trailing bytes.
  std::sort(spans.begin(), spans.end(), [](const span& a, const span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t position = 0;
  std::string previous;
  for (const span& s : spans) {
    const std::string name = detail::quote(tensors[s.index].name);
    if (s.begin < position)
      fail(detail::cat("tensor '", name, "' data_offsets [", s.begin, ", ", s.end, "] overlap tensor '",
                       previous, "', whose data ends at byte ", position, "; tensors must not overlap"));
    if (s.begin > position)
      fail(detail::cat("tensor '", name, "' data starts at byte ", s.begin, " but the previous data ends at ",
                       position, ": a gap of ", s.begin - position,
                       " bytes; tensors must be stored contiguously"));
    position = s.end;
    previous = name;
  }
  if (position != buffer_len)
    fail(detail::cat("the data buffer is ", buffer_len, " bytes but the tensors use only ", position, ": ",
                     buffer_len - position,
                     " trailing bytes belong to no tensor (extra data, or a wrong header)"));

  out.tensors.reserve(tensors.size());
  for (const span& s : spans) {
    tensor& tn = tensors[s.index];
    tn.bytes.assign(buffer + s.begin, buffer + s.end);
    out.tensors.push_back(std::move(tn));
  }
  return out;
}

/// Reads and parses a safetensors file; throws io_error if it cannot be read or is malformed.
inline file read(const std::string& path) {
  const std::string where = "cannot read safetensors file '" + path + "': ";
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status))
    throw io_error(where + (ec && ec != std::errc::no_such_file_or_directory ? ec.message()
                                                                             : std::string("no such file")));
  if (std::filesystem::is_directory(status)) throw io_error(where + "it is a directory, not a file");
  std::FILE* fp = std::fopen(path.c_str(), "rb");
  if (!fp) throw io_error(where + std::strerror(errno));
  std::vector<unsigned char> bytes;
  try {
  const std::uintmax_t hint = std::filesystem::file_size(path, ec);
  if (!ec && hint > 0 && hint < (std::uintmax_t(1) << 40)) bytes.resize(static_cast<std::size_t>(hint));
  std::size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), fp);
  bytes.resize(got);
  unsigned char chunk[1 << 16];
  for (;;) {  // whatever the size hint missed (a growing or special file)
    const std::size_t n = std::fread(chunk, 1, sizeof chunk, fp);
    bytes.insert(bytes.end(), chunk, chunk + n);
    if (n < sizeof chunk) break;
  }
  } catch (const std::bad_alloc&) {
    std::fclose(fp);
    throw io_error(detail::cat(where, "the file (", bytes.size(), " bytes read so far) does not fit in memory"));
  }
  const bool failed = std::ferror(fp) != 0;
  const int err = errno;
  std::fclose(fp);
  if (failed) throw io_error(where + "read error: " + std::strerror(err));
  try {
    return parse(bytes, path);
  } catch (const std::bad_alloc&) {
    throw io_error(detail::cat(where, "its ", bytes.size(), " bytes do not fit in memory twice (file and tensors)"));
  }
}

// ---- writing ------------------------------------------------------------------------------------

/// The bytes of a safetensors file holding `f` (header padded with spaces to a multiple of 8,
/// "__metadata__" first, tensors in order and contiguous). Throws io_error for an invalid file:
/// duplicate or reserved names, negative dimensions, byte counts that do not match the shape,
/// or names and metadata that are not valid UTF-8. `target` (default: f.source) names the file in
/// messages.
inline std::vector<unsigned char> serialize(const file& f, const std::string& target = "") {
  using ojson = nlohmann::ordered_json;
  const std::string& name = target.empty() ? f.source : target;
  const std::string where =
      "cannot serialise safetensors" + (name.empty() ? std::string() : " file '" + name + "'") + ": ";
  ojson header = ojson::object();
  if (!f.metadata.empty()) {
    ojson meta = ojson::object();
    for (const auto& kv : f.metadata) meta[kv.first] = kv.second;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> seen;
  std::uint64_t offset = 0;
  for (const tensor& t : f.tensors) {
    const std::string tw = where + "tensor '" + t.name + "': ";
    if (t.name == "__metadata__") throw io_error(tw + "the name \"__metadata__\" is reserved");
    if (!seen.insert(t.name).second) throw io_error(tw + "duplicate tensor name; names must be unique");
    std::uint64_t numel = 1;
    for (std::int64_t s : t.shape) {
      if (s < 0)
        throw io_error(tw + "shape " + detail::format_shape(t.shape) +
                       " has a negative dimension; dimensions must be >= 0");
      if (!detail::checked_mul(numel, static_cast<std::uint64_t>(s), numel))
        throw io_error(tw + "shape " + detail::format_shape(t.shape) + " is too large");
    }
    std::uint64_t nbytes = 0;
    if (!detail::checked_mul(numel, dtype_size(t.type), nbytes) || nbytes != t.bytes.size())
      throw io_error(detail::cat(tw, to_string(t.type), " ", detail::format_shape(t.shape), " needs ", numel,
                                 " x ", dtype_size(t.type), " bytes, but the tensor holds ", t.bytes.size()));
    header[t.name] = ojson::object({{"dtype", to_string(t.type)},
                                    {"shape", t.shape},
                                    {"data_offsets", ojson::array({offset, offset + nbytes})}});
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', false, ojson::error_handler_t::strict);
  } catch (const ojson::exception& e) {
    throw io_error(where + "a tensor name or metadata string is not valid UTF-8 (" + e.what() + ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<unsigned char> out;
  out.reserve(8 + text.size() + static_cast<std::size_t>(offset));
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>((n >> (8 * i)) & 0xffu));
  out.insert(out.end(), text.begin(), text.end());
  for (const tensor& t : f.tensors) out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  return out;
}

/// Serialises `f` and writes it to `path` atomically (see write_file_atomically): if anything
/// fails, io_error is thrown and `path` is untouched.
inline void write(const std::string& path, const file& f) {
  const std::vector<unsigned char> bytes = serialize(f, path);
  write_file_atomically(path, bytes.data(), bytes.size());
}

// ---- bridge to the library ----------------------------------------------------------------------

/// For every view, copies the file's tensor of the same name into view.data, converting the dtype
/// (F64/F32/BF16/F16 -> S). Every tensor must exist and have exactly the view's shape; everything
/// is checked before anything is copied. Throws io_error naming the missing tensors (and those the
/// file holds) or the mismatched shape ("tensor 'wq' has shape [8, 8]; expected [16, 16]").
template <class S>
void load_into(const file& f, const std::vector<TensorView<S>>& views) {
  std::map<std::string, const tensor*> index;
  for (const auto& t : f.tensors) index.emplace(t.name, &t);
  std::vector<std::string> missing;
  for (const auto& v : views)
    if (!index.count(v.name)) missing.push_back(v.name);
  if (!missing.empty())
    throw io_error(detail::prefix(f.source) + "missing tensor" + (missing.size() > 1 ? "s " : " ") +
                   detail::join_names(missing) + "; the file holds: " + detail::join_names(f.names()));
  for (const auto& v : views) {
    const tensor& t = *index.at(v.name);
    bool same = t.shape.size() == v.shape.size();
    for (std::size_t i = 0; same && i < t.shape.size(); ++i)
      same = t.shape[i] == static_cast<std::int64_t>(v.shape[i]);
    if (!same)
      throw io_error(detail::prefix(f.source) + "tensor '" + v.name + "' has shape " +
                     detail::format_shape(t.shape) + "; expected " + detail::format_shape(v.shape));
    if (!is_floating(t.type))
      throw io_error(detail::prefix(f.source) + "tensor '" + v.name + "' has dtype " + to_string(t.type) +
                     "; expected a floating-point dtype (F64, F32, BF16 or F16)");
  }
  for (const auto& v : views) index.at(v.name)->copy_to(v.data, static_cast<std::size_t>(v.size()));
}

/// A tensor holding a copy of the view's data (float -> F32, double -> F64), named after the view
/// unless `name_override` is given.
template <class S>
tensor from_view(const TensorView<S>& view, std::string name_override = "") {
  std::vector<std::int64_t> shape(view.shape.begin(), view.shape.end());
  return tensor::from<S>(name_override.empty() ? view.name : std::move(name_override), std::move(shape),
                         view.data);
}

}  // namespace coupledqk::io
