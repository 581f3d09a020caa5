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

// The generated head dims; any other multiple of 8 runs on the next one up,
// zero-padded inside the kernel (the caller's tensors are not copied).
constexpr int kKernelHeadDims[] = {32, 64, 96, 128, 192, 256};

int kernel_head_dim(int64_t head_dim) {
  if (head_dim % 8 != 0 || head_dim < 8) reject(fmt::format("q: head_dim={} must be a multiple of 8", head_dim));
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

const char* dim_name(int ndim, int axis) {
  static const char* bshd[] = {"batch", "seqlen", "heads", "head_dim"};
  static const char* bhs[] = {"batch", "heads", "seqlen_q"};
  return ndim == 3 ? bhs[axis] : bshd[axis];
}


// A [batch, seqlen, heads, head_dim] 16-bit tensor that cp.async can read in
// 16-byte chunks.
void check_bshd(const char* name, const TensorView& t) {
  if (t.ndim != 4) reject(fmt::format("{}: must have 4 dimensions [batch, seqlen, heads, head_dim], got {}", name, t.ndim));
  if (t.dtype != DType::f16 && t.dtype != DType::bf16) {
    reject(fmt::format("{}: dtype {} is not f16 or bf16", name, dtype_name(t.dtype)));
  }
  for (int axis = 0; axis < 4; ++axis) {
    if (t.shape[axis] < 0) reject(fmt::format("{}: {}={} is negative", name, dim_name(4, axis), t.shape[axis]));
    if (t.shape[axis] > INT_MAX) reject(fmt::format("{}: {}={} exceeds 2^31-1", name, dim_name(4, axis), t.shape[axis]));
  }
  if (t.shape[2] == 0) reject(fmt::format("{}: heads must be >= 1", name));
  if (t.strides[3] != 1) reject(fmt::format("{}: head_dim stride is {}; the last dimension must be contiguous (stride 1)", name, t.strides[3]));
  for (int axis = 0; axis < 3; ++axis) {
    if (t.strides[axis] % 8 != 0) {
      reject(fmt::format("{}: {} stride {} must be a multiple of 8 elements (16-byte aligned rows)", name,
                         dim_name(4, axis), t.strides[axis]));
    }
  }
  const bool empty = t.shape[0] == 0 || t.shape[1] == 0 || t.shape[3] == 0;
  if (t.data == nullptr && !empty) reject(fmt::format("{}: data is null", name));
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) reject(fmt::format("{}: data pointer must be 16-byte aligned", name));
}

void check_lse(const TensorView& lse, int64_t batch, int64_t heads, int64_t seqlen_q) {
  if (lse.ndim != 3) reject(fmt::format("lse: must have 3 dimensions [batch, heads_q, seqlen_q], got {}", lse.ndim));
  if (lse.dtype != DType::f32) reject(fmt::format("lse: dtype {} must be f32", dtype_name(lse.dtype)));
  if (lse.shape[0] != batch || lse.shape[1] != heads || lse.shape[2] != seqlen_q) {
    reject(fmt::format("lse: shape {} must be [batch, heads_q, seqlen_q] = [{}, {}, {}]", shape_text(lse), batch, heads, seqlen_q));
  }
  if (lse.data == nullptr && batch * heads * seqlen_q > 0) reject("lse: data is null");
  if (reinterpret_cast<uintptr_t>(lse.data) % 4 != 0) reject("lse: data pointer must be 4-byte aligned");
}

}  // namespace

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

std::vector<TileConfig> default_tile_set(DType dtype, int head_dim, bool causal, const Arch& arch) {
  std::vector<TileConfig> set;
  for (int bucket = 512; bucket <= 16384; bucket *= 2) {
    const TileConfig t = default_tiles(dtype, head_dim, causal, arch, bucket);
    const bool seen = std::any_of(set.begin(), set.end(), [&](const TileConfig& s) {
      return s.block_q == t.block_q && s.block_kv == t.block_kv && s.warps == t.warps;
    });
    if (!seen) set.push_back(t);
  }
  return set;
}

ForwardPlan plan_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const TensorView* lse, const ForwardOptions& options,
                         const Arch& arch, int max_smem_bytes, const TuningTable* tuning) {
  check_bshd("q", q);
  check_bshd("k", k);
  check_bshd("v", v);
  check_bshd("out", out);
  const int64_t batch = q.shape[0], seqlen_q = q.shape[1], heads_q = q.shape[2], head_dim = q.shape[3];
  const int64_t seqlen_k = k.shape[1], heads_kv = k.shape[2];
  if (k.dtype != q.dtype || v.dtype != q.dtype || out.dtype != q.dtype) {
    reject(fmt::format("k, v, out: dtypes ({}, {}, {}) must all match q's ({})", dtype_name(k.dtype),
                       dtype_name(v.dtype), dtype_name(out.dtype), dtype_name(q.dtype)));
  }
  if (k.shape[0] != batch) reject(fmt::format("k: batch={} must equal q's batch={}", k.shape[0], batch));
  if (k.shape[3] != head_dim) reject(fmt::format("k: head_dim={} must equal q's head_dim={}", k.shape[3], head_dim));
  const int kernel_dim = kernel_head_dim(head_dim);
  for (int axis = 0; axis < 4; ++axis) {
    if (v.shape[axis] != k.shape[axis]) reject(fmt::format("v: shape {} must equal k's shape {}", shape_text(v), shape_text(k)));
    if (out.shape[axis] != q.shape[axis]) reject(fmt::format("out: shape {} must equal q's shape {}", shape_text(out), shape_text(q)));
  }
  if (heads_q % heads_kv != 0) reject(fmt::format("k: heads_kv={} must divide heads_q={}", heads_kv, heads_q));
  if (lse != nullptr) check_lse(*lse, batch, heads_q, seqlen_q);
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
  if (tuning != nullptr) tuned = tuning->lookup({arch, q.dtype, kernel_dim, masked_like_causal, bucket});
  TileConfig tiles = tuned ? *tuned : default_tiles(q.dtype, kernel_dim, masked_like_causal, arch, bucket);
  if (options.tiles.block_q != 0) tiles.block_q = options.tiles.block_q;
  if (options.tiles.block_kv != 0) tiles.block_kv = options.tiles.block_kv;
  if (options.tiles.warps != 0) tiles.warps = options.tiles.warps;
  plan.spec.dtype = q.dtype;
  plan.spec.head_dim = kernel_dim;
  plan.spec.block_q = tiles.block_q;
  plan.spec.block_kv = tiles.block_kv;
  plan.spec.warps = tiles.warps;
  plan.spec.causal = causal;
  plan.spec.local = local;
  plan.spec.softcap = options.softcap > 0.f;
  plan.spec.alibi = options.alibi_slopes != nullptr;
  plan.spec.padded = kernel_dim != head_dim;
  plan.spec.validate();
  if (plan.spec.smem_bytes() > static_cast<size_t>(max_smem_bytes)) {
    throw Error(ErrorCode::unsupported,
                fmt::format("options.tiles: {} needs {} bytes of shared memory per block; {} allows {}",
                            plan.spec.text(), plan.spec.smem_bytes(), arch.text(), max_smem_bytes),
                plan.spec.text());
  }

  const int64_t num_q_blocks = (seqlen_q + tiles.block_q - 1) / tiles.block_q;
  const int64_t grid = num_q_blocks * heads_q * batch;
  if (grid > INT_MAX) reject(fmt::format("q: batch × heads × ceil(seqlen_q / {}) = {} exceeds 2^31-1 blocks", tiles.block_q, grid));

  FwdParams& p = plan.params;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = out.data;
  p.lse = lse != nullptr ? static_cast<float*>(lse->data) : nullptr;
  p.q_batch_stride = q.strides[0], p.q_row_stride = q.strides[1], p.q_head_stride = q.strides[2];
  p.k_batch_stride = k.strides[0], p.k_row_stride = k.strides[1], p.k_head_stride = k.strides[2];
  p.v_batch_stride = v.strides[0], p.v_row_stride = v.strides[1], p.v_head_stride = v.strides[2];
  p.o_batch_stride = out.strides[0], p.o_row_stride = out.strides[1], p.o_head_stride = out.strides[2];
  if (lse != nullptr) {
    p.lse_batch_stride = lse->strides[0], p.lse_head_stride = lse->strides[1], p.lse_row_stride = lse->strides[2];
  }
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
  plan.grid = static_cast<unsigned>(grid);
  return plan;
}

}  // namespace jitattn::detail
