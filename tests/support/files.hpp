// Helpers shared by the tests of the training example (tests/data, tests/train): temporary
// folders, whole-file I/O, substring checks and "this must throw" with the message returned.
#pragma once

#include <unistd.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>

#include <doctest/doctest.h>

namespace cqk_test_support {

namespace fs = std::filesystem;

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// Runs f, requires it to throw an E, returns the message.
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("wrong exception type: ", e.what());
    return {};
  }
  FAIL("nothing was thrown");
  return {};
}

/// A fresh folder under the system temporary folder, removed at the end of the scope.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag = "t") {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("coupledqk-test-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

inline void write_file(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace cqk_test_support
