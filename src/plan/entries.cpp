// The entry points: each call's tensors validated into a Problem (dense,
// varlen with packed or paged keys, KV cache), then planned (forward.cpp),
// with a workspace and its combine where the call may split (splits.cpp).
#include "plan/internal.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>

namespace jitattn::detail {
namespace {

void copy_strides(const TensorView& t, int64_t (&strides)[3]) {
  if (t.ndim == 4) {
    strides[0] = t.strides[0], strides[1] = t.strides[1], strides[2] = t.strides[2];
  } else {
    strides[0] = 0, strides[1] = t.strides[0], strides[2] = t.strides[1];
  }
}

Problem problem_of(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out) {
  Problem p;
  p.dtype = q.dtype;
  p.heads_q = q.shape[q.ndim - 2];
  p.heads_kv = k.shape[k.ndim - 2];
  p.head_dim = q.shape[q.ndim - 1];
  p.head_dim_v = v.shape[v.ndim - 1];
  p.q = q.data, p.k = k.data, p.v = v.data, p.out = out.data;
  copy_strides(q, p.q_strides);
  copy_strides(k, p.k_strides);
  copy_strides(v, p.v_strides);
  copy_strides(out, p.out_strides);
  p.kv_batches = k.ndim == 4 ? k.shape[0] : 0;
  p.kv_rows = k.ndim == 4 ? k.shape[1] : k.shape[0];
  return p;
}

// A dense call's tensors (their strides settled), validated.
Problem dense_problem(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const TensorView* lse, int sm_count) {
  check_rows("q", q, Rows::dense, true);
  check_rows("k", k, Rows::dense, true);
  check_rows("v", v, Rows::dense, true);
  check_rows("out", out, Rows::dense, true);
  check_matching(q, k, v, out, /*value_dim_of_its_own=*/true);
  if (k.shape[0] != q.shape[0]) reject(fmt::format("k: batch={} must equal q's batch={}", k.shape[0], q.shape[0]));
  Problem problem = problem_of(q, k, v, out);
  problem.batch = q.shape[0];
  problem.seqlen_q = problem.queries_bound = q.shape[1];
  problem.seqlen_k = problem.keys_bound = k.shape[1];
  if (lse != nullptr) {
    check_lse(*lse, problem.batch, problem.heads_q, problem.seqlen_q);
    problem.lse = static_cast<float*>(lse->data);
    for (int i = 0; i < 3; ++i) problem.lse_strides[i] = lse->strides[i];
  }
  problem.sm_count = sm_count;
  return problem;
}

// A paged cache: `table` (i32 [batch, max_pages]) and the page size (dimension
// 1 of k_cache, a power of two) into `problem`. Returns the capacity of one
// sequence (page_size × max_pages).
int64_t use_block_table(Problem& problem, const TensorView& table, const TensorView& k_cache, const char* k_name) {
  const int64_t batch = problem.batch;
  if (table.dtype != DType::i32 || table.ndim != 2 || table.shape[0] != batch || table.shape[1] < 1) {
    reject(fmt::format("block_table: must be i32 [batch, max_pages] = [{}, >= 1], got {} {}", batch,
                       dtype_name(table.dtype), shape_text(table)));
  }
  if (table.shape[1] > 1 && table.strides[1] != 1) {
    reject("block_table: the pages dimension must be contiguous (stride 1)");
  }
  // (The table of a batch of none is empty and need not point anywhere.)
  if ((table.data == nullptr && batch > 0) || reinterpret_cast<uintptr_t>(table.data) % 4 != 0) {
    reject("block_table: data pointer must be non-null and 4-byte aligned");
  }
  const int64_t page_size = k_cache.shape[1];
  if (page_size < 1 || (page_size & (page_size - 1)) != 0) {
    reject(fmt::format("{}: page_size={} (dimension 1 of a paged cache) must be a power of two", k_name, page_size));
  }
  problem.kvcache = true;
  problem.paged = true;
  problem.block_table = static_cast<const int*>(table.data);
  problem.block_table_stride = table.strides[0];
  while ((int64_t{1} << problem.page_shift) < page_size) ++problem.page_shift;
  // (Keys are i32 cache rows: cache_seqlens, the kernels' positions.)
  const int64_t capacity = page_size * table.shape[1];
  if (capacity > INT_MAX) {
    reject(fmt::format("block_table: page_size × max_pages = {} × {} = {} rows exceeds 2^31-1 (cache_seqlens are i32)",
                       page_size, table.shape[1], capacity));
  }
  return capacity;
}

// A caller's sum of its sequences' keys (KVCacheArgs and VarlenArgs
// total_seqlen_k): 0, or between the longest (problem.seqlen_k) and batch
// times that.
void use_total_seqlen_k(Problem& problem, const char* name, int64_t total) {
  if (total != 0 && (total < problem.seqlen_k || total > problem.batch * problem.seqlen_k)) {
    reject(fmt::format("{}={} must be 0 (unknown) or between the longest sequence's keys ({}: max_seqlen_k, or "
                       "without it the most a sequence can have) and batch × that ({})",
                       name, total, problem.seqlen_k, problem.batch * problem.seqlen_k));
  }
  problem.total_seqlen_k = total;
}

// A varlen call's tensors and offsets, validated: q/out [total_q, heads_q,
// head_dim], lse [heads_q, total_q]; k/v packed [total_k, heads_kv,
// head_dim], or with a block table paged [num_pages, page_size, heads_kv,
// head_dim].
Problem varlen_problem(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView* lse, const VarlenArgs& varlen, const ForwardOptions& options, int sm_count) {
  const bool paged = varlen.block_table != nullptr;
  check_rows("q", q, Rows::packed_queries, !paged);
  check_rows("k", k, paged ? Rows::pages : Rows::packed_keys, !paged);
  check_rows("v", v, paged ? Rows::pages : Rows::packed_keys, !paged);
  check_rows("out", out, Rows::packed_queries, !paged);
  check_matching(q, k, v, out, /*value_dim_of_its_own=*/!paged);
  const int64_t batch = varlen.cu_seqlens_q.ndim == 1 ? varlen.cu_seqlens_q.shape[0] - 1 : -1;
  if (batch < 0) reject("cu_seqlens_q: shape must be [batch + 1] (at least one element)");
  check_i32_vector("cu_seqlens_q", varlen.cu_seqlens_q, batch + 1, "batch + 1");
  // Over a paged cache with seqused_k nothing reads cu_seqlens_k (the
  // keys are the pages' first seqused_k[b] rows), so it may be left empty,
  // as FlashAttention-3 and vLLM allow.
  const TensorView& cu_k = varlen.cu_seqlens_k;
  const bool cu_k_given = cu_k.data != nullptr || cu_k.ndim != 0;
  if (cu_k_given) {
    check_i32_vector("cu_seqlens_k", cu_k, batch + 1, "batch + 1");
  } else if (!paged || varlen.seqused_k == nullptr) {
    reject("cu_seqlens_k: required unless both block_table and seqused_k are given (packed keys start at "
           "cu_seqlens_k[b]; a paged sequence's keys are counted by seqused_k[b], else by cu_seqlens_k)");
  }
  if (varlen.seqused_k != nullptr) check_i32_vector("seqused_k", *varlen.seqused_k, batch, "batch");
  const int64_t total_q = q.shape[0];
  if (varlen.max_seqlen_q < 0 || (varlen.max_seqlen_q == 0 && total_q > 0 && batch > 0)) {
    reject(fmt::format("varlen: max_seqlen_q={} must be at least 1 (0 only when there are no queries)",
                       varlen.max_seqlen_q));
  }
  Problem problem = problem_of(q, k, v, out);
  problem.batch = batch;
  problem.total_q = total_q;
  int64_t capacity = k.shape[0];
  if (paged) {
    capacity = use_block_table(problem, *varlen.block_table, k, "k");
    // The cache holds keys as they are; positions would need each
    // sequence's start in the cache, which varlen offsets do not give.
    if (options.rope.style != RopeStyle::none) {
      reject("options.rope: not supported over a paged cache in forward_varlen (rotate keys as they are written, "
             "e.g. forward_kvcache's k_new, and q before the call)");
    }
  }
  if (varlen.max_seqlen_k < 0) reject(fmt::format("varlen: max_seqlen_k={} must be at least 0", varlen.max_seqlen_k));
  // Hints above what the tensors hold (FlashAttention takes over-estimates)
  // are the tensors' bounds: no sequence is longer than all the queries, or
  // than the keys (packed) or the block table's pages.
  problem.seqlen_q = std::min<int64_t>(varlen.max_seqlen_q, total_q);
  problem.seqlen_k = std::min<int64_t>(varlen.max_seqlen_k, capacity);
  problem.queries_bound = total_q;
  problem.keys_bound = capacity;
  problem.seqlen_k_hinted = varlen.max_seqlen_k > 0;
  use_total_seqlen_k(problem, "varlen: total_seqlen_k", varlen.total_seqlen_k);
  problem.dynamic_splits = varlen.dynamic_splits;
  if (varlen.total_seqlen_k == 0 && !paged && varlen.seqused_k == nullptr) {
    // Packed keys: k's rows bound the sum (rows past cu_seqlens_k[batch]
    // only make the batch look more even than it is).
    problem.total_seqlen_k = std::min(capacity, batch * problem.seqlen_k);
  }
  problem.cu_seqlens_q = static_cast<const int*>(varlen.cu_seqlens_q.data);
  problem.cu_seqlens_k = cu_k_given ? static_cast<const int*>(cu_k.data) : nullptr;
  problem.seqused_k = varlen.seqused_k != nullptr ? static_cast<const int*>(varlen.seqused_k->data) : nullptr;
  if (lse != nullptr) {
    if (lse->dtype != DType::f32) reject(fmt::format("lse: dtype {} must be f32", dtype_name(lse->dtype)));
    if (lse->ndim != 2 || lse->shape[0] != problem.heads_q || lse->shape[1] != total_q) {
      reject(fmt::format("lse: shape {} must be [heads_q, total_q] = [{}, {}]", shape_text(*lse), problem.heads_q, total_q));
    }
    check_lse_alignment(*lse, problem.heads_q * total_q);
    problem.lse = static_cast<float*>(lse->data);
    problem.lse_strides[1] = lse->strides[0];
    problem.lse_strides[2] = lse->strides[1];
  }
  problem.sm_count = sm_count;
  return problem;
}

}  // namespace

ForwardPlan plan_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const TensorView* lse, const ForwardOptions& options,
                         const Arch& arch, int max_smem_bytes, int sm_count, const TuningTable* tuning) {
  check_unsplit(options, "forward", "forward_workspace_bytes");
  const Problem problem = dense_problem(settled_strides(q), settled_strides(k), settled_strides(v),
                                        settled_strides(out), lse, sm_count);
  return plan_problem(problem, options, arch, max_smem_bytes, tuning, false);
}

SplitForwardPlan plan_forward_split(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const TensorView* lse, const ForwardOptions& options,
                                    void* workspace, size_t workspace_bytes, bool sizing_only, const Arch& arch,
                                    int max_smem_bytes, int sm_count, const TuningTable* tuning) {
  const TensorView settled_out = settled_strides(out);
  const Problem problem =
      dense_problem(settled_strides(q), settled_strides(k), settled_strides(v), settled_out, lse, sm_count);
  return plan_with_workspace(problem, settled_out, lse, options, workspace, workspace_bytes, sizing_only, arch,
                             max_smem_bytes, tuning, false);
}

ForwardPlan plan_forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                const TensorView* lse, const VarlenArgs& varlen, const ForwardOptions& options,
                                const Arch& arch, int max_smem_bytes, int sm_count, const TuningTable* tuning) {
  const Problem problem = varlen_problem(settled_strides(q), settled_strides(k), settled_strides(v),
                                         settled_strides(out), lse, varlen, options, sm_count);
  check_unsplit(options, "forward_varlen", "forward_varlen_workspace_bytes");
  return plan_problem(problem, options, arch, max_smem_bytes, tuning, true);
}

SplitForwardPlan plan_forward_varlen_split(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const TensorView& out, const TensorView* lse, const VarlenArgs& varlen,
                                           const ForwardOptions& options, void* workspace, size_t workspace_bytes,
                                           bool sizing_only, const Arch& arch, int max_smem_bytes, int sm_count,
                                           const TuningTable* tuning) {
  const TensorView settled_out = settled_strides(out);
  const Problem problem = varlen_problem(settled_strides(q), settled_strides(k), settled_strides(v), settled_out, lse,
                                         varlen, options, sm_count);
  return plan_with_workspace(problem, settled_out, lse, options, workspace, workspace_bytes, sizing_only, arch,
                             max_smem_bytes, tuning, true);
}

namespace {

// A forward_kvcache call's arguments with their tensors' strides settled
// (settled_strides); args' k_new and v_new point into it.
struct SettledKVCacheArgs {
  KVCacheArgs args;
  TensorView k_new, v_new;

  explicit SettledKVCacheArgs(const KVCacheArgs& given) : args(given) {
    args.k_cache = settled_strides(given.k_cache);
    args.v_cache = settled_strides(given.v_cache);
    if (given.k_new != nullptr) k_new = settled_strides(*given.k_new), args.k_new = &k_new;
    if (given.v_new != nullptr) v_new = settled_strides(*given.v_new), args.v_new = &v_new;
  }
  SettledKVCacheArgs(const SettledKVCacheArgs&) = delete;
  SettledKVCacheArgs& operator=(const SettledKVCacheArgs&) = delete;
};

// The attention launch of plan_kvcache (tensors settled).
ForwardPlan plan_attention_over_cache(const TensorView& q, const KVCacheArgs& args, const TensorView& out,
                                      const TensorView* lse, const ForwardOptions& options, void* workspace,
                                      size_t workspace_bytes, bool sizing_only, const Arch& arch,
                                      int max_smem_bytes, int sm_count, const TuningTable* tuning) {
  const TensorView& k_cache = args.k_cache;
  const Rows cache_rows = args.block_table != nullptr ? Rows::pages : Rows::dense;
  check_rows("q", q, Rows::dense);
  check_rows("k_cache", k_cache, cache_rows);
  check_rows("v_cache", args.v_cache, cache_rows);
  check_rows("out", out, Rows::dense);
  check_matching(q, k_cache, args.v_cache, out);
  const int64_t batch = q.shape[0], seqlen_q = q.shape[1];
  check_i32_vector("cache_seqlens", args.cache_seqlens, batch, "batch");
  Problem problem = problem_of(q, k_cache, args.v_cache, out);
  problem.batch = batch;
  problem.seqlen_q = seqlen_q;
  problem.kvcache = true;
  problem.seqused_k = static_cast<const int*>(args.cache_seqlens.data);
  int64_t capacity = k_cache.shape[1];
  if (args.block_table != nullptr) {
    if (args.cache_batch_idx != nullptr) reject("cache_batch_idx: not supported with a paged cache (use block_table)");
    capacity = use_block_table(problem, *args.block_table, k_cache, "k_cache");
  } else if (args.cache_batch_idx != nullptr) {
    check_i32_vector("cache_batch_idx", *args.cache_batch_idx, batch, "batch");
    problem.kv_batch_index = static_cast<const int*>(args.cache_batch_idx->data);
  } else if (k_cache.shape[0] != batch) {
    reject(fmt::format("k_cache: batch={} must equal q's batch={} (or pass cache_batch_idx)", k_cache.shape[0], batch));
  }
  if (args.cache_leftpad != nullptr) {
    // As FlashAttention, which takes no paged cache with cache_leftpad either.
    if (args.block_table != nullptr) {
      reject("cache_leftpad: not supported with a paged cache (block_table): a sequence's pages can start where its "
             "keys do");
    }
    check_i32_vector("cache_leftpad", *args.cache_leftpad, batch, "batch");
    problem.kv_row_offset = static_cast<const int*>(args.cache_leftpad->data);
  }
  if ((args.k_new == nullptr) != (args.v_new == nullptr)) reject("k_new, v_new: give both or neither");
  if (args.k_new != nullptr) {
    check_rows("k_new", *args.k_new, Rows::dense);
    check_rows("v_new", *args.v_new, Rows::dense);
    const TensorView& k_new = *args.k_new;
    if (k_new.dtype != q.dtype || args.v_new->dtype != q.dtype) reject("k_new, v_new: dtype must match q's");
    for (int axis = 0; axis < 4; ++axis) {
      if (args.v_new->shape[axis] != k_new.shape[axis]) {
        reject(fmt::format("v_new: shape {} must equal k_new's shape {}", shape_text(*args.v_new), shape_text(k_new)));
      }
    }
    if (k_new.shape[0] != batch || k_new.shape[2] != k_cache.shape[2] || k_new.shape[3] != k_cache.shape[3]) {
      reject(fmt::format("k_new: shape {} must be [batch, seqlen_new, heads_kv, head_dim] = [{}, *, {}, {}]",
                         shape_text(k_new), batch, k_cache.shape[2], k_cache.shape[3]));
    }
    // Written at rows cache_seqlens[b] onwards: more than the cache holds
    // would land past it (or through block-table entries past its row).
    if (k_new.shape[1] > capacity) {
      reject(fmt::format("k_new: seqlen_new={} must be at most the cache's capacity {} ({})", k_new.shape[1], capacity,
                         args.block_table != nullptr ? "page_size × max_pages" : "k_cache's seqlen"));
    }
    problem.seqlen_k_added = static_cast<int>(k_new.shape[1]);
  }
  if (args.max_seqlen_k < 0 || args.max_seqlen_k > capacity) {
    reject(fmt::format("max_seqlen_k={} must be between 0 (= the cache capacity) and the capacity {}", args.max_seqlen_k,
                       capacity));
  }
  if (args.max_seqlen_k > 0 && args.max_seqlen_k < problem.seqlen_k_added) {
    reject(fmt::format("max_seqlen_k={} must be at least seqlen_new={}: every sequence holds its new keys",
                       args.max_seqlen_k, problem.seqlen_k_added));
  }
  problem.seqlen_k = args.max_seqlen_k > 0 ? args.max_seqlen_k : capacity;
  problem.queries_bound = seqlen_q;
  problem.keys_bound = capacity;
  problem.seqlen_k_hinted = args.max_seqlen_k > 0;
  use_total_seqlen_k(problem, "total_seqlen_k", args.total_seqlen_k);
  problem.dynamic_splits = args.dynamic_splits;
  check_num_splits("num_splits", args.num_splits);
  if (options.num_splits != 0) {
    reject(fmt::format("options.num_splits={}: forward_kvcache takes its split count from KVCacheArgs::num_splits",
                       options.num_splits));
  }
  if (options.rope.q_offsets != nullptr || options.rope.k_offsets != nullptr) {
    reject("options.rope: q_offsets and k_offsets do not apply to forward_kvcache (positions come from cache_seqlens)");
  }
  problem.num_splits = args.num_splits;
  problem.may_split = true;
  problem.sm_count = sm_count;
  problem.workspace = workspace;
  problem.workspace_bytes = workspace_bytes;
  problem.sizing_only = sizing_only;
  if (lse != nullptr) {
    check_lse(*lse, batch, problem.heads_q, seqlen_q);
    problem.lse = static_cast<float*>(lse->data);
    for (int i = 0; i < 3; ++i) problem.lse_strides[i] = lse->strides[i];
  }
  return plan_problem(problem, options, arch, max_smem_bytes, tuning, false);
}

}  // namespace

KVCachePlan plan_kvcache(const TensorView& given_q, const KVCacheArgs& given_args, const TensorView& given_out,
                         const TensorView* lse, const ForwardOptions& options, void* workspace, size_t workspace_bytes,
                         bool sizing_only, const Arch& arch, int max_smem_bytes, int sm_count,
                         const TuningTable* tuning) {
  const TensorView q = settled_strides(given_q), out = settled_strides(given_out);
  const SettledKVCacheArgs settled(given_args);
  const KVCacheArgs& args = settled.args;
  KVCachePlan plan;
  plan.attention = plan_attention_over_cache(q, args, out, lse, options, workspace, workspace_bytes, sizing_only, arch,
                                             max_smem_bytes, sm_count, tuning);
  const FwdParams& fwd = plan.attention.params;
  const KernelSpec& spec = plan.attention.spec;
  if (args.k_new != nullptr && args.k_new->shape[1] > 0 && q.shape[0] > 0) {
    AppendPlan& append = plan.append;
    append.spec = KernelSpec::append(q.dtype, spec.rope, spec.rotary_dim, spec.rope_tables, spec.rope_tables16,
                                     spec.paged, spec.rope_scaled);
    AppendParams& p = append.params;
    p.k_new = args.k_new->data;
    p.v_new = args.v_new->data;
    p.k_cache = args.k_cache.data;
    p.v_cache = args.v_cache.data;
    for (int i = 0; i < 3; ++i) {
      p.k_new_strides[i] = args.k_new->strides[i];
      p.v_new_strides[i] = args.v_new->strides[i];
      p.k_cache_strides[i] = args.k_cache.strides[i];
      p.v_cache_strides[i] = args.v_cache.strides[i];
    }
    p.cache_seqlens = fwd.seqused_k;
    p.kv_batch_index = fwd.kv_batch_index;
    p.block_table = fwd.block_table;
    p.block_table_stride = fwd.block_table_stride;
    p.page_shift = fwd.page_shift;
    p.batch = fwd.batch;
    p.seqlen_new = static_cast<int>(args.k_new->shape[1]);
    p.heads_kv = fwd.heads_kv;
    p.head_dim = fwd.head_dim;
    std::copy(std::begin(fwd.rope_inv_freq), std::end(fwd.rope_inv_freq), p.rope_inv_freq);
    p.rope_cos = fwd.rope_cos;
    p.rope_sin = fwd.rope_sin;
    p.rope_table_stride = fwd.rope_table_stride;
    p.rope_table_rows = fwd.rope_table_rows;
    p.rope_attention_factor = fwd.rope_attention_factor;
    const int64_t rows = static_cast<int64_t>(p.batch) * p.seqlen_new * p.heads_kv;
    if ((rows + 3) / 4 > INT_MAX) reject("k_new: batch × seqlen_new × heads_kv is too large");
    append.grid = static_cast<unsigned>((rows + 3) / 4);  // four rows (warps) per CTA
  }
  if (spec.split && !sizing_only) plan.combine = combine_splits(plan.attention, out, lse);
  return plan;
}

}  // namespace jitattn::detail
