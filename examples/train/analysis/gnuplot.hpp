// The plots' scripts: text from a plan or a flag reaches gnuplot as data only (implemented in records/progress.cpp).
#pragma once

#include <string>

namespace coupledqk::train {

/// `s` as a gnuplot string literal: single quotes (no backquote substitution, no escapes) around
/// the text cut to 120 characters, every character outside a small alphabet written as '?'. Text
/// from a plan or a flag is data: nothing in it can end the string and become a command.
std::string gnuplot_string(const std::string& s);
/// Runs gnuplot on `script` from the script's folder (scripts name their files relative to it, so
/// that no path reaches a script); true when it succeeded.
bool run_gnuplot(const std::string& script);
}  // namespace coupledqk::train
