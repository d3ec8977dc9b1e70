// The collectives of a data-parallel run (docs/distributed.md), each behind one call: the initial
// parameters from rank 0, the gradient reduction of a step (none on one process; NCCL between the
// GPUs where the backend has it; else MPI on a host copy of the flat gradient buffer), and an
// evaluation split over the ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "records/checkpoint.hpp"
#include "distributed/communicator.hpp"
#include "backend.hpp"
#include "evaluation.hpp"

namespace coupledqk::train {

/// Several ranks and no --resume: every rank takes rank 0's initial parameters (the same seed gives
/// the same ones, but a rank with other threads or another build must not start elsewhere).
void broadcast_parameters(Communicator& comm, Model& model);

/// The gradients (and the loss) of a step: the mean over the ranks, the same bits on every rank,
/// before clipping and AdamW; and whether any rank was interrupted (all stop at the same step).
class GradientReducer {
 public:
  /// Joins the backend's collectives (NCCL) when there are several ranks and it has them (rank 0's
  /// id sent through MPI); a collective call, on every rank alike.
  GradientReducer(Communicator& comm, Backend& backend);

  struct Reduced {
    float loss;
    bool interrupted;
  };
  /// One process: the loss and interrupted() untouched, no time counted.
  Reduced operator()(float loss);

  /// ", gradients all-reduced by NCCL 2.27.3 between the GPUs" (a device backend on several ranks), else "".
  std::string description() const;
  /// Seconds spent reducing since construction or reset_seconds() (rank 0's clock).
  double seconds() const { return seconds_; }
  void reset_seconds() { seconds_ = 0; }

 private:
  Communicator& comm_;
  Backend& backend_;
  bool nccl_ = false;
  std::vector<float> flat_;
  double seconds_ = 0;
};

/// evaluate_stream split over the ranks: each scores its share of the windows, local_batch at a
/// time, and the sums are added (one process: evaluate_stream with the global batch).
Perplexity evaluate_split(Communicator& comm, const BatchLoss& loss, const std::vector<std::int32_t>& stream,
                          Index seq, Index batch, Index local_batch, Index max_tokens);

}  // namespace coupledqk::train
