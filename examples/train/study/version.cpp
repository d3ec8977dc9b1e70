// The code version stored in study results (study/store.hpp): its own translation unit, so that a new
// commit recompiles only this file. The header is generated at every build (cmake/code_version.cmake).
#include "store.hpp"

#if __has_include("coupledqk_code_version.hpp")
#include "coupledqk_code_version.hpp"
#endif
#ifndef COUPLEDQK_CODE_VERSION
#define COUPLEDQK_CODE_VERSION "unknown"
#endif

namespace coupledqk::train::study {

std::string code_version() { return COUPLEDQK_CODE_VERSION; }

}  // namespace coupledqk::train::study
