// The velocity family (method spec section 3c, include/coupledqk/integrators/velocity.hpp) on the
// GPU: its DeviceDynamics specialisations and their kernels.
//
// The key is the query's velocity (unit mass, grad T(k) = k), so a drift is the linear update
// q <- q + w h k and only the kick has a learned field, "grad V"(q):
//
//     free     grad V = 0                                       drift         (FreeParticle)
//     newton   grad V = -F(q),  F(q) = F2 silu(F1 q + f1) + f2  newton-*      (NewtonField<SiluForce>)
//     unit     grad V = W^T (a * tanh(W q + b))                 unit-leapfrog (UnitMassHamiltonian)
//
// The integrators are the CPU's: a SymplecticSplitting's merged `plan` (drift w: q += w h k;
// kick w: k -= w h grad V(q)), run one stage after the other, or HamiltonianEuler (per step,
// simultaneously: q, k <- q + h k, k - h grad V(q)). h = softplus(rho_head) / N per pair.
//
// Kernels: one thread per (query, key) pair, grid-stride; the pair's state lives in registers /
// local memory (d <= 128), the weights are read through the read-only cache (no shared memory, no
// barrier). The backward recomputes the trajectory into a scratch buffer (stages x 2 d floats per
// pair: the state before each stage), walks it back and adds the parameter gradients with one
// float atomicAdd per term per pair (dparams and drho are therefore not bitwise reproducible from
// run to run; the forward, dq and dk are). This is the correctness-first form of the family: it
// is checked against the CPU policies in double on the emulator (tests/cuda/test_cuda_dynamics.cu),
// not yet tuned or measured on a GPU (docs/performance-gpu.md).
//
// Parameter layout (float32, visit order, row-major): newton F1 [m, d], f1 [m], F2 [d, m], f2 [d];
// unit W [m, d], b [m], a [m]; free none. rho [H].
//
// Limits: 1 <= d <= 128, 1 <= m <= 128, at most 64 merged stages (N <= 31 for the leapfrogs) and N
// <= 64 for newton-euler; a policy with a force other than SiluForce has no device kernels.
#pragma once

#include <type_traits>

#include <coupledqk/integrators/velocity.hpp>

#include "dynamics.cuh"

namespace coupledqk::cuda {

namespace velocity_detail {

using dynamics_detail::kMaxDim;
using dynamics_detail::kMaxOps;

enum Field : int { free_field = 0, newton_field = 1, unit_field = 2 };

constexpr int kThreads = 128;

/// The program of one policy: stages (kind, coefficient), or N simultaneous Euler steps.
struct Program {
  int field = free_field;
  int steps = 1;
  int euler = 0;         ///< 1: `steps` simultaneous steps; 0: the stages below
  int stages = 0;
  unsigned long long drift_bits = 0;  ///< bit i: stage i is a drift (else a kick)
  float coef[kMaxOps] = {};
};

template <class T>
struct Args {
  Program prog;
  Index pairs, heads;
  int d, m;
  const float* params;
  const float* rho;
  const T* q_in;
  const T* k_in;
  T* q_out;
  T* k_out;
  float* dq;
  float* dk;
  float* dparams;
  float* drho;
  float* trace;  ///< backward: updates x 2 d floats per pair (the state before each update)
};

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

/// A weight, through the read-only data cache on the GPU.
__device__ __forceinline__ float ld(const float* p) {
#if defined(COUPLEDQK_CUDA_EMULATOR)
  return *p;
#else
  return __ldg(p);
#endif
}

/// g = grad V(q) [d] of the field (g is written).
__device__ __forceinline__ void grad_potential(int field, const float* __restrict__ p, int d, int m, const float* q,
                                               float* g) {
  if (field == newton_field) {
    const float* F1 = p;
    const float* f1 = F1 + m * d;
    const float* F2 = f1 + m;
    const float* f2 = F2 + d * m;
    for (int i = 0; i < d; ++i) g[i] = -ld(f2 + i);
    for (int j = 0; j < m; ++j) {
      float z = ld(f1 + j);
      for (int i = 0; i < d; ++i) z += ld(F1 + j * d + i) * q[i];
      const float act = z * sigmoid(z);
      for (int i = 0; i < d; ++i) g[i] -= ld(F2 + i * m + j) * act;
    }
  } else if (field == unit_field) {
    const float* W = p;
    const float* b = W + m * d;
    const float* a = b + m;
    for (int i = 0; i < d; ++i) g[i] = 0.f;
    for (int j = 0; j < m; ++j) {
      float z = ld(b + j);
      for (int i = 0; i < d; ++i) z += ld(W + j * d + i) * q[i];
      const float s = ld(a + j) * tanhf(z);
      for (int i = 0; i < d; ++i) g[i] += ld(W + j * d + i) * s;
    }
  } else {
    for (int i = 0; i < d; ++i) g[i] = 0.f;
  }
}

/// Given u, the cotangent of g = grad V(q): qbar += (dg/dq)^T u, and the parameter gradients
/// (atomicAdd into dp, the params layout).
__device__ __forceinline__ void grad_potential_vjp(int field, const float* __restrict__ p, int d, int m, const float* q,
                                                   const float* u, float* qbar, float* dp) {
  if (field == newton_field) {
    // g = -F: the cotangent of F is -u
    const float* F1 = p;
    const float* f1 = F1 + m * d;
    const float* F2 = f1 + m;
    float* dF1 = dp;
    float* df1 = dF1 + m * d;
    float* dF2 = df1 + m;
    float* df2 = dF2 + d * m;
    for (int i = 0; i < d; ++i) atomicAdd(df2 + i, -u[i]);
    for (int j = 0; j < m; ++j) {
      float z = ld(f1 + j);
      for (int i = 0; i < d; ++i) z += ld(F1 + j * d + i) * q[i];
      const float s = sigmoid(z), act = z * s;
      float v = 0.f;  // (F2^T fbar)_j with fbar = -u
      for (int i = 0; i < d; ++i) {
        v -= ld(F2 + i * m + j) * u[i];
        atomicAdd(dF2 + i * m + j, -u[i] * act);
      }
      const float zbar = v * s * (1.f + z * (1.f - s));
      atomicAdd(df1 + j, zbar);
      for (int i = 0; i < d; ++i) {
        atomicAdd(dF1 + j * d + i, zbar * q[i]);
        qbar[i] += zbar * ld(F1 + j * d + i);
      }
    }
  } else if (field == unit_field) {
    // g = W^T (a * t), t = tanh(W q + b)
    const float* W = p;
    const float* b = W + m * d;
    const float* a = b + m;
    float* dW = dp;
    float* db = dW + m * d;
    float* da = db + m;
    for (int j = 0; j < m; ++j) {
      float z = ld(b + j), v = 0.f;
      for (int i = 0; i < d; ++i) {
        z += ld(W + j * d + i) * q[i];
        v += ld(W + j * d + i) * u[i];
      }
      const float t = tanhf(z), aj = ld(a + j);
      atomicAdd(da + j, v * t);
      const float zbar = v * aj * (1.f - t * t);
      atomicAdd(db + j, zbar);
      for (int i = 0; i < d; ++i) {
        atomicAdd(dW + j * d + i, aj * t * u[i] + zbar * q[i]);
        qbar[i] += zbar * ld(W + j * d + i);
      }
    }
  }
}

/// The number of updates recorded by the backward (stages, or Euler steps).
__host__ __device__ inline int updates(const Program& p) { return p.euler ? p.steps : p.stages; }

/// One update of the forward, in place on (q, k); g: scratch [d].
__device__ __forceinline__ void update(const Program& pr, int op, const float* p, int d, int m, float h, float* q,
                                       float* k, float* g) {
  if (pr.euler) {
    grad_potential(pr.field, p, d, m, q, g);
    for (int i = 0; i < d; ++i) {  // both from the step's input: q reads k before k moves
      q[i] += h * k[i];
      k[i] -= h * g[i];
    }
  } else if ((pr.drift_bits >> op) & 1ull) {
    const float c = pr.coef[op] * h;
    for (int i = 0; i < d; ++i) q[i] += c * k[i];
  } else {
    grad_potential(pr.field, p, d, m, q, g);
    const float c = pr.coef[op] * h;
    for (int i = 0; i < d; ++i) k[i] -= c * g[i];
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) velocity_forward_kernel(const Args<T> a) {
  float q[kMaxDim], k[kMaxDim], g[kMaxDim];
  const int d = a.d;
  for (Index r = Index(blockIdx.x) * kThreads + threadIdx.x; r < a.pairs; r += Index(gridDim.x) * kThreads) {
    for (int i = 0; i < d; ++i) {
      q[i] = to_float(a.q_in[r * d + i]);
      k[i] = to_float(a.k_in[r * d + i]);
    }
    const float h = dynamics_detail::softplus_f(ld(a.rho + r % a.heads)) / static_cast<float>(a.prog.steps);
    const int n = updates(a.prog);
    for (int op = 0; op < n; ++op) update(a.prog, op, a.params, d, a.m, h, q, k, g);
    for (int i = 0; i < d; ++i) {
      a.q_out[r * d + i] = from_float<T>(q[i]);
      a.k_out[r * d + i] = from_float<T>(k[i]);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) velocity_backward_kernel(const Args<T> a) {
  float q[kMaxDim], k[kMaxDim], g[kMaxDim], gq[kMaxDim], gk[kMaxDim], u[kMaxDim], add[kMaxDim];
  const int d = a.d, m = a.m, n = updates(a.prog);
  const Index stride = Index(gridDim.x) * kThreads;
  for (Index r = Index(blockIdx.x) * kThreads + threadIdx.x; r < a.pairs; r += stride) {
    const Index head = r % a.heads;
    const float rho = ld(a.rho + head);
    const float h = dynamics_detail::softplus_f(rho) / static_cast<float>(a.prog.steps);
    float* tr = a.trace + r * Index(n) * 2 * d;  // the state before update op: tr[op * 2d + (0: q, d: k)]
    for (int i = 0; i < d; ++i) {
      q[i] = to_float(a.q_in[r * d + i]);
      k[i] = to_float(a.k_in[r * d + i]);
    }
    for (int op = 0; op < n; ++op) {
      for (int i = 0; i < d; ++i) {
        tr[op * 2 * d + i] = q[i];
        tr[op * 2 * d + d + i] = k[i];
      }
      update(a.prog, op, a.params, d, m, h, q, k, g);
    }
    for (int i = 0; i < d; ++i) {
      gq[i] = a.dq[r * d + i];
      gk[i] = a.dk[r * d + i];
    }
    float dh = 0.f;  // d loss / d h
    for (int op = n - 1; op >= 0; --op) {
      for (int i = 0; i < d; ++i) {
        q[i] = tr[op * 2 * d + i];
        k[i] = tr[op * 2 * d + d + i];
      }
      if (a.prog.euler) {
        // q' = q + h k, k' = k - h g(q)
        grad_potential(a.prog.field, a.params, d, m, q, g);
        for (int i = 0; i < d; ++i) {
          dh += gq[i] * k[i] - gk[i] * g[i];
          u[i] = -h * gk[i];
          add[i] = 0.f;
        }
        grad_potential_vjp(a.prog.field, a.params, d, m, q, u, add, a.dparams);
        for (int i = 0; i < d; ++i) {
          gk[i] += h * gq[i];
          gq[i] += add[i];
        }
      } else if ((a.prog.drift_bits >> op) & 1ull) {
        // q' = q + c h k
        const float c = a.prog.coef[op];
        for (int i = 0; i < d; ++i) {
          dh += c * gq[i] * k[i];
          gk[i] += c * h * gq[i];
        }
      } else {
        // k' = k - c h g(q)
        const float c = a.prog.coef[op];
        grad_potential(a.prog.field, a.params, d, m, q, g);
        for (int i = 0; i < d; ++i) {
          dh -= c * gk[i] * g[i];
          u[i] = -c * h * gk[i];
          add[i] = 0.f;
        }
        grad_potential_vjp(a.prog.field, a.params, d, m, q, u, add, a.dparams);
        for (int i = 0; i < d; ++i) gq[i] += add[i];
      }
    }
    for (int i = 0; i < d; ++i) {
      a.dq[r * d + i] = gq[i];
      a.dk[r * d + i] = gk[i];
    }
    // h = softplus(rho) / N: d h / d rho = sigmoid(rho) / N
    atomicAdd(a.drho + head, dh * dynamics_detail::sigmoid_f(rho) / static_cast<float>(a.prog.steps));
  }
}

inline unsigned blocks_for(Index pairs) {
  const Index blocks = (pairs + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<Index>(1, std::min<Index>(blocks, 65535)));
}

template <class T>
void forward(const Program& prog, const DynamicsDims& dims, const float* params, const float* rho, const T* q_in,
             const T* k_in, T* q_out, T* k_out, cudaStream_t stream) {
  const Args<T> a{prog,  dims.pairs, dims.heads, static_cast<int>(dims.head_dim), static_cast<int>(dims.hidden),
                  params, rho,       q_in,       k_in,                          q_out,
                  k_out,  nullptr,   nullptr,    nullptr,                       nullptr,
                  nullptr};
  launch(velocity_forward_kernel<T>, blocks_for(dims.pairs), kThreads, 0, stream, a);
}

template <class T>
void backward(const Program& prog, const DynamicsDims& dims, const float* params, const float* rho, const T* q_in,
              const T* k_in, float* dq, float* dk, float* dparams, float* drho, cudaStream_t stream) {
  const std::size_t floats =
      static_cast<std::size_t>(dims.pairs) * static_cast<std::size_t>(updates(prog)) * 2 * static_cast<std::size_t>(dims.head_dim);
  const dynamics_detail::Scratch scratch(floats * sizeof(float), stream, dynamics_detail::device_limits().pools != 0);
  const Args<T> a{prog,  dims.pairs, dims.heads, static_cast<int>(dims.head_dim), static_cast<int>(dims.hidden),
                  params, rho,       q_in,       k_in,                          nullptr,
                  nullptr, dq,       dk,         dparams,                       drho,
                  scratch.get()};
  launch(velocity_backward_kernel<T>, blocks_for(dims.pairs), kThreads, 0, stream, a);
}

/// The field of a velocity-family Hamiltonian, or -1 (not one with device kernels).
template <class Ham>
constexpr int field_of() {
  if constexpr (std::is_same_v<Ham, FreeParticle>)
    return free_field;
  else if constexpr (std::is_same_v<Ham, NewtonField<SiluForce>>)
    return newton_field;
  else if constexpr (std::is_same_v<Ham, UnitMassHamiltonian>)
    return unit_field;
  else
    return -1;
}

template <class I, class = void>
struct hamiltonian_of {
  using type = void;
};
template <class I>
struct hamiltonian_of<I, std::void_t<typename I::hamiltonian>> {
  using type = typename I::hamiltonian;
};

/// A splitting method of a velocity-family field (drift, newton-leapfrog, unit-leapfrog, any scheme).
template <class I>
constexpr bool is_velocity_splitting() {
  if constexpr (dynamics_detail::has_plan<I>::value && I::has_dynamics)
    return field_of<typename hamiltonian_of<I>::type>() >= 0;
  else
    return false;
}

template <int N>
using SiluNewtonEulerBase = HamiltonianEuler<N, NewtonField<SiluForce>>;

/// newton-euler with the default force, or a policy derived from it.
template <class I>
constexpr bool is_newton_euler() {
  return dynamics_detail::derives_from_steps<SiluNewtonEulerBase, I>();
}

inline void validate(const DynamicsDims& dims, const char* fn, int field) {
  dynamics_detail::validate_head_dim(dims, fn, kMaxDim);
  if (field != free_field) dynamics_detail::validate_hidden(dims, fn);
}

/// The forward and backward of a velocity-family specialisation `Family`, which gives
/// `static Program program()` and `validate`.
template <class Family>
struct VelocityDynamics {
  template <class T>
  static void forward(const DynamicsDims& dims, const float* params, const float* rho, const T* q_in, const T* k_in,
                      T* q_out, T* k_out, cudaStream_t stream) {
    velocity_detail::forward<T>(Family::program(), dims, params, rho, q_in, k_in, q_out, k_out, stream);
  }
  template <class T>
  static void backward(const DynamicsDims& dims, const float* params, const float* rho, const T* q_in, const T* k_in,
                       float* dq, float* dk, float* dparams, float* drho, cudaStream_t stream) {
    velocity_detail::backward<T>(Family::program(), dims, params, rho, q_in, k_in, dq, dk, dparams, drho, stream);
  }
};

}  // namespace velocity_detail

/// Splittings of the velocity family's fields (drift, newton-leapfrog, unit-leapfrog): the merged
/// plan's stages one after the other.
template <class I>
struct DeviceDynamics<I, std::enable_if_t<velocity_detail::is_velocity_splitting<I>()>>
    : velocity_detail::VelocityDynamics<DeviceDynamics<I>> {
  static constexpr int field = velocity_detail::field_of<typename I::hamiltonian>();
  static constexpr bool supported = I::plan.size <= dynamics_detail::kMaxOps;

  static velocity_detail::Program program() {
    velocity_detail::Program p;
    p.field = field;
    p.steps = I::steps;
    p.stages = I::plan.size;
    for (int i = 0; i < I::plan.size && i < dynamics_detail::kMaxOps; ++i) {
      if (I::plan.stage[i].kind == StageKind::drift) p.drift_bits |= 1ull << i;
      p.coef[i] = static_cast<float>(I::plan.stage[i].coef);
    }
    return p;
  }
  static void validate(const DynamicsDims& dims, const char* fn) { velocity_detail::validate(dims, fn, field); }
};

/// newton-euler (HamiltonianEuler of the force): N simultaneous steps.
template <class I>
struct DeviceDynamics<I, std::enable_if_t<velocity_detail::is_newton_euler<I>()>>
    : velocity_detail::VelocityDynamics<DeviceDynamics<I>> {
  static constexpr bool supported = I::steps <= dynamics_detail::kMaxOps;

  static velocity_detail::Program program() {
    velocity_detail::Program p;
    p.field = velocity_detail::newton_field;
    p.steps = I::steps;
    p.euler = 1;
    return p;
  }
  static void validate(const DynamicsDims& dims, const char* fn) {
    velocity_detail::validate(dims, fn, velocity_detail::newton_field);
  }
};

}  // namespace coupledqk::cuda
