#include "merge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>

#include "argument_error.hpp"

namespace jitattn::detail {
namespace {

bool is_float_dtype(DType dtype) { return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16; }

int next_power_of_two(int64_t value) {
  int power = 1;
  while (power < value) power *= 2;
  return power;
}

// Whether the kernel can read or write a tensor in 16-byte vectors: a
// 16-byte aligned base, and every stride of a dimension longer than 1 a
// whole number of vectors. `strides`/`extents` list the dimensions above
// head_dim. Otherwise it takes the elementwise kernel (KernelSpec::elementwise).
bool vectors_fit(const void* data, DType dtype, const int64_t* strides, const int64_t* extents, int axes) {
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) return false;
  const int64_t vector = static_cast<int64_t>(16 / dtype_size(dtype));
  for (int axis = 0; axis < axes; ++axis) {
    if (extents[axis] > 1 && strides[axis] % vector != 0) return false;
  }
  return true;
}

// A tensor the kernel reads or writes (states, LSEs, outputs): its data
// (unless there is nothing to read), aligned to its element.
void check_elements(const char* name, const void* data, DType dtype, bool empty) {
  if (data == nullptr && !empty) reject(fmt::format("{}: data is null", name));
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) != 0) {
    reject(fmt::format("{}: data pointer must be {}-byte aligned ({})", name, dtype_size(dtype), dtype_name(dtype)));
  }
}

// The thread layout of CombineParams: enough chunk lanes to cover head_dim in
// 8-element chunks; enough state lanes that each lane has at most
// kCombineStatesInFlight states (all loaded in one batch, beside the LSE
// loads), up to a whole CTA per pair; then as many pairs per CTA as fit.
// pairs_per_block × num_states stays within the kernel's kCombineMaxStates
// weights: either one pair per CTA, or state_lanes × kCombineStatesInFlight
// >= num_states and pairs_per_block × state_lanes × chunk_lanes = kCombineThreads.
void choose_layout(CombineParams& p) {
  p.chunk_lanes = next_power_of_two((p.head_dim + 7) / 8);  // the last chunk may be partial (elementwise)
  const int batches = (p.num_states + kCombineStatesInFlight - 1) / kCombineStatesInFlight;
  p.state_lanes = std::min(next_power_of_two(batches), kCombineThreads / p.chunk_lanes);
  p.pairs_per_block = kCombineThreads / (p.chunk_lanes * p.state_lanes);
}

// The checks shared by merge_states and merge_state: out [rows, heads,
// head_dim] and the optional out_lse [rows, heads].
void check_outputs(const TensorView& out, const TensorView* out_lse, int64_t rows, int64_t heads, int64_t head_dim,
                   const char* shape_source) {
  if (out.ndim != 3) reject(fmt::format("out: must have 3 dimensions [rows, heads, head_dim], got {}", out.ndim));
  if (out.shape[0] != rows || out.shape[1] != heads || out.shape[2] != head_dim) {
    reject(fmt::format("out: shape {} must be [rows, heads, head_dim] = [{}, {}, {}] (from {})", shape_text(out), rows,
                       heads, head_dim, shape_source));
  }
  if (out.strides[2] != 1) {
    reject(fmt::format("out: head_dim stride is {}; the last dimension must be contiguous (stride 1)", out.strides[2]));
  }
  if (out_lse == nullptr) return;
  if (out_lse->dtype != DType::f32) reject(fmt::format("out_lse: dtype {} must be f32", dtype_name(out_lse->dtype)));
  if (out_lse->ndim != 2 || out_lse->shape[0] != rows || out_lse->shape[1] != heads) {
    reject(fmt::format("out_lse: shape {} must be [rows, heads] = [{}, {}]", shape_text(*out_lse), rows, heads));
  }
  // plan_combine reads a null out_lse as "not wanted"; a given tensor must have its data.
  if (out_lse->data == nullptr && rows * heads > 0) reject("out_lse: data is null");
}

// An lse input: f32 [leading..., rows, heads] of the given shape.
void check_lse_input(const char* name, const TensorView& lse, const TensorView& expected_from, const char* layout,
                     const char* source, int ndim) {
  if (lse.dtype != DType::f32) reject(fmt::format("{}: dtype {} must be f32", name, dtype_name(lse.dtype)));
  bool same = lse.ndim == ndim;
  for (int axis = 0; same && axis < ndim; ++axis) same = lse.shape[axis] == expected_from.shape[axis];
  if (!same) {
    std::string expected = "[";
    for (int axis = 0; axis < ndim; ++axis) expected += fmt::format("{}{}", axis ? ", " : "", expected_from.shape[axis]);
    expected += "]";
    reject(fmt::format("{}: shape {} must be {} = {} (from {})", name, shape_text(lse), layout, expected, source));
  }
}

void check_extents(const char* name, const TensorView& t, const char* const* axis_names) {
  for (int axis = 0; axis < t.ndim; ++axis) {
    if (t.shape[axis] < 0) reject(fmt::format("{}: {}={} is negative", name, axis_names[axis], t.shape[axis]));
    if (t.shape[axis] > INT_MAX) reject(fmt::format("{}: {}={} exceeds 2^31-1", name, axis_names[axis], t.shape[axis]));
  }
}

}  // namespace

CombinePlan plan_combine(const CombineProblem& problem) {
  const CombineProblem& q = problem;
  if (!is_float_dtype(q.state_dtype)) {
    reject(fmt::format("{}: dtype {} is not f32, f16 or bf16", q.states_name, dtype_name(q.state_dtype)));
  }
  if (!is_float_dtype(q.out_dtype)) reject(fmt::format("out: dtype {} is not f32, f16 or bf16", dtype_name(q.out_dtype)));
  if (q.num_states < 1) reject(fmt::format("{}: num_states={} must be at least 1", q.states_name, q.num_states));
  if (q.num_states > kCombineMaxStates) {
    throw Error(ErrorCode::unsupported, fmt::format("{}: num_states={} is above the most one merge supports, {}",
                                                    q.states_name, q.num_states, kCombineMaxStates));
  }
  if (q.head_dim < 1) reject(fmt::format("{}: head_dim={} must be positive", q.states_name, q.head_dim));
  if (q.head_dim > kCombineMaxHeadDim) {
    throw Error(ErrorCode::unsupported, fmt::format("{}: head_dim={} is above the largest supported, {}", q.states_name,
                                                    q.head_dim, kCombineMaxHeadDim));
  }
  const int64_t sizes[3] = {q.batch, q.seqlen, q.heads};
  const char* const size_names[3] = {"batch", "seqlen", "heads"};
  for (int i = 0; i < 3; ++i) {
    if (sizes[i] < 0 || sizes[i] > INT_MAX) {
      reject(fmt::format("{}: {}={} must be between 0 and 2^31-1", q.states_name, size_names[i], sizes[i]));
    }
  }
  const int64_t pairs = q.batch * q.seqlen * q.heads;
  if (pairs > INT_MAX) {
    reject(fmt::format("{}: batch × seqlen × heads = {} exceeds 2^31-1 (row, head) pairs", q.states_name, pairs));
  }
  const bool empty = pairs == 0;
  const bool split_b = q.separate_b;
  if (split_b && q.num_states != 2) {
    reject(fmt::format("{}: a separate second state needs num_states=2, got {}", q.states_b_name, q.num_states));
  }

  const int64_t state_extents[4] = {split_b ? 1 : q.num_states, q.batch, q.seqlen, q.heads};
  const int64_t row_extents[3] = {q.batch, q.seqlen, q.heads};
  check_elements(q.states_name, q.states, q.state_dtype, empty);
  check_elements(q.lse_name, q.lse, DType::f32, empty);
  check_elements("out", q.out, q.out_dtype, empty);
  if (q.out_lse != nullptr) check_elements("out_lse", q.out_lse, DType::f32, empty);
  if (split_b) {
    if (q.states_b == nullptr && !empty) reject(fmt::format("{}: data is null", q.states_b_name));
    if (q.lse_b == nullptr && !empty) reject(fmt::format("{}: data is null", q.lse_b_name));
    check_elements(q.states_b_name, q.states_b, q.state_dtype, empty);
    check_elements(q.lse_b_name, q.lse_b, DType::f32, empty);
  }
  // 16-byte vectors where every row allows them; element by element where
  // a head dim is not a multiple of 8 or a row starts between vectors.
  const bool vectors = q.head_dim % 8 == 0 &&
                       vectors_fit(q.states, q.state_dtype, q.states_strides, state_extents, 4) &&
                       vectors_fit(q.out, q.out_dtype, q.out_strides, row_extents, 3) &&
                       (!split_b || vectors_fit(q.states_b, q.state_dtype, q.states_b_strides, row_extents, 3));

  CombinePlan plan;
  plan.spec = KernelSpec::combine(q.state_dtype, q.out_dtype, /*elementwise=*/!vectors, q.dynamic_splits,
                                  /*sink=*/q.sinks != nullptr);
  plan.spec.validate();
  CombineParams& p = plan.params;
  p.states = q.states;
  p.lse = q.lse;
  p.out = q.out;
  p.out_lse = q.out_lse;
  p.states_b = split_b ? q.states_b : nullptr;
  p.lse_b = split_b ? q.lse_b : nullptr;
  p.states_state_stride = q.states_strides[0], p.states_batch_stride = q.states_strides[1];
  p.states_row_stride = q.states_strides[2], p.states_head_stride = q.states_strides[3];
  p.lse_state_stride = q.lse_strides[0], p.lse_batch_stride = q.lse_strides[1];
  p.lse_row_stride = q.lse_strides[2], p.lse_head_stride = q.lse_strides[3];
  p.out_batch_stride = q.out_strides[0], p.out_row_stride = q.out_strides[1], p.out_head_stride = q.out_strides[2];
  p.out_lse_batch_stride = q.out_lse_strides[0], p.out_lse_row_stride = q.out_lse_strides[1];
  p.out_lse_head_stride = q.out_lse_strides[2];
  p.states_b_batch_stride = q.states_b_strides[0], p.states_b_row_stride = q.states_b_strides[1];
  p.states_b_head_stride = q.states_b_strides[2];
  p.lse_b_batch_stride = q.lse_b_strides[0], p.lse_b_row_stride = q.lse_b_strides[1];
  p.lse_b_head_stride = q.lse_b_strides[2];
  p.rows_used = q.rows_used;
  p.sinks = q.sinks;
  p.num_states = static_cast<int>(q.num_states);
  p.batch = static_cast<int>(q.batch);
  p.seqlen = static_cast<int>(q.seqlen);
  p.heads = static_cast<int>(q.heads);
  p.head_dim = static_cast<int>(q.head_dim);
  p.pairs = static_cast<int>(pairs);
  choose_layout(p);
  plan.grid = static_cast<unsigned>((pairs + p.pairs_per_block - 1) / p.pairs_per_block);
  return plan;
}

CombinePlan plan_merge_states(const TensorView& given_states, const TensorView& lse, const TensorView& given_out,
                              const TensorView* out_lse) {
  // (A dimension of extent 1 then never keeps the 16-byte path from a state or out.)
  const TensorView states = settled_strides(given_states), out = settled_strides(given_out);
  static const char* const state_axes[4] = {"num_states", "rows", "heads", "head_dim"};
  if (states.ndim != 4) {
    reject(fmt::format("states: must have 4 dimensions [num_states, rows, heads, head_dim], got {}", states.ndim));
  }
  check_extents("states", states, state_axes);
  if (states.strides[3] != 1) {
    reject(fmt::format("states: head_dim stride is {}; the last dimension must be contiguous (stride 1)", states.strides[3]));
  }
  check_lse_input("lse", lse, states, "[num_states, rows, heads]", "states", 3);
  const int64_t rows = states.shape[1], heads = states.shape[2], head_dim = states.shape[3];
  check_outputs(out, out_lse, rows, heads, head_dim, "states");

  CombineProblem q;
  q.state_dtype = states.dtype;
  q.out_dtype = out.dtype;
  q.states = states.data;
  q.lse = static_cast<const float*>(lse.data);
  q.out = out.data;
  q.out_lse = out_lse != nullptr ? static_cast<float*>(out_lse->data) : nullptr;
  q.num_states = states.shape[0];
  q.batch = 1;  // rows are the seqlen level
  q.seqlen = rows;
  q.heads = heads;
  q.head_dim = head_dim;
  const int64_t states_strides[4] = {states.strides[0], 0, states.strides[1], states.strides[2]};
  const int64_t lse_strides[4] = {lse.strides[0], 0, lse.strides[1], lse.strides[2]};
  const int64_t out_strides[3] = {0, out.strides[0], out.strides[1]};
  std::copy(states_strides, states_strides + 4, q.states_strides);
  std::copy(lse_strides, lse_strides + 4, q.lse_strides);
  std::copy(out_strides, out_strides + 3, q.out_strides);
  if (out_lse != nullptr) {
    q.out_lse_strides[1] = out_lse->strides[0];
    q.out_lse_strides[2] = out_lse->strides[1];
  }
  return plan_combine(q);
}

CombinePlan plan_merge_state(const TensorView& given_a, const TensorView& lse_a, const TensorView& given_b,
                             const TensorView& lse_b, const TensorView& given_out, const TensorView* out_lse) {
  const TensorView a = settled_strides(given_a), b = settled_strides(given_b), out = settled_strides(given_out);
  static const char* const row_axes[3] = {"rows", "heads", "head_dim"};
  if (a.ndim != 3) reject(fmt::format("a: must have 3 dimensions [rows, heads, head_dim], got {}", a.ndim));
  check_extents("a", a, row_axes);
  if (b.ndim != 3 || b.shape[0] != a.shape[0] || b.shape[1] != a.shape[1] || b.shape[2] != a.shape[2]) {
    reject(fmt::format("b: shape {} must equal a's shape {}", shape_text(b), shape_text(a)));
  }
  if (b.dtype != a.dtype) {
    reject(fmt::format("b: dtype {} must equal a's dtype {}", dtype_name(b.dtype), dtype_name(a.dtype)));
  }
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"a", &a}, {"b", &b}}) {
    if (t->strides[2] != 1) {
      reject(fmt::format("{}: head_dim stride is {}; the last dimension must be contiguous (stride 1)", name, t->strides[2]));
    }
  }
  check_lse_input("lse_a", lse_a, a, "[rows, heads]", "a", 2);
  check_lse_input("lse_b", lse_b, a, "[rows, heads]", "a", 2);
  const int64_t rows = a.shape[0], heads = a.shape[1], head_dim = a.shape[2];
  check_outputs(out, out_lse, rows, heads, head_dim, "a");

  CombineProblem q;
  q.states_name = "a";
  q.lse_name = "lse_a";
  q.states_b_name = "b";
  q.lse_b_name = "lse_b";
  q.state_dtype = a.dtype;
  q.out_dtype = out.dtype;
  q.states = a.data;
  q.lse = static_cast<const float*>(lse_a.data);
  q.separate_b = true;
  q.states_b = b.data;
  q.lse_b = static_cast<const float*>(lse_b.data);
  q.out = out.data;
  q.out_lse = out_lse != nullptr ? static_cast<float*>(out_lse->data) : nullptr;
  q.num_states = 2;
  q.batch = 1;
  q.seqlen = rows;
  q.heads = heads;
  q.head_dim = head_dim;
  q.states_strides[2] = a.strides[0], q.states_strides[3] = a.strides[1];
  q.lse_strides[2] = lse_a.strides[0], q.lse_strides[3] = lse_a.strides[1];
  q.states_b_strides[1] = b.strides[0], q.states_b_strides[2] = b.strides[1];
  q.lse_b_strides[1] = lse_b.strides[0], q.lse_b_strides[2] = lse_b.strides[1];
  q.out_strides[1] = out.strides[0], q.out_strides[2] = out.strides[1];
  if (out_lse != nullptr) {
    q.out_lse_strides[1] = out_lse->strides[0];
    q.out_lse_strides[2] = out_lse->strides[1];
  }
  return plan_combine(q);
}

}  // namespace jitattn::detail
