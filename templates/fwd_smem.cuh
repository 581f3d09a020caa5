// Shared-memory tiles of the prefill kernels: the swizzled layouts (mma.sync
// rows, wgmma panels), ldmatrix addresses, and the cp.async copies of rows
// into them (aligned, rolled, element-wise staged and shifted). Part of
// fwd_prefill.cuh.
#pragma once

#include "fwd_config.cuh"

namespace jitattn {

// Shared-memory tiles are row-major [rows][kRowElems] of 16-bit values with
// the 16-byte chunks of each 128-byte group XOR-swizzled by (row % 8).
// ldmatrix reads the same chunk column of 8 consecutive rows, and cp.async
// writes 8 consecutive chunks of one row; the swizzle puts both patterns on 8
// distinct bank groups. With wgmma (Cfg::kWgmma) a tile of ROWS rows is
// instead laid out in wgmma's panels (wgmma.cuh): 64-column panels of ROWS
// 128-byte rows with the same swizzle, so every 8-row group of a panel is one
// 1 KB wgmma swizzle atom; for head dims up to 64 the two layouts coincide.
template <class Cfg, int ROWS = 0>
__device__ __forceinline__ int swizzled_bytes(int row, int chunk) {
  if constexpr (Cfg::kWgmma) {
    static_assert(ROWS > 0, "the panel layout needs the tile's rows");
    return (chunk >> 3) * (ROWS * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
  } else {
    return row * Cfg::kRowBytes + ((chunk & ~7) << 4) + (((chunk & 7) ^ (row & 7)) << 4);
  }
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a K or V stage:
// swizzled_bytes' panels, or over pages (tensor copies) 8-row groups of
// every panel in turn (FwdConfig::kInterleavedPanels), or of every panel of
// K, then of V (kInterleavedKV), so that a page's rows are one contiguous
// box: from a K (or V) stage's start, a group's next panel is 1 KB on, its
// next group kKVGroupAtoms KB (wgmma's descriptors step so:
// fwd_consume.cuh). Each group of a panel is still one 1 KB swizzle atom;
// only the atoms' order differs.
template <class Cfg>
__device__ __forceinline__ int kv_tile_bytes(int row, int chunk) {
  if constexpr (Cfg::kKVGroupAtoms > 1) {
    return ((row >> 3) * Cfg::kKVGroupAtoms + (chunk >> 3)) * 1024 + (row & 7) * 128 + (((chunk & 7) ^ (row & 7)) << 4);
  } else {
    return swizzled_bytes<Cfg, Cfg::kBlockKV>(row, chunk);
  }
}

// Every ldmatrix access starts at a row ≡ lane (mod 8) and walks in whole
// 16-row steps and in chunk pairs 2·step + c (c in {0, 1}): its address is a
// per-thread row base and `low` = ((c ^ row) << 4), combined with the step. As
// (2k + c) ^ r = 2k ^ (c ^ r), the step only XORs into the low bits. Keeping
// the base live (instead of one hoisted address per unrolled step) keeps the
// register count down.
template <class Cfg>
__device__ __forceinline__ unsigned fragment_address(unsigned row_base, unsigned low, int step) {
  if constexpr ((Cfg::kRowBytes & (Cfg::kRowBytes - 1)) == 0) {
    // Power-of-two rows on a 1 KB-aligned tile: the whole chunk index is free
    // of row bits, so one XOR does it.
    return (row_base + low) ^ (step * 32);
  } else {
    return row_base + (step >> 2) * 128 + (low ^ ((step & 3) * 32));
  }
}

// Copies 16-byte chunk `chunk` of a row into shared memory: by cp.async, or
// where rows are unaligned (FwdConfig::kUnaligned) by 2-byte loads, zero past
// the head dim, and one 16-byte store. That copy completes before the
// function returns, so the kernel's cp.async waits and barriers order it as
// they order the copies it replaces. A false `valid` writes zeros.
template <class Cfg>
__device__ __forceinline__ void copy_chunk(unsigned destination, const unsigned short* source, bool valid, int chunk) {
  if constexpr (Cfg::kUnaligned) {
    unsigned words[4] = {0u, 0u, 0u, 0u};
    if (valid) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (chunk * 8 + e < Cfg::kColumns) words[e / 2] |= static_cast<unsigned>(__ldg(source + e)) << (16 * (e & 1));
      }
    }
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(destination), "r"(words[0]), "r"(words[1]),
                 "r"(words[2]), "r"(words[3]));
  } else {
    cp_async_16(destination, source, valid);
  }
}

// load_tile in a loop that is not unrolled: for copies made at most once
// per tile on a producer with few registers (the varlen V block that ends
// past its sequence: the unrolled passes spilled 12 bytes in the
// three-warpgroup producer's 32 registers), and for every tile of unaligned
// rows, whose element-wise copies hold a register per element until stored
// (unrolled by 2 or 4 those kernels spilled up to 156 bytes more; ptxas,
// NVRTC 13.0; test_compile bounds it).
template <class Cfg, int ROWS>
__device__ __forceinline__ void load_tile_rolled(unsigned tile, const unsigned short* global, long long row_stride,
                                                 int row0, int rows_valid, int chunks_valid) {
#pragma unroll 1
  for (int index = threadIdx.x % Cfg::kLoadThreads; index < ROWS * Cfg::kChunksPerRow; index += Cfg::kLoadThreads) {
    const int row = index / Cfg::kChunksPerRow, chunk = index % Cfg::kChunksPerRow;
    const bool valid = row0 + row < rows_valid && chunk < chunks_valid;
    copy_chunk<Cfg>(tile + swizzled_bytes<Cfg, ROWS>(row, chunk),
                    valid ? global + static_cast<long long>(row0 + row) * row_stride + chunk * 8 : global, valid, chunk);
  }
}

// Copies rows [row0, row0 + ROWS) of a [seqlen, head_dim] slice into a
// swizzled tile. Rows at or past `rows_valid`, and chunks at or past
// `chunks_valid` (a caller's head dim below the kernel's), are zero-filled.
template <class Cfg, int ROWS>
__device__ __forceinline__ void load_tile(unsigned tile, const unsigned short* global, long long row_stride,
                                          int row0, int rows_valid, int chunks_valid) {
  // With wgmma, rows that do not split evenly over the threads (head dim 96:
  // 12 chunks a row) are still copied in whole 8-row passes by the threads
  // that fit (96 of the producer's 128): the per-chunk path below spilled
  // 100-370 bytes in the producer's 88 registers.
  constexpr int kRowsPerPass =
      Cfg::kWgmma ? Cfg::kLoadThreads / Cfg::kChunksPerRow / 8 * 8 : Cfg::kLoadThreads / Cfg::kChunksPerRow;
  constexpr int kActiveThreads = kRowsPerPass * Cfg::kChunksPerRow;
  if constexpr (Cfg::kUnaligned) {
    load_tile_rolled<Cfg, ROWS>(tile, global, row_stride, row0, rows_valid, chunks_valid);
  } else if constexpr ((Cfg::kLoadThreads % Cfg::kChunksPerRow == 0 || Cfg::kWgmma) && kRowsPerPass > 0 &&
                kRowsPerPass % 8 == 0 && ROWS % kRowsPerPass == 0) {
    // Each thread copies one fixed chunk column in whole 8-row steps: one
    // pointer walked by a fixed step and one row count compared against
    // constants (a 64-bit address per pass would cost registers the main
    // loop needs).
    if (kActiveThreads < Cfg::kLoadThreads && threadIdx.x >= kActiveThreads) return;
    const int row = threadIdx.x / Cfg::kChunksPerRow;
    const int chunk = threadIdx.x % Cfg::kChunksPerRow;
    // One instantiation for every tile height of the mma.sync layout: one
    // per height (the same code once inlined) made ptxas spill 36 more bytes
    // in the head_dim 128 kernels (NVRTC 13.0).
    const unsigned destination = tile + swizzled_bytes<Cfg, Cfg::kWgmma ? ROWS : 0>(row, chunk);
    const unsigned short* source = global + (row0 + row) * row_stride + chunk * 8;
    const long long step = kRowsPerPass * row_stride;
    const int rows_left = chunk < chunks_valid ? rows_valid - row0 - row : 0;
#pragma unroll
    for (int pass = 0; pass < ROWS / kRowsPerPass; ++pass) {
      const bool valid = pass * kRowsPerPass < rows_left;
      copy_chunk<Cfg>(destination + pass * kRowsPerPass * Cfg::kRowStride, valid ? source : global, valid, chunk);
      source += step;
    }
  } else {
    constexpr int kChunks = ROWS * Cfg::kChunksPerRow;
#pragma unroll
    for (int i = 0; i < (kChunks + Cfg::kLoadThreads - 1) / Cfg::kLoadThreads; ++i) {
      const int index = i * Cfg::kLoadThreads + threadIdx.x;
      if (kChunks % Cfg::kLoadThreads == 0 || index < kChunks) {
        const int row = index / Cfg::kChunksPerRow;
        const int chunk = index % Cfg::kChunksPerRow;
        const bool valid = row0 + row < rows_valid && chunk < chunks_valid;
        copy_chunk<Cfg>(tile + swizzled_bytes<Cfg, ROWS>(row, chunk),
                        valid ? global + (row0 + row) * row_stride + chunk * 8 : global, valid, chunk);
      }
    }
  }
}


// Unaligned rows with the producer (Cfg::kStagedRows): stage_strided_rows
// copies, by cp.async, the 16-byte-aligned blocks that cover rows [0, ROWS)
// into staging rows of Cfg::kStagingRowBytes; once they have landed,
// shift_strided_rows writes chunk c of each row to the tile as staging bytes
// [m + 16c, m + 16c + 16), m = the row's address mod 16 (even). Row r is at
// rows + r · row_stride, for r < rows_valid (K and V blocks, unpacked Q).
// Only blocks holding a byte of the row are read; an aligned block never
// straddles a page, so no copy touches a page that holds none of the
// caller's rows. Rows 8 apart start at the same offset mod 16 (8 rows of
// 2-byte elements span a multiple of 16 bytes), so each thread takes one
// column (a staging block, or a chunk) of rows 8k apart in whole 8-row
// passes: its offset, the bytes of its block its rows hold and its
// addresses are set up once, and each row costs a copy, or five loads, four
// permutes and a store. Copies are coalesced along a row and zero-fill past
// a row's last byte and for rows past the sequence, so the shift runs
// without masks or branches (with them, 3-7% slower at head dim 59 on the
// H200; per-chunk addressing was 1.8× slower).
template <class Cfg, int ROWS>
__device__ __forceinline__ void stage_strided_rows(unsigned staging, const unsigned short* rows, long long row_stride,
                                                   int rows_valid) {
  constexpr int kBlocks = Cfg::kChunksUsed + 1;
  // At most 16 threads a row (head dims 121-127 have 17 blocks: one thread
  // of each row takes two), so that passes have 8 rows.
  constexpr int kThreadsPerRow = kBlocks < 16 ? kBlocks : 16;
  constexpr int kRowsPerPass = Cfg::kProducerThreads / kThreadsPerRow / 8 * 8;
  static_assert(kRowsPerPass >= 8, "whole 8-row passes");
  const int thread = threadIdx.x % Cfg::kProducerThreads;
  if (thread >= kRowsPerPass * kThreadsPerRow) return;
  const int row = thread / kThreadsPerRow;
  const unsigned long long first = reinterpret_cast<unsigned long long>(rows + row * row_stride);
  const long long step = kRowsPerPass * row_stride;
  const int rows_left = rows_valid - row;
#pragma unroll
  for (int block = thread % kThreadsPerRow; block < kBlocks; block += kThreadsPerRow) {
    // The bytes of this block that belong to this thread's rows (the same
    // for all of them): the copy zeroes the rest, so the staged rows read
    // as zeros past the head dim, and blocks past a row's end are zeros.
    const int bytes = min(max(static_cast<int>(first & 15ull) + 2 * Cfg::kColumns - 16 * block, 0), 16);
    const unsigned short* source = reinterpret_cast<const unsigned short*>((first & ~15ull) + 16 * block);
    const unsigned destination = staging + row * Cfg::kStagingRowBytes + 16 * block;
#pragma unroll
    for (int pass = 0; pass < (ROWS + kRowsPerPass - 1) / kRowsPerPass; ++pass) {
      if (ROWS % kRowsPerPass != 0 && row + pass * kRowsPerPass >= ROWS) break;
      // Rows past the sequence are staged as zeros too (no read), so the
      // shift runs without a branch.
      const bool valid = pass * kRowsPerPass < rows_left && bytes != 0;
      cp_async_16_prefix(destination + pass * kRowsPerPass * Cfg::kStagingRowBytes, valid ? source : rows,
                         valid ? bytes : 0);
      source += step;
    }
  }
}

// (Tile and staging by generic pointers into shared memory: plain loads and
// stores, which the compiler may interleave across passes. As volatile asm,
// kept in order, each pass waited for its own loads: 5% slower at head
// dim 59 on the H200.)
template <class Cfg, int ROWS>
__device__ __forceinline__ void shift_strided_rows(unsigned char* tile, const unsigned char* staging,
                                                   const unsigned short* rows, long long row_stride) {
  constexpr int kRowsPerPass = Cfg::kProducerThreads / Cfg::kChunksUsed / 8 * 8;
  static_assert(kRowsPerPass >= 8, "whole 8-row passes");
  const int thread = threadIdx.x % Cfg::kProducerThreads;
  if (thread >= kRowsPerPass * Cfg::kChunksUsed) return;
  const int row = thread / Cfg::kChunksUsed, chunk = thread % Cfg::kChunksUsed;
  const unsigned offset = static_cast<unsigned>(reinterpret_cast<unsigned long long>(rows + row * row_stride)) & 15u;
  const unsigned selector = (offset & 2u) != 0u ? 0x5432u : 0x3210u;
  const unsigned* source =
      reinterpret_cast<const unsigned*>(staging + row * Cfg::kStagingRowBytes + chunk * 16 + (offset & 12u));
  // Rows 8k apart keep (row & 7), so the swizzled address steps linearly.
  uint4* destination = reinterpret_cast<uint4*>(tile + swizzled_bytes<Cfg, ROWS>(row, chunk));
#pragma unroll
  for (int pass = 0; pass < (ROWS + kRowsPerPass - 1) / kRowsPerPass; ++pass) {
    if (ROWS % kRowsPerPass != 0 && row + pass * kRowsPerPass >= ROWS) break;
    const unsigned* at = source + pass * kRowsPerPass * Cfg::kStagingRowBytes / 4;
    destination[pass * kRowsPerPass * Cfg::kRowStride / 16] =
        make_uint4(__byte_perm(at[0], at[1], selector), __byte_perm(at[1], at[2], selector),
                   __byte_perm(at[2], at[3], selector), __byte_perm(at[3], at[4], selector));
  }
}

// Zeroes chunks [Cfg::kChunksUsed, Cfg::kChunksPerRow) of a tile (head dims
// such as 111 on 128-wide tiles). shift_strided_rows never writes them, so
// once per tile buffer is enough.
template <class Cfg, int ROWS>
__device__ __forceinline__ void zero_unused_chunks(unsigned tile) {
  constexpr int kUnused = Cfg::kChunksPerRow - Cfg::kChunksUsed;
  if constexpr (kUnused > 0) {
#pragma unroll 1
    for (int index = threadIdx.x % Cfg::kProducerThreads; index < ROWS * kUnused; index += Cfg::kProducerThreads) {
      const int row = index / kUnused, chunk = Cfg::kChunksUsed + index % kUnused;
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(tile + swizzled_bytes<Cfg, ROWS>(row, chunk)),
                   "r"(0u));
    }
  }
}

}  // namespace jitattn
