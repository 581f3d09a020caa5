// KernelSpec: everything baked into a generated kernel, with a canonical text
// form (what logs, the CLI and cache metadata show) and a stable hash.
// Arch: the compile target (sm_80, sm_90a, ...).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <jitattn/jitattn.hpp>

namespace jitattn::detail {

// fwd: attention forward (prefill). combine: merges attention states (split-KV
// partials, merge_states); its spec is combine.<state dtype>.<out dtype> and
// uses only `dtype` (the states') and `out_dtype`.
// append: writes new keys (rotated with RoPE) and values into a KV cache; its
// spec is append.<dtype>[.rope_half_rN|.rope_interleaved_rN][.rope_scaled|.rope_tables|.rope_tables16][.paged]
// and uses dtype, rope, rotary_dim, rope_scaled, rope_tables(16) and paged.
// decode: flash decoding for calls with few (packed) query rows
// (templates/fwd_decode.cuh): block_q is the rows of its tile (16 or 32),
// block_kv the keys of one warp's chunk, `stages` each warp's pipeline depth;
// its text is decode.<dtype>.dN.brN.bcN.wN.sN[flags], and pack_gqa is
// implied (always set, never printed), as is kvcache unless the flag
// `dense` says the keys are a dense call's K/V (kvcache false). `varlen`
// packs its queries (dense keys too; a paged cache keeps its pages).
enum class Family : uint8_t { fwd = 0, combine = 1, append = 2, decode = 3 };

// RoPE pairing (templates/rope.cuh): rotate-half (GPT-NeoX, Llama) pairs
// channel p with p + rotary_dim / 2; interleaved (GPT-J) pairs 2p with 2p + 1.
enum class RopeKind : uint8_t { none = 0, half = 1, interleaved = 2 };

struct KernelSpec {
  Family family = Family::fwd;
  DType dtype = DType::bf16;
  int head_dim = 128;
  int block_q = 128;
  int block_kv = 64;
  int warps = 4;
  bool causal = false;   // keys after the bottom-right-aligned diagonal are masked
  bool local = false;    // sliding window (runtime bounds); excludes causal, which it subsumes
  bool softcap = false;  // cap · tanh(scores / cap)
  bool alibi = false;    // −slope · |distance| score bias
  bool padded = false;   // the caller's head dim is below head_dim (zero-padded in the kernel)
  bool varlen = false;   // packed queries (and keys, unless paged) located through cu_seqlens
  bool pack_gqa = false; // the query heads of a KV head share each tile
  RopeKind rope = RopeKind::none;  // RoPE applied to q and k in the kernel
  int rotary_dim = 0;              // channels rotated (a multiple of 16), with rope
  bool rope_tables = false;        // angles from caller cos/sin tables, not from frequencies
  // With rope_tables: the tables hold dtype (16-bit) entries, as
  // FlashAttention's rotary_cos / rotary_sin; else f32. Text .rope_tables16.
  bool rope_tables16 = false;
  bool kvcache = false;  // keys from a KV cache: per-sequence lengths, keys already rotated
  bool paged = false;    // the KV cache is paged (block table)
  // A contiguous KV cache whose sequences' keys start at cache_leftpad[b]
  // (FwdParams::kv_row_offset; text .leftpad after kvcache): the kernels
  // without it never read the pads.
  bool leftpad = false;
  bool split = false;    // split-KV: writes fp32 partial results for the combine kernel
  // decode with split: each sequence's split count chosen on the device from
  // the lengths (KVCacheArgs::dynamic_splits); text .dynsplit. combine: the
  // combine of such a decode, which skips the (row, head) pairs whose tile
  // was one piece: the decode kernel wrote their output and marked them
  // (kStateWrittenMark, combine_params.h).
  bool dynamic_splits = false;
  DType out_dtype = DType::f32;    // combine: the output's dtype (fwd writes `dtype`)
  // decode: cp.async stages per warp. fwd: 0, or the stages of the K/V
  // ring a producer warpgroup fills (and rotates, for RoPE) for 8 MMA warps
  // (text .sN after wN; sm_90a moves the producer's registers to the MMA
  // warps).
  int stages = 0;
  // fwd with stages, sm_90a only: the MMA warpgroups compute with wgmma, 64
  // query rows each (text .wgmma after .sN; FwdConfig::kWgmma).
  bool wgmma = false;
  // fwd with wgmma: a persistent grid of at most one CTA per SM walks the
  // tiles, the producer loading a CTA's next tile during the current one
  // (two Q buffers; text .persistent after .wgmma; FwdConfig::kPersistent).
  // The grid is then FwdParams' tile count capped by the host, not the tiles.
  bool persistent = false;
  // fwd: the caller's head dim where it is not a multiple of 8 (0 otherwise;
  // text .unaligned_dN last). Its rows start on any 2-byte boundary, so the
  // kernel reads and writes them element by element and zero-pads the tiles
  // up to head_dim, the next generated size (FwdConfig::kUnaligned). Only the
  // 4-warp mma.sync kernels without a KV cache take it.
  int unaligned_dim = 0;
  // combine: states and output read and written element by element (text
  // .elementwise): head dims that are not a multiple of 8, or rows that do
  // not start on 16-byte boundaries. Otherwise 16-byte vectors.
  bool elementwise = false;
  // fwd, decode with local: the window is also cut to the row's chunk of
  // FwdParams::attention_chunk keys (FlashAttention 3's attention_chunk;
  // text .chunk after .local; template mask kMaskChunk). Last in the struct
  // so that aggregate initializers of the fields above keep their meaning.
  bool chunk = false;
  // fwd, decode, combine: each query head has a learnable attention sink
  // (FwdParams::learnable_sink, FlashAttention's learnable_sink): a softmax
  // column of that logit and no value, folded in where the final output is
  // written (text .sink after .alibi; combine: .sink last). A split's
  // partials leave it to their combine, which then has the flag.
  bool sink = false;
  // fwd: V's (and so the output's) head dim where it differs from q's and
  // k's (FlashAttention 3's hdim_v, e.g. DeepSeek's 192 with 128): one of
  // the generated head dims, below head_dim (text .dvN last;
  // FwdConfig::kSplitDims). 0: V has head_dim. Dense or varlen K/V, not
  // split.
  int head_dim_v = 0;
  // fwd, decode, append with rope from the frequencies (not tables): cos and
  // sin are scaled by FwdParams::rope_attention_factor (YaRN's or LongRoPE's
  // attention factor other than 1; text .rope_scaled after the rope field;
  // FwdConfig::kRopeScaled). Last for the aggregate initializers' sake.
  bool rope_scaled = false;
  // decode with paged: pages of exactly this many rows, fewer than a chunk
  // (block_kv), so each warp's chunk spans block_kv / page_rows pages and
  // every copy pass of the warp lies in one of them (text .pagedN in place
  // of .paged; DecodeConfig::kPageRows). 0: pages of at least a chunk, of
  // any power-of-two size (FwdParams::page_shift). Last for the aggregate
  // initializers' sake.
  int page_rows = 0;

  // V's and the output's head dim in the kernel.
  int value_dim() const { return head_dim_v != 0 ? head_dim_v : head_dim; }

  // Whether the decode kernel reads pages of page_rows rows at this
  // (generated) head dim: pages of whole 512-byte copy passes (32 lanes of
  // 16 bytes; 8 rows hold them at every head dim), or passes of whole rows
  // (head dims 32, 64, 128, 256, down to single-row pages). The rule of
  // page_rows, and the planner's for sending paged calls to the decode
  // kernel.
  static bool decode_reads_pages(int head_dim, int64_t page_rows);

  // A combine spec: states of `state_dtype` merged into an `out_dtype` output.
  static KernelSpec combine(DType state_dtype, DType out_dtype, bool elementwise = false, bool dynamic_splits = false,
                            bool sink = false);
  // An append spec (RoPE and paging as in the attention call it serves).
  static KernelSpec append(DType dtype, RopeKind rope, int rotary_dim, bool rope_tables, bool rope_tables16, bool paged,
                           bool rope_scaled);
  // The template's ROPE_TABLES: bytes of a table entry (0 without tables).
  int rope_table_bytes() const { return !rope_tables ? 0 : rope_tables16 ? 2 : 4; }

  // e.g. "fwd.bf16.d128.br128.bc64.w4.causal" (flags appear only when set, in
  // the order wgmma, persistent, causal|local, chunk, softcap, alibi, sink, rope_half_rN|rope_interleaved_rN,
  // rope_scaled|rope_tables|rope_tables16, packgqa, kvcache|dense, leftpad, paged|pagedN, split, dynsplit, padded, varlen, unaligned_dN,
  // dvN),
  // "combine.f32.bf16"
  // (".elementwise", then ".dynsplit", then ".sink", where set).
  std::string text() const;
  // Inverse of text(); throws Error(invalid_argument) naming the bad field.
  static KernelSpec parse(std::string_view text);
  // Throws Error(unsupported/invalid_argument) if this build cannot generate it.
  void validate() const;
  // XXH3-64 of text(): stable across runs, hosts and builds.
  uint64_t hash() const;

  // fwd with wgmma, unless its producer rotates K (RoPE without a KV
  // cache) at head dims up to 128: K and V blocks arrive by tensor copies
  // whose maps the launch encodes (FwdConfig::kTensorCopies,
  // ForwardPlan::k_map; varlen: 3-D maps over the packed rows; paged: over
  // the pages, a box per page shorter than a block, K's and V's rows in it
  // where interleaved_kv(), every panel where interleaved_panels()), except
  // in the one
  // variant where they would spill, and for unaligned rows (staged by the
  // producer instead).
  bool tensor_copies() const {
    return family == Family::fwd && wgmma && (rope == RopeKind::none || kvcache || head_dim > 128) &&
           unaligned_dim == 0 && !(warps == 12 && persistent && local);
  }

  // How tensor_copies() over a paged cache lay out K/V stages, from the
  // head dim (whole 64-channel panels: 64, 128, 192, 256; not padded) and
  // the stage count:
  //   - interleaved_kv (three stages or more): each 8-row group of K's
  //     panels, then of V's, in turn, so one tensor copy reads a page's rows
  //     of both (FwdConfig::kInterleavedKV), through one map that spans both
  //     tensors (paged_pair_map: K and V need the same strides). Pages of 16
  //     rows then cost 8 copies a 128-key block instead of 16 (head dim 64)
  //     or 32 (128);
  //   - interleaved_panels (two stages, head dims of two or more panels: a
  //     stage's K and V refilled apart): each 8-row group of every panel in
  //     turn, so each copy reads every panel of K's or V's rows of a page
  //     (FwdConfig::kInterleavedPanels; paged_panel_map);
  //   - apart: one panel after another, a copy per panel (4-D maps).
  enum class KVStages { apart, interleaved_panels, interleaved_kv };
  KVStages kv_stages() const {
    return tensor_copies() ? kv_stages_of(paged, head_dim, padded, stages) : KVStages::apart;
  }
  bool interleaved_kv() const { return kv_stages() == KVStages::interleaved_kv; }
  bool interleaved_panels() const { return kv_stages() == KVStages::interleaved_panels; }
  // The same rule for planners that have not chosen the kernel yet.
  static KVStages kv_stages_of(bool paged, int head_dim, bool padded, int stages) {
    if (!paged || head_dim % 64 != 0 || padded) return KVStages::apart;
    if (stages >= 3) return KVStages::interleaved_kv;
    return head_dim > 64 ? KVStages::interleaved_panels : KVStages::apart;
  }

  // Persistent fwd whose producer issues K/V by tensor copies and does not
  // rotate K: its warps 1-3 copy out each tile's output, which the MMA warps
  // stage in the tile's Q buffer (FwdConfig::kProducerStoresOutput), with a
  // 32-byte record per Q buffer after the ring's barriers.
  bool producer_stores_output() const {
    return persistent && tensor_copies() && !(rope != RopeKind::none && !kvcache);
  }

  // fwd with wgmma whose producer rotates K with tables at head dims 65-128:
  // the table slots beside the ring, as many as fit in sm_90's 227 KB up to
  // `stages` (0: none fit, the tables are read from L2). Each holds a key
  // block's cos and sin rows, staged by tensor copies
  // (FwdConfig::kStagedTables, FwdParams::rope_cos_map).
  int rope_table_slots() const;
  size_t rope_table_slot_bytes() const;

  // Causal varlen persistent fwd with tiles of up to 128 rows: its tiles are
  // walked in an order of at most kOrderedSequences sequences, built in
  // shared memory after the ring (FwdConfig::kSequenceOrder); calls with
  // more sequences walk the grid's order.
  static constexpr int kOrderedSequences = 128;
  size_t sequence_order_bytes() const;

  int threads() const;
  // fp32 accumulators per thread (output + scores): what decides whether a
  // configuration fits in 255 registers.
  int accumulator_registers() const;
  size_t smem_bytes() const;

  // Packs every field into one word: the hot-path lookup key (no strings).
  // Fields a family does not use are left out, so they never split its keys.
  uint64_t packed() const;
  bool operator==(const KernelSpec& other) const { return packed() == other.packed(); }
  bool operator!=(const KernelSpec& other) const { return !(*this == other); }

 private:
  // fwd with stages: the Q tile(s), the ring of K/V stages and their barriers.
  size_t producer_ring_bytes() const;
  template <class Fail>
  void validate_decode(const Fail& fail) const;
  template <class Fail>
  void check_varlen_cache(const Fail& fail) const;
  template <class Fail>
  void check_leftpad(const Fail& fail) const;
};

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);

// A compile target. arch_specific is the "a" suffix (sm_90a): features such as
// wgmma that exist only on that exact architecture.
struct Arch {
  int major = 8;
  int minor = 0;
  bool arch_specific = false;

  std::string text() const;  // "sm_90a"
  static Arch parse(std::string_view text);
  // The target jitattn compiles for on a device of this compute capability.
  static Arch for_device(int major, int minor);
  int number() const { return major * 10 + minor; }
  bool operator==(const Arch& o) const {
    return major == o.major && minor == o.minor && arch_specific == o.arch_specific;
  }
};

}  // namespace jitattn::detail
