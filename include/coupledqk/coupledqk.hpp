// coupledqk: attention with coupled query-key dynamics (Gahtan & Bronstein, 2026).
// The whole library; each header can also be included on its own.
#pragma once

#include "attention.hpp"
#include "core/error.hpp"
#include "core/parameters.hpp"
#include "core/random.hpp"
#include "core/types.hpp"
#include "dynamics/affine_coupling.hpp"
#include "dynamics/hamiltonian.hpp"
#include "dynamics/tanh_map.hpp"
#include "integrators/affine.hpp"
#include "integrators/euler.hpp"
#include "integrators/identity.hpp"
#include "integrators/leapfrog.hpp"
#include "integrators/policy.hpp"
#include "integrators/splitting.hpp"
#include "integrators/uncoupled.hpp"
#include "registry.hpp"
#include "scoring/differential.hpp"
#include "scoring/policy.hpp"
#include "scoring/softmax.hpp"
#include "version.hpp"
