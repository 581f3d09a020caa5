// FlashAttention-2 style forward prefill for sm_80 and newer (mma.sync).
//
// One CTA computes BLOCK_Q query rows of one (batch, head). Each warp owns
// BLOCK_Q / WARPS consecutive rows (whole 16-row MMA tiles), so the softmax
// statistics of a row never leave the four lanes that hold it. The main loop
// walks the key blocks from last to first: with a causal mask the blocks that
// need masking come first, and the rest run the unmasked path.
//
// The kernel is spread over headers, each included once in this order:
//   fwd_config.cuh      FwdConfig, the compile-time shape
//   fwd_smem.cuh        swizzled shared-memory tiles and their copies
//   fwd_mma.cuh         mma.sync math, masks, online softmax, epilogue
//   fwd_io.cuh          paged K/V rows, split partials, packed-GQA Q
//   fwd_rope_tiles.cuh  fused RoPE on tiles
//   fwd_pipeline.cuh    the producer and its ring of stages
//   fwd_consume.cuh     the MMA warps (mma.sync and wgmma)
// This file: where a CTA's tile is, and the kernel bodies (ordinary grid,
// producer layouts, persistent).
#pragma once

#include "fwd_config.cuh"
#include "fwd_smem.cuh"
#include "fwd_mma.cuh"
#include "fwd_io.cuh"
#include "fwd_rope_tiles.cuh"
#include "fwd_pipeline.cuh"
#include "fwd_consume.cuh"

namespace jitattn {

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
    const VarlenSequence sequence = varlen_sequence(p, batch);
    seqlen_q = sequence.seqlen_q;
    seqlen_k = sequence.seqlen_k;
    if (q0 >= seqlen_q * group) return false;
    start_at_packed_rows<Cfg>(p, batch, sequence.q_row0, q_start, o_start, lse_start, k_start, v_start);
  }
  if constexpr (Cfg::kKVCache) {
    // (Varlen over a paged cache: the lengths are the varlen ones above.)
    const long long first_row = kv_row_offset<Cfg>(p, batch);
    if constexpr (!Cfg::kVarlen) seqlen_k = p.seqused_k[batch] - static_cast<int>(first_row) + p.seqlen_k_added;
    const int cache_batch = p.kv_batch_index != nullptr ? p.kv_batch_index[batch] : batch;
    // Paged: the batch strides are page strides, applied per tile. A
    // contiguous cache's keys start at the sequence's first row.
    k_start = Cfg::kPaged ? 0 : cache_batch * p.k_batch_stride + first_row * p.k_row_stride;
    v_start = Cfg::kPaged ? 0 : cache_batch * p.v_batch_stride + first_row * p.v_row_stride;
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
  if constexpr (Cfg::kSplit && Cfg::kLocal) {
    // Windows and chunks: split s takes piece s of this tile's own visible
    // blocks, of at least blocks_per_split (planned on the window's span,
    // splits.cpp), so a window over a long cache spreads over the splits
    // instead of landing in one of pieces cut from the whole cache.
    const int piece = max(p.blocks_per_split, (job.end_block - job.first_block + p.num_splits - 1) / p.num_splits);
    job.first_block = min(job.first_block + split * piece, job.end_block);
    job.end_block = min(job.end_block, job.first_block + piece);
  } else if constexpr (Cfg::kSplit) {
    // Every tile's keys start at block 0: pieces of absolute key blocks.
    job.first_block = max(job.first_block, split * p.blocks_per_split);
    job.end_block = max(job.first_block, min(job.end_block, (split + 1) * p.blocks_per_split));
  }
  return true;
}

template <class Cfg>
__device__ __forceinline__ void fwd_prefill_specialized(const FwdParams& p, const TileJob& job,
                                                        unsigned char* shared_bytes) {
  const Ring<Cfg> ring{smem_u32(shared_bytes),
                       Cfg::kInterleavedKV && p.kv_value_first != 0 ? Cfg::kKVPanels * 1024u : 0u};
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

// The sequence order of a varlen persistent kernel (Cfg::kSequenceOrder),
// in shared memory after the ring: per sequence its weight (-1 when it has
// no rows; once ranked, the ranks' query blocks) and query blocks, indexed
// by sequence; the sequences by rank; and per rank the number of tiles
// before its sequence's (first_tile[batch]: all of them).
struct SequenceOrder {
  int* keys;
  int* blocks;
  int* by_rank;
  int* first_tile;
};

template <class Cfg>
__device__ __forceinline__ SequenceOrder sequence_order() {
  // The dynamic shared memory by its symbol (fwd_prefill's shared_bytes):
  // a constant address, where a pointer passed down for the walk cost
  // registers the warps do not have (24 bytes of spills at head dim 128
  // with a window, softcap, ALiBi and packed GQA; ptxas, NVRTC 13.0).
  extern __shared__ __align__(1024) unsigned char dynamic_shared[];
  int* base = reinterpret_cast<int*>(dynamic_shared + Cfg::kSequenceOrderOffset);
  constexpr int n = Cfg::kOrderedSequences;
  return {base, base + n, base + 2 * n, base + 3 * n};
}

template <class Cfg>
__device__ __forceinline__ bool walks_sequence_order(const FwdParams& p) {
  return Cfg::kSequenceOrder && p.batch <= Cfg::kOrderedSequences && p.seqlen_k > 512;
}

// Builds the sequence order (every thread of the CTA; all its CTAs build
// the same one): sequences ranked by the weight of their heaviest tile,
// keys × 64-row halves (a tile of a few decoding rows runs one warpgroup's
// MMAs: consume_tiles_wgmma), most first, ties by index, and those without
// rows last; each contributes grid heads × its own query blocks tiles.
// Ranks by counting (a sequence's rank is the number of sequences before
// it), which for 128 sequences is 128 shared-memory reads a thread.
template <class Cfg>
__device__ void order_sequences(const FwdParams& p) {
  const SequenceOrder order = sequence_order<Cfg>();
  const int group = Cfg::kPackGqa ? p.heads_per_kv : 1;
  for (int b = threadIdx.x; b < p.batch; b += blockDim.x) {
    const VarlenSequence sequence = varlen_sequence(p, b);
    // Blocks past the grid's (its max_seqlen_q) are not run, as in the grid.
    const int blocks = min((sequence.seqlen_q * group + Cfg::kBlockQ - 1) / Cfg::kBlockQ, p.num_q_blocks);
    order.blocks[b] = blocks;
    const int halves = min((sequence.seqlen_q * group + 63) / 64, Cfg::kBlockQ / 64);
    order.keys[b] = blocks > 0 ? sequence.seqlen_k * halves : -1;
  }
  __syncthreads();
  for (int b = threadIdx.x; b < p.batch; b += blockDim.x) {
    const int keys = order.keys[b];
    int rank = 0;
    for (int other = 0; other < p.batch; ++other) {
      const int other_keys = order.keys[other];
      rank += other_keys > keys || (other_keys == keys && other < b);
    }
    order.by_rank[rank] = b;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    // Running sums of the ranks' tiles, a warp's 32 ranks at a time.
    const int lane = static_cast<int>(threadIdx.x);
    const int units = Cfg::kPackGqa ? p.heads_kv : p.heads_q;
    if (lane == 0) order.first_tile[0] = 0;
    int before = 0;
    for (int rank0 = 0; rank0 < p.batch; rank0 += 32) {
      const int rank = rank0 + lane;
      const int blocks = rank < p.batch ? order.blocks[order.by_rank[rank]] : 0;
      int tiles = blocks * units;
      for (int step = 1; step < 32; step *= 2) {
        const int lower = __shfl_up_sync(0xffffffffu, tiles, step);
        if (lane >= step) tiles += lower;
      }
      if (rank < p.batch) {
        order.first_tile[rank + 1] = before + tiles;
        order.keys[rank] = blocks;  // the keys are ranked: now blocks by rank
      }
      before += __shfl_sync(0xffffffffu, tiles, 31);
    }
  }
  // The caller's __syncthreads publishes first_tile.
}

// The grid index (locate_tile) of the linear-th tile of the sequence order:
// the rank whose tiles hold it (binary search over first_tile), then its
// sequence's heads one by one, each head's query blocks heaviest first
// (causal: the last).
template <class Cfg>
__device__ __forceinline__ int sequence_order_tile(const FwdParams& p, int linear) {
  const SequenceOrder order = sequence_order<Cfg>();
  int rank = 0;
  for (int high = p.batch - 1; rank < high;) {
    const int middle = (rank + high + 1) / 2;
    if (order.first_tile[middle] <= linear) {
      rank = middle;
    } else {
      high = middle - 1;
    }
  }
  const int in_sequence = linear - order.first_tile[rank], blocks = order.keys[rank];
  const int unit = in_sequence / blocks, from_heaviest = in_sequence - unit * blocks;
  // locate_tile counts causal blocks from the grid's last.
  const int in_grid = Cfg::kCausal ? p.num_q_blocks - blocks + from_heaviest : from_heaviest;
  return (order.by_rank[rank] * (Cfg::kPackGqa ? p.heads_kv : p.heads_q) + unit) * p.num_q_blocks + in_grid;
}

// Persistent (Cfg::kPersistent): the grid's gridDim.x CTAs (at most one wave)
// share the tiles that an ordinary launch gives one CTA each, in snake
// rounds: round r gives CTA c tile r · ctas + c of an order, or r · ctas +
// ctas − 1 − c in odd rounds. The order is the grid's, in which neighbouring
// CTAs share a head's K/V in L2 (query block major, unmasked tiles measured
// up to 18% slower at head dim 128), and within a head causal tiles come
// heaviest first. Varlen kernels with up to 128-row tiles walk the sequence
// order instead (Cfg::kSequenceOrder), where they have at most
// kOrderedSequences sequences. Causal 192-row tiles, and other varlen ones,
// are ordered heaviest first across every head (the last query block of
// every head, then the next to last, ...; Cfg::kHeadMajorTiles says why),
// so the heavy and light ends of the rounds even out each CTA's total for
// any block count. Grouping heads so that their K/V fit in L2 together
// breaks that descending order, and measured 1-17% slower from 4k keys
// (docs/PERFORMANCE.md). work(job, at) runs for each of this CTA's tiles;
// producer and MMA warps walk the same tiles, and skip the same empty ones
// (varlen).
template <class Cfg, class Work>
__device__ __forceinline__ RingPosition walk_persistent_tiles(const FwdParams& p, const Work& work) {
  // Few values stay live across a tile (the MMA warps' registers are full):
  // the linear tile number, the round's parity and the ring position; the
  // rest is reread from the parameters, shared memory and special
  // registers.
  auto grid_heads = [&] { return (Cfg::kPackGqa ? p.heads_kv : p.heads_q) * p.batch; };
  auto tile_count = [&] {
    return walks_sequence_order<Cfg>(p) ? sequence_order<Cfg>().first_tile[p.batch]
                                        : p.num_q_blocks * grid_heads();
  };
  RingPosition at;
  int linear = static_cast<int>(blockIdx.x);
  for (bool odd = false; linear < tile_count(); odd = !odd) {
    // The grid index of the linear-th tile.
    const int index = walks_sequence_order<Cfg>(p) ? sequence_order_tile<Cfg>(p, linear)
                      : Cfg::kHeadMajorTiles       ? linear
                                                   : linear % grid_heads() * p.num_q_blocks + linear / grid_heads();
    TileJob job;
    if (locate_tile<Cfg>(p, index, job)) {
      work(job, at);
      ++at.tile;
      at.block += job.end_block - job.first_block;
    }
    // Round r's tile r · ctas + c, or r · ctas + ctas − 1 − c in odd rounds.
    linear += odd ? 2 * static_cast<int>(blockIdx.x) + 1 : 2 * (static_cast<int>(gridDim.x - blockIdx.x)) - 1;
  }
  return at;
}

// The producer runs ahead into the CTA's next tile (its Q into the other
// buffer, its first K/V blocks into the ring, K rotated for RoPE) while the
// MMA warps finish the current one, and (kProducerStoresOutput) copies out
// each tile's output once they have staged it, so the MMA warps go from one
// tile's last P V to the next tile's first S = Q Kᵀ with only the staging
// between. Each role has its own loop: register allocation follows the
// hand-over (setmaxnreg) only where the roles' code is apart (one shared
// loop spilled 350-480 bytes, ptxas 13.0 through nvcc).
template <class Cfg>
__device__ void fwd_prefill_persistent(const FwdParams& p, unsigned char* shared_bytes) {
  const Ring<Cfg> ring{smem_u32(shared_bytes),
                       Cfg::kInterleavedKV && p.kv_value_first != 0 ? Cfg::kKVPanels * 1024u : 0u};
  if (threadIdx.x == 0) ring.init();
  if (walks_sequence_order<Cfg>(p)) order_sequences<Cfg>(p);
  __syncthreads();
  if (threadIdx.x < Cfg::kProducerThreads) {
    warpgroup_registers_release<Cfg::kProducerRegisters>();
    const RingPosition end = walk_persistent_tiles<Cfg>(p, [&](const TileJob& job, RingPosition at) {
      produce_tiles<Cfg>(p, job, ring, shared_bytes, at);
    });
    // The last tile's output is still staged (produce_tiles copies out
    // each earlier one).
    const int storer = threadIdx.x - 32;
    if (Cfg::kProducerStoresOutput && storer >= 0 && end.tile >= 1) {
      const RingPosition last{end.tile - 1, 0};
      mbarrier_wait(ring.q_free(last.q_buffer()), last.q_phase());
      store_staged_tile<Cfg>(p, shared_bytes, last.q_buffer(), storer);
    }
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
  // A warp whose rows are all past the tile's (a short sequence's or a KV
  // head's few packed rows) only copies and waits at the barriers: its MMAs
  // would take tensor-core time from the warps of other CTAs on its SM
  // sub-partition. Only warps of 16 rows: with 32 (128-row 4-warp tiles at
  // 255 registers) the branch made ptxas spill 76-88 bytes, and the kernel
  // measured slower (docs/PERFORMANCE.md).
  constexpr bool kSkipIdleWarps = Cfg::kRowsPerWarp == 16;
  const bool warp_has_rows = !kSkipIdleWarps || q0 + warp_row0 < rows;
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
    load_kv_tile<typename Cfg::ValueTile>(v_tile, v, p.v_row_stride, p.v_batch_stride, pages, p.page_shift, key0,
                                          seqlen_k, chunks_valid, page_current);
    cp_async_commit();
    if constexpr (Cfg::kRotateKeys) {
      // Rotating K here costs 25-40% of a block's time (docs/PERFORMANCE.md):
      // each CTA rotates every K block it reads. Double-buffering K to overlap
      // the rotation with P V measured no faster (and spilled at head_dim 128);
      // the producer layout (Cfg::kProducer) rotates beside the MMA warps.
      rotate_k_tile<Cfg>(shared_bytes + Cfg::kSmemQ * 2, p, key_position0 + key0);
      __syncthreads();
    }

    // V has landed, and every warp is done with K, so the next K block may
    // stream in while P V (and, with kEarlyNextK, the softmax) runs.
    // Idle warps reach this barrier from the other call site below: CTA-wide
    // but uniform within each warp, which PTX's bar.sync (barrier.sync.aligned)
    // allows and CUDA C++'s __syncthreads does not, hence the PTX. One call
    // site, with the math in branches around it, measured up to 13% slower on
    // 64-row tiles (docs/PERFORMANCE.md). compute-sanitizer synccheck reports
    // this pattern as "Divergent thread(s) in block" even when it is correct
    // (bench/probe_synccheck.cu, mode 4).
    auto wait_v_then_load_next_k = [&] {
      cp_async_wait<0>();
      named_barrier_sync<0, Cfg::kThreads>();
      if (block > first_block) {
        load_kv_tile<Cfg>(k_tile, k, p.k_row_stride, p.k_batch_stride, pages, p.page_shift, key0 - Cfg::kBlockKV,
                          seqlen_k, chunks_valid, page_next);
      }
      cp_async_commit();
    };
    if (warp_has_rows) {
      float s[Cfg::kMTiles][Cfg::kScoreTiles][4];
      gemm_qk<Cfg>(s, opaque(q_tile), opaque(k_tile), warp_row0, lane);
      if constexpr (Cfg::kRewriteScores) {
        rewrite_scores<Cfg>(s, p, slopes, q0 + warp_row0, key0, diagonal_offset, lane);
      }
      // The chunk bounds are formed per block here, not held across the loop
      // as the wgmma and decode kernels do: two more live registers spilled
      // 12 bytes more in the 4-warp kernels of unaligned head dims (ptxas,
      // NVRTC 13.0; test_compile).
      if (block_needs_mask<Cfg>(p, key0, seqlen_k, first_query, last_query, diagonal_offset,
                                chunk_bounds<Cfg>(p, first_query, last_query, diagonal_offset))) {
        apply_mask<Cfg>(s, p, seqlen_k, q0 + warp_row0, key0, diagonal_offset, lane);
      }
      if constexpr (Cfg::kEarlyNextK) {
        wait_v_then_load_next_k();
        online_softmax<Cfg>(s, o, row_max, row_sum, p.scale_log2);
      } else {
        online_softmax<Cfg>(s, o, row_max, row_sum, p.scale_log2);
        wait_v_then_load_next_k();
      }
      unsigned probabilities[Cfg::kMTiles][Cfg::kBlockKV / 16][4];
      pack_probabilities<Cfg>(probabilities, s);
      gemm_pv<typename Cfg::ValueTile>(o, probabilities, opaque(v_tile), lane);
    } else {
      wait_v_then_load_next_k();
    }
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
                    p.lse_row_stride, p.lse_head_stride, q0, warp_row0, rows, group, chunks_valid, p.lse_scale,
                    tile_sinks<Cfg>(p, head), lane);
}

}  // namespace jitattn
