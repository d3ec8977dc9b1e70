// libFuzzer target: the corpus reader's rules for a user's text file (examples/train/data/corpora.cpp):
// check_text (binary detection, UTF-8 repair, line endings), split_text_file (documents from
// sections or paragraphs), the Brown corpus conversion and the statistics. Any input must pass or
// raise coupledqk::io_error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "data/corpora.hpp"

namespace ct = coupledqk::train;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  (void)ct::brown_to_text(bytes);
  std::string text;
  try {
    text = ct::check_text(bytes, "fuzz.txt");
  } catch (const coupledqk::io_error&) {
    return 0;
  }
  if (text.find('\r') != std::string::npos || text.find('\0') != std::string::npos) std::abort();
  try {
    const auto docs = ct::split_text_file("fuzz.txt", text);
    if (docs.size() < 3) std::abort();
    const ct::Split split = ct::split_documents(docs);
    (void)ct::format_stats(ct::split_stats(split));
  } catch (const coupledqk::io_error&) {
  }
  return 0;
}
