// The safetensors reader/writer (coupledqk/io/safetensors.hpp): round trips, the byte layout,
// rejection of malformed files, atomic writes, and the bridge to parameter views.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <coupledqk/attention.hpp>
#include <coupledqk/integrators/leapfrog.hpp>
#include <coupledqk/io/safetensors.hpp>
#include <coupledqk/scoring/softmax.hpp>

namespace io = coupledqk::io;
namespace fs = std::filesystem;

namespace {

using bytes_t = std::vector<unsigned char>;

/// A fresh directory, removed with its content at scope exit.
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string pattern = (fs::temp_directory_path() / "coupledqk_st_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    return out;
  }
};

void put_u64(bytes_t& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

/// A file made of a raw header (not padded) and `data`.
bytes_t raw_file(const std::string& header, const bytes_t& data = {}) {
  bytes_t out;
  put_u64(out, header.size());
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

bytes_t zeros(std::size_t n) { return bytes_t(n, 0); }

void write_bytes(const std::string& path, const bytes_t& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

bytes_t read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return bytes_t(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

/// The io_error message of parse(b), or "" if it does not throw io_error.
std::string parse_error(const bytes_t& b, const std::string& what = "case.safetensors") {
  try {
    io::parse(b, what);
  } catch (const coupledqk::io_error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& message, const std::string& part) {
  return message.find(part) != std::string::npos;
}

#define CHECK_REJECTED(bytes, ...)                                               \
  do {                                                                           \
    const std::string msg_ = parse_error(bytes);                                 \
    INFO("message: " << msg_);                                                   \
    REQUIRE_FALSE(msg_.empty());                                                 \
    CHECK(has(msg_, "case.safetensors"));                                        \
    for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__})       \
      CHECK_MESSAGE(has(msg_, part_), "missing '" << part_ << "' in: " << msg_); \
  } while (0)

template <class S>
bool bit_equal(const std::vector<S>& a, const std::vector<S>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(S)) == 0);
}

io::file sample_file() {
  const std::vector<double> d{1.0,
                              -0.0,
                              std::numeric_limits<double>::denorm_min(),
                              std::numeric_limits<double>::infinity(),
                              std::numeric_limits<double>::quiet_NaN(),
                              1e308,
                              -3.25,
                              0.1};
  const std::vector<float> f{
      0.5f, -1.0f / 3.0f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::infinity(),
      7.0f, 1e-30f};
  io::file file;
  file.metadata = {{"attention", "leapfrog"}, {"steps", "3"}, {"note", "unicode \xc3\xa9 \"quoted\""}};
  file.tensors.push_back(io::tensor::from<double>("w.double", {2, 4}, d.data()));
  file.tensors.push_back(io::tensor::from<float>("v.float", {6}, f.data()));
  file.tensors.push_back(io::tensor::from<float>("scalar", {}, f.data()));
  file.tensors.push_back(io::tensor::from<double>("empty", {0, 3}, d.data()));
  return file;
}

}  // namespace

TEST_CASE("safetensors: dtype names and sizes") {
  for (io::dtype t : io::all_dtypes()) CHECK(io::parse_dtype(io::to_string(t)) == t);
  CHECK(io::dtype_size(io::dtype::F64) == 8);
  CHECK(io::dtype_size(io::dtype::F32) == 4);
  CHECK(io::dtype_size(io::dtype::BF16) == 2);
  CHECK(io::dtype_size(io::dtype::F16) == 2);
  CHECK(io::dtype_size(io::dtype::I64) == 8);
  CHECK(io::dtype_size(io::dtype::I32) == 4);
  CHECK(io::dtype_size(io::dtype::I16) == 2);
  CHECK(io::dtype_size(io::dtype::I8) == 1);
  CHECK(io::dtype_size(io::dtype::U8) == 1);
  CHECK(io::dtype_size(io::dtype::BOOL) == 1);
  CHECK(io::dtype_of<float>() == io::dtype::F32);
  CHECK(io::dtype_of<double>() == io::dtype::F64);
  try {
    io::parse_dtype("f32");
    FAIL("no exception");
  } catch (const coupledqk::io_error& e) {
    CHECK(has(e.what(), "'f32'"));
    CHECK(has(e.what(), "F64, F32, BF16, F16, I64, I32, I16, I8, U8, BOOL"));
  }
}

TEST_CASE("safetensors: F32/F64 round trip with metadata is bit-exact") {
  const io::file in = sample_file();
  const io::file out = io::parse(io::serialize(in), "memory");
  CHECK(out.metadata == in.metadata);
  REQUIRE(out.tensors.size() == in.tensors.size());
  for (std::size_t i = 0; i < in.tensors.size(); ++i) {
    CHECK(out.tensors[i].name == in.tensors[i].name);  // file order is the writer's order
    CHECK(out.tensors[i].type == in.tensors[i].type);
    CHECK(out.tensors[i].shape == in.tensors[i].shape);
    CHECK(out.tensors[i].bytes == in.tensors[i].bytes);
  }
  CHECK(out.at("scalar").numel() == 1);
  CHECK(out.at("empty").numel() == 0);
  CHECK(out.at("empty").to_vector<double>().empty());
  CHECK(bit_equal(out.at("w.double").to_vector<double>(), in.at("w.double").to_vector<double>()));
  const std::vector<float> f = out.at("v.float").to_vector<float>();
  CHECK(f[0] == 0.5f);
  CHECK(f[1] == -1.0f / 3.0f);
  CHECK(f[2] == std::numeric_limits<float>::denorm_min());
  CHECK(std::isinf(f[3]));
  const std::vector<double> d = out.at("w.double").to_vector<double>();
  CHECK(std::signbit(d[1]));
  CHECK(std::isnan(d[4]));
  // Widening F32 -> double is exact.
  const std::vector<double> fd = out.at("v.float").to_vector<double>();
  for (std::size_t i = 0; i < f.size(); ++i) CHECK(fd[i] == static_cast<double>(f[i]));

  // Through the file system as well.
  temp_dir dir;
  io::write(dir / "rt.safetensors", in);
  const io::file back = io::read(dir / "rt.safetensors");
  CHECK(back.source == dir / "rt.safetensors");
  CHECK(read_bytes(dir / "rt.safetensors") == io::serialize(in));
  CHECK(back.metadata == in.metadata);
  CHECK(back.names() == in.names());
  CHECK(back.meta("steps") == "3");
  CHECK(dir.entries() == std::vector<std::string>{"rt.safetensors"});
}

TEST_CASE("safetensors: byte layout matches a hand-built file") {
  const std::vector<float> a{1.0f, -2.0f};
  const std::vector<double> b{0.5};
  io::file f;
  f.metadata = {{"k", "v"}};
  f.tensors.push_back(io::tensor::from<float>("a", {2}, a.data()));
  f.tensors.push_back(io::tensor::from<double>("b", {1, 1}, b.data()));

  std::string header = R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F64","shape":[1,1],"data_offsets":[8,16]}})";
  while (header.size() % 8) header += ' ';
  bytes_t expected;
  put_u64(expected, header.size());
  expected.insert(expected.end(), header.begin(), header.end());
  for (unsigned char c : {0x00, 0x00, 0x80, 0x3f}) expected.push_back(c);        //  1.0f
  for (unsigned char c : {0x00, 0x00, 0x00, 0xc0}) expected.push_back(c);        // -2.0f
  for (unsigned char c : {0, 0, 0, 0, 0, 0, 0xe0, 0x3f}) expected.push_back(c);  // 0.5

  const bytes_t got = io::serialize(f);
  CHECK(got == expected);
  CHECK((got.size() - 0) % 8 == 0);
  CHECK(got[0] == header.size());

  // Another writer's file: other key order, whitespace, no padding, no metadata.
  const std::string other =
      R"( { "b" : {"shape":[1, 1], "data_offsets":[8,16], "dtype":"F64"},
           "a": {"data_offsets": [0, 8], "dtype": "F32", "shape": [2]} } )";
  bytes_t data(expected.end() - 16, expected.end());
  const io::file g = io::parse(raw_file(other, data), "other");
  CHECK(g.metadata.empty());
  CHECK(g.names() == std::vector<std::string>{"a", "b"});  // in data order
  CHECK(g.at("a").to_vector<float>() == a);
  CHECK(g.at("b").to_vector<double>() == b);
}

TEST_CASE("safetensors: BF16 and F16 are widened exactly; integer dtypes are not converted") {
  // BF16: 1.0, -2.0, 0.15625; F16: 1.0, -2.0, 2^-24 (smallest subnormal), 65504, inf, 1/3 rounded.
  const bytes_t data{0x80, 0x3f, 0x00, 0xc0, 0x20, 0x3e,                                      // BF16
                     0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00, 0xff, 0x7b, 0x00, 0x7c, 0x55, 0x35,  // F16
                     1,    0,    0,    0};                                                    // I32
  const io::file f = io::parse(raw_file(R"({"h":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},)"
                                        R"("g":{"dtype":"F16","shape":[2,3],"data_offsets":[6,18]},)"
                                        R"("i":{"dtype":"I32","shape":[1],"data_offsets":[18,22]}})",
                                        data),
                               "halves");
  CHECK(f.at("h").to_vector<float>() == std::vector<float>{1.0f, -2.0f, 0.15625f});
  const std::vector<double> g = f.at("g").to_vector<double>();
  CHECK(g[0] == 1.0);
  CHECK(g[1] == -2.0);
  CHECK(g[2] == std::ldexp(1.0, -24));
  CHECK(g[3] == 65504.0);
  CHECK(std::isinf(g[4]));
  CHECK(g[5] == 0.333251953125);
  try {
    f.at("i").to_vector<double>();
    FAIL("no exception");
  } catch (const coupledqk::io_error& e) {
    CHECK(has(e.what(), "'i'"));
    CHECK(has(e.what(), "I32"));
    CHECK(has(e.what(), "F64, F32, BF16, F16"));
  }
}

TEST_CASE("safetensors: lookups name what is available") {
  const io::file f = io::parse(io::serialize(sample_file()), "lookup.safetensors");
  CHECK(f.contains("scalar"));
  CHECK_FALSE(f.contains("nope"));
  try {
    f.at("nope");
    FAIL("no exception");
  } catch (const coupledqk::io_error& e) {
    CHECK(has(e.what(), "lookup.safetensors"));
    CHECK(has(e.what(), "'nope'"));
    CHECK(has(e.what(), "w.double, v.float, scalar, empty"));
  }
  try {
    f.meta("layer_index");
    FAIL("no exception");
  } catch (const coupledqk::io_error& e) {
    CHECK(has(e.what(), "'layer_index'"));
    CHECK(has(e.what(), "attention, note, steps"));
  }
  CHECK(f.find_meta("attention") != nullptr);
  CHECK(f.find_meta("nope") == nullptr);
}

TEST_CASE("safetensors: malformed files are rejected with a clear io_error") {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

  SUBCASE("empty") { CHECK_REJECTED(bytes_t{}, "empty", "0 bytes"); }
  SUBCASE("shorter than the length field") { CHECK_REJECTED(bytes_t(5, 0x20), "only 5 bytes", "8-byte"); }
  SUBCASE("header length larger than the file") {
    bytes_t b;
    put_u64(b, 1000);
    b.insert(b.end(), 10, ' ');
    CHECK_REJECTED(b, "header length 1000", "larger than the 10 bytes");
  }
  SUBCASE("header length over 100 MB") {
    bytes_t b;
    put_u64(b, 200ull * 1024 * 1024);
    b.push_back('{');
    CHECK_REJECTED(b, "209715200", "100 MB");
  }
  SUBCASE("header length 0") {
    bytes_t b;
    put_u64(b, 0);
    CHECK_REJECTED(b, "header length is 0", "JSON object");
  }
  SUBCASE("a binary file") {
    bytes_t b{0x7f, 'E', 'L', 'F', 2, 1, 1, 0};
    for (int i = 0; i < 64; ++i) b.push_back(static_cast<unsigned char>(i * 37));
    CHECK_REJECTED(b, "header length", "larger than");
    bytes_t c;
    put_u64(c, 16);
    for (int i = 0; i < 16; ++i) c.push_back(static_cast<unsigned char>(200 + i));
    CHECK_REJECTED(c, "not valid JSON", "16-byte header");
  }
  SUBCASE("truncated JSON") { CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32")"), "not valid JSON"); }
  SUBCASE("invalid UTF-8 in the header") { CHECK_REJECTED(raw_file("{\"t\xff\":{}}"), "not valid JSON"); }
  SUBCASE("header not an object") {
    CHECK_REJECTED(raw_file("[1, 2, 3]"), "JSON array", "expected a JSON object");
    CHECK_REJECTED(raw_file("42"), "JSON number", "expected a JSON object");
  }
  SUBCASE("entry not an object") { CHECK_REJECTED(raw_file(R"({"t":[1,2]})"), "tensor 't'", "array"); }
  SUBCASE("missing fields") {
    CHECK_REJECTED(raw_file(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", zeros(8)), "tensor 't'",
                   "missing \"dtype\"");
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", zeros(8)), "missing \"shape\"");
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","shape":[2]}})", zeros(8)), "missing \"data_offsets\"");
  }
  SUBCASE("unexpected field") {
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", zeros(8)),
                   "unexpected key \"x\"", "dtype, shape, data_offsets");
  }
  SUBCASE("wrong JSON types") {
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", zeros(8)), "dtype is 4",
                   "string");
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", zeros(8)),
                   "shape is \"2\"", "array");
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", zeros(8)), "2.5",
                   "non-negative integers");
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","shape":[true],"data_offsets":[0,8]}})", zeros(8)), "true",
                   "non-negative integers");
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", zeros(8)),
                   "data_offsets is [0]", "[begin, end]");
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":"0,8"}})", zeros(8)),
                   "data_offsets", "[begin, end]");
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[-1,7]}})", zeros(8)),
                   "data_offsets is [-1,7]", "non-negative");
  }
  SUBCASE("unknown dtype") {
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", zeros(2)),
                   "unknown dtype \"F8_E4M3\"", "accepted: F64, F32");
  }
  SUBCASE("negative dimension") {
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,8]}})", zeros(8)),
                   "negative dimension", "-3");
  }
  SUBCASE("absurd shape") {
    CHECK_REJECTED(
        raw_file(R"({"t":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", zeros(8)),
        "too large");
  }
  SUBCASE("offsets") {
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", zeros(8)), "[8, 0]",
                   "begin <= end");
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", zeros(8)),
                   "[4, 12]", "8-byte data buffer");
  }
  SUBCASE("byte count does not match the shape") {
    CHECK_REJECTED(raw_file(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", zeros(8)),
                   "span 8 bytes", "F32 [3] needs 3 x 4 = 12 bytes");
  }
  SUBCASE("overlapping tensors") {
    CHECK_REJECTED(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            zeros(12)),
                   "overlap", "'a'", "'b'");
    CHECK_REJECTED(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                            zeros(8)),
                   "overlap");
  }
  SUBCASE("gap between tensors") {
    CHECK_REJECTED(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                            zeros(12)),
                   "gap of 4 bytes", "'b'");
  }
  SUBCASE("trailing bytes and truncation") {
    CHECK_REJECTED(raw_file("{" + ok_entry + "}", zeros(9)), "1 trailing bytes");
    CHECK_REJECTED(raw_file("{}", zeros(3)), "3 trailing bytes");
    CHECK_REJECTED(raw_file("{" + ok_entry + "}", zeros(7)), "7-byte data buffer", "truncated");
  }
  SUBCASE("metadata") {
    CHECK_REJECTED(raw_file(R"({"__metadata__":{"steps":3}})"), "metadata value of 'steps' is 3",
                   "must be strings");
    CHECK_REJECTED(raw_file(R"({"__metadata__":{"a":null}})"), "null", "must be strings");
    CHECK_REJECTED(raw_file(R"({"__metadata__":["a"]})"), "__metadata__", "object of string values");
  }
  SUBCASE("duplicate keys") {
    // The words of the project's one JSON reader (io::read_json), with the key path.
    CHECK_REJECTED(raw_file("{" + ok_entry + "," + ok_entry + "}", zeros(8)),
                   "has the key 't' twice (in the top level)", "only once");
    CHECK_REJECTED(
        raw_file(R"({"t":{"dtype":"F32","dtype":"F64","shape":[2],"data_offsets":[0,8]}})", zeros(8)),
        "has the key 'dtype' twice (in t)");
    CHECK_REJECTED(raw_file(R"({"__metadata__":{"a":"1","a":"2"}})"), "has the key 'a' twice (in __metadata__)");
  }
  SUBCASE("the minimal valid files are accepted") {
    CHECK(parse_error(raw_file("{}")).empty());
    CHECK(parse_error(raw_file(R"({"__metadata__":{}})")).empty());
    CHECK(parse_error(raw_file("{" + ok_entry + "}", zeros(8))).empty());
    CHECK(parse_error(raw_file(R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})")).empty());
  }
}

TEST_CASE("safetensors: unreadable paths") {
  temp_dir dir;
  try {
    io::read(dir / "missing.safetensors");
    FAIL("no exception");
  } catch (const coupledqk::io_error& e) {
    CHECK(has(e.what(), "missing.safetensors"));
    CHECK(has(e.what(), "no such file"));
  }
  try {
    io::read(dir.path.string());
    FAIL("no exception");
  } catch (const coupledqk::io_error& e) {
    CHECK(has(e.what(), "directory"));
  }
  write_bytes(dir / "empty.safetensors", {});
  try {
    io::read(dir / "empty.safetensors");
    FAIL("no exception");
  } catch (const coupledqk::io_error& e) {
    CHECK(has(e.what(), "empty.safetensors"));
    CHECK(has(e.what(), "empty"));
  }
  // A truncated copy of a good file.
  bytes_t good = io::serialize(sample_file());
  good.resize(good.size() - 3);
  write_bytes(dir / "cut.safetensors", good);
  try {
    io::read(dir / "cut.safetensors");
    FAIL("no exception");
  } catch (const coupledqk::io_error& e) {
    CHECK(has(e.what(), "cut.safetensors"));
    CHECK(has(e.what(), "truncated"));
  }
}

TEST_CASE("safetensors: the writer refuses invalid content") {
  const float v[2] = {1.0f, 2.0f};
  auto message = [](const io::file& f) {
    try {
      io::serialize(f);
    } catch (const coupledqk::io_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  io::file dup;
  dup.tensors.push_back(io::tensor::from<float>("a", {2}, v));
  dup.tensors.push_back(io::tensor::from<float>("a", {1}, v));
  CHECK(has(message(dup), "duplicate"));
  CHECK_THROWS_AS(dup.add(io::tensor::from<float>("a", {1}, v)), coupledqk::io_error);

  io::file reserved;
  reserved.tensors.push_back(io::tensor::from<float>("__metadata__", {2}, v));
  CHECK(has(message(reserved), "reserved"));

  io::file short_bytes;
  short_bytes.tensors.push_back(io::tensor::from<float>("a", {2}, v));
  short_bytes.tensors[0].bytes.pop_back();
  CHECK(has(message(short_bytes), "holds 7"));

  io::file negative;
  negative.tensors.push_back(io::tensor::from<float>("a", {2}, v));
  negative.tensors[0].shape = {-2};
  CHECK(has(message(negative), "negative"));

  io::file bad_utf8;
  bad_utf8.metadata["k"] = "\xff";
  CHECK(has(message(bad_utf8), "UTF-8"));

  CHECK_THROWS_AS(io::tensor::from<float>("n", {2, -1}, v), coupledqk::invalid_argument);
}

TEST_CASE("safetensors: writes are atomic") {
  temp_dir dir;
  const io::file good = sample_file();

  SUBCASE("into a directory that does not exist: nothing is created") {
    const std::string target = dir / "no/such/dir/out.safetensors";
    try {
      io::write(target, good);
      FAIL("no exception");
    } catch (const coupledqk::io_error& e) {
      CHECK(has(e.what(), "out.safetensors"));
      CHECK(has(e.what(), "No such file or directory"));
    }
    CHECK_FALSE(fs::exists(dir / "no"));
    CHECK(dir.entries().empty());
  }
  SUBCASE("an existing file is kept when serialisation fails, and replaced on success") {
    const std::string target = dir / "out.safetensors";
    write_bytes(target, {'o', 'l', 'd'});
    io::file bad = good;
    bad.tensors[1].bytes.resize(3);
    CHECK_THROWS_AS(io::write(target, bad), coupledqk::io_error);
    CHECK(read_bytes(target) == bytes_t{'o', 'l', 'd'});
    CHECK(dir.entries() == std::vector<std::string>{"out.safetensors"});

    io::write(target, good);
    CHECK(read_bytes(target) == io::serialize(good));
    CHECK(dir.entries() == std::vector<std::string>{"out.safetensors"});
  }
  SUBCASE("a target that cannot be replaced leaves no temporary file behind") {
    fs::create_directory(dir / "occupied");
    write_bytes(dir / "occupied/keep", {'x'});
    try {
      io::write(dir / "occupied", good);
      FAIL("no exception");
    } catch (const coupledqk::io_error& e) {
      CHECK(has(e.what(), "occupied"));
    }
    CHECK(dir.entries() == std::vector<std::string>{"occupied"});
    CHECK(read_bytes(dir / "occupied/keep") == bytes_t{'x'});
  }
  SUBCASE("a path naming a directory is refused") {
    CHECK_THROWS_AS(io::write(dir.path.string() + "/", good), coupledqk::io_error);
    CHECK(dir.entries().empty());
  }
}

TEST_CASE("safetensors: a large file round-trips") {
  const std::size_t n = std::size_t(1) << 22;  // 16 MB of F32 + 32 MB of F64
  std::vector<float> f(n);
  std::vector<double> d(n);
  for (std::size_t i = 0; i < n; ++i) {
    f[i] = static_cast<float>(i) * 0.25f;
    d[i] = -static_cast<double>(i) / 3.0;
  }
  io::file big;
  big.tensors.push_back(io::tensor::from<float>("f", {1024, 4096}, f.data()));
  big.tensors.push_back(io::tensor::from<double>("d", {static_cast<std::int64_t>(n)}, d.data()));
  temp_dir dir;
  io::write(dir / "big.safetensors", big);
  const io::file back = io::read(dir / "big.safetensors");
  CHECK(bit_equal(back.at("f").to_vector<float>(), f));
  CHECK(bit_equal(back.at("d").to_vector<double>(), d));
}

namespace {
using Layer = coupledqk::Attention<double, coupledqk::Leapfrog<2>, coupledqk::Softmax>;

coupledqk::AttentionConfig small_config(coupledqk::Index dim) {
  coupledqk::AttentionConfig c;
  c.dim = dim;
  c.heads = 2;
  c.dynamics_init_scale = 0.3;
  return c;
}

std::vector<coupledqk::TensorView<double>> views_of(Layer& layer) {
  std::vector<coupledqk::TensorView<double>> v;
  coupledqk::append_views<double>(layer.params, "", v);
  return v;
}
}  // namespace

TEST_CASE("safetensors: parameters round-trip through from_view and load_into") {
  Layer a(small_config(8), 1), b(small_config(8), 2);
  REQUIRE(a.params.wq != b.params.wq);
  io::file f;
  for (const auto& v : views_of(a)) f.tensors.push_back(io::from_view(v));
  CHECK(f.contains("dyn.W"));
  CHECK(f.contains("dyn.rho"));
  CHECK(f.at("wq").shape == std::vector<std::int64_t>{8, 8});
  CHECK(io::from_view(views_of(a)[0], "grad.wq").name == "grad.wq");
  io::load_into(io::parse(io::serialize(f), "params"), views_of(b));
  CHECK(a.params.wq == b.params.wq);
  CHECK(a.params.wo == b.params.wo);
  CHECK(a.params.rho == b.params.rho);
  CHECK(a.params.dyn.W == b.params.dyn.W);
  CHECK(a.params.dyn.c == b.params.dyn.c);

  // F32 files load into double views (widened exactly).
  std::vector<float> wq32(64);
  for (std::size_t i = 0; i < wq32.size(); ++i) wq32[i] = static_cast<float>(i) / 8.0f;
  io::file g = f;
  g.tensors[0] = io::tensor::from<float>("wq", {8, 8}, wq32.data());
  io::load_into(g, views_of(b));
  CHECK(b.params.wq(1, 0) == 1.0);
}

TEST_CASE("safetensors: load_into reports shape mismatches and missing tensors, copying nothing") {
  Layer small(small_config(8), 1), big(small_config(16), 2);
  io::file f;
  f.source = "small.safetensors";
  for (const auto& v : views_of(small)) f.tensors.push_back(io::from_view(v));
  const Layer before = big;

  try {
    io::load_into(f, views_of(big));
    FAIL("no exception");
  } catch (const coupledqk::io_error& e) {
    CHECK(has(e.what(), "tensor 'wq' has shape [8, 8]; expected [16, 16]"));
    CHECK(has(e.what(), "small.safetensors"));
  }
  CHECK(big.params.wq == before.params.wq);

  io::file partial;
  for (const auto& t : f.tensors)
    if (t.name != "wk" && t.name != "dyn.b") partial.tensors.push_back(t);
  Layer other(small_config(8), 3);
  const Layer other_before = other;
  try {
    io::load_into(partial, views_of(other));
    FAIL("no exception");
  } catch (const coupledqk::io_error& e) {
    CHECK(has(e.what(), "missing tensors wk, dyn.b"));
    CHECK(has(e.what(), "the file holds: wq, wv, wo"));
  }
  CHECK(other.params.wq == other_before.params.wq);

  io::file ints = f;
  const std::int32_t zero32[64] = {};
  ints.tensors[0] = io::tensor::from<std::int32_t>("wq", {8, 8}, zero32);
  try {
    io::load_into(ints, views_of(other));
    FAIL("no exception");
  } catch (const coupledqk::io_error& e) {
    CHECK(has(e.what(), "'wq' has dtype I32"));
  }
}

// ---- hostile headers (issue 14): each case crashed or overflowed before the limits existed -------

TEST_CASE("safetensors: a header nesting arrays 100,000 deep is refused, not a stack overflow") {
  // {"a":[[[[...]]]]} -- 200 KB. The parse survived, but the message printed the entry with dump(),
  // which recursed once per level and died with SIGSEGV.
  const std::size_t depth = 100000;
  const std::string header = "{\"a\":" + std::string(depth, '[') + std::string(depth, ']') + "}";
  CHECK_REJECTED(raw_file(header), "nests JSON arrays or objects more than 8 levels deep (at a[0][0][0][0][0][0]",
                 "at most 8 are accepted");
  // Objects nest the same way, and so does a deep value in the metadata.
  std::string objects = "{\"a\":";
  for (int i = 0; i < 50000; ++i) objects += "{\"b\":";
  objects += "1" + std::string(50001, '}');
  CHECK_REJECTED(raw_file(objects), "more than 8 levels deep");
  CHECK_REJECTED(raw_file("{\"__metadata__\":{\"k\":" + std::string(depth, '[') + std::string(depth, ']') + "}}"),
                 "more than 8 levels deep");
  // Nesting within the limit is parsed, then rejected for what it is.
  CHECK_REJECTED(raw_file("{\"a\":[[[[1]]]]}"), "tensor 'a'", "entry is a JSON array");
}

TEST_CASE("safetensors: a shape whose dimensions multiply past 2^63 is refused even with a zero") {
  // [2^62, 2, 0]: the unsigned product check passed (2^63, then 0), and numel() overflowed int64.
  const std::string big = std::to_string(std::uint64_t(1) << 62);
  CHECK_REJECTED(raw_file("{\"t\":{\"dtype\":\"F32\",\"shape\":[" + big + ",2,0],\"data_offsets\":[0,0]}}"),
                 "tensor 't'", "multiply past 2^63 - 1");
  CHECK_REJECTED(raw_file("{\"t\":{\"dtype\":\"F32\",\"shape\":[0," + big + ",4],\"data_offsets\":[0,0]}}"),
                 "multiply past 2^63 - 1");
  CHECK_REJECTED(raw_file("{\"t\":{\"dtype\":\"F32\",\"shape\":[9223372036854775808],\"data_offsets\":[0,0]}}"),
                 "above 2^63 - 1");
  // The largest products that fit are parsed (and an empty one holds no bytes).
  const io::file f = io::parse(
      raw_file("{\"t\":{\"dtype\":\"U8\",\"shape\":[" + big + ",0,1],\"data_offsets\":[0,0]}}"), "case.safetensors");
  CHECK(f.at("t").numel() == 0);
  // numel() of a hand-made tensor checks too.
  io::tensor t;
  t.name = "hand";
  t.shape = {std::int64_t(1) << 62, 2, 0};
  CHECK_THROWS_AS(t.numel(), coupledqk::io_error);
  t.shape = {3, -1};
  CHECK_THROWS_AS(t.numel(), coupledqk::io_error);
}

TEST_CASE("safetensors: values quoted from a hostile header are cut to a bounded length") {
  const std::string long_name(1 << 20, 'x');
  const std::string long_value = "\"" + std::string(1 << 20, 'y') + "\"";
  for (const std::string& header :
       {"{\"" + long_name + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,3]}}",
        "{\"t\":{\"dtype\":" + long_value + ",\"shape\":[1],\"data_offsets\":[0,4]}}",
        "{\"t\":[" + long_value + "]}", "{\"__metadata__\":{\"k\":[" + long_value + "]}}",
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"" + long_name + "\":1}}"}) {
    const std::string msg = parse_error(raw_file(header, zeros(4)));
    INFO(msg.substr(0, 300));
    CHECK_FALSE(msg.empty());
    CHECK(msg.size() < 1000);
    CHECK(has(msg, "bytes in all"));
  }
  // A lookup lists a bounded number of the names a file holds.
  io::file many;
  const float v = 1;
  for (int i = 0; i < 100; ++i) many.add(io::tensor::from<float>("t" + std::to_string(i), {}, &v));
  try {
    many.at("missing");
    FAIL("expected io_error");
  } catch (const coupledqk::io_error& e) {
    CHECK(has(e.what(), "(100 in all)"));
    CHECK_FALSE(has(e.what(), "t99"));
  }
}

TEST_CASE("safetensors: more than max_tensors entries are refused before they are examined") {
  std::string header = "{";
  for (std::size_t i = 0; i <= io::max_tensors; ++i)
    header += (i ? "," : "") + ("\"" + std::to_string(i) + "\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}");
  header += "}";
  CHECK_REJECTED(raw_file(header), "more than 100000 tensors", "at most 100000 are accepted");
  // Far more members than that stop the reader's first pass, before any value is built; a long
  // array (a shape) is bounded the same way.
  header.pop_back();
  for (std::size_t i = 0; i < 10; ++i)
    header += ",\"x" + std::to_string(i) + "\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}";
  header += "}";
  CHECK_REJECTED(raw_file(header), "more than 100001 members in one object or array (at the top level)");
  std::string shape = "[1";
  for (std::size_t i = 0; i <= io::max_tensors; ++i) shape += ",1";
  CHECK_REJECTED(raw_file("{\"t\":{\"dtype\":\"U8\",\"shape\":" + shape + "],\"data_offsets\":[0,1]}}", zeros(1)),
                 "more than 100001 members in one object or array (at t.shape)");
}

TEST_CASE("safetensors: remove_stale_temporaries removes a killed writer's temporaries, keeps the rest") {
  temp_dir dir;
  const std::string target = dir / "ckpt.safetensors";
  const float v = 1;
  io::file f;
  f.add(io::tensor::from<float>("t", {}, &v));
  io::write(target, f);
  const std::string stale = dir / ".ckpt.safetensors.tmp.999999999.4";       // above any Linux pid_max
  const std::string live = dir / (".ckpt.safetensors.tmp." + std::to_string(::getppid()) + ".0");  // a live process
  const std::string other = dir / ".other.safetensors.tmp.999999999.0";      // another file's
  const std::string odd = dir / ".ckpt.safetensors.tmp.999999999.4.bak";     // not the writer's pattern
  for (const std::string& p : {stale, live, other, odd}) write_bytes(p, zeros(16));
  CHECK(io::remove_stale_temporaries(target) == 1);
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(live));
  CHECK(fs::exists(other));
  CHECK(fs::exists(odd));
  CHECK(fs::exists(target));
  CHECK(io::remove_stale_temporaries(target) == 0);
  CHECK(io::remove_stale_temporaries(dir / "absent-folder/x.safetensors") == 0);
}
