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
#include "rope.cuh"
#include "wgmma.cuh"

namespace jitattn {

// Which keys a query row may see, beyond key < seqlen_k.
enum MaskKind : int {
  kMaskNone = 0,
  kMaskCausal = 1,  // key <= row + seqlen_k - seqlen_q
  kMaskLocal = 2,   // a sliding window around that diagonal (FwdParams::window_*)
};

template <class Element_, int HEAD_DIM, int BLOCK_Q, int BLOCK_KV, int WARPS, int MASK, bool SOFTCAP, bool ALIBI,
          bool PADDED, bool VARLEN, bool PACK_GQA, int ROPE, int ROTARY_DIM, bool ROPE_TABLES, bool KVCACHE,
          bool PAGED, bool SPLIT, int STAGES = 0, bool WGMMA = false, bool PERSISTENT = false,
          int UNALIGNED_DIM = 0>
struct FwdConfig {
  using Element = Element_;
  static constexpr int kHeadDim = HEAD_DIM;
  // UNALIGNED_DIM > 0: the caller's head dim, not a multiple of 8, so its
  // rows start on any 2-byte boundary, which cp.async's 16-byte copies cannot
  // read. The 4-warp mma.sync kernels then read rows element by element
  // (copy_chunk); the wgmma tiles of two warpgroups have their producer copy
  // the aligned blocks that cover each row and shift them into the tiles
  // (kStagedRows, produce_tiles_unaligned). The output is written element
  // by element (store_output) up to kColumns, and the tiles are zero past
  // it, as for PADDED. Never with a KV cache (KernelSpec::validate).
  static constexpr bool kUnaligned = UNALIGNED_DIM > 0;
  static constexpr int kColumns = kUnaligned ? UNALIGNED_DIM : HEAD_DIM;
  static_assert(!kUnaligned || (UNALIGNED_DIM % 8 != 0 && UNALIGNED_DIM < HEAD_DIM && !KVCACHE && !SPLIT &&
                                !PADDED && !PERSISTENT && (STAGES == 0 || (WGMMA && WARPS == 8))),
                "unaligned head dims: a non-multiple of 8 below HEAD_DIM, without a KV cache; 4-warp kernels, or "
                "ordinary-grid wgmma tiles of two warpgroups");
  static constexpr int kBlockQ = BLOCK_Q;
  static constexpr int kBlockKV = BLOCK_KV;
  static constexpr int kWarps = WARPS;  // MMA warps: each owns kRowsPerWarp query rows
  // STAGES > 0: a producer warpgroup (warps 0-3) copies the tiles, and
  // rotates them for RoPE, into a ring of STAGES K/V stages, while the MMA
  // warps only compute (fwd_prefill_specialized). The rotation then runs
  // beside the tensor-core work instead of between its tiles.
  static constexpr int kStages = STAGES;
  static constexpr bool kProducer = STAGES > 0;
  // PERSISTENT (wgmma only): the grid is at most one wave of CTAs, each of
  // which walks a share of the tiles (fwd_prefill_persistent). Q is double
  // buffered, so the producer loads the next tile's Q, and its first K/V
  // blocks, while the MMA warps finish the current one.
  static constexpr bool kPersistent = PERSISTENT;
  static constexpr int kQBuffers = PERSISTENT ? 2 : 1;
  static constexpr int kProducerThreads = kProducer ? 128 : 0;
  static constexpr int kThreads = WARPS * 32 + kProducerThreads;
  // The threads that copy (and rotate) tiles: the producer, or everyone.
  static constexpr int kLoadThreads = kProducer ? kProducerThreads : kThreads;
  // Registers per thread after the hand-over (sm_90a): the launch gives each
  // thread kLaunchRegisters (168 for 384 threads, 128 for 512), and the
  // producer's and MMA warpgroups' shares add up to that. Measured on the
  // H200 (docs/PERFORMANCE.md): the producer's rotation runs 6-8% faster
  // overall with 56 than with 40 at head_dim 64, while at 128 the MMA warps'
  // accumulators need the 232.
  // With wgmma the MMA warps need fewer (no fragments of Q, K or V: 208 hold
  // S, O and P without spills at every head dim up to 128), and the
  // producer takes 88: at 40-56 its RoPE and packed-GQA copies spilled
  // 84-128 bytes (ptxas, NVRTC 13.0). Three wgmma warpgroups (WARPS = 12)
  // need 160 each for 96 accumulators (S and O), which leaves the producer 32
  // (RoPE then spills 4 bytes); with at most 64 accumulators 144 suffice and
  // the producer gets 72, which ran RoPE 6% faster than 56. Above head_dim
  // 128 (tensor copies only: KernelSpec::validate) the MMA warps hold 96-128
  // output accumulators and take 240, the producer 24: with 80-key blocks
  // (the planner's at 256) the kernels spilled 40-72 bytes there, against
  // 68-120 at 232 (ptxas, NVRTC 13.0). A producer that rotates K takes more:
  // 56 at 192 (the MMA warps' 224 still hold S, O and P without spills),
  // 40 at 256 (their 232 spill 90-236 bytes). At 24 its rotation spilled
  // 500+ bytes and ran RoPE 1.5-1.7 times slower at 256, and 32 measured
  // 2-5% slower than 40 (H200, docs/PERFORMANCE.md).
  static constexpr bool kRotateKeysAbove128 = HEAD_DIM > 128 && ROPE != 0 && !KVCACHE;
  // Above 128 a paged KV cache's producer, which walks the block table
  // (and copies the last block a row at a time: load_paged_rows), takes
  // what one that rotates K does; with 24 it spilled 92-100 bytes at 256.
  // A contiguous cache keeps 24: at 192 it ran chunked prefill 1-4% faster
  // than 56 (H200, docs/PERFORMANCE.md), and at 256 it spilled 68 bytes
  // against 140 at 40 (ptxas, NVRTC 13.0).
  static constexpr bool kWideProducerWork = kRotateKeysAbove128 || (HEAD_DIM > 128 && PAGED);
  static constexpr int kConsumerGroups = WARPS / 4;  // warpgroups of MMA warps (producer layout)
  static constexpr int kProducerRegisters = !WGMMA                              ? (HEAD_DIM <= 64 ? 56 : 40)
                                            : HEAD_DIM > 128                    ? (!kWideProducerWork ? 24
                                                                                   : HEAD_DIM <= 192 ? 56
                                                                                                     : 40)
                                            : kConsumerGroups == 2              ? 88
                                            : (HEAD_DIM + BLOCK_KV) / 2 <= 64 ? 72
                                                                                : 32;
  // WGMMA (sm_90a, with the producer): each warpgroup of MMA warps computes
  // its 64 rows with wgmma (wgmma.cuh) instead of mma.sync, reading Q, K and
  // V straight from shared memory in wgmma's panel layout (swizzled_bytes). The
  // tensor cores then run asynchronously beside the softmax, and the MMA
  // warps issue a few instructions per 64×N×16 product instead of one per
  // 16×8×16 with its ldmatrix loads.
  static constexpr bool kWgmma = WGMMA;
  // wgmma warpgroups take turns issuing their tensor-core work (S = Q Kᵀ
  // with the previous block's O += P V), passing a token around the
  // warpgroups through named barriers: while one warpgroup's products run,
  // the others compute their softmax instead of queueing products beside
  // it, so the softmax of one hides behind the products of another.
  static constexpr bool kMmaTurns = WGMMA && kConsumerGroups >= 2;
  // Named barrier 1 syncs the producer warpgroup (produce_tiles); 2 .. 4
  // sync one warpgroup's four warps (at most three warpgroups); the turn
  // barriers follow them, within the hardware's 16.
  static constexpr int kProducerBarrier = 1;
  static constexpr int kTurnBarrier0 = 2 + 3;
  static_assert(!WGMMA || (kConsumerGroups <= 3 && kTurnBarrier0 + 3 <= 16), "named barriers 0-15");
  // The launch's registers per thread (65536 over the CTA, in steps of 8),
  // and what the MMA warpgroups can claim once the producer has given back.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kMmaRegisters =
      ((kConsumerGroups + 1) * kLaunchRegisters - kProducerRegisters) / (kConsumerGroups > 0 ? kConsumerGroups : 1) / 8 * 8;
  static constexpr bool kCausal = MASK == kMaskCausal;
  static constexpr bool kLocal = MASK == kMaskLocal;
  static constexpr bool kSoftcap = SOFTCAP;
  static constexpr bool kAlibi = ALIBI;
  // The caller's head dim (FwdParams::head_dim) is below HEAD_DIM: loads
  // zero-fill and stores skip the chunks past it. Exact head dims compile
  // without those predicates.
  static constexpr bool kPadded = PADDED;
  // Packed sequences: queries (and, without a KV cache, keys) located
  // through cu_seqlens. With a (paged) KV cache, only the queries are
  // packed: each sequence's keys are its pages (forward_varlen with a block
  // table), so kVarlenKeys tells where the keys come from.
  static constexpr bool kVarlen = VARLEN;
  static constexpr bool kVarlenKeys = VARLEN && !KVCACHE;
  // Query heads that share a KV head share a tile: row r of the packed
  // sequence is query r / heads_per_kv of head r % heads_per_kv within the
  // group, so the group's K/V is read once per tile instead of once per head.
  static constexpr bool kPackGqa = PACK_GQA;
  // RoPE on q and k as their tiles land (rope.cuh).
  static constexpr int kRope = ROPE;
  static constexpr int kRotaryDim = ROTARY_DIM;
  static constexpr bool kRopeTables = ROPE_TABLES;
  // Keys from a KV cache (per-sequence lengths, optional batch remapping;
  // the cached keys are already rotated, so RoPE rotates q only), in pages,
  // and split over several CTAs that write fp32 partial results.
  static constexpr bool kKVCache = KVCACHE;
  static constexpr bool kPaged = PAGED;
  static constexpr bool kSplit = SPLIT;
  static constexpr bool kRotateKeys = ROPE != 0 && !KVCACHE;
  // wgmma, unless the producer rotates K (RoPE without a KV cache): the
  // producer reads each K and V block by tensor copies (TMA: one instruction
  // per 64-channel panel, completing on the stage's barrier by byte count)
  // from the maps the host encodes into FwdParams (KernelSpec::tensor_copies),
  // instead of 128 threads issuing 16-byte cp.async copies. Producer thread 0
  // issues them, or with a paged cache the first warp, one lane per page a
  // block spans. A block that ends past its sequence (varlen, KV cache) goes
  // by cp.async where it must (produce_tiles).
  // Not with three persistent warpgroups and a window: there the producer's
  // 32 registers spill 4-8 bytes (ptxas, NVRTC 13.0), and the cp.async
  // copies do not (KernelSpec::tensor_copies says the same).
  static constexpr bool kTensorCopies = WGMMA && (ROPE == 0 || KVCACHE || HEAD_DIM > 128) && UNALIGNED_DIM == 0 &&
                                        !(WARPS == 12 && PERSISTENT && MASK == kMaskLocal);
  // Pages shorter than this many rows are copied by cp.async: a page's box
  // must fill whole 1024-byte swizzle atoms of a 128-byte-swizzled panel.
  static constexpr int kMinTensorCopyPageShift = 3;
  // With the producer, the MMA warps rotate their own Q rows (while the
  // producer rotates the first K block) in pieces of this many words
  // (rotate_consecutive_rows): 4-byte pieces (two pairs' sin and cos per
  // thread instead of eight) measured 0.6-1.7% faster at head_dim 128 and
  // 16-byte pieces 2.4% faster at 64 and N 8192 (H200, docs/PERFORMANCE.md).
  static constexpr int kQRotationWords = HEAD_DIM <= 64 ? 4 : 1;
  // Scores rewritten before the softmax (to log2-domain logits) instead of
  // the scale being folded into the exponent.
  static constexpr bool kRewriteScores = SOFTCAP || ALIBI;

  static constexpr int kRowsPerWarp = BLOCK_Q / WARPS;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // 16-row MMA tiles per warp
  static constexpr int kScoreTiles = BLOCK_KV / 8;   // 8-column accumulator tiles of S
  static constexpr int kOutTiles = HEAD_DIM / 8;     // 8-column accumulator tiles of O
  static constexpr int kChunksPerRow = HEAD_DIM / 8; // 16-byte chunks of data per row
  // Shared-memory rows hold whole 8-chunk swizzle groups (128 bytes), so head
  // dims such as 32 and 96 leave a few unused chunks per row.
  static constexpr int kRowElems = (HEAD_DIM + 63) / 64 * 64;
  static constexpr int kRowBytes = kRowElems * 2;
  // Bytes from one row of a tile to the next (wgmma: within a panel).
  static constexpr int kRowStride = WGMMA ? 128 : kRowBytes;

  static constexpr int kSmemQ = BLOCK_Q * kRowElems;  // elements
  static constexpr int kSmemK = BLOCK_KV * kRowElems;
  static constexpr int kSmemV = BLOCK_KV * kRowElems;
  // The producer's ring: kQBuffers Q tiles, kStages K and V stages, then its
  // mbarriers (Ring: five per stage, and per Q buffer "Q landed", plus "Q
  // free" when there are two).
  static constexpr int kRingStages = kProducer ? kStages : 1;
  static constexpr int kBarrierOffset = (kQBuffers * kSmemQ + kRingStages * (kSmemK + kSmemV)) * 2;
  static constexpr int kQBarriers = kPersistent ? 4 : 1;
  // Unaligned rows with the producer (produce_tiles_unaligned): cp.async
  // copies the 16-byte-aligned blocks that cover each row into staging rows,
  // and the producer shifts them into the tiles. kStagingSlots slots of a K
  // block's rows then a V block's, so copies run kStagingSlots - 1 blocks
  // ahead of the shifts, independently of the ring's stages; the last slot
  // stages Q first. Each staging row has room for one block more than the
  // row's chunks: a chunk at any 2-byte offset spans two blocks. Barriers
  // after the ring's: "K staged" and "V staged" per slot, then "Q staged".
  static constexpr bool kStagedRows = kUnaligned && kProducer;
  static constexpr int kChunksUsed = kUnaligned ? (kColumns + 7) / 8 : kChunksPerRow;
  static constexpr int kStagingSlots = kStagedRows ? 3 : 0;
  static constexpr int kStagingRowBytes = (kChunksUsed + 1) * 16;
  static constexpr int kStagingSlotBytes = 2 * BLOCK_KV * kStagingRowBytes;
  static constexpr int kProducerBarriers = kProducer ? 5 * kStages + kQBarriers + 2 * kStagingSlots + kStagedRows : 0;
  static constexpr int kStagingOffset = (kBarrierOffset + kProducerBarriers * 8 + 15) / 16 * 16;
  static constexpr int kSmemBytes =
      kStagedRows ? kStagingOffset + kStagingSlots * kStagingSlotBytes : kBarrierOffset + kProducerBarriers * 8;
  static_assert(!kStagedRows || 2 * BLOCK_KV >= BLOCK_Q, "Q is staged in one slot's K and V rows");

  // Whether the next K block is requested before this block's softmax (more
  // time to hide its latency, longer register live ranges) or after it.
  // Measured on the H200 (docs/measurements/2026-11-22-kv-order-variants-bf16.json):
  // before wins by 3-4% at head_dim 64, after by 2-3% at 128.
  static constexpr bool kEarlyNextK = HEAD_DIM <= 64;

  static_assert(kRowsPerWarp % 16 == 0, "each warp owns whole 16-row MMA tiles");
  static_assert(!WGMMA || (STAGES > 0 && kRowsPerWarp == 16), "wgmma: a producer, and 64 rows per warpgroup");
  static_assert(!PERSISTENT || (WGMMA && !SPLIT && !KVCACHE), "persistent: wgmma tiles, no split or KV cache");
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!WGMMA, "wgmma needs sm_90a");
#endif
  static_assert(BLOCK_KV % 16 == 0 && HEAD_DIM % 16 == 0, "MMA k-steps are 16 wide");
};

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
// ldmatrix's transpose.
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

// Sets scores of keys the row may not see to -inf: keys past seqlen_k, and
// those outside the causal or local window around the bottom-right-aligned
// diagonal (key = row + diagonal_offset).
template <class Cfg>
__device__ __forceinline__ void apply_mask(float (&s)[Cfg::kMTiles][Cfg::kScoreTiles][4], const FwdParams& p,
                                           int seqlen_k, int first_row, int first_key, int diagonal_offset, int lane) {
  for_each_score<Cfg>(s, first_row, first_key, lane, [&](float& score, int packed_row, int key, int, int) {
    const int row = query_position<Cfg>(packed_row, p.heads_per_kv);
    bool visible = key < seqlen_k;
    if constexpr (Cfg::kCausal) visible = visible && key <= row + diagonal_offset;
    if constexpr (Cfg::kLocal) {
      visible = visible && key <= row + diagonal_offset + p.window_right && key >= row + diagonal_offset - p.window_left;
    }
    if (!visible) score = -kInfinity;
  });
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

// Normalizes O, writes it (through this warp's rows of the Q tile, so global
// stores are full 16-byte chunks) and the log-sum-exp. A row that saw no key
// has sum 0 and writes 0 and lse = -inf. Chunks past the caller's head dim
// (zero padding) are not stored.
template <class Cfg>
__device__ __forceinline__ void store_output(float (&o)[Cfg::kMTiles][Cfg::kOutTiles][4],
                                             const float (&row_max)[Cfg::kMTiles][2],
                                             const float (&row_sum)[Cfg::kMTiles][2], unsigned char* staging,
                                             unsigned short* out, long long out_row_stride, long long out_head_stride,
                                             float* lse, long long lse_row_stride, long long lse_head_stride, int q0,
                                             int warp_row0, int rows, int group, int chunks_valid, float lse_scale,
                                             int lane) {
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
        *reinterpret_cast<unsigned*>(staging + swizzled_bytes<Cfg, Cfg::kBlockQ>(row, n) + (lane & 3) * 4) =
            pack2<Element>(o[m][n][2 * half] * inverse, o[m][n][2 * half + 1] * inverse);
      }
      if (lse != nullptr && (lane & 3) == 0 && q0 + row < rows) {
        // Natural log: max·lse_scale + ln(sum).
        lse[row_offset<Cfg>(q0 + row, group, lse_row_stride, lse_head_stride)] =
            sum > 0.f ? row_max[m][half] * lse_scale + fast_log2(sum) * 0.69314718055994531f : -kInfinity;
      }
    }
  }
  __syncwarp();
  constexpr int kChunks = Cfg::kRowsPerWarp * Cfg::kChunksPerRow;
  static_assert(kChunks % 32 == 0, "whole warp passes");
#pragma unroll
  for (int i = 0; i < kChunks / 32; ++i) {
    const int chunk = i * 32 + lane;
    const int row = warp_row0 + chunk / Cfg::kChunksPerRow;
    const int column_chunk = chunk % Cfg::kChunksPerRow;
    if (q0 + row < rows && column_chunk < chunks_valid) {
      const uint4 value = *reinterpret_cast<const uint4*>(staging + swizzled_bytes<Cfg, Cfg::kBlockQ>(row, column_chunk));
      unsigned short* const destination =
          out + row_offset<Cfg>(q0 + row, group, out_row_stride, out_head_stride) + column_chunk * 8;
      if constexpr (Cfg::kUnaligned) {
        // Unaligned rows: element by element, up to the head dim.
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
      cp_async_16(tile + swizzled_bytes<Cfg, Cfg::kBlockKV>(row, chunk), source, valid);
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

// Applies RoPE to rows [first_row, first_row + ROWS) of a swizzled tile of
// TILE_ROWS rows, shared by THREADS threads of which this is `thread`;
// position_of(row) is tile row `row`'s position; PACKED: packed 16-bit
// arithmetic (rope.cuh).
template <class Cfg, int ROWS, int TILE_ROWS, int THREADS, bool PACKED, typename PositionOf>
__device__ __forceinline__ void rotate_tile(unsigned char* tile, const FwdParams& p, PositionOf&& position_of,
                                            int first_row, int thread) {
  constexpr int kTableUnitsInFlight = Cfg::kWgmma && Cfg::kHeadDim > 128 ? 1 : 2;
  rotate_rows<typename Cfg::Element, Cfg::kRope, Cfg::kRotaryDim, Cfg::kRopeTables, ROWS, THREADS, PACKED,
              kTableUnitsInFlight>(
      p,
      [&](int row, int chunk) {
        return reinterpret_cast<uint4*>(tile + swizzled_bytes<Cfg, TILE_ROWS>(first_row + row, chunk));
      },
      [&](int row) { return position_of(first_row + row); }, thread);
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
    rotate_consecutive_rows<typename Cfg::Element, Cfg::kRope, Cfg::kRotaryDim, ROWS, THREADS, WORDS, SPREAD_RUNS,
                            PACKED>(
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
  // rotated).
  __device__ __forceinline__ void rotate(unsigned char* k_tile, const FwdParams& p, int position0, int) {
    rotate_consecutive_tile<Cfg, Cfg::kBlockKV, Cfg::kBlockKV, Cfg::kProducerThreads, ProducerKeyPieces<Cfg>::kWords,
                            /*SPREAD_RUNS=*/true, /*PACKED=*/true>(k_tile, p, position0, 0,
                                                                   threadIdx.x % Cfg::kProducerThreads);
  }
};

template <class Cfg>
struct ProducerKeyRotation<Cfg, true> {
  using Pieces = ProducerKeyPieces<Cfg>;
  SteppedKeyRotation<typename Cfg::Element, Cfg::kRope, Cfg::kRotaryDim, Cfg::kBlockKV, Cfg::kProducerThreads,
                     Pieces::kWords, Pieces::kNarrowRegisters>
      stepped;
  __device__ __forceinline__ ProducerKeyRotation(const FwdParams& p, int thread) : stepped(p, thread) {}
  __device__ __forceinline__ void rotate(unsigned char* k_tile, const FwdParams& p, int position0, int tile_index) {
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
// diagonal_offset (bottom-right alignment), bounded by causal or the window.
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
  first_block = static_cast<int>(kv_begin / Cfg::kBlockKV);
  end_block = kv_end > kv_begin ? static_cast<int>((kv_end + Cfg::kBlockKV - 1) / Cfg::kBlockKV) : first_block;
}

// Whether the key block at key0 crosses a boundary for some row of the
// tile (the sequence's end, the causal diagonal, a window edge): only such
// blocks pay for masking.
template <class Cfg>
__device__ __forceinline__ bool block_needs_mask(const FwdParams& p, int key0, int seqlen_k, int first_query,
                                                 int last_query, int diagonal_offset) {
  bool needs_mask = key0 + Cfg::kBlockKV > seqlen_k;
  if constexpr (Cfg::kCausal) needs_mask = needs_mask || key0 + Cfg::kBlockKV - 1 > first_query + diagonal_offset;
  if constexpr (Cfg::kLocal) {
    needs_mask = needs_mask || key0 + Cfg::kBlockKV - 1 > first_query + diagonal_offset + p.window_right ||
                 key0 < last_query + diagonal_offset - p.window_left;
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

// One tile of the grid, as locate_tile finds it: its sequence's rows,
// lengths and the key blocks [first_block, end_block) its queries may see.
struct TileJob {
  const unsigned short* q;
  const unsigned short* k;
  const unsigned short* v;
  unsigned short* out;
  float* lse;
  int batch, head, q0, seqlen_q, seqlen_k, rows, group, chunks_valid;
  int diagonal_offset, first_block, end_block;
  int split;  // Split-KV: which slice of the keys (0 without)
};

// The producer layout (Cfg::kProducer): warps 0-3 copy Q and each K/V block
// into a ring of kStages stages and rotate K for RoPE; the MMA warps
// wait for a stage, compute, and hand it back. K and V of a stage are handed
// over and back separately: the MMA warps are done with K once S = Q Kᵀ is
// computed, which (with wgmma) is a whole block before they are done with V,
// so the producer refills K stages that much earlier. Hand-offs are
// mbarriers in shared memory after the ring, per stage:
//   - "K ready": K may be read. Without RoPE, the copies complete it (tensor
//     copies: one arrival announcing the block's bytes; cp.async: one
//     arrival per producer thread); with RoPE the producer's 128 threads arrive after rotating
//     K, once "K landed" (cp.async completion) has told them it is there;
//   - "K free" and "V free": every MMA thread arrives when done reading;
//   - "V landed": completed by the copies, as "K ready" without RoPE (a
//     varlen block past its sequence: by tracked cp.async, produce_tiles);
// then per Q buffer "Q landed" (the MMA warps rotate Q themselves for RoPE,
// each its own rows, while the producer rotates the first K block) and,
// persistent, "Q free" (the MMA warps have stored the output they staged in
// its rows). Block i of the CTA's sequence (the key blocks from the last
// down) uses stage i % kStages in phase (i / kStages) & 1; a persistent CTA
// counts its blocks on across its tiles (RingPosition).
template <class Cfg>
struct Ring {
  static constexpr int kStageKBytes = Cfg::kSmemK * 2;
  static constexpr int kStageVBytes = Cfg::kSmemV * 2;
  static constexpr int kQBytes = Cfg::kQBuffers * Cfg::kSmemQ * 2;
  unsigned base;  // shared-window address of the first Q tile (start of shared memory)
  __device__ __forceinline__ unsigned q_tile(int b) const { return base + b * Cfg::kSmemQ * 2; }
  __device__ __forceinline__ unsigned k_stage(int s) const { return base + kQBytes + s * kStageKBytes; }
  __device__ __forceinline__ unsigned v_stage(int s) const {
    return base + kQBytes + Cfg::kStages * kStageKBytes + s * kStageVBytes;
  }
  __device__ __forceinline__ unsigned barrier(int index) const { return base + Cfg::kBarrierOffset + index * 8; }
  __device__ __forceinline__ unsigned k_ready(int s) const { return barrier(s); }
  __device__ __forceinline__ unsigned k_landed(int s) const { return barrier(Cfg::kStages + s); }
  __device__ __forceinline__ unsigned k_free(int s) const { return barrier(2 * Cfg::kStages + s); }
  __device__ __forceinline__ unsigned v_landed(int s) const { return barrier(3 * Cfg::kStages + s); }
  __device__ __forceinline__ unsigned v_free(int s) const { return barrier(4 * Cfg::kStages + s); }
  __device__ __forceinline__ unsigned q_landed(int b) const { return barrier(5 * Cfg::kStages + b); }
  __device__ __forceinline__ unsigned q_free(int b) const { return barrier(5 * Cfg::kStages + 2 + b); }
  // Unaligned rows (Cfg::kStagedRows): the staging slots and their barriers.
  __device__ __forceinline__ unsigned staging(int slot) const {
    return base + Cfg::kStagingOffset + slot * Cfg::kStagingSlotBytes;
  }
  __device__ __forceinline__ unsigned k_staged(int slot) const {
    return barrier(5 * Cfg::kStages + Cfg::kQBarriers + slot);
  }
  __device__ __forceinline__ unsigned v_staged(int slot) const {
    return barrier(5 * Cfg::kStages + Cfg::kQBarriers + Cfg::kStagingSlots + slot);
  }
  __device__ __forceinline__ unsigned q_staged() const {
    return barrier(5 * Cfg::kStages + Cfg::kQBarriers + 2 * Cfg::kStagingSlots);
  }

  // Every barrier, by thread 0 before the CTA's first __syncthreads.
  __device__ __forceinline__ void init() const {
    for (int s = 0; s < Cfg::kStages; ++s) {
      // Tensor copies: one arrival (with the bytes to expect) per phase, on
      // "K landed" where the producer rotates K and then arrives on "K ready".
      mbarrier_init(k_ready(s), Cfg::kTensorCopies && !Cfg::kRotateKeys ? 1 : Cfg::kProducerThreads);
      mbarrier_init(k_landed(s), Cfg::kTensorCopies && Cfg::kRotateKeys ? 1 : Cfg::kProducerThreads);
      mbarrier_init(k_free(s), Cfg::kWarps * 32);
      mbarrier_init(v_landed(s), Cfg::kTensorCopies ? 1 : Cfg::kProducerThreads);
      mbarrier_init(v_free(s), Cfg::kWarps * 32);
    }
    for (int b = 0; b < Cfg::kQBuffers; ++b) {
      mbarrier_init(q_landed(b), Cfg::kProducerThreads);
      if (Cfg::kPersistent) mbarrier_init(q_free(b), Cfg::kWarps * 32);
    }
    if constexpr (Cfg::kStagedRows) {
      for (int slot = 0; slot < Cfg::kStagingSlots; ++slot) {
        mbarrier_init(k_staged(slot), Cfg::kProducerThreads);
        mbarrier_init(v_staged(slot), Cfg::kProducerThreads);
      }
      mbarrier_init(q_staged(), Cfg::kProducerThreads);
    }
    if constexpr (Cfg::kTensorCopies) fence_barrier_init();
  }
};

// Where a tile starts in the ring: the CTA's tiles before it (which Q buffer,
// and its phase) and their key blocks (which stage, and its phase). Zero for
// a CTA's only tile.
struct RingPosition {
  int tile = 0;
  int block = 0;
  __device__ __forceinline__ int q_buffer() const { return tile & 1; }
  __device__ __forceinline__ unsigned q_phase() const { return static_cast<unsigned>((tile >> 1) & 1); }
};

template <class Cfg>
__device__ __forceinline__ void produce_tiles(const FwdParams& p, const TileJob& job, const Ring<Cfg>& ring,
                                              unsigned char* shared_bytes, RingPosition at = {}) {
  constexpr int kStages = Cfg::kStages;
  // With RoPE and wgmma, K is copied kStages - 1 blocks ahead of the one
  // being rotated, as soon as its stage is handed back, and V a block later
  // than K (after K of its block is ready): the wgmma consumer issues block
  // i's P V with block i + 1's S, so V is needed a block after K, and a
  // producer waiting for a V stage would hold up the rotation. Otherwise K
  // and V of a block are copied together: the mma.sync consumer reads V
  // right after K, and without RoPE copying V a block later measured 2-8%
  // slower (docs/PERFORMANCE.md).
  constexpr bool kVLate = Cfg::kWgmma && Cfg::kRotateKeys;
  const int blocks = job.end_block - job.first_block;
  auto key0_of = [&](int i) { return (job.end_block - 1 - i) * Cfg::kBlockKV; };
  // Varlen and KV caches with tensor copies: the maps span every sequence's
  // rows, so a block that ends past its sequence would read the next
  // sequence's rows (or a KV cache's unused ones past cache_seqlens, or
  // through block-table entries past the sequence's pages, which may be
  // unset). K's rows there are harmless (those scores are masked by
  // selection), but V's must be zeros: P = 0 times a NaN is NaN. That V
  // block (and, paged, its K block) is copied by every producer thread with
  // zero-filling cp.async instead, tracked on the stage's barrier.
  // Only block 0 (the last the tile sees: blocks go from the last down) can
  // end past the sequence, so only the prologue's copy of it checks, and
  // the main loop keeps no registers for it.
  const int k_row0 = Cfg::kVarlenKeys ? p.cu_seqlens_k[job.batch] : 0;
  const int* pages = Cfg::kPaged ? p.block_table + job.batch * p.block_table_stride : nullptr;
  // The map's outermost coordinate: the batch, a contiguous cache's batch
  // (cache_batch_idx), or (paged) the page, looked up per copy.
  const int map_batch = Cfg::kKVCache && !Cfg::kPaged && p.kv_batch_index != nullptr ? p.kv_batch_index[job.batch]
                                                                                      : job.batch;
  constexpr int kCopyThreads = Cfg::kPaged ? 32 : 1;
  // Copies block i of this tile (block at.block + i of the CTA's ring) of K
  // or of V into its stage once the stage is free. Tensor copies: one copy
  // per 64-channel panel (and page); the KV head is the tile's query head
  // (packed or not) over the group size. `first`: block 0.
  auto issue = [&](int i, bool values, bool first) {
    const int r = at.block + i, s = r % kStages;
    const bool past_end = (Cfg::kVarlen || Cfg::kKVCache) && first && key0_of(0) + Cfg::kBlockKV > job.seqlen_k;
    const bool by_threads = !Cfg::kTensorCopies || (past_end && (values || Cfg::kPaged)) ||
                            (Cfg::kPaged && p.page_shift < Cfg::kMinTensorCopyPageShift);
    const int lane = threadIdx.x % Cfg::kProducerThreads;
    if (!by_threads && lane >= kCopyThreads) return;
    // Tensor copies read a block, or (paged) a page shorter than a block
    // per lane: the map's box. The page is looked up before the wait for a
    // free stage, so the table read overlaps it.
    const int copy_rows = Cfg::kPaged ? min(Cfg::kBlockKV, 1 << p.page_shift) : Cfg::kBlockKV;
    int page = 0;
    if (Cfg::kPaged && !by_threads && lane * copy_rows < Cfg::kBlockKV) {
      page = pages[(key0_of(i) + lane * copy_rows) >> p.page_shift];
    }
    // Tensor copies leave producer threads other than 0 free to run ahead
    // to the next tile (persistent); a parity wait more than one phase
    // ahead of the barrier would pass at once, so they first meet thread 0.
    if (Cfg::kTensorCopies && Cfg::kPersistent && by_threads) {
      named_barrier_sync<Cfg::kProducerBarrier, Cfg::kProducerThreads>();
    }
    if (r >= kStages) mbarrier_wait(values ? ring.v_free(s) : ring.k_free(s), (r / kStages - 1) & 1);
    const unsigned stage = values ? ring.v_stage(s) : ring.k_stage(s);
    if constexpr (Cfg::kTensorCopies) {
      constexpr int kPanels = Cfg::kRowElems / 64;
      const unsigned barrier = values ? ring.v_landed(s) : Cfg::kRotateKeys ? ring.k_landed(s) : ring.k_ready(s);
      const int kv_head = job.head / p.heads_per_kv;
      if (by_threads) {
        if constexpr (Cfg::kVarlenKeys) {
          // (The sequence's V rows from the parameters, not job.v: the
          // three-warpgroup producer's 32 registers spilled holding it.)
          const unsigned short* v_rows = static_cast<const unsigned short*>(p.v) +
                                         static_cast<long long>(k_row0) * p.v_row_stride + kv_head * p.v_head_stride;
          load_tile_rolled<Cfg, Cfg::kBlockKV>(stage, v_rows, p.v_row_stride, key0_of(i), job.seqlen_k,
                                               job.chunks_valid);
        } else if constexpr (Cfg::kPaged) {
          // A row at a time whatever the page size (the block that ends
          // past the sequence, and pages too short for a tensor copy): the
          // strided copy of whole pages, unrolled beside the producer's
          // 40-56 registers above head_dim 128, spilled 540 bytes.
          load_paged_rows<Cfg>(stage, values ? job.v : job.k, values ? p.v_row_stride : p.k_row_stride,
                               values ? p.v_batch_stride : p.k_batch_stride, pages, p.page_shift, key0_of(i),
                               job.seqlen_k, job.chunks_valid);
        } else {
          load_tile_rolled<Cfg, Cfg::kBlockKV>(stage, job.v, p.v_row_stride, key0_of(i), job.seqlen_k,
                                               job.chunks_valid);
        }
        cp_async_mbarrier_track(barrier);
        cp_async_commit();
        // Every thread's copies are tracked before the one counted arrival.
        named_barrier_sync<Cfg::kProducerBarrier, Cfg::kProducerThreads>();
        if (threadIdx.x % Cfg::kProducerThreads == 0) mbarrier_arrive(barrier);
        return;
      }
      // The byte count may be announced after some copies have completed
      // (the barrier's transaction count goes negative meanwhile): the phase
      // cannot complete before this one counted arrival.
      if (lane == 0) mbarrier_arrive_expect_bytes(barrier, kPanels * Cfg::kBlockKV * 128);
      if (lane * copy_rows >= Cfg::kBlockKV) return;
      const int key = key0_of(i) + lane * copy_rows;
      const int row = Cfg::kPaged ? key & ((1 << p.page_shift) - 1) : k_row0 + key;
      const int outer = Cfg::kPaged ? page : map_batch;
      const TensorMap* map = values ? &p.v_map : &p.k_map;
#pragma unroll
      for (int panel = 0; panel < kPanels; ++panel) {
        const unsigned destination = stage + (panel * Cfg::kBlockKV + lane * copy_rows) * 128;
        if constexpr (Cfg::kVarlenKeys) {
          tensor_copy_3d(destination, map, barrier, panel * 64, row, kv_head);
        } else {
          tensor_copy_4d(destination, map, barrier, panel * 64, row, kv_head, outer);
        }
      }
    } else {
      // A paged KV cache: the batch strides are page strides, and the
      // sequence's pages come from its row of the block table.
      load_kv_tile<Cfg>(stage, values ? job.v : job.k, values ? p.v_row_stride : p.k_row_stride,
                        values ? p.v_batch_stride : p.k_batch_stride, pages, Cfg::kPaged ? p.page_shift : 0,
                        key0_of(i), job.seqlen_k, job.chunks_valid);
      cp_async_mbarrier_arrive(values ? ring.v_landed(s) : Cfg::kRotateKeys ? ring.k_landed(s) : ring.k_ready(s));
      cp_async_commit();
    }
  };
  auto issue_k = [&](int i, bool first = false) { issue(i, false, first); };
  auto issue_v = [&](int i, bool first = false) { issue(i, true, first); };
  // Persistent: the Q buffer is free once the MMA warps have stored the
  // output of the CTA's tile before last from it.
  const int q_buffer = at.q_buffer();
  if (Cfg::kPersistent && at.tile >= 2) mbarrier_wait(ring.q_free(q_buffer), at.q_phase() ^ 1);
  if constexpr (Cfg::kPackGqa) {
    load_packed_q<Cfg>(ring.q_tile(q_buffer), job.q, p.q_row_stride, p.q_head_stride, job.q0, job.rows, job.group,
                       job.chunks_valid);
  } else {
    load_tile<Cfg, Cfg::kBlockQ>(ring.q_tile(q_buffer), job.q, p.q_row_stride, job.q0, job.seqlen_q,
                                 job.chunks_valid);
  }
  cp_async_mbarrier_arrive(ring.q_landed(q_buffer));
  cp_async_commit();
  // Up to kStages - 1 blocks ahead of the one being rotated.
  for (int i = 0; i < kStages - 1 && i < blocks; ++i) {
    issue_k(i, i == 0);
    if constexpr (!kVLate) issue_v(i, i == 0);
  }
  int key_position0 = 0, query_position0 = 0;
  if constexpr (Cfg::kRope != kRopeNone) {
    rope_positions(p, job.batch, job.diagonal_offset, key_position0, query_position0);
  }
  ProducerKeyRotation<Cfg> key_rotation(p, threadIdx.x % Cfg::kProducerThreads);
  for (int i = 0; i < blocks; ++i) {
    if constexpr (Cfg::kRotateKeys) {
      // K landed, for every producer thread (rotation units span chunks
      // that other threads copied).
      const int r = at.block + i, s = r % kStages;
      mbarrier_wait(ring.k_landed(s), (r / kStages) & 1);
      key_rotation.rotate(shared_bytes + (ring.k_stage(s) - ring.base), p, key_position0 + key0_of(i), i);
      // wgmma reads tiles through the async proxy: the rotated stores must
      // be ordered before those reads.
      if constexpr (Cfg::kWgmma) fence_async_shared();
      mbarrier_arrive(ring.k_ready(s));
    }
    if (i + kStages - 1 < blocks) {
      issue_k(i + kStages - 1);
      if constexpr (!kVLate) issue_v(i + kStages - 1);
    }
    if constexpr (kVLate) issue_v(i, i == 0);
  }
  // The last copies complete before the producer's threads exit (a
  // persistent producer waits once, after its last tile).
  if constexpr (!Cfg::kPersistent) cp_async_wait<0>();
}

// produce_tiles for unaligned rows (Cfg::kStagedRows): each K/V block's
// covering blocks are copied into staging slot i % kStagingSlots, which runs
// kStagingSlots - 1 blocks ahead; once a slot's copies have landed, the
// producer shifts K (and rotates it, RoPE) into its stage when that is free,
// then V, and hands each over with one arrival per thread. Q goes the same
// way through the last slot before the first block (packed GQA: element by
// element, load_packed_q). Ordinary grids only.
template <class Cfg>
__device__ __forceinline__ void produce_tiles_unaligned(const FwdParams& p, const TileJob& job, const Ring<Cfg>& ring,
                                                        unsigned char* shared_bytes) {
  constexpr int kStages = Cfg::kStages;
  constexpr int kSlots = Cfg::kStagingSlots;
  constexpr int kVStagingBytes = Cfg::kBlockKV * Cfg::kStagingRowBytes;  // V's rows follow K's in a slot
  const int blocks = job.end_block - job.first_block;
  auto key0_of = [&](int i) { return (job.end_block - 1 - i) * Cfg::kBlockKV; };
  auto k_rows = [&](int i) { return job.k + static_cast<long long>(key0_of(i)) * p.k_row_stride; };
  auto v_rows = [&](int i) { return job.v + static_cast<long long>(key0_of(i)) * p.v_row_stride; };
  const unsigned short* const q_rows = job.q + static_cast<long long>(job.q0) * p.q_row_stride;
  auto bytes = [&](unsigned address) { return shared_bytes + (address - ring.base); };
  auto stage_block = [&](int i) {
    const unsigned slot = ring.staging(i % kSlots);
    stage_strided_rows<Cfg, Cfg::kBlockKV>(slot, k_rows(i), p.k_row_stride, job.seqlen_k - key0_of(i));
    cp_async_mbarrier_arrive(ring.k_staged(i % kSlots));
    stage_strided_rows<Cfg, Cfg::kBlockKV>(slot + kVStagingBytes, v_rows(i), p.v_row_stride, job.seqlen_k - key0_of(i));
    cp_async_mbarrier_arrive(ring.v_staged(i % kSlots));
    cp_async_commit();
  };
  // Packed GQA: Q's rows are not at one stride (row_offset); they are read
  // element by element below (load_packed_q, once per tile) instead.
  if constexpr (!Cfg::kPackGqa) {
    stage_strided_rows<Cfg, Cfg::kBlockQ>(ring.staging(kSlots - 1), q_rows, p.q_row_stride, job.seqlen_q - job.q0);
    cp_async_mbarrier_arrive(ring.q_staged());
    cp_async_commit();
  }
  for (int i = 0; i < kSlots - 1 && i < blocks; ++i) stage_block(i);
  zero_unused_chunks<Cfg, Cfg::kBlockQ>(ring.q_tile(0));
  for (int s = 0; s < kStages; ++s) {
    zero_unused_chunks<Cfg, Cfg::kBlockKV>(ring.k_stage(s));
    zero_unused_chunks<Cfg, Cfg::kBlockKV>(ring.v_stage(s));
  }
  if constexpr (Cfg::kPackGqa) {
    load_packed_q<Cfg>(ring.q_tile(0), job.q, p.q_row_stride, p.q_head_stride, job.q0, job.rows, job.group,
                       job.chunks_valid);
  } else {
    mbarrier_wait(ring.q_staged(), 0);
    shift_strided_rows<Cfg, Cfg::kBlockQ>(bytes(ring.q_tile(0)), bytes(ring.staging(kSlots - 1)), q_rows,
                                          p.q_row_stride);
  }
  // wgmma reads the tiles through the async proxy: every store before the
  // hand-over is ordered before those reads.
  fence_async_shared();
  mbarrier_arrive(ring.q_landed(0));
  int key_position0 = 0, query_position0 = 0;
  if constexpr (Cfg::kRope != kRopeNone) {
    rope_positions(p, job.batch, job.diagonal_offset, key_position0, query_position0);
  }
  ProducerKeyRotation<Cfg> key_rotation(p, threadIdx.x % Cfg::kProducerThreads);
  for (int i = 0; i < blocks; ++i) {
    const int slot = i % kSlots, s = i % kStages;
    const unsigned staged_phase = (i / kSlots) & 1, free_phase = (i / kStages - 1) & 1;
    mbarrier_wait(ring.k_staged(slot), staged_phase);
    if (i >= kStages) mbarrier_wait(ring.k_free(s), free_phase);
    shift_strided_rows<Cfg, Cfg::kBlockKV>(bytes(ring.k_stage(s)), bytes(ring.staging(slot)), k_rows(i),
                                           p.k_row_stride);
    if constexpr (Cfg::kRotateKeys) {
      // Rotation units span chunks that other threads shifted.
      named_barrier_sync<Cfg::kProducerBarrier, Cfg::kProducerThreads>();
      key_rotation.rotate(bytes(ring.k_stage(s)), p, key_position0 + key0_of(i), i);
    }
    fence_async_shared();
    mbarrier_arrive(ring.k_ready(s));
    mbarrier_wait(ring.v_staged(slot), staged_phase);
    if (i >= kStages) mbarrier_wait(ring.v_free(s), free_phase);
    shift_strided_rows<Cfg, Cfg::kBlockKV>(bytes(ring.v_stage(s)), bytes(ring.staging(slot) + kVStagingBytes),
                                           v_rows(i), p.v_row_stride);
    fence_async_shared();
    mbarrier_arrive(ring.v_landed(s));
    if (i + kSlots - 1 < blocks) {
      // Block i + kSlots - 1 goes to the slot block i - 1 (or Q) came from:
      // every thread is done reading it once all are past this barrier.
      named_barrier_sync<Cfg::kProducerBarrier, Cfg::kProducerThreads>();
      stage_block(i + kSlots - 1);
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void consume_tiles(const FwdParams& p, const TileJob& job, const Ring<Cfg>& ring,
                                              unsigned char* shared_bytes) {
  constexpr int kStages = Cfg::kStages;
  const int lane = threadIdx.x & 31;
  const int warp_row0 = ((threadIdx.x - Cfg::kProducerThreads) >> 5) * Cfg::kRowsPerWarp;
  float slopes[Cfg::kMTiles][2];
  if constexpr (Cfg::kAlibi) load_row_slopes<Cfg>(slopes, p, job.batch, job.head, job.q0 + warp_row0, job.group, lane);
  // This warp's rows see fewer key blocks than the whole tile: it skips the
  // others (still waiting for each stage, so that its hand-backs stay in
  // step with the ring's phases).
  const int first_query = query_position<Cfg>(job.q0 + warp_row0, job.group);
  const int last_query = Cfg::kPackGqa
                             ? query_position<Cfg>(max(min(job.q0 + warp_row0 + Cfg::kRowsPerWarp, job.rows) - 1,
                                                       job.q0 + warp_row0), job.group)
                             : job.q0 + warp_row0 + Cfg::kRowsPerWarp - 1;
  int warp_first_block, warp_end_block;
  visible_blocks<Cfg>(p, job.seqlen_k, job.diagonal_offset, first_query, last_query, warp_first_block, warp_end_block);

  float o[Cfg::kMTiles][Cfg::kOutTiles][4];
  float row_max[Cfg::kMTiles][2];
  float row_sum[Cfg::kMTiles][2];
  clear_accumulators<Cfg>(o, row_max, row_sum);
  mbarrier_wait(ring.q_landed(0), 0);
  if constexpr (Cfg::kRope != kRopeNone) {
    // Each warp rotates its own Q rows (only it reads them).
    int key_position0, query_position0;
    rope_positions(p, job.batch, job.diagonal_offset, key_position0, query_position0);
    rotate_q_rows<Cfg, Cfg::kRowsPerWarp, 32, Cfg::kQRotationWords>(shared_bytes, p, query_position0, job.q0,
                                                                    job.group, warp_row0, lane);
    __syncwarp();
  }
  const int blocks = job.end_block - job.first_block;
  for (int i = 0; i < blocks; ++i) {
    const int s = i % kStages;
    const unsigned parity = (i / kStages) & 1;
    const int block = job.end_block - 1 - i;
    const int key0 = block * Cfg::kBlockKV;
    mbarrier_wait(ring.k_ready(s), parity);
    if (block >= warp_first_block && block < warp_end_block) {
      float s_acc[Cfg::kMTiles][Cfg::kScoreTiles][4];
      gemm_qk<Cfg>(s_acc, opaque(ring.base), opaque(ring.k_stage(s)), warp_row0, lane);
      if constexpr (Cfg::kRewriteScores) {
        rewrite_scores<Cfg>(s_acc, p, slopes, job.q0 + warp_row0, key0, job.diagonal_offset, lane);
      }
      if (block_needs_mask<Cfg>(p, key0, job.seqlen_k, first_query, last_query, job.diagonal_offset)) {
        apply_mask<Cfg>(s_acc, p, job.seqlen_k, job.q0 + warp_row0, key0, job.diagonal_offset, lane);
      }
      online_softmax<Cfg>(s_acc, o, row_max, row_sum, p.scale_log2);
      unsigned probabilities[Cfg::kMTiles][Cfg::kBlockKV / 16][4];
      pack_probabilities<Cfg>(probabilities, s_acc);
      mbarrier_wait(ring.v_landed(s), parity);
      gemm_pv<Cfg>(o, probabilities, opaque(ring.v_stage(s)), lane);
    } else {
      // The stage's V copy lands before the producer may copy into it again.
      mbarrier_wait(ring.v_landed(s), parity);
    }
    mbarrier_arrive(ring.k_free(s));
    mbarrier_arrive(ring.v_free(s));
  }
  allow_dependent_launch();
  // Each warp stages its output in its own Q rows, which only it reads.
  store_output<Cfg>(o, row_max, row_sum, shared_bytes, job.out, p.o_row_stride, p.o_head_stride, job.lse,
                    p.lse_row_stride, p.lse_head_stride, job.q0, warp_row0, job.rows, job.group, job.chunks_valid,
                    p.lse_scale, lane);
}

// The wgmma consumer (Cfg::kWgmma): each warpgroup of MMA warps owns 64
// rows of the tile, warp w of it rows 16w..16w+15, with accumulators in the
// mma.sync C-fragment layout, so masking, the softmax and the epilogue are
// the mma.sync kernel's. S = Q Kᵀ reads Q and K through descriptors; O += P V
// takes P from registers and V through a descriptor of its N-major panels.
// The ring's hand-offs are those of consume_tiles, but the block skipping is
// per warpgroup: a wgmma is issued by all four of its warps together.
template <class Cfg>
__device__ __forceinline__ void consume_tiles_wgmma(const FwdParams& p, const TileJob& job, const Ring<Cfg>& ring,
                                                    unsigned char* shared_bytes, RingPosition at = {}) {
  using Element = typename Cfg::Element;
  constexpr int kStages = Cfg::kStages;
  constexpr int kGroupRows = 64;
  const int lane = threadIdx.x & 31;
  const int consumer = threadIdx.x - Cfg::kProducerThreads;
  const int warp_row0 = (consumer >> 5) * Cfg::kRowsPerWarp;
  const int group_row0 = (consumer >> 7) * kGroupRows;
  float slopes[Cfg::kMTiles][2];
  if constexpr (Cfg::kAlibi) load_row_slopes<Cfg>(slopes, p, job.batch, job.head, job.q0 + warp_row0, job.group, lane);
  const int first_query = query_position<Cfg>(job.q0 + group_row0, job.group);
  const int last_query = Cfg::kPackGqa
                             ? query_position<Cfg>(max(min(job.q0 + group_row0 + kGroupRows, job.rows) - 1,
                                                       job.q0 + group_row0), job.group)
                             : job.q0 + group_row0 + kGroupRows - 1;
  int group_first_block, group_end_block;
  visible_blocks<Cfg>(p, job.seqlen_k, job.diagonal_offset, first_query, last_query, group_first_block,
                      group_end_block);

  float o[Cfg::kMTiles][Cfg::kOutTiles][4];
  float row_max[Cfg::kMTiles][2];
  float row_sum[Cfg::kMTiles][2];
  clear_accumulators<Cfg>(o, row_max, row_sum);
  // S = Q Kᵀ for the block in `stage` (async). Q's and K's k-step ks: panel
  // ks / 4, 32-byte column ks % 4.
  const int q_buffer = at.q_buffer();
  unsigned char* const q_bytes = shared_bytes + q_buffer * Cfg::kSmemQ * 2;
  const unsigned q_rows = ring.q_tile(q_buffer) + group_row0 * 128;
  auto issue_qk = [&](float (&s_acc)[Cfg::kMTiles][Cfg::kScoreTiles][4], int stage) {
    // Copies that landed without a producer store (K without RoPE) reach
    // the async proxy through this thread's fence.
    fence_async_shared();
    wgmma_fence();
    auto q_at = [&](int ks) { return wgmma_descriptor(q_rows + (ks >> 2) * (Cfg::kBlockQ * 128) + (ks & 3) * 32, 16); };
    auto k_at = [&](int ks) {
      return wgmma_descriptor(ring.k_stage(stage) + (ks >> 2) * (Cfg::kBlockKV * 128) + (ks & 3) * 32, 16);
    };
    wgmma_ss<Element, Cfg::kBlockKV, false>(s_acc[0], q_at(0), k_at(0));
#pragma unroll
    for (int ks = 1; ks < Cfg::kHeadDim / 16; ++ks) wgmma_ss<Element, Cfg::kBlockKV, true>(s_acc[0], q_at(ks), k_at(ks));
    wgmma_commit();
  };
  // O += P V for the block in `stage` (async).
  auto issue_pv = [&](const unsigned (&probabilities)[Cfg::kMTiles][Cfg::kBlockKV / 16][4], int stage,
                      unsigned parity) {
    mbarrier_wait(ring.v_landed(stage), parity);
    fence_async_shared();
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Cfg::kBlockKV / 16; ++ks) {
      // Keys 16ks..16ks+15: two 8-row groups of every panel; panels (64
      // columns of V each) are kBlockKV rows apart.
      wgmma_rs_panels<Element, Cfg::kHeadDim>(o[0], probabilities[0][ks], ring.v_stage(stage) + ks * 16 * 128,
                                              Cfg::kBlockKV * 128);
    }
    wgmma_commit();
  };
  // Masking and the softmax of one block's scores; the corrections for O
  // are returned.
  auto softmax = [&](float (&s_acc)[Cfg::kMTiles][Cfg::kScoreTiles][4], int key0,
                     float (&corrections)[Cfg::kMTiles][2]) {
    if constexpr (Cfg::kRewriteScores) {
      rewrite_scores<Cfg>(s_acc, p, slopes, job.q0 + warp_row0, key0, job.diagonal_offset, lane);
    }
    if (block_needs_mask<Cfg>(p, key0, job.seqlen_k, first_query, last_query, job.diagonal_offset)) {
      apply_mask<Cfg>(s_acc, p, job.seqlen_k, job.q0 + warp_row0, key0, job.diagonal_offset, lane);
    }
    online_softmax<Cfg, kRescaleLater>(s_acc, o, row_max, row_sum, p.scale_log2, corrections);
  };
  auto key_block = [&](int i) { return job.end_block - 1 - i; };
  // Block i of this tile is block at.block + i of the CTA's ring.
  auto stage_of = [&](int i) { return (at.block + i) % kStages; };
  auto parity_of = [&](int i) { return static_cast<unsigned>(((at.block + i) / kStages) & 1); };
  // Turns (Cfg::kMmaTurns): warpgroup g waits on barrier kTurnBarrier0 + g
  // for the previous warpgroup's arrival, issues, and arrives on the next
  // one's. Every warpgroup takes blocks + 1 turns per tile (one per block,
  // seen or skipped, and one for the last P V), so the token goes round in
  // step whatever each warpgroup's mask lets it see. Warpgroup 0 holds the
  // token first.
  const int warpgroup = consumer >> 7;
  auto take_turn = [&] {
    if constexpr (Cfg::kMmaTurns) named_barrier_sync(Cfg::kTurnBarrier0 + warpgroup, 256);
  };
  auto pass_turn = [&] {
    if constexpr (Cfg::kMmaTurns) {
      named_barrier_arrive(Cfg::kTurnBarrier0 + (warpgroup + 1 == Cfg::kConsumerGroups ? 0 : warpgroup + 1), 256);
    }
  };
  if constexpr (Cfg::kMmaTurns) {
    if (at.tile == 0 && warpgroup == 0) named_barrier_arrive(Cfg::kTurnBarrier0, 256);
  }
  // A block this warpgroup does not see is handed back once its copies have
  // landed (before the producer may copy into the stage again).
  auto skip_block = [&](int i) {
    take_turn();
    pass_turn();
    mbarrier_wait(ring.k_ready(stage_of(i)), parity_of(i));
    mbarrier_arrive(ring.k_free(stage_of(i)));
    mbarrier_wait(ring.v_landed(stage_of(i)), parity_of(i));
    mbarrier_arrive(ring.v_free(stage_of(i)));
  };

  mbarrier_wait(ring.q_landed(q_buffer), at.q_phase());
  if constexpr (Cfg::kRope != kRopeNone) {
    // Each warpgroup rotates its own Q rows (only its wgmma read them) and
    // orders the stores before those reads (async proxy).
    int key_position0, query_position0;
    rope_positions(p, job.batch, job.diagonal_offset, key_position0, query_position0);
    rotate_q_rows<Cfg, kGroupRows, 128, Cfg::kQRotationWords>(q_bytes, p, query_position0, job.q0, job.group,
                                                              group_row0, consumer & 127);
    fence_async_shared();
    named_barrier_sync(2 + (consumer >> 7), 128);
  }
  const int blocks = job.end_block - job.first_block;
  // The group sees a contiguous run of the ring's blocks; before and after
  // it, stages are only handed back.
  int i = 0;
  for (; i < blocks && key_block(i) >= group_end_block; ++i) skip_block(i);
  if (i < blocks && key_block(i) >= group_first_block) {
    unsigned probabilities[Cfg::kMTiles][Cfg::kBlockKV / 16][4];
    {
      float s_acc[Cfg::kMTiles][Cfg::kScoreTiles][4];
      mbarrier_wait(ring.k_ready(stage_of(i)), parity_of(i));
      take_turn();
      issue_qk(s_acc, stage_of(i));
      pass_turn();
      wgmma_wait<0>();
      wgmma_hold(s_acc[0]);
      mbarrier_arrive(ring.k_free(stage_of(i)));
      float corrections[Cfg::kMTiles][2];
      softmax(s_acc, key_block(i) * Cfg::kBlockKV, corrections);
      pack_probabilities<Cfg>(probabilities, s_acc);
    }
    // One block behind: block i's S = Q Kᵀ is issued, then block i - 1's
    // P V, and the softmax of block i runs while that P V still
    // accumulates into O; O is rescaled once it has finished.
    for (++i; i < blocks && key_block(i) >= group_first_block; ++i) {
      float s_acc[Cfg::kMTiles][Cfg::kScoreTiles][4];
      mbarrier_wait(ring.k_ready(stage_of(i)), parity_of(i));
      take_turn();
      issue_qk(s_acc, stage_of(i));
      issue_pv(probabilities, stage_of(i - 1), parity_of(i - 1));
      pass_turn();
      wgmma_wait<1>();
      wgmma_hold(s_acc[0]);
      mbarrier_arrive(ring.k_free(stage_of(i)));
      float corrections[Cfg::kMTiles][2];
      softmax(s_acc, key_block(i) * Cfg::kBlockKV, corrections);
      wgmma_wait<0>();
      wgmma_hold(o[0]);
      mbarrier_arrive(ring.v_free(stage_of(i - 1)));
      rescale_output<Cfg>(o, corrections);
      pack_probabilities<Cfg>(probabilities, s_acc);
    }
    take_turn();
    issue_pv(probabilities, stage_of(i - 1), parity_of(i - 1));
    pass_turn();
    wgmma_wait<0>();
    wgmma_hold(o[0]);
    mbarrier_arrive(ring.v_free(stage_of(i - 1)));
  } else {
    // No block seen: the turn of the last P V.
    take_turn();
    pass_turn();
  }
  for (; i < blocks; ++i) skip_block(i);
  // A persistent CTA lets the next grid in after its last tile.
  if constexpr (!Cfg::kPersistent) allow_dependent_launch();
  if constexpr (Cfg::kSplit) {
    // Split-KV (a KV cache's packed rows over few tiles): the partial result
    // goes straight from the accumulators, with no staging in Q's rows.
    store_partial<Cfg>(o, row_max, row_sum, p, job.split, job.batch, job.head, job.q0, warp_row0, job.rows,
                       job.group, lane);
    return;
  }
  // Each warp stages its output in its own Q rows; the warpgroup's wgmma
  // reads of Q (all four warps' rows) have completed once all four are here.
  named_barrier_sync(2 + (consumer >> 7), 128);
  store_output<Cfg>(o, row_max, row_sum, q_bytes, job.out, p.o_row_stride, p.o_head_stride, job.lse,
                    p.lse_row_stride, p.lse_head_stride, job.q0, warp_row0, job.rows, job.group, job.chunks_valid,
                    p.lse_scale, lane);
  // Persistent: the producer may load a later tile's Q into these rows.
  if constexpr (Cfg::kPersistent) mbarrier_arrive(ring.q_free(q_buffer));
}

// Locates tile `index` of the flattened grid (what one CTA computes in an
// ordinary launch). Query blocks of one (batch, head) are adjacent, so CTAs
// that read the same K/V run together and share it in L2. Causal: a head's
// last query blocks see the most keys; running them first leaves the light
// blocks for the tail of the grid. Split-KV: the splits of one tile are
// adjacent too. Packed GQA: the grid's heads are KV heads, and a tile's rows
// cover every query head of the group. False when the tile is past its
// sequence's rows (varlen: the grid covers the longest sequence).
template <class Cfg>
__device__ __forceinline__ bool locate_tile(const FwdParams& p, int index, TileJob& job) {
  const int q_block = Cfg::kCausal ? p.num_q_blocks - 1 - index % p.num_q_blocks : index % p.num_q_blocks;
  const int split = Cfg::kSplit ? index / p.num_q_blocks % p.num_splits : 0;
  const int batch_head = index / p.num_q_blocks / (Cfg::kSplit ? p.num_splits : 1);
  const int group = Cfg::kPackGqa ? p.heads_per_kv : 1;
  const int grid_heads = Cfg::kPackGqa ? p.heads_kv : p.heads_q;
  const int batch = batch_head / grid_heads;
  const int kv_head = Cfg::kPackGqa ? batch_head % grid_heads : batch_head % grid_heads / p.heads_per_kv;
  // The (first) query head of this tile.
  const int head = Cfg::kPackGqa ? kv_head * group : batch_head % grid_heads;
  const int q0 = q_block * Cfg::kBlockQ;

  // Where this sequence's rows start, and its lengths (varlen: from the
  // offsets; dense: batch strides and the common lengths).
  long long q_start = batch * p.q_batch_stride, o_start = batch * p.o_batch_stride;
  long long k_start = batch * p.k_batch_stride, v_start = batch * p.v_batch_stride;
  long long lse_start = batch * p.lse_batch_stride;
  int seqlen_q = p.seqlen_q;
  int seqlen_k = p.seqlen_k;
  if constexpr (Cfg::kVarlen) {
    const int q_row0 = p.cu_seqlens_q[batch];
    seqlen_q = p.cu_seqlens_q[batch + 1] - q_row0;
    // (Over a paged cache with seqused_k, cu_seqlens_k may be absent: it is
    // read only for packed keys or lengths without seqused_k.)
    seqlen_k = p.seqused_k != nullptr ? p.seqused_k[batch] : p.cu_seqlens_k[batch + 1] - p.cu_seqlens_k[batch];
    if (q0 >= seqlen_q * group) return false;
    q_start = q_row0 * p.q_row_stride;
    o_start = q_row0 * p.o_row_stride;
    if constexpr (!Cfg::kKVCache) {
      const int k_row0 = p.cu_seqlens_k[batch];
      k_start = k_row0 * p.k_row_stride;
      v_start = k_row0 * p.v_row_stride;
    }
    lse_start = q_row0 * p.lse_row_stride;
  }
  if constexpr (Cfg::kKVCache) {
    // (Varlen over a paged cache: the lengths are the varlen ones above.)
    if constexpr (!Cfg::kVarlen) seqlen_k = p.seqused_k[batch] + p.seqlen_k_added;
    const int cache_batch = p.kv_batch_index != nullptr ? p.kv_batch_index[batch] : batch;
    // Paged: the batch strides are page strides, applied per tile.
    k_start = Cfg::kPaged ? 0 : cache_batch * p.k_batch_stride;
    v_start = Cfg::kPaged ? 0 : cache_batch * p.v_batch_stride;
  }
  job.batch = batch, job.head = head, job.q0 = q0, job.seqlen_q = seqlen_q, job.seqlen_k = seqlen_k;
  job.split = split;
  // Rows of this sequence's (packed) Q: queries × heads of the group.
  job.rows = seqlen_q * group, job.group = group;
  job.chunks_valid = Cfg::kUnaligned ? (Cfg::kColumns + 7) / 8 : Cfg::kPadded ? p.head_dim / 8 : Cfg::kChunksPerRow;
  job.q = static_cast<const unsigned short*>(p.q) + q_start + head * p.q_head_stride;
  job.k = static_cast<const unsigned short*>(p.k) + k_start + kv_head * p.k_head_stride;
  job.v = static_cast<const unsigned short*>(p.v) + v_start + kv_head * p.v_head_stride;
  job.out = static_cast<unsigned short*>(p.o) + o_start + head * p.o_head_stride;
  job.lse = p.lse == nullptr ? nullptr : p.lse + lse_start + head * p.lse_head_stride;
  // Query i sees keys around i + diagonal_offset (bottom-right alignment);
  // this block's first and last queries bound the keys worth loading.
  job.diagonal_offset = seqlen_k - seqlen_q;
  const int first_query = query_position<Cfg>(q0, group);
  const int last_query = Cfg::kPackGqa ? query_position<Cfg>(min(q0 + Cfg::kBlockQ, job.rows) - 1, group)
                                       : q0 + Cfg::kBlockQ - 1;
  visible_blocks<Cfg>(p, seqlen_k, job.diagonal_offset, first_query, last_query, job.first_block, job.end_block);
  if constexpr (Cfg::kSplit) {
    job.first_block = max(job.first_block, split * p.blocks_per_split);
    job.end_block = max(job.first_block, min(job.end_block, (split + 1) * p.blocks_per_split));
  }
  return true;
}

template <class Cfg>
__device__ __forceinline__ void fwd_prefill_specialized(const FwdParams& p, const TileJob& job,
                                                        unsigned char* shared_bytes) {
  const Ring<Cfg> ring{smem_u32(shared_bytes)};
  if (threadIdx.x == 0) ring.init();
  __syncthreads();
  if (threadIdx.x < Cfg::kProducerThreads) {
    warpgroup_registers_release<Cfg::kProducerRegisters>();
    if constexpr (Cfg::kStagedRows) {
      produce_tiles_unaligned<Cfg>(p, job, ring, shared_bytes);
    } else {
      produce_tiles<Cfg>(p, job, ring, shared_bytes);
    }
  } else {
    warpgroup_registers_claim<Cfg::kMmaRegisters>();
    if constexpr (Cfg::kWgmma) {
      consume_tiles_wgmma<Cfg>(p, job, ring, shared_bytes);
    } else {
      consume_tiles<Cfg>(p, job, ring, shared_bytes);
    }
  }
}

// Persistent (Cfg::kPersistent): the grid's gridDim.x CTAs (at most one wave)
// share the tiles that an ordinary launch gives one CTA each, in snake
// rounds: round r gives CTA c tile r · ctas + c of an order, or r · ctas +
// ctas − 1 − c in odd rounds. Causal tiles are ordered heaviest first (the
// last query block of every head, then the next to last, ...), so the heavy
// and light ends of the rounds even out each CTA's total. Grouping heads so
// that their K/V fit in L2 together breaks that descending order, and
// measured 1-17% slower from 4k keys (docs/PERFORMANCE.md). Other tiles
// weigh alike and keep the grid's order, in which neighbouring CTAs share a
// head's K/V in L2 (query block major, it measured up to 18% slower at head
// dim 128). work(job, at) runs for each of this CTA's tiles; producer and
// MMA warps walk the same tiles, and skip the same empty ones (varlen).
template <class Cfg, class Work>
__device__ __forceinline__ void walk_persistent_tiles(const FwdParams& p, const Work& work) {
  // Few values stay live across a tile (the MMA warps' registers are full):
  // the linear tile number, the round's parity and the ring position; the
  // rest is reread from the parameters and special registers.
  auto grid_heads = [&] { return (Cfg::kPackGqa ? p.heads_kv : p.heads_q) * p.batch; };
  RingPosition at;
  int linear = static_cast<int>(blockIdx.x);
  for (bool odd = false; linear < p.num_q_blocks * grid_heads(); odd = !odd) {
    // The grid index of the linear-th tile (causal: query block major).
    const int index = Cfg::kCausal ? linear % grid_heads() * p.num_q_blocks + linear / grid_heads() : linear;
    TileJob job;
    if (locate_tile<Cfg>(p, index, job)) {
      work(job, at);
      ++at.tile;
      at.block += job.end_block - job.first_block;
    }
    // Round r's tile r · ctas + c, or r · ctas + ctas − 1 − c in odd rounds.
    linear += odd ? 2 * static_cast<int>(blockIdx.x) + 1 : 2 * (static_cast<int>(gridDim.x - blockIdx.x)) - 1;
  }
}

// The producer runs ahead into the CTA's next tile (its Q into the other
// buffer, its first K/V blocks into the ring, K rotated for RoPE) while the
// MMA warps finish the current one, so only the last tile's epilogue is left
// uncovered. Each role has its own loop: register allocation follows the
// hand-over (setmaxnreg) only where the roles' code is apart (one shared
// loop spilled 350-480 bytes, ptxas 13.0 through nvcc).
template <class Cfg>
__device__ void fwd_prefill_persistent(const FwdParams& p, unsigned char* shared_bytes) {
  const Ring<Cfg> ring{smem_u32(shared_bytes)};
  if (threadIdx.x == 0) ring.init();
  __syncthreads();
  if (threadIdx.x < Cfg::kProducerThreads) {
    warpgroup_registers_release<Cfg::kProducerRegisters>();
    walk_persistent_tiles<Cfg>(p, [&](const TileJob& job, RingPosition at) {
      produce_tiles<Cfg>(p, job, ring, shared_bytes, at);
    });
    cp_async_wait<0>();
  } else {
    warpgroup_registers_claim<Cfg::kMmaRegisters>();
    walk_persistent_tiles<Cfg>(p, [&](const TileJob& job, RingPosition at) {
      consume_tiles_wgmma<Cfg>(p, job, ring, shared_bytes, at);
    });
    allow_dependent_launch();
  }
}

template <class Cfg>
__device__ void fwd_prefill(const FwdParams& p) {
  // 1 KB alignment: the address XOR steps (at most bit 8) must not carry into
  // the tile base.
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  if constexpr (Cfg::kPersistent) {
    fwd_prefill_persistent<Cfg>(p, shared_bytes);
    return;
  }
  TileJob job;
  if (!locate_tile<Cfg>(p, static_cast<int>(blockIdx.x), job)) return;
  if constexpr (Cfg::kProducer) {
    fwd_prefill_specialized<Cfg>(p, job, shared_bytes);
    return;
  }
  // Shared-window addresses (32-bit) of the three tiles; Q's rows are reused
  // to stage the output.
  const unsigned q_tile = smem_u32(shared_bytes);
  const unsigned k_tile = q_tile + Cfg::kSmemQ * 2;
  const unsigned v_tile = k_tile + Cfg::kSmemK * 2;
  const int lane = threadIdx.x & 31;
  const int warp_row0 = (threadIdx.x >> 5) * Cfg::kRowsPerWarp;
  const unsigned short* const q = job.q;
  const unsigned short* const k = job.k;
  const unsigned short* const v = job.v;
  const int batch = job.batch, head = job.head, q0 = job.q0, seqlen_q = job.seqlen_q, seqlen_k = job.seqlen_k;
  const int rows = job.rows, group = job.group, chunks_valid = job.chunks_valid;
  const int diagonal_offset = job.diagonal_offset, first_block = job.first_block, end_block = job.end_block;
  const int first_query = query_position<Cfg>(q0, group);
  const int last_query = Cfg::kPackGqa ? query_position<Cfg>(min(q0 + Cfg::kBlockQ, rows) - 1, group)
                                       : q0 + Cfg::kBlockQ - 1;
  const int* pages = Cfg::kPaged ? p.block_table + batch * p.block_table_stride : nullptr;
  float slopes[Cfg::kMTiles][2];
  if constexpr (Cfg::kAlibi) load_row_slopes<Cfg>(slopes, p, batch, head, q0 + warp_row0, group, lane);

  if constexpr (Cfg::kPackGqa) {
    load_packed_q<Cfg>(q_tile, q, p.q_row_stride, p.q_head_stride, q0, rows, group, chunks_valid);
  } else {
    load_tile<Cfg, Cfg::kBlockQ>(q_tile, q, p.q_row_stride, q0, seqlen_q, chunks_valid);
  }
  if (end_block > first_block) {
    load_kv_tile<Cfg>(k_tile, k, p.k_row_stride, p.k_batch_stride, pages, p.page_shift, (end_block - 1) * Cfg::kBlockKV,
                      seqlen_k, chunks_valid);
  }
  cp_async_commit();

  int key_position0 = 0, query_position0 = 0;
  if constexpr (Cfg::kRope != kRopeNone) {
    rope_positions(p, batch, diagonal_offset, key_position0, query_position0);
    // Q must land before it is rotated (K with it; the loop's barrier then
    // also orders these writes before the first Q·Kᵀ).
    cp_async_wait<0>();
    __syncthreads();
    rotate_q_rows<Cfg, Cfg::kBlockQ, Cfg::kThreads, 4>(shared_bytes, p, query_position0, q0, group, 0, threadIdx.x);
  }

  float o[Cfg::kMTiles][Cfg::kOutTiles][4];
  float row_max[Cfg::kMTiles][2];
  float row_sum[Cfg::kMTiles][2];
  clear_accumulators<Cfg>(o, row_max, row_sum);

  // Paged caches with pages of at least a tile: the page of the next block
  // is read one step ahead, so its latency does not delay that block's copy.
  const bool page_per_tile = Cfg::kPaged && (Cfg::kBlockKV >> p.page_shift) <= 1;
  int page_current = -1;
  if (Cfg::kPaged && page_per_tile && end_block > first_block) {
    page_current = pages[((end_block - 1) * Cfg::kBlockKV) >> p.page_shift];
  }
  for (int block = end_block - 1; block >= first_block; --block) {
    const int key0 = block * Cfg::kBlockKV;
    int page_next = -1;
    if (Cfg::kPaged && page_per_tile && block > first_block) page_next = pages[(key0 - Cfg::kBlockKV) >> p.page_shift];
    // This barrier has two jobs: K (and, first time, Q) has landed for every
    // thread, and every warp has finished reading V of the previous block, so
    // V may be overwritten.
    cp_async_wait<0>();
    __syncthreads();
    load_kv_tile<Cfg>(v_tile, v, p.v_row_stride, p.v_batch_stride, pages, p.page_shift, key0, seqlen_k, chunks_valid,
                      page_current);
    cp_async_commit();
    if constexpr (Cfg::kRotateKeys) {
      // Rotating K here costs 25-40% of a block's time (docs/PERFORMANCE.md):
      // each CTA rotates every K block it reads. Double-buffering K to overlap
      // the rotation with P V measured no faster (and spilled at head_dim 128);
      // the producer layout (Cfg::kProducer) rotates beside the MMA warps.
      rotate_k_tile<Cfg>(shared_bytes + Cfg::kSmemQ * 2, p, key_position0 + key0);
      __syncthreads();
    }

    float s[Cfg::kMTiles][Cfg::kScoreTiles][4];
    gemm_qk<Cfg>(s, opaque(q_tile), opaque(k_tile), warp_row0, lane);
    if constexpr (Cfg::kRewriteScores) {
      rewrite_scores<Cfg>(s, p, slopes, q0 + warp_row0, key0, diagonal_offset, lane);
    }
    if (block_needs_mask<Cfg>(p, key0, seqlen_k, first_query, last_query, diagonal_offset)) apply_mask<Cfg>(s, p, seqlen_k, q0 + warp_row0, key0, diagonal_offset, lane);

    // V has landed, and every warp is done with K, so the next K block may
    // stream in while P V (and, with kEarlyNextK, the softmax) runs.
    auto wait_v_then_load_next_k = [&] {
      cp_async_wait<0>();
      __syncthreads();
      if (block > first_block) {
        load_kv_tile<Cfg>(k_tile, k, p.k_row_stride, p.k_batch_stride, pages, p.page_shift, key0 - Cfg::kBlockKV,
                          seqlen_k, chunks_valid, page_next);
      }
      cp_async_commit();
    };
    if constexpr (Cfg::kEarlyNextK) {
      wait_v_then_load_next_k();
      online_softmax<Cfg>(s, o, row_max, row_sum, p.scale_log2);
    } else {
      online_softmax<Cfg>(s, o, row_max, row_sum, p.scale_log2);
      wait_v_then_load_next_k();
    }
    unsigned probabilities[Cfg::kMTiles][Cfg::kBlockKV / 16][4];
    pack_probabilities<Cfg>(probabilities, s);
    gemm_pv<Cfg>(o, probabilities, opaque(v_tile), lane);
    page_current = page_next;
  }

  // The next grid on the stream may be scheduled from here (programmatic
  // launch; it waits for this grid to finish). Letting it in at the start, as
  // the decode kernel does, measured 11-17% slower on small causal prefills
  // (one wave of 64-row tiles): its CTAs took the SMs that freed up first and
  // ran unevenly spread once they started.
  allow_dependent_launch();
  // With no key block at all the Q copy (issued by every warp, to every row)
  // was never waited for: it must land before rows are reused for staging.
  cp_async_wait<0>();
  __syncthreads();
  if constexpr (Cfg::kSplit) {
    store_partial<Cfg>(o, row_max, row_sum, p, job.split, batch, head, q0, warp_row0, rows, group, lane);
    return;
  }
  store_output<Cfg>(o, row_max, row_sum, shared_bytes, job.out, p.o_row_stride, p.o_head_stride, job.lse,
                    p.lse_row_stride, p.lse_head_stride, q0, warp_row0, rows, group, chunks_valid, p.lse_scale, lane);
}

}  // namespace jitattn
