// Checks of the tensors and options a call passes: each failure names the
// argument and the rule, before anything is launched (DESIGN.md, Errors).
#include "plan/internal.hpp"

#include <climits>
#include <cmath>
#include <cstdint>

#include <fmt/ranges.h>

namespace jitattn::detail {

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

int check_value_dim(int64_t head_dim, int64_t head_dim_v) {
  // FwdConfig::kSplitDims: V's tiles and the output take a generated head
  // dim of their own, below q's; no padding of V (its chunks past its head
  // dim would be read as zeros and multiplied for nothing).
  bool generated = false;
  for (int dim : kKernelHeadDims) generated = generated || dim == head_dim_v;
  if (!generated || head_dim_v >= head_dim) {
    reject(fmt::format("v: head_dim={} differs from q's head_dim={}: it must then be one of 32, 64, 96, 128, 192 and "
                       "below q's (FlashAttention 3's hdim_v, e.g. q/k 192 with v 128)", head_dim_v, head_dim));
  }
  if (head_dim % 8 != 0) {
    reject(fmt::format("v: head_dim={} differs from q's head_dim={}, which must then be a multiple of 8", head_dim_v,
                       head_dim));
  }
  return static_cast<int>(head_dim_v);
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
  // (Strides of extent-1 dimensions are never stepped: one head, one batch.)
  if (heads > 1 && slopes.strides[slopes.ndim - 1] != 1) {
    reject("alibi_slopes: the heads dimension must be contiguous (stride 1)");
  }
  // (Per-batch slopes of a batch of none are empty and need not point anywhere.)
  if (slopes.data == nullptr && (per_head || batch > 0)) reject("alibi_slopes: data is null");
  if (reinterpret_cast<uintptr_t>(slopes.data) % 4 != 0) reject("alibi_slopes: data pointer must be 4-byte aligned");
  return per_batch_head ? slopes.strides[0] : 0;
}

// The learnable_sink tensor: f32 [heads_q], one logit per query head, as
// FlashAttention takes it.
void check_learnable_sink(const TensorView& sink, int64_t heads) {
  if (sink.dtype != DType::f32) reject(fmt::format("learnable_sink: dtype {} must be f32", dtype_name(sink.dtype)));
  if (sink.ndim != 1 || sink.shape[0] != heads) {
    reject(fmt::format("learnable_sink: shape {} must be [heads_q] = [{}]", shape_text(sink), heads));
  }
  if (heads > 1 && sink.strides[0] != 1) {
    reject(fmt::format("learnable_sink: stride {} must be 1 (contiguous heads)", sink.strides[0]));
  }
  if (sink.data == nullptr) reject("learnable_sink: data is null");
  if (reinterpret_cast<uintptr_t>(sink.data) % 4 != 0) reject("learnable_sink: data pointer must be 4-byte aligned");
}

// A 16-bit tensor of rows: dense [batch, seqlen, heads, head_dim] (4-D) or
// packed varlen [total, heads, head_dim] (3-D). Where head_dim is a multiple
// of 8, cp.async reads the rows in 16-byte chunks, so they must be 16-byte
// aligned. Other head dims (`any_head_dim`: forward and forward_varlen) are
// read element by element, from any 2-byte boundary.
void check_rows(const char* name, const TensorView& t, Rows layout, bool any_head_dim) {
  static const char* const dense[] = {"batch", "seqlen", "heads", "head_dim"};
  static const char* const packed_queries[] = {"total_q", "heads", "head_dim"};
  static const char* const packed_keys[] = {"total_k", "heads", "head_dim"};
  static const char* const pages[] = {"num_pages", "page_size", "heads", "head_dim"};
  const char* const* names = layout == Rows::dense            ? dense
                             : layout == Rows::packed_queries ? packed_queries
                             : layout == Rows::packed_keys    ? packed_keys
                                                              : pages;
  const int ndim = layout == Rows::dense || layout == Rows::pages ? 4 : 3;
  if (t.ndim != ndim) {
    reject(fmt::format("{}: must have {} dimensions [{}], got {}", name, ndim,
                       fmt::join(names, names + ndim, ", "), t.ndim));
  }
  if (t.dtype != DType::f16 && t.dtype != DType::bf16) {
    reject(fmt::format("{}: dtype {} is not f16 or bf16", name, dtype_name(t.dtype)));
  }
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
  // Inner axes first: a settled stride (settled_strides) is a product of an
  // inner one, so the caller's own stride is the one named.
  for (int axis = ndim - 2; axis >= 0 && !unaligned; --axis) {
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
  if (length > 1 && t.strides[0] != 1) reject(fmt::format("{}: must be contiguous (stride 1)", name));
  // (An empty vector, of a batch of 0, need not point anywhere.)
  if ((t.data == nullptr && length > 0) || reinterpret_cast<uintptr_t>(t.data) % 4 != 0) {
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

namespace {

// YaRN's scalars (RopeOptions::yarn_*), and that no other frequency scaling
// comes with them: Hugging Face's rope types are one at a time.
void check_yarn(const RopeOptions& rope) {
  if (!(rope.yarn_factor > 0.f) || !std::isfinite(rope.yarn_factor)) {
    reject(fmt::format("options.rope.yarn_factor={} must be positive and finite (0 = off)", rope.yarn_factor));
  }
  if (rope.linear_scaling != 1.f || rope.llama3_factor != 0.f) {
    reject(fmt::format("options.rope: yarn_factor={} comes alone; linear_scaling={} must be 1 and llama3_factor={} "
                       "0 (one frequency scaling at a time)", rope.yarn_factor, rope.linear_scaling, rope.llama3_factor));
  }
  if (!(rope.yarn_beta_slow > 0.f) || !(rope.yarn_beta_fast > rope.yarn_beta_slow) ||
      !std::isfinite(rope.yarn_beta_fast)) {
    reject(fmt::format("options.rope: yarn_beta_fast={} and yarn_beta_slow={} need 0 < beta_slow < beta_fast "
                       "(rotations over the original context; Hugging Face's defaults are 32 and 1)",
                       rope.yarn_beta_fast, rope.yarn_beta_slow));
  }
  if (!(rope.theta > 1.f)) {
    reject(fmt::format("options.rope.theta={} must be above 1 with yarn_factor (YaRN's ramp divides by ln theta)",
                       rope.theta));
  }
  if (rope.yarn_original_max_position <= 0) {
    reject(fmt::format("options.rope.yarn_original_max_position={} must be positive", rope.yarn_original_max_position));
  }
  if (!(rope.yarn_attention_factor >= 0.f) || !std::isfinite(rope.yarn_attention_factor)) {
    reject(fmt::format("options.rope.yarn_attention_factor={} must be positive and finite (0 = 0.1 · ln(yarn_factor) + 1)",
                       rope.yarn_attention_factor));
  }
}

// LongRoPE's (RopeOptions::longrope_*): positive finite pair factors, one
// way to its attention factor, and no other frequency scaling.
void check_longrope(const RopeOptions& rope, int rotary_dim) {
  if (rope.linear_scaling != 1.f || rope.llama3_factor != 0.f || rope.yarn_factor != 0.f) {
    reject(fmt::format("options.rope: longrope_pair_factors comes alone; linear_scaling={} must be 1, llama3_factor={} "
                       "and yarn_factor={} 0 (one frequency scaling at a time)",
                       rope.linear_scaling, rope.llama3_factor, rope.yarn_factor));
  }
  for (int pair = 0; pair < rotary_dim / 2; ++pair) {
    const float factor = rope.longrope_pair_factors[pair];
    if (!(factor > 0.f) || !std::isfinite(factor)) {
      reject(fmt::format("options.rope.longrope_pair_factors[{}]={} must be positive and finite (rotary_dim / 2 = {} "
                         "factors: the config's long_factor or short_factor)", pair, factor, rotary_dim / 2));
    }
  }
  if (!(rope.longrope_attention_factor >= 0.f) || !std::isfinite(rope.longrope_attention_factor)) {
    reject(fmt::format("options.rope.longrope_attention_factor={} must be positive and finite (0 = Hugging Face's "
                       "default from longrope_factor)", rope.longrope_attention_factor));
  }
  if (rope.longrope_attention_factor == 0.f) {
    if (!(rope.longrope_factor > 0.f) || !std::isfinite(rope.longrope_factor)) {
      reject(fmt::format("options.rope.longrope_factor={} must be positive and finite where longrope_attention_factor "
                         "is 0 (max_position_embeddings / original_max_position_embeddings, or the config's factor; "
                         "or give longrope_attention_factor)", rope.longrope_factor));
    }
    if (rope.longrope_original_max_position <= 1) {
      reject(fmt::format("options.rope.longrope_original_max_position={} must be above 1 (the default attention factor "
                         "divides by its log)", rope.longrope_original_max_position));
    }
  }
}

// LongRoPE's fields without longrope_pair_factors would be silently unused.
void check_no_longrope_scalars(const RopeOptions& rope) {
  if (rope.longrope_factor != 0.f || rope.longrope_attention_factor != 0.f) {
    reject(fmt::format("options.rope: longrope_factor={} and longrope_attention_factor={} need longrope_pair_factors "
                       "(null: no LongRoPE)", rope.longrope_factor, rope.longrope_attention_factor));
  }
}

}  // namespace

float rope_attention_factor(const RopeOptions& rope) {
  if (rope.cos != nullptr) return 1.f;
  if (rope.longrope_pair_factors != nullptr) {
    if (rope.longrope_attention_factor != 0.f) return rope.longrope_attention_factor;
    // Hugging Face's _compute_longrope_parameters' default.
    const double factor = rope.longrope_factor;
    return factor <= 1.0 ? 1.f
                         : static_cast<float>(std::sqrt(
                               1.0 + std::log(factor) / std::log(static_cast<double>(rope.longrope_original_max_position))));
  }
  if (rope.yarn_factor == 0.f) return 1.f;
  if (rope.yarn_attention_factor != 0.f) return rope.yarn_attention_factor;
  // Hugging Face's get_mscale(factor).
  return rope.yarn_factor <= 1.f ? 1.f : static_cast<float>(0.1 * std::log(static_cast<double>(rope.yarn_factor)) + 1.0);
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
  if (rope.cos != nullptr) {
    if (rope.yarn_factor != 0.f) {
      reject(fmt::format("options.rope: yarn_factor={} scales angles from theta; cos/sin tables are used as given "
                         "(build them with YaRN's frequencies and attention factor, or leave the tables out)",
                         rope.yarn_factor));
    }
    if (rope.longrope_pair_factors != nullptr) {
      reject("options.rope: longrope_pair_factors scale angles from theta; cos/sin tables are used as given (build "
             "them with LongRoPE's frequencies and attention factor, or leave the tables out)");
    }
    check_no_longrope_scalars(rope);
    return rotary_dim;
  }
  if (!(rope.theta > 0.f) || !std::isfinite(rope.theta)) {
    reject(fmt::format("options.rope.theta={} must be positive and finite", rope.theta));
  }
  if (!(rope.linear_scaling > 0.f) || !std::isfinite(rope.linear_scaling)) {
    reject(fmt::format("options.rope.linear_scaling={} must be positive and finite (1 = off)", rope.linear_scaling));
  }
  if (rope.longrope_pair_factors != nullptr) {
    check_longrope(rope, rotary_dim);
  } else {
    check_no_longrope_scalars(rope);
  }
  if (rope.yarn_factor != 0.f) check_yarn(rope);
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

// The cos/sin tables: f32 or q's dtype (FlashAttention's rotary_cos /
// rotary_sin) [positions, >= rotary_dim / 2], equal dtypes, shapes and strides.
void check_rope_tables(const RopeOptions& rope, int rotary_dim, DType q_dtype) {
  for (const TensorView* table : {rope.cos, rope.sin}) {
    const char* name = table == rope.cos ? "options.rope.cos" : "options.rope.sin";
    if (table->dtype != DType::f32 && table->dtype != q_dtype) {
      reject(fmt::format("{}: dtype {} must be f32 or q's dtype ({})", name, dtype_name(table->dtype),
                         dtype_name(q_dtype)));
    }
    if (table->ndim != 2 || table->shape[0] < 1 || table->shape[1] < rotary_dim / 2) {
      reject(fmt::format("{}: shape {} must be [positions >= 1, >= rotary_dim / 2 = {}]", name, shape_text(*table),
                         rotary_dim / 2));
    }
    if (table->strides[1] != 1) reject(fmt::format("{}: the last dimension must be contiguous (stride 1)", name));
    if (table->shape[0] > INT_MAX) reject(fmt::format("{}: more than 2^31-1 positions", name));
    const size_t entry_bytes = dtype_size(table->dtype);
    if (table->data == nullptr || reinterpret_cast<uintptr_t>(table->data) % entry_bytes != 0) {
      reject(fmt::format("{}: data pointer must be non-null and {}-byte aligned", name, entry_bytes));
    }
  }
  if (rope.sin->dtype != rope.cos->dtype) {
    reject(fmt::format("options.rope.sin: dtype {} must equal cos's ({})", dtype_name(rope.sin->dtype),
                       dtype_name(rope.cos->dtype)));
  }
  if (rope.sin->shape[0] != rope.cos->shape[0] || rope.sin->shape[1] != rope.cos->shape[1] ||
      (rope.cos->shape[0] > 1 && rope.sin->strides[0] != rope.cos->strides[0])) {
    reject(fmt::format("options.rope.sin: shape {} and strides must equal cos's ({})", shape_text(*rope.sin),
                       shape_text(*rope.cos)));
  }
}

void check_matching(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    bool value_dim_of_its_own) {
  if (k.dtype != q.dtype || v.dtype != q.dtype || out.dtype != q.dtype) {
    reject(fmt::format("k, v, out: dtypes ({}, {}, {}) must all match q's ({})", dtype_name(k.dtype),
                       dtype_name(v.dtype), dtype_name(out.dtype), dtype_name(q.dtype)));
  }
  // (k and v may have a rank other than q's: packed queries over a paged cache.)
  const int64_t q_dim = q.shape[q.ndim - 1], k_dim = k.shape[k.ndim - 1];
  if (k_dim != q_dim) reject(fmt::format("k: head_dim={} must equal q's head_dim={}", k_dim, q_dim));
  // V's head dim, which only forward and forward_varlen over K/V tensors
  // let differ from k's; out's is V's.
  const int axes = value_dim_of_its_own ? k.ndim - 1 : k.ndim;
  for (int axis = 0; axis < axes; ++axis) {
    if (v.shape[axis] != k.shape[axis]) {
      reject(fmt::format("v: shape {} must equal k's shape {}{}", shape_text(v), shape_text(k),
                         value_dim_of_its_own ? " but for head_dim" : ""));
    }
  }
  const int64_t v_dim = v.shape[v.ndim - 1];
  for (int axis = 0; axis < q.ndim; ++axis) {
    const int64_t want = axis == q.ndim - 1 ? v_dim : q.shape[axis];
    if (out.shape[axis] != want) {
      reject(fmt::format("out: shape {} must be q's shape {} with v's head_dim {}", shape_text(out), shape_text(q),
                         v_dim));
    }
  }
  const int64_t heads_q = q.shape[q.ndim - 2], heads_kv = k.shape[k.ndim - 2];
  if (heads_q % heads_kv != 0) reject(fmt::format("k: heads_kv={} must divide heads_q={}", heads_kv, heads_q));
}

}  // namespace jitattn::detail
