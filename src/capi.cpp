// capi: the C API over the C++ one. Every entry point catches everything,
// returns a status code and keeps the message for jitattn_last_error().
#include <jitattn/jitattn.h>

#include <exception>
#include <string>

#include <jitattn/jitattn.hpp>

#include "config_env.hpp"
#include "grown_struct.hpp"

namespace {

using jitattn::capi::GrownLayout;
using jitattn::capi::read_grown;

// The growing structs as this library knows them. first_size is the sizeof of jitattn 0.2.0's header, the
// first with struct_size: it never changes. known_end is where the last field ends: move it to each new
// last field (a field past it is rejected as unknown, so a forgotten update fails the field's own tests). A new
// field goes past the previous sizeof, not into the tail padding between known_end and it: a caller of an
// older header may leave that padding unset, so it is never checked, and an older library would not see it.
#define JITATTN_FIELD_END(type, field) (offsetof(type, field) + sizeof(type::field))
constexpr GrownLayout kFwdOptionsLayout{"jitattn_fwd_options", "jitattn_fwd_options_init", 200,
                                        JITATTN_FIELD_END(jitattn_fwd_options, rope_longrope_attention_factor),
                                        alignof(jitattn_fwd_options)};
constexpr GrownLayout kVarlenArgsLayout{"jitattn_varlen_args", "jitattn_varlen_args_init", 64,
                                        JITATTN_FIELD_END(jitattn_varlen_args, dynamic_splits),
                                        alignof(jitattn_varlen_args)};
constexpr GrownLayout kKVCacheArgsLayout{"jitattn_kvcache_args", "jitattn_kvcache_args_init", 96,
                                         JITATTN_FIELD_END(jitattn_kvcache_args, cache_leftpad),
                                         alignof(jitattn_kvcache_args)};
#undef JITATTN_FIELD_END
// Tripwires for the first field added to each (LP64): keep first_size, move known_end, drop the line.
static_assert(sizeof(jitattn_fwd_options) == 200, "jitattn_fwd_options grew: see kFwdOptionsLayout");
static_assert(sizeof(jitattn_varlen_args) == 64, "jitattn_varlen_args grew: see kVarlenArgsLayout");
static_assert(sizeof(jitattn_kvcache_args) == 96, "jitattn_kvcache_args grew: see kKVCacheArgsLayout");

// jitattn_fwd_options_init's values.
jitattn_fwd_options fwd_options_defaults() {
  jitattn_fwd_options options{};
  options.struct_size = sizeof(jitattn_fwd_options);
  options.window_left = -1;
  options.window_right = -1;
  options.rope_theta = 10000.f;
  options.rope_linear_scaling = 1.f;
  options.rope_llama3_low_freq_factor = 1.f;
  options.rope_llama3_high_freq_factor = 4.f;
  options.rope_llama3_original_max_position = 8192;
  options.rope_yarn_beta_fast = 32.f;
  options.rope_yarn_beta_slow = 1.f;
  options.rope_yarn_original_max_position = 4096;
  options.rope_yarn_truncate = 1;
  options.rope_longrope_original_max_position = 4096;
  options.pack_gqa = -1;
  return options;
}

thread_local std::string t_last_error;

jitattn_status status_of(jitattn::ErrorCode code) {
  switch (code) {
    case jitattn::ErrorCode::invalid_argument: return JITATTN_ERROR_INVALID_ARGUMENT;
    case jitattn::ErrorCode::unsupported: return JITATTN_ERROR_UNSUPPORTED;
    case jitattn::ErrorCode::compile_failed: return JITATTN_ERROR_COMPILE;
    case jitattn::ErrorCode::cuda_error: return JITATTN_ERROR_CUDA;
    case jitattn::ErrorCode::cache_error: return JITATTN_ERROR_CACHE;
    case jitattn::ErrorCode::graph_capture: return JITATTN_ERROR_GRAPH_CAPTURE;
    case jitattn::ErrorCode::internal: return JITATTN_ERROR_INTERNAL;
  }
  return JITATTN_ERROR_INTERNAL;
}

// Keeps `message` for jitattn_last_error(). Copying it may itself throw
// (out of memory), and nothing may leave an extern "C" function: the message
// is then empty, and the status alone says what failed.
void keep_error(const char* message) noexcept {
  try {
    t_last_error = message;
  } catch (...) {
    t_last_error.clear();  // (never allocates)
  }
}

template <typename Body>
jitattn_status guarded(Body&& body) {
  try {
    body();
    t_last_error.clear();
    return JITATTN_OK;
  } catch (const jitattn::Error& error) {
    keep_error(error.what());
    return status_of(error.code());
  } catch (const std::exception& error) {
    keep_error(error.what());
    return JITATTN_ERROR_INTERNAL;
  } catch (...) {
    keep_error("unknown error");
    return JITATTN_ERROR_INTERNAL;
  }
}

jitattn::TensorView view_of(const jitattn_tensor* tensor, const char* name) {
  if (tensor == nullptr) throw jitattn::Error(jitattn::ErrorCode::invalid_argument, std::string(name) + ": is NULL");
  if (tensor->ndim < 0 || tensor->ndim > 4) {
    throw jitattn::Error(jitattn::ErrorCode::invalid_argument,
                         std::string(name) + ": ndim=" + std::to_string(tensor->ndim) + " is not in 0..4");
  }
  if (tensor->dtype < JITATTN_F16 || tensor->dtype > JITATTN_I32) {
    throw jitattn::Error(jitattn::ErrorCode::invalid_argument,
                         std::string(name) + ": dtype=" + std::to_string(tensor->dtype) + " is not a jitattn_dtype");
  }
  jitattn::TensorView view;
  view.data = tensor->data;
  view.dtype = static_cast<jitattn::DType>(tensor->dtype);
  view.ndim = tensor->ndim;
  for (int i = 0; i < tensor->ndim; ++i) {
    view.shape[i] = tensor->shape[i];
    view.strides[i] = tensor->strides[i];
  }
  return view;
}

// The C structs of one forward call as C++ views (the options keep pointers
// into this object, so it lives for the whole call).
struct CallViews {
  CallViews(const jitattn_tensor* q_, const jitattn_tensor* k_, const jitattn_tensor* v_, const jitattn_tensor* out_,
            const jitattn_tensor* lse_, const jitattn_fwd_options* c_options, const char* k_name = "k",
            const char* v_name = "v")
      : q(view_of(q_, "q")), k(view_of(k_, k_name)), v(view_of(v_, v_name)), out(view_of(out_, "out")),
        has_lse(lse_ != nullptr) {
    if (has_lse) lse = view_of(lse_, "lse");
    if (c_options == nullptr) return;
    const jitattn_fwd_options given = read_grown(*c_options, fwd_options_defaults(), kFwdOptionsLayout, "options");
    // (<= 0 is the default; NaN and inf go on to the planner, which names them.)
    if (!(given.softmax_scale <= 0.f)) options.softmax_scale = given.softmax_scale;
    options.causal = given.causal != 0;
    options.window_left = given.window_left;
    options.window_right = given.window_right;
    options.attention_chunk = given.attention_chunk;
    options.softcap = given.softcap;
    if (given.alibi_slopes != nullptr) {
      alibi = view_of(given.alibi_slopes, "alibi_slopes");
      options.alibi_slopes = &alibi;
    }
    options.learnable_sink = optional_view(given.learnable_sink, "learnable_sink", learnable_sink);
    options.tiles = {given.block_q, given.block_kv, given.warps, given.stages,
                     given.wgmma != 0, given.persistent != 0};
    options.sm_limit = given.sm_limit;
    options.num_splits = given.num_splits;
    jitattn::RopeOptions& rope = options.rope;
    rope.style = static_cast<jitattn::RopeStyle>(given.rope_style);
    rope.rotary_dim = given.rotary_dim;
    rope.theta = given.rope_theta;
    rope.linear_scaling = given.rope_linear_scaling;
    rope.llama3_factor = given.rope_llama3_factor;
    rope.llama3_low_freq_factor = given.rope_llama3_low_freq_factor;
    rope.llama3_high_freq_factor = given.rope_llama3_high_freq_factor;
    rope.llama3_original_max_position = given.rope_llama3_original_max_position;
    rope.yarn_factor = given.rope_yarn_factor;
    rope.yarn_beta_fast = given.rope_yarn_beta_fast;
    rope.yarn_beta_slow = given.rope_yarn_beta_slow;
    rope.yarn_original_max_position = given.rope_yarn_original_max_position;
    rope.yarn_truncate = given.rope_yarn_truncate != 0;
    rope.yarn_attention_factor = given.rope_yarn_attention_factor;
    rope.longrope_pair_factors = given.rope_longrope_pair_factors;
    rope.longrope_factor = given.rope_longrope_factor;
    rope.longrope_original_max_position = given.rope_longrope_original_max_position;
    rope.longrope_attention_factor = given.rope_longrope_attention_factor;
    rope.cos = optional_view(given.rope_cos, "rope_cos", rope_cos);
    rope.sin = optional_view(given.rope_sin, "rope_sin", rope_sin);
    rope.q_offsets = optional_view(given.rope_q_offsets, "rope_q_offsets", rope_q_offsets);
    rope.k_offsets = optional_view(given.rope_k_offsets, "rope_k_offsets", rope_k_offsets);
    if (given.pack_gqa < -1 || given.pack_gqa > 1) {
      throw jitattn::Error(jitattn::ErrorCode::invalid_argument, "options.pack_gqa: must be -1 (auto), 0 or 1");
    }
    if (given.pack_gqa >= 0) options.pack_gqa = given.pack_gqa == 1;
  }
  CallViews(const CallViews&) = delete;
  CallViews& operator=(const CallViews&) = delete;
  const jitattn::TensorView* lse_pointer() const { return has_lse ? &lse : nullptr; }

  // The view of a nullable C tensor, stored in `storage`.
  static const jitattn::TensorView* optional_view(const jitattn_tensor* tensor, const char* name,
                                                  jitattn::TensorView& storage) {
    if (tensor == nullptr) return nullptr;
    storage = view_of(tensor, name);
    return &storage;
  }

  jitattn::TensorView q, k, v, out, lse, alibi, learnable_sink, rope_cos, rope_sin, rope_q_offsets, rope_k_offsets;
  bool has_lse;
  jitattn::ForwardOptions options;
};

// A C KV-cache call as C++ arguments (views stored here).
struct KVCacheViews {
  KVCacheViews(const jitattn_tensor* q, const jitattn_kvcache_args* c_args, const jitattn_tensor* out,
               const jitattn_tensor* lse, const jitattn_fwd_options* options)
      : given(read(c_args)), call(q, given.k_cache, given.v_cache, out, lse, options, "k_cache", "v_cache") {
    args.k_cache = call.k;
    args.v_cache = call.v;
    args.cache_seqlens = view_of(given.cache_seqlens, "cache_seqlens");
    args.block_table = CallViews::optional_view(given.block_table, "block_table", block_table);
    args.cache_batch_idx = CallViews::optional_view(given.cache_batch_idx, "cache_batch_idx", cache_batch_idx);
    args.cache_leftpad = CallViews::optional_view(given.cache_leftpad, "cache_leftpad", cache_leftpad);
    args.k_new = CallViews::optional_view(given.k_new, "k_new", k_new);
    args.v_new = CallViews::optional_view(given.v_new, "v_new", v_new);
    args.num_splits = given.num_splits;
    args.max_seqlen_k = given.max_seqlen_k;
    args.total_seqlen_k = given.total_seqlen_k;
    args.dynamic_splits = given.dynamic_splits != 0;
  }
  static jitattn_kvcache_args read(const jitattn_kvcache_args* c_args) {
    if (c_args == nullptr) throw jitattn::Error(jitattn::ErrorCode::invalid_argument, "args: is NULL");
    return read_grown(*c_args, jitattn_kvcache_args{}, kKVCacheArgsLayout, "args");
  }
  const jitattn_kvcache_args given;  // before `call`, which is built from it
  CallViews call;
  jitattn::TensorView block_table, cache_batch_idx, cache_leftpad, k_new, v_new;
  jitattn::KVCacheArgs args;
};

}  // namespace

extern "C" {

void jitattn_fwd_options_init_sized(jitattn_fwd_options* options, size_t struct_size) {
  jitattn::capi::write_grown(options, struct_size, fwd_options_defaults());
}

jitattn_status jitattn_fwd(const jitattn_tensor* q, const jitattn_tensor* k, const jitattn_tensor* v,
                           const jitattn_tensor* out, const jitattn_tensor* lse,
                           const jitattn_fwd_options* options, void* stream) {
  return guarded([&] {
    const CallViews views(q, k, v, out, lse, options);
    jitattn::forward(views.q, views.k, views.v, views.out, views.lse_pointer(), views.options, stream);
  });
}

jitattn_status jitattn_fwd_split(const jitattn_tensor* q, const jitattn_tensor* k, const jitattn_tensor* v,
                                 const jitattn_tensor* out, const jitattn_tensor* lse,
                                 const jitattn_fwd_options* options, void* workspace, size_t workspace_bytes,
                                 void* stream) {
  return guarded([&] {
    const CallViews views(q, k, v, out, lse, options);
    jitattn::forward(views.q, views.k, views.v, views.out, views.lse_pointer(), views.options, workspace,
                     workspace_bytes, stream);
  });
}

jitattn_status jitattn_fwd_workspace_bytes(const jitattn_tensor* q, const jitattn_tensor* k, const jitattn_tensor* v,
                                           const jitattn_tensor* out, const jitattn_tensor* lse,
                                           const jitattn_fwd_options* options, size_t* bytes) {
  return guarded([&] {
    if (bytes == nullptr) throw jitattn::Error(jitattn::ErrorCode::invalid_argument, "bytes: is NULL");
    const CallViews views(q, k, v, out, lse, options);
    *bytes = jitattn::forward_workspace_bytes(views.q, views.k, views.v, views.out, views.lse_pointer(), views.options);
  });
}

jitattn_status jitattn_fwd_varlen(const jitattn_tensor* q, const jitattn_tensor* k, const jitattn_tensor* v,
                                  const jitattn_tensor* out, const jitattn_tensor* lse,
                                  const jitattn_tensor* cu_seqlens_q, const jitattn_tensor* cu_seqlens_k,
                                  const jitattn_tensor* seqused_k, int32_t max_seqlen_q, int32_t max_seqlen_k,
                                  const jitattn_fwd_options* options, void* stream) {
  return guarded([&] {
    const CallViews views(q, k, v, out, lse, options);
    jitattn::VarlenArgs varlen;
    varlen.cu_seqlens_q = view_of(cu_seqlens_q, "cu_seqlens_q");
    varlen.cu_seqlens_k = view_of(cu_seqlens_k, "cu_seqlens_k");
    jitattn::TensorView seqused_view;
    if (seqused_k != nullptr) {
      seqused_view = view_of(seqused_k, "seqused_k");
      varlen.seqused_k = &seqused_view;
    }
    varlen.max_seqlen_q = max_seqlen_q;
    varlen.max_seqlen_k = max_seqlen_k;
    jitattn::forward_varlen(views.q, views.k, views.v, views.out, views.lse_pointer(), varlen, views.options, stream);
  });
}

namespace {

// The views of a jitattn_varlen_args (kept alive with the VarlenArgs that
// points at them).
struct VarlenViews {
  jitattn::VarlenArgs args;
  jitattn::TensorView seqused_k, block_table;

  explicit VarlenViews(const jitattn_varlen_args* c_args) {
    if (c_args == nullptr) throw jitattn::Error(jitattn::ErrorCode::invalid_argument, "args: is NULL");
    const jitattn_varlen_args given = read_grown(*c_args, jitattn_varlen_args{}, kVarlenArgsLayout, "args");
    args.cu_seqlens_q = view_of(given.cu_seqlens_q, "cu_seqlens_q");
    // NULL (allowed with block_table and seqused_k) stays an empty view.
    if (given.cu_seqlens_k != nullptr) args.cu_seqlens_k = view_of(given.cu_seqlens_k, "cu_seqlens_k");
    args.seqused_k = CallViews::optional_view(given.seqused_k, "seqused_k", seqused_k);
    args.block_table = CallViews::optional_view(given.block_table, "block_table", block_table);
    args.max_seqlen_q = given.max_seqlen_q;
    args.max_seqlen_k = given.max_seqlen_k;
    args.total_seqlen_k = given.total_seqlen_k;
    args.dynamic_splits = given.dynamic_splits != 0;
  }
  VarlenViews(const VarlenViews&) = delete;
  VarlenViews& operator=(const VarlenViews&) = delete;
};

}  // namespace

jitattn_status jitattn_fwd_varlen_split(const jitattn_tensor* q, const jitattn_tensor* k, const jitattn_tensor* v,
                                        const jitattn_tensor* out, const jitattn_tensor* lse,
                                        const jitattn_varlen_args* args, const jitattn_fwd_options* options,
                                        void* workspace, size_t workspace_bytes, void* stream) {
  return guarded([&] {
    const CallViews views(q, k, v, out, lse, options);
    const VarlenViews varlen(args);
    jitattn::forward_varlen(views.q, views.k, views.v, views.out, views.lse_pointer(), varlen.args, views.options,
                            workspace, workspace_bytes, stream);
  });
}

jitattn_status jitattn_fwd_varlen_workspace_bytes(const jitattn_tensor* q, const jitattn_tensor* k,
                                                  const jitattn_tensor* v, const jitattn_tensor* out,
                                                  const jitattn_tensor* lse, const jitattn_varlen_args* args,
                                                  const jitattn_fwd_options* options, size_t* bytes) {
  return guarded([&] {
    if (bytes == nullptr) throw jitattn::Error(jitattn::ErrorCode::invalid_argument, "bytes: is NULL");
    const CallViews views(q, k, v, out, lse, options);
    const VarlenViews varlen(args);
    *bytes = jitattn::forward_varlen_workspace_bytes(views.q, views.k, views.v, views.out, views.lse_pointer(),
                                                     varlen.args, views.options);
  });
}

jitattn_status jitattn_fwd_kvcache(const jitattn_tensor* q, const jitattn_kvcache_args* args, const jitattn_tensor* out,
                                   const jitattn_tensor* lse, const jitattn_fwd_options* options, void* workspace,
                                   size_t workspace_bytes, void* stream) {
  return guarded([&] {
    const KVCacheViews views(q, args, out, lse, options);
    jitattn::forward_kvcache(views.call.q, views.args, views.call.out, views.call.lse_pointer(), views.call.options,
                             workspace, workspace_bytes, stream);
  });
}

jitattn_status jitattn_kvcache_workspace_bytes(const jitattn_tensor* q, const jitattn_kvcache_args* args,
                                               const jitattn_tensor* out, const jitattn_tensor* lse,
                                               const jitattn_fwd_options* options, size_t* bytes) {
  return guarded([&] {
    if (bytes == nullptr) throw jitattn::Error(jitattn::ErrorCode::invalid_argument, "bytes: is NULL");
    const KVCacheViews views(q, args, out, lse, options);
    *bytes = jitattn::kvcache_workspace_bytes(views.call.q, views.args, views.call.out, views.call.lse_pointer(),
                                              views.call.options);
  });
}

jitattn_status jitattn_merge_states(const jitattn_tensor* states, const jitattn_tensor* lse, const jitattn_tensor* out,
                                    const jitattn_tensor* out_lse, void* stream) {
  return guarded([&] {
    const jitattn::TensorView states_view = view_of(states, "states"), lse_view = view_of(lse, "lse");
    const jitattn::TensorView out_view = view_of(out, "out");
    jitattn::TensorView out_lse_view;
    if (out_lse != nullptr) out_lse_view = view_of(out_lse, "out_lse");
    jitattn::merge_states(states_view, lse_view, out_view, out_lse != nullptr ? &out_lse_view : nullptr, stream);
  });
}

jitattn_status jitattn_merge_state(const jitattn_tensor* a, const jitattn_tensor* lse_a, const jitattn_tensor* b,
                                   const jitattn_tensor* lse_b, const jitattn_tensor* out,
                                   const jitattn_tensor* out_lse, void* stream) {
  return guarded([&] {
    const jitattn::TensorView a_view = view_of(a, "a"), lse_a_view = view_of(lse_a, "lse_a");
    const jitattn::TensorView b_view = view_of(b, "b"), lse_b_view = view_of(lse_b, "lse_b");
    const jitattn::TensorView out_view = view_of(out, "out");
    jitattn::TensorView out_lse_view;
    if (out_lse != nullptr) out_lse_view = view_of(out_lse, "out_lse");
    jitattn::merge_state(a_view, lse_a_view, b_view, lse_b_view, out_view, out_lse != nullptr ? &out_lse_view : nullptr,
                         stream);
  });
}

jitattn_status jitattn_warm(const char* spec, const char* arch) {
  return guarded([&] {
    if (spec == nullptr) throw jitattn::Error(jitattn::ErrorCode::invalid_argument, "spec: is NULL");
    if (arch == nullptr) throw jitattn::Error(jitattn::ErrorCode::invalid_argument, "arch: is NULL");
    jitattn::global_runtime().warm(spec, arch);
  });
}

jitattn_status jitattn_configure(const char* cache_dir, const char* template_dir, int log_level) {
  return guarded([&] {
    if (log_level < -1 || log_level > 4) {
      throw jitattn::Error(jitattn::ErrorCode::invalid_argument,
                           "log_level=" + std::to_string(log_level) + ": must be -1 (keep) or 0..4");
    }
    // The environment only for settings not given (config_env.hpp).
    jitattn::detail::GivenSettings given;
    given.cache_dir = cache_dir;
    given.template_dir = template_dir;
    if (log_level >= 0) given.log_level = static_cast<jitattn::LogLevel>(log_level);
    const jitattn::Config config = jitattn::detail::config_from_env(given);
    jitattn::configure(config);
  });
}

const char* jitattn_last_error(void) { return t_last_error.c_str(); }

const char* jitattn_version(void) { return JITATTN_VERSION_STRING; }

}  // extern "C"
