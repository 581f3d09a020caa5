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
// A paged cache's pages are powers of two. Pages of at least KEYS rows hold
// whole chunks (chunks start at multiples of KEYS): one block-table read per
// chunk, read one chunk ahead. Shorter pages of PAGE_ROWS rows (vLLM's 16,
// say, beside 64-key chunks of 128-byte rows, or SGLang's single rows):
// lane j reads the table entry of the chunk's page j (and j + 32) one chunk
// ahead; a copy pass of the warp that lies in one page takes its page from
// that lane, and in pages shorter than a pass each copy takes its row's
// page. A chunk then keeps the
// size that streams best whatever the page size (chunks cut to pages of 16
// rows took up to 1.39x the time of a contiguous cache at head dim 64;
// docs/PERFORMANCE.md).
//
// Without KVCACHE the keys are a dense call's K/V ([batch, seqlen_k], every
// sequence seqlen_k long): forward() with few query rows. Those keys are not
// rotated, so that variant takes no RoPE. With VARLEN the queries are packed
// (forward_varlen: sequence b's rows from cu_seqlens_q), and so are dense
// keys; a paged cache keeps its pages.
#pragma once

#include "combine_params.h"
#include "fwd_prefill.cuh"

namespace jitattn {

// The per-warp view is a one-warp FwdConfig (ROWS query rows, KEYS-key
// blocks), so the prefill kernel's MMA, mask and softmax steps apply as they
// are; the CTA-wide constants are added here.
template <class Element_, int HEAD_DIM, int ROWS, int KEYS, int WARPS, int STAGES, int MASK, bool SOFTCAP, bool ALIBI,
          bool PADDED, int ROPE, int ROTARY_DIM, int ROPE_TABLES, bool KVCACHE, bool PAGED, bool SPLIT,
          bool DYNAMIC_SPLITS, bool VARLEN, bool LEFTPAD = false, bool SINK = false, bool ROPE_SCALED = false,
          int PAGE_ROWS = 0>
struct DecodeConfig
    : FwdConfig<Element_, HEAD_DIM, ROWS, KEYS, /*WARPS=*/1, MASK, SOFTCAP, ALIBI, PADDED, VARLEN,
                /*PACK_GQA=*/true, ROPE, ROTARY_DIM, ROPE_TABLES, KVCACHE, PAGED, SPLIT, /*STAGES=*/0,
                /*WGMMA=*/false, /*PERSISTENT=*/false, /*UNALIGNED_DIM=*/0, LEFTPAD, SINK, /*HEAD_DIM_V=*/0,
                ROPE_SCALED> {
  using Warp = FwdConfig<Element_, HEAD_DIM, ROWS, KEYS, 1, MASK, SOFTCAP, ALIBI, PADDED, VARLEN, true, ROPE,
                         ROTARY_DIM, ROPE_TABLES, KVCACHE, PAGED, SPLIT, 0, false, false, 0, LEFTPAD, SINK, 0,
                         ROPE_SCALED>;
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
  // Split counts per tile chosen on the device, CTA k taking piece k
  // (find_piece).
  static constexpr bool kDynamicSplits = DYNAMIC_SPLITS;
  // Paged: pages of exactly kPageRows rows, kChunkPages to a chunk (0 and
  // 1: pages of at least a chunk, of any power-of-two size, p.page_shift).
  static constexpr int kPageRows = PAGE_ROWS;
  static constexpr int kChunkPages = PAGE_ROWS == 0 ? 1 : KEYS / PAGE_ROWS;
  // Table entries a lane holds for a chunk: pages j and j + 32.
  static constexpr int kPageSlots = (kChunkPages + 31) / 32;
  // Passes of the warp's 32 16-byte copies in one K or V page (0: a pass
  // spans several pages, of kRowsPerPass rows in all).
  static constexpr int kPagePasses = PAGE_ROWS * Warp::kChunksPerRow / 32;
  static constexpr int kRowsPerPass = 32 / Warp::kChunksPerRow;

  static_assert(STAGES >= 2, "a pipeline needs a stage being read and one being filled");
  static_assert(SPLIT || !DYNAMIC_SPLITS, "dynamic splits choose split counts");
  static_assert(KVCACHE || (ROPE == 0 && !PAGED), "dense keys: no pages, and no RoPE (keys are not rotated here)");
  static_assert(!VARLEN || ROPE == 0, "varlen: no RoPE (positions come from a KV cache's lengths)");
  static_assert(!(VARLEN && KVCACHE) || PAGED, "varlen over a KV cache: a paged one (block table)");
  static_assert(KEYS * Warp::kChunksPerRow % 32 == 0, "chunk copies are whole warp passes");
  static_assert(PAGE_ROWS == 0 || (PAGED && PAGE_ROWS < KEYS && KEYS % PAGE_ROWS == 0 && kChunkPages <= 64 &&
                                   (PAGE_ROWS * Warp::kChunksPerRow % 32 == 0 || 32 % Warp::kChunksPerRow == 0)),
                "short pages tile a chunk, each page whole copy passes or each pass whole rows");
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

// A chunk's pages over pages shorter than the chunk: lane j holds the page
// numbers of the chunk's pages j and j + 32 (page 0 past the sequence's
// keys, whose rows are not read).
template <class Cfg>
struct ChunkPages {
  int page[Cfg::kPageSlots];
};

// load_chunk over pages of Cfg::kPageRows rows, shorter than the chunk:
// `rows` is the K or V head's first row in page 0. Every source address
// lies in a page's rows of this head, so none needs a select for the rows
// that zero-fill: a select per copy (or the branches the compiler made of
// it) doubled the kernel's instructions and cost 5-22% of the rate.
template <class Cfg>
__device__ __forceinline__ void load_paged_chunk(unsigned tile, const unsigned short* rows, long long page_stride,
                                                 long long row_stride, const ChunkPages<Cfg>& pages, int rows_valid,
                                                 int chunks_valid, int lane) {
  using Warp = typename Cfg::Warp;
  // Padded head dims: the pad's chunks zero-fill from the row's first.
  auto copy = [&](int index, const unsigned short* page_rows) {
    const int row = index / Warp::kChunksPerRow;  // of the chunk
    const int chunk = index % Warp::kChunksPerRow;
    const int source_chunk = Cfg::kPadded && chunk >= chunks_valid ? 0 : chunk;
    cp_async_16_evict_first(tile + swizzled_bytes<Warp>(row, chunk),
                            page_rows + (row % Cfg::kPageRows) * row_stride + source_chunk * 8,
                            row < rows_valid && chunk < chunks_valid);
  };
  if constexpr (Cfg::kPagePasses > 0) {
    // Each page whole passes: one page (one shuffle) per pass.
#pragma unroll
    for (int page = 0; page < Cfg::kChunkPages; ++page) {
      const unsigned short* page_rows =
          rows + static_cast<long long>(__shfl_sync(0xffffffffu, pages.page[page / 32], page % 32)) * page_stride;
#pragma unroll
      for (int pass = 0; pass < Cfg::kPagePasses; ++pass) copy((page * Cfg::kPagePasses + pass) * 32 + lane, page_rows);
    }
  } else {
    // Pages shorter than a pass: each copy its row's page. A pass's rows
    // are whole (32 lanes, kRowsPerPass rows) and never straddle entries
    // j and j + 32.
#pragma unroll
    for (int pass = 0; pass < Cfg::kBlockKV / Cfg::kRowsPerPass; ++pass) {
      const int index = pass * 32 + lane;
      const int page = index / Warp::kChunksPerRow / Cfg::kPageRows;
      const int slot = pass * Cfg::kRowsPerPass / Cfg::kPageRows / 32;  // the same for the whole pass
      copy(index, rows + static_cast<long long>(__shfl_sync(0xffffffffu, pages.page[slot], page % 32)) * page_stride);
    }
  }
}

// The chunks [begin, end) that the query tile starting at packed row q0 of a
// sequence may see (bottom-right diagonal), in whole chunks.
template <class Cfg>
__device__ __forceinline__ void tile_chunks(const FwdParams& p, int seqlen_q, int seqlen_k, int q0, int& begin,
                                            int& end) {
  const int group = p.heads_per_kv;
  const int last_row = min(q0 + Cfg::kBlockQ, seqlen_q * group) - 1;
  visible_blocks<typename Cfg::Warp>(p, seqlen_k, seqlen_k - seqlen_q, q0 / group, max(last_row, 0) / group, begin,
                                     end);
}

template <class Cfg>
__device__ __forceinline__ int chunk_steps(int begin, int end) {
  return (end - begin + Cfg::kStreams - 1) / Cfg::kStreams;
}

// Sequence b's queries and keys (and, varlen, its first packed query row;
// 0 otherwise), from the lengths in device memory.
template <class Cfg>
__device__ __forceinline__ VarlenSequence decode_sequence(const FwdParams& p, int b) {
  if constexpr (Cfg::kVarlen) return varlen_sequence(p, b);
  if constexpr (!Cfg::kKVCache) return VarlenSequence{0, p.seqlen_q, p.seqlen_k};
  return VarlenSequence{0, p.seqlen_q, p.seqused_k[b] - kv_row_offset<Cfg>(p, b) + p.seqlen_k_added};
}

// Calls visit(q_block, steps) for each query tile of a sequence (at most the
// grid's) with its visible steps (every warp one chunk).
template <class Cfg, class Visit>
__device__ __forceinline__ void for_each_tile(const FwdParams& p, const VarlenSequence& sequence, Visit&& visit) {
  const int tiles = min((sequence.seqlen_q * p.heads_per_kv + Cfg::kBlockQ - 1) / Cfg::kBlockQ, p.num_q_blocks);
  for (int q_block = 0; q_block < tiles; ++q_block) {
    int begin, end;
    tile_chunks<Cfg>(p, sequence.seqlen_q, sequence.seqlen_k, q_block * Cfg::kBlockQ, begin, end);
    visit(q_block, chunk_steps<Cfg>(begin, end));
  }
}

template <class Cfg, class Visit>
__device__ __forceinline__ void for_each_tile(const FwdParams& p, int b, Visit&& visit) {
  for_each_tile<Cfg>(p, decode_sequence<Cfg>(p, b), visit);
}

template <class T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ int warp_inclusive_sum(int x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const int before = __shfl_up_sync(0xffffffffu, x, offset);
    if (lane >= offset) x += before;
  }
  return x;
}

// One CTA's piece of a batch whose splits are chosen on the device
// (kDynamicSplits).
struct DecodePiece {
  int batch;
  int q_block;
  int kv_head;
  int split;        // the piece's index in its tile
  int pieces;       // the tile's pieces
  int piece_steps;  // steps per piece (the last may be shorter)
  // Dynamic splits: the sequence's lengths as find_piece read them, so the
  // CTA does not wait on a second read before its first copy.
  VarlenSequence sequence;
};

// A tile of `steps` visible steps takes one split per share of the batch's
// work (at most num_splits) and pieces of at least blocks_per_split steps;
// returns how many of its pieces have keys (1 for a tile with none, whose
// CTA writes its empty state).
__device__ __forceinline__ int tile_pieces(const FwdParams& p, int steps, int share, int& piece_steps) {
  const int splits = min(p.num_splits, max(1, (steps + share - 1) / share));
  piece_steps = max(p.blocks_per_split, (steps + splits - 1) / splits);
  return max(1, (steps + piece_steps - 1) / piece_steps);
}

// Pieces are dispatched longest first, in four classes of length (a
// quarter of a share apart): split tiles' pieces first, sequence by sequence,
// measured 12% slower than this at batch 16 of 4-27k keys, where whole tiles
// of up to a share outlast the halves of split ones (H200,
// docs/PERFORMANCE.md).
constexpr int kPieceClasses = 4;

__device__ __forceinline__ int piece_class(int pieces, int piece_steps, int steps, int share) {
  const int length = 4 * (pieces == 1 ? steps : piece_steps);
  return length >= 3 * share ? 0 : length >= 2 * share ? 1 : length >= share ? 2 : 3;
}

// Dynamic splits: the batch's work (visible steps of every tile and KV head)
// is cut into split_slots shares (FlashAttention-3's rule: one per 1.1 SMs),
// and each tile into its pieces (tile_pieces). An even batch that fills the
// GPU runs unsplit; the longest sequences of an uneven one split the most,
// the short ones' CTAs filling the SMs around them.
__device__ __forceinline__ int share_of(const FwdParams& p, long long steps_of_every_head) {
  const long long work = steps_of_every_head * p.heads_kv;
  // In 32 bits where the work fits: a 64-bit division is a long subroutine,
  // and every CTA divides before its first copy.
  const long long share = work <= 0x7fffffffLL ? (static_cast<unsigned>(work) + p.split_slots - 1) / p.split_slots
                                               : (work + p.split_slots - 1) / p.split_slots;
  return static_cast<int>(max(static_cast<long long>(p.blocks_per_split), share));
}

// The batch's visible steps and query tiles (one KV head's).
struct BatchWork {
  long long steps;
  int tiles;
};

template <class Cfg>
__device__ __forceinline__ BatchWork batch_work(const FwdParams& p) {
  BatchWork work{0, 0};
  for (int b = threadIdx.x & 31; b < p.batch; b += 32) {
    for_each_tile<Cfg>(p, b, [&](int, int steps) {
      work.steps += steps;
      ++work.tiles;
    });
  }
  return BatchWork{warp_sum(work.steps), warp_sum(work.tiles)};
}

// Where the pieces of a share overflow one wave of CTAs (wave_ctas), the
// share may grow by eighths until they fit (share_growth_limit says how
// far): a piece a little longer can cost less than a second wave of pieces
// (batch 4 of 15-29k keys: 136 pieces on 132 SMs ran 2.94 TB/s, fitted 3.78;
// H200, docs/PERFORMANCE.md).
constexpr int kShareGrowths = 4;  // share × (1 + g/8), 1 <= g <= kShareGrowths

__device__ __forceinline__ int grown_share(int share, int growth) { return share + share * growth / 8; }

// The class that holds rank (pieces longest first, counts by class), and
// the rank within it; a negative rank is class 0's. (Indices stay
// constants, so the counts stay in registers.)
__device__ __forceinline__ int class_of_rank(const int (&counts)[kPieceClasses], int& rank) {
  int c = 0;
#pragma unroll
  for (int i = 0; i + 1 < kPieceClasses; ++i) {
    if (c == i && rank >= counts[i]) {
      rank -= counts[i];
      c = i + 1;
    }
  }
  return c;
}

// How far the share may grow, in eighths (0: not at all), to fit a wave.
// Growing pays where the grid and the pieces (counts: every KV head's, by
// class) overflow a wave and the tiles alone (each a piece at least) do
// not, if the fitted pieces (at most the grown share) end before the
// overflow would. Pieces go longest first, so the overflow's O pieces start
// as the first wave's O shortest end: the overflow ends near the length of
// rank wave - O plus that of rank wave, each taken at its class's middle.
// (Where those are short, as for one sequence of 32k keys among fifteen of
// 2k, the overflow ends within the share. Batch 16 of 4-27k keys grown by
// half to fit ran 4% slower.)
__device__ __forceinline__ int share_growth_limit(const FwdParams& p, const int (&counts)[kPieceClasses], int tiles) {
  int total = 0;
  int first = kPieceClasses - 1;  // the longest pieces' class
#pragma unroll
  for (int c = kPieceClasses - 1; c >= 0; --c) {
    total += counts[c];
    if (counts[c] != 0) first = c;
  }
  if (gridDim.x <= static_cast<unsigned>(p.wave_ctas) || total <= p.wave_ctas || tiles * p.heads_kv > p.wave_ctas) {
    return 0;
  }
  // Class c spans lengths [(3 - c) / 4, (4 - c) / 4) of the share.
  auto middle_eighths = [](int c) { return 7 - 2 * c; };
  int last_of_wave = 2 * p.wave_ctas - total, first_past_wave = p.wave_ctas;
  const int overflow_end = middle_eighths(class_of_rank(counts, last_of_wave)) +
                           middle_eighths(class_of_rank(counts, first_past_wave));
  return min(kShareGrowths, max(8 - 2 * first, overflow_end) - 8);
}

// The smallest growth g up to growth_limit (share_growth_limit) whose
// pieces, pieces_at(g) a KV head, fit one wave of CTAs; 0 where none does.
template <typename PiecesAt>
__device__ __forceinline__ int smallest_fitting_growth(const FwdParams& p, int growth_limit, PiecesAt&& pieces_at) {
  int growth = 0;
#pragma unroll
  for (int g = kShareGrowths; g >= 1; --g) {
    if (g <= growth_limit && pieces_at(g) * p.heads_kv <= p.wave_ctas) growth = g;
  }
  return growth;
}

// The tile and split of CTA k in a grid of (query tile, split, KV head,
// batch), flattened with the query tile fastest, as in fwd_prefill. (Index:
// blockIdx.x's unsigned, or a signed CTA number.)
template <class Index>
__device__ __forceinline__ DecodePiece piece_of_grid(const FwdParams& p, Index k, int splits) {
  DecodePiece piece;
  piece.q_block = static_cast<int>(k % p.num_q_blocks);
  piece.split = static_cast<int>(k / p.num_q_blocks % splits);
  const int batch_head = k / p.num_q_blocks / splits;
  piece.batch = batch_head / p.heads_kv;
  piece.kv_head = batch_head % p.heads_kv;
  return piece;
}

// A grid of every tile's every split (tiles × num_splits CTAs within one
// wave, no more than the pieces the lengths may ask for): CTA k is the split
// it is without dynamic splits, and the splits past its tile's pieces have
// nothing to do.
template <class Cfg>
__device__ __forceinline__ bool piece_of_split_grid(const FwdParams& p, int k, DecodePiece& piece) {
  piece = piece_of_grid(p, k, p.num_splits);
  // The tile's own steps first: its lengths load beside the batch's.
  int steps = 0;
  piece.sequence = decode_sequence<Cfg>(p, piece.batch);
  for_each_tile<Cfg>(p, piece.sequence, [&](int q_block, int tile_steps) {
    if (q_block == piece.q_block) steps = tile_steps;
  });
  piece.pieces = tile_pieces(p, steps, share_of(p, batch_work<Cfg>(p).steps), piece.piece_steps);
  return piece.split < piece.pieces;
}

// Up to 32 sequences of at most one query tile: one sequence per lane, whose
// lengths are read once; the rest is a handful of warp reductions. (Three
// passes over the lengths, as piece_in_batch makes, cost up to 8% more at
// 8k keys.)
template <class Cfg>
__device__ __forceinline__ bool piece_in_small_batch(const FwdParams& p, int rank, DecodePiece& piece) {
  const int lane = threadIdx.x & 31;
  int steps = 0, tiles = 0;
  VarlenSequence sequence{0, 0, 0};
  if (lane < p.batch) {
    sequence = decode_sequence<Cfg>(p, lane);
    for_each_tile<Cfg>(p, sequence, [&](int, int tile_steps) {
      steps = tile_steps;
      tiles = 1;
    });
  }
  int share = share_of(p, warp_sum(static_cast<long long>(steps)));
  int piece_steps, pieces, own_class;
  int counts[kPieceClasses];  // every KV head's pieces, by class
  auto count_classes = [&] {
    pieces = tiles * tile_pieces(p, steps, share, piece_steps);
    own_class = piece_class(pieces, piece_steps, steps, share);
    // Every class's count in 16 bits of one sum: at most 32 lanes × 128.
    const unsigned long long packed = warp_sum(static_cast<unsigned long long>(pieces) << (16 * own_class));
#pragma unroll
    for (int c = 0; c < kPieceClasses; ++c) counts[c] = static_cast<int>(packed >> (16 * c) & 0xffff) * p.heads_kv;
  };
  count_classes();
  const int growth_limit = share_growth_limit(p, counts, __popc(__ballot_sync(0xffffffffu, tiles != 0)));
  if (growth_limit > 0) {
    unsigned long long grown = 0;
#pragma unroll
    for (int g = 1; g <= kShareGrowths; ++g) {
      int grown_steps;
      grown += static_cast<unsigned long long>(tiles * tile_pieces(p, steps, grown_share(share, g), grown_steps))
               << (16 * (g - 1));
    }
    grown = warp_sum(grown);
    const int growth = smallest_fitting_growth(
        p, growth_limit, [&](int g) { return static_cast<int>(grown >> (16 * (g - 1)) & 0xffff); });
    if (growth > 0) {
      share = grown_share(share, growth);
      count_classes();
    }
  }
  const int c = class_of_rank(counts, rank);
  const int mine = own_class == c ? pieces * p.heads_kv : 0;
  const int through = warp_inclusive_sum(mine);
  const unsigned holders = __ballot_sync(0xffffffffu, rank < through);
  if (holders == 0) return false;
  const int owner = __ffs(holders) - 1;
  rank -= __shfl_sync(0xffffffffu, through - mine, owner);
  piece.batch = owner;
  piece.q_block = 0;
  piece.pieces = __shfl_sync(0xffffffffu, pieces, owner);
  piece.piece_steps = __shfl_sync(0xffffffffu, piece_steps, owner);
  piece.sequence.q_row0 = __shfl_sync(0xffffffffu, sequence.q_row0, owner);
  piece.sequence.seqlen_q = __shfl_sync(0xffffffffu, sequence.seqlen_q, owner);
  piece.sequence.seqlen_k = __shfl_sync(0xffffffffu, sequence.seqlen_k, owner);
  piece.kv_head = rank / piece.pieces;
  piece.split = rank % piece.pieces;
  return true;
}

// Any batch: passes over the lengths for the share, the classes' counts
// (twice where the share grows to fit a wave, with a pass between), then the
// sequence that holds the piece, 32 at a time.
template <class Cfg>
__device__ bool piece_in_batch(const FwdParams& p, int rank, DecodePiece& piece) {
  const int lane = threadIdx.x & 31;
  const BatchWork work = batch_work<Cfg>(p);
  int share = share_of(p, work.steps);
  int counts[kPieceClasses];
  auto count_classes = [&] {
#pragma unroll
    for (int c = 0; c < kPieceClasses; ++c) counts[c] = 0;
    for (int b = lane; b < p.batch; b += 32) {
      for_each_tile<Cfg>(p, b, [&](int, int steps) {
        int piece_steps;
        const int pieces = tile_pieces(p, steps, share, piece_steps);
        const int own_class = piece_class(pieces, piece_steps, steps, share);
#pragma unroll
        for (int c = 0; c < kPieceClasses; ++c) counts[c] += c == own_class ? pieces : 0;
      });
    }
#pragma unroll
    for (int c = 0; c < kPieceClasses; ++c) counts[c] = warp_sum(counts[c]) * p.heads_kv;
  };
  count_classes();
  const int growth_limit = share_growth_limit(p, counts, work.tiles);
  if (growth_limit > 0) {
    int grown[kShareGrowths] = {};
    for (int b = lane; b < p.batch; b += 32) {
      for_each_tile<Cfg>(p, b, [&](int, int steps) {
        int piece_steps;
#pragma unroll
        for (int g = 1; g <= kShareGrowths; ++g) {
          grown[g - 1] += tile_pieces(p, steps, grown_share(share, g), piece_steps);
        }
      });
    }
    const int growth = smallest_fitting_growth(p, growth_limit, [&](int g) { return warp_sum(grown[g - 1]); });
    if (growth > 0) {
      share = grown_share(share, growth);
      count_classes();
    }
  }
  const int c = class_of_rank(counts, rank);
  // A sequence's pieces of class c.
  auto sequence_pieces = [&](int b) {
    int count = 0;
    for_each_tile<Cfg>(p, b, [&](int, int steps) {
      int piece_steps;
      const int pieces = tile_pieces(p, steps, share, piece_steps);
      if (piece_class(pieces, piece_steps, steps, share) == c) count += pieces;
    });
    return count * p.heads_kv;
  };
  for (int b0 = 0; b0 < p.batch; b0 += 32) {
    const int mine = b0 + lane < p.batch ? sequence_pieces(b0 + lane) : 0;
    const int through = warp_inclusive_sum(mine);
    const unsigned holders = __ballot_sync(0xffffffffu, rank < through);
    if (holders == 0) {
      rank -= __shfl_sync(0xffffffffu, through, 31);
      continue;
    }
    const int owner = __ffs(holders) - 1;
    rank -= __shfl_sync(0xffffffffu, through - mine, owner);
    piece.batch = b0 + owner;
    piece.sequence = decode_sequence<Cfg>(p, piece.batch);
    bool found = false;
    for_each_tile<Cfg>(p, piece.sequence, [&](int q_block, int steps) {
      int piece_steps;
      const int pieces = tile_pieces(p, steps, share, piece_steps);
      if (found || piece_class(pieces, piece_steps, steps, share) != c) return;
      if (rank < pieces * p.heads_kv) {
        found = true;
        piece.q_block = q_block;
        piece.kv_head = rank / pieces;
        piece.split = rank % pieces;
        piece.pieces = pieces;
        piece.piece_steps = piece_steps;
      } else {
        rank -= pieces * p.heads_kv;
      }
    });
    return found;
  }
  return false;
}

// The piece of CTA k, or false for a CTA past the batch's last piece. Every
// warp computes it alike (no barrier).
//
// Past a split grid the pieces are numbered so that the grid holds no empty
// CTA before the last one: by class (piece_class), then sequence by
// sequence, query tile by query tile, KV head by KV head. In the first wave
// the ranks are spread: the hardware hands consecutive CTAs to the two SMs of
// one TPC, so even CTAs take the first half of the ranks and odd ones the
// rest, each heavy piece beside a light one. (Unspread, batch 4 with one
// sequence of 32k keys and three of 2k ran 3.0-3.2 TB/s against 3.3; H200,
// docs/PERFORMANCE.md.)
template <class Cfg>
__device__ __forceinline__ bool find_piece(const FwdParams& p, int k, DecodePiece& piece) {
  if (gridDim.x == static_cast<unsigned>(p.num_q_blocks * p.num_splits * p.heads_kv * p.batch) &&
      gridDim.x <= static_cast<unsigned>(p.wave_ctas)) {
    return piece_of_split_grid<Cfg>(p, k, piece);
  }
  unsigned sms;
  asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
  const int wave = min(static_cast<int>(gridDim.x), static_cast<int>(sms));
  const int rank = k >= wave ? k : k % 2 == 0 ? k / 2 : (wave + 1) / 2 + k / 2;
  if (p.batch <= 32 && p.num_q_blocks == 1) return piece_in_small_batch<Cfg>(p, rank, piece);
  return piece_in_batch<Cfg>(p, rank, piece);
}

template <class Cfg>
__device__ void fwd_decode(const FwdParams& p) {
  using Warp = typename Cfg::Warp;
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  const unsigned q_tile = smem_u32(shared_bytes);
  const unsigned pipeline = q_tile + Cfg::kQBytes;

  // CTA k's tile and split (piece_of_grid), or with dynamic splits the
  // batch's piece k (find_piece).
  DecodePiece piece;
  if constexpr (Cfg::kDynamicSplits) {
    if (!find_piece<Cfg>(p, static_cast<int>(blockIdx.x), piece)) return;
  } else {
    piece = piece_of_grid(p, blockIdx.x, Cfg::kSplit ? p.num_splits : 1);
  }
  const int q_block = piece.q_block;
  const int split = piece.split;
  const int group = p.heads_per_kv;
  const int batch = piece.batch;
  const int kv_head = piece.kv_head;
  const int head = kv_head * group;  // the group's first query head
  const int q0 = q_block * Cfg::kBlockQ;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int chunks_valid = Cfg::kPadded ? p.head_dim / 8 : Cfg::kChunksPerRow;

  // This sequence's lengths (read by find_piece with dynamic splits), and
  // where its rows start: batch strides, or (varlen) the packed rows of its
  // offsets.
  VarlenSequence sequence;
  if constexpr (Cfg::kDynamicSplits) {
    sequence = piece.sequence;
  } else {
    sequence = decode_sequence<Cfg>(p, batch);
  }
  const int seqlen_q = sequence.seqlen_q;
  const int seqlen_k = sequence.seqlen_k;
  const int cache_batch = Cfg::kKVCache && p.kv_batch_index != nullptr ? p.kv_batch_index[batch] : batch;
  long long q_start = batch * p.q_batch_stride, o_start = batch * p.o_batch_stride;
  long long lse_start = batch * p.lse_batch_stride;
  // Paged: the batch strides are page strides, applied per chunk. A
  // contiguous cache's keys start at the sequence's first row.
  const long long first_row = kv_row_offset<Cfg>(p, batch);
  long long k_start = Cfg::kPaged ? 0 : cache_batch * p.k_batch_stride + first_row * p.k_row_stride;
  long long v_start = Cfg::kPaged ? 0 : cache_batch * p.v_batch_stride + first_row * p.v_row_stride;
  if constexpr (Cfg::kVarlen) {
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
  const ChunkBounds chunks = chunk_bounds<Warp>(p, first_query, last_query, diagonal_offset);
  int chunk_begin, chunk_end;
  tile_chunks<Cfg>(p, seqlen_q, seqlen_k, q0, chunk_begin, chunk_end);
  if constexpr (Cfg::kSplit) {
    // Split s takes piece s of this tile's own visible steps, so a sequence
    // shorter than the planner assumed (no max_seqlen_k hint, or a graph
    // replayed with other lengths) still spreads over the splits.
    const int steps = chunk_steps<Cfg>(chunk_begin, chunk_end);
    int piece_steps = max(p.blocks_per_split, (steps + p.num_splits - 1) / p.num_splits);
    if constexpr (Cfg::kDynamicSplits) {
      piece_steps = piece.piece_steps;
      // The tile's splits past its pieces have no CTA: its first piece marks
      // them empty (lse -inf), which the combine reads as no keys. A tile of
      // one piece writes its output itself (final_output below) and marks
      // state 0 instead, so the combine leaves its rows alone.
      if (split == 0) {
        const int query0 = partial_query0<Warp>(p, batch);
        const int end = min(q0 + Cfg::kBlockQ, rows);
        const bool one_piece = piece.pieces == 1;
        const int first_marked = one_piece ? 0 : piece.pieces, last_marked = one_piece ? 0 : p.num_splits - 1;
        const float mark = one_piece ? __uint_as_float(kStateWrittenMark) : -kInfinity;
        for (int packed = q0 + static_cast<int>(threadIdx.x); packed < end; packed += Cfg::kCtaThreads) {
          const long long pair = static_cast<long long>(query0 + packed / group) * p.heads_q + head + packed % group;
          for (int marked = first_marked; marked <= last_marked; ++marked) {
            p.partial_lse[static_cast<long long>(marked) * p.partial_rows * p.heads_q + pair] = mark;
          }
        }
      }
    }
    const int first = chunk_begin + split * piece_steps * Cfg::kStreams;
    chunk_end = min(chunk_end, first + piece_steps * Cfg::kStreams);
    chunk_begin = first;
  }
  // This warp's chunks: chunk_begin + warp + i · WARPS for i < count.
  const int first_chunk = chunk_begin + warp;
  const int count = first_chunk < chunk_end ? (chunk_end - first_chunk + Cfg::kStreams - 1) / Cfg::kStreams : 0;

  load_packed_q<Warp, Cfg::kCtaThreads>(q_tile, q, p.q_row_stride, p.q_head_stride, q0, rows, group, chunks_valid);
  cp_async_commit();

  const unsigned stages = pipeline + warp * Cfg::kStages * Cfg::kStageBytes;
  const int in_page = Cfg::kPaged ? (1 << p.page_shift) - 1 : 0;
  // Chunk i's page; over short pages, lane j's pages j and j + 32 of the
  // chunk (ChunkPages).
  auto page_of = [&](int i) {
    const int key0 = (first_chunk + i * Cfg::kStreams) * Cfg::kBlockKV;
    ChunkPages<Cfg> chunk_pages;
    if constexpr (Cfg::kPageRows != 0) {
#pragma unroll
      for (int slot = 0; slot < Cfg::kPageSlots; ++slot) {
        const int key = key0 + min(slot * 32 + lane, Cfg::kChunkPages - 1) * Cfg::kPageRows;
        chunk_pages.page[slot] = key < seqlen_k ? pages[key / Cfg::kPageRows] : 0;
      }
    } else {
      chunk_pages.page[0] = Cfg::kPaged ? pages[key0 >> p.page_shift] : 0;
    }
    return chunk_pages;
  };
  // Starts the copy of this warp's chunk i into its stage (chunk_pages:
  // chunk i's, when paged).
  auto issue = [&](int i, const ChunkPages<Cfg>& chunk_pages) {
    const int key0 = (first_chunk + i * Cfg::kStreams) * Cfg::kBlockKV;
    const unsigned stage = stages + (i % Cfg::kStages) * Cfg::kStageBytes;
    if constexpr (Cfg::kPageRows != 0) {
      load_paged_chunk<Cfg>(stage, k, p.k_batch_stride, p.k_row_stride, chunk_pages, seqlen_k - key0, chunks_valid,
                            lane);
      load_paged_chunk<Cfg>(stage + Cfg::kChunkBytes, v, p.v_batch_stride, p.v_row_stride, chunk_pages,
                            seqlen_k - key0, chunks_valid, lane);
    } else {
      const int page = chunk_pages.page[0];
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
    }
  };
#pragma unroll
  for (int i = 0; i < Cfg::kStages - 1; ++i) {
    if (i < count) issue(i, page_of(i));
    cp_async_commit();
  }
  // The page(s) of the next chunk to issue, read one iteration early.
  ChunkPages<Cfg> page_ahead{};
  if (Cfg::kPaged && Cfg::kStages - 1 < count) page_ahead = page_of(Cfg::kStages - 1);

  // Q has landed (its group is the oldest) for every thread.
  cp_async_wait<Cfg::kStages - 1>();
  __syncthreads();
  if constexpr (Cfg::kRope != kRopeNone) {
    // KV cache: query i is at cache_seqlens + i (rope_q_offsets); cached keys
    // are already rotated.
    const int query_position0 = p.rope_q_offsets[batch];
    rotate_rows<typename Cfg::Element, Cfg::kRope, Cfg::kRotaryDim, Cfg::kRopeTableBytes, Cfg::kRopeScaled,
                Cfg::kBlockQ, Cfg::kCtaThreads, /*PACKED=*/false>(
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
    if (block_needs_mask<Warp>(p, key0, seqlen_k, first_query, last_query, diagonal_offset, chunks)) {
      apply_mask<Warp>(s, p, seqlen_k, q0, key0, diagonal_offset, lane);
    }
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

  // Each thread finishes four adjacent columns of one row at a time, into
  // out and lse, or a split's partial state. Dynamic splits: a tile of one
  // piece writes out and lse itself (its combine pairs are marked written),
  // which spares the combine its rows: an even batch of 16 × 1k keys took
  // 22.7 us so against 25.0 through the partials (H200, docs/PERFORMANCE.md).
  const bool final_output = !Cfg::kSplit || (Cfg::kDynamicSplits && piece.pieces == 1);
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
    float inverse = sum > 0.f ? 1.f / sum : 0.f;
    float row_lse = sum > 0.f ? max * p.lse_scale + fast_log2(sum) * 0.69314718055994531f : -kInfinity;
    const int packed = q0 + row;
    // The output itself counts the head's sink (a split's partial leaves it
    // to the combine): a row that saw no key writes 0 with lse = the sink.
    if constexpr (Warp::kSink) {
      if (final_output) inverse = fold_sink(sum, max * p.lse_scale, p.learnable_sink[head + packed % group], row_lse);
    }
    if (!final_output) {
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
