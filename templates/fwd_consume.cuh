// The consumer side of the prefill kernels with a producer: MMA warps that
// take K/V blocks from the ring, with mma.sync or with wgmma warpgroups that
// take turns at the tensor cores. Part of fwd_prefill.cuh.
#pragma once

#include "fwd_pipeline.cuh"

namespace jitattn {

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
  const ChunkBounds chunks = chunk_bounds<Cfg>(p, first_query, last_query, job.diagonal_offset);

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
      if (block_needs_mask<Cfg>(p, key0, job.seqlen_k, first_query, last_query, job.diagonal_offset, chunks)) {
        apply_mask<Cfg>(s_acc, p, job.seqlen_k, job.q0 + warp_row0, key0, job.diagonal_offset, lane);
      }
      online_softmax<Cfg>(s_acc, o, row_max, row_sum, p.scale_log2);
      unsigned probabilities[Cfg::kMTiles][Cfg::kBlockKV / 16][4];
      pack_probabilities<Cfg>(probabilities, s_acc);
      mbarrier_wait(ring.v_landed(s), parity);
      gemm_pv<typename Cfg::ValueTile>(o, probabilities, opaque(ring.v_stage(s)), lane);
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
                    p.lse_scale, tile_sinks<Cfg>(p, job.head), lane);
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
  const ChunkBounds chunks = chunk_bounds<Cfg>(p, first_query, last_query, job.diagonal_offset);
  // A warpgroup whose rows are all past the tile's computes nothing: it
  // hands every stage back and passes its turns, so the other warpgroups'
  // MMAs run back to back. Decoding sequences beside a prefill chunk in one
  // varlen call (a KV head's few packed rows in a 128-row tile) then cost
  // half the tensor-core time (docs/PERFORMANCE.md).
  if (job.q0 + group_row0 >= job.rows) group_first_block = group_end_block = 0;

  float o[Cfg::kMTiles][Cfg::kOutTiles][4];
  float row_max[Cfg::kMTiles][2];
  float row_sum[Cfg::kMTiles][2];
  clear_accumulators<Cfg>(o, row_max, row_sum);
  // K and V stages: from one panel to the next, and from one 8-row group
  // to the next (kv_tile_bytes).
  constexpr unsigned kKVPanelBytes = Cfg::kKVGroupAtoms > 1 ? 1024 : Cfg::kBlockKV * 128;
  constexpr unsigned kKVGroupBytes = Cfg::kKVGroupAtoms * 1024;
  // S = Q Kᵀ for the block in `stage` (async). Q's and K's k-step ks: panel
  // ks / 4, 32-byte column ks % 4.
  const int q_buffer = at.q_buffer();
  unsigned char* const q_bytes = shared_bytes + q_buffer * Cfg::kSmemQ * 2;
  const unsigned q_rows = ring.q_tile(q_buffer) + group_row0 * 128;
  const unsigned long long q_descriptor = wgmma_descriptor(q_rows, 16);  // unused where Q sits in registers
  // Fused RoPE at head dims up to 64: Q rotated in registers (QRegisters).
  QRegisters<Cfg> q_registers;
  auto issue_qk = [&](float (&s_acc)[Cfg::kMTiles][Cfg::kScoreTiles][4], int stage) {
    // Copies that landed without a producer store (K without RoPE) reach
    // the async proxy through this thread's fence.
    fence_async_shared();
    wgmma_fence();
    const unsigned long long k_descriptor = wgmma_descriptor(ring.k_stage(stage), 16, kKVGroupBytes);
    auto q_at = [&](int ks) {
      return wgmma_descriptor_at(q_descriptor, (ks >> 2) * (Cfg::kBlockQ * 128) + (ks & 3) * 32);
    };
    auto k_at = [&](int ks) { return wgmma_descriptor_at(k_descriptor, (ks >> 2) * kKVPanelBytes + (ks & 3) * 32); };
    if constexpr (QRegisters<Cfg>::kUsed) {
      wgmma_rs_k_major<Element, Cfg::kBlockKV, false>(s_acc[0], q_registers.a[0], k_at(0));
#pragma unroll
      for (int ks = 1; ks < QRegisters<Cfg>::kSteps; ++ks) {
        wgmma_rs_k_major<Element, Cfg::kBlockKV, true>(s_acc[0], q_registers.a[ks], k_at(ks));
      }
    } else {
      wgmma_ss<Element, Cfg::kBlockKV, false>(s_acc[0], q_at(0), k_at(0));
#pragma unroll
      for (int ks = 1; ks < Cfg::kHeadDim / 16; ++ks) {
        wgmma_ss<Element, Cfg::kBlockKV, true>(s_acc[0], q_at(ks), k_at(ks));
      }
    }
    wgmma_commit();
  };
  // O += P V for the block in `stage` (async).
  auto issue_pv = [&](const unsigned (&probabilities)[Cfg::kMTiles][Cfg::kBlockKV / 16][4], int stage,
                      unsigned parity) {
    mbarrier_wait(ring.v_landed(stage), parity);
    fence_async_shared();
    wgmma_fence();
    const unsigned long long v_descriptor = wgmma_descriptor(ring.v_stage(stage), kKVPanelBytes, kKVGroupBytes);
#pragma unroll
    for (int ks = 0; ks < Cfg::kBlockKV / 16; ++ks) {
      // Keys 16ks..16ks+15: two 8-row groups of every panel; panels (64
      // columns of V each) are kKVPanelBytes apart.
      wgmma_rs_panels<Element, Cfg::kHeadDimV>(o[0], probabilities[0][ks],
                                               wgmma_descriptor_at(v_descriptor, 2 * ks * kKVGroupBytes),
                                               kKVPanelBytes);
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
    if (block_needs_mask<Cfg>(p, key0, job.seqlen_k, first_query, last_query, job.diagonal_offset, chunks)) {
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
    int key_position0, query_position0;
    rope_positions(p, job.batch, job.diagonal_offset, key_position0, query_position0);
    if constexpr (QRegisters<Cfg>::kUsed) {
      q_registers.load_rotated(ring.q_tile(q_buffer), p, warp_row0, lane, [&](int row) {
        return query_position0 + (Cfg::kPackGqa ? query_position<Cfg>(job.q0 + row, job.group) : job.q0 + row);
      });
    } else {
      // Each warpgroup rotates its own Q rows (only its wgmma read them) and
      // orders the stores before those reads (async proxy).
      rotate_q_rows<Cfg, kGroupRows, 128, Cfg::kQRotationWords>(q_bytes, p, query_position0, job.q0, job.group,
                                                                group_row0, consumer & 127);
      fence_async_shared();
      named_barrier_sync(2 + (consumer >> 7), 128);
    }
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
  if constexpr (Cfg::kProducerStoresOutput) {
    // Producer warps 1-3 copy the staged rows out.
    stage_output<Cfg>(o, row_max, row_sum, q_bytes, job.lse, p.lse_row_stride, p.lse_head_stride, job.q0, warp_row0,
                      job.rows, job.group, p.lse_scale, tile_sinks<Cfg>(p, job.head), lane);
  } else {
    store_output<Cfg>(o, row_max, row_sum, q_bytes, job.out, p.o_row_stride, p.o_head_stride, job.lse,
                      p.lse_row_stride, p.lse_head_stride, job.q0, warp_row0, job.rows, job.group, job.chunks_valid,
                      p.lse_scale, tile_sinks<Cfg>(p, job.head), lane);
  }
  // Persistent: the producer may load a later tile's Q into these rows
  // (once warps 1-3 have copied the staged output out, where they do).
  if constexpr (Cfg::kPersistent) mbarrier_arrive(ring.q_free(q_buffer));
}

}  // namespace jitattn
