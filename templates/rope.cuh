// Rotary position embedding (RoPE) applied to 16-bit tiles in shared memory,
// so rotated q and k never travel through global memory.
//
// Rotate-half (GPT-NeoX, Llama) pairs channel p with p + rotary_dim / 2;
// interleaved (GPT-J) pairs 2p with 2p + 1. A pair (x, y) at angle a becomes
// (x·cos a − y·sin a, y·cos a + x·sin a); channels at or past rotary_dim are
// left alone. Angles are always fp32 (caller tables may hold them in f32 or
// in the element type, widened on load). The rotation itself comes in two
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

// The table row of `position`. Positions outside the tables are a caller
// error the kernel cannot report; clamping keeps the reads inside the tables.
template <class Params>
__device__ __forceinline__ long long table_row(const Params& p, int position) {
  return min(max(position, 0), p.rope_table_rows - 1);
}

// Entry `index` of a cos or sin table whose entries are TABLE_BYTES wide:
// f32 (4), or the element type (2), as FlashAttention takes its tables.
template <int TABLE_BYTES, class Element>
__device__ __forceinline__ float table_entry(const void* table, long long index) {
  static_assert(TABLE_BYTES == 4 || TABLE_BYTES == 2, "f32 or 16-bit table entries");
  if constexpr (TABLE_BYTES == 4) {
    return __ldg(static_cast<const float*>(table) + index);
  } else {
    float value, unused;
    unpack2<Element>(__ldg(static_cast<const unsigned short*>(table) + index), value, unused);
    return value;
  }
}

// SCALED (angles from the frequencies only): cos and sin are multiplied by
// p.rope_attention_factor, YaRN's or LongRoPE's attention factor, as Hugging
// Face and vLLM scale their cos/sin caches; the rotated channels of q and of
// k (and the keys an append writes) come out that much longer. Tables are the caller's
// cos and sin as given, so they are never SCALED.
template <bool SCALED, class Params>
__device__ __forceinline__ void scale_angle(const Params& p, float& sine, float& cosine) {
  if constexpr (SCALED) {
    sine *= p.rope_attention_factor;
    cosine *= p.rope_attention_factor;
  }
}

// cos and sin of pair `pair` at `position`: from the tables (TABLE_BYTES
// wide entries), or from the frequencies (TABLE_BYTES 0; SCALED: scale_angle).
// Params: FwdParams or AppendParams (both carry rope_inv_freq, the attention
// factor and the table fields).
template <int TABLE_BYTES, bool SCALED, class Element, class Params>
__device__ __forceinline__ void rope_angle(const Params& p, int position, int pair, float& sine, float& cosine) {
  static_assert(TABLE_BYTES == 0 || !SCALED, "tables hold the caller's cos and sin as they are");
  if constexpr (TABLE_BYTES != 0) {
    const long long index = table_row(p, position) * p.rope_table_stride + pair;
    cosine = table_entry<TABLE_BYTES, Element>(p.rope_cos, index);
    sine = table_entry<TABLE_BYTES, Element>(p.rope_sin, index);
  } else {
    // The fp32 product, as frameworks build their angle tables.
    sincos_reduced(static_cast<float>(position) * p.rope_inv_freq[pair], sine, cosine);
    scale_angle<SCALED>(p, sine, cosine);
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

// Interleaved in packed 16-bit arithmetic: the pair (x, y) in one register,
// its angle as the 16-bit words (cos, cos) and (−sin, sin).
template <class Element>
__device__ __forceinline__ unsigned rotate_interleaved_packed(unsigned xy, unsigned cosines, unsigned signed_sines) {
  // (x, y)·cos + (y, x)·(−sin, sin).
  const unsigned yx = __byte_perm(xy, 0, 0x1032);
  return fma2<Element>(xy, cosines, mul2<Element>(yx, signed_sines));
}

// Interleaved: the two halves of one register are a pair.
template <class Element, bool PACKED>
__device__ __forceinline__ unsigned rotate_interleaved(unsigned xy, float sine, float cosine) {
  if constexpr (PACKED) {
    return rotate_interleaved_packed<Element>(xy, pack2<Element>(cosine, cosine), pack2<Element>(-sine, sine));
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

// The 16-bit table entries of pairs [pair, pair + 2 · WORDS) at `position`
// (pair a multiple of 4), as stored: lane l of word w is pair pair + 2w + l,
// which is already the operand packed 16-bit arithmetic wants. 16-byte
// loads (8-byte for two words) where the tables allow them.
template <int WORDS>
__device__ __forceinline__ void table_words(const FwdParams& p, int position, int pair, unsigned (&cosine)[WORDS],
                                            unsigned (&sine)[WORDS]) {
  static_assert(WORDS % 2 == 0, "whole 8-byte pieces of a table row");
  const long long index = table_row(p, position) * p.rope_table_stride + pair;
  const unsigned short* cos_row = static_cast<const unsigned short*>(p.rope_cos) + index;
  const unsigned short* sin_row = static_cast<const unsigned short*>(p.rope_sin) + index;
  if (p.rope_table_vectors) {
    if constexpr (WORDS % 4 == 0) {
#pragma unroll
      for (int w = 0; w < WORDS; w += 4) {
        const uint4 c = __ldg(reinterpret_cast<const uint4*>(cos_row + 2 * w));
        const uint4 s = __ldg(reinterpret_cast<const uint4*>(sin_row + 2 * w));
        cosine[w] = c.x, cosine[w + 1] = c.y, cosine[w + 2] = c.z, cosine[w + 3] = c.w;
        sine[w] = s.x, sine[w + 1] = s.y, sine[w + 2] = s.z, sine[w + 3] = s.w;
      }
    } else {
#pragma unroll
      for (int w = 0; w < WORDS; w += 2) {
        const uint2 c = __ldg(reinterpret_cast<const uint2*>(cos_row + 2 * w));
        const uint2 s = __ldg(reinterpret_cast<const uint2*>(sin_row + 2 * w));
        cosine[w] = c.x, cosine[w + 1] = c.y;
        sine[w] = s.x, sine[w + 1] = s.y;
      }
    }
  } else {
#pragma unroll
    for (int w = 0; w < WORDS; ++w) {
      cosine[w] = __ldg(cos_row + 2 * w) | static_cast<unsigned>(__ldg(cos_row + 2 * w + 1)) << 16;
      sine[w] = __ldg(sin_row + 2 * w) | static_cast<unsigned>(__ldg(sin_row + 2 * w + 1)) << 16;
    }
  }
}

// cos and sin of pairs [pair, pair + N) at `position` from the tables (pair
// a multiple of 4), widened to fp32: f32 tables by 16-byte loads where the
// tables allow them, 16-bit ones through table_words. rotate_rows issues
// them for two units at a time. (Read pair by pair, one round trip to L2 per
// unit bounded the producer: tables took about twice the time of angles
// from theta at head_dim 128, docs/PERFORMANCE.md.)
template <int N, int TABLE_BYTES, class Element>
__device__ __forceinline__ void table_angles(const FwdParams& p, int position, int pair, float (&sine)[N],
                                             float (&cosine)[N]) {
  static_assert(N % 4 == 0, "whole 16-byte pieces of a table row");
  if constexpr (TABLE_BYTES == 2) {
    unsigned c[N / 2], s[N / 2];
    table_words<N / 2>(p, position, pair, c, s);
#pragma unroll
    for (int w = 0; w < N / 2; ++w) {
      unpack2<Element>(c[w], cosine[2 * w], cosine[2 * w + 1]);
      unpack2<Element>(s[w], sine[2 * w], sine[2 * w + 1]);
    }
    return;
  }
  const long long index = table_row(p, position) * p.rope_table_stride + pair;
  const float* cos_row = static_cast<const float*>(p.rope_cos) + index;
  const float* sin_row = static_cast<const float*>(p.rope_sin) + index;
  if (p.rope_table_vectors) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 c = __ldg(reinterpret_cast<const float4*>(cos_row + i));
      const float4 s = __ldg(reinterpret_cast<const float4*>(sin_row + i));
      cosine[i] = c.x, cosine[i + 1] = c.y, cosine[i + 2] = c.z, cosine[i + 3] = c.w;
      sine[i] = s.x, sine[i + 1] = s.y, sine[i + 2] = s.z, sine[i + 3] = s.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      cosine[i] = __ldg(cos_row + i);
      sine[i] = __ldg(sin_row + i);
    }
  }
}

// Where rotate_rows reads a row's table entries: as 16-bit words (words,
// as table_words) or widened to fp32 (angles, as table_angles).
// TablesInGlobal from the caller's tables by the row's position;
// TablesInShared from ROW_BYTES-wide rows of TABLE_BYTES-wide entries staged
// in shared memory by tile row, cos rows then sin rows
// (FwdConfig::kStagedTables).
struct TablesInGlobal {
  template <int WORDS>
  __device__ __forceinline__ void words(const FwdParams& p, int, int position, int pair, unsigned (&cosine)[WORDS],
                                        unsigned (&sine)[WORDS]) const {
    table_words<WORDS>(p, position, pair, cosine, sine);
  }
  template <int N, int TABLE_BYTES, class Element>
  __device__ __forceinline__ void angles(const FwdParams& p, int, int position, int pair, float (&sine)[N],
                                         float (&cosine)[N]) const {
    table_angles<N, TABLE_BYTES, Element>(p, position, pair, sine, cosine);
  }
};

template <int ROW_BYTES, int ROWS>
struct TablesInShared {
  const unsigned char* cos_rows;  // ROWS rows; sin's rows follow
  template <int WORDS>
  __device__ __forceinline__ void words(const FwdParams&, int row, int, int pair, unsigned (&cosine)[WORDS],
                                        unsigned (&sine)[WORDS]) const {
    static_assert(WORDS == 4 || WORDS == 2, "one 16- or 8-byte piece of a row");
    const unsigned char* at = cos_rows + row * ROW_BYTES + pair * 2;
    if constexpr (WORDS == 4) {
      const uint4 c = *reinterpret_cast<const uint4*>(at);
      const uint4 s = *reinterpret_cast<const uint4*>(at + ROWS * ROW_BYTES);
      cosine[0] = c.x, cosine[1] = c.y, cosine[2] = c.z, cosine[3] = c.w;
      sine[0] = s.x, sine[1] = s.y, sine[2] = s.z, sine[3] = s.w;
    } else {
      const uint2 c = *reinterpret_cast<const uint2*>(at);
      const uint2 s = *reinterpret_cast<const uint2*>(at + ROWS * ROW_BYTES);
      cosine[0] = c.x, cosine[1] = c.y;
      sine[0] = s.x, sine[1] = s.y;
    }
  }
  // f32 entries: N of them in 16-byte pieces.
  template <int N, int TABLE_BYTES, class Element>
  __device__ __forceinline__ void angles(const FwdParams&, int row, int, int pair, float (&sine)[N],
                                         float (&cosine)[N]) const {
    static_assert(TABLE_BYTES == 4 && N % 4 == 0, "whole 16-byte pieces of f32 entries");
    const unsigned char* at = cos_rows + row * ROW_BYTES + pair * 4;
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 c = *reinterpret_cast<const float4*>(at + 4 * i);
      const float4 s = *reinterpret_cast<const float4*>(at + ROWS * ROW_BYTES + 4 * i);
      cosine[i] = c.x, cosine[i + 1] = c.y, cosine[i + 2] = c.z, cosine[i + 3] = c.w;
      sine[i] = s.x, sine[i + 1] = s.y, sine[i + 2] = s.z, sine[i + 3] = s.w;
    }
  }
};

// One interleaved pair at an angle from the frequencies.
template <class Element, bool PACKED, bool SCALED>
__device__ __forceinline__ unsigned rotate_pair(unsigned packed, const FwdParams& p, int position, int pair) {
  float sine, cosine;
  rope_angle<0, SCALED, Element>(p, position, pair, sine, cosine);
  return rotate_interleaved<Element, PACKED>(packed, sine, cosine);
}

// Rotates rows [0, ROWS) of a tile of 16-bit rows in place, shared by
// THREADS threads of which this is `thread`. The work unit is
// one 16-byte chunk (interleaved) or a chunk and its partner half a rotary
// dim away (rotate-half); `chunk_at(row, chunk)` is the chunk's address and
// `position_of(row)` the row's position; angles from tables whose entries are
// TABLE_BYTES wide (0: from the frequencies, SCALED as in rope_angle), read
// through `tables` (TablesInGlobal, TablesInShared). The caller
// brackets this with barriers: the tile must have landed, and readers must
// wait for the writes.
template <class Element, int STYLE, int ROTARY_DIM, int TABLE_BYTES, bool SCALED, int ROWS, int THREADS, bool PACKED,
          int TABLE_UNITS_IN_FLIGHT = 2, typename ChunkAt, typename PositionOf, class Tables = TablesInGlobal>
__device__ __forceinline__ void rotate_rows(const FwdParams& p, ChunkAt&& chunk_at, PositionOf&& position_of,
                                            int thread, const Tables& tables = Tables{}) {
  static_assert(ROTARY_DIM % 16 == 0, "rotary_dim is a multiple of 16");
  constexpr int kUnitsPerRow = STYLE == kRopeHalf ? ROTARY_DIM / 16 : ROTARY_DIM / 8;
  constexpr int kUnits = ROWS * kUnitsPerRow;
  auto rotate_unit = [&](int index) {
    const int row = index / kUnitsPerRow;
    const int unit = index % kUnitsPerRow;
    const int position = position_of(row);
    if constexpr (STYLE == kRopeHalf) {
      uint4* first = chunk_at(row, unit);
      uint4* second = chunk_at(row, unit + ROTARY_DIM / 16);
      uint4 a = *first, b = *second;
      unsigned* av = reinterpret_cast<unsigned*>(&a);
      unsigned* bv = reinterpret_cast<unsigned*>(&b);
      if constexpr (TABLE_BYTES == 2 && PACKED) {
        // 16-bit entries are the packed operands as stored.
        unsigned c[4], s[4];
        tables.template words<4>(p, row, position, unit * 8, c, s);
#pragma unroll
        for (int w = 0; w < 4; ++w) rotate_half_packed<Element>(av[w], bv[w], c[w], s[w]);
      } else if constexpr (TABLE_BYTES != 0) {
        float s[8], c[8];
        tables.template angles<8, TABLE_BYTES, Element>(p, row, position, unit * 8, s, c);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          rotate_half_words<Element, PACKED>(av[w], bv[w], s[2 * w], c[2 * w], s[2 * w + 1], c[2 * w + 1]);
        }
      } else {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          float s0, c0, s1, c1;
          rope_angle<0, SCALED, Element>(p, position, unit * 8 + 2 * w, s0, c0);
          rope_angle<0, SCALED, Element>(p, position, unit * 8 + 2 * w + 1, s1, c1);
          rotate_half_words<Element, PACKED>(av[w], bv[w], s0, c0, s1, c1);
        }
      }
      *first = a;
      *second = b;
    } else {
      uint4* chunk = chunk_at(row, unit);
      uint4 a = *chunk;
      if constexpr (TABLE_BYTES == 2 && PACKED) {
        // Pair 2w + l's cos in both lanes, and (−sin, sin).
        unsigned c[2], s[2];
        tables.template words<2>(p, row, position, unit * 4, c, s);
        unsigned* words = reinterpret_cast<unsigned*>(&a);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const unsigned selector = w % 2 == 0 ? 0x1010 : 0x3232;
          words[w] = rotate_interleaved_packed<Element>(words[w], __byte_perm(c[w / 2], 0, selector),
                                                        __byte_perm(s[w / 2], 0, selector) ^ 0x8000u);
        }
      } else if constexpr (TABLE_BYTES != 0) {
        float s[4], c[4];
        tables.template angles<4, TABLE_BYTES, Element>(p, row, position, unit * 4, s, c);
        a.x = rotate_interleaved<Element, PACKED>(a.x, s[0], c[0]);
        a.y = rotate_interleaved<Element, PACKED>(a.y, s[1], c[1]);
        a.z = rotate_interleaved<Element, PACKED>(a.z, s[2], c[2]);
        a.w = rotate_interleaved<Element, PACKED>(a.w, s[3], c[3]);
      } else {
        a.x = rotate_pair<Element, PACKED, SCALED>(a.x, p, position, unit * 4);
        a.y = rotate_pair<Element, PACKED, SCALED>(a.y, p, position, unit * 4 + 1);
        a.z = rotate_pair<Element, PACKED, SCALED>(a.z, p, position, unit * 4 + 2);
        a.w = rotate_pair<Element, PACKED, SCALED>(a.w, p, position, unit * 4 + 3);
      }
      *chunk = a;
    }
  };
  if constexpr (TABLE_BYTES != 0) {
    // Several units' table loads in flight at once: two (four took up to
    // 1.4x the time with f32 tables at head_dim 64, H200), four for 16-bit
    // tables at head_dim 64 (their words take half the registers), or one
    // where registers are few (two spilled 16-72 bytes more in the producers
    // above head_dim 128, ptxas, NVRTC 13.0). The caller chooses.
#pragma unroll TABLE_UNITS_IN_FLIGHT
    for (int index = thread; index < kUnits; index += THREADS) rotate_unit(index);
  } else {
#pragma unroll 1
    for (int index = thread; index < kUnits; index += THREADS) rotate_unit(index);
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
// kRun rows each, kPairs pairs a unit; kWhole when every thread's run is
// whole (else callers rotate with one angle per row).
//
// A run is rows first_row(run) + r · row_step, r < kRun. Unspread runs are
// consecutive rows. SPREAD runs take every kRunners-th row (the producer
// warpgroup's K tiles, rotate_consecutive_rows and SteppedKeyRotation):
//   - with whole groups of eight runs, first_row bit-reverses the run's low
//     three bits, so the runs of one warp touch rows 4 (or 2) apart modulo
//     8 and their swizzled 4-byte pieces fall in different bank columns;
//   - kRun steps of kRunners rows span the tile, so one more step from a
//     run's last row lands on the same run's row in the next tile.
//
// EVEN_RUNS takes the most runners, a power of two, that split the rows
// evenly, and leaves the threads past them idle (kWhole then holds for any
// row count). A power of two keeps a run's rows within few swizzle phases
// (SteppedKeyRotation::rotate_swizzled): five runners of a 24-unit row
// spilled 116 bytes in the producer at head_dim 192, four none.
template <int STYLE, int ROTARY_DIM, int ROWS, int THREADS, int WORDS, bool EVEN_RUNS = false>
struct RunLayout {
  static constexpr int kUnitsPerRow = STYLE == kRopeHalf ? ROTARY_DIM / (4 * WORDS) : ROTARY_DIM / (2 * WORDS);
  static constexpr int kPairs = STYLE == kRopeHalf ? 2 * WORDS : WORDS;
  // (No rotation, ROTARY_DIM 0: no units, no runs.)
  static constexpr int kMostRunners =
      kUnitsPerRow == 0 ? 0 : THREADS / kUnitsPerRow > ROWS ? ROWS : THREADS / kUnitsPerRow;
  __host__ __device__ static constexpr int even_runners(int most) {
    int runners = 1;
    while (runners * 2 <= most && ROWS % (runners * 2) == 0) runners *= 2;
    return runners;
  }
  static constexpr int kRunners = EVEN_RUNS ? even_runners(kMostRunners) : kMostRunners;
  static constexpr int kRun = kRunners > 0 ? ROWS / kRunners : 0;
  static constexpr bool kWhole =
      kRunners > 0 && (EVEN_RUNS || THREADS % kUnitsPerRow == 0) && ROWS % kRunners == 0;
  // Rows whose loads are batched (rotate_run): up to four, whole batches.
  static constexpr int kBatch = kRun < 4 ? kRun : kRun % 4 == 0 ? 4 : kRun % 2 == 0 ? 2 : 1;
  __device__ static constexpr int row_step(bool spread) { return spread ? kRunners : 1; }
  __device__ static __forceinline__ int first_row(int run, bool spread) {
    if (!spread) return run * kRun;
    return kRunners % 8 == 0 ? (run & ~7) | (run & 1) << 2 | (run & 2) | (run & 4) >> 2 : run;
  }
};

// The angles of PAIRS consecutive pairs at one position, and their step:
// fp32 sin and cos, moved from row to row with the angle-sum identities.
// Each step adds ~5e-7 of error (the approximate sincos of the step, then
// rounding), so callers re-evaluate after at most 64 steps. SCALED: the
// angles (not their steps) are scaled as in rope_angle; a step is a rotation,
// so it keeps their length.
template <int PAIRS, bool SCALED>
struct SteppedAngles {
  float cosine[PAIRS], sine[PAIRS], step_cosine[PAIRS], step_sine[PAIRS];

  // The angles of pairs first_pair... at `position`.
  __device__ __forceinline__ void start(const FwdParams& p, int first_pair, int position) {
#pragma unroll
    for (int i = 0; i < PAIRS; ++i) {
      sincos_reduced(static_cast<float>(position) * p.rope_inv_freq[first_pair + i], sine[i], cosine[i]);
      scale_angle<SCALED>(p, sine[i], cosine[i]);
    }
  }
  // A step of `positions` positions.
  __device__ __forceinline__ void set_step(const FwdParams& p, int first_pair, int positions) {
#pragma unroll
    for (int i = 0; i < PAIRS; ++i) {
      sincos_reduced(static_cast<float>(positions) * p.rope_inv_freq[first_pair + i], step_sine[i], step_cosine[i]);
    }
  }
  // Both (one frequency read per pair).
  __device__ __forceinline__ void start(const FwdParams& p, int first_pair, int position, int step_positions) {
#pragma unroll
    for (int i = 0; i < PAIRS; ++i) {
      const float frequency = p.rope_inv_freq[first_pair + i];
      sincos_reduced(static_cast<float>(position) * frequency, sine[i], cosine[i]);
      scale_angle<SCALED>(p, sine[i], cosine[i]);
      sincos_reduced(static_cast<float>(step_positions) * frequency, step_sine[i], step_cosine[i]);
    }
  }
  // One step forward, or back.
  template <bool BACK>
  __device__ __forceinline__ void advance() {
#pragma unroll
    for (int i = 0; i < PAIRS; ++i) {
      if constexpr (BACK) {
        const float c = cosine[i] * step_cosine[i] + sine[i] * step_sine[i];
        sine[i] = sine[i] * step_cosine[i] - cosine[i] * step_sine[i];
        cosine[i] = c;
      } else {
        const float c = cosine[i] * step_cosine[i] - sine[i] * step_sine[i];
        sine[i] = sine[i] * step_cosine[i] + cosine[i] * step_sine[i];
        cosine[i] = c;
      }
    }
  }
};

// Rotates one thread's run of RUN rows (of one unit: a piece of WORDS words,
// and for rotate-half its partner piece), `piece_at(r, piece)` being run row
// r's piece. `angles` hold run row 0's angles (BACK: row RUN - 1's, rows go
// from the last down) and advance after every row but the last
// (STEP_PAST_END: after the last too). BATCH rows are loaded before any of
// them is rotated: the compiler cannot move a load above an earlier store to
// a piece that might alias it.
template <class Element, int STYLE, int WORDS, int RUN, int BATCH, bool BACK, bool STEP_PAST_END, bool PACKED,
          typename PieceAt, class Angles>
__device__ __forceinline__ void rotate_run(PieceAt&& piece_at, Angles& angles) {
  using Piece = typename RowPiece<WORDS>::type;
  constexpr int kPieces = STYLE == kRopeHalf ? 2 : 1;  // pieces a unit covers in one row
  static_assert(RUN % BATCH == 0, "whole batches");
#pragma unroll
  for (int b0 = 0; b0 < RUN; b0 += BATCH) {
    Piece held[BATCH][kPieces];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const int r = BACK ? RUN - 1 - (b0 + b) : b0 + b;
#pragma unroll
      for (int piece = 0; piece < kPieces; ++piece) held[b][piece] = *piece_at(r, piece);
    }
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const int r = BACK ? RUN - 1 - (b0 + b) : b0 + b;
      unsigned* av = reinterpret_cast<unsigned*>(&held[b][0]);
      if constexpr (STYLE == kRopeHalf) {
        unsigned* bv = reinterpret_cast<unsigned*>(&held[b][kPieces - 1]);
#pragma unroll
        for (int w = 0; w < WORDS; ++w) {
          rotate_half_words<Element, PACKED>(av[w], bv[w], angles.sine[2 * w], angles.cosine[2 * w],
                                             angles.sine[2 * w + 1], angles.cosine[2 * w + 1]);
        }
      } else {
#pragma unroll
        for (int w = 0; w < WORDS; ++w) {
          av[w] = rotate_interleaved<Element, PACKED>(av[w], angles.sine[w], angles.cosine[w]);
        }
      }
#pragma unroll
      for (int piece = 0; piece < kPieces; ++piece) *piece_at(r, piece) = held[b][piece];
      if (STEP_PAST_END || b0 + b + 1 < RUN) angles.template advance<BACK>();
    }
  }
}

// The same rotation (THREADS threads, this one `thread`) for rows at
// consecutive positions (a K tile, or a Q tile of one head: row r at
// position0 + r) with angles from frequencies, cheaper:
// each thread owns a run of rows of one unit, evaluates sin and cos once at
// the run's first row, and steps the angle from row to row (SteppedAngles;
// runs are at most 32 rows). That is two sincos per pair and run instead of
// one per pair and row. 16-byte pieces halve the loop overhead, 4- and
// 8-byte ones cut the angle registers. `piece_at(row, unit)` is the piece's
// address (units of a row: RunLayout).
//
// SPREAD_RUNS (RunLayout) also batches four rows' loads (eight spill at the
// producer's 56 registers). Measured on the H200 at head_dim 64
// (docs/PERFORMANCE.md): both together make RoPE prefill 0.7-1.3% faster;
// the batched loads alone 0.5%, and the spread rows alone 2-3% slower.
template <class Element, int STYLE, int ROTARY_DIM, bool SCALED, int ROWS, int THREADS, int WORDS, bool SPREAD_RUNS,
          bool PACKED, typename PieceAt>
__device__ __forceinline__ void rotate_consecutive_rows(const FwdParams& p, PieceAt&& piece_at, int position0,
                                                        int thread) {
  using Layout = RunLayout<STYLE, ROTARY_DIM, ROWS, THREADS, WORDS>;
  static_assert(Layout::kWhole, "whole runs");
  const int unit = thread % Layout::kUnitsPerRow;
  const int run = thread / Layout::kUnitsPerRow;
  if (run >= Layout::kRunners) return;
  // Spread rows only in whole groups of eight runs (with fewer, SPREAD_RUNS
  // keeps consecutive rows and only batches the loads).
  constexpr bool kSpread = SPREAD_RUNS && Layout::kRunners % 8 == 0;
  constexpr int kRowStep = Layout::row_step(kSpread);
  const int row0 = Layout::first_row(run, kSpread);
  SteppedAngles<Layout::kPairs, SCALED> angles;
  angles.start(p, unit * Layout::kPairs, position0 + row0, kRowStep);
  constexpr int kBatch = SPREAD_RUNS ? (Layout::kRun < 4 ? Layout::kRun : 4) : 1;
  rotate_run<Element, STYLE, WORDS, Layout::kRun, kBatch, /*BACK=*/false, /*STEP_PAST_END=*/false, PACKED>(
      [&](int r, int piece) { return piece_at(row0 + r * kRowStep, unit + piece * Layout::kUnitsPerRow); }, angles);
}

// The producer warpgroup's rotation of a sequence of K tiles of ROWS rows,
// from the last tile down (tile t - 1 follows tile t), keeping each thread's
// angles from tile to tile: rows of a run are rotated from the last up with
// backward steps, and one more step reaches the run's last row in the next
// tile (RunLayout's spread runs). sin and cos are evaluated only every
// kAnchorTiles tiles (at most 64 steps apart, as in rotate_consecutive_rows'
// longest runs) instead of twice per pair and run: at rotary_dim 128 they
// were about a fifth of the rotation's instructions, and they share the
// special-function unit with the MMA warps' exponentials.
template <class Element, int STYLE, int ROTARY_DIM, bool SCALED, int ROWS, int THREADS, int WORDS,
          bool EVEN_RUNS = false>
struct SteppedKeyRotation {
  using Layout = RunLayout<STYLE, ROTARY_DIM, ROWS, THREADS, WORDS, EVEN_RUNS>;
  static_assert(Layout::kWhole, "whole runs");
  static constexpr int kAnchorTiles = Layout::kRun >= 64 ? 1 : 64 / Layout::kRun;
  SteppedAngles<Layout::kPairs, SCALED> angles;
  int unit, row0;
  bool active;

  __device__ __forceinline__ SteppedKeyRotation(const FwdParams& p, int thread)
      : unit(thread % Layout::kUnitsPerRow),
        row0(Layout::first_row(thread / Layout::kUnitsPerRow, true)),
        active(thread / Layout::kUnitsPerRow < Layout::kRunners) {
    angles.set_step(p, unit * Layout::kPairs, Layout::kRunners);
  }

  // Re-evaluates the angles at the run's last row every kAnchorTiles tiles.
  __device__ __forceinline__ void anchor(const FwdParams& p, int position0, int tile_index) {
    if (tile_index % kAnchorTiles == 0) {
      angles.start(p, unit * Layout::kPairs, position0 + row0 + (Layout::kRun - 1) * Layout::kRunners);
    }
  }

  // Rotates the tile whose row 0 is at position0, the tile_index-th of the
  // sequence (0: the first rotated); `piece_at(row, unit)` as in
  // rotate_consecutive_rows.
  template <typename PieceAt>
  __device__ __forceinline__ void rotate(const FwdParams& p, PieceAt&& piece_at, int position0, int tile_index) {
    if (!active) return;
    anchor(p, position0, tile_index);
    rotate_run<Element, STYLE, WORDS, Layout::kRun, Layout::kBatch, /*BACK=*/true, /*STEP_PAST_END=*/true,
               /*PACKED=*/true>(
        [&](int r, int piece) { return piece_at(row0 + r * Layout::kRunners, unit + piece * Layout::kUnitsPerRow); },
        angles);
  }

  // The same for a tile whose 16-byte chunks are swizzled by row % 8, rows
  // ROW_BYTES apart (wgmma's panels): `offset_of(row, unit)` is the piece's
  // byte offset in `tile`. A run's rows repeat their swizzle every kPeriod
  // rows, so the thread computes kPeriod shared-memory addresses per piece
  // (from an opaque base, so once per tile) and reaches the other rows by
  // constant offsets. Unrolled with one address per row, the compiler held
  // all 40-48 of them from tile to tile, which spilled 1.7-2.2 KB in a
  // 24-register producer above head_dim 128 (ptxas, NVRTC 13.0).
  template <int ROW_BYTES, typename OffsetOf>
  __device__ __forceinline__ void rotate_swizzled(const FwdParams& p, unsigned char* tile, OffsetOf&& offset_of,
                                                  int position0, int tile_index) {
    if (!active) return;
    anchor(p, position0, tile_index);
    using Piece = typename RowPiece<WORDS>::type;
    constexpr int kRunners = Layout::kRunners;
    constexpr int kPeriod = kRunners % 8 == 0 ? 1 : kRunners % 4 == 0 ? 2 : kRunners % 2 == 0 ? 4 : 8;
    constexpr int kPieces = STYLE == kRopeHalf ? 2 : 1;
    unsigned addresses[kPeriod][kPieces];
    const unsigned base = opaque(smem_u32(tile));
#pragma unroll
    for (int r = 0; r < kPeriod; ++r) {
#pragma unroll
      for (int piece = 0; piece < kPieces; ++piece) {
        addresses[r][piece] = base + offset_of(row0 + r * kRunners, unit + piece * Layout::kUnitsPerRow);
      }
    }
    rotate_run<Element, STYLE, WORDS, Layout::kRun, Layout::kBatch, /*BACK=*/true, /*STEP_PAST_END=*/true,
               /*PACKED=*/true>(
        [&](int r, int piece) {
          return reinterpret_cast<Piece*>(__cvta_shared_to_generic(
              addresses[r % kPeriod][piece] + r / kPeriod * kPeriod * kRunners * ROW_BYTES));
        },
        angles);
  }
};

}  // namespace jitattn
