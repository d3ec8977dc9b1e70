// A fourth-order symplectic integrator written the way a user of coupledqk would write one:
// one header, no change to the library. It is the Forest-Ruth / Yoshida composition of three
// leapfrog steps of sizes theta h, (1 - 2 theta) h and theta h, theta = 1 / (2 - 2^(1/3)), written
// as kick/drift stages of the learned Hamiltonian; SymplecticSplitting provides the forward, the
// backward, the reversible (recompute) backward and the merging of stages across steps.
//
//     #include "forest_ruth.hpp"
//     coupledqk::Attention<double, ForestRuth<2>, coupledqk::Softmax> layer(config, seed);
//
// Its run-time names come from the user's own variant table (forest_ruth_variants below), which
// make_attention, make_gpt and visit_gpt take in place of the built-in one:
//
//     auto layer = coupledqk::make_attention<double>(forest_ruth_variants, "forest-ruth", 2, config);
#pragma once

#include <coupledqk/integrators/splitting.hpp>
#include <coupledqk/registry.hpp>

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

/// The user's variant table: its own names, mapped onto its own policies (built-in names can be
/// added with coupledqk::builtin_variants.with(...)).
inline constexpr coupledqk::VariantTable forest_ruth_variants{
    coupledqk::variant<ForestRuth, coupledqk::Softmax>("forest-ruth"),
    coupledqk::variant<ForestRuth, coupledqk::Differential>("diff-forest-ruth"),
};
