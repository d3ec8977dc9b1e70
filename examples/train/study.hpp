// coupledqk-study: a reproduction study of the paper's claims, described by a plan file, built up
// run by run over several invocations (docs/reproduction.md, docs/training.md).
//
//   Plan plan = load_plan("studies/claims-cpu.json");   // groups of variants x seeds, the claims
//   Store store(plan, results_dir);                      // one JSON file per finished run
//   ... train the runs store.missing() names, store.save(result) each ...
//   Report r = evaluate(plan, store.results());          // paired differences, CIs, verdicts
//
// A run is identified by its full configuration: every training flag that changes what is trained
// (train_flags without --cache and --threads), written as "name=value" lines; its id is a hash of
// that text. Same configuration = same run, whatever group lists it. Results record the plan's
// name and the code version that produced them: results of another plan are an error, results of
// another code version are kept and flagged (status, report), never silently mixed.
//
// The study's rooms (examples/train/study/): plan.hpp (the plan, its choices, run identity),
// store.hpp (the results folder), claims.hpp (claims on the finished runs, with the statistics of
// analysis/statistics.hpp), report.hpp (docs/reproduction.md). This header includes all four.
#pragma once

#include "study/claims.hpp"
#include "study/plan.hpp"
#include "study/report.hpp"
#include "study/store.hpp"
