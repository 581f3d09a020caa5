// The kernel family and tiles of a call: the tuned or default tiles, the
// decode kernel for few query rows, the wgmma tiles (and persistent grids) on
// sm_90a, what the caller forced, and the fit into shared memory. Each rule
// cites the H200 measurement behind it (docs/PERFORMANCE.md).
#include "plan/internal.hpp"

#include "tune.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>

namespace jitattn::detail {
namespace {

// Waves of tiles up to which causal grids of head dims above 64 run
// persistent (plan_problem).
constexpr int64_t kPersistentMaxWaves = 12;

// Key blocks of wgmma calls without a mask or causal at head dim 128 from
// this many keys (choose_family).
constexpr int kWideBlockKeys = 176;
constexpr int64_t kWideBlockMinKeys = 8192;

// The decode kernel (templates/fwd_decode.cuh): chunks of 8 KB of K per warp
// (32 keys of 256-byte rows, head dims 96-128; 64 keys of 128-byte rows,
// head dims up to 64; fewer above 128 and for pages shorter than a chunk),
// four warps, and each warp's pipeline as deep as kDecodePipelineBytes allows
// (2-8 stages). Pages shorter than a chunk (KernelSpec::decode_reads_pages:
// from 8 rows, or single rows at head dims 32, 64, 128 and 256) keep the
// chunk, which then spans several pages (KernelSpec::page_rows):
// chunks cut to pages of 16 rows took up to 1.39x the time of a contiguous
// cache at head dim 64, and pages of 1-8 (then on the prefill tiles) up to
// 3.67x; spanning chunks take 1.00-1.12x at head dims 64-256. Measured on
// the H200 (docs/PERFORMANCE.md): per-chunk
// instructions, not bytes in flight, bound a warp, so larger chunks beat
// deeper pipelines (32-key chunks of 128-byte rows took up to 1.37x the
// time at head dim 32, batch 64, and 1.02x at 64). When the tiles alone fill
// every SM twice, two CTAs per SM overlap one CTA's start (Q and first
// chunks in flight) with another's stream, in a 96 KB pipeline: chunks of 16
// keys of 256-byte rows; for 128-byte rows two warps of 64-key chunks, and
// only up to kDecodeShareSmMaxKeys keys (with 4096-32768 keys they took
// 1.10-1.32x the time of one CTA of four warps at head dim 32, 0.99-1.03x
// at 64; with 1024 keys one CTA took 1.08-1.15x theirs).
constexpr int kDecodeChunkKeys = 32;
constexpr int kDecodeChunkBytes = kDecodeChunkKeys * 256;
constexpr int kDecodeMinChunkKeys = 16;
constexpr int kDecodeWarps = 4;
constexpr int kDecodePipelineBytes = 128 * 1024;
constexpr int kDecodeShareSmPipelineBytes = 96 * 1024;
constexpr int64_t kDecodeShareSmMaxKeys = 2048;
// Resident decode grids (decode_grid_resident): one-token grids of more
// tiles than SMs over short caches run every tile at once, unsplit, in CTAs
// of a smaller pipeline (4 KB chunks) that several fit an SM. In one wave of
// one CTA per SM the tiles past the SMs run as a second wave nearly alone,
// and splitting them measured slower than this at up to 8192 keys. The CTAs'
// pipeline is the largest of 64 KB (four warps, two stages), 48 KB (two
// warps, three) and 32 KB (two, two) whose bytes over all tiles stay within
// 12 MB: past that, SMs holding more tiles than others fell behind (batch 26
// in 64 KB CTAs: 13 MB, 0.75-0.92x; batch 36 in 48 KB ones: 13.5 MB,
// 0.72-0.78x), within it they kept pace. Measured on the H200 (one token,
// 32/8 heads; docs/PERFORMANCE.md), against the planner's tiles and splits
// before:
//   - d128, 64 KB, batch 17-24 (136-192 tiles): 1.09-1.32x the rate at 1024
//     keys, 1.04-1.14x at 4096, 1.00-1.06x at 8192; at 16384 0.98-1.01x, at
//     32768 0.96-0.98x: hence the 8192-key bound;
//   - d128, 48 KB, batch 25-32: 1.06-1.10x at 1024 keys, 1.00-1.10x at 4096,
//     1.00-1.04x at 8192; 32 KB, batch 36-45: 1.06-1.19x, 1.03-1.07x,
//     1.01-1.03x; batch 33 (264 tiles, two an SM before, evenly) level to
//     0.99x;
//   - d128, 64 KB where three tiles an SM are nearly even anyway (2.75-3 an
//     SM, batch 46-49): 1.05-1.16x at 1024 keys, 1.03-1.04x at 4096,
//     1.00-1.02x at 8192 (batch 44, 2.67 an SM, gained on one H200 and lost
//     up to 3.5% on another; 32 KB CTAs there ran as 64 KB ones at 46-48);
//   - d64 (32-key chunks of 128-byte rows): 64 KB, batch 17-24: 1.14-1.32x at
//     1024 keys, 1.11-1.16x at 4096, 1.02-1.14x at 8192; 48 KB, batch 28:
//     1.14x, 1.03x, 1.02x; 32 KB, batch 36: 1.33x, 1.13x, 1.11x. Batch 48 in
//     64 KB gained at 1024 keys only, so the nearly even band is d128's.
constexpr int64_t kDecodeResidentMaxKeys = 8192;
constexpr int64_t kDecodeResidentMaxBytesInFlight = 12 << 20;
constexpr double kDecodeResidentNearlyFullTilesPerSm = 2.75;
constexpr int kDecodeResidentChunkBytes = kDecodeChunkBytes / 2;
// Resident decode CTAs: their pipeline's bytes (0: not resident) and warps.
struct ResidentDecode {
  int pipeline_bytes = 0;
  int warps = 0;
};

// Bytes of a K or V row as the decode kernel copies it (head dims padded to
// 64 channels).
int decode_row_bytes(const KernelSpec& spec) {
  return (spec.head_dim + 63) / 64 * 64 * static_cast<int>(dtype_size(spec.dtype));
}

// The resident CTAs a decode grid of `tiles` CTAs (one per tile, before any
// split) of `rows` packed query rows over at most seqlen_k keys takes
// (pipeline_bytes 0: none). Only on sm_90 (the 12 MB and the bands are the
// H200's; other GPUs keep the tiles of before), for one tile row (one token
// of a group of up to 16), keys not split on the device (dynamic_splits),
// and CTAs of which every tile fits the SMs' shared memory at once.
ResidentDecode decode_grid_resident(const Arch& arch, int max_smem_bytes, int64_t tiles, int sm_count, int64_t rows,
                                    int row_bytes, int64_t seqlen_k, bool dynamic_splits) {
  if (arch.major != 9 || rows > 16 || dynamic_splits || seqlen_k > kDecodeResidentMaxKeys || row_bytes > 256) return {};
  const int64_t sms = std::max(1, sm_count);
  if (tiles <= sms) return {};  // one wave of one CTA an SM: the 128 KB pipelines
  auto fits = [&](const ResidentDecode& ctas) {
    // The pipeline and the Q tile's 16 rows (KernelSpec::smem_bytes).
    return tiles <= sms * ctas_per_sm_by_smem(ctas.pipeline_bytes + 16 * row_bytes, max_smem_bytes);
  };
  const ResidentDecode wide{64 * 1024, 4}, medium{48 * 1024, 2}, narrow{32 * 1024, 2};
  const double per_sm = static_cast<double>(tiles) / sms;
  if (row_bytes == 256 && per_sm >= kDecodeResidentNearlyFullTilesPerSm && fits(wide)) return wide;
  for (const ResidentDecode& ctas : {wide, medium, narrow}) {
    if (tiles * ctas.pipeline_bytes <= kDecodeResidentMaxBytesInFlight && fits(ctas)) return ctas;
  }
  return {};
}

// Fills the decode fields of `spec` (rows: packed query rows of the call;
// page_shift: log2 of the page size, -1 when not paged; tiles: CTAs before
// any split; seqlen_k: the longest sequence, or the cache's capacity;
// resident: decode_grid_resident's CTAs, if any), from `forced` where the
// caller set them.
void choose_decode_tiles(KernelSpec& spec, const TileConfig& forced, int64_t rows, int page_shift, int max_smem_bytes,
                         int64_t tiles, int sm_count, int64_t seqlen_k, const ResidentDecode& resident_ctas) {
  const bool resident = resident_ctas.pipeline_bytes > 0;
  spec.family = Family::decode;
  spec.pack_gqa = true;
  spec.block_q = forced.block_q != 0 ? forced.block_q : rows <= 16 ? 16 : 32;
  if (page_shift >= 0 && !KernelSpec::decode_reads_pages(spec.head_dim, int64_t{1} << page_shift)) {
    reject(fmt::format("options.tiles: the decode kernel (stages > 0 over a KV cache) reads pages of at least 8 "
                       "rows at head_dim {}; page_size is {}", spec.head_dim, 1 << page_shift));
  }
  const int row_bytes = decode_row_bytes(spec);
  const bool short_rows = row_bytes < kDecodeChunkBytes / kDecodeChunkKeys;
  const bool share_sm = !resident && tiles >= 2 * static_cast<int64_t>(sm_count) &&
                        (!short_rows || seqlen_k <= kDecodeShareSmMaxKeys);
  const int chunk_keys = resident   ? kDecodeResidentChunkBytes / row_bytes
                         : short_rows ? kDecodeChunkBytes / row_bytes
                         : share_sm   ? kDecodeChunkKeys / 2
                                      : kDecodeChunkKeys;
  spec.block_kv = forced.block_kv != 0 ? forced.block_kv : chunk_keys;
  spec.warps = forced.warps != 0 ? forced.warps
               : resident         ? resident_ctas.warps
               : share_sm && short_rows ? kDecodeWarps / 2
                                        : kDecodeWarps;
  const int room = max_smem_bytes - spec.block_q * row_bytes;
  auto stage_bytes = [&] { return spec.warps * 2 * spec.block_kv * row_bytes; };
  // Large head dims (192-256) leave no room for two stages of the chosen
  // chunks: smaller chunks first, then fewer warps. Forced values stay as
  // forced (a forced tile that does not fit is rejected by the caller).
  while (forced.block_kv == 0 && spec.block_kv > kDecodeMinChunkKeys && 2 * stage_bytes() > room) spec.block_kv /= 2;
  while (forced.warps == 0 && spec.warps > 1 && 2 * stage_bytes() > room) spec.warps /= 2;
  const int budget = std::min(resident   ? resident_ctas.pipeline_bytes
                              : share_sm ? kDecodeShareSmPipelineBytes
                                         : kDecodePipelineBytes,
                              room);
  spec.stages = forced.stages != 0 ? forced.stages : std::clamp(budget / stage_bytes(), 2, 8);
  // Pages shorter than the chunk: the chunk spans them.
  spec.page_rows = page_shift >= 0 && (1 << page_shift) < spec.block_kv ? 1 << page_shift : 0;
}
// Forced tiles that the selected kernel does not take are the caller's to
// fix: the spec validator's reason, named as options.tiles.
void validate_forced(const KernelSpec& spec, const ForwardOptions& options, const CallFacts& facts) {
  try {
    spec.validate();
  } catch (const Error& error) {
    // Tiles the caller forced that the selected kernel does not take (say
    // 128 query rows with stages over a KV cache, which select the decode
    // kernel): the validator's reason, under the option that set them.
    const bool forced = facts.tiles_forced || options.tiles.stages != 0 || options.tiles.wgmma;
    if (!forced) throw;
    throw Error(error.code(),
                fmt::format("options.tiles = {{block_q {}, block_kv {}, warps {}, stages {}{}}}: {}", options.tiles.block_q,
                            options.tiles.block_kv, options.tiles.warps, options.tiles.stages,
                            options.tiles.wgmma ? ", wgmma" : "", error.what()),
                error.spec());
  }
}

// Chosen (not forced) tiles shrink until they fit the arch's shared memory.
void fit_shared_memory(KernelSpec& spec, const CallFacts& facts, const Arch& arch, int max_smem_bytes) {
  // Chosen (not forced) tiles that do not fit, e.g. RoPE's second K buffer at
  // head_dim 256: smaller key blocks first, then smaller query blocks.
  while (!facts.tiles_forced && spec.family == Family::fwd && spec.smem_bytes() > static_cast<size_t>(max_smem_bytes) &&
         (spec.block_kv > 32 || spec.block_q > 64)) {
    if (spec.block_kv > 32) {
      spec.block_kv /= 2;
    } else {
      spec.block_q /= 2;
      spec.warps = std::min(spec.warps, spec.block_q / 16);
    }
  }
  if (spec.smem_bytes() > static_cast<size_t>(max_smem_bytes)) {
    throw Error(ErrorCode::unsupported,
                fmt::format("options.tiles: {} needs {} bytes of shared memory per block; {} allows {}",
                            spec.text(), spec.smem_bytes(), arch.text(), max_smem_bytes),
                spec.text());
  }
}

// Fills map.dims and map.strides_bytes for map.rank dimensions (extents
// innermost first; element_strides of dimensions 1 .. rank - 1). False where
// a tensor copy cannot step a dimension of more than one element: a stride
// that is not positive or reaches 2^40 bytes.
bool set_map_dims(TileMapLayout& map, const int64_t* extents, const int64_t* element_strides) {
  const int64_t element_bytes = static_cast<int64_t>(dtype_size(map.dtype));
  for (int d = 0; d < map.rank; ++d) map.dims[d] = static_cast<uint64_t>(extents[d]);
  for (int d = 1; d < map.rank; ++d) {
    const int64_t bytes = element_strides[d - 1] * element_bytes;
    if (extents[d] == 1) {
      // Never stepped: any valid stride (a multiple of 16 bytes) describes it.
      map.strides_bytes[d - 1] = 16;
    } else if (bytes <= 0 || bytes >= (int64_t{1} << 40)) {
      return false;
    } else {
      map.strides_bytes[d - 1] = static_cast<uint64_t>(bytes);  // a multiple of 16 (check_rows)
    }
  }
  return true;
}

// The rows one copy reads: a key block, or a page where pages are shorter.
int map_box_rows(const Problem& problem, int block_kv) {
  return problem.paged ? static_cast<int>(std::min<int64_t>(block_kv, int64_t{1} << problem.page_shift)) : block_kv;
}

}  // namespace

std::optional<TileMapLayout> kv_tile_map(const void* data, DType dtype, int64_t batch, int64_t rows, int64_t heads,
                                         int64_t head_dim, const int64_t (&strides)[3], int box_rows) {
  TileMapLayout map;
  map.base = data;
  map.dtype = dtype;
  const bool packed = batch == 0;
  map.rank = packed ? 3 : 4;
  // Dimensions innermost first: channels, rows, heads, batches.
  const int64_t extents[4] = {head_dim, rows, heads, packed ? 1 : batch};
  const int64_t element_strides[3] = {strides[1], strides[2], strides[0]};
  for (int d = 0; d < map.rank; ++d) {
    if (extents[d] == 0) return TileMapLayout{};  // no keys: nothing is ever copied
  }
  if (!set_map_dims(map, extents, element_strides)) return std::nullopt;
  map.box[0] = 64;
  map.box[1] = static_cast<uint32_t>(box_rows);
  map.box[2] = map.box[3] = 1;
  return map;
}

std::optional<TileMapLayout> paged_panel_map(const void* data, DType dtype, int64_t pages, int64_t page_rows,
                                             int64_t heads, int64_t head_dim, const int64_t (&strides)[3],
                                             int box_rows) {
  TileMapLayout map;
  constexpr int64_t kGroupRows = 8;  // rows of a 1024-byte swizzle atom
  if (pages == 0 || heads == 0 || page_rows < kGroupRows) return map;  // nothing copied by the map
  const int64_t page_stride = strides[0], row_stride = strides[1], head_stride = strides[2];
  const int64_t panels = head_dim / 64, groups = page_rows / kGroupRows;
  // Heads merge with the panels where each head's channels continue the
  // last head's, or with a page's 8-row groups where each head's rows
  // continue the last head's ([pages, heads, page_rows, head_dim]).
  const bool heads_with_panels = heads == 1 || head_stride == head_dim;
  const bool heads_with_groups = !heads_with_panels && head_stride == page_rows * row_stride;
  if (!heads_with_panels && !heads_with_groups) return std::nullopt;
  map.base = data;
  map.dtype = dtype;
  map.rank = 5;
  const int64_t extents[5] = {64, kGroupRows, heads_with_panels ? panels * heads : panels,
                              heads_with_groups ? groups * heads : groups, pages};
  const int64_t element_strides[4] = {row_stride, 64, kGroupRows * row_stride, page_stride};
  if (!set_map_dims(map, extents, element_strides)) return std::nullopt;
  map.box[0] = 64;
  map.box[1] = static_cast<uint32_t>(kGroupRows);
  map.box[2] = static_cast<uint32_t>(panels);
  map.box[3] = static_cast<uint32_t>(box_rows / kGroupRows);
  map.box[4] = 1;
  map.head_panels = heads_with_panels ? static_cast<int>(panels) : 0;
  map.head_groups = heads_with_groups ? static_cast<int>(groups) : 0;
  return map;
}

std::optional<TileMapLayout> paged_pair_map(const void* k, const void* v, DType dtype, int64_t pages,
                                            int64_t page_rows, int64_t heads, int64_t head_dim,
                                            const int64_t (&k_strides)[3], const int64_t (&v_strides)[3],
                                            int box_rows) {
  TileMapLayout map;
  constexpr int64_t kGroupRows = 8;  // rows of a 1024-byte swizzle atom
  constexpr int64_t kPanel = 64;     // channels of a 128-byte swizzled panel
  if (pages == 0 || heads == 0 || page_rows < kGroupRows) return map;  // nothing copied by the map
  if (!std::equal(k_strides, k_strides + 3, v_strides)) return std::nullopt;
  const auto k_address = reinterpret_cast<uintptr_t>(k), v_address = reinterpret_cast<uintptr_t>(v);
  const bool value_first = v_address < k_address;
  const uintptr_t distance = value_first ? k_address - v_address : v_address - k_address;
  // The K/V dimension is one more stride of the map: a positive multiple of
  // 16 bytes below 2^40 (set_map_dims checks the range).
  if (distance == 0 || distance % 16 != 0) return std::nullopt;
  const int64_t pair_stride = static_cast<int64_t>(distance / dtype_size(dtype));
  const int64_t page_stride = k_strides[0], row_stride = k_strides[1], head_stride = k_strides[2];
  const int64_t panels = head_dim / kPanel, groups = page_rows / kGroupRows;
  // Heads merge with the panels where each head's channels continue the
  // last head's ([pages, page_rows, heads, head_dim]: FlashAttention's and
  // vLLM's), with K/V where a head's K and V sit side by side and the next
  // head's follow ([pages, page_rows, heads, 2, head_dim]), or with a page's
  // 8-row groups where each head's rows continue the last head's ([pages,
  // heads, page_rows, head_dim]: FlashInfer's HND).
  const bool heads_with_panels = heads == 1 || head_stride == head_dim;
  const bool heads_with_pair = !heads_with_panels && head_stride == 2 * pair_stride;
  const bool heads_with_groups = !heads_with_panels && !heads_with_pair && head_stride == page_rows * row_stride;
  if (!heads_with_panels && !heads_with_pair && !heads_with_groups) return std::nullopt;
  // Pages merge with the groups too, where each page's rows (of every head,
  // heads outermost) continue the last page's: a map has five dimensions.
  const int64_t page_groups = groups * (heads_with_groups ? heads : 1);
  if (pages > 1 && page_stride != page_groups * kGroupRows * row_stride) return std::nullopt;
  if (pages * page_groups > INT_MAX) return std::nullopt;  // coordinates are 32-bit
  map.base = value_first ? v : k;
  map.dtype = dtype;
  map.rank = 5;
  const int64_t extents[5] = {kPanel, kGroupRows, heads_with_panels ? panels * heads : panels,
                              heads_with_pair ? 2 * heads : 2, pages * page_groups};
  const int64_t element_strides[4] = {row_stride, kPanel, pair_stride, kGroupRows * row_stride};
  if (!set_map_dims(map, extents, element_strides)) return std::nullopt;
  map.box[0] = static_cast<uint32_t>(kPanel);
  map.box[1] = static_cast<uint32_t>(kGroupRows);
  map.box[2] = static_cast<uint32_t>(panels);
  map.box[3] = 2;
  map.box[4] = static_cast<uint32_t>(box_rows / kGroupRows);
  map.head_panels = heads_with_panels ? static_cast<int>(panels) : 0;
  map.head_pair = heads_with_pair ? 2 : 0;
  map.head_groups = heads_with_groups ? static_cast<int>(groups) : 0;
  map.page_groups = static_cast<int>(page_groups);
  map.value_first = value_first;
  return map;
}

TileMapLayout rope_table_map(const void* data, DType dtype, int64_t positions, int64_t row_stride, int rotary_dim,
                             int block_kv) {
  TileMapLayout map;
  map.base = data;
  map.dtype = dtype;
  map.rank = 2;
  map.dims[0] = static_cast<uint64_t>(rotary_dim / 2);
  map.dims[1] = static_cast<uint64_t>(positions);
  map.strides_bytes[0] = static_cast<uint64_t>(row_stride) * dtype_size(dtype);
  map.box[0] = static_cast<uint32_t>(rotary_dim / 2);
  map.box[1] = static_cast<uint32_t>(block_kv);
  map.box[2] = map.box[3] = 1;
  map.swizzle_128b = false;
  return map;
}

std::optional<TileMapLayout> kv_map_of(const Problem& problem, const void* data, const int64_t (&strides)[3],
                                       int block_kv, bool values, bool interleaved_panels) {
  const int box_rows = map_box_rows(problem, block_kv);
  const int64_t head_dim = values ? problem.head_dim_v : problem.head_dim;
  if (interleaved_panels) {
    return paged_panel_map(data, problem.dtype, problem.kv_batches, problem.kv_rows, problem.heads_kv, head_dim,
                           strides, box_rows);
  }
  return kv_tile_map(data, problem.dtype, problem.kv_batches, problem.kv_rows, problem.heads_kv, head_dim, strides,
                     box_rows);
}

std::optional<KVMaps> kv_maps_of(const Problem& problem, int block_kv, KernelSpec::KVStages layout) {
  KVMaps maps;
  if (layout == KernelSpec::KVStages::interleaved_kv) {
    const auto pair =
        paged_pair_map(problem.k, problem.v, problem.dtype, problem.kv_batches, problem.kv_rows, problem.heads_kv,
                       problem.head_dim, problem.k_strides, problem.v_strides, map_box_rows(problem, block_kv));
    if (!pair) return std::nullopt;
    maps.k = *pair;  // maps.v stays rank 0: the kernel copies V with K
    return maps;
  }
  const bool interleaved_panels = layout == KernelSpec::KVStages::interleaved_panels;
  const auto k = kv_map_of(problem, problem.k, problem.k_strides, block_kv, false, interleaved_panels);
  const auto v = kv_map_of(problem, problem.v, problem.v_strides, block_kv, true, interleaved_panels);
  if (!k || !v) return std::nullopt;
  maps.k = *k;
  maps.v = *v;
  return maps;
}

TileConfig default_tiles(DType, int head_dim, bool causal, const Arch& arch, int seqlen_bucket) {
  // The winners of sweeps on the H200 (bf16 and f16): head dims 64 and 128 in
  // docs/measurements/2026-11-22-tile-sweep-v2.json, the others from `jitattn
  // tune` in docs/measurements/2026-11-22-tune-new-head-dims.txt. Four warps of
  // 32 query rows win where the accumulators fit (each K/V fragment read from
  // shared memory feeds two MMA row tiles); short causal problems prefer
  // smaller query blocks, which give the GPU more CTAs to balance.
  const bool short_causal = causal && seqlen_bucket <= 512;
  switch (head_dim) {
    case 32: return short_causal ? TileConfig{64, 64, 4} : TileConfig{128, 64, 4};
    case 64:
      if (short_causal) return {64, 64, 4};
      if (causal && seqlen_bucket <= 2048) return {128, 64, 4};
      return {128, 128, 4};
    case 96: return {128, 64, 4};
    case 128: return short_causal ? TileConfig{64, 64, 4} : TileConfig{128, 64, 4};
    case 192: return causal ? TileConfig{64, 64, 4} : TileConfig{128, 64, 8};
    default: {
      // head_dim 256: 128×128×8 needs 192 KB of shared memory (sm_90, sm_100);
      // sm_80/sm_87 hold 128 KB of it, and sm_86/89/120 only 99 KB.
      if (arch.major == 9 || arch.major == 10) return {128, 128, 8};
      if (arch.major == 8 && (arch.minor == 0 || arch.minor == 7)) return {128, 64, 8};
      return {64, 64, 4};
    }
  }
}

std::optional<TileConfig> wgmma_tiles(int head_dim, bool rope, const Arch& arch, bool paged) {
  if (arch.major != 9 || arch.minor != 0 || !arch.arch_specific) return std::nullopt;
  if (head_dim > 128) {
    // A 128-row Q tile and two stages of the longest key blocks that fit in
    // shared memory: 96 keys at 192 (192 KB), 80 at 256 (224 KB). Against
    // 64-key blocks (three stages at 192) they measured 4-14% faster at 192
    // and 0-6% at 256 (H200, docs/PERFORMANCE.md). RoPE takes the same. A
    // paged cache takes 64-key blocks, which tile its pages
    // (KernelSpec::validate): three stages at 192, two at 256.
    if (paged) return TileConfig{128, 64, 8, head_dim == 192 ? 3 : 2, true};
    return TileConfig{128, head_dim == 192 ? 96 : 80, 8, 2, true};
  }
  // Without RoPE at head dims up to 64: 192-row tiles, three MMA warpgroups.
  // Measured on the H200 (docs/PERFORMANCE.md) against 128 rows: 1.10-1.13×
  // at head_dim 64 causal from N 2048, 1.00-1.07× without a mask (0.99× at
  // 1024), 1.16-1.30× at head_dim 32 from N 2048. With RoPE they won only 2-4% from 8k keys (the producer,
  // left 32 registers, rotates no faster while the MMA warps take more
  // issue slots) and lost 5-25% below 4k, so RoPE keeps 128 rows.
  if (head_dim <= 64 && !rope) return TileConfig{192, 128, 12, 4, true};
  // Four stages at head_dim ≤ 64; two at 96-128 (two 64 KB stages of 128
  // keys). Measured on the H200 (docs/PERFORMANCE.md). Three at 128 over a
  // paged cache, whose stages then take a page's K and V in one copy
  // (KernelSpec::interleaved_kv): pages of 8-16 rows 7-22% faster than two
  // stages of K and V copied apart, pages of 64 level (H200, same file).
  const int stages = head_dim > 64 ? (paged && head_dim == 128 ? 3 : 2) : 4;
  return TileConfig{128, 128, 8, stages, true};
}

void apply_tiles(KernelSpec& spec, const TileConfig& tiles) {
  spec.block_q = tiles.block_q;
  spec.block_kv = tiles.block_kv;
  spec.warps = tiles.warps;
  spec.stages = tiles.stages;
  spec.wgmma = tiles.wgmma;
  spec.persistent = tiles.persistent;
}

std::vector<TileConfig> default_tile_set(DType dtype, int head_dim, bool causal, const Arch& arch) {
  std::vector<TileConfig> set;
  for (int bucket = 512; bucket <= 16384; bucket *= 2) {
    const TileConfig t = default_tiles(dtype, head_dim, causal, arch, bucket);
    const bool seen = std::any_of(set.begin(), set.end(), [&](const TileConfig& s) {
      return s.block_q == t.block_q && s.block_kv == t.block_kv && s.warps == t.warps;
    });
    if (!seen) set.push_back(t);
  }
  if (const auto wgmma = wgmma_tiles(head_dim, /*rope=*/false, arch)) {
    set.push_back(*wgmma);
    TileConfig persistent = *wgmma;
    persistent.persistent = true;
    if (head_dim <= 128) set.push_back(persistent);
    if (head_dim == 128) {  // long calls (choose_family)
      TileConfig wide = *wgmma;
      wide.block_kv = kWideBlockKeys;
      set.push_back(wide);
    }
  }
  return set;
}

namespace {

// Short sliding windows on sm_90a (a local mask whose rows see at most
// kShortWindowKeys keys, as gpt-oss's 128-key sliding layers), without
// RoPE: a tile sees a few key blocks however long the call, as a short
// call's tiles do, and 64-row tiles of 64-key blocks on 4 warps measured
// fastest at head dims up to 64. H200, bench/probe_window_kernels.py
// (docs/PERFORMANCE.md), window 128, causal, 64/8 heads at head dim 64:
// prefill 0.84-0.87x the time of the planner's former 192-row wgmma tiles
// (0.72-0.77x forced 128-row ones); 16 and 64 speculative tokens over a
// 32k-key cache 0.56-0.94x, and ahead of 64x128 and 128x64 4-warp tiles
// but for one shape (8 x 16 tokens: 64x128 4% faster). At head dim 128
// (32/8 heads) the wgmma tiles stayed 3-5% ahead on prefill and 64x64 tiles
// were up to 2.4x slower over a cache, so it keeps its tiles. The decode
// kernel keeps calls of up to 32 packed rows.
constexpr int64_t kShortWindowKeys = 256;
bool short_window(const CallFacts& facts, const Arch& arch) {
  const bool hopper = arch.major == 9 && arch.minor == 0 && arch.arch_specific;
  return hopper && facts.local && facts.window_span > 0 && facts.window_span <= kShortWindowKeys &&
         !facts.has_rope && !facts.unaligned && facts.kernel_dim <= 64;
}

// The tuned or default tiles, what the caller forced, and the feature
// flags of the spec, GQA packing included. Returns the tiles.
TileConfig base_spec(KernelSpec& spec, const Problem& problem, const ForwardOptions& options, const CallFacts& facts,
                     const Arch& arch, const TuningTable* tuning, bool varlen) {
  const int64_t batch = problem.batch, seqlen_q = problem.seqlen_q, seqlen_k = problem.seqlen_k;
  const int64_t head_dim = problem.head_dim;
  const int kernel_dim = facts.kernel_dim;
  const bool has_rope = facts.has_rope, unaligned = facts.unaligned;
  const bool causal = facts.causal, local = facts.local, masked_like_causal = facts.masked_like_causal;
  const int64_t group = facts.group;
  const RopeOptions& rope = options.rope;
  const int bucket = seqlen_bucket(seqlen_q, seqlen_k);
  std::optional<TileConfig> tuned;
  if (tuning != nullptr) tuned = tuning->lookup({arch, problem.dtype, kernel_dim, masked_like_causal, bucket});
  TileConfig tiles = tuned ? *tuned : default_tiles(problem.dtype, kernel_dim, masked_like_causal, arch, bucket);
  if (!tuned && short_window(facts, arch)) tiles = {64, 64, 4};
  if (options.tiles.stages != 0) {
    if (options.tiles.stages < 0) reject(fmt::format("options.tiles.stages={} must be >= 0", options.tiles.stages));
    if (problem.kvcache && !options.tiles.wgmma && options.pack_gqa == false) {
      reject("options.pack_gqa=false: the decode kernel (options.tiles.stages > 0) always packs a KV head's query heads");
    }
  }
  // Tiles the caller fixed (block sizes or warps, facts.tiles_forced): the
  // planner then leaves them, and the defaults below, alone.
  if (options.tiles.block_q != 0) tiles.block_q = options.tiles.block_q;
  if (options.tiles.block_kv != 0) tiles.block_kv = options.tiles.block_kv;
  if (options.tiles.warps != 0) tiles.warps = options.tiles.warps;
  // With a KV cache, tiles.stages selects the decode kernel, unless wgmma
  // asks for the producer layout.
  const bool producer_stages = !problem.kvcache || options.tiles.wgmma;
  if (producer_stages && options.tiles.stages != 0) tiles.stages = options.tiles.stages;
  spec.dtype = problem.dtype;
  spec.head_dim = kernel_dim;
  spec.block_q = tiles.block_q;
  spec.block_kv = tiles.block_kv;
  spec.warps = tiles.warps;
  if (producer_stages) spec.stages = tiles.stages;
  if (options.tiles.wgmma) {
    if (options.tiles.stages == 0) reject("options.tiles.wgmma needs options.tiles.stages > 0 (the producer layout)");
    if (arch.major != 9 || !arch.arch_specific) reject(fmt::format("options.tiles.wgmma needs sm_90a, not {}", arch.text()));
    spec.wgmma = true;
  }
  if (options.tiles.persistent) {
    if (!options.tiles.wgmma) reject("options.tiles.persistent needs options.tiles.wgmma (the wgmma tiles walk a CTA's tiles)");
    spec.persistent = true;
  }
  if (options.sm_limit < 0) reject(fmt::format("options.sm_limit={} must be >= 0 (0 = every SM)", options.sm_limit));
  spec.causal = causal;
  spec.local = local;
  spec.chunk = facts.chunk > 0;
  spec.softcap = options.softcap > 0.f;
  spec.alibi = options.alibi_slopes != nullptr;
  spec.sink = options.learnable_sink != nullptr;
  spec.head_dim_v = facts.value_dim;
  // Head dims that are not a multiple of 8 (KernelSpec::unaligned_dim):
  // element-wise rows in the 4-warp kernels, or on sm_90a the wgmma tiles of
  // two warpgroups, whose producer copies aligned blocks and shifts them
  // (chosen below); never persistent or three warpgroups.
  spec.unaligned_dim = unaligned ? static_cast<int>(head_dim) : 0;
  spec.padded = kernel_dim != head_dim && !unaligned;
  if (unaligned && options.tiles.stages != 0 && (!options.tiles.wgmma || options.tiles.persistent)) {
    reject(fmt::format("options.tiles.stages={}: head_dim={} (not a multiple of 8) runs on the 4-warp kernels, or "
                       "with stages on ordinary-grid wgmma tiles (options.tiles.wgmma, not persistent)",
                       options.tiles.stages, head_dim));
  }
  if (unaligned && options.tiles.stages == 0) {
    // Not a tuned producer layout of the mma.sync kernels either (the wgmma
    // tiles are chosen below).
    spec.stages = 0;
    tiles.stages = 0;
  }
  spec.varlen = varlen;
  if (has_rope) {
    spec.rope = rope.style == RopeStyle::rotate_half ? RopeKind::half : RopeKind::interleaved;
    spec.rotary_dim = facts.rotary_dim;
    spec.rope_tables = rope.cos != nullptr;
    spec.rope_tables16 = spec.rope_tables && rope.cos->dtype != DType::f32;
    spec.rope_scaled = facts.rope_attention_factor != 1.f;
  }
  // Packing a KV head's query heads into one tile pays when query sequences
  // are shorter than a tile (decoding, short chunks): fewer, fuller tiles,
  // each reading the group's K/V once. Longer sequences fill their tiles
  // anyway, and packing would only add per-row addressing.
  // Varlen calls judge by their average sequence (total_q / batch): a batch
  // of decoding steps and a prefill chunk has a long longest sequence but
  // mostly one-row ones, whose K/V unpacked tiles would read once per query
  // head (15 one-query sequences over 8192 keys beside a 512-query chunk,
  // d128, 32/8 heads: packed 0.185 ms, unpacked 0.457; batches of 1-4
  // sequences of 1024-4096 queries unpacked 1.13-1.30x faster; H200,
  // docs/PERFORMANCE.md).
  const int64_t typical_q = varlen ? (problem.total_q + std::max<int64_t>(batch, 1) - 1) / std::max<int64_t>(batch, 1)
                                   : seqlen_q;
  const int64_t unpacked_tiles = group * ((typical_q + tiles.block_q - 1) / tiles.block_q);
  const int64_t packed_tiles = (typical_q * group + tiles.block_q - 1) / tiles.block_q;
  const bool pack_pays = typical_q < tiles.block_q && packed_tiles < unpacked_tiles;
  spec.pack_gqa = group > 1 && options.pack_gqa.value_or(pack_pays);
  if (problem.kvcache) {
    spec.kvcache = true;
    spec.paged = problem.paged;
    spec.leftpad = problem.kv_row_offset != nullptr;
  }
  return tiles;
}

// The kernel family and its tiles: the decode kernel for few query rows,
// 64-row tiles for short packed rows that may split, the wgmma tiles (and
// persistent grids) on sm_90a where they measured faster.
void choose_family(KernelSpec& spec, TileConfig& tiles, KernelChoice& choice, const Problem& problem,
                   const ForwardOptions& options, const CallFacts& facts, const Arch& arch, int max_smem_bytes) {
  const int64_t batch = problem.batch, seqlen_q = problem.seqlen_q, seqlen_k = problem.seqlen_k;
  const int64_t heads_q = problem.heads_q, heads_kv = problem.heads_kv;
  const int kernel_dim = facts.kernel_dim;
  const bool has_rope = facts.has_rope, unaligned = facts.unaligned, tiles_forced = facts.tiles_forced;
  const bool causal = facts.causal, masked_like_causal = facts.masked_like_causal;
  const int64_t group = facts.group;
  const bool short_windowed = short_window(facts, arch);  // 64x64 4-warp tiles (base_spec)
  // A sequence's rows as the kernels tile them: every query of each head of
  // a KV head's group when packed (the decode kernel always packs).
  auto packed_rows = [&] { return detail::packed_rows(problem, spec); };
  // Calls that may split over their keys (a KV cache, or a dense or varlen
  // call given a workspace) are sized by splits rather than tiles.
  const bool may_split = problem.may_split && facts.value_dim == 0;  // splits: plan_splits
  // The decode kernel takes calls of at most 32 packed query rows (16 above
  // head dim 128): over a KV cache (pages of at least a chunk), or dense K/V
  // (packed or not) without RoPE (it does not rotate keys) when the planner
  // chooses. Varlen calls count their longest sequence.
  const bool few_rows = !tiles_forced && options.pack_gqa.value_or(true) &&
                        seqlen_q * group <= (kernel_dim > 128 ? 16 : 32);
  const bool cache_decode =
      problem.kvcache && ((options.tiles.stages != 0 && !options.tiles.wgmma) ||
                          (few_rows && (!problem.paged || KernelSpec::decode_reads_pages(
                                                              kernel_dim, int64_t{1} << problem.page_shift))));
  // (Not with V's own head dim: the decode kernel's V and its merge are
  // head_dim wide.)
  const bool dense_decode =
      !problem.kvcache && few_rows && options.tiles.stages == 0 && !has_rope && !unaligned && facts.value_dim == 0;
  if (cache_decode || dense_decode) {
    const int64_t decode_tiles = batch * heads_kv * ((seqlen_q * group + 31) / 32);
    // Resident tiles are the planner's choice only (forced tiles keep the
    // split rules of their own occupancy), and for batches that run unsplit:
    // a batch the caller told is uneven splits its longest sequences
    // (uneven_splits), on the tiles that rule was measured with.
    const TileConfig& forced = options.tiles;
    const bool nothing_forced = !tiles_forced && forced.stages == 0;
    const bool uneven = problem.seqlen_k_hinted && uneven_splits(decode_tiles, batch, problem.sm_count, seqlen_k,
                                                                 problem.total_seqlen_k) > 1;
    const ResidentDecode resident =
        nothing_forced && !uneven
            ? decode_grid_resident(arch, max_smem_bytes, decode_tiles, problem.sm_count, seqlen_q * group,
                                   decode_row_bytes(spec), seqlen_k, problem.dynamic_splits)
            : ResidentDecode{};
    choice.resident_decode = resident.pipeline_bytes > 0;
    choose_decode_tiles(spec, forced, seqlen_q * group, problem.paged ? problem.page_shift : -1, max_smem_bytes,
                        decode_tiles, problem.sm_count, seqlen_k, resident);
    tiles = {spec.block_q, spec.block_kv, spec.warps, spec.stages};
  } else if (may_split && !tiles_forced && options.tiles.stages == 0 && !unaligned && packed_rows() <= 64) {
    // Longer packed tiles (speculative decoding, chunked prefill, short
    // dense queries) where the wgmma tiles below do not take them (before
    // sm_90a, short caches, pages of fewer than 8 rows): one 64-row tile of
    // four warps; the key loop is memory-bound. Measured on the H200
    // (docs/PERFORMANCE.md). 128-key blocks keep more bytes in flight; a
    // paged cache keeps them only when a block fits in one page (smaller
    // pages take the per-row copy, which costs more than the larger block
    // gains).
    const int block_kv =
        short_windowed || (problem.paged && (int64_t{1} << problem.page_shift) < 128) ? 64 : 128;
    tiles = {64, block_kv, 4};
    spec.block_q = 64;
    spec.block_kv = block_kv;
    spec.warps = 4;
    spec.stages = 0;
  }
  // sm_90a: the wgmma family (FwdConfig::kWgmma, wgmma_tiles): a producer
  // warpgroup copies (and, for RoPE, rotates) K/V into a ring of stages
  // while two (three at head dims up to 64 without RoPE) warpgroups of MMA
  // warps compute 64 query rows each with wgmma, taking turns at the tensor
  // cores. Measured on the H200 (docs/PERFORMANCE.md) it beats the mma.sync
  // kernels by up to 1.5× once its tiles fill the GPU and each CTA walks
  // enough keys: without RoPE at least 256 on average (a causal CTA sees
  // half the keys; windows are counted like causal), 512 at head dim 32
  // (256 measured 4% slower there, persistent; 512 up to 31% faster);
  // shorter calls keep the mma.sync tiles, which start faster. With RoPE it
  // wins at nearly every length (the mma.sync kernels rotate K on their MMA
  // warps); below 256 keys per CTA at head_dim 64 the mma.sync producer
  // layout (256-row tiles, so each K block is rotated once per 256 query
  // rows) is kept, as it measured 3-9% faster before the turns (from 256
  // keys the persistent wgmma tiles are 16-36% faster now). The tuner's table
  // (mma.sync tiles only) does not override either.
  constexpr int64_t kMinCtas = 128;
  auto ctas_of = [&](int64_t rows) {
    return batch * (spec.pack_gqa ? heads_kv * ((seqlen_q * group + rows - 1) / rows)
                                       : heads_q * ((seqlen_q + rows - 1) / rows));
  };
  const int64_t keys_per_cta = masked_like_causal ? seqlen_k / 2 : seqlen_k;
  const bool long_keys = keys_per_cta >= (kernel_dim <= 32 ? 512 : 256);
  const bool hopper = arch.major == 9 && arch.minor == 0 && arch.arch_specific;
  // A KV cache with more packed query rows than the decode kernel takes
  // (speculative decoding, chunked prefill) gets the wgmma tiles where its
  // keys are long enough and tensor maps can describe the cache, however few
  // the tiles: splits fill the GPU (the heuristic below). So does a dense
  // call that may split (a workspace was given). The exception is
  // up to 64 packed rows over a contiguous cache whose 64-row mma.sync tiles
  // fill every SM twice (two of those CTAs fit an SM, one wgmma CTA does).
  // Measured on the H200 against the 64-row tiles (docs/PERFORMANCE.md):
  // 16 query tokens x 4 heads at head dim 128, batch 1: 0.92x at 1k keys,
  // 1.06-1.07x from 4k; batch 16: 1.03-1.30x; batch 64: 0.87-1.02x, and
  // 0.82-0.86x at head dim 64 (so those keep mma.sync); pages of 16 or 64:
  // 1.05-1.43x at every batch; 8 tokens at head dim 256 (above the decode
  // kernel's 16 rows): 1.55-2.05x. Beyond 64 rows the wgmma tiles used to
  // need 128 CTAs without splitting; with splits, batch 1 runs 1.2-2.1x
  // faster.
  // Its keys are rotated already, so RoPE rotates only q there. Its tiles
  // are the dense ones (192 rows at head dims up to 64 without RoPE, where
  // they do not pad much more than 128: level with 128 rows on a contiguous
  // cache, 4-13% faster with pages of 16; with RoPE 192 rows were not
  // measured over a cache, so 128; above head_dim 128 a paged cache takes
  // 64-key blocks, which tile its pages) (H200, docs/PERFORMANCE.md).
  const bool short_rows_keep_mma_sync = !problem.paged && packed_rows() <= 64 &&
                                        ctas_of(64) >= 2 * static_cast<int64_t>(problem.sm_count);
  const bool cache_prefill = problem.kvcache && spec.family == Family::fwd && !short_rows_keep_mma_sync;
  const bool choose = !tiles_forced && options.tiles.stages == 0 && spec.family == Family::fwd &&
                      (!problem.kvcache || cache_prefill) && hopper && !unaligned && !short_windowed;
  std::optional<TileConfig> wgmma;
  if (!unaligned) wgmma = wgmma_tiles(kernel_dim, has_rope, arch, problem.paged);
  // V of 128 channels or fewer beside q/k of 192 (DeepSeek's prefill): V's
  // stages are a third smaller, so 128-key blocks fit two stages. Measured
  // on the H200 against 96 (bench_value_dim.py, 16 heads, 16384 tokens,
  // docs/PERFORMANCE.md): 0.94-0.97x the time at 1024-16384 keys, causal
  // and not. Dense keys without RoPE only: with varlen's producer the
  // 128-key kernels spilled (52 bytes with a window and sinks; ptxas, NVRTC
  // 13.0), and RoPE's producer there was not measured.
  if (wgmma && kernel_dim == 192 && facts.value_dim != 0 && facts.value_dim <= 128 && !has_rope && !spec.varlen &&
      !problem.kvcache) {
    *wgmma = TileConfig{128, 128, 8, 2, true};
  }
  // wgmma kernels read K and V by tensor copies (KernelSpec::tensor_copies)
  // unless their producer rotates K (RoPE without a KV cache) at head dims
  // up to 128; views a tensor map cannot describe keep the mma.sync
  // kernels. A paged cache's copies read a block, or a page where pages are
  // shorter (one copy per page: no per-row table lookups, so small pages
  // cost little; at head dims of whole panels one copy takes K's and V's
  // rows of the page, KernelSpec::interleaved_kv, whose one map of both
  // needs them alike in strides, dense pages, and the heads side by side in
  // a row, K and V side by side per head, or a page's rows apart; with two
  // stages one copy takes every panel of K's or V's rows,
  // KernelSpec::interleaved_panels, whose maps need the heads side by side
  // or a page's rows apart).
  const int64_t page_rows = problem.paged ? int64_t{1} << problem.page_shift : 0;
  if (wgmma && wgmma->block_q == 192) {
    // 192-row tiles pay where a sequence's (packed) rows fill them. Where
    // they would pad it to over 1.25× the rows 128-row tiles pad it to (at
    // most 128 rows, or 193-256: a 256-query chunk's second 192-row tile is
    // two-thirds empty), 128 rows are faster: 0.79× the time for 256
    // queries over 4096 keys. At 1.125× (512, 1024 queries) 192 rows still
    // measured 1-10% faster (H200, docs/PERFORMANCE.md).
    auto padded = [&](int64_t tile) { return (packed_rows() + tile - 1) / tile * tile; };
    if (padded(192) * 4 > padded(128) * 5) *wgmma = TileConfig{128, 128, 8, 4, true};
  }
  auto kv_stages = [&](const TileConfig& t) {
    return KernelSpec::kv_stages_of(problem.paged, kernel_dim, spec.padded, t.stages);
  };
  auto maps_fit = [&](const TileConfig& t) { return kv_maps_of(problem, t.block_kv, kv_stages(t)).has_value(); };
  bool maps_possible = wgmma && maps_fit(*wgmma);
  // A paged K and V that no one map spans (one tensor for both, other
  // strides, gaps between pages, K/V distance out of range): two stages,
  // whose copies read K and V apart (per panel at head dim 64, every panel
  // of a page in one box above), before the mma.sync kernel.
  if (wgmma && !maps_possible && kv_stages(*wgmma) == KernelSpec::KVStages::interleaved_kv) {
    TileConfig apart = *wgmma;
    apart.stages = 2;
    if (maps_fit(apart)) {
      *wgmma = apart;
      maps_possible = true;
    }
  }
  // Pages shorter than this (not whole 1024-byte swizzle atoms; the
  // kernel's FwdConfig::kMinTensorCopyPageShift) would be copied a row at a
  // time (cp.async, a table lookup per row): they keep the mma.sync kernel.
  constexpr int64_t kMinTensorCopyPageRows = 8;
  if (problem.paged && page_rows < kMinTensorCopyPageRows) wgmma.reset();
  // (The producer layout writes no partial results: a forced split count
  // keeps the tiles that do.)
  const bool split_forced = problem.may_split && problem.num_splits > 1;
  const bool rope_producer =
      has_rope && !problem.kvcache && kernel_dim == 64 && !long_keys && ctas_of(256) >= kMinCtas && !split_forced;
  // Unaligned head dims on sm_90a: 128-row wgmma tiles of two warpgroups
  // (the producer shifts rows into them: FwdConfig::kStagedRows), under the
  // rules of the aligned ones; 64-key blocks above head dim 64, where 128
  // with the staging slots would not fit in shared memory.
  const bool unaligned_wgmma = !tiles_forced && options.tiles.stages == 0 && !problem.kvcache && hopper &&
                               unaligned && kernel_dim <= 128 && (has_rope || long_keys) && ctas_of(128) >= kMinCtas;
  if (unaligned_wgmma) {
    tiles = {128, kernel_dim <= 64 ? 128 : 64, 8, 2, true};
    apply_tiles(spec, tiles);
  } else if (choose && rope_producer) {
    tiles = {256, 64, 8, 3};
    apply_tiles(spec, tiles);
  } else if (choose && wgmma &&
             (problem.kvcache ? long_keys && maps_possible
                              : (has_rope && (kernel_dim <= 128 || maps_possible)) || (long_keys && maps_possible)) &&
             (problem.kvcache || ctas_of(wgmma->block_q) >= kMinCtas ||
              (may_split && long_keys && maps_possible && !short_rows_keep_mma_sync))) {
    tiles = *wgmma;
    apply_tiles(spec, tiles);
    // Persistent (FwdConfig::kPersistent) where it measured faster on the
    // H200 than the same tiles in an ordinary grid (docs/PERFORMANCE.md,
    // bench/bench_persistent.py), with more tiles than SMs:
    //   - causal at head dims up to 64 up to 8192 keys: 0.72-0.99 of the
    //     ordinary grid's time (the last wave evened out, the next tile's
    //     loads under the current epilogue), RoPE included; level at 16k;
    //   - causal at larger head dims up to 4096 keys: 0.74-0.95, RoPE
    //     0.70-0.95 (full grids of 512-4096 keys too, since their 128-row
    //     tiles go head by head, FwdConfig::kHeadMajorTiles; heaviest first
    //     across every head read each head's K/V from DRAM once per query
    //     block, and full grids from 1k keys measured 0.98-1.11); 8k keys
    //     0.98-1.07. Varlen calls walk their sequences' real tiles in the
    //     same order where they have at most KernelSpec::kOrderedSequences
    //     sequences (FwdConfig::kSequenceOrder), and take the same rule up
    //     to 2048 keys (4 x 4096, 32 query heads over 8, measured 2% slower
    //     than the ordinary grid);
    //     with more, their tiles keep the heaviest-first order (head by head
    //     in the grid would crowd a step's decoding tiles onto a few CTAs),
    //     and the rule it measured: at most kPersistentMaxWaves waves of
    //     tiles (counted over the longest sequence), or up to 512 keys;
    //   - without a causal mask, head dims up to 64 up to 4096 keys
    //     (0.80-0.98; 0.99-1.06 beyond), larger ones up to 1024 keys
    //     (0.84-0.95 with full grids, 1.01-1.03 at batch 2 × 1024; from 4k
    //     keys up to 1.06).
    // Three warpgroups with packed GQA would spill (test_compile).
    //   - RoPE tables that the ordinary kernel stages beside K and the
    //     persistent one has no room for (f32 rows at head dim 128), causal:
    //     up to 2048 keys in at most kPersistentMaxWaves waves. Without the
    //     staging, persistent grids took 0.77-0.97 of the time up to 2048
    //     keys but 1.10-1.21 at 32 × 512 and 2 × 4096.
    const bool spills = spec.warps == 12 && spec.pack_gqa;
    const int64_t tile_count = ctas_of(tiles.block_q);
    const bool small_head = kernel_dim <= 64;
    const bool in_waves = tile_count <= kPersistentMaxWaves * problem.sm_count;
    KernelSpec persistent_spec = spec;
    persistent_spec.persistent = true;
    const bool loses_staged_tables = spec.rope_table_slots() > 0 && persistent_spec.rope_table_slots() == 0;
    const bool ordered = persistent_spec.sequence_order_bytes() > 0 && problem.batch <= KernelSpec::kOrderedSequences &&
                         seqlen_k > 512 && seqlen_k <= 2048;
    const bool causal_pays = small_head            ? seqlen_k <= 8192
                             : loses_staged_tables ? seqlen_k <= 2048 && in_waves
                                                   : seqlen_k <= 4096 && (!spec.varlen || ordered || in_waves ||
                                                                          seqlen_k <= 512);
    // Chunked causal calls (attention_chunk with causal, dense keys) are
    // causal attention over sequences of a chunk's keys: above head dim 64
    // they take the causal rule on the chunk. Measured on the H200 at head
    // dim 128 (bench_chunk.py, 40/8 heads, docs/PERFORMANCE.md): chunks of
    // 2048 persistent 0.93-0.98x the ordinary grid's time, chunks of 8192
    // 1.01-1.05x. (176-key blocks: 1.10-1.13x at 2048, 1.00-1.01x at 8192,
    // so chunked calls keep 128.) Head dims up to 64 were not measured.
    const bool chunked_causal = facts.chunk > 0 && facts.right == 0 && !spec.varlen && !small_head && !has_rope;
    const bool pays = chunked_causal ? std::min<int64_t>(seqlen_k, facts.chunk) <= 4096
                      : causal       ? causal_pays
                                     : seqlen_k <= (small_head ? 4096 : 1024);
    // A split count the caller forced (split_forced) takes the ordinary
    // grid: persistent grids write no partial results.
    spec.persistent = !spills && !problem.kvcache && !split_forced && kernel_dim <= 128 && pays &&
                      tile_count > problem.sm_count;
    // Long calls at head dim 128, without a mask or causal, take 176-key
    // blocks (as FlashAttention 3 does without a mask): a block's fixed
    // costs (barriers, turns, row maxima across the quad, O rescaled) then
    // cover 1.375x the keys. Measured on the H200 against 128
    // (docs/PERFORMANCE.md), 16 heads: without a mask 8192 keys 1.01-1.05x,
    // 16384 1.03x; causal 1.01x and 1.02x; at 4096, where the last block is
    // a third empty (and causal calls run persistent), 0.97-1.00x, so
    // shorter calls keep 128. Windows were not measured. Dense keys only
    // (KernelSpec::validate).
    if (!spec.persistent && kernel_dim == 128 && !has_rope && !facts.local && !spec.varlen && !problem.kvcache &&
        seqlen_k >= kWideBlockMinKeys) {
      tiles.block_kv = kWideBlockKeys;
      spec.block_kv = kWideBlockKeys;
    }
  }
}

}  // namespace

KernelChoice choose_kernel(KernelSpec& spec, const Problem& problem, const ForwardOptions& options,
                           const CallFacts& facts, const Arch& arch, int max_smem_bytes, const TuningTable* tuning,
                           bool varlen) {
  KernelChoice choice;
  TileConfig tiles = base_spec(spec, problem, options, facts, arch, tuning, varlen);
  choose_family(spec, tiles, choice, problem, options, facts, arch, max_smem_bytes);
  validate_forced(spec, options, facts);
  fit_shared_memory(spec, facts, arch, max_smem_bytes);
  return choice;
}

}  // namespace jitattn::detail
