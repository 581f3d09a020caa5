// Launch arguments of the combine kernels (templates/combine.cuh), which merge
// attention states: split-KV partials and merge_states. Compiled both by the
// host (src/merge.cpp fills it) and by NVRTC, so the layouts cannot drift
// apart. Plain C++ types only: no toolkit headers.
//
// A state is an output normalized by its own softmax sum, O_s, with its
// natural-log LSE_s (-inf: the state saw no key). Per (row, head):
//   lse = log Σ_s exp(LSE_s)                 (-inf when every LSE_s is -inf)
//   out = Σ_s exp(LSE_s - lse) · O_s         (exactly 0 then)
#pragma once

namespace jitattn {

constexpr int kCombineThreads = 128;     // threads per CTA
constexpr int kCombineMaxStates = 1024;  // states one call may merge
constexpr int kCombineMaxHeadDim = 512;  // head_dim: up to this (a multiple of 8 in 16-byte vectors)
// States a lane loads before it uses any (combine.cuh); the host gives each
// lane at most this many when there are few states.
constexpr int kCombineStatesInFlight = 4;
// Dynamic decode splits (KernelSpec::dynamic_splits): a tile that took one
// piece writes its rows' output and LSE itself, and puts these bits in state
// 0's LSE; the combine leaves such (row, head) pairs alone and reads none of
// their other states. A NaN no arithmetic produces (the GPU's NaNs are
// 0x7fffffff), so no real LSE is taken for it.
constexpr unsigned kStateWrittenMark = 0x7fa0'5a17u;

struct CombineParams {
  const void* states;  // [num_states, batch, seqlen, heads, head_dim]
  const float* lse;    // [num_states, batch, seqlen, heads]
  void* out;           // [batch, seqlen, heads, head_dim]
  float* out_lse;      // [batch, seqlen, heads] or null

  // Two states in separate buffers (merge_state): when states_b is non-null,
  // state 1 is read from states_b / lse_b with the strides below instead of
  // from states + state stride (num_states is then 2).
  const void* states_b;
  const float* lse_b;

  // Strides in elements; the head_dim stride is 1.
  long long states_state_stride, states_batch_stride, states_row_stride, states_head_stride;
  long long lse_state_stride, lse_batch_stride, lse_row_stride, lse_head_stride;
  long long out_batch_stride, out_row_stride, out_head_stride;
  long long out_lse_batch_stride, out_lse_row_stride, out_lse_head_stride;
  long long states_b_batch_stride, states_b_row_stride, states_b_head_stride;
  long long lse_b_batch_stride, lse_b_row_stride, lse_b_head_stride;

  // Optional (device memory): rows at or past *rows_used are skipped
  // (split varlen attention: cu_seqlens_q + batch, the packed rows in use).
  const int* rows_used;

  int num_states;
  int batch;
  int seqlen;
  int heads;
  int head_dim;
  int pairs;  // batch × seqlen × heads: the (row, head) pairs, each merged by one group of threads

  // The thread layout, chosen by the host: a pair's group is chunk_lanes ×
  // state_lanes threads (both powers of two, product <= kCombineThreads).
  // Lane (k, c) accumulates elements [8c, 8c + 8) of states k, k +
  // state_lanes, ...; a CTA holds pairs_per_block groups.
  int chunk_lanes;  // >= head_dim / 8
  int state_lanes;
  int pairs_per_block;

  // Combine specs with .sink (split attention with FlashAttention's
  // learnable_sink): f32 [heads], each head's sink logit, merged as a state
  // of that LSE and output 0. Unused otherwise; last, so that the fields
  // above keep their offsets.
  const float* sinks;
};

}  // namespace jitattn
