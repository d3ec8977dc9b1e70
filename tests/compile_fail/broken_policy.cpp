// A policy that must NOT compile: CheckIntegrator turns each defect into its sentence. Built by
// ctest (tests/CMakeLists.txt: compile_fail_*) with -DBROKEN=<case>; each case passes only when the
// compiler's output holds that case's message.
#include <coupledqk/integrators/leapfrog.hpp>
#include <coupledqk/integrators/policy.hpp>

namespace cqk = coupledqk;

/// Leapfrog<1> with one member broken per case.
struct Broken : cqk::Leapfrog<1> {
#if BROKEN == 1
  // forward takes the trace by value instead of by pointer
  template <class S>
  static void forward(const parameters<S>&, const cqk::Vector<S>&, cqk::MatrixRef<S>, cqk::MatrixRef<S>,
                      cqk::trace_of<cqk::Leapfrog<1>, S>, cqk::DynamicsMemory) {}
#elif BROKEN == 2
  // backward without the tau gradient
  template <class S>
  static void backward(const parameters<S>&, const cqk::Vector<S>&, const cqk::trace_of<cqk::Leapfrog<1>, S>&,
                       const cqk::ConstMatrixRef<S>&, const cqk::ConstMatrixRef<S>&, cqk::MatrixRef<S>,
                       cqk::MatrixRef<S>, parameters<S>&, cqk::DynamicsMemory) {}
#elif BROKEN == 3
  // make_parameters returns the wrong type
  template <class S>
  static int make_parameters(const cqk::DynamicsShape&, cqk::Rng&) {
    return 0;
  }
#elif BROKEN == 4
  // no name
  static constexpr int name = 0;
#endif
};

static_assert(cqk::CheckIntegrator<cqk::Leapfrog<1>>::value, "the unbroken policy passes");
#if BROKEN != 0
static_assert(cqk::CheckIntegrator<Broken>::value);
#endif

int main() { return 0; }
