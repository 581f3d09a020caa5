// Merging attention states: split-KV partials and merge_states
// (combine_params.h states the operation).
//
// Each (row, head) pair is merged by its own group of threads, chunk_lanes ×
// state_lanes of them (the host sizes the group to the head dim and state
// count; small problems pack several groups into one CTA). Two passes:
//   1. LSE: the group reads the pair's LSE_s into shared memory and reduces
//      their max m, then turns each into e_s = exp(LSE_s - m) (ex2 on
//      log2-scaled values) and reduces their sum.
//   2. Accumulation: lane (k, c) adds e_s · O_s over elements [8c, 8c + 8) of
//      states s = k, k + state_lanes, ...; 16-byte loads in batches of
//      kCombineStatesInFlight states. The state lanes' sums meet in shared
//      memory and the total is divided by Σ e_s.
// The first batch is loaded before the LSE pass, so its loads and the LSE
// loads overlap instead of queueing one memory round trip behind the other
// (with few states, the first batch is every state a lane has: the host
// sizes state_lanes so). Later batches load only states with e_s > 0. A
// state with e_s == 0 (LSE -inf, or far below the max) never enters the sum,
// so a split that saw no key may leave anything in its O_s, NaN included;
// a pair whose every state is empty writes out = 0 and lse = -inf.
// SINK: the pair's head has a learnable sink logit (CombineParams::sinks),
// merged as one more state whose output is 0: it enlarges the sum and the
// LSE only. A pair with no key then writes 0 with lse = the sink.
// DYNAMIC_SPLITS: a pair whose state 0 holds kStateWrittenMark for its LSE
// was written by the decode kernel (its tile was one piece). Every lane reads
// that LSE before anything else, and a marked pair then loads, merges and
// stores nothing.
// ELEMENTWISE: lanes read and write their chunks one element at a time, and
// the last chunk of a head dim that is not a multiple of 8 holds only the
// elements below it (rows on any element boundary); otherwise 16-byte
// vectors.
#pragma once

#include "combine_params.h"
#include "ptx.cuh"

namespace jitattn {

namespace combine_io {

// A 16-byte global load that does not allocate in L1: every state element is
// read exactly once.
__device__ __forceinline__ uint4 load_once_16(const char* address) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(address));
  return v;
}

__device__ __forceinline__ void half2_to_float2(unsigned word, float& lo, float& hi) {
  asm("{ .reg .f16 l, h;\n"
      "  mov.b32 {l, h}, %2;\n"
      "  cvt.f32.f16 %0, l;\n"
      "  cvt.f32.f16 %1, h; }\n"
      : "=f"(lo), "=f"(hi)
      : "r"(word));
}

// Eight consecutive elements of one dtype: raw 16-byte vectors in, floats out.
template <class T>
struct Eight;

template <>
struct Eight<float> {
  static constexpr int kBytes = 4;    // per element
  static constexpr int kVectors = 2;  // 16-byte vectors per eight elements
  static __device__ __forceinline__ void to_float(const uint4 (&raw)[kVectors], float (&x)[8]) {
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      x[4 * v + 0] = __uint_as_float(raw[v].x);
      x[4 * v + 1] = __uint_as_float(raw[v].y);
      x[4 * v + 2] = __uint_as_float(raw[v].z);
      x[4 * v + 3] = __uint_as_float(raw[v].w);
    }
  }
  static __device__ __forceinline__ void store(char* address, const float (&x)[8]) {
    uint4* out = reinterpret_cast<uint4*>(address);
    out[0] = uint4{__float_as_uint(x[0]), __float_as_uint(x[1]), __float_as_uint(x[2]), __float_as_uint(x[3])};
    out[1] = uint4{__float_as_uint(x[4]), __float_as_uint(x[5]), __float_as_uint(x[6]), __float_as_uint(x[7])};
  }
};

// bf16 is the top half of an fp32: widening is a shift.
template <>
struct Eight<bf16> {
  static constexpr int kBytes = 2;
  static constexpr int kVectors = 1;
  static __device__ __forceinline__ void to_float(const uint4 (&raw)[kVectors], float (&x)[8]) {
    const unsigned words[4] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = __uint_as_float(words[i] << 16);
      x[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
  static __device__ __forceinline__ void store(char* address, const float (&x)[8]) {
    *reinterpret_cast<uint4*>(address) =
        uint4{pack2<bf16>(x[0], x[1]), pack2<bf16>(x[2], x[3]), pack2<bf16>(x[4], x[5]), pack2<bf16>(x[6], x[7])};
  }
};

template <>
struct Eight<f16> {
  static constexpr int kBytes = 2;
  static constexpr int kVectors = 1;
  static __device__ __forceinline__ void to_float(const uint4 (&raw)[kVectors], float (&x)[8]) {
    half2_to_float2(raw[0].x, x[0], x[1]);
    half2_to_float2(raw[0].y, x[2], x[3]);
    half2_to_float2(raw[0].z, x[4], x[5]);
    half2_to_float2(raw[0].w, x[6], x[7]);
  }
  static __device__ __forceinline__ void store(char* address, const float (&x)[8]) {
    *reinterpret_cast<uint4*>(address) =
        uint4{pack2<f16>(x[0], x[1]), pack2<f16>(x[2], x[3]), pack2<f16>(x[4], x[5]), pack2<f16>(x[6], x[7])};
  }
};

// Elements [0, valid) of a chunk read one at a time into the raw vectors
// Eight<T>::to_float takes, the rest zeros (ELEMENTWISE).
template <class T>
__device__ __forceinline__ void load_elements(const char* address, int valid, uint4 (&raw)[Eight<T>::kVectors]) {
  unsigned words[4 * Eight<T>::kVectors];
#pragma unroll
  for (int w = 0; w < 4 * Eight<T>::kVectors; ++w) words[w] = 0u;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (e < valid) {
      if constexpr (Eight<T>::kBytes == 4) {
        words[e] = __ldg(reinterpret_cast<const unsigned*>(address) + e);
      } else {
        const unsigned short element = __ldg(reinterpret_cast<const unsigned short*>(address) + e);
        words[e / 2] |= static_cast<unsigned>(element) << (16 * (e % 2));
      }
    }
  }
#pragma unroll
  for (int v = 0; v < Eight<T>::kVectors; ++v) {
    raw[v] = uint4{words[4 * v], words[4 * v + 1], words[4 * v + 2], words[4 * v + 3]};
  }
}

// Elements [0, valid) of a chunk written one at a time (ELEMENTWISE).
template <class T>
__device__ __forceinline__ void store_elements(char* address, const float (&x)[8], int valid) {
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (e < valid) {
      if constexpr (Eight<T>::kBytes == 4) {
        reinterpret_cast<float*>(address)[e] = x[e];
      } else {
        reinterpret_cast<unsigned short*>(address)[e] = static_cast<unsigned short>(pack2<T>(x[e], 0.f) & 0xffffu);
      }
    }
  }
}

// x reduced (max, or sum) over a group of `group` consecutive threads, group
// a power of two; every thread of the group gets the same value. Every
// thread of the CTA must call it (groups above a warp meet in shared memory).
template <bool kMax>
__device__ __forceinline__ float group_reduce(float x, int group, float* scratch) {
  const int width = group < 32 ? group : 32;
  for (int offset = width / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, x, offset);
    x = kMax ? fmaxf(x, other) : x + other;
  }
  if (group > 32) {
    const int warp = threadIdx.x / 32, warps = group / 32, first = warp / warps * warps;
    __syncthreads();  // earlier readers of scratch are done
    if (threadIdx.x % 32 == 0) scratch[warp] = x;
    __syncthreads();
    x = scratch[first];
    for (int w = 1; w < warps; ++w) x = kMax ? fmaxf(x, scratch[first + w]) : x + scratch[first + w];
  }
  return x;
}

}  // namespace combine_io

template <class State, class Out, bool ELEMENTWISE, bool DYNAMIC_SPLITS, bool SINK = false>
__device__ __forceinline__ void combine_states(const CombineParams& p) {
  using In = combine_io::Eight<State>;
  using Result = combine_io::Eight<Out>;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLn2 = 0.6931471805599453f;
  constexpr int kInFlight = kCombineStatesInFlight;

  // A group's LSE_s, then its e_s (pairs_per_block × num_states <= kCombineMaxStates by the host's layout).
  __shared__ float weights[kCombineMaxStates];
  // The state lanes' partial sums: element j of thread t at [j][t] (conflict-free).
  __shared__ float partial[8 * kCombineThreads];
  __shared__ float scratch[kCombineThreads / 32];

  const int group = p.chunk_lanes * p.state_lanes;
  const int lane = threadIdx.x % group;
  const int slot = threadIdx.x / group;
  const int chunk = lane % p.chunk_lanes;
  const int state_lane = lane / p.chunk_lanes;
  const int pair = blockIdx.x * p.pairs_per_block + slot;
  int b = 0, r = 0, h = 0;
  if (pair < p.pairs) {
    h = pair % p.heads;
    const int row = pair / p.heads;
    r = row % p.seqlen;
    b = row / p.seqlen;
  }
  // Rows past *rows_used (varlen: the packed rows no sequence owns) are
  // neither read nor written.
  bool active = pair < p.pairs && (p.rows_used == nullptr || r < *p.rows_used);
  bool has_chunk = active && chunk * 8 < p.head_dim;
  const int chunk_elements = min(p.head_dim - chunk * 8, 8);  // ELEMENTWISE: the last chunk may hold fewer
  const int num_states = p.num_states;

  // This lane's chunk of state 0 and of state 1 (its own buffer in merge_state).
  const char* state_0 = static_cast<const char*>(p.states) +
                        (b * p.states_batch_stride + r * p.states_row_stride + h * p.states_head_stride + chunk * 8) *
                            In::kBytes;
  const long long state_step = p.states_state_stride * In::kBytes;
  const char* state_1 =
      p.states_b != nullptr
          ? static_cast<const char*>(p.states_b) +
                (b * p.states_b_batch_stride + r * p.states_b_row_stride + h * p.states_b_head_stride + chunk * 8) *
                    In::kBytes
          : state_0 + state_step;
  // Loads states first, first + state_lanes, ... of one batch (given the
  // weights e_s, only those of positive weight).
  uint4 raw[kInFlight][In::kVectors];
  auto load_batch = [&](int first, const float* known_weights) {
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int s = first + i * p.state_lanes;
      const bool load = has_chunk && s < num_states && (known_weights == nullptr || known_weights[s] > 0.f);
      const char* address = s == 1 ? state_1 : state_0 + s * state_step;
      if constexpr (ELEMENTWISE) {
        combine_io::load_elements<State>(address, load ? chunk_elements : 0, raw[i]);
      } else {
#pragma unroll
        for (int v = 0; v < In::kVectors; ++v) {
          raw[i][v] = load ? combine_io::load_once_16(address + 16 * v) : uint4{0u, 0u, 0u, 0u};
        }
      }
    }
  };
  if constexpr (!DYNAMIC_SPLITS) load_batch(state_lane, nullptr);

  // --- 1. LSE: max, then e_s and their sum ---------------------------------
  const float* lse = p.lse + b * p.lse_batch_stride + r * p.lse_row_stride + h * p.lse_head_stride;
  const float* lse_1 = p.lse_b != nullptr
                           ? p.lse_b + b * p.lse_b_batch_stride + r * p.lse_b_row_stride + h * p.lse_b_head_stride
                           : lse + p.lse_state_stride;
  // A pair the decode kernel wrote (DYNAMIC_SPLITS) loads nothing past state
  // 0's LSE, which every lane of its group reads first; a CTA of such pairs
  // leaves at once. Other pairs load their first batch after it.
  if constexpr (DYNAMIC_SPLITS) {
    if (active && __float_as_uint(*lse) == kStateWrittenMark) {
      active = false;
      has_chunk = false;
    }
    if (__syncthreads_and(!active)) return;
    load_batch(state_lane, nullptr);
  }
  float* e = weights + slot * num_states;
  float max_lse = -kInfinity;
  if (active) {
    for (int s = lane; s < num_states; s += group) {
      // +inf is FlashAttention 2's LSE of a row with no key (merge_states
      // of its outputs): empty, as -inf.
      const float given = s == 1 ? *lse_1 : lse[s * p.lse_state_stride];
      const float value = given == kInfinity ? -kInfinity : given;
      e[s] = value;
      max_lse = fmaxf(max_lse, value);
    }
  }
  max_lse = combine_io::group_reduce<true>(max_lse, group, scratch);
  // SINK: the head's learnable sink is one more state, of LSE the sink and
  // an output of 0, so it enters the max and the sum but no product.
  const float sink = SINK && active ? p.sinks[h] : -kInfinity;
  if constexpr (SINK) max_lse = fmaxf(max_lse, sink);
  // Every state empty: all e_s become exp2(-inf) = 0 rather than NaN.
  const float max_log2 = max_lse == -kInfinity ? 0.f : max_lse * kLog2e;
  float sum = 0.f;
  if (active) {
    for (int s = lane; s < num_states; s += group) {
      const float weight = fast_exp2(fmaf(e[s], kLog2e, -max_log2));
      e[s] = weight;
      sum += weight;
    }
  }
  sum = combine_io::group_reduce<false>(sum, group, scratch);
  if constexpr (SINK) sum += fast_exp2(fmaf(sink, kLog2e, -max_log2));
  __syncthreads();  // each lane reads e_s that other lanes wrote

  // --- 2. Σ e_s · O_s over this lane's states and chunk ----------------------
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (has_chunk) {
    for (int first = state_lane; first < num_states; first += p.state_lanes * kInFlight) {
      if (first != state_lane) load_batch(first, e);
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        const int s = first + i * p.state_lanes;
        const float weight = s < num_states ? e[s] : 0.f;
        if (weight > 0.f) {  // an empty state's O_s (perhaps NaN) never meets a multiply
          float x[8];
          In::to_float(raw[i], x);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[j] = fmaf(weight, x[j], acc[j]);
        }
      }
    }
  }

  // --- 3. Sum the state lanes, normalize, store -----------------------------
#pragma unroll
  for (int j = 0; j < 8; ++j) partial[j * kCombineThreads + threadIdx.x] = acc[j];
  __syncthreads();
  if (has_chunk && state_lane == 0) {
    for (int k = 1; k < p.state_lanes; ++k) {
      const int other = threadIdx.x + k * p.chunk_lanes;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += partial[j * kCombineThreads + other];
    }
    const float inverse = sum > 0.f ? 1.f / sum : 0.f;  // sum 0: no state saw a key
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] *= inverse;
    char* out = static_cast<char*>(p.out) +
                (b * p.out_batch_stride + r * p.out_row_stride + h * p.out_head_stride + chunk * 8) * Result::kBytes;
    if constexpr (ELEMENTWISE) {
      combine_io::store_elements<Out>(out, acc, chunk_elements);
    } else {
      Result::store(out, acc);
    }
  }
  if (active && lane == 0 && p.out_lse != nullptr) {
    p.out_lse[b * p.out_lse_batch_stride + r * p.out_lse_row_stride + h * p.out_lse_head_stride] =
        max_lse == -kInfinity ? -kInfinity : max_lse + fast_log2(sum) * kLn2;
  }
}

}  // namespace jitattn
