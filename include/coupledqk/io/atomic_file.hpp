// The one durable, atomic file write of the project: a temporary file in the target's folder is
// written, flushed and fsync'ed, renamed over the target, and the folder fsync'ed, so that a reader
// sees the old file or the new one, never a part, even after a crash (checkpoints, the study's
// results, the tokenizer's caches, every file a tool replaces). The POSIX calls live here, not in
// the file formats' headers.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "../core/error.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#define COUPLEDQK_IO_POSIX 1
#else
#define COUPLEDQK_IO_POSIX 0
#endif

namespace coupledqk::io {

/// Writes `data` to `path` atomically: a temporary file in the same directory is written,
/// flushed and fsync'ed, then renamed over `path`. On any failure the temporary file is removed,
/// `path` is left as it was, and io_error is thrown.
inline void write_file_atomically(const std::string& path, const unsigned char* data, std::size_t size) {
  namespace fs = std::filesystem;
  const std::string where = "cannot write '" + path + "': ";
  if (path.empty()) throw io_error("cannot write a file with an empty path");
  const fs::path target(path);
  if (!target.has_filename()) throw io_error(where + "the path names a directory, not a file");
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string base = target.filename().string();
  static std::atomic<unsigned long> counter{0};
  fs::path tmp;
#if COUPLEDQK_IO_POSIX
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = dir / ("." + base + ".tmp." + std::to_string(static_cast<long>(::getpid())) + "." +
                 std::to_string(counter++));
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST)
      throw io_error(where + "cannot create a temporary file in directory '" + dir.string() +
                     "': " + std::strerror(errno));
  }
  if (fd < 0) throw io_error(where + "cannot create a unique temporary file in '" + dir.string() + "'");
  std::FILE* fp = ::fdopen(fd, "wb");
  if (!fp) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw io_error(where + "fdopen failed: " + std::strerror(err));
  }
#else
  std::FILE* fp = nullptr;
  for (int attempt = 0; attempt < 100 && !fp; ++attempt) {
    tmp = dir / ("." + base + ".tmp." + std::to_string(counter++));
    std::error_code ec;
    if (fs::exists(tmp, ec)) continue;
    fp = std::fopen(tmp.string().c_str(), "wb");
    if (!fp)
      throw io_error(where + "cannot create a temporary file in directory '" + dir.string() +
                     "': " + std::strerror(errno));
  }
  if (!fp) throw io_error(where + "cannot create a unique temporary file in '" + dir.string() + "'");
#endif
  auto abandon = [&](const std::string& what, int err) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw io_error(where + what + ": " + std::strerror(err));
  };
  if (size > 0 && std::fwrite(data, 1, size, fp) != size) {
    const int err = errno;
    std::fclose(fp);
    abandon("writing the temporary file '" + tmp.string() + "' failed", err);
  }
  if (std::fflush(fp) != 0) {
    const int err = errno;
    std::fclose(fp);
    abandon("flushing the temporary file '" + tmp.string() + "' failed", err);
  }
#if COUPLEDQK_IO_POSIX
  if (::fsync(::fileno(fp)) != 0) {
    const int err = errno;
    std::fclose(fp);
    abandon("fsync of the temporary file '" + tmp.string() + "' failed", err);
  }
#endif
  if (std::fclose(fp) != 0) abandon("closing the temporary file '" + tmp.string() + "' failed", errno);
#if COUPLEDQK_IO_POSIX
  if (std::rename(tmp.c_str(), target.c_str()) != 0)
    abandon("renaming the temporary file over it failed", errno);
  // Make the rename itself durable (best effort).
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
#else
  {
    std::error_code ec;
    fs::rename(tmp, target, ec);
    if (ec) {
      fs::remove(tmp, ec);
      throw io_error(where + "renaming the temporary file over it failed: " + ec.message());
    }
  }
#endif
}

/// Removes the temporary files that write_file_atomically(path, ...) left behind in path's folder
/// when its process was killed mid-write (".<name>.tmp.<pid>.<n>" whose process <pid> no longer
/// exists; a live process's are kept). Returns how many were removed; never throws (a file that
/// cannot be removed is left). POSIX only; elsewhere it removes nothing.
inline std::size_t remove_stale_temporaries(const std::string& path) {
  std::size_t removed = 0;
#if COUPLEDQK_IO_POSIX
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (path.empty() || !target.has_filename()) return 0;
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = "." + target.filename().string() + ".tmp.";
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // "<pid>.<n>"
    const std::size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos || dot > 9 || dot + 1 == rest.size() ||
        rest.find_first_not_of("0123456789.") != std::string::npos || rest.find('.', dot + 1) != std::string::npos)
      continue;
    const long pid = std::stol(rest.substr(0, dot));
    if (pid <= 0 || pid == static_cast<long>(::getpid())) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code rm;
    std::error_code type_ec;
    if (fs::is_regular_file(it->symlink_status(type_ec)) && fs::remove(it->path(), rm)) ++removed;
  }
#else
  (void)path;
#endif
  return removed;
}

}  // namespace coupledqk::io
