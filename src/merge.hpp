// merge: plans a merge of attention states (the combine kernel family):
// validates the call and splits it into what is compiled (the KernelSpec:
// state and output dtypes) and what stays a runtime argument (CombineParams +
// grid). merge_states / merge_state come in as tensors; split-KV decoding
// calls plan_combine with raw pointers and strides. Pure arithmetic: no GPU,
// no I/O, testable on CPU.
#pragma once

#include <cstdint>

#include <jitattn/jitattn.hpp>

#include "combine_params.h"
#include "spec.hpp"

namespace jitattn::detail {

struct CombinePlan {
  KernelSpec spec;
  CombineParams params{};
  unsigned grid = 0;  // CTAs of kCombineThreads (spec.threads()); 0 = nothing to merge
};

// One merge in raw form. Rows are indexed on two levels (batch, seqlen) so
// split-KV partials [num_splits, batch, seqlen_q, heads, head_dim] merge
// without a reshape. Strides are in elements; the head_dim stride is 1.
struct CombineProblem {
  DType state_dtype = DType::f32;  // f32, f16 or bf16
  DType out_dtype = DType::bf16;   // f32, f16 or bf16
  const void* states = nullptr;    // [num_states, batch, seqlen, heads, head_dim]
  const float* lse = nullptr;      // [num_states, batch, seqlen, heads], natural log
  void* out = nullptr;             // [batch, seqlen, heads, head_dim]
  float* out_lse = nullptr;        // [batch, seqlen, heads], or null to skip
  int64_t num_states = 0, batch = 0, seqlen = 0, heads = 0, head_dim = 0;
  int64_t states_strides[4] = {};   // state, batch, row, head
  int64_t lse_strides[4] = {};      // state, batch, row, head
  int64_t out_strides[3] = {};      // batch, row, head
  int64_t out_lse_strides[3] = {};  // batch, row, head
  // Optional, in device memory: rows at or past *rows_used are not merged.
  const int* rows_used = nullptr;
  // The partials of a decode with dynamic splits: pairs whose state 0's LSE
  // is kStateWrittenMark were written by the decode kernel and are skipped
  // (KernelSpec::dynamic_splits).
  bool dynamic_splits = false;
  // Optional, in device memory: f32 [heads], each head's learnable sink
  // logit, merged as one more state of that LSE and output 0 (split
  // attention with ForwardOptions::learnable_sink; KernelSpec::sink).
  const float* sinks = nullptr;

  // Optional: state 1 in buffers of its own (num_states must be 2); the
  // state strides above are then unused.
  bool separate_b = false;
  const void* states_b = nullptr;
  const float* lse_b = nullptr;
  int64_t states_b_strides[3] = {};  // batch, row, head
  int64_t lse_b_strides[3] = {};     // batch, row, head

  // The names errors give the arguments (merge_state's are a, lse_a, b, lse_b).
  const char* states_name = "states";
  const char* lse_name = "lse";
  const char* states_b_name = "states_b";
  const char* lse_b_name = "lse_b";
};

// Throws Error(invalid_argument) naming the argument and the rule, or
// Error(unsupported) for sizes this build does not generate (more than
// kCombineMaxStates states, head_dim above kCombineMaxHeadDim).
CombinePlan plan_combine(const CombineProblem& problem);

// merge_states: states [num_states, rows, heads, head_dim] (f32/f16/bf16),
// lse f32 [num_states, rows, heads], out [rows, heads, head_dim]
// (f32/f16/bf16), out_lse optional f32 [rows, heads].
CombinePlan plan_merge_states(const TensorView& states, const TensorView& lse, const TensorView& out,
                              const TensorView* out_lse);

// merge_state: a, b [rows, heads, head_dim] (one dtype), lse_a, lse_b f32
// [rows, heads]; out and out_lse as plan_merge_states.
CombinePlan plan_merge_state(const TensorView& a, const TensorView& lse_a, const TensorView& b,
                             const TensorView& lse_b, const TensorView& out, const TensorView* out_lse);

}  // namespace jitattn::detail
