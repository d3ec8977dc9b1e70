// libFuzzer target: the safetensors reader (coupledqk/io/safetensors.hpp). Any input must either
// parse or raise coupledqk::io_error; a parsed file must convert, serialise and parse back to the
// same tensors. Anything else (a crash, a sanitizer report, another exception) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include <coupledqk/io/safetensors.hpp>

namespace io = coupledqk::io;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<unsigned char> bytes(data, data + size);
  io::file f;
  try {
    f = io::parse(bytes, "fuzz.safetensors");
  } catch (const coupledqk::io_error&) {
    return 0;
  }
  for (const io::tensor& t : f.tensors) {
    const std::int64_t n = t.numel();
    if (n < 0 || static_cast<std::uint64_t>(n) * io::dtype_size(t.type) != t.bytes.size()) std::abort();
    if (io::is_floating(t.type)) {
      if (t.to_vector<float>().size() != static_cast<std::size_t>(n)) std::abort();
      if (t.to_vector<double>().size() != static_cast<std::size_t>(n)) std::abort();
    }
    (void)f.at(t.name);
  }
  // What was read writes and reads back (names that are not UTF-8 are refused by the writer).
  std::vector<unsigned char> again;
  try {
    again = io::serialize(f);
  } catch (const coupledqk::io_error&) {
    return 0;
  }
  const io::file g = io::parse(again, "again.safetensors");
  if (g.tensors.size() != f.tensors.size() || g.metadata != f.metadata) std::abort();
  for (const io::tensor& t : f.tensors) {
    const io::tensor& u = g.at(t.name);
    if (u.type != t.type || u.shape != t.shape || u.bytes != t.bytes) std::abort();
  }
  return 0;
}
