// Errors raised by coupledqk. Every message says what was wrong, the value seen and what is accepted.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace coupledqk {

/// Raised for bad arguments: wrong shapes, zero sizes, unknown names, out-of-range step counts,
/// non-finite inputs. Derives from std::invalid_argument so generic handlers still catch it.
class invalid_argument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// A non-finite value where only finite ones are accepted (require_finite): bad input to a layer,
/// or, inside training, activations that overflowed (the trainer reports the loss as diverged).
class non_finite_error : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// Raised when a file cannot be read or written, or its content is not what was expected.
class io_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Raised when a computation or a device fails for a reason that is neither its arguments nor a
/// file: a training run whose loss diverged, a failed MPI call, a device that cannot be used.
class runtime_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

}  // namespace detail

/// Throws coupledqk::invalid_argument built from the parts when `ok` is false.
template <class... Parts>
void require(bool ok, Parts&&... parts) {
  if (!ok) throw invalid_argument(detail::concat(std::forward<Parts>(parts)...));
}

/// Names joined by ", " for messages ("(none)" when there are none).
inline std::string join_names(const std::vector<std::string>& names) {
  if (names.empty()) return "(none)";
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace coupledqk
