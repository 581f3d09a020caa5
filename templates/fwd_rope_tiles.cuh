// Fused RoPE on shared-memory tiles: K blocks rotated by the producer
// (stepped angles where they fit its registers), Q tiles rotated once, and
// the positions of a sequence's first key and query. The arithmetic is in
// rope.cuh. Part of fwd_prefill.cuh.
#pragma once

#include "fwd_io.cuh"

namespace jitattn {

// Applies RoPE to rows [first_row, first_row + ROWS) of a swizzled tile of
// TILE_ROWS rows, shared by THREADS threads of which this is `thread`;
// position_of(row) is tile row `row`'s position; PACKED: packed 16-bit
// arithmetic (rope.cuh); `tables`: where 16-bit table words come from
// (rotate_rows).
template <class Cfg, int ROWS, int TILE_ROWS, int THREADS, bool PACKED, typename PositionOf,
          class Tables = TablesInGlobal>
__device__ __forceinline__ void rotate_tile(unsigned char* tile, const FwdParams& p, PositionOf&& position_of,
                                            int first_row, int thread, const Tables& tables = Tables{}) {
  // Units whose table loads are in flight together (rotate_rows): 16-bit
  // tables at head dims up to 64 keep four (a quarter of their registers);
  // at 128 four were 5-15% slower, as they were with f32 tables at 64 (H200,
  // docs/PERFORMANCE.md).
  constexpr int kTableUnitsInFlight = Cfg::kWgmma && Cfg::kHeadDim > 128       ? 1
                                      : Cfg::kRopeTableBytes == 2 && Cfg::kHeadDim <= 64 ? 4
                                                                                         : 2;
  rotate_rows<typename Cfg::Element, Cfg::kRope, Cfg::kRotaryDim, Cfg::kRopeTableBytes, Cfg::kRopeScaled, ROWS, THREADS,
              PACKED, kTableUnitsInFlight>(
      p,
      [&](int row, int chunk) {
        return reinterpret_cast<uint4*>(tile + swizzled_bytes<Cfg, TILE_ROWS>(first_row + row, chunk));
      },
      [&](int row) { return position_of(first_row + row); }, thread, tables);
}

// The same for rows at consecutive positions (a K tile; a Q tile whose rows
// are consecutive queries), tile row first_row at position0: stepped angles
// in pieces of WORDS words (rotate_consecutive_rows) where the units split
// evenly over the threads, else one angle per row.
template <class Cfg, int ROWS, int TILE_ROWS, int THREADS, int WORDS, bool SPREAD_RUNS, bool PACKED>
__device__ __forceinline__ void rotate_consecutive_tile(unsigned char* tile, const FwdParams& p, int position0,
                                                        int first_row, int thread) {
  if constexpr (Cfg::kRopeTables || !RunLayout<Cfg::kRope, Cfg::kRotaryDim, ROWS, THREADS, WORDS>::kWhole) {
    rotate_tile<Cfg, ROWS, TILE_ROWS, THREADS, PACKED>(tile, p, [&](int row) { return position0 - first_row + row; },
                                                       first_row, thread);
  } else {
    using Piece = typename RowPiece<WORDS>::type;
    rotate_consecutive_rows<typename Cfg::Element, Cfg::kRope, Cfg::kRotaryDim, Cfg::kRopeScaled, ROWS, THREADS, WORDS,
                            SPREAD_RUNS, PACKED>(
        p,
        [&](int row, int unit) {
          // Units of 4 or 8 bytes are pieces of the swizzled 16-byte chunks.
          constexpr int kPerChunk = 4 / WORDS;
          return reinterpret_cast<Piece*>(tile + swizzled_bytes<Cfg, TILE_ROWS>(first_row + row, unit / kPerChunk)) +
                 unit % kPerChunk;
        },
        position0, thread);
  }
}

// Rotates a K tile of the 4-warp kernel (every thread, 16-byte pieces), in
// packed 16-bit arithmetic (rope.cuh: every K block is rotated once per query
// tile, which is what fused RoPE costs).
template <class Cfg>
__device__ __forceinline__ void rotate_k_tile(unsigned char* k_tile, const FwdParams& p, int position0) {
  rotate_consecutive_tile<Cfg, Cfg::kBlockKV, Cfg::kBlockKV, Cfg::kLoadThreads, 4, /*SPREAD_RUNS=*/false,
                          /*PACKED=*/true>(k_tile, p, position0, 0, threadIdx.x % Cfg::kLoadThreads);
}

// The producer warpgroup's rotation of its K blocks (from the last down), in
// packed 16-bit arithmetic. Pieces, measured on the H200 with packed
// arithmetic (docs/PERFORMANCE.md):
//   - wgmma (88 registers): 16-byte pieces where a thread's runs are then at
//     least 8 rows (rotary_dim 128 with 128-key tiles: 0-5% faster than 4-byte
//     pieces at head_dim 128); 8-byte pieces spill there;
//   - else 4-byte pieces: 16-byte ones leave runs of 4 rows (rotary_dim 64, or
//     64-key tiles), whose two sincos per pair and run cost more than they
//     save (1-6% slower at head_dim 64; 8 bytes of spills with ALiBi);
//   - the mma.sync producer (56 or 40 registers): 4-byte pieces (wider ones
//     spill).
// 16-byte pieces keep their angles from block to block (SteppedKeyRotation):
// RoPE prefill 1-3.5% faster at head_dim 128 from N 2048. With 4-byte pieces
// the same was 2-5% slower at head_dim 64 although its SASS has no more
// instructions a block (not understood), so those evaluate sincos per block
// and run (rotate_consecutive_rows), as before.
//
// Above head_dim 128 the producer is left 40-56 registers
// (FwdConfig::kProducerRegisters): each thread steps the angles of two pairs
// (4-byte pieces of rotate-half, 8-byte ones interleaved) down runs of rows
// that split the block evenly, and threads past them idle (rotary dims such
// as 192 do not split 128 threads evenly).
template <class Cfg>
struct ProducerKeyPieces {
  static constexpr bool kNarrowRegisters = Cfg::kWgmma && Cfg::kHeadDim > 128;
  static constexpr bool kLongWideRuns =
      RunLayout<Cfg::kRope, Cfg::kRotaryDim, Cfg::kBlockKV, Cfg::kProducerThreads, 4>::kRun >= 8;
  static constexpr int kWords = kNarrowRegisters ? (Cfg::kRope == kRopeHalf ? 1 : 2)
                                : Cfg::kWgmma && kLongWideRuns ? 4
                                                               : 1;
  using Layout = RunLayout<Cfg::kRope, Cfg::kRotaryDim, Cfg::kBlockKV, Cfg::kProducerThreads, kWords, kNarrowRegisters>;
  static constexpr bool kStepped =
      Cfg::kRotateKeys && !Cfg::kRopeTables && Layout::kWhole && (kWords == 4 || kNarrowRegisters);
};

template <class Cfg, bool STEPPED = ProducerKeyPieces<Cfg>::kStepped>
struct ProducerKeyRotation {
  __device__ __forceinline__ ProducerKeyRotation(const FwdParams&, int) {}
  // Rotates the K tile whose row 0 is at position0 (the tile_index-th
  // rotated); with its table rows staged at `table_slot` where that is not
  // null (FwdConfig::kStagedTables).
  __device__ __forceinline__ void rotate(unsigned char* k_tile, const FwdParams& p, int position0, int,
                                         const unsigned char* table_slot = nullptr) {
    if constexpr (Cfg::kStagedTables) {
      if (table_slot != nullptr) {
        rotate_tile<Cfg, Cfg::kBlockKV, Cfg::kBlockKV, Cfg::kProducerThreads, /*PACKED=*/true>(
            k_tile, p, [&](int row) { return position0 + row; }, 0, threadIdx.x % Cfg::kProducerThreads,
            TablesInShared<Cfg::kTableRowBytes, Cfg::kBlockKV>{table_slot});
        return;
      }
    }
    rotate_consecutive_tile<Cfg, Cfg::kBlockKV, Cfg::kBlockKV, Cfg::kProducerThreads, ProducerKeyPieces<Cfg>::kWords,
                            /*SPREAD_RUNS=*/true, /*PACKED=*/true>(k_tile, p, position0, 0,
                                                                   threadIdx.x % Cfg::kProducerThreads);
  }
};

template <class Cfg>
struct ProducerKeyRotation<Cfg, true> {
  using Pieces = ProducerKeyPieces<Cfg>;
  SteppedKeyRotation<typename Cfg::Element, Cfg::kRope, Cfg::kRotaryDim, Cfg::kRopeScaled, Cfg::kBlockKV,
                     Cfg::kProducerThreads, Pieces::kWords, Pieces::kNarrowRegisters>
      stepped;
  __device__ __forceinline__ ProducerKeyRotation(const FwdParams& p, int thread) : stepped(p, thread) {}
  __device__ __forceinline__ void rotate(unsigned char* k_tile, const FwdParams& p, int position0, int tile_index,
                                         const unsigned char* = nullptr) {
    if constexpr (Pieces::kNarrowRegisters) {
      constexpr int kPerChunk = 4 / Pieces::kWords;  // pieces of a swizzled 16-byte chunk
      stepped.template rotate_swizzled<Cfg::kRowStride>(
          p, k_tile,
          [&](int row, int unit) {
            return swizzled_bytes<Cfg, Cfg::kBlockKV>(row, unit / kPerChunk) + unit % kPerChunk * 4 * Pieces::kWords;
          },
          position0, tile_index);
    } else {
      stepped.rotate(
          p,
          [&](int row, int unit) {
            return reinterpret_cast<uint4*>(k_tile + swizzled_bytes<Cfg, Cfg::kBlockKV>(row, unit));
          },
          position0, tile_index);
    }
  }
};

// RoPE positions of a sequence's first key and first query: keys from their
// offset, queries from theirs or aligned to the keys' end (the causal
// diagonal).
__device__ __forceinline__ void rope_positions(const FwdParams& p, int batch, int diagonal_offset, int& key_position0,
                                               int& query_position0) {
  key_position0 = p.rope_k_offsets != nullptr ? p.rope_k_offsets[batch] : 0;
  query_position0 = p.rope_q_offsets != nullptr ? p.rope_q_offsets[batch] : key_position0 + diagonal_offset;
}

// Rotates rows [first_row, first_row + ROWS) of this CTA's Q tile in shared
// memory, shared by THREADS threads of which this is `thread`, in pieces of
// WORDS words (rotate_consecutive_rows).
template <class Cfg, int ROWS, int THREADS, int WORDS>
__device__ __forceinline__ void rotate_q_rows(unsigned char* q_tile, const FwdParams& p, int query_position0, int q0,
                                              int group, int first_row, int thread) {
  if constexpr (Cfg::kPackGqa) {
    // Packed rows cycle through the group's heads: positions repeat.
    rotate_tile<Cfg, ROWS, Cfg::kBlockQ, THREADS, /*PACKED=*/false>(
        q_tile, p, [&](int row) { return query_position0 + query_position<Cfg>(q0 + row, group); }, first_row, thread);
  } else {
    rotate_consecutive_tile<Cfg, ROWS, Cfg::kBlockQ, THREADS, WORDS, /*SPREAD_RUNS=*/WORDS == 1, /*PACKED=*/false>(
        q_tile, p, query_position0 + q0 + first_row, first_row, thread);
  }
}

// Q of a wgmma warpgroup taken into registers and rotated there, for S = Q Kᵀ
// with A from registers (wgmma_rs_k_major): no rotated Q is stored back, so
// no store, proxy fence or warpgroup barrier stands between Q's landing and
// the first S = Q Kᵀ. Head dims up to 64 (one 128-byte row, where the wgmma
// and mma.sync layouts coincide: the fragments load as mma.sync's do), 16
// registers a thread. Rotate-half needs rotary_dim a multiple of 32 (a pair's
// partner is then k-step rotary_dim / 32 further, in the same thread and
// register); interleaved pairs are the two halves of one register. At head
// dim 64 this took the RoPE kernel's time at 32 × 512 from 1.28× plain to
// 1.24× (H200, docs/PERFORMANCE.md). Everything else keeps the shared-memory
// rotation (rotate_q_rows), three-warpgroup tiles included: at 128 registers
// a thread they spilled with Q held and ptxas serialized their wgmma. At
// head dim 128 Q's 32 registers need the MMA warps at 224, which leaves the
// producer 56: K's rotation then ran RoPE 7-18% slower (H200, same file).
template <class Cfg>
struct QRegisters {
  static constexpr bool kUsed = Cfg::kWgmma && Cfg::kRope != kRopeNone && Cfg::kHeadDim <= 64 &&
                                Cfg::kHeadDim % 16 == 0 && Cfg::kConsumerGroups <= 2 &&
                                (Cfg::kRope == kRopeInterleaved || Cfg::kRotaryDim % 32 == 0) &&
                                wgmma_picks_width(Cfg::kBlockKV);
  static constexpr int kSteps = kUsed ? Cfg::kHeadDim / 16 : 1;
  unsigned a[kSteps][4];  // k-step ks: the m16n8k16 A fragment of columns 16ks..16ks+15

  // Loads this warp's 16 rows (tile rows warp_row0..+15) from the swizzled Q
  // tile and rotates them; position_of(tile row) is the row's position.
  template <typename PositionOf>
  __device__ __forceinline__ void load_rotated(unsigned q_tile, const FwdParams& p, int warp_row0, int lane,
                                               PositionOf&& position_of) {
    using Element = typename Cfg::Element;
    const QTileFragments<Cfg> fragment_of(q_tile, warp_row0, lane);
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) fragment_of(0, ks, a[ks]);
    // Fragment register j: row (lane / 4) + 8 (j & 1), columns 2 (lane % 4) + 8 (j / 2) and the next.
    const int positions[2] = {position_of(warp_row0 + (lane >> 2)), position_of(warp_row0 + (lane >> 2) + 8)};
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int column = ks * 16 + 2 * (lane & 3) + 8 * (j >> 1);
        if constexpr (Cfg::kRope == kRopeHalf) {
          constexpr int kHalfSteps = Cfg::kRotaryDim / 32;  // k-steps of the first half
          if (ks < kHalfSteps) {
            float s0, c0, s1, c1;
            rope_angle<Cfg::kRopeTableBytes, Cfg::kRopeScaled, Element>(p, positions[j & 1], column, s0, c0);
            rope_angle<Cfg::kRopeTableBytes, Cfg::kRopeScaled, Element>(p, positions[j & 1], column + 1, s1, c1);
            rotate_half_words<Element, false>(a[ks][j], a[ks + kHalfSteps][j], s0, c0, s1, c1);
          }
        } else if (column < Cfg::kRotaryDim) {
          float sine, cosine;
          rope_angle<Cfg::kRopeTableBytes, Cfg::kRopeScaled, Element>(p, positions[j & 1], column / 2, sine, cosine);
          a[ks][j] = rotate_interleaved<Element, false>(a[ks][j], sine, cosine);
        }
      }
    }
  }
};

}  // namespace jitattn
