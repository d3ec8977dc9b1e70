// libFuzzer target: the training checkpoint loader (examples/train/records/checkpoint.cpp) -- the
// safetensors reader, then every check coupledqk-train and `coupledqk-train generate` make before
// they use a file: the coupledqk metadata, the tensors against the model config, the model built
// and restored (shapes, dtypes, finite values), the optimiser state and the embedded tokenizer.
// Any input must pass or raise coupledqk::io_error / coupledqk::invalid_argument.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "records/checkpoint.hpp"

namespace io = coupledqk::io;
namespace ct = coupledqk::train;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    io::file f = io::parse(std::vector<unsigned char>(data, data + size), "fuzz.safetensors");
    const ct::Checkpoint c = ct::checkpoint_from_file(std::move(f));
    // The run comparison of --resume (against itself: no difference).
    if (!ct::compare_runs(c.info.run, c.info.run).empty()) std::abort();
    ct::verify_checkpoint(c);
  } catch (const coupledqk::io_error&) {
  } catch (const coupledqk::invalid_argument&) {
  }
  return 0;
}
