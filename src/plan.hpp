// plan: validates a forward call and splits it into what is compiled (the
// KernelSpec) and what stays a runtime argument (FwdParams + grid). Pure
// arithmetic: no GPU, no I/O, so it is cheap on the hot path and testable on CPU.
// Implemented in src/plan/ (see plan/internal.hpp for its steps).
#pragma once

#include <optional>
#include <vector>

#include <jitattn/jitattn.hpp>

#include "append_params.h"
#include "fwd_params.h"
#include "merge.hpp"
#include "spec.hpp"

namespace jitattn::detail {

// A tiled tensor map for the launch to encode (cuTensorMapEncodeTiled) into
// FwdParams::k_map or v_map, for kernels whose K/V blocks arrive by tensor
// copies (KernelSpec::tensor_copies). Plan describes it; encoding needs the
// driver, so the launch does it.
struct TileMapLayout {
  const void* base = nullptr;
  DType dtype = DType::bf16;
  // 3 (varlen: no batch dimension), 4, or 5 (paged_panel_map, paged_pair_map); 0 = no map
  // (no keys to copy, or pages too short for a box).
  int rank = 0;
  uint64_t dims[5] = {};           // elements, innermost first: head_dim, rows, heads[, batch]
  uint64_t strides_bytes[4] = {};  // of dims 1 .. rank - 1
  uint32_t box[5] = {};            // 64 channels (one 128-byte swizzled panel) × block_kv rows × 1 × 1
  // paged_panel_map: KV head h's box starts at coordinate h · head_panels
  // of dimension 2 (panels) and h · head_groups of dimension 3 (groups).
  // paged_pair_map: at h · head_panels of dimension 2 (panels), h ·
  // head_pair of dimension 3 (K/V), and h · head_groups + page ·
  // page_groups of dimension 4 (8-row groups); its base is V's (dimension
  // 3's index 0 is V) where V lies below K (FwdParams::k_map_head_panels
  // ... kv_value_first).
  int head_panels = 0, head_pair = 0, head_groups = 0, page_groups = 0;
  bool value_first = false;
  // K/V boxes land as wgmma's 128-byte-swizzled panels; RoPE tables' rows
  // land unswizzled.
  bool swizzle_128b = true;
};

// The tile map of a K or V tensor (batch 0 for packed varlen rows; strides
// in elements: batch, row, head), or none when a tensor copy cannot read it:
// a dimension of more than one element with a stride that is not positive or
// reaches 2^40 bytes. A paged cache's map has pages for batches and a page's
// rows for rows. box_rows: the rows one copy reads (a key block, or a page
// shorter than one).
std::optional<TileMapLayout> kv_tile_map(const void* data, DType dtype, int64_t batch, int64_t rows, int64_t heads,
                                         int64_t head_dim, const int64_t (&strides)[3], int box_rows);

// The 5-D map of a paged K or V cache [pages, page_rows, heads, head_dim]
// (strides in elements: page, row, head) for kernels whose stages
// interleave panels (KernelSpec::interleaved_panels): dimensions 64
// channels, 8 rows, panels, 8-row groups of a page, pages, with the heads
// merged into the panels (heads adjacent: head stride = head_dim) or into
// the groups (head stride = page_rows × row stride, as in [pages, heads,
// page_rows, head_dim] caches). Boxes of 64 × 8 × every panel × box_rows /
// 8 groups land as the stage's interleaved layout. None when neither merge
// fits, or a stride is out of a tensor copy's range; a map of rank 0 for
// pages of fewer than 8 rows (copied row by row, never by the map).
std::optional<TileMapLayout> paged_panel_map(const void* data, DType dtype, int64_t pages, int64_t page_rows,
                                             int64_t heads, int64_t head_dim, const int64_t (&strides)[3],
                                             int box_rows);

// The 5-D map of a paged cache's K and V together (strides in elements:
// page, row, head; the same for both) for kernels whose stages interleave
// K's and V's 8-row groups (KernelSpec::interleaved_kv, head dims of whole
// panels): dimensions 64 channels, 8 rows, panels, K and V (the distance
// from the lower of the two to the other), 8-row groups of every page. The
// heads merge into the panels (heads adjacent: head stride head_dim), into
// K/V (a head's K and V adjacent, then the next head's: head stride twice
// the distance) or into the groups (head stride page_rows × row stride);
// the pages into the groups (page stride the page's rows of every head).
// Boxes of 64 × 8 × every panel × 2 × box_rows / 8 groups land as the
// stage's interleaved layout. None when K's and V's strides differ, no
// merge fits, or a stride or the distance is out of a tensor copy's range
// (not a positive multiple of 16 bytes below 2^40); a map of rank 0 for
// pages of fewer than 8 rows.
std::optional<TileMapLayout> paged_pair_map(const void* k, const void* v, DType dtype, int64_t pages,
                                            int64_t page_rows, int64_t heads, int64_t head_dim,
                                            const int64_t (&k_strides)[3], const int64_t (&v_strides)[3],
                                            int box_rows);

// The tile map of a RoPE cos or sin table (f32 or 16-bit entries)
// [positions, >= rotary_dim / 2] whose base and row stride are 16-byte
// aligned, for kernels that stage block_kv rows of it at a time
// (KernelSpec::rope_table_slots): its first rotary_dim / 2 entries per row,
// unswizzled.
TileMapLayout rope_table_map(const void* data, DType dtype, int64_t positions, int64_t row_stride, int rotary_dim,
                             int block_kv);

struct ForwardPlan {
  KernelSpec spec;
  FwdParams params{};
  // spec.tensor_copies(): the maps of K and V the launch encodes into params.
  TileMapLayout k_map, v_map;
  // Staged RoPE tables (params.rope_tables_staged): their maps, which
  // the launch encodes too.
  TileMapLayout rope_cos_map, rope_sin_map;
  unsigned grid = 0;  // CTAs (flattened); 0 = nothing to compute
  // Split-KV (spec.split): the partial results live in the caller's
  // workspace, fp32 outputs first (partial_o_bytes, 256-aligned), then LSEs.
  int num_splits = 1;
  size_t partial_o_bytes = 0;
  size_t workspace_bytes = 0;
};

class TuningTable;

// The built-in tile configuration for a shape class (from tuning on the H200),
// used when neither the caller nor a tuning table chooses.
TileConfig default_tiles(DType dtype, int head_dim, bool causal, const Arch& arch, int seqlen_bucket);
// The wgmma family's tiles for a class on `arch` (sm_90a; `paged`: over a
// paged KV cache, whose pages the key blocks must tile), which the planner
// takes once they fill the GPU; none elsewhere.
std::optional<TileConfig> wgmma_tiles(int head_dim, bool rope, const Arch& arch, bool paged = false);
// Every distinct default_tiles() choice over the seqlen buckets, and the
// wgmma tiles where they apply (ordinary and persistent, and at head dim 128
// the 176-key blocks of long calls): what warming a (dtype, head_dim, causal)
// class must compile so no call compiles later.
std::vector<TileConfig> default_tile_set(DType dtype, int head_dim, bool causal, const Arch& arch);
// A spec's tile fields (block_q, block_kv, warps, stages, wgmma) from tiles.
void apply_tiles(KernelSpec& spec, const TileConfig& tiles);

// Split-KV: how many splits a call with `tiles` CTAs and `kv_blocks` key
// blocks each should use on `sm_count` SMs holding `ctas_per_sm` CTAs each.
// None when the tiles alone fill 80% of a wave; else the smallest count whose
// wave efficiency (tiles·splits / wave over its ceiling) reaches 85% of the
// best, counting only counts that change the blocks per split; at most
// max_splits.
int num_splits_heuristic(int64_t tiles, int sm_count, int ctas_per_sm, int64_t kv_blocks, int max_splits);
// Split-KV for a decoding grid of more than one wave and less than two
// whose second wave is mostly empty (under 80% wave efficiency unsplit),
// which the rule above leaves unsplit: one token at batch 20 over 8 KV heads
// (160 CTAs on 132 SMs) ran at 0.83x cuDNN's rate unsplit. The same
// efficiency rule picks the count, in splits of at least 1024 keys
// (seqlen_k: the longest sequence); 1 otherwise.
int partial_wave_splits(int64_t tiles, int sm_count, int ctas_per_sm, int64_t kv_blocks, int64_t seqlen_k);
// Split-KV for a decoding batch of `batch` sequences in `tiles` CTAs whose
// longest sequence has longest_keys keys and all of them total_keys: 1
// unless the longest is over 1.25x the mean; else as many splits as let the
// longest sequence's tiles fill half the SMs, in pieces of about 2048 keys or
// more (the nearest count).
int uneven_splits(int64_t tiles, int64_t batch, int sm_count, int64_t longest_keys, int64_t total_keys);

// RoPE inverse frequencies of pairs 0 .. rotary_dim / 2 − 1 from theta,
// linear scaling and Llama 3.1 scaling (computed in double, rounded once).
std::vector<float> rope_inv_frequencies(const RopeOptions& rope, int rotary_dim);

// Throws Error(invalid_argument) naming the argument and the rule, or
// Error(unsupported) for valid input this build cannot serve. max_smem_bytes
// is the device's per-block opt-in limit; sm_count sizes persistent grids.
// Tiles come from options.tiles, else `tuning` (if it has the shape class),
// else default_tiles(). Never splits (no workspace).
ForwardPlan plan_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const TensorView* lse, const ForwardOptions& options,
                         const Arch& arch, int max_smem_bytes, int sm_count, const TuningTable* tuning = nullptr);

// A dense forward call given a workspace: plan_forward, but split over its
// keys where the tiles alone leave the GPU underused (or options.num_splits
// asks), followed by the combine of the splits (grid 0 unless split). With
// sizing_only the workspace is not checked (forward_workspace_bytes).
struct SplitForwardPlan {
  ForwardPlan attention;
  CombinePlan combine;
};
SplitForwardPlan plan_forward_split(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const TensorView* lse, const ForwardOptions& options,
                                    void* workspace, size_t workspace_bytes, bool sizing_only, const Arch& arch,
                                    int max_smem_bytes, int sm_count, const TuningTable* tuning = nullptr);

// The same for packed varlen calls: q/out 3-D, lse [heads_q, total_q], k/v
// 3-D (or paged 4-D with varlen.block_table). Sizes the grid by
// max_seqlen_q; cu_seqlens are passed to the kernel unread. Never splits.
ForwardPlan plan_forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                const TensorView* lse, const VarlenArgs& varlen, const ForwardOptions& options,
                                const Arch& arch, int max_smem_bytes, int sm_count,
                                const TuningTable* tuning = nullptr);
// A varlen call given a workspace: plan_forward_varlen, split over keys as
// plan_forward_split does (the splits sized by max_seqlen_k; partial rows
// are the packed queries).
SplitForwardPlan plan_forward_varlen_split(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const TensorView& out, const TensorView* lse, const VarlenArgs& varlen,
                                           const ForwardOptions& options, void* workspace, size_t workspace_bytes,
                                           bool sizing_only, const Arch& arch, int max_smem_bytes, int sm_count,
                                           const TuningTable* tuning = nullptr);

// Writing k_new/v_new into the cache (append family); grid 0 = nothing to append.
struct AppendPlan {
  KernelSpec spec;
  AppendParams params{};
  unsigned grid = 0;
};

// A forward_kvcache call: up to three launches, in order.
struct KVCachePlan {
  AppendPlan append;
  ForwardPlan attention;
  CombinePlan combine;  // grid 0 unless attention.spec.split
};

// forward_kvcache: append (when k_new is given), attention over the cache
// (contiguous or paged; split-KV when the heuristic or args.num_splits asks),
// combine of the splits. sm_count drives the split heuristic. With
// sizing_only the workspace is not checked (kvcache_workspace_bytes).
KVCachePlan plan_kvcache(const TensorView& q, const KVCacheArgs& args, const TensorView& out, const TensorView* lse,
                         const ForwardOptions& options, void* workspace, size_t workspace_bytes, bool sizing_only,
                         const Arch& arch, int max_smem_bytes, int sm_count, const TuningTable* tuning = nullptr);

}  // namespace jitattn::detail
