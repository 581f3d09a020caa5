// The producer side of the prefill kernels with a producer (stages > 0): a
// tile's job (TileJob), the ring of K/V stages and their barriers (Ring),
// and the producers that copy (cp.async or tensor copies), shift and rotate
// blocks into it. Part of fwd_prefill.cuh.
#pragma once

#include "fwd_rope_tiles.cuh"

namespace jitattn {

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
// so the producer refills K stages that much earlier (except where one copy
// brings a page's K and V, Cfg::kInterleavedKV: a stage is refilled once
// both are handed back, and V lands on "K ready"). Hand-offs are
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
// persistent, "Q free" (the MMA warps have staged their output in its rows;
// with kProducerStoresOutput producer warps 1-3 copy it out, then arrive on
// "output copied": store_staged_tile); with staged RoPE tables, "table
// landed" per table slot (produce_tiles). Block i of the CTA's sequence (the key blocks from the last
// down) uses stage i % kStages in phase (i / kStages) & 1; a persistent CTA
// counts its blocks on across its tiles (RingPosition).
template <class Cfg>
struct Ring {
  static constexpr int kStageKBytes = Cfg::kSmemK * 2;
  static constexpr int kStageVBytes = Cfg::kSmemV * 2;
  static constexpr int kQBytes = Cfg::kQBuffers * Cfg::kSmemQ * 2;
  unsigned base;  // shared-window address of the first Q tile (start of shared memory)
  // Cfg::kInterleavedKV: where K's atoms start in a group of K's and V's
  // (kKVPanels KB on where V lies lower in memory,
  // FwdParams::kv_value_first: the copies' map starts at V).
  unsigned k_atom = 0;
  __device__ __forceinline__ unsigned q_tile(int b) const { return base + b * Cfg::kSmemQ * 2; }
  // Cfg::kInterleavedKV: stage s's K and V, interleaved group by group.
  __device__ __forceinline__ unsigned kv_pair_stage(int s) const {
    return base + kQBytes + s * (kStageKBytes + kStageVBytes);
  }
  __device__ __forceinline__ unsigned k_stage(int s) const {
    if constexpr (Cfg::kInterleavedKV) return kv_pair_stage(s) + k_atom;
    return base + kQBytes + s * kStageKBytes;
  }
  __device__ __forceinline__ unsigned v_stage(int s) const {
    if constexpr (Cfg::kInterleavedKV) return kv_pair_stage(s) + (k_atom ^ (Cfg::kKVPanels * 1024u));
    return base + kQBytes + Cfg::kStages * kStageKBytes + s * kStageVBytes;
  }
  __device__ __forceinline__ unsigned barrier(int index) const { return base + Cfg::kBarrierOffset + index * 8; }
  __device__ __forceinline__ unsigned k_ready(int s) const { return barrier(s); }
  __device__ __forceinline__ unsigned k_landed(int s) const { return barrier(Cfg::kStages + s); }
  __device__ __forceinline__ unsigned k_free(int s) const { return barrier(2 * Cfg::kStages + s); }
  // V lands with K where one copy brings both (Cfg::kInterleavedKV).
  __device__ __forceinline__ unsigned v_landed(int s) const {
    return Cfg::kInterleavedKV ? k_ready(s) : barrier(3 * Cfg::kStages + s);
  }
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
  // Staged RoPE tables (Cfg::kStagedTables): slot t's cos rows (its sin rows
  // follow), and "table landed" per slot, after every other barrier.
  __device__ __forceinline__ unsigned table_slot(int t) const {
    return base + Cfg::kTableOffset + t * Cfg::kTableSlotBytes;
  }
  __device__ __forceinline__ unsigned table_landed(int t) const {
    return barrier(5 * Cfg::kStages + Cfg::kQBarriers + 2 * Cfg::kStagingSlots + Cfg::kStagedRows + t);
  }

  // Persistent (Cfg::kProducerStoresOutput): "output copied" per Q buffer,
  // in its record (staged_tile_record).
  __device__ __forceinline__ unsigned output_copied(int b) const {
    return base + Cfg::kOutputRecordOffset + b * Cfg::kOutputRecordBytes + Cfg::kOutputRecordBytes - 8;
  }

  // Every barrier, by thread 0 before the CTA's first __syncthreads.
  __device__ __forceinline__ void init() const {
    for (int s = 0; s < Cfg::kStages; ++s) {
      // Tensor copies: one arrival (with the bytes to expect) per phase, on
      // "K landed" where the producer rotates K and then arrives on "K ready".
      mbarrier_init(k_ready(s), Cfg::kTensorCopies && !Cfg::kRotateKeys ? 1 : Cfg::kProducerThreads);
      mbarrier_init(k_landed(s), Cfg::kTensorCopies && Cfg::kRotateKeys ? 1 : Cfg::kProducerThreads);
      mbarrier_init(k_free(s), Cfg::kWarps * 32);
      if (!Cfg::kInterleavedKV) mbarrier_init(v_landed(s), Cfg::kTensorCopies ? 1 : Cfg::kProducerThreads);
      mbarrier_init(v_free(s), Cfg::kWarps * 32);
    }
    for (int b = 0; b < Cfg::kQBuffers; ++b) {
      mbarrier_init(q_landed(b), Cfg::kProducerThreads);
      if (Cfg::kPersistent) mbarrier_init(q_free(b), Cfg::kWarps * 32);
      if (Cfg::kProducerStoresOutput) mbarrier_init(output_copied(b), Cfg::kOutputStorers);
    }
    if constexpr (Cfg::kStagedRows) {
      for (int slot = 0; slot < Cfg::kStagingSlots; ++slot) {
        mbarrier_init(k_staged(slot), Cfg::kProducerThreads);
        mbarrier_init(v_staged(slot), Cfg::kProducerThreads);
      }
      mbarrier_init(q_staged(), Cfg::kProducerThreads);
    }
    for (int t = 0; t < Cfg::kTableSlots; ++t) mbarrier_init(table_landed(t), 1);
    if constexpr (Cfg::kTensorCopies || Cfg::kStagedTables) fence_barrier_init();
  }
};

// A tile whose output the MMA warps stage in a Q buffer for producer warps
// 1-3 to copy out (Cfg::kProducerStoresOutput): its record, one per Q
// buffer after the ring's barriers (Cfg::kOutputRecordOffset), and the
// buffer's "output copied" mbarrier (those 96 threads' arrivals) in the
// record's last 8 bytes.
struct StagedTile {
  unsigned short* out;
  int q0, rows, group, chunks_valid;
};

template <class Cfg>
__device__ __forceinline__ StagedTile* staged_tile_record(unsigned char* shared_bytes, int buffer) {
  static_assert(sizeof(StagedTile) + 8 <= Cfg::kOutputRecordBytes, "a record and a barrier per Q buffer");
  return reinterpret_cast<StagedTile*>(shared_bytes + Cfg::kOutputRecordOffset + buffer * Cfg::kOutputRecordBytes);
}

// Copies the output staged in Q buffer `buffer` to memory, by producer
// warps 1-3 (storer: this thread's index among them), once the MMA warps'
// "Q free" arrivals have completed (the caller waited). Warp 1's lane 0
// wrote the record when the tile began; the barrier makes it visible to
// the others.
template <class Cfg>
__device__ __forceinline__ void store_staged_tile(const FwdParams& p, unsigned char* shared_bytes, int buffer,
                                                  int storer) {
  named_barrier_sync<Cfg::kStorerBarrier, Cfg::kOutputStorers>();
  const StagedTile tile = *staged_tile_record<Cfg>(shared_bytes, buffer);
  copy_staged_output<Cfg, Cfg::kBlockQ, Cfg::kOutputStorers, Cfg::kStorerUnroll>(
      shared_bytes + buffer * Cfg::kSmemQ * 2, tile.out, p.o_row_stride, p.o_head_stride, tile.q0, 0, tile.rows,
      tile.group, tile.chunks_valid, storer);
}

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
  // The map row of the sequence's key 0: its packed rows, or a contiguous
  // cache's first row (cache_leftpad).
  const int k_row0 = Cfg::kVarlenKeys ? p.cu_seqlens_k[job.batch] : kv_row_offset<Cfg>(p, job.batch);
  const int* pages = Cfg::kPaged ? p.block_table + job.batch * p.block_table_stride : nullptr;
  // The map's outermost coordinate: the batch, a contiguous cache's batch
  // (cache_batch_idx), or (paged) the page, looked up per copy.
  const int map_batch = Cfg::kKVCache && !Cfg::kPaged && p.kv_batch_index != nullptr ? p.kv_batch_index[job.batch]
                                                                                      : job.batch;
  constexpr int kCopyThreads = Cfg::kPaged ? 32 : 1;
  // Copies block i of this tile (block at.block + i of the CTA's ring) of K
  // or of V into its stage once the stage is free. Tensor copies: one copy
  // per 64-channel panel (and page); the KV head is the tile's query head
  // (packed or not) over the group size. `first`: block 0. V's rows take
  // their widths from Cfg::ValueTile (Cfg itself unless V has a head dim of
  // its own); copies by thread are of V blocks, or of a paged cache's,
  // which has none.
  using ValueTile = typename Cfg::ValueTile;
  static_assert(!Cfg::kInterleavedKV || (!kVLate && !Cfg::kVarlenKeys && !Cfg::kSplitDims),
                "interleaved K/V stages are copied together, from a paged cache, V as wide as K");
  auto issue = [&](int i, bool values, bool first) {
    // Interleaved K/V stages: K's issue copies both.
    if (Cfg::kInterleavedKV && values) return;
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
    if (r >= kStages) {
      mbarrier_wait(values ? ring.v_free(s) : ring.k_free(s), (r / kStages - 1) & 1);
      if (Cfg::kInterleavedKV) mbarrier_wait(ring.v_free(s), (r / kStages - 1) & 1);
    }
    const unsigned stage = values ? ring.v_stage(s) : ring.k_stage(s);
    if constexpr (Cfg::kTensorCopies) {
      const int panels = values ? ValueTile::kRowElems / 64 : Cfg::kRowElems / 64;
      const unsigned barrier = values ? ring.v_landed(s) : Cfg::kRotateKeys ? ring.k_landed(s) : ring.k_ready(s);
      const int kv_head = job.head / p.heads_per_kv;
      if (by_threads) {
        if constexpr (Cfg::kVarlenKeys) {
          // (The sequence's V rows from the parameters, not job.v: the
          // three-warpgroup producer's 32 registers spilled holding it.)
          const unsigned short* v_rows = static_cast<const unsigned short*>(p.v) +
                                         static_cast<long long>(k_row0) * p.v_row_stride + kv_head * p.v_head_stride;
          load_tile_rolled<ValueTile, Cfg::kBlockKV>(stage, v_rows, p.v_row_stride, key0_of(i), job.seqlen_k,
                                                     job.chunks_valid);
        } else if constexpr (Cfg::kPaged) {
          // A row at a time whatever the page size (the block that ends
          // past the sequence, and pages too short for a tensor copy): the
          // strided copy of whole pages, unrolled beside the producer's
          // 40-56 registers above head_dim 128, spilled 540 bytes.
          load_paged_rows<Cfg>(stage, values ? job.v : job.k, values ? p.v_row_stride : p.k_row_stride,
                               values ? p.v_batch_stride : p.k_batch_stride, pages, p.page_shift, key0_of(i),
                               job.seqlen_k, job.chunks_valid);
          if constexpr (Cfg::kInterleavedKV) {
            load_paged_rows<Cfg>(ring.v_stage(s), job.v, p.v_row_stride, p.v_batch_stride, pages, p.page_shift,
                                 key0_of(i), job.seqlen_k, job.chunks_valid);
          }
        } else {
          load_tile_rolled<ValueTile, Cfg::kBlockKV>(stage, job.v, p.v_row_stride, key0_of(i), job.seqlen_k,
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
      constexpr int kTensors = Cfg::kInterleavedKV ? 2 : 1;  // K and V in one copy
      if (lane == 0) mbarrier_arrive_expect_bytes(barrier, kTensors * panels * Cfg::kBlockKV * 128);
      if (lane * copy_rows >= Cfg::kBlockKV) return;
      const int key = key0_of(i) + lane * copy_rows;
      const int row = Cfg::kPaged ? key & ((1 << p.page_shift) - 1) : k_row0 + key;
      const int outer = Cfg::kPaged ? page : map_batch;
      const TensorMap* map = values ? &p.v_map : &p.k_map;
      if constexpr (Cfg::kInterleavedKV) {
        // One box of every panel of K's and V's rows of the page (or of the
        // block, in a longer page): dimensions 64 channels, 8 rows, panels,
        // K/V (V first where it lies lower: Ring::k_atom), and 8-row groups
        // of every page (FwdParams::kv_map_page_groups a page), into which
        // KV head kv_head's box starts at panel kv_head · k_map_head_panels,
        // K/V index kv_head · kv_map_head_pair or group kv_head ·
        // k_map_head_groups (paged_pair_map).
        tensor_copy_5d(ring.kv_pair_stage(s) + lane * copy_rows * 2 * panels * 128, &p.k_map, barrier, 0, 0,
                       kv_head * p.k_map_head_panels, kv_head * p.kv_map_head_pair,
                       page * p.kv_map_page_groups + kv_head * p.k_map_head_groups + (row >> 3));
      } else if constexpr (Cfg::kInterleavedPanels) {
        // One box of every panel: the page's rows (or the block's, in a
        // longer page) from its 8-row group row / 8, KV head kv_head's
        // panels or groups (FwdParams::k_map_head_panels).
        const int head_panels = values ? p.v_map_head_panels : p.k_map_head_panels;
        const int head_groups = values ? p.v_map_head_groups : p.k_map_head_groups;
        tensor_copy_5d(stage + lane * copy_rows * panels * 128, map, barrier, 0, 0, kv_head * head_panels,
                       kv_head * head_groups + (row >> 3), page);
      } else {
#pragma unroll
        for (int panel = 0; panel < panels; ++panel) {
          const unsigned destination = stage + (panel * Cfg::kBlockKV + lane * copy_rows) * 128;
          if constexpr (Cfg::kVarlenKeys) {
            tensor_copy_3d(destination, map, barrier, panel * 64, row, kv_head);
          } else {
            tensor_copy_4d(destination, map, barrier, panel * 64, row, kv_head, outer);
          }
        }
      }
    } else {
      // A paged KV cache: the batch strides are page strides, and the
      // sequence's pages come from its row of the block table.
      if (Cfg::kSplitDims && values) {
        load_kv_tile<ValueTile>(stage, job.v, p.v_row_stride, p.v_batch_stride, pages, 0, key0_of(i), job.seqlen_k,
                                job.chunks_valid);
      } else {
        load_kv_tile<Cfg>(stage, values ? job.v : job.k, values ? p.v_row_stride : p.k_row_stride,
                          values ? p.v_batch_stride : p.k_batch_stride, pages, Cfg::kPaged ? p.page_shift : 0,
                          key0_of(i), job.seqlen_k, job.chunks_valid);
      }
      cp_async_mbarrier_arrive(values ? ring.v_landed(s) : Cfg::kRotateKeys ? ring.k_landed(s) : ring.k_ready(s));
      cp_async_commit();
    }
  };
  auto issue_k = [&](int i, bool first = false) { issue(i, false, first); };
  auto issue_v = [&](int i, bool first = false) { issue(i, true, first); };
  // Persistent: the Q buffer is free once the MMA warps have staged the
  // output of the CTA's tile before last in it, and (kProducerStoresOutput)
  // producer warps 1-3 have copied that out (at the end of the last tile).
  const int q_buffer = at.q_buffer();
  const int storer = threadIdx.x % Cfg::kProducerThreads - 32;
  if (Cfg::kPersistent && at.tile >= 2) {
    mbarrier_wait(ring.q_free(q_buffer), at.q_phase() ^ 1);
    if (Cfg::kProducerStoresOutput) mbarrier_wait(ring.output_copied(q_buffer), at.q_phase() ^ 1);
  }
  if (Cfg::kProducerStoresOutput && storer == 0) {
    *staged_tile_record<Cfg>(shared_bytes, q_buffer) = {job.out, job.q0, job.rows, job.group, job.chunks_valid};
  }
  if constexpr (Cfg::kPackGqa) {
    load_packed_q<Cfg>(ring.q_tile(q_buffer), job.q, p.q_row_stride, p.q_head_stride, job.q0, job.rows, job.group,
                       job.chunks_valid);
  } else {
    load_tile<Cfg, Cfg::kBlockQ>(ring.q_tile(q_buffer), job.q, p.q_row_stride, job.q0, job.seqlen_q,
                                 job.chunks_valid);
  }
  cp_async_mbarrier_arrive(ring.q_landed(q_buffer));
  cp_async_commit();
  int key_position0 = 0, query_position0 = 0;
  if constexpr (Cfg::kRope != kRopeNone) {
    rope_positions(p, job.batch, job.diagonal_offset, key_position0, query_position0);
  }
  // Staged RoPE tables (Cfg::kStagedTables): block i's cos and sin rows come
  // by two tensor copies from producer thread 0 into table slot
  // r % kTableSlots (r: the block's place in the ring), once every producer
  // thread is done rotating the block that used the slot before (that
  // block's "K ready" has completed). A block whose positions are not all
  // rows of the tables (which the loads from L2 clamp), or tables that have
  // no maps, is rotated with loads from L2 instead; its slot's phase then
  // completes by the one arrival alone.
  auto tables_staged = [&](int i) {
    const int position0 = key_position0 + key0_of(i);
    return p.rope_tables_staged != 0 && position0 >= 0 && position0 <= p.rope_table_rows - Cfg::kBlockKV;
  };
  constexpr int kTableSlots = Cfg::kStagedTables ? Cfg::kTableSlots : 1;
  auto issue_tables = [&](int i) {
    if (threadIdx.x % Cfg::kProducerThreads != 0) return;
    const int r = at.block + i, t = r % kTableSlots;
    if (r >= kTableSlots) {
      const int before = r - kTableSlots;
      mbarrier_wait(ring.k_ready(before % kStages), (before / kStages) & 1);
    }
    const unsigned landed = ring.table_landed(t);
    if (!tables_staged(i)) {
      mbarrier_arrive(landed);
      return;
    }
    constexpr int kTableBytes = Cfg::kBlockKV * Cfg::kTableRowBytes;
    mbarrier_arrive_expect_bytes(landed, 2 * kTableBytes);
    tensor_copy_2d(ring.table_slot(t), &p.rope_cos_map, landed, 0, key_position0 + key0_of(i));
    tensor_copy_2d(ring.table_slot(t) + kTableBytes, &p.rope_sin_map, landed, 0, key_position0 + key0_of(i));
  };
  if constexpr (Cfg::kStagedTables) {
    for (int i = 0; i < kTableSlots && i < blocks; ++i) issue_tables(i);
  }
  // Up to kStages - 1 blocks ahead of the one being rotated.
  for (int i = 0; i < kStages - 1 && i < blocks; ++i) {
    issue_k(i, i == 0);
    if constexpr (!kVLate) issue_v(i, i == 0);
  }
  ProducerKeyRotation<Cfg> key_rotation(p, threadIdx.x % Cfg::kProducerThreads);
  for (int i = 0; i < blocks; ++i) {
    if constexpr (Cfg::kRotateKeys) {
      // K landed, for every producer thread (rotation units span chunks
      // that other threads copied).
      const int r = at.block + i, s = r % kStages;
      mbarrier_wait(ring.k_landed(s), (r / kStages) & 1);
      const unsigned char* table_slot = nullptr;
      if constexpr (Cfg::kStagedTables) {
        if (tables_staged(i)) {
          const int t = r % kTableSlots;
          mbarrier_wait(ring.table_landed(t), (r / kTableSlots) & 1);
          table_slot = shared_bytes + (ring.table_slot(t) - ring.base);
        }
      }
      key_rotation.rotate(shared_bytes + (ring.k_stage(s) - ring.base), p, key_position0 + key0_of(i), i, table_slot);
      // wgmma reads tiles through the async proxy: the rotated stores must
      // be ordered before those reads.
      if constexpr (Cfg::kWgmma) fence_async_shared();
      mbarrier_arrive(ring.k_ready(s));
      // With one table slot (persistent) the next block's rows are copied
      // as soon as every producer thread is done with this block's; with
      // more, after this iteration's K/V copies are issued (its thread then
      // rarely waits for the others). Each order was 2-5% faster where it
      // is used than the other (H200, docs/PERFORMANCE.md).
      if constexpr (Cfg::kStagedTables && kTableSlots == 1) {
        if (i + 1 < blocks) issue_tables(i + 1);
      }
    }
    if (i + kStages - 1 < blocks) {
      issue_k(i + kStages - 1);
      if constexpr (!kVLate) issue_v(i + kStages - 1);
    }
    if constexpr (kVLate) issue_v(i, i == 0);
    if constexpr (Cfg::kStagedTables && kTableSlots > 1) {
      if (i + kTableSlots < blocks) issue_tables(i + kTableSlots);
    }
  }
  // The last copies complete before the producer's threads exit (a
  // persistent producer waits once, after its last tile).
  if constexpr (!Cfg::kPersistent) cp_async_wait<0>();
  // Producer warps 1-3 copy out the previous tile's output, staged in the
  // Q buffer that the next tile's Q goes to. They get here while thread 0
  // still issues this tile's copies (they only copied their share of Q),
  // so the copy runs as soon as the MMA warps have staged it. Here few of
  // the producer's registers are live (at the next tile's start its job's
  // are: the three-warpgroup producer's 32 spilled 24 bytes there).
  if constexpr (Cfg::kProducerStoresOutput) {
    if (at.tile >= 1 && storer >= 0) {
      const RingPosition previous{at.tile - 1, 0};
      mbarrier_wait(ring.q_free(previous.q_buffer()), previous.q_phase());
      store_staged_tile<Cfg>(p, shared_bytes, previous.q_buffer(), storer);
      mbarrier_arrive(ring.output_copied(previous.q_buffer()));
    }
  }
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

}  // namespace jitattn
