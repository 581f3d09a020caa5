// Split-KV: where a call's tiles alone leave the GPU underused, its keys are
// split, each split writes fp32 partials into the caller's workspace, and a
// combine launch merges them into out and lse. The heuristic is the issue's:
// the smallest split count whose wave efficiency reaches 85% of the best.
#include "plan/internal.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

namespace jitattn::detail {

namespace {

// CTAs the SMs hold at once.
double wave_of(int sm_count, int ctas_per_sm) {
  return static_cast<double>(std::max(1, sm_count)) * std::max(1, ctas_per_sm);
}

// The smallest split count up to max_splits (and kv_blocks, and a wave)
// whose wave efficiency reaches 85% of the best.
int efficient_splits(int64_t tiles, double wave, int64_t kv_blocks, int max_splits) {
  const int limit = static_cast<int>(std::min<int64_t>({max_splits, kv_blocks, static_cast<int64_t>(wave)}));
  auto blocks_per_split = [&](int splits) { return (kv_blocks + splits - 1) / splits; };
  // A split count that leaves blocks per split unchanged only adds empty splits.
  auto eligible = [&](int splits) { return splits == 1 || blocks_per_split(splits) != blocks_per_split(splits - 1); };
  auto efficiency = [&](int splits) {
    const double waves = tiles * splits / wave;
    return waves / std::ceil(waves);
  };
  double best = 0;
  for (int splits = 1; splits <= limit; ++splits) {
    if (eligible(splits)) best = std::max(best, efficiency(splits));
  }
  for (int splits = 1; splits <= limit; ++splits) {
    if (eligible(splits) && efficiency(splits) >= 0.85 * best) return splits;
  }
  return 1;
}

}  // namespace

int num_splits_heuristic(int64_t tiles, int sm_count, int ctas_per_sm, int64_t kv_blocks, int max_splits) {
  const double wave = wave_of(sm_count, ctas_per_sm);
  if (tiles >= 0.8 * wave) return 1;
  return efficient_splits(tiles, wave, kv_blocks, max_splits);
}

int partial_wave_splits(int64_t tiles, int sm_count, int ctas_per_sm, int64_t kv_blocks, int64_t seqlen_k) {
  const double wave = wave_of(sm_count, ctas_per_sm);
  // Unsplit, 1-2 waves run at waves / 2 of two waves' efficiency: 80% at 1.6.
  const double waves = static_cast<double>(tiles) / wave;
  if (waves <= 1 || waves >= 1.6) return 1;
  const int64_t most = std::min<int64_t>(kMaxSplits, seqlen_k / kPartialWaveMinSplitKeys);
  return most < 2 ? 1 : efficient_splits(tiles, wave, kv_blocks, static_cast<int>(most));
}

int uneven_splits(int64_t tiles, int64_t batch, int sm_count, int64_t longest_keys, int64_t total_keys) {
  if (batch < 2 || total_keys <= 0 || longest_keys <= kUnevenRatio * total_keys / batch) return 1;
  // The longest sequence's tiles, split to fill about half the SMs (8 ways
  // for 8 KV heads on 132 SMs: 9 ran 3-8% slower than 8 in two of three
  // uneven 128k-key batches), in pieces of about kUnevenPieceKeys or more
  // (7.8k keys in 4 pieces ran 5% faster than in 3; H200).
  const int64_t tiles_per_sequence = std::max<int64_t>(1, tiles / batch);
  int64_t splits = std::max(1, sm_count / 2) / tiles_per_sequence;
  const int64_t most_pieces = (longest_keys + kUnevenPieceKeys / 2) / kUnevenPieceKeys;
  splits = std::min<int64_t>({splits, most_pieces, kMaxSplits});
  return static_cast<int>(std::max<int64_t>(1, splits));
}

namespace {

// The most keys one tile sees: every key, or with a window (cut to chunks)
// the span around its rows' diagonal. The decode kernel, and the 4-warp and
// wgmma split kernels with a window, cut each tile's own visible keys into
// pieces (fwd_decode.cuh, fwd_prefill.cuh), so their splits are planned on
// that span: a 4096-key window over a 32k cache is split as 4096 keys, not
// as 32k of which most pieces would be empty.
int64_t tile_visible_keys(const KernelSpec& spec, const FwdParams& p, const Problem& problem) {
  int64_t keys = problem.seqlen_k;
  if (!spec.local) return keys;
  // A tile's queries span at most that many diagonal keys: all of a
  // sequence's, or a tile's rows (a KV head's query heads share them when
  // packed).
  const int64_t tile_queries = spec.pack_gqa ? std::max(1, spec.block_q / std::max(1, p.heads_per_kv)) : spec.block_q;
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(problem.seqlen_q, tile_queries));
  keys = std::min<int64_t>(keys, int64_t{p.window_left} + p.window_right + rows);
  if (spec.chunk) {
    // One query sees one chunk; seqlen_q > 1 queries reach into at most
    // (seqlen_q - 1) / c + 2 chunks.
    const int64_t chunk = p.attention_chunk;
    keys = std::min(keys, (rows == 1 ? 1 : (rows - 1) / chunk + 2) * chunk);
  }
  return std::max<int64_t>(keys, 1);
}

}  // namespace

int64_t plan_splits(ForwardPlan& plan, const Problem& problem, const KernelChoice& choice, int64_t grid,
                    int max_smem_bytes, bool varlen) {
  KernelSpec& spec = plan.spec;
  FwdParams& p = plan.params;
  // The kernels that write partial results: the decode kernel, the 4-warp
  // mma.sync tiles and the wgmma tiles in an ordinary grid with aligned rows.
  // Not with V's own head dim (the partials and the combine are head_dim wide).
  const bool splittable = spec.family == Family::decode ||
                          ((spec.stages == 0 || spec.wgmma) && !spec.persistent && spec.unaligned_dim == 0 &&
                           spec.head_dim_v == 0);
  // Errors name the entry point's own argument and sizing function.
  const bool kvcache_call = problem.kvcache && !varlen;
  const char* num_splits_name = kvcache_call ? "num_splits" : "options.num_splits";
  const char* workspace_query = kvcache_call ? "kvcache_workspace_bytes"
                                : varlen     ? "forward_varlen_workspace_bytes"
                                             : "forward_workspace_bytes";
  if (problem.may_split && !splittable && problem.num_splits > 1) {
    reject(fmt::format("{}={}: {} does not split (persistent grids, the mma.sync producer layout, head dims that "
                       "are not a multiple of 8 and V's own head dim, dvN, do not)", num_splits_name,
                       problem.num_splits, spec.text()));
  }
  if (problem.may_split && splittable && grid > 0) {
    // Split-KV when the tiles alone leave the GPU underused (a call with no
    // tiles, e.g. no queries, has nothing to split).
    // Splits are counted in key blocks: one CTA step (every warp one chunk)
    // for the decode kernel. The heuristic sees blocks of at least
    // kMinSplitKeys; a split still spans whole steps.
    // The keys a tile sees (tile_visible_keys).
    const bool decode = spec.family == Family::decode;
    const int64_t seen_keys = tile_visible_keys(spec, p, problem);
    const int64_t step = decode ? spec.block_kv * spec.warps : spec.block_kv;
    const int64_t kv_blocks = std::max<int64_t>(1, (seen_keys + step - 1) / step);
    const int64_t split_keys = decode ? std::max<int64_t>(step, kMinSplitKeys) : step;
    const int64_t split_blocks = std::max<int64_t>(1, (seen_keys + split_keys - 1) / split_keys);
    // Decode splits chosen on the device from the lengths (dynamic_splits):
    // the launch holds the splits an even batch of seqlen_k keys would take,
    // and at least enough for one sequence's tiles to fill half the SMs (as
    // uneven_splits), or the forced count.
    const bool from_lengths = problem.dynamic_splits && spec.family == Family::decode && problem.num_splits != 1;
    int splits = problem.num_splits;
    bool partial_wave = false;  // splits from partial_wave_splits
    const int ctas_per_sm =
        static_cast<int>(std::min<int64_t>(ctas_per_sm_by_smem(spec.smem_bytes(), max_smem_bytes), kDecodeCtasPerSm));
    if (splits == 0) {
      // Resident decode tiles fill the SMs unsplit: counted in their CTA
      // slots, the heuristic would split them to fill every slot, which
      // measured slower (tiles.cpp).
      splits = choice.resident_decode ? 1
                                      : num_splits_heuristic(grid, problem.sm_count, ctas_per_sm, split_blocks,
                                                             kMaxSplits);
      if (from_lengths) {
        // Each split past those is an empty CTA for even batches (one more
        // CTA launch each): 8 for 16 x 8 tiles of 32k keys ran 3% faster
        // than 15 on even batches and no slower on uneven ones (H200,
        // docs/PERFORMANCE.md).
        const int64_t tiles_per_sequence = std::max<int64_t>(1, grid / std::max<int64_t>(1, problem.batch));
        splits = static_cast<int>(std::max<int64_t>(
            splits, std::min<int64_t>(std::max(1, problem.sm_count / 2) / tiles_per_sequence, kMaxSplits)));
      } else if (spec.family == Family::decode) {
        // A decoding batch known to be uneven: its longest sequences split too.
        if (problem.seqlen_k_hinted) {
          splits = std::max(splits, uneven_splits(grid, problem.batch, problem.sm_count, problem.seqlen_k,
                                                  problem.total_seqlen_k));
        }
        // One wave and a mostly empty second: split so that the waves fill
        // (resident tiles have no second wave).
        const int balancing = choice.resident_decode ? 1
                                                     : partial_wave_splits(grid, problem.sm_count, ctas_per_sm,
                                                                           split_blocks, seen_keys);
        partial_wave = balancing > splits;
        splits = std::max(splits, balancing);
      }
    }
    splits = static_cast<int>(std::min<int64_t>(splits, kv_blocks));
    if (splits > 1) {
      const int64_t per_split = (kv_blocks + splits - 1) / splits;
      splits = static_cast<int>((kv_blocks + per_split - 1) / per_split);  // no empty splits
      spec.split = true;
      spec.dynamic_splits = from_lengths;
      // Split partials leave a learnable sink to the combine (combine_splits);
      // a dynamic decode's tiles of one piece write their rows themselves.
      spec.sink = spec.sink && spec.dynamic_splits;
      p.num_splits = splits;
      // The decode kernel cuts each tile's own keys into pieces of at least
      // blocks_per_split steps (FwdParams): those of the longest sequence where
      // the caller gave its length, so shorter ones split less (pieces of a
      // few steps cost more than they spread: one sequence of 32k keys and
      // fifteen of 2k, split 8 ways, ran 12% slower so; H200,
      // docs/PERFORMANCE.md); else kMinSplitKeys, so that sequences shorter
      // than the capacity still fill the splits the planner chose for it,
      // or for partial-wave splits kPartialWaveMinSplitKeys, below which
      // they measured slower than none.
      const bool longest_known = problem.seqlen_k_hinted && !from_lengths;
      const int64_t piece_keys = partial_wave ? kPartialWaveMinSplitKeys : split_keys;
      p.blocks_per_split = static_cast<int>(spec.family != Family::decode || longest_known ? per_split
                                                                                           : (piece_keys + step - 1) / step);
      // Dynamic splits: one share of the batch's work per 1.1 SMs
      // (FlashAttention-3's rule). Growing the share until the pieces fit
      // one wave of CTAs measured 1.5-2.2x slower where one long sequence
      // sits among short ones, whose CTAs end early and hand their SMs on
      // (H200, docs/PERFORMANCE.md).
      p.split_slots = from_lengths ? std::max(1, problem.sm_count * 10 / 11) : 0;
      // The CTAs of one wave, past which pieces wait for a free SM.
      p.wave_ctas = from_lengths ? std::max(1, problem.sm_count) * ctas_per_sm : 0;
      plan.num_splits = splits;
      // Partial rows: every query of every sequence (varlen: the packed ones).
      const int64_t partial_rows = varlen ? problem.total_q : problem.batch * problem.seqlen_q;
      if (partial_rows > INT_MAX) reject(fmt::format("q: {} query rows exceed 2^31-1", partial_rows));
      p.partial_rows = static_cast<int>(partial_rows);
      const size_t partial_elements = static_cast<size_t>(splits) * partial_rows * problem.heads_q;
      plan.partial_o_bytes = (partial_elements * problem.head_dim * 4 + 255) / 256 * 256;
      plan.workspace_bytes = plan.partial_o_bytes + partial_elements * 4;
      // Dynamic splits: CTA k takes the batch's piece k (fwd_decode.cuh,
      // find_piece). A tile takes at most one piece per share of the work
      // plus one, so tiles + split_slots CTAs hold every piece the lengths
      // can ask for, and those past the last piece only read the lengths.
      // (One CTA per tile and split left 7 empty CTAs of 8 in an even batch
      // of 16, costing it 1-41%; H200, docs/PERFORMANCE.md.)
      grid = from_lengths ? std::min<int64_t>(grid * splits, grid + p.split_slots) : grid * splits;
      if (!problem.sizing_only) {
        if (problem.workspace_bytes < plan.workspace_bytes) {
          reject(fmt::format("workspace: {} bytes given; this call needs {} (ask {})", problem.workspace_bytes,
                             plan.workspace_bytes, workspace_query));
        }
        if (problem.workspace == nullptr || reinterpret_cast<uintptr_t>(problem.workspace) % 256 != 0) {
          reject("workspace: data pointer must be non-null and 256-byte aligned");
        }
        p.partial_o = static_cast<float*>(problem.workspace);
        p.partial_lse = reinterpret_cast<float*>(static_cast<char*>(problem.workspace) + plan.partial_o_bytes);
      }
    }
    if (grid > INT_MAX) reject(fmt::format("q: {} blocks with {} splits exceed 2^31-1", grid, splits));
  }
  return grid;
}

// The combine launch that merges a split attention's partial results
// (workspace, FwdParams::partial_rows rows) into out and lse: out [batch,
// seqlen_q, heads_q, head_dim] with lse [batch, heads_q, seqlen_q], or
// varlen out [total_q, heads_q, head_dim] with lse [heads_q, total_q] (one
// "batch" of total_q rows).
CombinePlan combine_splits(const ForwardPlan& attention, const TensorView& out, const TensorView* lse) {
  const FwdParams& fwd = attention.params;
  const bool packed = out.ndim == 3;
  CombineProblem combine;
  combine.state_dtype = DType::f32;
  combine.out_dtype = out.dtype;
  combine.states = fwd.partial_o;
  combine.lse = fwd.partial_lse;
  combine.out = out.data;
  combine.out_lse = lse != nullptr ? static_cast<float*>(lse->data) : nullptr;
  const int64_t batch = packed ? 1 : out.shape[0], seqlen = packed ? out.shape[0] : out.shape[1];
  const int64_t heads = out.shape[out.ndim - 2], head_dim = out.shape[out.ndim - 1];
  combine.num_states = attention.num_splits;
  combine.batch = batch;
  combine.seqlen = seqlen;
  combine.heads = heads;
  combine.head_dim = head_dim;
  const int64_t states_strides[4] = {batch * seqlen * heads * head_dim, seqlen * heads * head_dim, heads * head_dim,
                                     head_dim};
  const int64_t lse_strides[4] = {batch * seqlen * heads, seqlen * heads, heads, 1};
  std::copy(states_strides, states_strides + 4, combine.states_strides);
  std::copy(lse_strides, lse_strides + 4, combine.lse_strides);
  // (batch, row, head) strides of out and of lse.
  combine.out_strides[0] = packed ? 0 : out.strides[0];
  combine.out_strides[1] = out.strides[packed ? 0 : 1];
  combine.out_strides[2] = out.strides[packed ? 1 : 2];
  if (lse != nullptr) {
    combine.out_lse_strides[0] = packed ? 0 : lse->strides[0];
    combine.out_lse_strides[1] = lse->strides[packed ? 1 : 2];
    combine.out_lse_strides[2] = lse->strides[packed ? 0 : 1];
  }
  // Varlen: the packed rows past the last sequence's are no one's.
  if (packed) combine.rows_used = fwd.cu_seqlens_q + fwd.batch;
  // Dynamic splits: the tiles of one piece wrote their rows themselves.
  combine.dynamic_splits = attention.spec.dynamic_splits;
  combine.sinks = fwd.learnable_sink;  // the partials leave the sinks to the combine
  combine.states_name = "workspace";
  combine.lse_name = "workspace";
  return plan_combine(combine);
}

void check_num_splits(const char* name, int num_splits) {
  if (num_splits < 0 || num_splits > kMaxSplits) {
    reject(fmt::format("{}={} must be 0 (heuristic) or 1 to {}", name, num_splits, kMaxSplits));
  }
}

// A call without a workspace never splits: options.num_splits 0 or 1.
void check_unsplit(const ForwardOptions& options, const char* entry, const char* workspace_query) {
  check_num_splits("options.num_splits", options.num_splits);
  if (options.num_splits > 1) {
    reject(fmt::format("options.num_splits={}: splitting needs a workspace (the {} overload that takes one, sized by "
                       "{})", options.num_splits, entry, workspace_query));
  }
}

// A dense or varlen call given a workspace: split over its keys where the
// tiles alone leave the GPU underused (or options.num_splits asks), then
// the combine of the splits into out and lse.
SplitForwardPlan plan_with_workspace(Problem problem, const TensorView& out, const TensorView* lse,
                                     const ForwardOptions& options, void* workspace, size_t workspace_bytes,
                                     bool sizing_only, const Arch& arch, int max_smem_bytes,
                                     const TuningTable* tuning, bool varlen) {
  check_num_splits("options.num_splits", options.num_splits);
  problem.may_split = true;
  problem.num_splits = options.num_splits;
  problem.workspace = workspace;
  problem.workspace_bytes = workspace_bytes;
  problem.sizing_only = sizing_only;
  SplitForwardPlan plan;
  plan.attention = plan_problem(problem, options, arch, max_smem_bytes, tuning, varlen);
  if (plan.attention.spec.split && !sizing_only) plan.combine = combine_splits(plan.attention, out, lse);
  return plan;
}

}  // namespace jitattn::detail
