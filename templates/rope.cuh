// Rotary position embedding (RoPE) applied to 16-bit tiles in shared memory,
// so rotated q and k never travel through global memory.
//
// Rotate-half (GPT-NeoX, Llama) pairs channel p with p + rotary_dim / 2;
// interleaved (GPT-J) pairs 2p with 2p + 1. A pair (x, y) at angle a becomes
// (x·cos a − y·sin a, y·cos a + x·sin a); channels at or past rotary_dim are
// left alone. Angles are always fp32. The rotation itself comes in two
// precisions (template parameter PACKED):
//   - fp32 arithmetic, the result rounded once to 16 bits (q everywhere, and
//     the KV-cache append, which writes rotated keys to memory);
//   - packed 16-bit arithmetic (PACKED: K tiles of the prefill kernels): cos
//     and sin rounded to the element type, y·sin rounded, then one fused
//     x·cos + (that) rounded: up to about two more 16-bit roundings of error
//     per value than fp32, as in frameworks' 16-bit rotary code, for 7
//     instructions per two rotate-half pairs instead of 14 (unpacking, 8 fp32
//     products, packing). Every K block is rotated once per query tile,
//     which makes it the cost of fused RoPE (docs/PERFORMANCE.md).
#pragma once

#include "fwd_params.h"
#include "ptx.cuh"

namespace jitattn {

enum RopeStyle : int {
  kRopeNone = 0,
  kRopeHalf = 1,         // pairs (p, p + rotary_dim / 2)
  kRopeInterleaved = 2,  // pairs (2p, 2p + 1)
};

// cos and sin of pair `pair` at `position`. Params: FwdParams or
// AppendParams (both carry rope_inv_freq and the table fields).
template <bool TABLES, class Params>
__device__ __forceinline__ void rope_angle(const Params& p, int position, int pair, float& sine, float& cosine) {
  if constexpr (TABLES) {
    // Positions outside the tables are a caller error the kernel cannot
    // report; clamping keeps the reads inside the tables.
    const long long row = min(max(position, 0), p.rope_table_rows - 1);
    cosine = __ldg(p.rope_cos + row * p.rope_table_stride + pair);
    sine = __ldg(p.rope_sin + row * p.rope_table_stride + pair);
  } else {
    // The fp32 product, as frameworks build their angle tables.
    sincos_reduced(static_cast<float>(position) * p.rope_inv_freq[pair], sine, cosine);
  }
}

// Rotate-half in packed 16-bit arithmetic: lane l of x and of y form a pair
// at the angle whose cos and sin are lane l of `cosine` and `sine`.
template <class Element>
__device__ __forceinline__ void rotate_half_packed(unsigned& x, unsigned& y, unsigned cosine, unsigned sine) {
  const unsigned x_in = x;
  x = fma2<Element>(x_in, cosine, mul2<Element>(y, sine ^ 0x80008000u));  // x·cos − y·sin
  y = fma2<Element>(y, cosine, mul2<Element>(x_in, sine));                 // y·cos + x·sin
}

// Interleaved: the two halves of one register are a pair.
template <class Element, bool PACKED>
__device__ __forceinline__ unsigned rotate_interleaved(unsigned xy, float sine, float cosine) {
  if constexpr (PACKED) {
    // (x, y)·cos + (y, x)·(−sin, sin).
    const unsigned yx = __byte_perm(xy, 0, 0x1032);
    return fma2<Element>(xy, pack2<Element>(cosine, cosine), mul2<Element>(yx, pack2<Element>(-sine, sine)));
  } else {
    float x, y;
    unpack2<Element>(xy, x, y);
    return pack2<Element>(x * cosine - y * sine, y * cosine + x * sine);
  }
}

// Rotate-half: words x and y hold two pairs (lane l of x with lane l of y) at
// angles 0 and 1.
template <class Element, bool PACKED>
__device__ __forceinline__ void rotate_half_words(unsigned& x, unsigned& y, float s0, float c0, float s1, float c1) {
  if constexpr (PACKED) {
    rotate_half_packed<Element>(x, y, pack2<Element>(c0, c1), pack2<Element>(s0, s1));
  } else {
    float x0, x1, y0, y1;
    unpack2<Element>(x, x0, x1);
    unpack2<Element>(y, y0, y1);
    x = pack2<Element>(x0 * c0 - y0 * s0, x1 * c1 - y1 * s1);
    y = pack2<Element>(y0 * c0 + x0 * s0, y1 * c1 + x1 * s1);
  }
}

template <class Element, bool TABLES, bool PACKED>
__device__ __forceinline__ unsigned rotate_pair(unsigned packed, const FwdParams& p, int position, int pair) {
  float sine, cosine;
  rope_angle<TABLES>(p, position, pair, sine, cosine);
  return rotate_interleaved<Element, PACKED>(packed, sine, cosine);
}

// Rotates rows [0, ROWS) of a tile of 16-bit rows in place, shared by
// THREADS threads of which this is `thread`. The work unit is
// one 16-byte chunk (interleaved) or a chunk and its partner half a rotary
// dim away (rotate-half); `chunk_at(row, chunk)` is the chunk's address and
// `position_of(row)` the row's position. The caller brackets this with
// barriers: the tile must have landed, and readers must wait for the writes.
template <class Element, int STYLE, int ROTARY_DIM, bool TABLES, int ROWS, int THREADS, bool PACKED,
          typename ChunkAt, typename PositionOf>
__device__ __forceinline__ void rotate_rows(const FwdParams& p, ChunkAt&& chunk_at, PositionOf&& position_of,
                                            int thread) {
  static_assert(ROTARY_DIM % 16 == 0, "rotary_dim is a multiple of 16");
  constexpr int kUnitsPerRow = STYLE == kRopeHalf ? ROTARY_DIM / 16 : ROTARY_DIM / 8;
  constexpr int kUnits = ROWS * kUnitsPerRow;
#pragma unroll 1
  for (int index = thread; index < kUnits; index += THREADS) {
    const int row = index / kUnitsPerRow;
    const int unit = index % kUnitsPerRow;
    const int position = position_of(row);
    if constexpr (STYLE == kRopeHalf) {
      uint4* first = chunk_at(row, unit);
      uint4* second = chunk_at(row, unit + ROTARY_DIM / 16);
      uint4 a = *first, b = *second;
      unsigned* av = reinterpret_cast<unsigned*>(&a);
      unsigned* bv = reinterpret_cast<unsigned*>(&b);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        float s0, c0, s1, c1;
        rope_angle<TABLES>(p, position, unit * 8 + 2 * w, s0, c0);
        rope_angle<TABLES>(p, position, unit * 8 + 2 * w + 1, s1, c1);
        rotate_half_words<Element, PACKED>(av[w], bv[w], s0, c0, s1, c1);
      }
      *first = a;
      *second = b;
    } else {
      uint4* chunk = chunk_at(row, unit);
      uint4 a = *chunk;
      a.x = rotate_pair<Element, TABLES, PACKED>(a.x, p, position, unit * 4);
      a.y = rotate_pair<Element, TABLES, PACKED>(a.y, p, position, unit * 4 + 1);
      a.z = rotate_pair<Element, TABLES, PACKED>(a.z, p, position, unit * 4 + 2);
      a.w = rotate_pair<Element, TABLES, PACKED>(a.w, p, position, unit * 4 + 3);
      *chunk = a;
    }
  }
}

// A piece of a row: WORDS 32-bit words (2 · WORDS 16-bit values).
template <int WORDS>
struct RowPiece;
template <>
struct RowPiece<4> {
  using type = uint4;
};
template <>
struct RowPiece<2> {
  using type = uint2;
};
template <>
struct RowPiece<1> {
  using type = unsigned;
};

// How rotate_consecutive_rows splits ROWS rows over THREADS threads with
// pieces of WORDS words: kUnitsPerRow units a row, kRunners runs a pass of
// kRun rows each; kWhole when every thread's run is whole (else callers
// rotate with one angle per row).
template <int STYLE, int ROTARY_DIM, int ROWS, int THREADS, int WORDS>
struct RunLayout {
  static constexpr int kUnitsPerRow = STYLE == kRopeHalf ? ROTARY_DIM / (4 * WORDS) : ROTARY_DIM / (2 * WORDS);
  static constexpr int kRunners = THREADS / kUnitsPerRow > ROWS ? ROWS : THREADS / kUnitsPerRow;
  static constexpr int kRun = kRunners > 0 ? ROWS / kRunners : 0;
  static constexpr bool kWhole = THREADS % kUnitsPerRow == 0 && kRunners > 0 && ROWS % kRunners == 0;
};

// The same rotation (THREADS threads, this one `thread`) for rows at
// consecutive positions (a K tile, or a Q tile of one head: row r at
// position0 + r) with angles from frequencies, cheaper:
// each thread owns a run of rows of one unit, evaluates sin and cos once at
// the run's first row, and steps the angle from row to row with the
// angle-sum identities (fp32; runs are at most 32 rows, and each step adds
// ~1e-7 of rounding). That is two sincos per pair and run instead of one per
// pair and row. A unit is a piece of WORDS words (and, for rotate-half, its
// partner piece): 16-byte pieces halve the loop overhead, 4- and 8-byte ones
// cut the angle registers (for the producer warpgroup, which runs with few).
// `piece_at(row, unit)` is the piece's address.
//
// SPREAD_RUNS (the producer warpgroup, whose four warps rotate every K tile
// while sharing issue slots with eight MMA warps) changes two things:
//   - run j takes rows base(j), base(j) + R, base(j) + 2R, ... (R runs in a
//     pass, angle step R positions), base(j) bit-reversing j's low three
//     bits: the runs of one warp touch rows 4 (or 2) apart modulo 8, so
//     their swizzled chunks fall in different bank columns;
//   - a thread loads four rows' pieces before rotating and storing them (the
//     compiler cannot move a load above an earlier store to a piece that
//     might alias it; eight rows spill at the producer's 56 registers).
// Measured on the H200 at head_dim 64 (docs/PERFORMANCE.md): both together
// make RoPE prefill 0.7-1.3% faster; the batched loads alone 0.5%, and the
// spread rows alone 2-3% slower.
template <class Element, int STYLE, int ROTARY_DIM, int ROWS, int THREADS, int WORDS, bool SPREAD_RUNS, bool PACKED,
          typename PieceAt>
__device__ __forceinline__ void rotate_consecutive_rows(const FwdParams& p, PieceAt&& piece_at, int position0,
                                                        int thread) {
  using Piece = typename RowPiece<WORDS>::type;
  using Layout = RunLayout<STYLE, ROTARY_DIM, ROWS, THREADS, WORDS>;
  constexpr int kUnitsPerRow = Layout::kUnitsPerRow;
  constexpr int kPairs = STYLE == kRopeHalf ? 2 * WORDS : WORDS;  // pairs per unit
  constexpr int kRunners = Layout::kRunners;  // runs per pass
  constexpr int kRun = Layout::kRun;          // rows per run
  constexpr int kPieces = STYLE == kRopeHalf ? 2 : 1;  // pieces a unit covers in one row
  static_assert(Layout::kWhole, "whole runs");
  const int unit = thread % kUnitsPerRow;
  const int run = thread / kUnitsPerRow;
  if (run >= kRunners) return;
  // Run rows: row0 + r · kRowStep. Spread runs need whole groups of eight
  // runs (row0 keeps j's high bits and reverses its low three); with fewer,
  // SPREAD_RUNS keeps consecutive rows and only batches the loads.
  constexpr bool kSpread = SPREAD_RUNS && kRunners % 8 == 0;
  constexpr int kRowStep = kSpread ? kRunners : 1;
  const int row0 = kSpread ? (run & ~7) | (run & 1) << 2 | (run & 2) | (run & 4) >> 2 : run * kRun;
  float cosine[kPairs], sine[kPairs], step_cosine[kPairs], step_sine[kPairs];
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const float frequency = p.rope_inv_freq[unit * kPairs + i];
    sincos_reduced(static_cast<float>(position0 + row0) * frequency, sine[i], cosine[i]);
    sincos_reduced(static_cast<float>(kRowStep) * frequency, step_sine[i], step_cosine[i]);
  }
  // SPREAD_RUNS loads kBatch rows before rotating any of them.
  constexpr int kBatch = SPREAD_RUNS ? (kRun < 4 ? kRun : 4) : 1;
  static_assert(kRun % kBatch == 0, "whole batches");
  auto at = [&](int r, int piece) { return piece_at(row0 + r * kRowStep, unit + piece * kUnitsPerRow); };
#pragma unroll
  for (int r0 = 0; r0 < kRun; r0 += kBatch) {
    Piece held[kBatch][kPieces];
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
#pragma unroll
      for (int piece = 0; piece < kPieces; ++piece) held[r][piece] = *at(r0 + r, piece);
    }
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      unsigned* av = reinterpret_cast<unsigned*>(&held[r][0]);
      if constexpr (STYLE == kRopeHalf) {
        unsigned* bv = reinterpret_cast<unsigned*>(&held[r][kPieces - 1]);
#pragma unroll
        for (int w = 0; w < WORDS; ++w) {
          rotate_half_words<Element, PACKED>(av[w], bv[w], sine[2 * w], cosine[2 * w], sine[2 * w + 1],
                                             cosine[2 * w + 1]);
        }
      } else {
#pragma unroll
        for (int w = 0; w < WORDS; ++w) av[w] = rotate_interleaved<Element, PACKED>(av[w], sine[w], cosine[w]);
      }
#pragma unroll
      for (int piece = 0; piece < kPieces; ++piece) *at(r0 + r, piece) = held[r][piece];
      if (r0 + r + 1 < kRun) {
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
          const float c = cosine[i] * step_cosine[i] - sine[i] * step_sine[i];
          sine[i] = sine[i] * step_cosine[i] + cosine[i] * step_sine[i];
          cosine[i] = c;
        }
      }
    }
  }
}

}  // namespace jitattn
