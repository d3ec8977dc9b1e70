#include "distributed/communicator.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include <coupledqk/core/error.hpp>

#ifdef COUPLEDQK_WITH_MPI
#include <mpi.h>
#endif

namespace coupledqk::train {

namespace {

/// The process count an MPI launcher announced in the environment: 0 when none started us.
/// Open MPI (OMPI_COMM_WORLD_SIZE), MPICH / Intel MPI's Hydra (PMI_SIZE), PMIx launchers such as
/// srun --mpi=pmix (PMIX_RANK: the size is then unknown here, -1).
int launcher_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(name)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  if (std::getenv("PMIX_RANK") || std::getenv("PMI_RANK")) return -1;
  return 0;
}

#ifdef COUPLEDQK_WITH_MPI
void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw coupledqk::runtime_error(std::string(call) + " failed: " + std::string(text, static_cast<std::size_t>(length)));
}

template <class T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }

/// Elements per round of sum(): bounds the counts below 2^31 (MPI's int) and the extra memory.
constexpr std::size_t max_block = std::size_t(1) << 26;

/// The deterministic sum of the file comment in communicator.hpp, on blocks of at most max_block.
template <class T>
void deterministic_sum(T* data, std::size_t n, int rank, int size, double scale) {
  std::vector<int> counts(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size)),
      recv_counts(static_cast<std::size_t>(size)), recv_offsets(static_cast<std::size_t>(size));
  std::vector<T> gathered;
  for (std::size_t start = 0; start < n; start += max_block) {
    const std::size_t m = std::min(max_block, n - start);
    T* block = data + start;
    // Chunk r of the block: counts[r] elements from offsets[r]; this rank owns chunk `rank`.
    int offset = 0;
    for (int r = 0; r < size; ++r) {
      counts[static_cast<std::size_t>(r)] =
          static_cast<int>(m / static_cast<std::size_t>(size) + (static_cast<std::size_t>(r) < m % static_cast<std::size_t>(size)));
      offsets[static_cast<std::size_t>(r)] = offset;
      offset += counts[static_cast<std::size_t>(r)];
    }
    const int mine = counts[static_cast<std::size_t>(rank)];
    for (int r = 0; r < size; ++r) {
      recv_counts[static_cast<std::size_t>(r)] = mine;
      recv_offsets[static_cast<std::size_t>(r)] = r * mine;
    }
    gathered.resize(static_cast<std::size_t>(mine) * static_cast<std::size_t>(size));
    check(MPI_Alltoallv(block, counts.data(), offsets.data(), mpi_type<T>(), gathered.data(), recv_counts.data(),
                        recv_offsets.data(), mpi_type<T>(), MPI_COMM_WORLD),
          "MPI_Alltoallv");
    // Rank order 0, 1, ..., N-1, in double: the same bits whoever computes it.
    T* own = block + offsets[static_cast<std::size_t>(rank)];
    for (int i = 0; i < mine; ++i) {
      double s = 0;
      for (int r = 0; r < size; ++r) s += static_cast<double>(gathered[static_cast<std::size_t>(r * mine + i)]);
      own[i] = static_cast<T>(s * scale);
    }
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, block, counts.data(), offsets.data(), mpi_type<T>(),
                         MPI_COMM_WORLD),
          "MPI_Allgatherv");
  }
}

/// Broadcast of a byte buffer of any size (in pieces of at most 1 GiB).
void broadcast_bytes(void* data, std::size_t bytes, int root) {
  constexpr std::size_t piece = std::size_t(1) << 30;
  auto* p = static_cast<unsigned char*>(data);
  for (std::size_t done = 0; done < bytes; done += piece)
    check(MPI_Bcast(p + done, static_cast<int>(std::min(piece, bytes - done)), MPI_BYTE, root, MPI_COMM_WORLD),
          "MPI_Bcast");
}
#endif

}  // namespace

bool Communicator::mpi_compiled() {
#ifdef COUPLEDQK_WITH_MPI
  return true;
#else
  return false;
#endif
}

Communicator::Communicator() {
  const int announced = launcher_size();
#ifdef COUPLEDQK_WITH_MPI
  if (announced == 0) return;  // not started by a launcher: one process, MPI untouched
  int initialised = 0;
  check(MPI_Initialized(&initialised), "MPI_Initialized");
  if (!initialised) {
    // Only the main thread calls MPI (OpenMP and Eigen threads never do).
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  }
  mpi_ = true;
  // A failed MPI call, or a peer lost, ends the job (the default; set explicitly).
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  MPI_Comm local;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
        "MPI_Comm_split_type");
  check(MPI_Comm_rank(local, &local_rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(local, &local_size_), "MPI_Comm_size");
  MPI_Comm_free(&local);
  int machines = local_rank_ == 0 ? 1 : 0;
  check(MPI_Allreduce(MPI_IN_PLACE, &machines, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  char name[MPI_MAX_PROCESSOR_NAME];
  int length = 0;
  if (MPI_Get_processor_name(name, &length) == MPI_SUCCESS) host_.assign(name, static_cast<std::size_t>(length));
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  length = 0;
  std::string library = "MPI";
  if (MPI_Get_library_version(version, &length) == MPI_SUCCESS) {
    library.assign(version, static_cast<std::size_t>(length));
    library = library.substr(0, library.find_first_of(",\n"));
  }
  description_ = "MPI: " + library + ", " + std::to_string(size_) + " rank" + (size_ > 1 ? "s" : "") + " on " +
                 std::to_string(machines) + " machine" + (machines > 1 ? "s" : "");
#else
  if (announced > 1 || announced < 0)
    throw invalid_argument(
        "this program was started by an MPI launcher" +
        (announced > 1 ? " with " + std::to_string(announced) + " processes" : std::string()) +
        ", but it was built without MPI (configure with -DCOUPLEDQK_MPI=ON where MPI is installed, e.g. Debian's "
        "libopenmpi-dev): each process would train the whole run alone and write the same files");
#endif
}

Communicator& world() {
  static std::unique_ptr<Communicator> w;
  if (!w) w.reset(new Communicator());
  return *w;
}

void Communicator::sum(float* data, std::size_t n, double scale) {
  if (size_ == 1) return;
#ifdef COUPLEDQK_WITH_MPI
  deterministic_sum(data, n, rank_, size_, scale);
#else
  (void)data;
  (void)n;
  (void)scale;
#endif
}

void Communicator::sum(double* data, std::size_t n, double scale) {
  if (size_ == 1) return;
#ifdef COUPLEDQK_WITH_MPI
  deterministic_sum(data, n, rank_, size_, scale);
#else
  (void)data;
  (void)n;
  (void)scale;
#endif
}

void Communicator::broadcast(std::string& bytes, int root) {
  if (size_ == 1) return;
#ifdef COUPLEDQK_WITH_MPI
  unsigned long long n = bytes.size();
  check(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, MPI_COMM_WORLD), "MPI_Bcast");
  bytes.resize(static_cast<std::size_t>(n));
  broadcast_bytes(bytes.data(), bytes.size(), root);
#else
  (void)bytes;
  (void)root;
#endif
}

void Communicator::broadcast(std::vector<unsigned char>& bytes, int root) {
  if (size_ == 1) return;
#ifdef COUPLEDQK_WITH_MPI
  unsigned long long n = bytes.size();
  check(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, MPI_COMM_WORLD), "MPI_Bcast");
  bytes.resize(static_cast<std::size_t>(n));
  broadcast_bytes(bytes.data(), bytes.size(), root);
#else
  (void)bytes;
  (void)root;
#endif
}

void Communicator::broadcast(void* data, std::size_t bytes, int root) {
  if (size_ == 1) return;
#ifdef COUPLEDQK_WITH_MPI
  broadcast_bytes(data, bytes, root);
#else
  (void)data;
  (void)bytes;
  (void)root;
#endif
}

std::vector<std::string> Communicator::all_gather(const std::string& text) {
  if (size_ == 1) return {text};
  std::vector<std::string> out(static_cast<std::size_t>(size_));
#ifdef COUPLEDQK_WITH_MPI
  // Messages and fingerprints: short; longer text is cut so that the counts stay ints.
  const int mine = static_cast<int>(std::min<std::size_t>(text.size(), std::size_t(1) << 20));
  std::vector<int> lengths(static_cast<std::size_t>(size_)), offsets(static_cast<std::size_t>(size_));
  check(MPI_Allgather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    offsets[static_cast<std::size_t>(r)] = total;
    total += lengths[static_cast<std::size_t>(r)];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  check(MPI_Allgatherv(text.data(), mine, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
                       MPI_COMM_WORLD),
        "MPI_Allgatherv");
  for (int r = 0; r < size_; ++r)
    out[static_cast<std::size_t>(r)] = all.substr(static_cast<std::size_t>(offsets[static_cast<std::size_t>(r)]),
                                                  static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)]));
#else
  (void)text;
#endif
  return out;
}

void Communicator::agree(const std::string& error) {
  if (size_ == 1) {
    if (!error.empty()) throw collective_error(error);
    return;
  }
#ifdef COUPLEDQK_WITH_MPI
  int failed = error.empty() ? 0 : 1;
  check(MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  if (failed == 0) return;
  // The ranks' host names travel with the messages: "rank 3 of 4 (node-b)".
  const std::vector<std::string> errors = all_gather(error);
  const std::vector<std::string> hosts = all_gather(host_);
  bool same = true;
  int failures = 0;
  for (const std::string& e : errors) {
    same = same && e == errors[0];
    failures += e.empty() ? 0 : 1;
  }
  if (same) throw collective_error(errors[0]);  // every rank, the same failure (bad flags, say)
  if (failures == 1 && !errors[0].empty()) throw collective_error(errors[0]);  // rank 0's files
  std::string message;
  int shown = 0;
  for (int r = 0; r < size_; ++r) {
    const std::string& e = errors[static_cast<std::size_t>(r)];
    if (e.empty()) continue;
    if (shown++ == 8) {
      message += "\n  (more ranks failed)";
      break;
    }
    message += (shown > 1 ? "\n  " : "") + std::string("rank ") + std::to_string(r) + " of " +
               std::to_string(size_) + " (" + hosts[static_cast<std::size_t>(r)] + "): " + e;
  }
  throw collective_error(message);
#endif
}

void Communicator::barrier() {
#ifdef COUPLEDQK_WITH_MPI
  if (size_ > 1) check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
}

void Communicator::abort(const std::string& message, int code) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
#ifdef COUPLEDQK_WITH_MPI
  if (mpi_ && !finalized_) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

void Communicator::finalize() {
#ifdef COUPLEDQK_WITH_MPI
  if (mpi_ && !finalized_) {
    finalized_ = true;
    MPI_Finalize();
  }
#endif
}

}  // namespace coupledqk::train
