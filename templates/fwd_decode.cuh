// Flash decoding: attention of a few (packed) query rows over a long KV cache.
//
// Decoding reads every K/V byte once and does almost no math per byte, so the
// kernel is built to keep many bytes in flight rather than to share tiles.
// One CTA holds the packed query rows of one KV head (every query head of the
// group, every query of the call: ROWS rows, one or two 16-row MMA tiles) and
// its WARPS warps stream disjoint chunks of KEYS keys: warp w takes chunks
// w, w + WARPS, w + 2·WARPS, ... of the CTA's key range, each through its own
// STAGES-deep cp.async pipeline, synchronising only within the warp. Every
// warp keeps its own online-softmax state; at the end the warps' states are
// merged through shared memory (the same merge as the combine kernel's).
//
// A chunk never straddles a page of a paged cache (pages are powers of two of
// at least KEYS rows and chunks start at multiples of KEYS), so a paged cache
// costs one block-table read per chunk, read one chunk ahead.
//
// Without KVCACHE the keys are a dense call's K/V ([batch, seqlen_k], every
// sequence seqlen_k long): forward() with few query rows. Those keys are not
// rotated, so that variant takes no RoPE. With VARLEN the queries are packed
// (forward_varlen: sequence b's rows from cu_seqlens_q), and so are dense
// keys; a paged cache keeps its pages.
#pragma once

#include "fwd_prefill.cuh"

namespace jitattn {

// The per-warp view is a one-warp FwdConfig (ROWS query rows, KEYS-key
// blocks), so the prefill kernel's MMA, mask and softmax steps apply as they
// are; the CTA-wide constants are added here.
template <class Element_, int HEAD_DIM, int ROWS, int KEYS, int WARPS, int STAGES, int MASK, bool SOFTCAP, bool ALIBI,
          bool PADDED, int ROPE, int ROTARY_DIM, int ROPE_TABLES, bool KVCACHE, bool PAGED, bool SPLIT,
          bool DYNAMIC_SPLITS, bool VARLEN>
struct DecodeConfig
    : FwdConfig<Element_, HEAD_DIM, ROWS, KEYS, /*WARPS=*/1, MASK, SOFTCAP, ALIBI, PADDED, VARLEN,
                /*PACK_GQA=*/true, ROPE, ROTARY_DIM, ROPE_TABLES, KVCACHE, PAGED, SPLIT> {
  using Warp = FwdConfig<Element_, HEAD_DIM, ROWS, KEYS, 1, MASK, SOFTCAP, ALIBI, PADDED, VARLEN, true, ROPE,
                         ROTARY_DIM, ROPE_TABLES, KVCACHE, PAGED, SPLIT>;
  static constexpr int kStreams = WARPS;  // warps, each streaming its own chunks
  static constexpr int kStages = STAGES;
  static constexpr int kCtaThreads = WARPS * 32;
  static constexpr int kChunkBytes = KEYS * Warp::kRowBytes;  // one K or V chunk
  static constexpr int kStageBytes = 2 * kChunkBytes;         // K then V
  static constexpr int kQBytes = ROWS * Warp::kRowBytes;
  static constexpr int kPipelineBytes = WARPS * STAGES * kStageBytes;
  static constexpr int kSmemBytes = kQBytes + kPipelineBytes;
  // Keys one CTA step covers (every warp one chunk): the unit of split ranges.
  static constexpr int kStepKeys = WARPS * KEYS;
  // Split counts per sequence chosen on the device (splits_from_lengths).
  static constexpr bool kDynamicSplits = DYNAMIC_SPLITS;

  static_assert(STAGES >= 2, "a pipeline needs a stage being read and one being filled");
  static_assert(SPLIT || !DYNAMIC_SPLITS, "dynamic splits choose split counts");
  static_assert(KVCACHE || (ROPE == 0 && !PAGED), "dense keys: no pages, and no RoPE (keys are not rotated here)");
  static_assert(!VARLEN || ROPE == 0, "varlen: no RoPE (positions come from a KV cache's lengths)");
  static_assert(!(VARLEN && KVCACHE) || PAGED, "varlen over a KV cache: a paged one (block table)");
  static_assert(KEYS * Warp::kChunksPerRow % 32 == 0, "chunk copies are whole warp passes");
  // The merge reuses the pipeline: WARPS fp32 [ROWS][HEAD_DIM] accumulators.
  static_assert(WARPS * ROWS * HEAD_DIM * 4 <= kPipelineBytes, "merge buffer fits in the pipeline");
  // Per-warp statistics ([WARPS][ROWS] maxima and sums) reuse the Q tile.
  static_assert(2 * WARPS * ROWS * 4 <= kQBytes, "merge statistics fit in the Q tile");
  static_assert(kQBytes % 1024 == 0 && kChunkBytes % 1024 == 0, "tiles stay 1 KB aligned (fragment_address)");
};

// Copies rows [0, KEYS) of a K or V chunk (first_row is the chunk's first
// row; rows at or past rows_valid, and chunks past chunks_valid, zero-fill)
// with the calling warp alone, evict-first in L2: each byte of the cache is
// read once per call.
template <class Cfg>
__device__ __forceinline__ void load_chunk(unsigned tile, const unsigned short* first_row, long long row_stride,
                                           int rows_valid, int chunks_valid, int lane) {
  constexpr int kCopies = Cfg::kBlockKV * Cfg::kChunksPerRow;
#pragma unroll
  for (int i = 0; i < kCopies / 32; ++i) {
    const int index = i * 32 + lane;
    const int row = index / Cfg::kChunksPerRow;
    const int chunk = index % Cfg::kChunksPerRow;
    const bool valid = row < rows_valid && chunk < chunks_valid;
    cp_async_16_evict_first(tile + swizzled_bytes<Cfg>(row, chunk),
                            valid ? first_row + row * row_stride + chunk * 8 : first_row, valid);
  }
}

// One sequence's visible steps (every warp one chunk) over all its queries,
// and its query tiles (at most the grid's), from the lengths in device
// memory.
template <class Cfg>
__device__ __forceinline__ int sequence_steps(const FwdParams& p, int b, int& tiles) {
  using Warp = typename Cfg::Warp;
  int seqlen_q = p.seqlen_q;
  int seqlen_k = Cfg::kKVCache ? p.seqused_k[b] + p.seqlen_k_added : p.seqlen_k;
  if constexpr (Cfg::kVarlen) {
    const VarlenSequence sequence = varlen_sequence(p, b);
    seqlen_q = sequence.seqlen_q;
    seqlen_k = sequence.seqlen_k;
  }
  tiles = min((seqlen_q * p.heads_per_kv + Cfg::kBlockQ - 1) / Cfg::kBlockQ, p.num_q_blocks);
  int first_chunk, end_chunk;
  visible_blocks<Warp>(p, seqlen_k, seqlen_k - seqlen_q, 0, max(seqlen_q - 1, 0), first_chunk, end_chunk);
  return (end_chunk - first_chunk + Cfg::kStreams - 1) / Cfg::kStreams;
}

__device__ __forceinline__ long long warp_sum(long long x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// The splits of a tile of `steps` visible steps when they are chosen on the
// device (kDynamicSplits): the batch's work (steps × query tiles × KV heads)
// is cut into split_slots shares (FlashAttention-3's rule: one per 1.1 SMs),
// and a tile takes one split per share of its steps, at most num_splits. An
// even batch that fills the GPU runs unsplit; the longest sequences of an
// uneven one split the most, the short ones' CTAs filling the SMs around
// them. Every warp computes it alike (no barrier).
template <class Cfg>
__device__ __forceinline__ int splits_from_lengths(const FwdParams& p, int steps) {
  const int lane = threadIdx.x & 31;
  long long work = 0;
  for (int b = lane; b < p.batch; b += 32) {
    int tiles;
    const int sequence = sequence_steps<Cfg>(p, b, tiles);
    work += static_cast<long long>(tiles) * sequence;
  }
  work = warp_sum(work) * p.heads_kv;
  const long long share = max(static_cast<long long>(p.blocks_per_split), (work + p.split_slots - 1) / p.split_slots);
  return static_cast<int>(min(static_cast<long long>(p.num_splits), max(1ll, (steps + share - 1) / share)));
}

template <class Cfg>
__device__ void fwd_decode(const FwdParams& p) {
  using Warp = typename Cfg::Warp;
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  const unsigned q_tile = smem_u32(shared_bytes);
  const unsigned pipeline = q_tile + Cfg::kQBytes;

  // Grid: (query tile, split, KV head, batch) flattened with the query tile
  // fastest, as in fwd_prefill.
  const int q_block = static_cast<int>(blockIdx.x % p.num_q_blocks);
  const int split = Cfg::kSplit ? static_cast<int>(blockIdx.x / p.num_q_blocks % p.num_splits) : 0;
  const int batch_head = blockIdx.x / p.num_q_blocks / (Cfg::kSplit ? p.num_splits : 1);
  const int group = p.heads_per_kv;
  const int batch = batch_head / p.heads_kv;
  const int kv_head = batch_head % p.heads_kv;
  const int head = kv_head * group;  // the group's first query head
  const int q0 = q_block * Cfg::kBlockQ;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int chunks_valid = Cfg::kPadded ? p.head_dim / 8 : Cfg::kChunksPerRow;

  // This sequence's lengths, and where its rows start: batch strides, or
  // (varlen) the packed rows of its offsets.
  int seqlen_q = p.seqlen_q;
  int seqlen_k = Cfg::kKVCache ? p.seqused_k[batch] + p.seqlen_k_added : p.seqlen_k;
  const int cache_batch = Cfg::kKVCache && p.kv_batch_index != nullptr ? p.kv_batch_index[batch] : batch;
  long long q_start = batch * p.q_batch_stride, o_start = batch * p.o_batch_stride;
  long long lse_start = batch * p.lse_batch_stride;
  // Paged: the batch strides are page strides, applied per chunk.
  long long k_start = Cfg::kPaged ? 0 : cache_batch * p.k_batch_stride;
  long long v_start = Cfg::kPaged ? 0 : cache_batch * p.v_batch_stride;
  if constexpr (Cfg::kVarlen) {
    const VarlenSequence sequence = varlen_sequence(p, batch);
    seqlen_q = sequence.seqlen_q;
    seqlen_k = sequence.seqlen_k;
    // The grid covers the longest sequence.
    if (q0 >= seqlen_q * group) return;
    start_at_packed_rows<Cfg>(p, batch, sequence.q_row0, q_start, o_start, lse_start, k_start, v_start);
  }
  const int* pages = Cfg::kPaged ? p.block_table + batch * p.block_table_stride : nullptr;
  const int rows = seqlen_q * group;
  const unsigned short* q = static_cast<const unsigned short*>(p.q) + q_start + head * p.q_head_stride;
  const unsigned short* k = static_cast<const unsigned short*>(p.k) + k_start + kv_head * p.k_head_stride;
  const unsigned short* v = static_cast<const unsigned short*>(p.v) + v_start + kv_head * p.v_head_stride;

  float slopes[Warp::kMTiles][2];
  if constexpr (Cfg::kAlibi) load_row_slopes<Warp>(slopes, p, batch, head, q0, group, lane);

  // The keys this tile may see (bottom-right diagonal), cut to this split's
  // steps, in whole chunks.
  const int diagonal_offset = seqlen_k - seqlen_q;
  const int first_query = q0 / group;
  const int last_query = (min(q0 + Cfg::kBlockQ, rows) - 1) / group;
  int chunk_begin, chunk_end;
  visible_blocks<Warp>(p, seqlen_k, diagonal_offset, first_query, last_query, chunk_begin, chunk_end);
  if constexpr (Cfg::kSplit) {
    // Split s takes piece s of this tile's own visible steps, so a sequence
    // shorter than the planner assumed (no max_seqlen_k hint, or a graph
    // replayed with other lengths) still spreads over the splits.
    const int steps = (chunk_end - chunk_begin + Cfg::kStreams - 1) / Cfg::kStreams;
    int splits = p.num_splits;
    if constexpr (Cfg::kDynamicSplits) splits = splits_from_lengths<Cfg>(p, steps);
    const int piece = max(p.blocks_per_split, (steps + splits - 1) / splits) * Cfg::kStreams;
    const int first = chunk_begin + split * piece;
    chunk_end = min(chunk_end, first + piece);
    chunk_begin = first;
    // A split without a visible key is an empty state: the combine reads only
    // its lse, never its output. With counts from the lengths most splits of
    // an even batch are such, and leave before Q's copy to hand the SM on.
    // (Only there: compiled into the other split kernels, this and the
    // device count cost them 1-4%, and leaving early measured up to 5%
    // slower on some uneven batches; docs/PERFORMANCE.md.)
    if (Cfg::kDynamicSplits && chunk_begin >= chunk_end) {
      const int query0 = partial_query0<Warp>(p, batch);
      const int end = min(q0 + Cfg::kBlockQ, rows);
      for (int packed = q0 + static_cast<int>(threadIdx.x); packed < end; packed += Cfg::kCtaThreads) {
        p.partial_lse[(static_cast<long long>(split) * p.partial_rows + query0 + packed / group) * p.heads_q + head +
                      packed % group] = -kInfinity;
      }
      return;
    }
  }
  // This warp's chunks: chunk_begin + warp + i · WARPS for i < count.
  const int first_chunk = chunk_begin + warp;
  const int count = first_chunk < chunk_end ? (chunk_end - first_chunk + Cfg::kStreams - 1) / Cfg::kStreams : 0;

  load_packed_q<Warp, Cfg::kCtaThreads>(q_tile, q, p.q_row_stride, p.q_head_stride, q0, rows, group, chunks_valid);
  cp_async_commit();

  const unsigned stages = pipeline + warp * Cfg::kStages * Cfg::kStageBytes;
  const int in_page = Cfg::kPaged ? (1 << p.page_shift) - 1 : 0;
  auto page_of = [&](int i) { return pages[((first_chunk + i * Cfg::kStreams) * Cfg::kBlockKV) >> p.page_shift]; };
  // Starts the copy of this warp's chunk i into its stage (page: chunk i's
  // page, when paged).
  auto issue = [&](int i, int page) {
    const int key0 = (first_chunk + i * Cfg::kStreams) * Cfg::kBlockKV;
    const unsigned stage = stages + (i % Cfg::kStages) * Cfg::kStageBytes;
    long long k_row0, v_row0;
    if constexpr (Cfg::kPaged) {
      k_row0 = page * p.k_batch_stride + (key0 & in_page) * p.k_row_stride;
      v_row0 = page * p.v_batch_stride + (key0 & in_page) * p.v_row_stride;
    } else {
      k_row0 = key0 * p.k_row_stride;
      v_row0 = key0 * p.v_row_stride;
    }
    load_chunk<Warp>(stage, k + k_row0, p.k_row_stride, seqlen_k - key0, chunks_valid, lane);
    load_chunk<Warp>(stage + Cfg::kChunkBytes, v + v_row0, p.v_row_stride, seqlen_k - key0, chunks_valid, lane);
  };
#pragma unroll
  for (int i = 0; i < Cfg::kStages - 1; ++i) {
    if (i < count) issue(i, Cfg::kPaged ? page_of(i) : 0);
    cp_async_commit();
  }
  // The page of the next chunk to issue, read one iteration early.
  int page_ahead = Cfg::kPaged && Cfg::kStages - 1 < count ? page_of(Cfg::kStages - 1) : 0;

  // Q has landed (its group is the oldest) for every thread.
  cp_async_wait<Cfg::kStages - 1>();
  __syncthreads();
  if constexpr (Cfg::kRope != kRopeNone) {
    // KV cache: query i is at cache_seqlens + i (rope_q_offsets); cached keys
    // are already rotated.
    const int query_position0 = p.rope_q_offsets[batch];
    rotate_rows<typename Cfg::Element, Cfg::kRope, Cfg::kRotaryDim, Cfg::kRopeTableBytes, Cfg::kBlockQ, Cfg::kCtaThreads,
                /*PACKED=*/false>(
        p, [&](int row, int chunk) { return reinterpret_cast<uint4*>(shared_bytes + swizzled_bytes<Warp>(row, chunk)); },
        [&](int row) { return query_position0 + (q0 + row) / group; }, threadIdx.x);
    __syncthreads();
  }

  float o[Warp::kMTiles][Warp::kOutTiles][4];
  float row_max[Warp::kMTiles][2];
  float row_sum[Warp::kMTiles][2];
  clear_accumulators<Warp>(o, row_max, row_sum);

  // One 16-row tile: Q's fragments stay in registers (32 at head_dim 128)
  // instead of being re-read from shared memory for every chunk.
  constexpr bool kQInRegisters = Warp::kMTiles == 1 && Cfg::kHeadDim <= 128;
  const QTileFragments<Warp> q_tile_fragments(q_tile, 0, lane);
  unsigned q_fragments[kQInRegisters ? Cfg::kHeadDim / 16 : 1][4];
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int ks = 0; ks < Cfg::kHeadDim / 16; ++ks) q_tile_fragments(0, ks, q_fragments[ks]);
  }

  for (int i = 0; i < count; ++i) {
    // Every lane is done reading chunk i - 1's stage, which is refilled now.
    __syncwarp();
    const int ahead = i + Cfg::kStages - 1;
    if (ahead < count) issue(ahead, page_ahead);
    cp_async_commit();
    if (Cfg::kPaged && ahead + 1 < count) page_ahead = page_of(ahead + 1);
    // Chunk i has landed for every lane of the warp.
    cp_async_wait<Cfg::kStages - 1>();
    __syncwarp();

    const int key0 = (first_chunk + i * Cfg::kStreams) * Cfg::kBlockKV;
    const unsigned stage = stages + (i % Cfg::kStages) * Cfg::kStageBytes;
    float s[Warp::kMTiles][Warp::kScoreTiles][4];
    if constexpr (kQInRegisters) {
      gemm_qk_with<Warp>(s, stage, lane, [&](int, int ks, unsigned (&a)[4]) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = q_fragments[ks][r];
      });
    } else {
      gemm_qk_with<Warp>(s, stage, lane, q_tile_fragments);
    }
    if constexpr (Cfg::kRewriteScores) rewrite_scores<Warp>(s, p, slopes, q0, key0, diagonal_offset, lane);
    if (block_needs_mask<Warp>(p, key0, seqlen_k, first_query, last_query, diagonal_offset)) apply_mask<Warp>(s, p, seqlen_k, q0, key0, diagonal_offset, lane);
    online_softmax<Warp, kRescaleChanged>(s, o, row_max, row_sum, p.scale_log2);
    unsigned probabilities[Warp::kMTiles][Cfg::kBlockKV / 16][4];
    pack_probabilities<Warp>(probabilities, s);
    gemm_pv<Warp>(o, probabilities, stage + Cfg::kChunkBytes, lane);
  }

  // Merge the warps' states. Every warp must be done with Q and its stages
  // (the merge reuses both).
  cp_async_wait<0>();
  __syncthreads();
  float* merge_max = reinterpret_cast<float*>(shared_bytes);  // [WARPS][ROWS]
  float* merge_sum = merge_max + Cfg::kStreams * Cfg::kBlockQ;
  float* merge_o = reinterpret_cast<float*>(shared_bytes + Cfg::kQBytes);  // [WARPS][ROWS][HEAD_DIM]
#pragma unroll
  for (int m = 0; m < Warp::kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = m * 16 + (lane >> 2) + half * 8;
      const float sum = quad_sum(row_sum[m][half]);
      if ((lane & 3) == 0) {
        merge_max[warp * Cfg::kBlockQ + row] = row_max[m][half];
        merge_sum[warp * Cfg::kBlockQ + row] = sum;
      }
      float* out_row = merge_o + (warp * Cfg::kBlockQ + row) * Cfg::kHeadDim + (lane & 3) * 2;
#pragma unroll
      for (int n = 0; n < Warp::kOutTiles; ++n) {
        *reinterpret_cast<float2*>(out_row + n * 8) = float2{o[m][n][2 * half], o[m][n][2 * half + 1]};
      }
    }
  }
  __syncthreads();

  // Each thread finishes four adjacent columns of one row at a time.
  constexpr int kQuads = Cfg::kHeadDim / 4;
  unsigned short* out = static_cast<unsigned short*>(p.o) + o_start + head * p.o_head_stride;
  float* lse = p.lse == nullptr ? nullptr : p.lse + lse_start + head * p.lse_head_stride;
  const int query0 = Cfg::kSplit ? partial_query0<Warp>(p, batch) : 0;
  for (int index = threadIdx.x; index < Cfg::kBlockQ * kQuads; index += Cfg::kCtaThreads) {
    const int row = index / kQuads;
    const int column = index % kQuads * 4;
    if (q0 + row >= rows || column >= p.head_dim) continue;
    float max = -kInfinity;
#pragma unroll
    for (int w = 0; w < Cfg::kStreams; ++w) max = fmaxf(max, merge_max[w * Cfg::kBlockQ + row]);
    float sum = 0.f;
    float4 acc = float4{0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < Cfg::kStreams; ++w) {
      const float warp_max = merge_max[w * Cfg::kBlockQ + row];
      // A warp that saw no key of this row has max -inf and sum 0.
      const float weight = warp_max == -kInfinity ? 0.f : fast_exp2((warp_max - max) * p.scale_log2);
      sum += weight * merge_sum[w * Cfg::kBlockQ + row];
      const float4 part = *reinterpret_cast<const float4*>(merge_o + (w * Cfg::kBlockQ + row) * Cfg::kHeadDim + column);
      acc.x += weight * part.x;
      acc.y += weight * part.y;
      acc.z += weight * part.z;
      acc.w += weight * part.w;
    }
    // A row that saw no key at all writes 0 and lse = -inf.
    const float inverse = sum > 0.f ? 1.f / sum : 0.f;
    const float row_lse = sum > 0.f ? max * p.lse_scale + fast_log2(sum) * 0.69314718055994531f : -kInfinity;
    const int packed = q0 + row;
    if constexpr (Cfg::kSplit) {
      const int query = packed / group;
      const long long at =
          (static_cast<long long>(split) * p.partial_rows + query0 + query) * p.heads_q + head + packed % group;
      *reinterpret_cast<float4*>(p.partial_o + at * p.head_dim + column) =
          float4{acc.x * inverse, acc.y * inverse, acc.z * inverse, acc.w * inverse};
      if (column == 0) p.partial_lse[at] = row_lse;
    } else {
      uint2 packed_out;
      packed_out.x = pack2<typename Cfg::Element>(acc.x * inverse, acc.y * inverse);
      packed_out.y = pack2<typename Cfg::Element>(acc.z * inverse, acc.w * inverse);
      *reinterpret_cast<uint2*>(out + row_offset<Warp>(packed, group, p.o_row_stride, p.o_head_stride) + column) =
          packed_out;
      if (lse != nullptr && column == 0) {
        lse[row_offset<Warp>(packed, group, p.lse_row_stride, p.lse_head_stride)] = row_lse;
      }
    }
  }
}

}  // namespace jitattn
