#pragma once

#define COUPLEDQK_VERSION_MAJOR 0
#define COUPLEDQK_VERSION_MINOR 1
#define COUPLEDQK_VERSION_PATCH 0

namespace coupledqk {
inline constexpr const char* version = "0.1.0";
}
