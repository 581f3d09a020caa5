// The mma.sync tile math of the prefill kernels: S = Q Kᵀ, score rewrites
// (softcap, ALiBi), masks, the online softmax, O += P V, the epilogue, and
// the key blocks a tile sees. Part of fwd_prefill.cuh.
#pragma once

#include "fwd_smem.cuh"

namespace jitattn {

// S = Q Kᵀ for this warp's rows, with K [BLOCK_KV][HEAD_DIM] in shared memory
// and Q's A fragments from `q_fragment(m, ks, a)` (16-row tile m, k-step ks).
// K's rows are the MMA's columns, so its non-transposed 8×8 blocks are
// exactly the column-major B fragments.
template <class Cfg, typename QFragment>
__device__ __forceinline__ void gemm_qk_with(float (&s)[Cfg::kMTiles][Cfg::kScoreTiles][4], unsigned k_tile, int lane,
                                             QFragment&& q_fragment) {
  constexpr int kRowBytes = Cfg::kRowBytes;
  // K matrices are (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15).
  const unsigned k_row = k_tile + ((lane & 7) + (lane >> 4) * 8) * kRowBytes;
  const unsigned k_low = (((lane >> 3) & 1) ^ (lane & 7)) << 4;
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int n = 0; n < Cfg::kScoreTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[m][n][e] = 0.f;
    }
  }
#pragma unroll
  for (int ks = 0; ks < Cfg::kHeadDim / 16; ++ks) {
    unsigned a[Cfg::kMTiles][4];
#pragma unroll
    for (int m = 0; m < Cfg::kMTiles; ++m) q_fragment(m, ks, a[m]);
#pragma unroll
    for (int pair = 0; pair < Cfg::kScoreTiles / 2; ++pair) {
      unsigned b[4];
      ldmatrix_x4(b, fragment_address<Cfg>(k_row + pair * 16 * kRowBytes, k_low, ks));
#pragma unroll
      for (int m = 0; m < Cfg::kMTiles; ++m) {
        mma_m16n8k16<typename Cfg::Element>(s[m][2 * pair], a[m], b[0], b[1]);
        mma_m16n8k16<typename Cfg::Element>(s[m][2 * pair + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// Q's A fragment for rows warp_row0 + 16m .. +15, k-step ks, from the
// swizzled Q tile. ldmatrix lanes: the matrices are (rows 0-7 | 8-15) ×
// (k 0-7 | 8-15).
template <class Cfg>
struct QTileFragments {
  unsigned q_row, q_low;
  __device__ __forceinline__ QTileFragments(unsigned q_tile, int warp_row0, int lane)
      : q_row(q_tile + (warp_row0 + (lane & 15)) * Cfg::kRowBytes), q_low(((lane >> 4) ^ (lane & 7)) << 4) {}
  __device__ __forceinline__ void operator()(int m, int ks, unsigned (&a)[4]) const {
    ldmatrix_x4(a, fragment_address<Cfg>(q_row + m * 16 * Cfg::kRowBytes, q_low, ks));
  }
};

// S = Q Kᵀ with Q read from its shared-memory tile.
template <class Cfg>
__device__ __forceinline__ void gemm_qk(float (&s)[Cfg::kMTiles][Cfg::kScoreTiles][4], unsigned q_tile,
                                        unsigned k_tile, int warp_row0, int lane) {
  gemm_qk_with<Cfg>(s, k_tile, lane, QTileFragments<Cfg>(q_tile, warp_row0, lane));
}

// P (fp32 probabilities in score-accumulator layout) → 16-bit A fragments.
// The C fragment of two adjacent 8-column tiles is the A fragment of one
// 16-wide k-step. Packing all of P at once frees the fp32 scores before P V.
template <class Cfg>
__device__ __forceinline__ void pack_probabilities(unsigned (&a)[Cfg::kMTiles][Cfg::kBlockKV / 16][4],
                                                   const float (&p)[Cfg::kMTiles][Cfg::kScoreTiles][4]) {
  using Element = typename Cfg::Element;
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int ks = 0; ks < Cfg::kBlockKV / 16; ++ks) {
      a[m][ks][0] = pack2<Element>(p[m][2 * ks][0], p[m][2 * ks][1]);
      a[m][ks][1] = pack2<Element>(p[m][2 * ks][2], p[m][2 * ks][3]);
      a[m][ks][2] = pack2<Element>(p[m][2 * ks + 1][0], p[m][2 * ks + 1][1]);
      a[m][ks][3] = pack2<Element>(p[m][2 * ks + 1][2], p[m][2 * ks + 1][3]);
    }
  }
}

// O += P V. V is [BLOCK_KV][HEAD_DIM] row-major, so its B fragments need
// ldmatrix's transpose. Cfg: the kernel's ValueTile (V's own row widths).
template <class Cfg>
__device__ __forceinline__ void gemm_pv(float (&o)[Cfg::kMTiles][Cfg::kOutTiles][4],
                                        const unsigned (&a)[Cfg::kMTiles][Cfg::kBlockKV / 16][4],
                                        unsigned v_tile, int lane) {
  constexpr int kRowBytes = Cfg::kRowBytes;
  // Matrices: (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15).
  const unsigned v_row = v_tile + (lane & 15) * kRowBytes;
  const unsigned v_low = ((lane >> 4) ^ (lane & 7)) << 4;
#pragma unroll
  for (int ks = 0; ks < Cfg::kBlockKV / 16; ++ks) {
#pragma unroll
    for (int pair = 0; pair < Cfg::kOutTiles / 2; ++pair) {
      unsigned b[4];
      ldmatrix_x4_trans(b, fragment_address<Cfg>(v_row + ks * 16 * kRowBytes, v_low, pair));
#pragma unroll
      for (int m = 0; m < Cfg::kMTiles; ++m) {
        mma_m16n8k16<typename Cfg::Element>(o[m][2 * pair], a[m][ks], b[0], b[1]);
        mma_m16n8k16<typename Cfg::Element>(o[m][2 * pair + 1], a[m][ks], b[2], b[3]);
      }
    }
  }
}

// Accumulator element e of score tile n sits at row lane/4 (+8 for e >= 2)
// and column n*8 + 2*(lane%4) + (e & 1); `body` gets those positions and the
// thread's row slot (m, e / 2) for per-row values held in registers.
template <class Cfg, typename Body>
__device__ __forceinline__ void for_each_score(float (&s)[Cfg::kMTiles][Cfg::kScoreTiles][4], int first_row,
                                               int first_key, int lane, Body&& body) {
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int n = 0; n < Cfg::kScoreTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        body(s[m][n][e], first_row + m * 16 + (lane >> 2) + (e >> 1) * 8, first_key + n * 8 + (lane & 3) * 2 + (e & 1),
             m, e >> 1);
      }
    }
  }
}

// The position in its sequence of tile row `row` (packed rows interleave the
// heads of a group).
template <class Cfg>
__device__ __forceinline__ int query_position(int row, int group) {
  if constexpr (Cfg::kPackGqa) return row / group;
  return row;
}

// Offset of packed row `row` from the group's first head at query 0.
template <class Cfg>
__device__ __forceinline__ long long row_offset(int row, int group, long long row_stride, long long head_stride) {
  if constexpr (Cfg::kPackGqa) return static_cast<long long>(row / group) * row_stride + (row % group) * head_stride;
  return static_cast<long long>(row) * row_stride;
}

// Turns raw q·k into log2-domain logits: softcap · tanh(scale · s / softcap)
// (or scale · s), minus the ALiBi distance bias, times log2(e). The softmax
// then runs with scale_log2 = 1.
template <class Cfg>
__device__ __forceinline__ void rewrite_scores(float (&s)[Cfg::kMTiles][Cfg::kScoreTiles][4], const FwdParams& p,
                                               const float (&slopes)[Cfg::kMTiles][2], int first_row, int first_key,
                                               int diagonal_offset, int lane) {
  for_each_score<Cfg>(s, first_row, first_key, lane, [&](float& score, int row, int key, int m, int half) {
    float logit = Cfg::kSoftcap ? p.softcap * fast_tanh(score * p.softcap_scale) : score * p.scale;
    if constexpr (Cfg::kAlibi) {
      const int position = query_position<Cfg>(row, p.heads_per_kv);
      logit -= slopes[m][half] * static_cast<float>(abs(position + diagonal_offset - key));
    }
    score = logit * 1.4426950408889634f;
  });
}

// The first key of the chunk (of p.attention_chunk keys) that holds key
// position `position`: floor division, so a query before the first key
// (negative position, seqlen_q > seqlen_k) is in chunk -1 and sees no key
// of it. Divides by FwdParams' magic number (positions stay below 2^30).
__device__ __forceinline__ int chunk_start(int position, const FwdParams& p) {
  const unsigned n = static_cast<unsigned>(position >= 0 ? position : p.attention_chunk - 1 - position);
  const int index = static_cast<int>((__umulhi(n, p.attention_chunk_magic) + n) >> p.attention_chunk_shift);
  return (position >= 0 ? index : -index) * p.attention_chunk;
}

// Sets scores of keys the row may not see to -inf: keys past seqlen_k, and
// those outside the causal or local window around the bottom-right-aligned
// diagonal (key = row + diagonal_offset), cut to the row's chunk with
// kChunk.
template <class Cfg>
__device__ __forceinline__ void apply_mask(float (&s)[Cfg::kMTiles][Cfg::kScoreTiles][4], const FwdParams& p,
                                           int seqlen_k, int first_row, int first_key, int diagonal_offset, int lane) {
  // Each row sees one range of keys. Held relative to this thread's first
  // key, as [begin, end) of column offsets, it is tested with one compare
  // against the element's constant offset n * 8 + (e & 1), instead of each
  // element's key and row being formed and compared to every bound.
  const int thread_key0 = first_key + (lane & 3) * 2;
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = query_position<Cfg>(first_row + m * 16 + (lane >> 2) + half * 8, p.heads_per_kv);
      const int diagonal = row + diagonal_offset - thread_key0;
      int end = seqlen_k - thread_key0;
      if constexpr (Cfg::kCausal) end = min(end, diagonal + 1);
      if constexpr (Cfg::kLocal) end = min(end, diagonal + p.window_right + 1);
      int begin = Cfg::kLocal ? diagonal - p.window_left : 0;
      if constexpr (Cfg::kChunk) {
        const int chunk0 = chunk_start(row + diagonal_offset, p) - thread_key0;
        begin = max(begin, chunk0);
        end = min(end, chunk0 + p.attention_chunk);
      }
#pragma unroll
      for (int n = 0; n < Cfg::kScoreTiles; ++n) {
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          const int column = n * 8 + (e & 1);
          const bool visible = column < end && (!Cfg::kLocal || column >= begin);
          if (!visible) s[m][n][e] = -kInfinity;
        }
      }
    }
  }
}

// O *= the per-row corrections of an online softmax step.
template <class Cfg>
__device__ __forceinline__ void rescale_output(float (&o)[Cfg::kMTiles][Cfg::kOutTiles][4],
                                               const float (&corrections)[Cfg::kMTiles][2]) {
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int n = 0; n < Cfg::kOutTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[m][n][e] *= corrections[m][e >> 1];
    }
  }
}

// Online softmax step: folds this block's scores into the running row maxima
// and sums, rescales the output accumulators, and turns s into probabilities
// exp2(s·scale_log2 − max·scale_log2). Sums stay per-lane partial until the
// epilogue, since every rescale factor is uniform across a row's four lanes.
//
// When O is rescaled:
enum RescaleMode : int {
  kRescaleNow = 0,
  // Decoding, where the running maxima settle after a few blocks: when no row
  // of the warp raised its maximum, every correction is exactly 1 and the
  // warp skips rescaling O.
  kRescaleChanged = 1,
  // wgmma, where the previous block's P V may still be accumulating into O:
  // the corrections go to `later`, for rescale_output once it has finished.
  kRescaleLater = 2,
};

template <class Cfg, RescaleMode MODE = kRescaleNow>
__device__ __forceinline__ void online_softmax(float (&s)[Cfg::kMTiles][Cfg::kScoreTiles][4],
                                               float (&o)[Cfg::kMTiles][Cfg::kOutTiles][4],
                                               float (&row_max)[Cfg::kMTiles][2],
                                               float (&row_sum)[Cfg::kMTiles][2], float scale_log2,
                                               float (*later)[2] = nullptr) {
  constexpr bool SKIP_UNIT_RESCALE = MODE == kRescaleChanged;
  float corrections[Cfg::kMTiles][2];
  bool rescale = false;
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // wgmma: maxima and sums in kParts independent chains. There is one
      // warp per warpgroup and scheduler to wait out each step's latency,
      // and a single chain of 2·kScoreTiles steps measured 1-4% slower with
      // RoPE at head dim 64 (H200, docs/PERFORMANCE.md). The mma.sync
      // kernels keep one chain: at 255 registers more chains spill.
      constexpr int kParts = !Cfg::kWgmma ? 1 : Cfg::kScoreTiles < 4 ? Cfg::kScoreTiles : 4;
      float part_max[kParts];
#pragma unroll
      for (int j = 0; j < kParts; ++j) part_max[j] = row_max[m][half];
#pragma unroll
      for (int n = 0; n < Cfg::kScoreTiles; ++n) {
        part_max[n % kParts] = fmaxf(part_max[n % kParts], fmaxf(s[m][n][2 * half], s[m][n][2 * half + 1]));
      }
      float block_max = part_max[0];
#pragma unroll
      for (int j = 1; j < kParts; ++j) block_max = fmaxf(block_max, part_max[j]);
      block_max = quad_max(block_max);
      // A row with no visible key so far keeps max = -inf; subtracting 0
      // instead keeps exp2 at 0 rather than NaN (-inf - -inf).
      const float max_scaled = block_max == -kInfinity ? 0.f : block_max * scale_log2;
      const float correction = fast_exp2(row_max[m][half] * scale_log2 - max_scaled);
      row_sum[m][half] *= correction;
      if constexpr (SKIP_UNIT_RESCALE) {
        rescale = rescale || block_max != row_max[m][half];
        corrections[m][half] = correction;
      } else if constexpr (MODE == kRescaleLater) {
        later[m][half] = correction;
      } else {
#pragma unroll
        for (int n = 0; n < Cfg::kOutTiles; ++n) {
          o[m][n][2 * half] *= correction;
          o[m][n][2 * half + 1] *= correction;
        }
      }
      row_max[m][half] = block_max;
      float part_sum[kParts];
#pragma unroll
      for (int j = 0; j < kParts; ++j) part_sum[j] = 0.f;
#pragma unroll
      for (int n = 0; n < Cfg::kScoreTiles; ++n) {
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          s[m][n][e] = fast_exp2(s[m][n][e] * scale_log2 - max_scaled);
          part_sum[n % kParts] += s[m][n][e];
        }
      }
      float sum = part_sum[0];
#pragma unroll
      for (int j = 1; j < kParts; ++j) sum += part_sum[j];
      row_sum[m][half] += sum;
    }
  }
  if constexpr (SKIP_UNIT_RESCALE) {
    // An unchanged maximum gives a correction of exactly exp2(0) = 1.
    if (__any_sync(0xffffffffu, rescale)) rescale_output<Cfg>(o, corrections);
  }
}

// Learnable attention sink (FwdConfig::kSink): one more softmax column per
// query head, of logit `sink` (natural-log units, as the scaled scores) and
// no value. Folds it into a row's final statistics: `sum` of exp over the
// row's keys relative to `max_natural`, its largest logit (-inf for a row
// that saw no key). Returns the factor that turns O's accumulators into the
// output and sets `lse`, which then counts the sink: a row with no key
// writes O = 0 with lse = sink, as FlashAttention's learnable_sink does.
// Taken relative to the larger of the two maxima, so no term overflows
// however far the sink lies from the scores.
__device__ __forceinline__ float fold_sink(float sum, float max_natural, float sink, float& lse) {
  constexpr float kLog2e = 1.4426950408889634f;
  const float top = fmaxf(max_natural, sink);
  if (top == -kInfinity) {  // no key, and a sink of -inf
    lse = -kInfinity;
    return 0.f;
  }
  const float keys = sum > 0.f ? fast_exp2((max_natural - top) * kLog2e) : 0.f;
  const float total = fmaf(sum, keys, fast_exp2((sink - top) * kLog2e));
  lse = top + fast_log2(total) * 0.69314718055994531f;
  return keys / total;
}

// The sink logits of a tile's rows from its first query head (nullptr
// without kSink): row r's head is `head` + r % group when packed.
template <class Cfg>
__device__ __forceinline__ const float* tile_sinks(const FwdParams& p, int head) {
  if constexpr (Cfg::kSink) return p.learnable_sink + head;
  return nullptr;
}

// Normalizes O into this warp's rows of the staging tile (the Q tile's
// rows, swizzled) and writes the log-sum-exp. A row that saw no key has sum
// 0 and stages 0 with lse = -inf (with a sink: lse = the sink, fold_sink).
// copy_staged_output then moves the rows to memory in full 16-byte chunks.
template <class Cfg>
__device__ __forceinline__ void stage_output(float (&o)[Cfg::kMTiles][Cfg::kOutTiles][4],
                                             const float (&row_max)[Cfg::kMTiles][2],
                                             const float (&row_sum)[Cfg::kMTiles][2], unsigned char* staging,
                                             float* lse, long long lse_row_stride, long long lse_head_stride, int q0,
                                             int warp_row0, int rows, int group, float lse_scale, const float* sinks,
                                             int lane) {
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = quad_sum(row_sum[m][half]);
      float inverse = sum > 0.f ? 1.f / sum : 0.f;
      const int row = warp_row0 + m * 16 + (lane >> 2) + half * 8;
      float sink_lse = 0.f;
      if constexpr (Cfg::kSink) {
        // Rows past the sequence read their head's sink too (in bounds) and
        // store nothing.
        const float sink = sinks[Cfg::kPackGqa ? (q0 + row) % group : 0];
        inverse = fold_sink(sum, row_max[m][half] * lse_scale, sink, sink_lse);
      }
#pragma unroll
      for (int n = 0; n < Cfg::kOutTiles; ++n) {
        *reinterpret_cast<unsigned*>(staging + swizzled_bytes<Cfg, Cfg::kBlockQ>(row, n) + (lane & 3) * 4) =
            pack2<typename Cfg::Element>(o[m][n][2 * half] * inverse, o[m][n][2 * half + 1] * inverse);
      }
      if (lse != nullptr && (lane & 3) == 0 && q0 + row < rows) {
        // Natural log: max·lse_scale + ln(sum).
        lse[row_offset<Cfg>(q0 + row, group, lse_row_stride, lse_head_stride)] =
            Cfg::kSink ? sink_lse
            : sum > 0.f ? row_max[m][half] * lse_scale + fast_log2(sum) * 0.69314718055994531f : -kInfinity;
      }
    }
  }
}

// Copies staged rows first_row .. first_row + ROWS - 1 of a tile to the
// output, THREADS threads (thread: this one's index among them) a 16-byte
// chunk each per pass. Rows past the sequence's and chunks past the
// caller's head dim (zero padding) are not stored; unaligned rows go
// element by element up to the head dim. UNROLL passes are in flight at
// once (the producer that runs it for persistent kernels has few
// registers).
template <class Cfg, int ROWS, int THREADS, int UNROLL>
__device__ __forceinline__ void copy_staged_output(const unsigned char* staging, unsigned short* out,
                                                   long long out_row_stride, long long out_head_stride, int q0,
                                                   int first_row, int rows, int group, int chunks_valid, int thread) {
  constexpr int kChunks = ROWS * Cfg::kOutChunks;
#pragma unroll UNROLL
  for (int i = 0; i < (kChunks + THREADS - 1) / THREADS; ++i) {
    const int chunk = i * THREADS + thread;
    const int row = first_row + chunk / Cfg::kOutChunks;
    const int column_chunk = chunk % Cfg::kOutChunks;
    if ((kChunks % THREADS == 0 || chunk < kChunks) && q0 + row < rows && column_chunk < chunks_valid) {
      const uint4 value = *reinterpret_cast<const uint4*>(staging + swizzled_bytes<Cfg, Cfg::kBlockQ>(row, column_chunk));
      unsigned short* const destination =
          out + row_offset<Cfg>(q0 + row, group, out_row_stride, out_head_stride) + column_chunk * 8;
      if constexpr (Cfg::kUnaligned) {
        const unsigned words[4] = {value.x, value.y, value.z, value.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (column_chunk * 8 + e < Cfg::kColumns) {
            destination[e] = static_cast<unsigned short>(words[e / 2] >> (16 * (e & 1)));
          }
        }
      } else {
        *reinterpret_cast<uint4*>(destination) = value;
      }
    }
  }
}

// The whole epilogue by one warp: its rows staged, then stored.
template <class Cfg>
__device__ __forceinline__ void store_output(float (&o)[Cfg::kMTiles][Cfg::kOutTiles][4],
                                             const float (&row_max)[Cfg::kMTiles][2],
                                             const float (&row_sum)[Cfg::kMTiles][2], unsigned char* staging,
                                             unsigned short* out, long long out_row_stride, long long out_head_stride,
                                             float* lse, long long lse_row_stride, long long lse_head_stride, int q0,
                                             int warp_row0, int rows, int group, int chunks_valid, float lse_scale,
                                             const float* sinks, int lane) {
  stage_output<Cfg>(o, row_max, row_sum, staging, lse, lse_row_stride, lse_head_stride, q0, warp_row0, rows, group,
                    lse_scale, sinks, lane);
  __syncwarp();
  constexpr int kPasses = Cfg::kRowsPerWarp * Cfg::kOutChunks / 32;
  copy_staged_output<Cfg, Cfg::kRowsPerWarp, 32, kPasses>(staging, out, out_row_stride, out_head_stride, q0,
                                                          warp_row0, rows, group, chunks_valid, lane);
}


// ALiBi slopes of this thread's rows, tile rows first_row + 16m + lane/4
// (+8): packed rows differ in head.
template <class Cfg>
__device__ __forceinline__ void load_row_slopes(float (&slopes)[Cfg::kMTiles][2], const FwdParams& p, int batch,
                                                int head, int first_row, int group, int lane) {
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = first_row + m * 16 + (lane >> 2) + half * 8;
      const int row_head = Cfg::kPackGqa ? head + row % group : head;
      slopes[m][half] = p.alibi_slopes[batch * p.alibi_batch_stride + row_head];
    }
  }
}

// Key blocks [first_block, end_block) of BLOCK_KV keys that queries
// first_query..last_query may see: query i sees keys around i +
// diagonal_offset (bottom-right alignment), bounded by causal or the window,
// and by its chunk (chunks move forward with the query, so the first
// query's chunk starts the range and the last query's ends it).
template <class Cfg>
__device__ __forceinline__ void visible_blocks(const FwdParams& p, int seqlen_k, int diagonal_offset, int first_query,
                                               int last_query, int& first_block, int& end_block) {
  long long kv_begin = 0;
  long long kv_end = seqlen_k;
  if constexpr (Cfg::kCausal) kv_end = min(kv_end, static_cast<long long>(last_query) + 1 + diagonal_offset);
  if constexpr (Cfg::kLocal) {
    kv_end = min(kv_end, static_cast<long long>(last_query) + 1 + diagonal_offset + p.window_right);
    kv_begin = max(kv_begin, static_cast<long long>(first_query) + diagonal_offset - p.window_left);
  }
  if constexpr (Cfg::kChunk) {
    kv_begin = max(kv_begin, static_cast<long long>(chunk_start(first_query + diagonal_offset, p)));
    kv_end = min(kv_end, static_cast<long long>(chunk_start(last_query + diagonal_offset, p)) +
                             p.attention_chunk);
  }
  first_block = static_cast<int>(kv_begin / Cfg::kBlockKV);
  end_block = kv_end > kv_begin ? static_cast<int>((kv_end + Cfg::kBlockKV - 1) / Cfg::kBlockKV) : first_block;
}

// kChunk: where the chunks of a tile's (or warp's) rows end and start. Rows'
// chunks only move forward, so the first row's chunk ends first and the
// last row's starts last. The wgmma and decode kernels form them once per
// tile: two multiply-shift divisions per key block cost chunked calls 1-2%
// (H200, docs/PERFORMANCE.md); the 4-warp kernels, short of registers, form
// them per block. {0, 0} and unused without chunks.
struct ChunkBounds {
  int first_end;   // the end of the first row's chunk
  int last_start;  // the start of the last row's chunk
};

template <class Cfg>
__device__ __forceinline__ ChunkBounds chunk_bounds(const FwdParams& p, int first_query, int last_query,
                                                    int diagonal_offset) {
  if constexpr (Cfg::kChunk) {
    return {chunk_start(first_query + diagonal_offset, p) + p.attention_chunk,
            chunk_start(last_query + diagonal_offset, p)};
  }
  return {0, 0};
}

// Whether the key block at key0 crosses a boundary for some row of the
// tile (the sequence's end, the causal diagonal, a window edge, a chunk's
// edge given by `chunks`): only such blocks pay for masking.
template <class Cfg>
__device__ __forceinline__ bool block_needs_mask(const FwdParams& p, int key0, int seqlen_k, int first_query,
                                                 int last_query, int diagonal_offset, const ChunkBounds& chunks) {
  bool needs_mask = key0 + Cfg::kBlockKV > seqlen_k;
  if constexpr (Cfg::kCausal) needs_mask = needs_mask || key0 + Cfg::kBlockKV - 1 > first_query + diagonal_offset;
  if constexpr (Cfg::kLocal) {
    needs_mask = needs_mask || key0 + Cfg::kBlockKV - 1 > first_query + diagonal_offset + p.window_right ||
                 key0 < last_query + diagonal_offset - p.window_left;
  }
  if constexpr (Cfg::kChunk) {
    needs_mask = needs_mask || key0 + Cfg::kBlockKV > chunks.first_end || key0 < chunks.last_start;
  }
  return needs_mask;
}

// Zero output accumulators, maxima -inf, sums 0.
template <class Cfg>
__device__ __forceinline__ void clear_accumulators(float (&o)[Cfg::kMTiles][Cfg::kOutTiles][4],
                                                   float (&row_max)[Cfg::kMTiles][2],
                                                   float (&row_sum)[Cfg::kMTiles][2]) {
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int n = 0; n < Cfg::kOutTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[m][n][e] = 0.f;
    }
    row_max[m][0] = row_max[m][1] = -kInfinity;
    row_sum[m][0] = row_sum[m][1] = 0.f;
  }
}

}  // namespace jitattn
