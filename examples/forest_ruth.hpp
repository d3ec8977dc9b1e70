// A fourth-order symplectic integrator written the way a user of coupledqk would write one:
// one header, no change to the library. It is the Forest-Ruth / Yoshida composition of three
// leapfrog steps of sizes theta h, (1 - 2 theta) h and theta h, theta = 1 / (2 - 2^(1/3)), written
// as kick/drift stages of the learned Hamiltonian; SymplecticSplitting provides the forward, the
// backward, the reversible (recompute) backward and the merging of stages across steps.
//
//     #include "forest_ruth.hpp"
//     coupledqk::Attention<double, ForestRuth<2>, coupledqk::Softmax> layer(config, seed);
#pragma once

#include <coupledqk/integrators/splitting.hpp>

struct ForestRuthScheme {
  static constexpr double theta = 1.0 / (2.0 - 1.2599210498948731647672106);  // 2^(1/3)
  static constexpr std::array<coupledqk::Stage, 7> stages{{
      {coupledqk::StageKind::kick, theta / 2},
      {coupledqk::StageKind::drift, theta},
      {coupledqk::StageKind::kick, (1 - theta) / 2},
      {coupledqk::StageKind::drift, 1 - 2 * theta},
      {coupledqk::StageKind::kick, (1 - theta) / 2},
      {coupledqk::StageKind::drift, theta},
      {coupledqk::StageKind::kick, theta / 2},
  }};
  static constexpr int order = 4;
  static constexpr const char* name = "forest-ruth";
};

template <int Steps>
struct ForestRuth : coupledqk::SymplecticSplitting<ForestRuthScheme, Steps> {};
