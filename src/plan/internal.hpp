// The plan stage's own declarations, shared by its files (src/plan/):
//   checks.cpp   tensor and option checks that name the argument and the rule
//   entries.cpp  each entry point's tensors into a Problem, and the plan_* calls
//   forward.cpp  plan_problem: options → kernel spec → launch parameters
//   tiles.cpp    the kernel family and tiles (defaults, decode, wgmma, persistent)
//   splits.cpp   split-KV: the heuristic, the workspace and the combine
// Everything else includes plan.hpp only.
#pragma once

#include "argument_error.hpp"
#include "plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

namespace jitattn::detail {

// ---- checks.cpp ----------------------------------------------------------

// The generated head dim that serves `head_dim` (the next one up).
int kernel_head_dim(int64_t head_dim);
// f32 [heads_q] or [batch, heads_q]; returns the batch stride (0 per head).
long long check_alibi(const TensorView& slopes, int64_t batch, int64_t heads);
void check_learnable_sink(const TensorView& sink, int64_t heads);
// How a tensor of rows is laid out: the dimensions its messages name.
enum class Rows {
  dense,           // [batch, seqlen, heads, head_dim]
  packed_queries,  // [total_q, heads, head_dim] (varlen q, out)
  packed_keys,     // [total_k, heads, head_dim] (varlen k, v)
  pages,           // [num_pages, page_size, heads, head_dim] (a paged cache)
};
// A 16-bit tensor of rows (see checks.cpp).
void check_rows(const char* name, const TensorView& t, Rows layout, bool any_head_dim = false);
// An i32 vector in device memory of `length` elements (cu_seqlens, seqused_k).
void check_i32_vector(const char* name, const TensorView& t, int64_t length, const char* meaning);
void check_lse_alignment(const TensorView& lse, int64_t elements);
void check_lse(const TensorView& lse, int64_t batch, int64_t heads, int64_t seqlen_q);
// RoPE options that need no tensor shapes beyond head_dim; returns rotary_dim.
int check_rope_scalars(const RopeOptions& rope, int64_t head_dim);
// The factor cos and sin from the frequencies are scaled by: YaRN's or
// LongRoPE's attention factor, else 1 (and 1 with tables, which are used as given).
float rope_attention_factor(const RopeOptions& rope);
// The cos/sin tables: f32 [positions, >= rotary_dim / 2], equal shapes and strides.
void check_rope_tables(const RopeOptions& rope, int rotary_dim, DType q_dtype);
// dtypes, head dims, shapes of k/v and out, and the GQA ratio agree. With
// `value_dim_of_its_own` (forward and forward_varlen over K/V tensors) v's
// head dim may differ from q's and k's, and out's follows v's.
void check_matching(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    bool value_dim_of_its_own = false);
// V's head dim where it differs from q's (FlashAttention 3's hdim_v): the
// value dim the kernel takes (KernelSpec::head_dim_v), after its rules.
int check_value_dim(int64_t head_dim, int64_t head_dim_v);

// ---- constants shared by the steps ----------------------------------------

// CTAs per SM assumed for decoding tiles (128 threads of 130-190 registers
// and 48-80 KB of shared memory: two or three per SM).
constexpr int kDecodeCtasPerSm = 3;
constexpr int kMaxSplits = 128;
// Shared memory the driver reserves for each resident CTA. An SM holds the
// per-block opt-in limit plus this much: sm_80 163 + 1 KB, sm_86/89/120
// 99 + 1, sm_90/100 227 + 1 (CUDA C++ Programming Guide, compute
// capabilities table).
constexpr size_t kSmemReservedPerCta = 1024;
// The CTAs of `smem_bytes` dynamic shared memory each that an SM holds at
// once on a GPU whose blocks may opt in to max_smem_bytes (at least one).
inline int64_t ctas_per_sm_by_smem(size_t smem_bytes, int max_smem_bytes) {
  const size_t smem_per_sm = static_cast<size_t>(std::max(0, max_smem_bytes)) + kSmemReservedPerCta;
  return std::max<int64_t>(1, static_cast<int64_t>(smem_per_sm / (smem_bytes + kSmemReservedPerCta)));
}
// Splits of the decode kernel are counted in blocks of at least this many
// keys: splits of one 64-key step (16-key chunks above head dim 128, pages
// of 16) took 1.08x the time of splits of two (head dim 256, one sequence of
// 1024 keys: 16 splits 0.73 TB/s, 8 splits 0.79; H200, docs/PERFORMANCE.md).
constexpr int kMinSplitKeys = 128;
// Decoding grids of more than one wave of CTAs and under 80% of two
// (partial_wave_splits) split only into pieces of at least this many keys:
// one token, 32/8 heads at head dim 128, batch 20 (160 CTAs on 132 SMs), 3
// splits of 4096 keys ran 13% faster than none, of 1024 keys 9% slower;
// batch 24, 2 splits of 1024 keys 12% slower (H200, docs/PERFORMANCE.md).
constexpr int64_t kPartialWaveMinSplitKeys = 1024;
// Decoding batches of uneven lengths (KVCacheArgs and VarlenArgs
// total_seqlen_k): a batch whose longest sequence is more than kUnevenRatio
// times the mean splits its keys so that the longest sequence's pieces fill
// about half the SMs, in pieces of about kUnevenPieceKeys keys or more
// (uneven_splits). One wave of tiles ends with its
// longest tile, which then streams alone at a fraction of the bandwidth:
// 16 x 8 tiles of one 32k-key sequence and fifteen of 1k ran at 0.75 TB/s
// unsplit, 3.15 in 8 splits; 2k-key pieces were slower than 4k ones at 32k
// keys and faster than 4k ones at 8k (H200, docs/PERFORMANCE.md).
constexpr double kUnevenRatio = 1.25;
constexpr int kUnevenPieceKeys = 2048;

// ---- the call as the steps see it ------------------------------------------

// The call after its tensors are validated: sizes, pointers and strides as
// the kernel reads them. Dense, varlen and KV-cache calls meet here.
struct Problem {
  DType dtype = DType::bf16;
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  int64_t head_dim_v = 0;  // v's and out's head dim (head_dim unless the call gives V its own)
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  // batch (0 for varlen), row, head strides in elements.
  int64_t q_strides[3] = {}, k_strides[3] = {}, v_strides[3] = {}, out_strides[3] = {};
  // K's and V's extents as tensors: batches (0 for packed varlen rows) and
  // rows (seqlen_k, or the packed total).
  int64_t kv_batches = 0, kv_rows = 0;
  int64_t lse_strides[3] = {};  // batch, head, row
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;  // null over pages with seqused_k
  const int* seqused_k = nullptr;
  int64_t total_q = 0;  // varlen: the packed query rows
  // The most query rows and keys any sequence can have, whatever a hint says
  // (seqlen_q and seqlen_k; the packed rows; a cache's capacity): unbounded
  // window sides reach past both ends of every sequence by their sum.
  int64_t queries_bound = 0, keys_bound = 0;
  // KV cache (forward_kvcache): seqused_k is cache_seqlens; seqlen_k above is
  // the longest sequence (hint or capacity).
  bool kvcache = false;
  bool paged = false;
  int seqlen_k_added = 0;
  const int* kv_batch_index = nullptr;
  const int* kv_row_offset = nullptr;  // cache_leftpad
  const int* block_table = nullptr;
  int64_t block_table_stride = 0;
  int page_shift = 0;
  int num_splits = 0;  // requested; 0 = heuristic
  // KV cache and varlen: the sum of the sequences' keys, if known (0 if
  // not); with seqlen_k from a max_seqlen_k hint it tells uneven batches.
  int64_t total_seqlen_k = 0;
  bool seqlen_k_hinted = false;
  // KV cache and varlen: decode splits chosen on the device from the lengths.
  bool dynamic_splits = false;
  int sm_count = 0;
  // Split-KV needs the caller's workspace: KV-cache calls always take one;
  // dense and varlen calls only through the workspace overloads.
  bool may_split = false;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool sizing_only = false;  // *_workspace_bytes: no workspace yet
};

// What the options decide before any kernel is chosen (forward.cpp,
// check_options): validated scalars and the mask kind.
struct CallFacts {
  int kernel_dim = 0;  // the generated head dim
  int value_dim = 0;   // KernelSpec::head_dim_v: V's own head dim, or 0 when it is q's
  bool unaligned = false;  // head_dim not a multiple of 8
  float scale = 0.f;
  long long alibi_batch_stride = 0;
  bool has_rope = false;
  int rotary_dim = 0;
  float rope_attention_factor = 1.f;  // KernelSpec::rope_scaled where it is not 1
  // The mask: causal is a window with right bound 0; a window that bounds
  // nothing is no mask. left/right: -1 unbounded.
  int left = -1, right = -1;
  int chunk = 0;  // attention_chunk (0: off); a local mask
  bool causal = false, local = false;
  bool masked_like_causal = false;  // tuned like causal masks (both skip key blocks)
  // Local masks: the most keys a query sees (the window's left + right + 1,
  // or the chunk, whichever is smaller); 0 when unbounded.
  int64_t window_span = 0;
  int64_t group = 1;                // query heads per KV head
  // The caller fixed block sizes or warps: the planner leaves them alone.
  bool tiles_forced = false;
};

// A sequence's rows as the kernels tile them: every query of each head of a
// KV head's group when packed (the decode kernel always packs).
inline int64_t packed_rows(const Problem& problem, const KernelSpec& spec) {
  return spec.pack_gqa ? problem.seqlen_q * (problem.heads_q / problem.heads_kv) : problem.seqlen_q;
}

// ---- the steps --------------------------------------------------------------

// forward.cpp: the whole plan of one attention launch.
ForwardPlan plan_problem(const Problem& problem, const ForwardOptions& options, const Arch& arch, int max_smem_bytes,
                         const TuningTable* tuning, bool varlen);

// What choose_kernel decided besides the spec, for the later steps.
struct KernelChoice {
  // Resident decode CTAs (64, 48 or 32 KB pipelines), chosen so that every
  // tile runs at once (tiles.cpp, decode_grid_resident): plan_splits leaves
  // the grid unsplit unless the caller forces splits.
  bool resident_decode = false;
};

// tiles.cpp: the spec's family and tiles for the call, its feature flags
// included; validated, fitted into shared memory.
KernelChoice choose_kernel(KernelSpec& spec, const Problem& problem, const ForwardOptions& options,
                           const CallFacts& facts, const Arch& arch, int max_smem_bytes, const TuningTable* tuning,
                           bool varlen);
// The tensor maps of K and V rows for blocks of `block_kv` keys (a page
// where pages are shorter) in stages laid out as `layout` says, if maps can
// describe them: the 5-D paged forms where panels interleave, or one map of
// both where K and V do (k's, with v's of rank 0).
struct KVMaps {
  TileMapLayout k, v;
};
std::optional<KVMaps> kv_maps_of(const Problem& problem, int block_kv, KernelSpec::KVStages layout);
// One of them (`values`: V's) where they are separate maps.
std::optional<TileMapLayout> kv_map_of(const Problem& problem, const void* data, const int64_t (&strides)[3],
                                       int block_kv, bool values, bool interleaved_panels);

// splits.cpp
void check_num_splits(const char* name, int num_splits);
// A call without a workspace never splits: options.num_splits 0 or 1.
void check_unsplit(const ForwardOptions& options, const char* entry, const char* workspace_query);
// Split-KV over the keys where the tiles alone leave the GPU underused (or
// the caller asks): the split fields of the plan and its workspace. Returns
// the grid with the splits.
int64_t plan_splits(ForwardPlan& plan, const Problem& problem, const KernelChoice& choice, int64_t grid,
                    int max_smem_bytes, bool varlen);
// The combine launch that merges a split attention into out and lse.
CombinePlan combine_splits(const ForwardPlan& attention, const TensorView& out, const TensorView* lse);
// A dense or varlen call given a workspace: the attention and its combine.
SplitForwardPlan plan_with_workspace(Problem problem, const TensorView& out, const TensorView* lse,
                                     const ForwardOptions& options, void* workspace, size_t workspace_bytes,
                                     bool sizing_only, const Arch& arch, int max_smem_bytes,
                                     const TuningTable* tuning, bool varlen);

}  // namespace jitattn::detail
