// coupledqk-allreduce-bench: the time of the training's gradient all-reduce (Communicator::sum, the
// fixed-order sum of distributed/communicator.hpp) for buffers of several sizes, against MPI_Allreduce (whose
// order MPI leaves open). docs/distributed.md uses it to estimate the communication share of a step.
//
//   mpirun -np 2 coupledqk-allreduce-bench [floats ...]     (default: 1e5 1e6 4e6 16e6 floats)
//
// Each size: 2 warm-up calls, then `reps` timed calls, each after an MPI_Barrier (so that a rank
// late from other work does not count as communication); the median of rank 0's times.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "distributed/communicator.hpp"

namespace ct = coupledqk::train;

int main(int argc, char** argv) {
  try {
    ct::Communicator& comm = ct::world();
    std::vector<std::size_t> sizes;
    for (int i = 1; i < argc; ++i) {
      char* end = nullptr;
      const double v = std::strtod(argv[i], &end);
      if (!end || *end != '\0' || !(v >= 1 && v <= 1e10)) {
        std::fprintf(stderr, "coupledqk-allreduce-bench: '%s' is not a float count in [1, 1e10]\n", argv[i]);
        return 1;
      }
      sizes.push_back(static_cast<std::size_t>(v));
    }
    if (sizes.empty()) sizes = {100'000, 1'000'000, 4'000'000, 16'000'000};
    if (comm.size() < 2 && comm.root())
      std::fprintf(stderr, "note: one process (start it with mpirun -np N): nothing is communicated\n");
    if (comm.root())
      std::printf("%-10s %6s %14s %14s %12s\n", "floats", "ranks", "sum (ms)", "MPI_Allreduce", "GB/s (sum)");
    for (std::size_t n : sizes) {
      std::vector<float> buffer(n, 1.0f + static_cast<float>(comm.rank()));
      const int reps = n >= 10'000'000 ? 5 : 11;
      std::vector<double> ours, theirs;
      for (int r = -2; r < reps; ++r) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        comm.sum(buffer.data(), n, 1.0 / comm.size());
        const double a = MPI_Wtime() - t0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(std::min<std::size_t>(n, 1u << 30)), MPI_FLOAT,
                      MPI_SUM, MPI_COMM_WORLD);
        const double b = MPI_Wtime() - t0;
        if (r >= 0) ours.push_back(a), theirs.push_back(b);
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      // Bus bandwidth as NCCL's tests define it: bytes * 2 (N-1)/N per rank over the time.
      const double moved = 4.0 * static_cast<double>(n) * 2.0 * (comm.size() - 1) / comm.size();
      if (comm.root())
        std::printf("%-10zu %6d %14.3f %14.3f %12.2f\n", n, comm.size(), 1e3 * median(ours), 1e3 * median(theirs),
                    moved / median(ours) / 1e9);
    }
    comm.finalize();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coupledqk-allreduce-bench: error: %s\n", e.what());
    return 1;
  }
}
