// The scoring policy interface: how evolved queries and keys become the attention output.
//
// A scoring reads Q', K', V [rows, D] (head h in columns [h d, (h+1) d)) and writes O [rows, D]. The
// rows are B sequences (ScoringShape::start(b), length(b): B*T rows of equal sequences by default,
// or right-padded, or packed; scoring/mask.hpp), and row t of a sequence reads only the rows of its
// own sequence that ScoringShape::mask allows (by default causally, t' <= t). Padding rows of O are
// zero, and their rows of dq, dk, dv too. A policy is a struct with:
//
//   static constexpr const char* name;                 // e.g. "softmax"
//   template <class S> using parameters = ...;         // named tensors (EmptyParameters if none)
//   template <class S> struct saved;                   // what forward keeps for backward, plus
//                                                      // reusable workspace (mutable members)
//   static void validate(const ScoringShape&);         // throws invalid_argument for shapes the
//                                                      // policy cannot take (e.g. odd head counts)
//   template <class S> static parameters<S> make_parameters(const ScoringShape&, Rng&);
//
//   // o written (=). keep may be null when no backward follows.
//   template <class S> static void forward(const parameters<S>&, const ScoringShape&,
//       const Matrix<S>& q, const Matrix<S>& k, const Matrix<S>& v, Matrix<S>& o, saved<S>* keep);
//
//   // o: the forward's output, d_o its cotangent. dq, dk, dv written (=); grad accumulates (+=).
//   template <class S> static void backward(const parameters<S>&, const ScoringShape&,
//       const Matrix<S>& q, const Matrix<S>& k, const Matrix<S>& v, const Matrix<S>& o,
//       const saved<S>&, const Matrix<S>& d_o, Matrix<S>& dq, Matrix<S>& dk, Matrix<S>& dv,
//       parameters<S>& grad);
//
//   // Incremental decoding: the newest token's evolved query q [1, D] against the cached evolved
//   // keys and values of its sequence [t+1, D] (the shape's seq = t+1, batch = 1); o [1, D] (=).
//   // Must equal row t of forward() on the whole prefix, to round-off.
//   // A policy that reads the shape's mask and sequences says so; without it the layer refuses
//   // every mask but the default causal one over equal sequences:
//   static constexpr bool supports_masks = true;
//
//   template <class S> static void decode(const parameters<S>&, const ScoringShape&,
//       const ConstMatrixRef<S>& q, const ConstBlockRef<S>& keys, const ConstBlockRef<S>& values,
//       MatrixRef<S> o);
//
// CheckScoring<Sc> below turns a missing member into a readable compile error.
#pragma once

#include <type_traits>

#include "../core/parameters.hpp"
#include "../core/random.hpp"
#include "../core/types.hpp"
#include "mask.hpp"

namespace coupledqk {

/// Everything a scoring policy needs to know about one call.
struct ScoringShape {
  Index batch = 0;         ///< B
  Index seq = 0;           ///< T (rows per sequence; the longest sequence when packed)
  Index heads = 0;         ///< H (query/key pairs per token)
  Index head_dim = 0;      ///< d
  int layer_index = 0;     ///< 0-based, used by Differential's lambda_init
  bool reference = false;  ///< true: the plain path (T x T probabilities); false: FlashSoftmax
  Mask mask{};             ///< which keys each query sees (causal by default)
  const Sequences* sequences = nullptr;  ///< the rows' layout; null: B sequences of T rows

  /// First row of sequence b and its number of tokens (padding excluded).
  Index start(Index b) const { return sequences ? sequences->start(b) : b * seq; }
  Index length(Index b) const { return sequences ? sequences->length(b) : seq; }
  /// True when some rows are padding (their output and gradients are zero).
  bool padded() const { return sequences && !sequences->dense(); }
  /// True for the default: causal over B equal sequences.
  bool is_default() const { return mask.is_default() && (!sequences || sequences->layout() == SequenceLayout::equal); }
};

namespace detail {
template <class Sc, class = void>
struct scoring_supports_masks : std::false_type {};
template <class Sc>
struct scoring_supports_masks<Sc, std::enable_if_t<Sc::supports_masks>> : std::true_type {};
}  // namespace detail
/// Whether a scoring policy reads ScoringShape::mask and ::sequences (static supports_masks = true).
template <class Sc>
inline constexpr bool supports_masks_v = detail::scoring_supports_masks<Sc>::value;

namespace detail {
template <class Sc, class = void>
struct has_scoring_parameters : std::false_type {};
template <class Sc>
struct has_scoring_parameters<Sc, std::void_t<typename Sc::template parameters<double>>> : std::true_type {};
template <class Sc, class = void>
struct has_saved : std::false_type {};
template <class Sc>
struct has_saved<Sc, std::void_t<typename Sc::template saved<double>>> : std::true_type {};
template <class Sc, class = void>
struct has_validate : std::false_type {};
template <class Sc>
struct has_validate<Sc, std::void_t<decltype(Sc::validate(std::declval<const ScoringShape&>()))>> : std::true_type {};
template <class Sc, class = void>
struct has_scoring_forward : std::false_type {};
template <class Sc>
struct has_scoring_forward<
    Sc, std::void_t<decltype(Sc::template forward<double>(
            std::declval<const typename Sc::template parameters<double>&>(), std::declval<const ScoringShape&>(),
            std::declval<const Matrix<double>&>(), std::declval<const Matrix<double>&>(),
            std::declval<const Matrix<double>&>(), std::declval<Matrix<double>&>(),
            std::declval<typename Sc::template saved<double>*>()))>> : std::true_type {};
template <class Sc, class = void>
struct has_scoring_backward : std::false_type {};
template <class Sc>
struct has_scoring_backward<
    Sc, std::void_t<decltype(Sc::template backward<double>(
            std::declval<const typename Sc::template parameters<double>&>(), std::declval<const ScoringShape&>(),
            std::declval<const Matrix<double>&>(), std::declval<const Matrix<double>&>(),
            std::declval<const Matrix<double>&>(), std::declval<const Matrix<double>&>(),
            std::declval<const typename Sc::template saved<double>&>(), std::declval<const Matrix<double>&>(),
            std::declval<Matrix<double>&>(), std::declval<Matrix<double>&>(), std::declval<Matrix<double>&>(),
            std::declval<typename Sc::template parameters<double>&>()))>> : std::true_type {};
template <class Sc, class = void>
struct has_decode : std::false_type {};
template <class Sc>
struct has_decode<Sc, std::void_t<decltype(Sc::template decode<double>(
                          std::declval<const typename Sc::template parameters<double>&>(),
                          std::declval<const ScoringShape&>(), std::declval<const ConstMatrixRef<double>&>(),
                          std::declval<const ConstBlockRef<double>&>(), std::declval<const ConstBlockRef<double>&>(),
                          std::declval<MatrixRef<double>>()))>> : std::true_type {};
}  // namespace detail

/// Compile-time check of the interface above: `static_assert(CheckScoring<MyScoring>::value)`.
template <class Sc>
struct CheckScoring {
  static_assert(std::is_convertible_v<decltype(Sc::name), const char*>,
                "scoring policy: needs `static constexpr const char* name`");
  static_assert(detail::has_scoring_parameters<Sc>::value,
                "scoring policy: needs `template <class S> using parameters = ...` (EmptyParameters<S> if none)");
  static_assert(detail::has_saved<Sc>::value,
                "scoring policy: needs `template <class S> struct saved` (what forward keeps for backward)");
  static_assert(detail::has_validate<Sc>::value, "scoring policy: needs `static void validate(const ScoringShape&)`");
  static_assert(detail::has_scoring_forward<Sc>::value,
                "scoring policy: needs `template <class S> static void forward(const parameters<S>&, const "
                "ScoringShape&, const Matrix<S>& q, const Matrix<S>& k, const Matrix<S>& v, Matrix<S>& o, "
                "saved<S>* keep)`");
  static_assert(detail::has_scoring_backward<Sc>::value,
                "scoring policy: needs `template <class S> static void backward(const parameters<S>&, const "
                "ScoringShape&, q, k, v, o, const saved<S>&, d_o, Matrix<S>& dq, Matrix<S>& dk, Matrix<S>& dv, "
                "parameters<S>& grad)`");
  static_assert(detail::has_decode<Sc>::value,
                "scoring policy: needs `template <class S> static void decode(const parameters<S>&, const "
                "ScoringShape&, const ConstMatrixRef<S>& q, const ConstBlockRef<S>& keys, const "
                "ConstBlockRef<S>& values, MatrixRef<S> o)` (incremental decoding)");
  static constexpr bool value = true;
};

}  // namespace coupledqk
