// Learning-rate schedule: linear warm-up, then cosine decay to a floor (GPT-2 / llm.c style).
//
//   step s (0-based index of the update about to be taken), W warm-up steps, S total steps:
//     s <  W:       lr = max_lr * (s + 1) / W
//     W <= s < S:   lr = min_lr + 0.5 * (1 + cos(pi * (s - W) / (S - W))) * (max_lr - min_lr)
//     s >= S:       lr = min_lr
#pragma once

#include <cmath>

#include "../core/error.hpp"
#include "../core/types.hpp"

namespace coupledqk {

struct CosineSchedule {
  double max_lr = 6e-4;
  double min_lr = 6e-5;  ///< the floor reached at total_steps (conventionally 10% of max_lr)
  Index warmup_steps = 0;
  Index total_steps = 1;

  /// Throws unless the schedule is usable.
  void validate() const {
    require(std::isfinite(max_lr) && max_lr >= 0, "schedule: max_lr must be finite and >= 0; got ", max_lr);
    require(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= max_lr,
            "schedule: min_lr must be finite and in [0, max_lr = ", max_lr, "]; got ", min_lr);
    require(total_steps >= 1, "schedule: total_steps must be >= 1; got ", total_steps);
    require(warmup_steps >= 0 && warmup_steps <= total_steps, "schedule: warmup_steps must be in [0, ",
            "total_steps = ", total_steps, "]; got ", warmup_steps);
  }

  /// The learning rate of update `step` (0-based).
  double at(Index step) const {
    require(step >= 0, "schedule: step must be >= 0; got ", step);
    if (step < warmup_steps) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    if (step >= total_steps) return min_lr;
    const double ratio =
        static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    const double pi = 3.14159265358979323846;
    return min_lr + 0.5 * (1.0 + std::cos(pi * ratio)) * (max_lr - min_lr);
  }
};

}  // namespace coupledqk
