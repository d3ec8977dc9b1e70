// libFuzzer target: the token-stream cache reader (examples/train/data/tokenizer.cpp,
// parse_token_file, for the vocabularies of the seeds): any bytes are either a valid stream (every id below the vocabulary) or a
// reason to rebuild; never a crash or an exception.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/tokenizer.hpp"

namespace ct = coupledqk::train;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  for (int vocab : {400, 512, 8192}) {
    std::vector<std::int32_t> ids;
    std::string why;
    if (ct::parse_token_file(bytes, vocab, ids, why)) {
      if (ids.size() * 4 + 32 != bytes.size()) std::abort();
      for (std::int32_t id : ids)
        if (id < 0 || id >= vocab) std::abort();
    } else if (why.empty()) {
      std::abort();
    }
  }
  return 0;
}
