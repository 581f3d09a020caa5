// The prefill kernels' compile-time shape (FwdConfig): the spec's tile sizes
// and features as constants, and the shared-memory layout that follows from
// them. Part of fwd_prefill.cuh.
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
  // kMaskLocal's window cut to the row's chunk of FwdParams::attention_chunk
  // keys: [floor(p / c) * c, floor(p / c) * c + c) for the row's diagonal key p.
  kMaskChunk = 3,
};

template <class Element_, int HEAD_DIM, int BLOCK_Q, int BLOCK_KV, int WARPS, int MASK, bool SOFTCAP, bool ALIBI,
          bool PADDED, bool VARLEN, bool PACK_GQA, int ROPE, int ROTARY_DIM, int ROPE_TABLES, bool KVCACHE,
          bool PAGED, bool SPLIT, int STAGES = 0, bool WGMMA = false, bool PERSISTENT = false,
          int UNALIGNED_DIM = 0, bool LEFTPAD = false, bool SINK = false, int HEAD_DIM_V = 0,
          bool ROPE_SCALED = false>
struct FwdConfig;

// The view of a FwdConfig's V tiles where V's head dim differs from Q's and
// K's (FwdConfig::kSplitDims): the same kernel with the row constants of
// V, so that V's copies, its ldmatrix addresses and the P V products take
// their widths from it while Q and K keep theirs.
template <class Cfg>
struct ValueTileConfig : Cfg {
  static constexpr int kHeadDim = Cfg::kHeadDimV;
  static constexpr int kColumns = Cfg::kHeadDimV;
  static constexpr int kChunksPerRow = Cfg::kHeadDimV / 8;
  static constexpr int kChunksUsed = Cfg::kHeadDimV / 8;
  static constexpr int kRowElems = Cfg::kRowElemsV;
  static constexpr int kRowBytes = Cfg::kRowElemsV * 2;
  static constexpr int kRowStride = Cfg::kWgmma ? 128 : kRowBytes;
};

template <bool VALUE_VIEW, class Cfg>
struct ValueTileOf {
  using type = Cfg;
};
template <class Cfg>
struct ValueTileOf<true, Cfg> {
  using type = ValueTileConfig<Cfg>;
};

template <class Element_, int HEAD_DIM, int BLOCK_Q, int BLOCK_KV, int WARPS, int MASK, bool SOFTCAP, bool ALIBI,
          bool PADDED, bool VARLEN, bool PACK_GQA, int ROPE, int ROTARY_DIM, int ROPE_TABLES, bool KVCACHE,
          bool PAGED, bool SPLIT, int STAGES, bool WGMMA, bool PERSISTENT, int UNALIGNED_DIM, bool LEFTPAD,
          bool SINK, int HEAD_DIM_V, bool ROPE_SCALED>
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
  // HEAD_DIM_V > 0 and below HEAD_DIM: V (and so O) has its own head dim,
  // as FlashAttention 3's hdim_v (DeepSeek's q/k 192 with v 128). V's tiles,
  // the O accumulators and the output rows take it (kSmemV, kOutTiles,
  // kOutChunks; V's copies and P V through ValueTile), while Q, K and S
  // keep HEAD_DIM: no work or shared memory on columns V does not have.
  // Dense or varlen K/V only (KernelSpec::validate).
  static constexpr int kHeadDimV = HEAD_DIM_V > 0 ? HEAD_DIM_V : HEAD_DIM;
  static constexpr bool kSplitDims = kHeadDimV != HEAD_DIM;
  static_assert(!kSplitDims || (kHeadDimV < HEAD_DIM && kHeadDimV % 32 == 0 && !KVCACHE && !SPLIT && !kUnaligned),
                "a value head dim: a multiple of 32 below HEAD_DIM, over dense or varlen K/V, not split");
  using ValueTile = typename ValueTileOf<kSplitDims, FwdConfig>::type;
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
  // The order in which persistent CTAs take causal tiles
  // (walk_persistent_tiles): query block major (every head's last block,
  // then every head's next to last, ...) evens out the CTAs' totals for any
  // block count, but a head's K/V is read again for each of its query
  // blocks after every other head's has passed through L2, so from DRAM
  // once the heads' K/V exceed L2. A 128-row tile does 128 flops per byte
  // of K/V (192-row: 192), less than the H200 computes per byte it reads
  // from DRAM: at d128, 32 x 512, that read 401 MB instead of 201 and took
  // 1.10x the time. So dense 128-row tiles go head by head, in the grid's
  // order (a head's query blocks run together and share its K/V in L2),
  // which the snake rounds balance as well for their power-of-two block
  // counts. 192-row tiles keep query block major (head by head measured up
  // to 1.22x slower), and so does varlen outside the sequence order below:
  // in the grid a sequence shorter than the longest leaves empty tiles at
  // fixed places in each head's run of blocks, and head by head handed a
  // step's decoding tiles to a quarter of the CTAs (2.5x the time;
  // docs/PERFORMANCE.md).
  static constexpr bool kHeadMajorTiles = MASK != kMaskCausal || (BLOCK_Q <= 128 && !VARLEN);
  // Causal varlen persistent kernels of up to 128 rows a tile, with at
  // most kOrderedSequences sequences and more than 512 keys in the longest,
  // walk their sequences' real tiles only (order_sequences,
  // walk_persistent_tiles): sequences by the weight of their heaviest tile
  // (keys × its 64-row halves), most first, and head by head within each,
  // as dense tiles go. Tiles past a sequence's rows are then not in the
  // order at all, so they cannot crowd a step's real tiles onto a few CTAs,
  // and a head's K/V stays in L2 while its query blocks run. The order is
  // built in shared memory at the kernel's start, in time quadratic in the
  // sequences (a rank per sequence), hence the limit; other calls keep the
  // order above. Up to 512 keys it measured 5% slower than that, with
  // packed GQA (H200, docs/PERFORMANCE.md).
  static constexpr bool kSequenceOrder = PERSISTENT && VARLEN && BLOCK_Q <= 128 && MASK == kMaskCausal;
  static constexpr int kOrderedSequences = 128;
  // Per sequence its weight and query blocks (by index), the sequences by
  // rank, and each rank's first tile (kOrderedSequences + 1 entries, padded
  // to 16 bytes); SequenceOrder in fwd_prefill.cuh.
  static constexpr int kSequenceOrderBytes = kSequenceOrder ? (4 * kOrderedSequences + 4) * 4 : 0;
  static constexpr int kOutputRecordBytes = 32;  // kProducerStoresOutput
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
  // 2-5% slower than 40 (H200, docs/PERFORMANCE.md). 176-key blocks (dense
  // keys by tensor copies only: KernelSpec::validate) hold 88 S and 64 O
  // accumulators and 44 words of P: with the 208 left beside an 88-register
  // producer they spilled 212 bytes and serialized the wgmma; that producer
  // only issues tensor copies, so it takes 24 and they 240.
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
                                            : BLOCK_KV > 128                    ? 24
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
  // barriers follow them, then the one of producer warps 1-3 that store
  // persistent outputs, within the hardware's 16.
  static constexpr int kProducerBarrier = 1;
  static constexpr int kTurnBarrier0 = 2 + 3;
  static constexpr int kStorerBarrier = kTurnBarrier0 + 3;
  static_assert(!WGMMA || (kConsumerGroups <= 3 && kStorerBarrier < 16), "named barriers 0-15");
  // The launch's registers per thread (65536 over the CTA, in steps of 8),
  // and what the MMA warpgroups can claim once the producer has given back.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kMmaRegisters =
      ((kConsumerGroups + 1) * kLaunchRegisters - kProducerRegisters) / (kConsumerGroups > 0 ? kConsumerGroups : 1) / 8 * 8;
  // Passes of the output copy in flight per storer (store_staged_tile):
  // the three-warpgroup producer's 32 registers hold one.
  static constexpr int kStorerUnroll = kProducerRegisters >= 72 ? 4 : 1;
  static constexpr bool kCausal = MASK == kMaskCausal;
  static constexpr bool kLocal = MASK == kMaskLocal || MASK == kMaskChunk;
  static constexpr bool kChunk = MASK == kMaskChunk;
  static constexpr bool kSoftcap = SOFTCAP;
  static constexpr bool kAlibi = ALIBI;
  // A learnable attention sink per query head (FwdParams::learnable_sink):
  // folded into each row's softmax sum where the final output is written
  // (fold_sink); split partials leave it to the combine.
  static constexpr bool kSink = SINK;
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
  // Angles from caller cos/sin tables whose entries are kRopeTableBytes
  // wide: 4 (f32) or 2 (the element type, as FlashAttention takes them);
  // ROPE_TABLES 0: from the frequencies.
  static constexpr int kRopeTableBytes = ROPE_TABLES;
  static constexpr bool kRopeTables = ROPE_TABLES != 0;
  // Angles from the frequencies, their cos and sin scaled by YaRN's or
  // LongRoPE's attention factor (rope.cuh, scale_angle): q's and k's rotated channels come out
  // FwdParams::rope_attention_factor times longer, as Hugging Face's.
  static constexpr bool kRopeScaled = ROPE_SCALED;
  static_assert(!ROPE_SCALED || (ROPE != 0 && ROPE_TABLES == 0), "scaled angles: RoPE from the frequencies");
  // Keys from a KV cache (per-sequence lengths, optional batch remapping;
  // the cached keys are already rotated, so RoPE rotates q only), in pages,
  // and split over several CTAs that write fp32 partial results.
  static constexpr bool kKVCache = KVCACHE;
  static constexpr bool kPaged = PAGED;
  // A contiguous cache whose sequences' keys start at kv_row_offset[b]
  // (cache_leftpad), not at row 0.
  static constexpr bool kLeftPad = LEFTPAD;
  static_assert(!LEFTPAD || (KVCACHE && !PAGED && !VARLEN), "leftpad: a contiguous KV cache's rows");
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
                                        !(WARPS == 12 && PERSISTENT && kLocal);
  // Tensor copies over a paged cache at head dims of whole 64-channel
  // panels (64-256, not padded) with three stages or more
  // (KernelSpec::interleaved_kv): a K/V stage holds each 8-row group of K's
  // panels, then of V's, in turn (kv_tile_bytes), so that one copy (a 5-D
  // box of a map that spans both tensors: paged_pair_map on the host) reads
  // a page's rows of K and V, and V lands with K (on "K ready"). Short pages
  // cost the copies' count, not their bytes: pages of 16 rows take 8 copies
  // a 128-key block instead of 16 (head dim 64: K's and V's boxes) or 32
  // (128, a box per panel). K's atoms come after V's where V lies lower in
  // memory (FwdParams::kv_value_first). A stage is refilled once both K and
  // V are handed back, a block later than K alone: with two stages that
  // left the next K late (head dim 128 over pages of 16: 1.35-1.45x the
  // time of separate copies), so two-stage kernels copy K and V apart, with
  // every panel of a page in one box (kInterleavedPanels: K's or V's 8-row
  // groups of each panel in turn), which took pages of 16 at head dim 128
  // from 1.20-1.35x a contiguous cache's time to 1.03-1.15x (H200,
  // docs/PERFORMANCE.md).
  static constexpr bool kWholePanelPages = PAGED && kTensorCopies && HEAD_DIM % 64 == 0 && !PADDED;
  static constexpr bool kInterleavedKV = kWholePanelPages && STAGES >= 3;
  static constexpr bool kInterleavedPanels = kWholePanelPages && STAGES < 3 && HEAD_DIM > 64;
  static constexpr int kKVPanels = (HEAD_DIM + 63) / 64;
  // 1 KB swizzle atoms from one 8-row group of a K or V stage to the next.
  static constexpr int kKVGroupAtoms = kInterleavedKV ? 2 * kKVPanels : kInterleavedPanels ? kKVPanels : 1;
  // Persistent: the MMA warps only stage a tile's output (in its Q buffer)
  // and go on to the next tile; producer warps 1-3 copy it to memory before
  // a later tile's Q is loaded into that buffer (produce_tiles), from a
  // record of the tile kept per Q buffer after the ring's barriers. Short
  // calls then ran 1-4% faster than with the MMA warps copying (H200,
  // docs/PERFORMANCE.md). Only where producer thread 0 alone issues the K/V
  // copies (tensor copies, K not rotated): warps 1-3 are idle there.
  static constexpr bool kProducerStoresOutput = PERSISTENT && kTensorCopies && !kRotateKeys;
  static constexpr int kOutputRecords = kProducerStoresOutput ? kQBuffers : 0;
  static constexpr int kOutputStorers = kProducerThreads - 32;  // producer warps 1-3
  // Pages shorter than this many rows are copied by cp.async: a page's box
  // must fill whole 1024-byte swizzle atoms of a 128-byte-swizzled panel.
  static constexpr int kMinTensorCopyPageShift = 3;
  // With the producer, the MMA warps rotate their own Q rows (while the
  // producer rotates the first K block) in pieces of this many words
  // (rotate_consecutive_rows): 4-byte pieces, whose runs of rows step two
  // pairs' angles instead of evaluating eight pairs' sin and cos for runs of
  // two rows. Q's rotation holds up each tile's first S = Q Kᵀ, and at
  // head_dim 64 it shares the special-function unit with the exponentials:
  // 4-byte pieces there took RoPE prefill from 1.32x to 1.28-1.29x the time
  // without RoPE at 32 x 512, and from 1.29-1.30x to 1.26-1.27x at 8 x 2048;
  // at head_dim 128 they measured 0.6-1.7% faster (H200, docs/PERFORMANCE.md).
  static constexpr int kQRotationWords = 1;
  // Scores rewritten before the softmax (to log2-domain logits) instead of
  // the scale being folded into the exponent.
  static constexpr bool kRewriteScores = SOFTCAP || ALIBI;

  static constexpr int kRowsPerWarp = BLOCK_Q / WARPS;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // 16-row MMA tiles per warp
  static constexpr int kScoreTiles = BLOCK_KV / 8;   // 8-column accumulator tiles of S
  static constexpr int kOutTiles = kHeadDimV / 8;    // 8-column accumulator tiles of O
  static constexpr int kOutChunks = kHeadDimV / 8;   // 16-byte chunks of an output row
  static constexpr int kChunksPerRow = HEAD_DIM / 8; // 16-byte chunks of data per row
  // Shared-memory rows hold whole 8-chunk swizzle groups (128 bytes), so head
  // dims such as 32 and 96 leave a few unused chunks per row.
  static constexpr int kRowElems = (HEAD_DIM + 63) / 64 * 64;
  static constexpr int kRowElemsV = (kHeadDimV + 63) / 64 * 64;  // V's rows (ValueTile)
  static constexpr int kRowBytes = kRowElems * 2;
  // Bytes from one row of a tile to the next (wgmma: within a panel).
  static constexpr int kRowStride = WGMMA ? 128 : kRowBytes;

  static constexpr int kSmemQ = BLOCK_Q * kRowElems;  // elements
  static constexpr int kSmemK = BLOCK_KV * kRowElems;
  static constexpr int kSmemV = BLOCK_KV * kRowElemsV;
  // The producer's ring: kQBuffers Q tiles, kStages K and V stages, then its
  // mbarriers (Ring: five per stage, and per Q buffer "Q landed", plus "Q
  // free" when there are two).
  static constexpr int kRingStages = kProducer ? kStages : 1;
  static constexpr int kTileBytes = (kQBuffers * kSmemQ + kRingStages * (kSmemK + kSmemV)) * 2;
  static constexpr int kQBarriers = kPersistent ? 4 : 1;
  // RoPE tables staged beside K (kStagedTables): the producer rotates K
  // block i with the cos and sin rows of its positions, which one tensor
  // copy per table brings into table slot i % kTableSlots (rows of
  // ROTARY_DIM / 2 entries, unswizzled: a warp's units read consecutive
  // bytes) instead of every thread loading them from L2 on its way to "K
  // ready". 16-bit tables at head dims 65-128, where those loads made them
  // 1.09-1.52x the time of angles from theta (at 64 they already match
  // it); f32 tables at 65-128 (H200, docs/PERFORMANCE.md). As many slots as
  // fit, up to kStages: 16-bit ones two beside two stages at 128 and one
  // beside a persistent kernel's second Q tile; f32 ones (twice the bytes)
  // one beside two stages and none in persistent kernels at 128 (the loads
  // from L2 then stay).
  static constexpr int kMaxSmemBytes = 232448;  // sm_90's 227 KB per block
  static constexpr bool kMayStageTables = WGMMA && kRotateKeys && ROPE_TABLES != 0 && HEAD_DIM > 64 &&
                                          HEAD_DIM <= 128 && UNALIGNED_DIM == 0;
  static constexpr int kTableRowBytes = ROTARY_DIM / 2 * ROPE_TABLES;
  static constexpr int kTableSlotBytes = kMayStageTables ? (2 * BLOCK_KV * kTableRowBytes + 1023) / 1024 * 1024 : 0;
  __host__ __device__ static constexpr int table_slots_that_fit() {
    for (int slots = kStages; slots > 0; --slots) {
      if (kTileBytes + slots * kTableSlotBytes + (5 * kStages + kQBarriers + slots) * 8 +
              kOutputRecords * kOutputRecordBytes + kSequenceOrderBytes <=
          kMaxSmemBytes) {
        return slots;
      }
    }
    return 0;
  }
  static constexpr int kTableSlots = kMayStageTables ? table_slots_that_fit() : 0;
  static constexpr bool kStagedTables = kTableSlots > 0;
  static constexpr int kTableOffset = kTileBytes;  // cos then sin of each slot
  static constexpr int kBarrierOffset = kTileBytes + kTableSlots * kTableSlotBytes;
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
  static constexpr int kProducerBarriers =
      kProducer ? 5 * kStages + kQBarriers + kTableSlots + 2 * kStagingSlots + kStagedRows : 0;
  // The producer's records of staged outputs (kProducerStoresOutput) follow
  // the barriers, then the sequence order (kSequenceOrder).
  static constexpr int kOutputRecordOffset = kBarrierOffset + kProducerBarriers * 8;
  static constexpr int kSequenceOrderOffset = kOutputRecordOffset + kOutputRecords * kOutputRecordBytes;
  static constexpr int kRingEnd = kSequenceOrderOffset + kSequenceOrderBytes;
  static constexpr int kStagingOffset = (kRingEnd + 15) / 16 * 16;
  static constexpr int kSmemBytes = kStagedRows ? kStagingOffset + kStagingSlots * kStagingSlotBytes : kRingEnd;
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

}  // namespace jitattn
