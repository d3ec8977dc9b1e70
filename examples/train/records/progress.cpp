#include "records/progress.hpp"
#include "analysis/gnuplot.hpp"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <fstream>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include <nlohmann/json.hpp>

#include <coupledqk/core/error.hpp>
#include <coupledqk/io/safetensors.hpp>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#define COUPLEDQK_HAVE_ISATTY 1
#else
#define COUPLEDQK_HAVE_ISATTY 0
#endif

namespace coupledqk::train {

namespace {

bool is_terminal(std::FILE* f) {
#if COUPLEDQK_HAVE_ISATTY
  return ::isatty(::fileno(f)) != 0;
#else
  (void)f;
  return false;
#endif
}

std::string printf_string(const char* format, double a) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, a);
  return buffer;
}

// Seconds between plain progress lines, and between redraws of the bar.
constexpr double kLineInterval = 10.0;
constexpr double kBarInterval = 0.1;

}  // namespace

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 10) return printf_string("%.1fs", s);
  const long total = std::lround(s);
  char buffer[64];
  if (total < 60)
    std::snprintf(buffer, sizeof buffer, "%lds", total);
  else if (total < 3600)
    std::snprintf(buffer, sizeof buffer, "%ldm%02lds", total / 60, total % 60);
  else
    std::snprintf(buffer, sizeof buffer, "%ldh%02ldm", total / 3600, (total % 3600) / 60);
  return buffer;
}

std::string format_count(double v) {
  if (!std::isfinite(v)) return "?";
  if (std::fabs(v) >= 1e9) return printf_string("%.2fG", v / 1e9);
  if (std::fabs(v) >= 1e6) return printf_string("%.2fM", v / 1e6);
  if (std::fabs(v) >= 1e4) return printf_string("%.1fk", v / 1e3);
  return printf_string("%.0f", v);
}

ProgressMode parse_progress_mode(const std::string& name) {
  if (name == "auto") return ProgressMode::automatic;
  if (name == "bar") return ProgressMode::bar;
  if (name == "lines") return ProgressMode::lines;
  if (name == "off") return ProgressMode::off;
  throw invalid_argument("unknown progress mode '" + name + "'; accepted: auto, bar, lines, off");
}

// ---- Progress ---------------------------------------------------------------------------------

Progress::Progress(ProgressMode mode, std::string label, std::FILE* out)
    : mode_(mode), label_(std::move(label)), out_(out) {
  if (!out_) mode_ = ProgressMode::off;  // silent: the ranks other than 0 of a distributed run
  if (mode_ == ProgressMode::automatic) mode_ = is_terminal(out_) ? ProgressMode::bar : ProgressMode::lines;
  if (!label_.empty()) label_ += ": ";
}

Progress::~Progress() { finish(); }

void Progress::end_line() {
  if (line_open_) {
    std::fputc('\n', out_);
    std::fflush(out_);
    line_open_ = false;
  }
}

void Progress::finish() { end_line(); }

void Progress::message(const std::string& text) {
  if (!out_) return;
  end_line();
  std::fprintf(out_, "%s%s\n", label_.c_str(), text.c_str());
  std::fflush(out_);
}

void Progress::step(const StepMetrics& m) {
  if (mode_ == ProgressMode::off) return;
  const double t = now_seconds();
  const bool last = m.step >= m.total_steps;
  const double interval = mode_ == ProgressMode::bar ? kBarInterval : kLineInterval;
  if (!last && m.step > 1 && t - last_print_ < interval) return;
  last_print_ = t;
  const double tokens_per_step = m.step > 0 ? static_cast<double>(m.tokens) / static_cast<double>(m.step) : 0;
  const double eta = m.tokens_per_s > 0
                         ? static_cast<double>(m.total_steps - m.step) * tokens_per_step / m.tokens_per_s
                         : -1;
  const double fraction = m.total_steps > 0 ? static_cast<double>(m.step) / static_cast<double>(m.total_steps) : 1;
  char text[256];
  std::snprintf(text, sizeof text, "step %ld/%ld  loss %.4f  lr %.2e  %s tok/s  ETA %s",
                static_cast<long>(m.step), static_cast<long>(m.total_steps), m.loss, m.lr,
                format_count(m.tokens_per_s).c_str(), format_duration(eta).c_str());
  if (mode_ == ProgressMode::bar) {
    constexpr int width = 24;
    const int filled = static_cast<int>(std::floor(fraction * width));
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.append(static_cast<std::size_t>(width - filled), '.');
    // \033[K clears what a longer previous line left on the right.
    std::fprintf(out_, "\r%s[%s] %3.0f%%  %s\033[K", label_.c_str(), bar.c_str(), 100 * fraction, text);
    line_open_ = true;
    if (last) end_line();
  } else {
    std::fprintf(out_, "%s%s  (%s elapsed)\n", label_.c_str(), text, format_duration(m.elapsed).c_str());
  }
  std::fflush(out_);
}

void Progress::eval(const EvalMetrics& m) {
  if (mode_ == ProgressMode::off) return;
  char text[256];
  std::snprintf(text, sizeof text, "%s perplexity %.3f (loss %.4f, %s tokens) at step %ld, %s training tokens",
                m.split.c_str(), m.ppl, m.loss, format_count(static_cast<double>(m.eval_tokens)).c_str(),
                static_cast<long>(m.step), format_count(static_cast<double>(m.tokens)).c_str());
  message(text);
}

// ---- MetricsLog -------------------------------------------------------------------------------

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) throw io_error("cannot open the metrics file '" + path + "' for writing: " + std::strerror(errno));
}

void MetricsLog::line(const std::string& json) {
  if (!out_.is_open()) return;
  out_ << json << '\n';
  out_.flush();
  if (!out_) throw io_error("writing the metrics file '" + path_ + "' failed");
}

void MetricsLog::step(const StepMetrics& m) {
  if (!enabled()) return;
  nlohmann::ordered_json j;
  j["type"] = "step";
  j["step"] = m.step;
  j["tokens"] = m.tokens;
  j["loss"] = m.loss;
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;
  j["tokens_per_s"] = m.tokens_per_s;
  j["elapsed"] = m.elapsed;
  line(j.dump());
}

void MetricsLog::eval(const EvalMetrics& m) {
  if (!enabled()) return;
  nlohmann::ordered_json j;
  j["type"] = "eval";
  j["step"] = m.step;
  j["tokens"] = m.tokens;
  j["split"] = m.split;
  j["eval_tokens"] = m.eval_tokens;
  j["loss"] = m.loss;
  j[m.split + "_ppl"] = m.ppl;
  j["elapsed"] = m.elapsed;
  line(j.dump());
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:,+@") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string file_safe(std::string s) {
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) c = '-';
  return s;
}

std::string name_error(const std::string& s) {
  if (s.empty()) return "is empty; a name is 1 to " + std::to_string(max_name_length) + " characters";
  if (s.size() > max_name_length)
    return "is " + std::to_string(s.size()) + " characters long; at most " + std::to_string(max_name_length) +
           " are accepted";
  if (file_safe(s) != s) return "must use letters, digits, '-', '_' and '.' only (it is a name, not a path)";
  if (s[0] == '.') return "must not start with '.' (it is a name, not a path)";
  return "";
}

std::string unsigned_error(const std::string& text, std::uint64_t max) {
  const std::string range = "expected an integer in [0, " + std::to_string(max) + "]";
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    return "'" + bounded_quote(text) + "' is not a non-negative integer; " + range;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0' || v > max) return "'" + bounded_quote(text) + "' is out of range; " + range;
  return "";
}

std::uint64_t parse_unsigned(const std::string& text, std::uint64_t max, const std::string& what) {
  const std::string bad = unsigned_error(text, max);
  if (!bad.empty()) throw invalid_argument(what + " = " + bad);
  return std::strtoull(text.c_str(), nullptr, 10);
}

std::string bounded_quote(const std::string& s) { return io::detail::quote(s); }

std::string gnuplot_string(const std::string& s) {
  static const std::string safe =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _.,:;/()+=%#*[]<>!-";
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < 120; ++i) out += safe.find(s[i]) == std::string::npos ? '?' : s[i];
  return out + (s.size() > 120 ? "...'" : "'");
}

bool run_gnuplot(const std::string& script) {
  const std::filesystem::path p(script);
  const std::string dir = p.parent_path().empty() ? std::string(".") : p.parent_path().string();
  const std::string cmd = "cd " + shell_quote(dir) + " && gnuplot " + shell_quote(p.filename().string()) + " 2>&1";
  return std::system(cmd.c_str()) == 0;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  return "unknown CPU";
}

}  // namespace coupledqk::train
