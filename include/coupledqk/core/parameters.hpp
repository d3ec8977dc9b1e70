// Named parameter tensors.
//
// A parameter struct (of an integrator, a scoring or a layer) exposes its tensors through
//
//     template <class F> void visit(F&& f);        // f(const char* name, Matrix<S>& or Vector<S>&)
//     template <class F> void visit(F&& f) const;
//
// in a fixed order. Everything generic -- counting, zeroing, lists of named views for files,
// gradient checks -- is written once here on top of visit().
#pragma once

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "error.hpp"
#include "types.hpp"

namespace coupledqk {

/// Base of a parameter struct: derive as `struct P : NamedTensors<P>` and list the tensors once in
///
///     template <class Self, class F> static void fields(Self& s, F& f) { f("W", s.W); ... }
///
/// which serves both the const and the non-const visit().
template <class Derived>
struct NamedTensors {
  template <class F>
  void visit(F&& f) {
    Derived::fields(static_cast<Derived&>(*this), f);
  }
  template <class F>
  void visit(F&& f) const {
    Derived::fields(static_cast<const Derived&>(*this), f);
  }
};

/// A parameter set with no tensors (Identity, Softmax).
template <class S>
struct EmptyParameters {
  template <class F>
  void visit(F&&) {}
  template <class F>
  void visit(F&&) const {}
};

/// A non-owning view of one named tensor: row-major data with its logical shape.
template <class S>
struct TensorView {
  std::string name;
  std::vector<Index> shape;
  S* data = nullptr;

  Index size() const {
    Index n = 1;
    for (Index s : shape) n *= s;
    return n;
  }
};

/// The name and logical shape of a tensor, without its data (layouts computed from shapes alone).
struct TensorSpec {
  std::string name;
  std::vector<Index> shape;

  Index size() const {
    Index n = 1;
    for (Index s : shape) n *= s;
    return n;
  }
};

/// Logical shape of a parameter tensor: [n] for vectors, [rows, cols] for matrices.
template <class Dense>
std::vector<Index> shape_of(const Dense& t) {
  if constexpr (Dense::ColsAtCompileTime == 1)
    return {t.rows()};
  else
    return {t.rows(), t.cols()};
}

/// Total number of scalars in a parameter set.
template <class Params>
Index count_parameters(const Params& p) {
  Index n = 0;
  p.visit([&](const char*, const auto& t) { n += t.size(); });
  return n;
}

/// Sets every tensor to zero, keeping its shape.
template <class Params>
void set_zero(Params& p) {
  p.visit([](const char*, auto& t) { t.setZero(); });
}

/// A copy with the same shapes and all zeros (the usual gradient buffer).
template <class Params>
Params zeros_like(const Params& p) {
  Params z = p;
  set_zero(z);
  return z;
}

/// dst += src, tensor by tensor (same parameter type, same shapes). Allocates nothing for up to 32
/// tensors.
template <class Params>
void add_into(Params& dst, const Params& src) {
  constexpr std::size_t small = 32;
  std::array<const void*, small> fixed{};
  std::vector<const void*> more;
  std::size_t n = 0;
  src.visit([&](const char*, const auto& t) {
    if (n < small)
      fixed[n] = &t;
    else
      more.push_back(&t);
    ++n;
  });
  std::size_t i = 0;
  dst.visit([&](const char*, auto& t) {
    const void* from = i < small ? fixed[i] : more[i - small];
    ++i;
    t += *static_cast<const std::decay_t<decltype(t)>*>(from);
  });
}

/// Named views of every tensor, each name prefixed with `prefix`.
template <class S, class Params>
void append_views(Params& p, const std::string& prefix, std::vector<TensorView<S>>& out) {
  p.visit([&](const char* name, auto& t) {
    out.push_back(TensorView<S>{prefix + name, shape_of(t), t.data()});
  });
}

/// Throws if any parameter holds a NaN or an infinity, naming the tensor and the first bad index.
template <class Params>
void require_finite_parameters(const Params& p, const std::string& prefix = "") {
  p.visit([&](const char* name, const auto& t) {
    for (Index i = 0; i < t.size(); ++i) {
      const auto v = t.data()[i];
      require(std::isfinite(v), "parameter '", prefix, name, "' holds a non-finite value (",
              v, ") at flat index ", i, "; every parameter must be finite");
    }
  });
}

/// Throws unless every entry of `m` is finite; `what` names the tensor in the message.
template <class Dense>
void require_finite(const Dense& m, const char* what) {
  for (Index r = 0; r < m.rows(); ++r)
    for (Index c = 0; c < m.cols(); ++c) {
      const auto v = m(r, c);
      if (!std::isfinite(v))
        throw non_finite_error(detail::concat(what, " holds a non-finite value (", v, ") at row ", r, ", column ", c,
                                              "; only finite inputs are accepted"));
    }
}

}  // namespace coupledqk
