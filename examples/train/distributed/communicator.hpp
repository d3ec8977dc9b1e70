// The processes of a data-parallel training run (docs/distributed.md): one process, or the ranks
// of MPI_COMM_WORLD when the program was started by an MPI launcher (mpirun, mpiexec, srun with
// PMI/PMIx) in a build with MPI (COUPLEDQK_MPI). This header is free of MPI: communicator.cpp holds
// the MPI calls, and a build without MPI compiles the same file to a one-process world.
//
//   Communicator& c = world();        // MPI_Init_thread on first use, when a launcher started us
//   c.size(), c.rank(), c.root()      // 1, 0, true without a launcher
//   c.sum(grads.data(), n);           // in place; every rank ends with the same bits
//   c.agree(error);                   // collective: throws on every rank when any rank failed
//
// Determinism: sum() does not use MPI_Allreduce, whose summation order the standard leaves to the
// implementation (and which may give different ranks different bits). Each rank owns a contiguous
// chunk of the buffer; an all-to-all brings every rank's copy of its chunk to it; it adds them in
// rank order 0, 1, ..., N-1 in double; an all-gather returns the summed chunks to every rank. The
// result is a fixed function of the inputs for a given N, identical on every rank, and the traffic
// is that of a ring all-reduce (2 (N-1)/N of the buffer sent and received per rank).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace coupledqk::train {

/// An error every rank raised together (agree()): each rank can exit cleanly, none waits for another.
/// Any other exception that escapes on one rank of several must end the job (Communicator::abort).
struct collective_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Communicator {
 public:
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool root() const { return rank_ == 0; }
  /// Rank among the processes of this machine, and their count (GPU choice, default threads).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  /// "one process", or "MPI: Open MPI v4.1.4, 2 ranks on 1 machine(s)".
  const std::string& description() const { return description_; }
  /// Whether this build can run on several processes (compiled with MPI).
  static bool mpi_compiled();

  /// In-place sum over the ranks, times `scale` (1/size(): the mean), see the file comment; a
  /// no-op on one process. Both sum in double; the float one rounds each result once.
  void sum(float* data, std::size_t n, double scale = 1.0);
  void sum(double* data, std::size_t n, double scale = 1.0);
  /// Root's bytes to every rank (the size included: `bytes` is resized on the other ranks).
  void broadcast(std::string& bytes, int root = 0);
  void broadcast(std::vector<unsigned char>& bytes, int root = 0);
  void broadcast(void* data, std::size_t bytes, int root = 0);
  /// Every rank's string, in rank order.
  std::vector<std::string> all_gather(const std::string& text);
  /// Collective: `error` is this rank's failure ("" for none). Returns when no rank failed; else
  /// throws collective_error on every rank, with the failures of every rank that had one
  /// ("rank 1 of 2 (host b): <message>", or just the message when every rank failed the same way
  /// or rank 0 alone failed: rank 0 alone reads the checkpoint and writes files).
  void agree(const std::string& error);
  void barrier();
  /// Ends the whole job (MPI_Abort) after `message` is written to stderr; exit(code) on one process.
  [[noreturn]] void abort(const std::string& message, int code = 1);
  /// MPI_Finalize (nothing without MPI). Called once, at the normal end of main.
  void finalize();

 private:
  friend Communicator& world();
  Communicator();
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string description_ = "one process", host_;
  bool mpi_ = false, finalized_ = false;
};

/// The run's processes (initialised on first use; see the file comment). Throws invalid_argument when
/// a launcher started several processes but this build has no MPI (each would train alone).
Communicator& world();

/// Runs f() on every rank and agree()s on its failure: when it throws on any rank, every rank throws
/// collective_error naming the ranks that failed and why.
template <class F>
void together(Communicator& c, F&& f) {
  if (c.size() == 1) {  // one process: the exception itself, as without MPI
    f();
    return;
  }
  std::string error;
  try {
    f();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  c.agree(error);
}


}  // namespace coupledqk::train
