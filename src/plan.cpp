#include "plan.hpp"

#include "tune.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

namespace jitattn::detail {
namespace {

[[noreturn]] void reject(const std::string& message) { throw Error(ErrorCode::invalid_argument, message); }

std::string shape_text(const TensorView& t) {
  std::string text = "[";
  for (int i = 0; i < t.ndim; ++i) text += fmt::format("{}{}", i ? ", " : "", t.shape[i]);
  return text + "]";
}

// The generated head dims; any other head dim runs on the next one up,
// zero-padded inside the kernel (the caller's tensors are not copied). Head
// dims that are not a multiple of 8 take the 4-warp kernels' element-wise
// copies (KernelSpec::unaligned_dim).
constexpr int kKernelHeadDims[] = {32, 64, 96, 128, 192, 256};

int kernel_head_dim(int64_t head_dim) {
  if (head_dim < 1) reject(fmt::format("q: head_dim={} must be at least 1", head_dim));
  for (int dim : kKernelHeadDims) {
    if (head_dim <= dim) return dim;
  }
  throw Error(ErrorCode::unsupported, fmt::format("q: head_dim={} is above the largest supported, 256", head_dim));
}

// The alibi_slopes tensor: f32 [heads_q] or [batch, heads_q]; returns the
// batch stride (0 when the slopes are per head).
long long check_alibi(const TensorView& slopes, int64_t batch, int64_t heads) {
  if (slopes.dtype != DType::f32) reject(fmt::format("alibi_slopes: dtype {} must be f32", dtype_name(slopes.dtype)));
  const bool per_head = slopes.ndim == 1 && slopes.shape[0] == heads;
  const bool per_batch_head = slopes.ndim == 2 && slopes.shape[0] == batch && slopes.shape[1] == heads;
  if (!per_head && !per_batch_head) {
    reject(fmt::format("alibi_slopes: shape {} must be [heads_q] = [{}] or [batch, heads_q] = [{}, {}]", shape_text(slopes),
                       heads, batch, heads));
  }
  if (slopes.strides[slopes.ndim - 1] != 1) reject("alibi_slopes: the heads dimension must be contiguous (stride 1)");
  if (slopes.data == nullptr) reject("alibi_slopes: data is null");
  if (reinterpret_cast<uintptr_t>(slopes.data) % 4 != 0) reject("alibi_slopes: data pointer must be 4-byte aligned");
  return per_batch_head ? slopes.strides[0] : 0;
}

// A 16-bit tensor of rows: dense [batch, seqlen, heads, head_dim] (4-D) or
// packed varlen [total, heads, head_dim] (3-D). Where head_dim is a multiple
// of 8, cp.async reads the rows in 16-byte chunks, so they must be 16-byte
// aligned. Other head dims (`any_head_dim`: forward and forward_varlen) are
// read element by element, from any 2-byte boundary.
void check_rows(const char* name, const TensorView& t, int ndim, bool any_head_dim = false) {
  const char* layout = ndim == 4 ? "[batch, seqlen, heads, head_dim]" : "[total_q, heads, head_dim]";
  if (t.ndim != ndim) reject(fmt::format("{}: must have {} dimensions {}, got {}", name, ndim, layout, t.ndim));
  if (t.dtype != DType::f16 && t.dtype != DType::bf16) {
    reject(fmt::format("{}: dtype {} is not f16 or bf16", name, dtype_name(t.dtype)));
  }
  const char* const names4[] = {"batch", "seqlen", "heads", "head_dim"};
  const char* const names3[] = {"total", "heads", "head_dim"};
  const char* const* names = ndim == 4 ? names4 : names3;
  for (int axis = 0; axis < ndim; ++axis) {
    if (t.shape[axis] < 0) reject(fmt::format("{}: {}={} is negative", name, names[axis], t.shape[axis]));
    if (t.shape[axis] > INT_MAX) reject(fmt::format("{}: {}={} exceeds 2^31-1", name, names[axis], t.shape[axis]));
  }
  if (t.shape[ndim - 2] == 0) reject(fmt::format("{}: heads must be >= 1", name));
  if (t.strides[ndim - 1] != 1) {
    reject(fmt::format("{}: head_dim stride is {}; the last dimension must be contiguous (stride 1)", name, t.strides[ndim - 1]));
  }
  const int64_t head_dim = t.shape[ndim - 1];
  const bool unaligned = head_dim % 8 != 0;
  if (unaligned && !any_head_dim) {
    reject(fmt::format("{}: head_dim={} must be a multiple of 8 for KV-cache calls and paged caches (forward and "
                       "forward_varlen over K/V tensors take any head_dim up to 256)", name, head_dim));
  }
  for (int axis = 0; axis < ndim - 1 && !unaligned; ++axis) {
    if (t.strides[axis] % 8 != 0) {
      reject(fmt::format("{}: {} stride {} must be a multiple of 8 elements (16-byte aligned rows)", name, names[axis],
                         t.strides[axis]));
    }
  }
  bool empty = false;
  for (int axis = 0; axis < ndim; ++axis) empty = empty || (axis != ndim - 2 && t.shape[axis] == 0);
  if (t.data == nullptr && !empty) reject(fmt::format("{}: data is null", name));
  if (reinterpret_cast<uintptr_t>(t.data) % (unaligned ? 2 : 16) != 0) {
    reject(fmt::format("{}: data pointer must be {}-byte aligned{}", name, unaligned ? 2 : 16,
                       unaligned ? "" : " (head_dim a multiple of 8)"));
  }
}

// An i32 vector in device memory of `length` elements (cu_seqlens, seqused_k).
void check_i32_vector(const char* name, const TensorView& t, int64_t length, const char* meaning) {
  if (t.dtype != DType::i32) reject(fmt::format("{}: dtype {} must be i32", name, dtype_name(t.dtype)));
  if (t.ndim != 1 || t.shape[0] != length) {
    reject(fmt::format("{}: shape {} must be [{}] = [{}]", name, shape_text(t), meaning, length));
  }
  if (t.strides[0] != 1) reject(fmt::format("{}: must be contiguous (stride 1)", name));
  if (t.data == nullptr || reinterpret_cast<uintptr_t>(t.data) % 4 != 0) {
    reject(fmt::format("{}: data pointer must be non-null and 4-byte aligned", name));
  }
}

void check_lse_alignment(const TensorView& lse, int64_t elements) {
  if (lse.data == nullptr && elements > 0) reject("lse: data is null");
  if (reinterpret_cast<uintptr_t>(lse.data) % 4 != 0) reject("lse: data pointer must be 4-byte aligned");
}

void check_lse(const TensorView& lse, int64_t batch, int64_t heads, int64_t seqlen_q) {
  if (lse.ndim != 3) reject(fmt::format("lse: must have 3 dimensions [batch, heads_q, seqlen_q], got {}", lse.ndim));
  if (lse.dtype != DType::f32) reject(fmt::format("lse: dtype {} must be f32", dtype_name(lse.dtype)));
  if (lse.shape[0] != batch || lse.shape[1] != heads || lse.shape[2] != seqlen_q) {
    reject(fmt::format("lse: shape {} must be [batch, heads_q, seqlen_q] = [{}, {}, {}]", shape_text(lse), batch, heads, seqlen_q));
  }
  check_lse_alignment(lse, batch * heads * seqlen_q);
}

// CTAs per SM assumed for decoding tiles (128 threads of 130-190 registers
// and 48-80 KB of shared memory: two or three per SM).
constexpr int kDecodeCtasPerSm = 3;
constexpr int kMaxSplits = 128;
// Shared memory of one SM on sm_90 (the CTAs it holds at once; each CTA also
// takes 1 KB of the driver's).
constexpr size_t kSmemPerSm = 228 * 1024;
// Waves of tiles up to which causal grids of head dims above 64 run
// persistent (plan_problem).
constexpr int64_t kPersistentMaxWaves = 12;

// The decode kernel (templates/fwd_decode.cuh): chunks of 8 KB of K per warp
// (32 keys of 256-byte rows, head dims 96-128; 64 keys of 128-byte rows,
// head dims up to 64; fewer above 128 and for pages shorter than a chunk),
// four warps, and each warp's pipeline as deep as kDecodePipelineBytes allows
// (2-8 stages). Chunks never straddle pages, so paged caches need pages of
// at least a chunk. Measured on the H200 (docs/PERFORMANCE.md): per-chunk
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
// Splits of the decode kernel are counted in blocks of at least this many
// keys: splits of one 64-key step (16-key chunks above head dim 128, pages
// of 16) took 1.08x the time of splits of two (head dim 256, one sequence of
// 1024 keys: 16 splits 0.73 TB/s, 8 splits 0.79; H200, docs/PERFORMANCE.md).
constexpr int kMinSplitKeys = 128;

// Fills the decode fields of `spec` (rows: packed query rows of the call;
// page_shift: log2 of the page size, -1 when not paged; tiles: CTAs before
// any split; seqlen_k: the longest sequence, or the cache's capacity), from
// `forced` where the caller set them.
void choose_decode_tiles(KernelSpec& spec, const TileConfig& forced, int64_t rows, int page_shift, int max_smem_bytes,
                         int64_t tiles, int sm_count, int64_t seqlen_k) {
  spec.family = Family::decode;
  spec.pack_gqa = true;
  spec.block_q = forced.block_q != 0 ? forced.block_q : rows <= 16 ? 16 : 32;
  const int smallest_chunk = forced.block_kv != 0 ? forced.block_kv : kDecodeMinChunkKeys;
  if (page_shift >= 0 && (1 << page_shift) < smallest_chunk) {
    reject(fmt::format("options.tiles: decode chunks of bc={} keys need pages of at least that many rows; "
                       "page_size is {}", smallest_chunk, 1 << page_shift));
  }
  const int row_bytes = (spec.head_dim + 63) / 64 * 64 * static_cast<int>(dtype_size(spec.dtype));
  const bool short_rows = row_bytes < kDecodeChunkBytes / kDecodeChunkKeys;
  const bool share_sm =
      tiles >= 2 * static_cast<int64_t>(sm_count) && (!short_rows || seqlen_k <= kDecodeShareSmMaxKeys);
  const int chunk_keys = short_rows ? kDecodeChunkBytes / row_bytes
                         : share_sm ? kDecodeChunkKeys / 2
                                    : kDecodeChunkKeys;
  spec.block_kv = forced.block_kv != 0 ? forced.block_kv
                 : page_shift >= 0    ? std::min(chunk_keys, 1 << page_shift)
                                      : chunk_keys;
  spec.warps = forced.warps != 0 ? forced.warps : share_sm && short_rows ? kDecodeWarps / 2 : kDecodeWarps;
  const int room = max_smem_bytes - spec.block_q * row_bytes;
  auto stage_bytes = [&] { return spec.warps * 2 * spec.block_kv * row_bytes; };
  // Large head dims (192-256) leave no room for two stages of the chosen
  // chunks: smaller chunks first, then fewer warps. Forced values stay as
  // forced (a forced tile that does not fit is rejected by the caller).
  while (forced.block_kv == 0 && spec.block_kv > kDecodeMinChunkKeys && 2 * stage_bytes() > room) spec.block_kv /= 2;
  while (forced.warps == 0 && spec.warps > 1 && 2 * stage_bytes() > room) spec.warps /= 2;
  const int budget = std::min(share_sm ? kDecodeShareSmPipelineBytes : kDecodePipelineBytes, room);
  spec.stages = forced.stages != 0 ? forced.stages : std::clamp(budget / stage_bytes(), 2, 8);
}

// RoPE options that need no tensor shapes beyond head_dim; returns rotary_dim.
int check_rope_scalars(const RopeOptions& rope, int64_t head_dim) {
  const int rotary_dim = rope.rotary_dim == 0 ? static_cast<int>(head_dim) : rope.rotary_dim;
  if (rope.style != RopeStyle::rotate_half && rope.style != RopeStyle::interleaved) {
    reject(fmt::format("options.rope.style={} is not none, rotate_half or interleaved", static_cast<int>(rope.style)));
  }
  if (rotary_dim < 16 || rotary_dim > head_dim || rotary_dim % 16 != 0) {
    reject(fmt::format("options.rope.rotary_dim={} (0 = head_dim = {}) must be a multiple of 16 between 16 and head_dim",
                       rope.rotary_dim, head_dim));
  }
  if ((rope.cos == nullptr) != (rope.sin == nullptr)) reject("options.rope: cos and sin tables come together (one is null)");
  if (rope.cos != nullptr) return rotary_dim;
  if (!(rope.theta > 0.f) || !std::isfinite(rope.theta)) {
    reject(fmt::format("options.rope.theta={} must be positive and finite", rope.theta));
  }
  if (!(rope.linear_scaling > 0.f) || !std::isfinite(rope.linear_scaling)) {
    reject(fmt::format("options.rope.linear_scaling={} must be positive and finite (1 = off)", rope.linear_scaling));
  }
  if (rope.llama3_factor != 0.f) {
    if (!(rope.llama3_factor > 0.f) || !std::isfinite(rope.llama3_factor)) {
      reject(fmt::format("options.rope.llama3_factor={} must be positive and finite (0 = off)", rope.llama3_factor));
    }
    if (!(rope.llama3_low_freq_factor > 0.f) || !(rope.llama3_high_freq_factor > rope.llama3_low_freq_factor)) {
      reject(fmt::format("options.rope: llama3 frequency factors low={} high={} need 0 < low < high",
                         rope.llama3_low_freq_factor, rope.llama3_high_freq_factor));
    }
    if (rope.llama3_original_max_position <= 0) {
      reject(fmt::format("options.rope.llama3_original_max_position={} must be positive",
                         rope.llama3_original_max_position));
    }
  }
  return rotary_dim;
}

// The cos/sin tables: f32 [positions, >= rotary_dim / 2], equal shapes and strides.
void check_rope_tables(const RopeOptions& rope, int rotary_dim) {
  for (const TensorView* table : {rope.cos, rope.sin}) {
    const char* name = table == rope.cos ? "options.rope.cos" : "options.rope.sin";
    if (table->dtype != DType::f32) reject(fmt::format("{}: dtype {} must be f32", name, dtype_name(table->dtype)));
    if (table->ndim != 2 || table->shape[0] < 1 || table->shape[1] < rotary_dim / 2) {
      reject(fmt::format("{}: shape {} must be [positions >= 1, >= rotary_dim / 2 = {}]", name, shape_text(*table),
                         rotary_dim / 2));
    }
    if (table->strides[1] != 1) reject(fmt::format("{}: the last dimension must be contiguous (stride 1)", name));
    if (table->shape[0] > INT_MAX) reject(fmt::format("{}: more than 2^31-1 positions", name));
    if (table->data == nullptr || reinterpret_cast<uintptr_t>(table->data) % 4 != 0) {
      reject(fmt::format("{}: data pointer must be non-null and 4-byte aligned", name));
    }
  }
  if (rope.sin->shape[0] != rope.cos->shape[0] || rope.sin->shape[1] != rope.cos->shape[1] ||
      rope.sin->strides[0] != rope.cos->strides[0]) {
    reject(fmt::format("options.rope.sin: shape {} and strides must equal cos's ({})", shape_text(*rope.sin),
                       shape_text(*rope.cos)));
  }
}

}  // namespace

std::optional<TileMapLayout> kv_tile_map(const void* data, DType dtype, int64_t batch, int64_t rows, int64_t heads,
                                         int64_t head_dim, const int64_t (&strides)[3], int box_rows) {
  TileMapLayout map;
  map.base = data;
  map.dtype = dtype;
  const int64_t element_bytes = static_cast<int64_t>(dtype_size(dtype));
  const bool packed = batch == 0;
  map.rank = packed ? 3 : 4;
  // Dimensions innermost first: channels, rows, heads, batches.
  const int64_t extents[4] = {head_dim, rows, heads, packed ? 1 : batch};
  const int64_t element_strides[3] = {strides[1], strides[2], strides[0]};
  for (int d = 0; d < map.rank; ++d) {
    if (extents[d] == 0) return TileMapLayout{};  // no keys: nothing is ever copied
    map.dims[d] = static_cast<uint64_t>(extents[d]);
  }
  for (int d = 1; d < map.rank; ++d) {
    const int64_t bytes = element_strides[d - 1] * element_bytes;
    if (extents[d] == 1) {
      // Never stepped: any valid stride (a multiple of 16 bytes) describes it.
      map.strides_bytes[d - 1] = 16;
    } else if (bytes <= 0 || bytes >= (int64_t{1} << 40)) {
      return std::nullopt;
    } else {
      map.strides_bytes[d - 1] = static_cast<uint64_t>(bytes);  // a multiple of 16 (check_rows)
    }
  }
  map.box[0] = 64;
  map.box[1] = static_cast<uint32_t>(box_rows);
  map.box[2] = map.box[3] = 1;
  return map;
}

int num_splits_heuristic(int64_t tiles, int sm_count, int ctas_per_sm, int64_t kv_blocks, int max_splits) {
  const double wave = static_cast<double>(std::max(1, sm_count)) * std::max(1, ctas_per_sm);
  if (tiles >= 0.8 * wave) return 1;
  const int limit = static_cast<int>(std::min<int64_t>({max_splits, kv_blocks, static_cast<int64_t>(wave)}));
  auto blocks_per_split = [&](int splits) { return (kv_blocks + splits - 1) / splits; };
  // A split count that leaves blocks per split unchanged only adds empty splits.
  auto eligible = [&](int splits) { return splits == 1 || blocks_per_split(splits) != blocks_per_split(splits - 1); };
  auto efficiency = [&](int splits) {
    const double waves = tiles * splits / wave;
    return waves / std::ceil(waves);
  };
  double best = 0;
  for (int splits = 1; splits <= limit; ++splits) {
    if (eligible(splits)) best = std::max(best, efficiency(splits));
  }
  for (int splits = 1; splits <= limit; ++splits) {
    if (eligible(splits) && efficiency(splits) >= 0.85 * best) return splits;
  }
  return 1;
}

std::vector<float> rope_inv_frequencies(const RopeOptions& rope, int rotary_dim) {
  std::vector<float> frequencies(rotary_dim / 2);
  const double two_pi = 6.283185307179586;
  for (int pair = 0; pair < rotary_dim / 2; ++pair) {
    double frequency = std::pow(static_cast<double>(rope.theta), -2.0 * pair / rotary_dim) / rope.linear_scaling;
    if (rope.llama3_factor != 0.f) {
      // Long wavelengths are slowed by the factor, short ones kept, and the
      // band between interpolated (Llama 3.1).
      const double factor = rope.llama3_factor, low = rope.llama3_low_freq_factor, high = rope.llama3_high_freq_factor;
      const double original = rope.llama3_original_max_position;
      const double wavelength = two_pi / frequency;
      if (wavelength > original / low) {
        frequency /= factor;
      } else if (wavelength >= original / high) {
        const double smooth = (original / wavelength - low) / (high - low);
        frequency = (1.0 - smooth) * frequency / factor + smooth * frequency;
      }
    }
    frequencies[pair] = static_cast<float>(frequency);
  }
  return frequencies;
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
  // keys). Measured on the H200 (docs/PERFORMANCE.md).
  const int stages = head_dim > 64 ? 2 : 4;
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
  }
  return set;
}

namespace {

// The call after its tensors are validated: sizes, pointers and strides as
// the kernel reads them. Dense and varlen calls meet here.
struct Problem {
  DType dtype = DType::bf16;
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  // batch (0 for varlen), row, head strides in elements.
  int64_t q_strides[3] = {}, k_strides[3] = {}, v_strides[3] = {}, out_strides[3] = {};
  // K's and V's extents as tensors: batches (0 for packed varlen rows) and
  // rows (seqlen_k, or the packed total).
  int64_t kv_batches = 0, kv_rows = 0;
  int64_t lse_strides[3] = {};  // batch, head, row
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  const int* seqused_k = nullptr;
  int64_t total_q = 0;  // varlen: the packed query rows
  // KV cache (forward_kvcache): seqused_k is cache_seqlens; seqlen_k above is
  // the longest sequence (hint or capacity).
  bool kvcache = false;
  bool paged = false;
  int seqlen_k_added = 0;
  const int* kv_batch_index = nullptr;
  const int* block_table = nullptr;
  int64_t block_table_stride = 0;
  int page_shift = 0;
  int num_splits = 0;  // requested; 0 = heuristic
  int sm_count = 0;
  // Split-KV needs the caller's workspace: KV-cache calls always take one;
  // dense and varlen calls only through the workspace overloads.
  bool may_split = false;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool sizing_only = false;  // *_workspace_bytes: no workspace yet
};

void check_matching(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out) {
  if (k.dtype != q.dtype || v.dtype != q.dtype || out.dtype != q.dtype) {
    reject(fmt::format("k, v, out: dtypes ({}, {}, {}) must all match q's ({})", dtype_name(k.dtype),
                       dtype_name(v.dtype), dtype_name(out.dtype), dtype_name(q.dtype)));
  }
  // (k and v may have a rank other than q's: packed queries over a paged cache.)
  const int64_t q_dim = q.shape[q.ndim - 1], k_dim = k.shape[k.ndim - 1];
  if (k_dim != q_dim) reject(fmt::format("k: head_dim={} must equal q's head_dim={}", k_dim, q_dim));
  for (int axis = 0; axis < k.ndim; ++axis) {
    if (v.shape[axis] != k.shape[axis]) reject(fmt::format("v: shape {} must equal k's shape {}", shape_text(v), shape_text(k)));
  }
  for (int axis = 0; axis < q.ndim; ++axis) {
    if (out.shape[axis] != q.shape[axis]) reject(fmt::format("out: shape {} must equal q's shape {}", shape_text(out), shape_text(q)));
  }
  const int64_t heads_q = q.shape[q.ndim - 2], heads_kv = k.shape[k.ndim - 2];
  if (heads_q % heads_kv != 0) reject(fmt::format("k: heads_kv={} must divide heads_q={}", heads_kv, heads_q));
}

void copy_strides(const TensorView& t, int64_t (&strides)[3]) {
  if (t.ndim == 4) {
    strides[0] = t.strides[0], strides[1] = t.strides[1], strides[2] = t.strides[2];
  } else {
    strides[0] = 0, strides[1] = t.strides[0], strides[2] = t.strides[1];
  }
}

Problem problem_of(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out) {
  Problem p;
  p.dtype = q.dtype;
  p.heads_q = q.shape[q.ndim - 2];
  p.heads_kv = k.shape[k.ndim - 2];
  p.head_dim = q.shape[q.ndim - 1];
  p.q = q.data, p.k = k.data, p.v = v.data, p.out = out.data;
  copy_strides(q, p.q_strides);
  copy_strides(k, p.k_strides);
  copy_strides(v, p.v_strides);
  copy_strides(out, p.out_strides);
  p.kv_batches = k.ndim == 4 ? k.shape[0] : 0;
  p.kv_rows = k.ndim == 4 ? k.shape[1] : k.shape[0];
  return p;
}

ForwardPlan plan_problem(const Problem& problem, const ForwardOptions& options, const Arch& arch, int max_smem_bytes,
                         const TuningTable* tuning, bool varlen) {
  const int64_t batch = problem.batch, seqlen_q = problem.seqlen_q, seqlen_k = problem.seqlen_k;
  const int64_t heads_q = problem.heads_q, heads_kv = problem.heads_kv, head_dim = problem.head_dim;
  const int kernel_dim = kernel_head_dim(head_dim);
  float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (options.softmax_scale) {
    scale = *options.softmax_scale;
    if (!(scale > 0.f) || !std::isfinite(scale)) {
      reject(fmt::format("options.softmax_scale={} must be positive and finite", scale));
    }
  }
  if (options.window_left < -1) reject(fmt::format("options.window_left={} must be -1 (unbounded) or >= 0", options.window_left));
  if (options.window_right < -1) reject(fmt::format("options.window_right={} must be -1 (unbounded) or >= 0", options.window_right));
  if (!(options.softcap >= 0.f) || !std::isfinite(options.softcap)) {
    reject(fmt::format("options.softcap={} must be >= 0 (0 = off) and finite", options.softcap));
  }
  long long alibi_batch_stride = 0;
  if (options.alibi_slopes != nullptr) alibi_batch_stride = check_alibi(*options.alibi_slopes, batch, heads_q);
  const RopeOptions& rope = options.rope;
  const bool has_rope = rope.style != RopeStyle::none;
  const int rotary_dim = has_rope ? check_rope_scalars(rope, head_dim) : 0;
  if (has_rope && rope.cos != nullptr) {
    check_rope_tables(rope, rotary_dim);
    const bool offsets = rope.q_offsets != nullptr || rope.k_offsets != nullptr;
    if (!offsets && !varlen) {
      // Default positions are checkable here: keys 0 .. sk−1 and queries
      // sk − sq .. sk − 1.
      if (seqlen_q > seqlen_k) {
        reject(fmt::format("options.rope: with tables, queries at negative positions (seqlen_q={} > seqlen_k={}) "
                           "need rope.q_offsets", seqlen_q, seqlen_k));
      }
      if (rope.cos->shape[0] < seqlen_k) {
        reject(fmt::format("options.rope.cos: {} positions; the keys reach position {}", rope.cos->shape[0], seqlen_k - 1));
      }
    }
  }
  if (has_rope && rope.q_offsets != nullptr) check_i32_vector("options.rope.q_offsets", *rope.q_offsets, batch, "batch");
  if (has_rope && rope.k_offsets != nullptr) check_i32_vector("options.rope.k_offsets", *rope.k_offsets, batch, "batch");

  // The mask kind: causal is a window with right bound 0; a window that
  // bounds nothing is no mask.
  const int right = options.causal ? 0 : options.window_right;
  const int left = options.window_left;
  const bool causal = right == 0 && left < 0;
  const bool local = !causal && (left >= 0 || right >= 0);

  ForwardPlan plan;
  const int bucket = seqlen_bucket(seqlen_q, seqlen_k);
  // Windows are tuned like causal masks (both skip key blocks).
  const bool masked_like_causal = causal || local;
  std::optional<TileConfig> tuned;
  if (tuning != nullptr) tuned = tuning->lookup({arch, problem.dtype, kernel_dim, masked_like_causal, bucket});
  TileConfig tiles = tuned ? *tuned : default_tiles(problem.dtype, kernel_dim, masked_like_causal, arch, bucket);
  if (options.tiles.stages != 0) {
    if (options.tiles.stages < 0) reject(fmt::format("options.tiles.stages={} must be >= 0", options.tiles.stages));
    if (problem.kvcache && !options.tiles.wgmma && options.pack_gqa == false) {
      reject("options.pack_gqa=false: the decode kernel (options.tiles.stages > 0) always packs a KV head's query heads");
    }
  }
  // Tiles the caller fixed (block sizes or warps); the planner then leaves
  // them, and the defaults below, alone.
  const bool tiles_forced = options.tiles.block_q != 0 || options.tiles.block_kv != 0 || options.tiles.warps != 0;
  if (options.tiles.block_q != 0) tiles.block_q = options.tiles.block_q;
  if (options.tiles.block_kv != 0) tiles.block_kv = options.tiles.block_kv;
  if (options.tiles.warps != 0) tiles.warps = options.tiles.warps;
  // With a KV cache, tiles.stages selects the decode kernel, unless wgmma
  // asks for the producer layout.
  const bool producer_stages = !problem.kvcache || options.tiles.wgmma;
  if (producer_stages && options.tiles.stages != 0) tiles.stages = options.tiles.stages;
  plan.spec.dtype = problem.dtype;
  plan.spec.head_dim = kernel_dim;
  plan.spec.block_q = tiles.block_q;
  plan.spec.block_kv = tiles.block_kv;
  plan.spec.warps = tiles.warps;
  if (producer_stages) plan.spec.stages = tiles.stages;
  if (options.tiles.wgmma) {
    if (options.tiles.stages == 0) reject("options.tiles.wgmma needs options.tiles.stages > 0 (the producer layout)");
    if (arch.major != 9 || !arch.arch_specific) reject(fmt::format("options.tiles.wgmma needs sm_90a, not {}", arch.text()));
    plan.spec.wgmma = true;
  }
  if (options.tiles.persistent) {
    if (!options.tiles.wgmma) reject("options.tiles.persistent needs options.tiles.wgmma (the wgmma tiles walk a CTA's tiles)");
    plan.spec.persistent = true;
  }
  if (options.sm_limit < 0) reject(fmt::format("options.sm_limit={} must be >= 0 (0 = every SM)", options.sm_limit));
  plan.spec.causal = causal;
  plan.spec.local = local;
  plan.spec.softcap = options.softcap > 0.f;
  plan.spec.alibi = options.alibi_slopes != nullptr;
  // Head dims that are not a multiple of 8 (KernelSpec::unaligned_dim):
  // element-wise rows in the 4-warp kernels, or on sm_90a the wgmma tiles of
  // two warpgroups, whose producer copies aligned blocks and shifts them
  // (chosen below); never persistent or three warpgroups.
  const bool unaligned = head_dim % 8 != 0;
  plan.spec.unaligned_dim = unaligned ? static_cast<int>(head_dim) : 0;
  plan.spec.padded = kernel_dim != head_dim && !unaligned;
  if (unaligned && options.tiles.stages != 0 && (!options.tiles.wgmma || options.tiles.persistent)) {
    reject(fmt::format("options.tiles.stages={}: head_dim={} (not a multiple of 8) runs on the 4-warp kernels, or "
                       "with stages on ordinary-grid wgmma tiles (options.tiles.wgmma, not persistent)",
                       options.tiles.stages, head_dim));
  }
  if (unaligned && options.tiles.stages == 0) {
    // Not a tuned producer layout of the mma.sync kernels either (the wgmma
    // tiles are chosen below).
    plan.spec.stages = 0;
    tiles.stages = 0;
  }
  plan.spec.varlen = varlen;
  if (has_rope) {
    plan.spec.rope = rope.style == RopeStyle::rotate_half ? RopeKind::half : RopeKind::interleaved;
    plan.spec.rotary_dim = rotary_dim;
    plan.spec.rope_tables = rope.cos != nullptr;
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
  const int64_t group = heads_q / heads_kv;
  const int64_t typical_q = varlen ? (problem.total_q + std::max<int64_t>(batch, 1) - 1) / std::max<int64_t>(batch, 1)
                                   : seqlen_q;
  const int64_t unpacked_tiles = group * ((typical_q + tiles.block_q - 1) / tiles.block_q);
  const int64_t packed_tiles = (typical_q * group + tiles.block_q - 1) / tiles.block_q;
  const bool pack_pays = typical_q < tiles.block_q && packed_tiles < unpacked_tiles;
  plan.spec.pack_gqa = group > 1 && options.pack_gqa.value_or(pack_pays);
  // A sequence's rows as the kernels tile them: every query of each head of
  // a KV head's group when packed (the decode kernel always packs).
  auto packed_rows = [&] { return plan.spec.pack_gqa ? seqlen_q * group : seqlen_q; };
  if (problem.kvcache) {
    plan.spec.kvcache = true;
    plan.spec.paged = problem.paged;
  }
  // Calls that may split over their keys (a KV cache, or a dense or varlen
  // call given a workspace) are sized by splits rather than tiles.
  const bool may_split = problem.may_split;
  // The decode kernel takes calls of at most 32 packed query rows (16 above
  // head dim 128): over a KV cache (pages of at least a chunk), or dense K/V
  // (packed or not) without RoPE (it does not rotate keys) when the planner
  // chooses. Varlen calls count their longest sequence.
  const bool few_rows = !tiles_forced && options.pack_gqa.value_or(true) &&
                        seqlen_q * group <= (kernel_dim > 128 ? 16 : 32);
  const bool cache_decode =
      problem.kvcache && ((options.tiles.stages != 0 && !options.tiles.wgmma) ||
                          (few_rows && (!problem.paged || (int64_t{1} << problem.page_shift) >= kDecodeMinChunkKeys)));
  const bool dense_decode =
      !problem.kvcache && few_rows && options.tiles.stages == 0 && !has_rope && !unaligned;
  if (cache_decode || dense_decode) {
    const int64_t decode_tiles = batch * heads_kv * ((seqlen_q * group + 31) / 32);
    choose_decode_tiles(plan.spec, options.tiles, seqlen_q * group, problem.paged ? problem.page_shift : -1,
                        max_smem_bytes, decode_tiles, problem.sm_count, seqlen_k);
    tiles = {plan.spec.block_q, plan.spec.block_kv, plan.spec.warps, plan.spec.stages};
  } else if (may_split && !tiles_forced && options.tiles.stages == 0 && !unaligned && packed_rows() <= 64) {
    // Longer packed tiles (speculative decoding, chunked prefill, short
    // dense queries) where the wgmma tiles below do not take them (before
    // sm_90a, short caches, pages of fewer than 8 rows): one 64-row tile of
    // four warps; the key loop is memory-bound. Measured on the H200
    // (docs/PERFORMANCE.md). 128-key blocks keep more bytes in flight; a
    // paged cache keeps them only when a block fits in one page (smaller
    // pages take the per-row copy, which costs more than the larger block
    // gains).
    const int block_kv = problem.paged && (int64_t{1} << problem.page_shift) < 128 ? 64 : 128;
    tiles = {64, block_kv, 4};
    plan.spec.block_q = 64;
    plan.spec.block_kv = block_kv;
    plan.spec.warps = 4;
    plan.spec.stages = 0;
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
    return batch * (plan.spec.pack_gqa ? heads_kv * ((seqlen_q * group + rows - 1) / rows)
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
  const bool cache_prefill = problem.kvcache && plan.spec.family == Family::fwd && !short_rows_keep_mma_sync;
  const bool choose = !tiles_forced && options.tiles.stages == 0 && plan.spec.family == Family::fwd &&
                      (!problem.kvcache || cache_prefill) && hopper && !unaligned;
  std::optional<TileConfig> wgmma;
  if (!unaligned) wgmma = wgmma_tiles(kernel_dim, has_rope, arch, problem.paged);
  // wgmma kernels read K and V by tensor copies (KernelSpec::tensor_copies)
  // unless their producer rotates K (RoPE without a KV cache) at head dims
  // up to 128; views a tensor map cannot describe keep the mma.sync
  // kernels. A paged cache's copies read a block, or a page where pages are
  // shorter (one copy per page: no per-row table lookups, so small pages
  // cost little).
  const int64_t page_rows = problem.paged ? int64_t{1} << problem.page_shift : 0;
  auto kv_map = [&](const void* data, const int64_t (&strides)[3], int block_kv) {
    const int box_rows = problem.paged ? static_cast<int>(std::min<int64_t>(block_kv, page_rows)) : block_kv;
    return kv_tile_map(data, problem.dtype, problem.kv_batches, problem.kv_rows, heads_kv, head_dim, strides, box_rows);
  };
  const bool maps_possible = wgmma && kv_map(problem.k, problem.k_strides, wgmma->block_kv) &&
                             kv_map(problem.v, problem.v_strides, wgmma->block_kv);
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
  // Pages shorter than this (not whole 1024-byte swizzle atoms; the
  // kernel's FwdConfig::kMinTensorCopyPageShift) would be copied a row at a
  // time (cp.async, a table lookup per row): they keep the mma.sync kernel.
  constexpr int64_t kMinTensorCopyPageRows = 8;
  if (problem.paged && page_rows < kMinTensorCopyPageRows) wgmma.reset();
  const bool rope_producer =
      has_rope && !problem.kvcache && kernel_dim == 64 && !long_keys && ctas_of(256) >= kMinCtas;
  // Unaligned head dims on sm_90a: 128-row wgmma tiles of two warpgroups
  // (the producer shifts rows into them: FwdConfig::kStagedRows), under the
  // rules of the aligned ones; 64-key blocks above head dim 64, where 128
  // with the staging slots would not fit in shared memory.
  const bool unaligned_wgmma = !tiles_forced && options.tiles.stages == 0 && !problem.kvcache && hopper &&
                               unaligned && kernel_dim <= 128 && (has_rope || long_keys) && ctas_of(128) >= kMinCtas;
  if (unaligned_wgmma) {
    tiles = {128, kernel_dim <= 64 ? 128 : 64, 8, 2, true};
    apply_tiles(plan.spec, tiles);
  } else if (choose && rope_producer) {
    tiles = {256, 64, 8, 3};
    apply_tiles(plan.spec, tiles);
  } else if (choose && wgmma &&
             (problem.kvcache ? long_keys && maps_possible
                              : (has_rope && (kernel_dim <= 128 || maps_possible)) || (long_keys && maps_possible)) &&
             (problem.kvcache || ctas_of(wgmma->block_q) >= kMinCtas ||
              (may_split && long_keys && maps_possible && !short_rows_keep_mma_sync))) {
    tiles = *wgmma;
    apply_tiles(plan.spec, tiles);
    // Persistent (FwdConfig::kPersistent) where it measured faster on the
    // H200 than the same tiles in an ordinary grid (docs/PERFORMANCE.md,
    // bench/bench_persistent.py), with more tiles than SMs:
    //   - causal at head dims up to 64 up to 8192 keys: 0.72-0.99 of the
    //     ordinary grid's time (the last wave evened out, the next tile's
    //     loads under the current epilogue), RoPE included; level at 16k;
    //   - causal at larger head dims up to 4096 keys in at most
    //     kPersistentMaxWaves waves of tiles, or up to 512 keys: 0.71-0.92.
    //     Fuller grids of 1k-2k keys measured 0.98-1.09 since the
    //     warpgroups take turns (heaviest first across every head keeps all
    //     their K/V at work at once), and 8k keys up to 1.10;
    //   - without a causal mask, head dims up to 64 up to 4096 keys
    //     (0.80-0.98; 0.99-1.06 beyond), larger ones up to 1024 keys
    //     (0.84-0.95 with full grids, 1.01-1.03 at batch 2 × 1024; from 4k
    //     keys up to 1.06).
    // Three warpgroups with packed GQA would spill (test_compile).
    const bool spills = plan.spec.warps == 12 && plan.spec.pack_gqa;
    const int64_t tile_count = ctas_of(tiles.block_q);
    const bool small_head = kernel_dim <= 64;
    const bool pays = causal ? (small_head ? seqlen_k <= 8192
                                           : seqlen_k <= 4096 && (tile_count <= kPersistentMaxWaves * problem.sm_count ||
                                                                  seqlen_k <= 512))
                             : seqlen_k <= (small_head ? 4096 : 1024);
    plan.spec.persistent = !spills && !problem.kvcache && kernel_dim <= 128 && pays && tile_count > problem.sm_count;
  }
  try {
    plan.spec.validate();
  } catch (const Error& error) {
    // Tiles the caller forced that the selected kernel does not take (say
    // 128 query rows with stages over a KV cache, which select the decode
    // kernel): the validator's reason, under the option that set them.
    const bool forced = tiles_forced || options.tiles.stages != 0 || options.tiles.wgmma;
    if (!forced) throw;
    throw Error(error.code(),
                fmt::format("options.tiles = {{block_q {}, block_kv {}, warps {}, stages {}{}}}: {}", options.tiles.block_q,
                            options.tiles.block_kv, options.tiles.warps, options.tiles.stages,
                            options.tiles.wgmma ? ", wgmma" : "", error.what()),
                error.spec());
  }
  // Chosen (not forced) tiles that do not fit, e.g. RoPE's second K buffer at
  // head_dim 256: smaller key blocks first, then smaller query blocks.
  while (!tiles_forced && plan.spec.family == Family::fwd && plan.spec.smem_bytes() > static_cast<size_t>(max_smem_bytes) &&
         (plan.spec.block_kv > 32 || plan.spec.block_q > 64)) {
    if (plan.spec.block_kv > 32) {
      plan.spec.block_kv /= 2;
    } else {
      plan.spec.block_q /= 2;
      plan.spec.warps = std::min(plan.spec.warps, plan.spec.block_q / 16);
    }
    tiles = {plan.spec.block_q, plan.spec.block_kv, plan.spec.warps};
  }
  if (plan.spec.smem_bytes() > static_cast<size_t>(max_smem_bytes)) {
    throw Error(ErrorCode::unsupported,
                fmt::format("options.tiles: {} needs {} bytes of shared memory per block; {} allows {}",
                            plan.spec.text(), plan.spec.smem_bytes(), arch.text(), max_smem_bytes),
                plan.spec.text());
  }

  if (plan.spec.tensor_copies()) {
    const auto k_map = kv_map(problem.k, problem.k_strides, plan.spec.block_kv);
    const auto v_map = kv_map(problem.v, problem.v_strides, plan.spec.block_kv);
    if (!k_map || !v_map) {
      const int64_t(&strides)[3] = !k_map ? problem.k_strides : problem.v_strides;
      reject(fmt::format("{}: strides (batch, row, head) = ({}, {}, {}) elements: {} reads K and V by tensor copies, "
                         "which need a positive stride below 2^40 bytes in every dimension of more than one element",
                         !k_map ? "k" : "v", strides[0], strides[1], strides[2], plan.spec.text()));
    }
    plan.k_map = *k_map;
    plan.v_map = *v_map;
  }

  const int64_t rows = packed_rows();
  if (rows > INT_MAX) reject(fmt::format("q: seqlen_q × heads_q / heads_kv = {} exceeds 2^31-1", rows));
  const int64_t num_q_blocks = (rows + tiles.block_q - 1) / tiles.block_q;
  int64_t grid = num_q_blocks * (plan.spec.pack_gqa ? heads_kv : heads_q) * batch;
  if (grid > INT_MAX) reject(fmt::format("q: batch × heads × ceil(seqlen_q / {}) = {} exceeds 2^31-1 blocks", tiles.block_q, grid));

  FwdParams& p = plan.params;
  p.q = problem.q;
  p.k = problem.k;
  p.v = problem.v;
  p.o = problem.out;
  p.lse = problem.lse;
  p.q_batch_stride = problem.q_strides[0], p.q_row_stride = problem.q_strides[1], p.q_head_stride = problem.q_strides[2];
  p.k_batch_stride = problem.k_strides[0], p.k_row_stride = problem.k_strides[1], p.k_head_stride = problem.k_strides[2];
  p.v_batch_stride = problem.v_strides[0], p.v_row_stride = problem.v_strides[1], p.v_head_stride = problem.v_strides[2];
  p.o_batch_stride = problem.out_strides[0], p.o_row_stride = problem.out_strides[1], p.o_head_stride = problem.out_strides[2];
  p.lse_batch_stride = problem.lse_strides[0], p.lse_head_stride = problem.lse_strides[1], p.lse_row_stride = problem.lse_strides[2];
  p.cu_seqlens_q = problem.cu_seqlens_q;
  p.cu_seqlens_k = problem.cu_seqlens_k;
  p.seqused_k = problem.seqused_k;
  p.batch = static_cast<int>(batch);
  p.heads_q = static_cast<int>(heads_q);
  p.heads_kv = static_cast<int>(heads_kv);
  p.heads_per_kv = static_cast<int>(heads_q / heads_kv);
  p.seqlen_q = static_cast<int>(seqlen_q);
  p.seqlen_k = static_cast<int>(seqlen_k);
  p.num_q_blocks = static_cast<int>(num_q_blocks);
  p.head_dim = static_cast<int>(head_dim);
  // Unbounded sides become bounds past both ends of the sequence (the
  // diagonal runs from key sk - sq to sk - 1, so sq + sk reaches every key
  // from every row), so the kernel needs no special case and nothing
  // overflows an int.
  const int unbounded = static_cast<int>(std::min<int64_t>(seqlen_q + seqlen_k, INT_MAX / 4));
  p.window_left = left < 0 ? unbounded : std::min(left, INT_MAX / 4);
  p.window_right = right < 0 ? unbounded : std::min(right, INT_MAX / 4);
  p.scale = scale;
  const bool rewrite_scores = plan.spec.softcap || plan.spec.alibi;
  p.scale_log2 = rewrite_scores ? 1.f : scale * 1.4426950408889634f;
  p.lse_scale = rewrite_scores ? 0.6931471805599453f : scale;
  p.softcap = options.softcap;
  p.softcap_scale = options.softcap > 0.f ? scale / options.softcap : 0.f;
  p.alibi_slopes = options.alibi_slopes != nullptr ? static_cast<const float*>(options.alibi_slopes->data) : nullptr;
  p.alibi_batch_stride = alibi_batch_stride;
  if (has_rope) {
    if (rope.cos != nullptr) {
      p.rope_cos = static_cast<const float*>(rope.cos->data);
      p.rope_sin = static_cast<const float*>(rope.sin->data);
      p.rope_table_stride = rope.cos->strides[0];
      p.rope_table_rows = static_cast<int>(rope.cos->shape[0]);
      p.rope_table_vectors = (reinterpret_cast<uintptr_t>(rope.cos->data) | reinterpret_cast<uintptr_t>(rope.sin->data) |
                              static_cast<uintptr_t>(rope.cos->strides[0] * 4)) % 16 == 0;
    } else {
      // Frequencies depend only on the options: remember the last set, so a
      // model's calls do not recompute them.
      thread_local RopeOptions last_options{};
      thread_local int last_rotary_dim = 0;
      thread_local std::vector<float> last_frequencies;
      const bool same = last_rotary_dim == rotary_dim && last_options.theta == rope.theta &&
                        last_options.linear_scaling == rope.linear_scaling &&
                        last_options.llama3_factor == rope.llama3_factor &&
                        last_options.llama3_low_freq_factor == rope.llama3_low_freq_factor &&
                        last_options.llama3_high_freq_factor == rope.llama3_high_freq_factor &&
                        last_options.llama3_original_max_position == rope.llama3_original_max_position;
      if (!same) {
        last_frequencies = rope_inv_frequencies(rope, rotary_dim);
        last_options = rope;
        last_rotary_dim = rotary_dim;
      }
      std::copy(last_frequencies.begin(), last_frequencies.end(), p.rope_inv_freq);
    }
    p.rope_q_offsets = rope.q_offsets != nullptr ? static_cast<const int*>(rope.q_offsets->data) : nullptr;
    p.rope_k_offsets = rope.k_offsets != nullptr ? static_cast<const int*>(rope.k_offsets->data) : nullptr;
    // KV cache: query i of sequence b is at cache_seqlens[b] + i.
    if (problem.kvcache) p.rope_q_offsets = problem.seqused_k;
  }
  if (problem.kvcache) {
    p.seqlen_k_added = problem.seqlen_k_added;
    p.kv_batch_index = problem.kv_batch_index;
    p.block_table = problem.block_table;
    p.block_table_stride = problem.block_table_stride;
    p.page_shift = problem.page_shift;
  }
  // The kernels that write partial results: the decode kernel, the 4-warp
  // mma.sync tiles and the wgmma tiles in an ordinary grid with aligned rows.
  const bool splittable = plan.spec.family == Family::decode ||
                          ((plan.spec.stages == 0 || plan.spec.wgmma) && !plan.spec.persistent && !unaligned);
  // Errors name the entry point's own argument and sizing function.
  const bool kvcache_call = problem.kvcache && !varlen;
  const char* num_splits_name = kvcache_call ? "num_splits" : "options.num_splits";
  const char* workspace_query = kvcache_call ? "kvcache_workspace_bytes"
                                : varlen     ? "forward_varlen_workspace_bytes"
                                             : "forward_workspace_bytes";
  if (may_split && !splittable && problem.num_splits > 1) {
    reject(fmt::format("{}={}: {} does not split (persistent grids, the mma.sync producer layout and head dims that "
                       "are not a multiple of 8 do not)", num_splits_name, problem.num_splits, plan.spec.text()));
  }
  if (may_split && splittable && grid > 0) {
    // Split-KV when the tiles alone leave the GPU underused (a call with no
    // tiles, e.g. no queries, has nothing to split).
    // Splits are counted in key blocks: one CTA step (every warp one chunk)
    // for the decode kernel. The heuristic sees blocks of at least
    // kMinSplitKeys; a split still spans whole steps.
    const int64_t step = plan.spec.family == Family::decode ? plan.spec.block_kv * plan.spec.warps : plan.spec.block_kv;
    const int64_t kv_blocks = std::max<int64_t>(1, (seqlen_k + step - 1) / step);
    const int64_t split_keys = plan.spec.family == Family::decode ? std::max<int64_t>(step, kMinSplitKeys) : step;
    const int64_t split_blocks = std::max<int64_t>(1, (seqlen_k + split_keys - 1) / split_keys);
    int splits = problem.num_splits;
    if (splits == 0) {
      const int ctas_per_sm = static_cast<int>(std::max<size_t>(
          1, std::min<size_t>(kSmemPerSm / (plan.spec.smem_bytes() + 1024), kDecodeCtasPerSm)));
      splits = num_splits_heuristic(grid, problem.sm_count, ctas_per_sm, split_blocks, kMaxSplits);
    }
    splits = static_cast<int>(std::min<int64_t>(splits, kv_blocks));
    if (splits > 1) {
      const int64_t per_split = (kv_blocks + splits - 1) / splits;
      splits = static_cast<int>((kv_blocks + per_split - 1) / per_split);  // no empty splits
      plan.spec.split = true;
      p.num_splits = splits;
      p.blocks_per_split = static_cast<int>(per_split);
      plan.num_splits = splits;
      // Partial rows: every query of every sequence (varlen: the packed ones).
      const int64_t partial_rows = varlen ? problem.total_q : batch * seqlen_q;
      if (partial_rows > INT_MAX) reject(fmt::format("q: {} query rows exceed 2^31-1", partial_rows));
      p.partial_rows = static_cast<int>(partial_rows);
      const size_t partial_elements = static_cast<size_t>(splits) * partial_rows * heads_q;
      plan.partial_o_bytes = (partial_elements * head_dim * 4 + 255) / 256 * 256;
      plan.workspace_bytes = plan.partial_o_bytes + partial_elements * 4;
      grid *= splits;
      if (!problem.sizing_only) {
        if (problem.workspace_bytes < plan.workspace_bytes) {
          reject(fmt::format("workspace: {} bytes given; this call needs {} (ask {})", problem.workspace_bytes,
                             plan.workspace_bytes, workspace_query));
        }
        if (problem.workspace == nullptr || reinterpret_cast<uintptr_t>(problem.workspace) % 256 != 0) {
          reject("workspace: data pointer must be non-null and 256-byte aligned");
        }
        p.partial_o = static_cast<float*>(problem.workspace);
        p.partial_lse = reinterpret_cast<float*>(static_cast<char*>(problem.workspace) + plan.partial_o_bytes);
      }
    }
    if (grid > INT_MAX) reject(fmt::format("q: {} blocks with {} splits exceed 2^31-1", grid, splits));
  }
  if (plan.spec.persistent) {
    // One wave of CTAs at most, as many per SM as shared memory holds; the
    // kernel hands them the grid's tiles (FwdConfig::kPersistent).
    const int64_t ctas_per_sm = std::max<int64_t>(1, kSmemPerSm / (plan.spec.smem_bytes() + 1024));
    int64_t sms = std::max(1, problem.sm_count);
    if (options.sm_limit > 0) sms = std::min<int64_t>(sms, options.sm_limit);
    grid = std::min<int64_t>(grid, sms * ctas_per_sm);
  }
  plan.spec.validate();
  plan.grid = static_cast<unsigned>(grid);
  return plan;
}


}  // namespace

namespace {

// A dense call's tensors, validated.
Problem dense_problem(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const TensorView* lse, int sm_count) {
  check_rows("q", q, 4, true);
  check_rows("k", k, 4, true);
  check_rows("v", v, 4, true);
  check_rows("out", out, 4, true);
  check_matching(q, k, v, out);
  if (k.shape[0] != q.shape[0]) reject(fmt::format("k: batch={} must equal q's batch={}", k.shape[0], q.shape[0]));
  Problem problem = problem_of(q, k, v, out);
  problem.batch = q.shape[0];
  problem.seqlen_q = q.shape[1];
  problem.seqlen_k = k.shape[1];
  if (lse != nullptr) {
    check_lse(*lse, problem.batch, problem.heads_q, problem.seqlen_q);
    problem.lse = static_cast<float*>(lse->data);
    for (int i = 0; i < 3; ++i) problem.lse_strides[i] = lse->strides[i];
  }
  problem.sm_count = sm_count;
  return problem;
}

// The combine launch that merges a split attention's partial results
// (workspace, FwdParams::partial_rows rows) into out and lse: out [batch,
// seqlen_q, heads_q, head_dim] with lse [batch, heads_q, seqlen_q], or
// varlen out [total_q, heads_q, head_dim] with lse [heads_q, total_q] (one
// "batch" of total_q rows).
CombinePlan combine_splits(const ForwardPlan& attention, const TensorView& out, const TensorView* lse) {
  const FwdParams& fwd = attention.params;
  const bool packed = out.ndim == 3;
  CombineProblem combine;
  combine.state_dtype = DType::f32;
  combine.out_dtype = out.dtype;
  combine.states = fwd.partial_o;
  combine.lse = fwd.partial_lse;
  combine.out = out.data;
  combine.out_lse = lse != nullptr ? static_cast<float*>(lse->data) : nullptr;
  const int64_t batch = packed ? 1 : out.shape[0], seqlen = packed ? out.shape[0] : out.shape[1];
  const int64_t heads = out.shape[out.ndim - 2], head_dim = out.shape[out.ndim - 1];
  combine.num_states = attention.num_splits;
  combine.batch = batch;
  combine.seqlen = seqlen;
  combine.heads = heads;
  combine.head_dim = head_dim;
  const int64_t states_strides[4] = {batch * seqlen * heads * head_dim, seqlen * heads * head_dim, heads * head_dim,
                                     head_dim};
  const int64_t lse_strides[4] = {batch * seqlen * heads, seqlen * heads, heads, 1};
  std::copy(states_strides, states_strides + 4, combine.states_strides);
  std::copy(lse_strides, lse_strides + 4, combine.lse_strides);
  // (batch, row, head) strides of out and of lse.
  combine.out_strides[0] = packed ? 0 : out.strides[0];
  combine.out_strides[1] = out.strides[packed ? 0 : 1];
  combine.out_strides[2] = out.strides[packed ? 1 : 2];
  if (lse != nullptr) {
    combine.out_lse_strides[0] = packed ? 0 : lse->strides[0];
    combine.out_lse_strides[1] = lse->strides[packed ? 1 : 2];
    combine.out_lse_strides[2] = lse->strides[packed ? 0 : 1];
  }
  // Varlen: the packed rows past the last sequence's are no one's.
  if (packed) combine.rows_used = fwd.cu_seqlens_q + fwd.batch;
  combine.states_name = "workspace";
  combine.lse_name = "workspace";
  return plan_combine(combine);
}

void check_num_splits(const char* name, int num_splits) {
  if (num_splits < 0 || num_splits > kMaxSplits) {
    reject(fmt::format("{}={} must be 0 (heuristic) or 1 to {}", name, num_splits, kMaxSplits));
  }
}

// A paged cache: `table` (i32 [batch, max_pages]) and the page size (dimension
// 1 of k_cache, a power of two) into `problem`. Returns the capacity of one
// sequence (page_size × max_pages).
int64_t use_block_table(Problem& problem, const TensorView& table, const TensorView& k_cache, const char* k_name) {
  const int64_t batch = problem.batch;
  if (table.dtype != DType::i32 || table.ndim != 2 || table.shape[0] != batch || table.shape[1] < 1) {
    reject(fmt::format("block_table: must be i32 [batch, max_pages] = [{}, >= 1], got {} {}", batch,
                       dtype_name(table.dtype), shape_text(table)));
  }
  if (table.strides[1] != 1) reject("block_table: the pages dimension must be contiguous (stride 1)");
  if (table.data == nullptr || reinterpret_cast<uintptr_t>(table.data) % 4 != 0) {
    reject("block_table: data pointer must be non-null and 4-byte aligned");
  }
  const int64_t page_size = k_cache.shape[1];
  if (page_size < 1 || (page_size & (page_size - 1)) != 0) {
    reject(fmt::format("{}: page_size={} (dimension 1 of a paged cache) must be a power of two", k_name, page_size));
  }
  problem.kvcache = true;
  problem.paged = true;
  problem.block_table = static_cast<const int*>(table.data);
  problem.block_table_stride = table.strides[0];
  while ((int64_t{1} << problem.page_shift) < page_size) ++problem.page_shift;
  return page_size * table.shape[1];
}

// A varlen call's tensors and offsets, validated: q/out [total_q, heads_q,
// head_dim], lse [heads_q, total_q]; k/v packed [total_k, heads_kv,
// head_dim], or with a block table paged [num_pages, page_size, heads_kv,
// head_dim].
Problem varlen_problem(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView* lse, const VarlenArgs& varlen, const ForwardOptions& options, int sm_count) {
  const bool paged = varlen.block_table != nullptr;
  check_rows("q", q, 3, !paged);
  check_rows("k", k, paged ? 4 : 3, !paged);
  check_rows("v", v, paged ? 4 : 3, !paged);
  check_rows("out", out, 3, !paged);
  check_matching(q, k, v, out);
  const int64_t batch = varlen.cu_seqlens_q.ndim == 1 ? varlen.cu_seqlens_q.shape[0] - 1 : -1;
  if (batch < 0) reject("cu_seqlens_q: shape must be [batch + 1] (at least one element)");
  check_i32_vector("cu_seqlens_q", varlen.cu_seqlens_q, batch + 1, "batch + 1");
  // Over a paged cache with seqused_k nothing reads cu_seqlens_k (the
  // keys are the pages' first seqused_k[b] rows), so it may be left empty,
  // as FlashAttention-3 and vLLM allow.
  const TensorView& cu_k = varlen.cu_seqlens_k;
  const bool cu_k_given = cu_k.data != nullptr || cu_k.ndim != 0;
  if (cu_k_given) {
    check_i32_vector("cu_seqlens_k", cu_k, batch + 1, "batch + 1");
  } else if (!paged || varlen.seqused_k == nullptr) {
    reject("cu_seqlens_k: required unless both block_table and seqused_k are given (packed keys start at "
           "cu_seqlens_k[b]; a paged sequence's keys are counted by seqused_k[b], else by cu_seqlens_k)");
  }
  if (varlen.seqused_k != nullptr) check_i32_vector("seqused_k", *varlen.seqused_k, batch, "batch");
  const int64_t total_q = q.shape[0];
  if (varlen.max_seqlen_q < 0 || (varlen.max_seqlen_q == 0 && total_q > 0 && batch > 0) || varlen.max_seqlen_q > total_q) {
    reject(fmt::format("varlen: max_seqlen_q={} must be between 1 and total_q={} (0 only when there are no queries)",
                       varlen.max_seqlen_q, total_q));
  }
  Problem problem = problem_of(q, k, v, out);
  problem.batch = batch;
  problem.total_q = total_q;
  int64_t capacity = k.shape[0];
  if (paged) {
    capacity = use_block_table(problem, *varlen.block_table, k, "k");
    // The cache holds keys as they are; positions would need each
    // sequence's start in the cache, which varlen offsets do not give.
    if (options.rope.style != RopeStyle::none) {
      reject("options.rope: not supported over a paged cache in forward_varlen (rotate keys as they are written, "
             "e.g. forward_kvcache's k_new, and q before the call)");
    }
  }
  if (varlen.max_seqlen_k < 0 || varlen.max_seqlen_k > capacity) {
    reject(fmt::format("varlen: max_seqlen_k={} must be between 0 and {}={}", varlen.max_seqlen_k,
                       paged ? "page_size × max_pages" : "total_k", capacity));
  }
  problem.seqlen_q = varlen.max_seqlen_q;
  problem.seqlen_k = varlen.max_seqlen_k;
  problem.cu_seqlens_q = static_cast<const int*>(varlen.cu_seqlens_q.data);
  problem.cu_seqlens_k = cu_k_given ? static_cast<const int*>(cu_k.data) : nullptr;
  problem.seqused_k = varlen.seqused_k != nullptr ? static_cast<const int*>(varlen.seqused_k->data) : nullptr;
  if (lse != nullptr) {
    if (lse->dtype != DType::f32) reject(fmt::format("lse: dtype {} must be f32", dtype_name(lse->dtype)));
    if (lse->ndim != 2 || lse->shape[0] != problem.heads_q || lse->shape[1] != total_q) {
      reject(fmt::format("lse: shape {} must be [heads_q, total_q] = [{}, {}]", shape_text(*lse), problem.heads_q, total_q));
    }
    check_lse_alignment(*lse, problem.heads_q * total_q);
    problem.lse = static_cast<float*>(lse->data);
    problem.lse_strides[1] = lse->strides[0];
    problem.lse_strides[2] = lse->strides[1];
  }
  problem.sm_count = sm_count;
  return problem;
}

// A call without a workspace never splits: options.num_splits 0 or 1.
void check_unsplit(const ForwardOptions& options, const char* entry, const char* workspace_query) {
  check_num_splits("options.num_splits", options.num_splits);
  if (options.num_splits > 1) {
    reject(fmt::format("options.num_splits={}: splitting needs a workspace (the {} overload that takes one, sized by "
                       "{})", options.num_splits, entry, workspace_query));
  }
}

// A dense or varlen call given a workspace: split over its keys where the
// tiles alone leave the GPU underused (or options.num_splits asks), then
// the combine of the splits into out and lse.
SplitForwardPlan plan_with_workspace(Problem problem, const TensorView& out, const TensorView* lse,
                                     const ForwardOptions& options, void* workspace, size_t workspace_bytes,
                                     bool sizing_only, const Arch& arch, int max_smem_bytes,
                                     const TuningTable* tuning, bool varlen) {
  check_num_splits("options.num_splits", options.num_splits);
  problem.may_split = true;
  problem.num_splits = options.num_splits;
  problem.workspace = workspace;
  problem.workspace_bytes = workspace_bytes;
  problem.sizing_only = sizing_only;
  SplitForwardPlan plan;
  plan.attention = plan_problem(problem, options, arch, max_smem_bytes, tuning, varlen);
  if (plan.attention.spec.split && !sizing_only) plan.combine = combine_splits(plan.attention, out, lse);
  return plan;
}

}  // namespace

ForwardPlan plan_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const TensorView* lse, const ForwardOptions& options,
                         const Arch& arch, int max_smem_bytes, int sm_count, const TuningTable* tuning) {
  check_unsplit(options, "forward", "forward_workspace_bytes");
  return plan_problem(dense_problem(q, k, v, out, lse, sm_count), options, arch, max_smem_bytes, tuning, false);
}

SplitForwardPlan plan_forward_split(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const TensorView* lse, const ForwardOptions& options,
                                    void* workspace, size_t workspace_bytes, bool sizing_only, const Arch& arch,
                                    int max_smem_bytes, int sm_count, const TuningTable* tuning) {
  return plan_with_workspace(dense_problem(q, k, v, out, lse, sm_count), out, lse, options, workspace,
                             workspace_bytes, sizing_only, arch, max_smem_bytes, tuning, false);
}

ForwardPlan plan_forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                const TensorView* lse, const VarlenArgs& varlen, const ForwardOptions& options,
                                const Arch& arch, int max_smem_bytes, int sm_count, const TuningTable* tuning) {
  Problem problem = varlen_problem(q, k, v, out, lse, varlen, options, sm_count);
  check_unsplit(options, "forward_varlen", "forward_varlen_workspace_bytes");
  return plan_problem(problem, options, arch, max_smem_bytes, tuning, true);
}

SplitForwardPlan plan_forward_varlen_split(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const TensorView& out, const TensorView* lse, const VarlenArgs& varlen,
                                           const ForwardOptions& options, void* workspace, size_t workspace_bytes,
                                           bool sizing_only, const Arch& arch, int max_smem_bytes, int sm_count,
                                           const TuningTable* tuning) {
  return plan_with_workspace(varlen_problem(q, k, v, out, lse, varlen, options, sm_count), out, lse, options,
                             workspace, workspace_bytes, sizing_only, arch, max_smem_bytes, tuning, true);
}

ForwardPlan plan_forward_kvcache(const TensorView& q, const KVCacheArgs& args, const TensorView& out,
                                 const TensorView* lse, const ForwardOptions& options, void* workspace,
                                 size_t workspace_bytes, bool sizing_only, const Arch& arch, int max_smem_bytes,
                                 int sm_count, const TuningTable* tuning) {
  const TensorView& k_cache = args.k_cache;
  check_rows("q", q, 4);
  check_rows("k_cache", k_cache, 4);
  check_rows("v_cache", args.v_cache, 4);
  check_rows("out", out, 4);
  check_matching(q, k_cache, args.v_cache, out);
  const int64_t batch = q.shape[0], seqlen_q = q.shape[1];
  check_i32_vector("cache_seqlens", args.cache_seqlens, batch, "batch");
  Problem problem = problem_of(q, k_cache, args.v_cache, out);
  problem.batch = batch;
  problem.seqlen_q = seqlen_q;
  problem.kvcache = true;
  problem.seqused_k = static_cast<const int*>(args.cache_seqlens.data);
  int64_t capacity = k_cache.shape[1];
  if (args.block_table != nullptr) {
    if (args.cache_batch_idx != nullptr) reject("cache_batch_idx: not supported with a paged cache (use block_table)");
    capacity = use_block_table(problem, *args.block_table, k_cache, "k_cache");
  } else if (args.cache_batch_idx != nullptr) {
    check_i32_vector("cache_batch_idx", *args.cache_batch_idx, batch, "batch");
    problem.kv_batch_index = static_cast<const int*>(args.cache_batch_idx->data);
  } else if (k_cache.shape[0] != batch) {
    reject(fmt::format("k_cache: batch={} must equal q's batch={} (or pass cache_batch_idx)", k_cache.shape[0], batch));
  }
  if ((args.k_new == nullptr) != (args.v_new == nullptr)) reject("k_new, v_new: give both or neither");
  if (args.k_new != nullptr) {
    check_rows("k_new", *args.k_new, 4);
    check_rows("v_new", *args.v_new, 4);
    const TensorView& k_new = *args.k_new;
    if (k_new.dtype != q.dtype || args.v_new->dtype != q.dtype) reject("k_new, v_new: dtype must match q's");
    for (int axis = 0; axis < 4; ++axis) {
      if (args.v_new->shape[axis] != k_new.shape[axis]) {
        reject(fmt::format("v_new: shape {} must equal k_new's shape {}", shape_text(*args.v_new), shape_text(k_new)));
      }
    }
    if (k_new.shape[0] != batch || k_new.shape[2] != k_cache.shape[2] || k_new.shape[3] != k_cache.shape[3]) {
      reject(fmt::format("k_new: shape {} must be [batch, seqlen_new, heads_kv, head_dim] = [{}, *, {}, {}]",
                         shape_text(k_new), batch, k_cache.shape[2], k_cache.shape[3]));
    }
    problem.seqlen_k_added = static_cast<int>(k_new.shape[1]);
  }
  if (args.max_seqlen_k < 0 || args.max_seqlen_k > capacity) {
    reject(fmt::format("max_seqlen_k={} must be between 0 (= the cache capacity) and the capacity {}", args.max_seqlen_k,
                       capacity));
  }
  problem.seqlen_k = args.max_seqlen_k > 0 ? args.max_seqlen_k : capacity;
  check_num_splits("num_splits", args.num_splits);
  if (options.num_splits != 0) {
    reject(fmt::format("options.num_splits={}: forward_kvcache takes its split count from KVCacheArgs::num_splits",
                       options.num_splits));
  }
  if (options.rope.q_offsets != nullptr || options.rope.k_offsets != nullptr) {
    reject("options.rope: q_offsets and k_offsets do not apply to forward_kvcache (positions come from cache_seqlens)");
  }
  problem.num_splits = args.num_splits;
  problem.may_split = true;
  problem.sm_count = sm_count;
  problem.workspace = workspace;
  problem.workspace_bytes = workspace_bytes;
  problem.sizing_only = sizing_only;
  if (lse != nullptr) {
    check_lse(*lse, batch, problem.heads_q, seqlen_q);
    problem.lse = static_cast<float*>(lse->data);
    for (int i = 0; i < 3; ++i) problem.lse_strides[i] = lse->strides[i];
  }
  return plan_problem(problem, options, arch, max_smem_bytes, tuning, false);
}

KVCachePlan plan_kvcache(const TensorView& q, const KVCacheArgs& args, const TensorView& out, const TensorView* lse,
                         const ForwardOptions& options, void* workspace, size_t workspace_bytes, bool sizing_only,
                         const Arch& arch, int max_smem_bytes, int sm_count, const TuningTable* tuning) {
  KVCachePlan plan;
  plan.attention = plan_forward_kvcache(q, args, out, lse, options, workspace, workspace_bytes, sizing_only, arch,
                                        max_smem_bytes, sm_count, tuning);
  const FwdParams& fwd = plan.attention.params;
  const KernelSpec& spec = plan.attention.spec;
  if (args.k_new != nullptr && args.k_new->shape[1] > 0 && q.shape[0] > 0) {
    AppendPlan& append = plan.append;
    append.spec = KernelSpec::append(q.dtype, spec.rope, spec.rotary_dim, spec.rope_tables, spec.paged);
    AppendParams& p = append.params;
    p.k_new = args.k_new->data;
    p.v_new = args.v_new->data;
    p.k_cache = args.k_cache.data;
    p.v_cache = args.v_cache.data;
    for (int i = 0; i < 3; ++i) {
      p.k_new_strides[i] = args.k_new->strides[i];
      p.v_new_strides[i] = args.v_new->strides[i];
      p.k_cache_strides[i] = args.k_cache.strides[i];
      p.v_cache_strides[i] = args.v_cache.strides[i];
    }
    p.cache_seqlens = fwd.seqused_k;
    p.kv_batch_index = fwd.kv_batch_index;
    p.block_table = fwd.block_table;
    p.block_table_stride = fwd.block_table_stride;
    p.page_shift = fwd.page_shift;
    p.batch = fwd.batch;
    p.seqlen_new = static_cast<int>(args.k_new->shape[1]);
    p.heads_kv = fwd.heads_kv;
    p.head_dim = fwd.head_dim;
    std::copy(std::begin(fwd.rope_inv_freq), std::end(fwd.rope_inv_freq), p.rope_inv_freq);
    p.rope_cos = fwd.rope_cos;
    p.rope_sin = fwd.rope_sin;
    p.rope_table_stride = fwd.rope_table_stride;
    p.rope_table_rows = fwd.rope_table_rows;
    const int64_t rows = static_cast<int64_t>(p.batch) * p.seqlen_new * p.heads_kv;
    if ((rows + 3) / 4 > INT_MAX) reject("k_new: batch × seqlen_new × heads_kv is too large");
    append.grid = static_cast<unsigned>((rows + 3) / 4);  // four rows (warps) per CTA
  }
  if (spec.split && !sizing_only) plan.combine = combine_splits(plan.attention, out, lse);
  return plan;
}

}  // namespace jitattn::detail
