// Progress of a training run: a one-line bar on a terminal, plain periodic lines otherwise, and a
// JSON-lines metrics file (one object per step, per evaluation, and a final summary).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include <coupledqk/core/types.hpp>

namespace coupledqk::train {

/// How progress is shown on stderr.
enum class ProgressMode {
  automatic,  ///< bar when stderr is a terminal (isatty), lines otherwise
  bar,        ///< one line redrawn with '\r'
  lines,      ///< a plain line every few seconds (logs, pipes, CI)
  off,        ///< nothing but messages
};

/// "auto", "bar", "lines" or "off"; invalid_argument listing them otherwise.
ProgressMode parse_progress_mode(const std::string& name);

/// What one optimiser step reports.
struct StepMetrics {
  Index step = 0;              ///< updates done, this one included (1-based)
  Index total_steps = 0;
  std::int64_t tokens = 0;     ///< training tokens seen so far
  double loss = 0;             ///< this batch's mean cross-entropy (nats/token)
  double lr = 0;               ///< learning rate used by this update
  double grad_norm = 0;        ///< global gradient norm before clipping
  double tokens_per_s = 0;     ///< this session's average
  double elapsed = 0;          ///< seconds of training, earlier sessions included
};

/// What one evaluation reports.
struct EvalMetrics {
  Index step = 0;
  std::int64_t tokens = 0;         ///< training tokens seen when it ran
  std::string split = "valid";     ///< "valid" or "test"
  std::int64_t eval_tokens = 0;    ///< tokens scored
  double loss = 0;                 ///< mean cross-entropy (nats/token)
  double ppl = 0;                  ///< exp(loss)
  double elapsed = 0;
};

/// Human-readable progress on stderr. `label` (e.g. "leapfrog seed 2") prefixes every line. A null
/// `out` shows nothing, messages included (the ranks other than 0 of a distributed run).
class Progress {
 public:
  explicit Progress(ProgressMode mode = ProgressMode::automatic, std::string label = "",
                    std::FILE* out = stderr);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// True when progress is drawn as a bar (the mode, resolved against isatty).
  bool is_bar() const { return mode_ == ProgressMode::bar; }
  void step(const StepMetrics& m);
  void eval(const EvalMetrics& m);
  /// A line of text (ends the bar's line first).
  void message(const std::string& text);
  /// Ends the bar's line.
  void finish();

 private:
  void end_line();
  ProgressMode mode_;
  std::string label_;
  std::FILE* out_;
  bool line_open_ = false;
  double last_print_ = -1e9;  // seconds (steady clock) of the last line or redraw
};

/// "1h02m", "3m07s", "12s", "0.4s".
std::string format_duration(double seconds);

/// Seconds on a monotonic clock (differences only).
double now_seconds();
/// "12.3k", "1.25M", "950".
std::string format_count(double value);

/// `s` as one shell word: unchanged when it holds only safe characters, else in single quotes (for
/// the commands quoted in reports).
std::string shell_quote(const std::string& s);
/// `s` with every character but letters, digits, '-', '_' and '.' replaced by '-' (file names).
std::string file_safe(std::string s);
/// Longest name (plan, group, claim id) accepted: names become file names and labels.
inline constexpr std::size_t max_name_length = 64;
/// What is wrong with `s` as a name -- 1 to max_name_length letters, digits, '-', '_' and '.', not
/// starting with '.' (so never a path, "." or ".."); "" when it is one.
std::string name_error(const std::string& s);
/// What is wrong with `text` as a decimal integer in [0, max] (no sign, spaces or wrapping: "-1"
/// and 2^64 are refused); "" when it is one. The one integer rule of the CLI checks, plans and flags.
std::string unsigned_error(const std::string& text, std::uint64_t max);
/// The integer; invalid_argument "<what> = '<text>' is not ..." otherwise.
std::uint64_t parse_unsigned(const std::string& text, std::uint64_t max, const std::string& what);
/// `s` cut to a bounded length with control characters escaped, for messages (io::detail::quote).
std::string bounded_quote(const std::string& s);
/// The CPU's model name from /proc/cpuinfo ("unknown CPU" where there is none).
std::string cpu_model();

/// JSON lines, one object per line:
///   {"type":"step","step":..,"tokens":..,"loss":..,"lr":..,"grad_norm":..,"tokens_per_s":..,"elapsed":..}
///   {"type":"eval","step":..,"tokens":..,"split":"valid","eval_tokens":..,"loss":..,"ppl":..,"elapsed":..}
///   {"type":"summary", ...}  (written by the trainer: see trainer.hpp)
/// Each line is flushed, so a killed run leaves complete lines. A default-constructed log
/// (no path) writes nothing.
class MetricsLog {
 public:
  MetricsLog() = default;
  /// Opens `path` for writing (append: keep what is there, for a resumed run). Throws io_error.
  MetricsLog(const std::string& path, bool append);
  bool enabled() const { return out_.is_open(); }
  const std::string& path() const { return path_; }
  void step(const StepMetrics& m);
  void eval(const EvalMetrics& m);
  /// Writes one line of already-serialised JSON.
  void line(const std::string& json);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace coupledqk::train
