// FlashAttention-2 style forward prefill for sm_80 and newer (mma.sync).
//
// One CTA computes BLOCK_Q query rows of one (batch, head). Each warp owns
// BLOCK_Q / WARPS consecutive rows (whole 16-row MMA tiles), so the softmax
// statistics of a row never leave the four lanes that hold it. The main loop
// walks the key blocks from last to first: with a causal mask the blocks that
// need masking come first, and the rest run the unmasked path.
#pragma once

#include "fwd_params.h"
#include "ptx.cuh"

namespace jitattn {

template <class Element_, int HEAD_DIM, int BLOCK_Q, int BLOCK_KV, int WARPS, bool CAUSAL>
struct FwdConfig {
  using Element = Element_;
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kBlockQ = BLOCK_Q;
  static constexpr int kBlockKV = BLOCK_KV;
  static constexpr int kWarps = WARPS;
  static constexpr int kThreads = WARPS * 32;
  static constexpr bool kCausal = CAUSAL;

  static constexpr int kRowsPerWarp = BLOCK_Q / WARPS;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // 16-row MMA tiles per warp
  static constexpr int kScoreTiles = BLOCK_KV / 8;   // 8-column accumulator tiles of S
  static constexpr int kOutTiles = HEAD_DIM / 8;     // 8-column accumulator tiles of O
  static constexpr int kChunksPerRow = HEAD_DIM / 8; // 16-byte chunks per row

  static constexpr int kSmemQ = BLOCK_Q * HEAD_DIM;  // elements
  static constexpr int kSmemK = BLOCK_KV * HEAD_DIM;
  static constexpr int kSmemV = BLOCK_KV * HEAD_DIM;
  static constexpr int kSmemBytes = (kSmemQ + kSmemK + kSmemV) * 2;

  // Whether the next K block is requested before this block's softmax (more
  // time to hide its latency, longer register live ranges) or after it.
  // Measured on the H200 (docs/measurements/2026-11-22-kv-order-variants-bf16.json):
  // before wins by 3-4% at head_dim 64, after by 2-3% at 128.
  static constexpr bool kEarlyNextK = HEAD_DIM <= 64;

  static_assert(kRowsPerWarp % 16 == 0, "each warp owns whole 16-row MMA tiles");
  static_assert(BLOCK_KV % 16 == 0 && HEAD_DIM % 16 == 0, "MMA k-steps are 16 wide");
};

// Shared-memory tiles are row-major [rows][HEAD_DIM] of 16-bit values with the
// 16-byte chunks of each row XOR-swizzled by (row % 8). ldmatrix reads the same
// chunk column of 8 consecutive rows, and cp.async writes 8 consecutive chunks
// of one row; the swizzle puts both patterns on 8 distinct bank groups.
//
// Every access below starts at a row ≡ lane (mod 8) and walks in whole 16-row
// steps and even chunk steps, so its byte offset is a per-thread base plus a
// row step, XOR a chunk step: ((2k + c) ^ r) = 2k ^ (c ^ r) for c in {0, 1}.
// Keeping only the base live (instead of one hoisted address per unrolled
// step) is what keeps the register count down.
template <int HEAD_DIM>
__device__ __forceinline__ int swizzled_bytes(int row, int chunk) {
  return row * HEAD_DIM * 2 + ((chunk ^ (row & 7)) << 4);
}

// Copies rows [row0, row0 + ROWS) of a [seqlen, HEAD_DIM] slice into a
// swizzled tile; rows at or past `rows_valid` are zero-filled.
template <class Cfg, int ROWS>
__device__ __forceinline__ void load_tile(unsigned tile, const unsigned short* global,
                                          long long row_stride, int row0, int rows_valid) {
  constexpr int kRowsPerPass = Cfg::kThreads / Cfg::kChunksPerRow;
  static_assert(Cfg::kThreads % Cfg::kChunksPerRow == 0 && kRowsPerPass % 8 == 0 && ROWS % kRowsPerPass == 0,
                "each thread copies one fixed chunk column in whole 8-row steps");
  const int row = threadIdx.x / Cfg::kChunksPerRow;
  const int chunk = threadIdx.x % Cfg::kChunksPerRow;
  const unsigned destination = tile + swizzled_bytes<Cfg::kHeadDim>(row, chunk);
  // One pointer walked by a fixed step, and one row count compared against
  // constants: precomputing a 64-bit address per pass costs registers the
  // main loop needs.
  const unsigned short* source = global + (row0 + row) * row_stride + chunk * 8;
  const long long step = kRowsPerPass * row_stride;
  const int rows_left = rows_valid - row0 - row;
#pragma unroll
  for (int pass = 0; pass < ROWS / kRowsPerPass; ++pass) {
    const bool valid = pass * kRowsPerPass < rows_left;
    cp_async_16(destination + pass * kRowsPerPass * Cfg::kHeadDim * 2, valid ? source : global, valid);
    source += step;
  }
}

// S = Q Kᵀ for this warp's rows: Q [rows][HEAD_DIM] and K [BLOCK_KV][HEAD_DIM]
// both in shared memory. K's rows are the MMA's columns, so its non-transposed
// 8×8 blocks are exactly the column-major B fragments.
template <class Cfg>
__device__ __forceinline__ void gemm_qk(float (&s)[Cfg::kMTiles][Cfg::kScoreTiles][4], unsigned q_tile,
                                        unsigned k_tile, int warp_row0, int lane) {
  constexpr int kRowBytes = Cfg::kHeadDim * 2;
  // ldmatrix lanes: Q matrices are (rows 0-7 | 8-15) × (k 0-7 | 8-15); K matrices
  // are (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15).
  const unsigned q_base = q_tile + swizzled_bytes<Cfg::kHeadDim>(warp_row0 + (lane & 15), lane >> 4);
  const unsigned k_base = k_tile + swizzled_bytes<Cfg::kHeadDim>((lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);
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
    for (int m = 0; m < Cfg::kMTiles; ++m) {
      ldmatrix_x4(a[m], (q_base + m * 16 * kRowBytes) ^ (ks * 32));
    }
#pragma unroll
    for (int pair = 0; pair < Cfg::kScoreTiles / 2; ++pair) {
      unsigned b[4];
      ldmatrix_x4(b, (k_base + pair * 16 * kRowBytes) ^ (ks * 32));
#pragma unroll
      for (int m = 0; m < Cfg::kMTiles; ++m) {
        mma_m16n8k16<typename Cfg::Element>(s[m][2 * pair], a[m], b[0], b[1]);
        mma_m16n8k16<typename Cfg::Element>(s[m][2 * pair + 1], a[m], b[2], b[3]);
      }
    }
  }
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
// ldmatrix's transpose.
template <class Cfg>
__device__ __forceinline__ void gemm_pv(float (&o)[Cfg::kMTiles][Cfg::kOutTiles][4],
                                        const unsigned (&a)[Cfg::kMTiles][Cfg::kBlockKV / 16][4],
                                        unsigned v_tile, int lane) {
  constexpr int kRowBytes = Cfg::kHeadDim * 2;
  // Matrices: (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15).
  const unsigned v_base = v_tile + swizzled_bytes<Cfg::kHeadDim>(lane & 15, lane >> 4);
#pragma unroll
  for (int ks = 0; ks < Cfg::kBlockKV / 16; ++ks) {
#pragma unroll
    for (int pair = 0; pair < Cfg::kOutTiles / 2; ++pair) {
      unsigned b[4];
      ldmatrix_x4_trans(b, (v_base + ks * 16 * kRowBytes) ^ (pair * 32));
#pragma unroll
      for (int m = 0; m < Cfg::kMTiles; ++m) {
        mma_m16n8k16<typename Cfg::Element>(o[m][2 * pair], a[m][ks], b[0], b[1]);
        mma_m16n8k16<typename Cfg::Element>(o[m][2 * pair + 1], a[m][ks], b[2], b[3]);
      }
    }
  }
}

// Sets scores of keys outside [0, seqlen_k) and, when causal, of keys after the
// query's bottom-right-aligned diagonal to -inf. Accumulator element e of tile
// n sits at row lane/4 (+8 for e >= 2) and column n*8 + 2*(lane%4) + (e & 1).
template <class Cfg>
__device__ __forceinline__ void apply_mask(float (&s)[Cfg::kMTiles][Cfg::kScoreTiles][4],
                                           int first_row, int first_key, int seqlen_k,
                                           int diagonal_offset, int lane) {
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int n = 0; n < Cfg::kScoreTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = first_row + m * 16 + (lane >> 2) + (e >> 1) * 8;
        const int key = first_key + n * 8 + (lane & 3) * 2 + (e & 1);
        bool visible = key < seqlen_k;
        if constexpr (Cfg::kCausal) visible = visible && key <= row + diagonal_offset;
        if (!visible) s[m][n][e] = -kInfinity;
      }
    }
  }
}

// Online softmax step: folds this block's scores into the running row maxima
// and sums, rescales the output accumulators, and turns s into probabilities
// exp2(s·scale_log2 − max·scale_log2). Sums stay per-lane partial until the
// epilogue, since every rescale factor is uniform across a row's four lanes.
template <class Cfg>
__device__ __forceinline__ void online_softmax(float (&s)[Cfg::kMTiles][Cfg::kScoreTiles][4],
                                               float (&o)[Cfg::kMTiles][Cfg::kOutTiles][4],
                                               float (&row_max)[Cfg::kMTiles][2],
                                               float (&row_sum)[Cfg::kMTiles][2], float scale_log2) {
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float block_max = row_max[m][half];
#pragma unroll
      for (int n = 0; n < Cfg::kScoreTiles; ++n) {
        block_max = fmaxf(block_max, fmaxf(s[m][n][2 * half], s[m][n][2 * half + 1]));
      }
      block_max = quad_max(block_max);
      // A row with no visible key so far keeps max = -inf; subtracting 0
      // instead keeps exp2 at 0 rather than NaN (-inf - -inf).
      const float max_scaled = block_max == -kInfinity ? 0.f : block_max * scale_log2;
      const float correction = fast_exp2(row_max[m][half] * scale_log2 - max_scaled);
      row_max[m][half] = block_max;
      row_sum[m][half] *= correction;
#pragma unroll
      for (int n = 0; n < Cfg::kOutTiles; ++n) {
        o[m][n][2 * half] *= correction;
        o[m][n][2 * half + 1] *= correction;
      }
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < Cfg::kScoreTiles; ++n) {
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          s[m][n][e] = fast_exp2(s[m][n][e] * scale_log2 - max_scaled);
          sum += s[m][n][e];
        }
      }
      row_sum[m][half] += sum;
    }
  }
}

// Normalizes O, writes it (through this warp's rows of the Q tile, so global
// stores are full 16-byte chunks) and the log-sum-exp. A row that saw no key
// has sum 0 and writes 0 and lse = -inf.
template <class Cfg>
__device__ __forceinline__ void store_output(float (&o)[Cfg::kMTiles][Cfg::kOutTiles][4],
                                             const float (&row_max)[Cfg::kMTiles][2],
                                             const float (&row_sum)[Cfg::kMTiles][2],
                                             unsigned char* staging, unsigned short* out,
                                             long long out_row_stride, float* lse,
                                             long long lse_row_stride, int q0, int warp_row0,
                                             int seqlen_q, float scale, int lane) {
  using Element = typename Cfg::Element;
#pragma unroll
  for (int m = 0; m < Cfg::kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = quad_sum(row_sum[m][half]);
      const float inverse = sum > 0.f ? 1.f / sum : 0.f;
      const int row = warp_row0 + m * 16 + (lane >> 2) + half * 8;
#pragma unroll
      for (int n = 0; n < Cfg::kOutTiles; ++n) {
        *reinterpret_cast<unsigned*>(staging + swizzled_bytes<Cfg::kHeadDim>(row, n) + (lane & 3) * 4) =
            pack2<Element>(o[m][n][2 * half] * inverse, o[m][n][2 * half + 1] * inverse);
      }
      if (lse != nullptr && (lane & 3) == 0 && q0 + row < seqlen_q) {
        // Natural log: max·scale + ln(sum).
        lse[(q0 + row) * lse_row_stride] =
            sum > 0.f ? row_max[m][half] * scale + fast_log2(sum) * 0.69314718055994531f : -kInfinity;
      }
    }
  }
  __syncwarp();
  constexpr int kChunks = Cfg::kRowsPerWarp * Cfg::kChunksPerRow;
#pragma unroll
  for (int i = 0; i < kChunks / 32; ++i) {
    const int chunk = i * 32 + lane;
    const int row = warp_row0 + chunk / Cfg::kChunksPerRow;
    const int col = (chunk % Cfg::kChunksPerRow) * 8;
    if (q0 + row < seqlen_q) {
      const uint4 value = *reinterpret_cast<const uint4*>(staging + swizzled_bytes<Cfg::kHeadDim>(row, col / 8));
      *reinterpret_cast<uint4*>(out + (q0 + row) * out_row_stride + col) = value;
    }
  }
}

// V has landed, and every warp is done with K, so the next K block may stream
// in while P V (and, with kEarlyNextK, the softmax) runs.
template <class Cfg>
__device__ __forceinline__ void wait_v_then_load_next_k(unsigned k_tile, const unsigned short* k, long long row_stride,
                                                        int block, int key0, int seqlen_k) {
  cp_async_wait<0>();
  __syncthreads();
  if (block > 0) load_tile<Cfg, Cfg::kBlockKV>(k_tile, k, row_stride, key0 - Cfg::kBlockKV, seqlen_k);
  cp_async_commit();
}

template <class Cfg>
__device__ void fwd_prefill(const FwdParams& p) {
  // 1 KB alignment: the address XOR steps (at most bit 7) must not carry into
  // the tile base.
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  // Shared-window addresses (32-bit) of the three tiles; Q's rows are reused
  // to stage the output.
  const unsigned q_tile = smem_u32(shared_bytes);
  const unsigned k_tile = q_tile + Cfg::kSmemQ * 2;
  const unsigned v_tile = k_tile + Cfg::kSmemK * 2;

  // Flattened grid: query blocks of one (batch, head) are adjacent, so CTAs
  // that read the same K/V run together and share it in L2.
  // Causal: a head's last query blocks see the most keys; running them first
  // leaves the light blocks for the tail of the grid.
  const int q_block = Cfg::kCausal ? p.num_q_blocks - 1 - static_cast<int>(blockIdx.x % p.num_q_blocks)
                                   : static_cast<int>(blockIdx.x % p.num_q_blocks);
  const int batch_head = blockIdx.x / p.num_q_blocks;
  const int head = batch_head % p.heads_q;
  const int batch = batch_head / p.heads_q;
  const int kv_head = head / p.heads_per_kv;
  const int q0 = q_block * Cfg::kBlockQ;
  const int lane = threadIdx.x & 31;
  const int warp_row0 = (threadIdx.x >> 5) * Cfg::kRowsPerWarp;

  const unsigned short* q = static_cast<const unsigned short*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const unsigned short* k = static_cast<const unsigned short*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
  const unsigned short* v = static_cast<const unsigned short*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
  unsigned short* out = static_cast<unsigned short*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride;
  float* lse = p.lse == nullptr ? nullptr : p.lse + batch * p.lse_batch_stride + head * p.lse_head_stride;

  // Query i sees keys j <= i + diagonal_offset (bottom-right alignment), so
  // this block's last row bounds the keys worth loading.
  const int diagonal_offset = p.seqlen_k - p.seqlen_q;
  int kv_end = p.seqlen_k;
  if constexpr (Cfg::kCausal) kv_end = min(kv_end, q0 + Cfg::kBlockQ + diagonal_offset);
  const int num_kv_blocks = kv_end > 0 ? (kv_end + Cfg::kBlockKV - 1) / Cfg::kBlockKV : 0;

  load_tile<Cfg, Cfg::kBlockQ>(q_tile, q, p.q_row_stride, q0, p.seqlen_q);
  if (num_kv_blocks > 0) {
    load_tile<Cfg, Cfg::kBlockKV>(k_tile, k, p.k_row_stride, (num_kv_blocks - 1) * Cfg::kBlockKV, p.seqlen_k);
  }
  cp_async_commit();

  float o[Cfg::kMTiles][Cfg::kOutTiles][4];
  float row_max[Cfg::kMTiles][2];
  float row_sum[Cfg::kMTiles][2];
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

  for (int block = num_kv_blocks - 1; block >= 0; --block) {
    const int key0 = block * Cfg::kBlockKV;
    // This barrier has two jobs: K (and, first time, Q) has landed for every
    // thread, and every warp has finished reading V of the previous block, so
    // V may be overwritten.
    cp_async_wait<0>();
    __syncthreads();
    load_tile<Cfg, Cfg::kBlockKV>(v_tile, v, p.v_row_stride, key0, p.seqlen_k);
    cp_async_commit();

    float s[Cfg::kMTiles][Cfg::kScoreTiles][4];
    gemm_qk<Cfg>(s, opaque(q_tile), opaque(k_tile), warp_row0, lane);
    const bool past_end = key0 + Cfg::kBlockKV > p.seqlen_k;
    const bool crosses_diagonal = Cfg::kCausal && key0 + Cfg::kBlockKV - 1 > q0 + diagonal_offset;
    if (past_end || crosses_diagonal) {
      apply_mask<Cfg>(s, q0 + warp_row0, key0, p.seqlen_k, diagonal_offset, lane);
    }

    if constexpr (Cfg::kEarlyNextK) {
      wait_v_then_load_next_k<Cfg>(k_tile, k, p.k_row_stride, block, key0, p.seqlen_k);
      online_softmax<Cfg>(s, o, row_max, row_sum, p.scale_log2);
    } else {
      online_softmax<Cfg>(s, o, row_max, row_sum, p.scale_log2);
      wait_v_then_load_next_k<Cfg>(k_tile, k, p.k_row_stride, block, key0, p.seqlen_k);
    }
    unsigned probabilities[Cfg::kMTiles][Cfg::kBlockKV / 16][4];
    pack_probabilities<Cfg>(probabilities, s);
    gemm_pv<Cfg>(o, probabilities, opaque(v_tile), lane);
  }

  // With no key block at all the Q copy (issued by every warp, to every row)
  // was never waited for: it must land before rows are reused for staging.
  cp_async_wait<0>();
  __syncthreads();
  store_output<Cfg>(o, row_max, row_sum, shared_bytes, out, p.o_row_stride, lse, p.lse_row_stride, q0,
                    warp_row0, p.seqlen_q, p.scale, lane);
}

}  // namespace jitattn
