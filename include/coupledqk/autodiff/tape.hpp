// Reverse-mode automatic differentiation on an explicit tape.
//
//     Tape<double> tape;
//     Var w = tape.parameter(W.data(), dW.data(), rows, cols);  // leaf bound to external storage
//     Var x = tape.constant(X);                                 // leaf without a gradient
//     Var y = ops::linear(tape, x, w);                          // one node per fused op (ops.hpp)
//     Var l = ops::cross_entropy(tape, y, targets, n);          // [1, 1]
//     tape.backward(l);                                         // dW += dLoss/dW
//     tape.clear();                                             // next step
//
// Design (stan-dev/math's reverse pass, without a global tape):
//  - Nodes are appended in construction order; each holds its value (a row-major Matrix), a
//    gradient allocated on first use, op scratch (`aux`, `index`) and ONE backward closure. Fused
//    ops (LayerNorm, a whole attention layer, softmax + cross-entropy) are one node each with their
//    own analytic backward: there is no graph of scalars.
//  - backward(root) seeds d root = 1 (or a given cotangent) and walks the nodes in reverse order;
//    a node whose gradient was never touched is skipped (nothing flows through it).
//  - Parameters are leaves bound to external memory (value pointer + gradient pointer). Their
//    gradients are ACCUMULATED (+=) straight into that memory, so a leaf used twice (tied
//    embeddings) receives the sum, and micro-batches accumulate.
//  - A node requires a gradient when any of its inputs does; otherwise no closure is recorded and
//    ops keep nothing for the backward. Binding the parameters with a null gradient pointer therefore
//    gives an inference-only graph at no extra cost.
//  - Closures live in an arena owned by the tape; clear() destroys them, rewinds the arena and the
//    node list, but keeps every buffer's capacity, each node's backward scratch (`scratch`) and its
//    op workspace (`workspace<T>`: e.g. an attention layer's Context), so a training loop that
//    builds the same graph each step allocates nothing in the tape after the first step (tested in
//    tests/autodiff/test_no_alloc.cpp). release() frees everything.
//
// Var is a small handle (node index + the tape's epoch); using a Var after clear() throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/types.hpp"

namespace coupledqk {

/// A handle to a node of a Tape. Cheap to copy; valid until the tape is cleared.
struct Var {
  std::int32_t id = -1;
  std::uint32_t epoch = 0;
  bool valid() const { return id >= 0; }
};

namespace detail {

/// Keeps a parameter out of template argument deduction (std::type_identity before C++20).
template <class T>
struct same_type {
  using type = T;
};

/// A monotonic arena: objects are placed one after another in large blocks; reset() rewinds to the
/// start without freeing the blocks. The caller destroys what it placed.
class Arena {
 public:
  static constexpr std::size_t block_bytes = std::size_t(1) << 16;

  void* allocate(std::size_t bytes, std::size_t align) {
    while (current_ < blocks_.size()) {
      Block& b = blocks_[current_];
      const std::size_t p = (offset_ + align - 1) / align * align;
      if (p + bytes <= b.size) {
        offset_ = p + bytes;
        return b.data.get() + p;
      }
      ++current_;
      offset_ = 0;
    }
    const std::size_t size = bytes > block_bytes ? bytes : block_bytes;
    blocks_.push_back(Block{std::make_unique<unsigned char[]>(size), size});
    current_ = blocks_.size() - 1;
    offset_ = bytes;
    return blocks_.back().data.get();
  }

  void reset() {
    current_ = 0;
    offset_ = 0;
  }
  void release() {
    blocks_.clear();
    reset();
  }
  std::size_t capacity_bytes() const {
    std::size_t n = 0;
    for (const Block& b : blocks_) n += b.size;
    return n;
  }

 private:
  struct Block {
    std::unique_ptr<unsigned char[]> data;  // aligned to __STDCPP_DEFAULT_NEW_ALIGNMENT__
    std::size_t size = 0;
  };
  std::vector<Block> blocks_;
  std::size_t current_ = 0, offset_ = 0;
};

/// A workspace object kept in a tape node (Tape::workspace<T>), type-erased.
struct WorkspaceBase {
  virtual ~WorkspaceBase() = default;
};
template <class T>
struct WorkspaceHolder final : WorkspaceBase {
  T value{};
};
/// One distinct address per type: identifies the type held without RTTI.
template <class T>
inline const char workspace_tag = 0;

}  // namespace detail

template <class S>
class Tape {
  static_assert(std::is_floating_point_v<S>, "Tape: Scalar must be float or double");

 public:
  using scalar_type = S;

  Tape() = default;
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;
  ~Tape() { clear(); }

  // ---- leaves ------------------------------------------------------------------------------

  /// A leaf bound to external row-major storage [rows, cols]. `grad` (same shape) receives
  /// dLoss/dvalue by accumulation (+=) during backward(); null means "no gradient wanted".
  /// Both buffers must stay alive and in place until the tape is cleared.
  Var parameter(const S* value, S* grad, Index rows, Index cols) {
    require(value != nullptr && rows > 0 && cols > 0, "tape parameter: needs a value buffer and ",
            "a positive shape; got rows = ", rows, ", cols = ", cols);
    const Var v = push_node(rows, cols, grad != nullptr, false);  // the value is external
    Node& n = node(v);
    n.ext_value = value;
    n.ext_grad = grad;
    return v;
  }

  /// A parameter leaf for a matrix (or a vector, as [1, n]) and its gradient buffer (same type and
  /// shape; nullptr for none).
  template <class Dense>
  Var parameter(const Dense& value, typename detail::same_type<Dense>::type* grad) {
    if (grad)
      require(grad->rows() == value.rows() && grad->cols() == value.cols(), "tape parameter: the ",
              "gradient buffer is [", grad->rows(), ", ", grad->cols(), "]; expected the value's shape [",
              value.rows(), ", ", value.cols(), "]");
    const bool is_vector = Dense::ColsAtCompileTime == 1;
    return parameter(value.data(), grad ? grad->data() : nullptr, is_vector ? 1 : value.rows(),
                     is_vector ? value.size() : value.cols());
  }

  /// A leaf holding a copy of `value`; it never receives a gradient (inputs, masks).
  Var constant(const ConstMatrixRef<S>& value) {
    const Var v = push(value.rows(), value.cols(), false);
    node(v).value = value;
    return v;
  }

  // ---- what ops use ------------------------------------------------------------------------

  /// A new op node [rows, cols]; the op writes its value into output(v). requires_grad: whether any
  /// input requires a gradient (then the op must also call set_backward).
  Var push(Index rows, Index cols, bool requires_grad) { return push_node(rows, cols, requires_grad, true); }

  /// The value buffer an op fills (already [rows, cols]).
  Matrix<S>& output(Var v) {
    Node& n = node(v);
    require(n.ext_value == nullptr, "tape: a parameter leaf's value is external and read-only");
    return n.value;
  }

  /// Op scratch kept for the backward (statistics, probabilities); keeps its capacity across clears.
  Matrix<S>& aux(Var v) { return node(v).aux; }
  std::vector<std::int32_t>& index(Var v) { return node(v).index; }

  /// A buffer the node's op may use freely in its forward or backward (e.g. to form a gradient
  /// before handing it to accumulate_move); it keeps its capacity across clears, so the same graph
  /// step after step reuses it instead of allocating.
  Matrix<S>& scratch(Var v) { return node(v).scratch; }

  /// An object of type T owned by the node's slot and kept across clears (released by release()),
  /// for ops whose state is more than matrices: the attention node keeps its layer's Context here,
  /// so its buffers are reused step after step. Default-constructed on first use, and again when
  /// the slot last held another type.
  template <class T>
  T& workspace(Var v) {
    Node& n = node(v);
    if (n.work_type != &detail::workspace_tag<T>) {
      n.work = std::make_unique<detail::WorkspaceHolder<T>>();
      n.work_type = &detail::workspace_tag<T>;
    }
    return static_cast<detail::WorkspaceHolder<T>*>(n.work.get())->value;
  }

  /// Records the backward of node v: `f(Tape&)` is called once by backward() when gradient has
  /// reached v; it reads grad(v) and accumulates into its inputs. f is stored in the tape's arena
  /// and destroyed by clear(); the returned reference lets an op fill it after placing it.
  template <class F>
  std::decay_t<F>& set_backward(Var v, F&& f) {
    using Fn = std::decay_t<F>;
    static_assert(alignof(Fn) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "tape closure: over-aligned capture");
    static_assert(std::is_invocable_v<Fn&, Tape&>, "tape closure: must be callable as f(Tape&)");
    Node& n = node(v);
    require(n.requires_grad && n.call == nullptr,
            "tape: set_backward on a node that requires no gradient or already has a backward");
    Fn* obj = ::new (arena_.allocate(sizeof(Fn), alignof(Fn))) Fn(std::forward<F>(f));
    n.closure = obj;
    n.call = [](void* p, Tape& t) { (*static_cast<Fn*>(p))(t); };
    if constexpr (!std::is_trivially_destructible_v<Fn>) n.destroy = [](void* p) { static_cast<Fn*>(p)->~Fn(); };
    return *obj;
  }

  // ---- reading -----------------------------------------------------------------------------

  ConstMatrixMap<S> value(Var v) const {
    const Node& n = node(v);
    return ConstMatrixMap<S>(n.ext_value ? n.ext_value : n.value.data(), n.rows, n.cols);
  }
  /// The single entry of a [1, 1] node (a loss).
  S scalar(Var v) const {
    const Node& n = node(v);
    require(n.rows == 1 && n.cols == 1, "tape scalar: node is [", n.rows, ", ", n.cols, "]; expected [1, 1]");
    return value(v)(0, 0);
  }
  Index rows(Var v) const { return node(v).rows; }
  Index cols(Var v) const { return node(v).cols; }
  bool requires_grad(Var v) const { return node(v).requires_grad; }

  /// dRoot/dv. For a parameter leaf: its external buffer (holding whatever was accumulated). For
  /// other nodes: zeros until something is accumulated (allocated then).
  MatrixMap<S> grad(Var v) {
    Node& n = node(v);
    require(n.requires_grad, "tape grad: this node requires no gradient (a constant, or a parameter ",
            "bound without a gradient buffer, and everything computed only from such leaves)");
    if (n.ext_grad) return MatrixMap<S>(n.ext_grad, n.rows, n.cols);
    if (!n.has_grad) {
      n.grad.setZero(n.rows, n.cols);
      n.has_grad = true;
    }
    return MatrixMap<S>(n.grad.data(), n.rows, n.cols);
  }

  /// Where an op puts its contribution to grad(v) itself (e.g. with gemm, which can add into its
  /// output): the gradient buffer, and whether to add to it (a parameter leaf's external buffer, or
  /// a node that already has a gradient) or to write it whole (the first contribution to an
  /// internal node: the buffer is sized and counts as holding the gradient from now on).
  struct GradTarget {
    MatrixMap<S> buffer;
    bool add;
  };
  GradTarget grad_target(Var v) {
    Node& n = node(v);
    require(n.requires_grad, "tape grad_target: this node requires no gradient");
    if (n.ext_grad) return GradTarget{MatrixMap<S>(n.ext_grad, n.rows, n.cols), true};
    const bool add = n.has_grad;
    if (!add) {
      n.grad.resize(n.rows, n.cols);  // no reallocation when the size is unchanged
      n.has_grad = true;
    }
    return GradTarget{MatrixMap<S>(n.grad.data(), n.rows, n.cols), add};
  }

  /// grad(v) += e, for any Eigen expression of v's shape. The first accumulation into an internal
  /// node writes (=) instead of zero-filling and adding. No-op when v requires no gradient.
  template <class Expr>
  void accumulate(Var v, const Expr& e) {
    Node& n = node(v);
    if (!n.requires_grad) return;
    require(e.rows() == n.rows && e.cols() == n.cols, "tape accumulate: gradient is [", e.rows(), ", ",
            e.cols(), "]; node is [", n.rows, ", ", n.cols, "]");
    if (n.ext_grad) {
      MatrixMap<S>(n.ext_grad, n.rows, n.cols).noalias() += e;
    } else if (!n.has_grad) {
      n.grad.noalias() = e;
      n.has_grad = true;
    } else {
      n.grad.noalias() += e;
    }
  }

  /// grad(v) += g, taking g's buffer when v has no gradient yet (no copy). g receives the node's
  /// previous buffer, sized like g, so capacity circulates instead of being reallocated: when g is
  /// a buffer kept across steps (scratch, aux), the same graph allocates nothing from its second
  /// step on.
  void accumulate_move(Var v, Matrix<S>& g) {
    Node& n = node(v);
    if (!n.requires_grad) return;
    if (n.ext_grad || n.has_grad) return accumulate(v, g);
    require(g.rows() == n.rows && g.cols() == n.cols, "tape accumulate: gradient is [", g.rows(), ", ",
            g.cols(), "]; node is [", n.rows, ", ", n.cols, "]");
    n.grad.resize(n.rows, n.cols);  // the buffer g gets back (allocated once, on the first step)
    n.grad.swap(g);
    n.has_grad = true;
  }

  // ---- the reverse pass ----------------------------------------------------------------------

  /// Seeds dRoot = 1 for a [1, 1] root (a loss) and runs every recorded backward in reverse order.
  void backward(Var root) {
    require(rows(root) == 1 && cols(root) == 1, "tape backward: the root is [", rows(root), ", ",
            cols(root), "]; backward(root) needs a scalar [1, 1] (or pass a seed of the root's shape)");
    run_backward(root, Eigen::Matrix<S, 1, 1>::Ones());
  }

  /// Seeds dRoot = seed (root's shape) and runs the backward. Only once per tape fill.
  void backward(Var root, const ConstMatrixRef<S>& seed) { run_backward(root, seed); }

  // ---- lifetime ----------------------------------------------------------------------------

  /// Drops every node and closure of the step; keeps buffers' capacity for the next one.
  /// Every Var handed out so far becomes invalid.
  void clear() {
    for (std::size_t i = count_; i-- > 0;) {
      Node& n = *nodes_[i];
      if (n.destroy) n.destroy(n.closure);
      n.destroy = nullptr;
      n.call = nullptr;
      n.closure = nullptr;
    }
    count_ = 0;
    arena_.reset();
    backward_done_ = false;
    ++epoch_;
  }

  /// clear(), then frees every buffer too (workspaces included).
  void release() {
    clear();
    nodes_.clear();
    arena_.release();
  }

  /// Nodes recorded since the last clear().
  std::size_t size() const { return count_; }

  /// Bytes held by the tape's own buffers (values, gradients, scratch, closure arena), live or
  /// kept for reuse. Not counted: parameters and their gradients (external), nor node workspaces
  /// (an attention layer's Context).
  std::size_t capacity_bytes() const {
    std::size_t b = arena_.capacity_bytes();
    for (const auto& n : nodes_)
      b += sizeof(S) * static_cast<std::size_t>(n->value.size() + n->grad.size() + n->aux.size() +
                                                n->scratch.size()) +
           sizeof(std::int32_t) * n->index.capacity();
    return b;
  }

 private:
  Var push_node(Index rows, Index cols, bool requires_grad, bool with_value) {
    require(rows >= 0 && cols >= 0, "tape: negative shape [", rows, ", ", cols, "]");
    require(count_ < static_cast<std::size_t>(INT32_MAX), "tape: too many nodes");
    if (count_ == nodes_.size()) nodes_.push_back(std::make_unique<Node>());
    Node& n = *nodes_[count_];
    n.rows = rows;
    n.cols = cols;
    n.requires_grad = requires_grad;
    n.has_grad = false;
    n.ext_value = nullptr;
    n.ext_grad = nullptr;
    n.call = nullptr;
    n.destroy = nullptr;
    n.closure = nullptr;
    if (with_value) n.value.resize(rows, cols);  // no reallocation when the size is unchanged
    return Var{static_cast<std::int32_t>(count_++), epoch_};
  }

  template <class Expr>
  void run_backward(Var root, const Expr& seed) {
    require(!backward_done_, "tape backward: already run on this tape; clear() it before the next step");
    require(requires_grad(root), "tape backward: nothing the root depends on requires a gradient ",
            "(were the parameters bound without gradient buffers?)");
    backward_done_ = true;
    accumulate(root, seed);
    for (std::int32_t i = root.id; i >= 0; --i) {
      Node& n = *nodes_[i];
      if (n.call && n.has_grad) n.call(n.closure, *this);
    }
  }

  struct Node {
    Matrix<S> value;                 // [rows, cols]; unused by parameter leaves
    Matrix<S> grad;                  // [rows, cols] once has_grad; unused by parameter leaves
    Matrix<S> aux;                   // op scratch kept for the backward
    Matrix<S> scratch;               // op scratch, free use
    std::vector<std::int32_t> index; // op scratch (token ids, targets)
    std::unique_ptr<detail::WorkspaceBase> work;  // op workspace (workspace<T>), kept across clears
    const void* work_type = nullptr;               // &workspace_tag<T> of `work`
    const S* ext_value = nullptr;    // parameter leaf: external value
    S* ext_grad = nullptr;           // parameter leaf: external gradient (+=)
    Index rows = 0, cols = 0;
    bool requires_grad = false, has_grad = false;
    void* closure = nullptr;
    void (*call)(void*, Tape&) = nullptr;
    void (*destroy)(void*) = nullptr;
  };

  Node& node(Var v) {
    check(v);
    return *nodes_[v.id];
  }
  const Node& node(Var v) const {
    check(v);
    return *nodes_[v.id];
  }
  void check(Var v) const {
    require(v.id >= 0 && static_cast<std::size_t>(v.id) < count_ && v.epoch == epoch_,
            "tape: invalid Var (id ", v.id, ", epoch ", v.epoch, "; the tape holds ", count_,
            " nodes at epoch ", epoch_, "): it is default-constructed, from another tape, or from ",
            "before the last clear()");
  }

  std::vector<std::unique_ptr<Node>> nodes_;  // stable addresses; [count_, size) kept for reuse
  std::size_t count_ = 0;
  std::uint32_t epoch_ = 0;
  bool backward_done_ = false;
  detail::Arena arena_;
};

}  // namespace coupledqk
