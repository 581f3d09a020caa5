// Global-memory rows beyond plain tiles: K/V through a block table (paged
// caches), the split-KV partial results, and Q with a KV head's query heads
// packed (pack_gqa). Part of fwd_prefill.cuh.
#pragma once

#include "fwd_mma.cuh"

namespace jitattn {

// Copies K or V rows [key0, key0 + BLOCK_KV) of a paged sequence into a
// tile, each row through its own block-table entry: pages shorter than a
// tile, and the wgmma producer's copies by thread (the block that ends past
// the sequence, pages too short for tensor copies). Rows past the
// sequence read no table entry (those may be unset) and are zero-filled.
// Not unrolled: this path must not raise the register count of the
// kernel's main path.
template <class Cfg>
__device__ __forceinline__ void load_paged_rows(unsigned tile, const unsigned short* rows, long long row_stride,
                                                long long page_stride, const int* pages, int page_shift, int key0,
                                                int seqlen_k, int chunks_valid) {
  constexpr int kChunks = Cfg::kBlockKV * Cfg::kChunksPerRow;
  const int in_page = (1 << page_shift) - 1;
#pragma unroll 1
  for (int i = 0; i < (kChunks + Cfg::kLoadThreads - 1) / Cfg::kLoadThreads; ++i) {
    const int index = i * Cfg::kLoadThreads + threadIdx.x;
    if (kChunks % Cfg::kLoadThreads == 0 || index < kChunks) {
      const int row = index / Cfg::kChunksPerRow;
      const int chunk = index % Cfg::kChunksPerRow;
      const int key = key0 + row;
      const bool valid = key < seqlen_k && chunk < chunks_valid;
      const unsigned short* source = rows;
      if (valid) source = rows + pages[key >> page_shift] * page_stride + (key & in_page) * row_stride + chunk * 8;
      cp_async_16(tile + kv_tile_bytes<Cfg>(row, chunk), source, valid);
    }
  }
}

// Copies K or V rows [key0, key0 + BLOCK_KV) of one sequence and head into a
// tile: rows at a fixed stride, or (paged) through the block table.
template <class Cfg>
__device__ __forceinline__ void load_kv_tile(unsigned tile, const unsigned short* rows, long long row_stride,
                                             long long page_stride, const int* pages, int page_shift, int key0,
                                             int seqlen_k, int chunks_valid, int page = -1) {
  if constexpr (!Cfg::kPaged) {
    load_tile<Cfg, Cfg::kBlockKV>(tile, rows, row_stride, key0, seqlen_k, chunks_valid);
  } else if ((Cfg::kBlockKV >> page_shift) <= 1) {
    // Pages at least a tile long (power-of-two sizes, so tiles never
    // straddle pages): one lookup (done ahead by the caller when it can),
    // then the strided copy.
    if (page < 0) page = pages[key0 >> page_shift];
    const unsigned short* first = rows + page * page_stride + (key0 & ((1 << page_shift) - 1)) * row_stride;
    load_tile<Cfg, Cfg::kBlockKV>(tile, first, row_stride, 0, seqlen_k - key0, chunks_valid);
  } else {
    load_paged_rows<Cfg>(tile, rows, row_stride, page_stride, pages, page_shift, key0, seqlen_k, chunks_valid);
  }
}

// Split-KV partial results are [num_splits, partial_rows, heads_q,
// head_dim]: the row of a sequence's first query there (dense: its batch's
// seqlen_q rows; varlen: its packed rows).
template <class Cfg>
__device__ __forceinline__ int partial_query0(const FwdParams& p, int batch) {
  if constexpr (Cfg::kVarlen) {
    return p.cu_seqlens_q[batch];
  } else {
    return batch * p.seqlen_q;
  }
}

// Split-KV epilogue: this split's normalized fp32 output and LSE for each
// row, straight from the accumulators (the combine kernel merges splits).
template <class Cfg>
__device__ __forceinline__ void store_partial(float (&o)[Cfg::kMTiles][Cfg::kOutTiles][4],
                                              const float (&row_max)[Cfg::kMTiles][2],
                                              const float (&row_sum)[Cfg::kMTiles][2], const FwdParams& p, int split,
                                              int batch, int head, int q0, int warp_row0, int rows, int group,
                                              int lane) {
  const int query0 = partial_query0<Cfg>(p, batch);
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = quad_sum(row_sum[m][half]);
      const int row = q0 + warp_row0 + m * 16 + (lane >> 2) + half * 8;
      if (row >= rows) continue;
      const float inverse = sum > 0.f ? 1.f / sum : 0.f;
      const int query = query_position<Cfg>(row, group);
      const int row_head = Cfg::kPackGqa ? head + row % group : head;
      const long long at = (static_cast<long long>(split) * p.partial_rows + query0 + query) * p.heads_q + row_head;
      float* out = p.partial_o + at * p.head_dim;
#pragma unroll
      for (int n = 0; n < Cfg::kOutTiles; ++n) {
        const int column = n * 8 + (lane & 3) * 2;
        if (!Cfg::kPadded || column < p.head_dim) {
          float2 pair;
          pair.x = o[m][n][2 * half] * inverse;
          pair.y = o[m][n][2 * half + 1] * inverse;
          *reinterpret_cast<float2*>(out + column) = pair;
        }
      }
      if ((lane & 3) == 0) {
        p.partial_lse[at] =
            sum > 0.f ? row_max[m][half] * p.lse_scale + fast_log2(sum) * 0.69314718055994531f : -kInfinity;
      }
    }
  }
}

// Copies the Q tile of a packed-GQA CTA: row r is query (q0 + r) / group of
// head (q0 + r) % group, so rows do not sit at one stride and each chunk
// computes its own address. THREADS threads share the copy, in a loop that
// is not unrolled: unrolled, the persistent head-dim-128 producer (88
// registers) spilled 12-28 bytes holding the addresses (ptxas, NVRTC 13.0),
// and it runs once per tile.
template <class Cfg, int THREADS = Cfg::kLoadThreads>
__device__ __forceinline__ void load_packed_q(unsigned tile, const unsigned short* q, long long row_stride,
                                              long long head_stride, int q0, int rows, int group, int chunks_valid) {
  constexpr int kChunks = Cfg::kBlockQ * Cfg::kChunksPerRow;
#pragma unroll 1
  for (int i = 0; i < (kChunks + THREADS - 1) / THREADS; ++i) {
    const int index = i * THREADS + threadIdx.x;
    if (kChunks % THREADS == 0 || index < kChunks) {
      const int row = index / Cfg::kChunksPerRow;
      const int chunk = index % Cfg::kChunksPerRow;
      const bool valid = q0 + row < rows && chunk < chunks_valid;
      const unsigned short* source = valid ? q + row_offset<Cfg>(q0 + row, group, row_stride, head_stride) + chunk * 8 : q;
      copy_chunk<Cfg>(tile + swizzled_bytes<Cfg, Cfg::kBlockQ>(row, chunk), source, valid, chunk);
    }
  }
}


// A varlen sequence's query rows [q_row0, q_row0 + seqlen_q) in the packed
// tensors, and its key count: seqused_k[b] when given, else its packed key
// rows'. (Over a paged cache with seqused_k, cu_seqlens_k may be absent: it
// is read only for lengths here, or by the caller for packed key rows.)
struct VarlenSequence {
  int q_row0, seqlen_q, seqlen_k;
};
__device__ __forceinline__ VarlenSequence varlen_sequence(const FwdParams& p, int batch) {
  VarlenSequence sequence;
  sequence.q_row0 = p.cu_seqlens_q[batch];
  sequence.seqlen_q = p.cu_seqlens_q[batch + 1] - sequence.q_row0;
  sequence.seqlen_k =
      p.seqused_k != nullptr ? p.seqused_k[batch] : p.cu_seqlens_k[batch + 1] - p.cu_seqlens_k[batch];
  return sequence;
}

// The first cache row of KV-cache sequence b's keys (cache_leftpad; 0 for
// kernels compiled without it, which never read the pads).
template <class Cfg>
__device__ __forceinline__ int kv_row_offset(const FwdParams& p, int batch) {
  if constexpr (Cfg::kLeftPad) return p.kv_row_offset[batch];
  return 0;
}

// Moves the starts of a varlen sequence's tensors (elements) to its packed
// rows: queries, output and LSE at q_row0; keys and values at
// cu_seqlens_k[batch] unless they live in a KV cache (whose starts the
// caller keeps).
template <class Cfg>
__device__ __forceinline__ void start_at_packed_rows(const FwdParams& p, int batch, int q_row0, long long& q_start,
                                                     long long& o_start, long long& lse_start, long long& k_start,
                                                     long long& v_start) {
  q_start = q_row0 * p.q_row_stride;
  o_start = q_row0 * p.o_row_stride;
  lse_start = q_row0 * p.lse_row_stride;
  if constexpr (!Cfg::kKVCache) {
    const int k_row0 = p.cu_seqlens_k[batch];
    k_start = k_row0 * p.k_row_stride;
    v_start = k_row0 * p.v_row_stride;
  }
}

}  // namespace jitattn
