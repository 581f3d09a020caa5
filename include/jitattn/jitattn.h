/* jitattn C API: plain structs, status codes, and jitattn_last_error().
 * Mirrors jitattn.hpp; usable from C and from Python's ctypes. */
#ifndef JITATTN_H
#define JITATTN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(JITATTN_BUILDING)
#define JITATTN_C_API __attribute__((visibility("default")))
#else
#define JITATTN_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum jitattn_status {
  JITATTN_OK = 0,
  JITATTN_ERROR_INVALID_ARGUMENT = 1,
  JITATTN_ERROR_UNSUPPORTED = 2,
  JITATTN_ERROR_COMPILE = 3,
  JITATTN_ERROR_CUDA = 4,
  JITATTN_ERROR_CACHE = 5,
  JITATTN_ERROR_GRAPH_CAPTURE = 6,
  JITATTN_ERROR_INTERNAL = 7
} jitattn_status;

typedef enum jitattn_dtype { JITATTN_F16 = 0, JITATTN_BF16 = 1, JITATTN_F32 = 2, JITATTN_I32 = 3 } jitattn_dtype;

/* Shapes and strides in elements; the last dimension must be contiguous. The
 * stride of a dimension of extent 0 or 1 is never used (any value is taken). */
typedef struct jitattn_tensor {
  void* data;
  int32_t dtype; /* jitattn_dtype */
  int32_t ndim;
  int64_t shape[4];
  int64_t strides[4];
} jitattn_tensor;

/* Structs that grow. jitattn_fwd_options, jitattn_varlen_args and jitattn_kvcache_args begin with
 * struct_size, the sizeof the caller was compiled with; their init functions below set it (and zero or
 * default every field). New fields are only ever added at a struct's end, past the previous sizeof (never
 * in its tail padding), with 0 meaning off or the default.
 * So a binary built against another jitattn.h keeps working with this library:
 *   - an older caller's struct is shorter: the fields it lacks take their defaults;
 *   - a newer caller's struct is longer: accepted while every field this library does not know is 0, else
 *     JITATTN_ERROR_UNSUPPORTED naming the first byte it does not know.
 * The library never reads past struct_size bytes, nor checks a struct's own tail padding. A struct_size of 0
 * or above 4096 (a struct never initialized) is rejected with JITATTN_ERROR_INVALID_ARGUMENT. Take a struct's
 * memory from its init function (or zero it first): a newer caller's tail padding lies where this library
 * would read a field, and C initializers need not zero padding. */

typedef struct jitattn_fwd_options {
  uint32_t struct_size; /* sizeof(jitattn_fwd_options), set by jitattn_fwd_options_init() */
  float softmax_scale;  /* <= 0: 1/sqrt(head_dim) */
  int32_t causal;       /* bottom-right aligned */
  int32_t window_left;  /* sliding window, -1 = unbounded (see jitattn.hpp) */
  int32_t window_right; /* -1 = unbounded; causal implies 0 */
  float softcap;        /* 0 = off */
  const struct jitattn_tensor* alibi_slopes; /* f32 [heads_q] or [batch, heads_q]; NULL = off */
  int32_t block_q;      /* 0: chosen by the planner */
  int32_t block_kv;     /* 0: chosen by the planner */
  int32_t warps;        /* 0: chosen by the planner */
  /* Fused RoPE (RopeOptions in jitattn.hpp). rope_style: 0 none, 1 rotate-half
   * (GPT-NeoX/Llama), 2 interleaved (GPT-J). */
  int32_t rope_style;
  int32_t rotary_dim;                 /* 0 = head_dim; a multiple of 16 */
  float rope_theta;                   /* init: 10000 */
  float rope_linear_scaling;          /* init: 1 (off) */
  float rope_llama3_factor;           /* 0 = off */
  float rope_llama3_low_freq_factor;  /* init: 1 */
  float rope_llama3_high_freq_factor; /* init: 4 */
  int32_t rope_llama3_original_max_position; /* init: 8192 */
  const struct jitattn_tensor* rope_cos;       /* f32 or q's dtype [positions, >= rotary_dim/2], or NULL */
  const struct jitattn_tensor* rope_sin;       /* with rope_cos */
  const struct jitattn_tensor* rope_q_offsets; /* i32 [batch] or NULL */
  const struct jitattn_tensor* rope_k_offsets; /* i32 [batch] or NULL */
  int32_t pack_gqa; /* -1: the planner decides; 0 off; 1 on */
  int32_t stages;   /* decode kernel pipeline depth, or the producer layout's stages (TileConfig::stages); 0: the planner */
  int32_t wgmma;    /* with forced producer tiles on sm_90a: 1 = wgmma MMA warpgroups, warps 8 or 12 (TileConfig::wgmma);
                       with a KV cache, stages > 0 and wgmma = 1 select this producer layout instead of the decode kernel */
  int32_t persistent; /* with forced wgmma tiles: 1 = a persistent grid of at most one CTA per SM (TileConfig::persistent) */
  int32_t sm_limit;   /* persistent grids use at most this many SMs; 0 = all (ForwardOptions::sm_limit) */
  int32_t num_splits; /* jitattn_fwd_split, jitattn_fwd_varlen_split: 0 = chosen by the library, 1 = no split,
                         n = forced (<= 128); jitattn_fwd and jitattn_fwd_varlen take 0 or 1, jitattn_fwd_kvcache
                         only 0 (it reads its args' num_splits) */
  int32_t attention_chunk; /* chunked local attention (ForwardOptions::attention_chunk): 0 = off */
  const struct jitattn_tensor* learnable_sink; /* f32 [heads_q] sink logits (ForwardOptions::learnable_sink); NULL = off */
  /* YaRN frequency scaling and attention factor (RopeOptions::yarn_*) */
  float rope_yarn_factor;                   /* 0 = off */
  float rope_yarn_beta_fast;                /* init: 32 */
  float rope_yarn_beta_slow;                /* init: 1 */
  int32_t rope_yarn_original_max_position;  /* init: 4096 */
  int32_t rope_yarn_truncate;               /* init: 1 (gpt-oss: 0) */
  float rope_yarn_attention_factor;         /* 0: 0.1 * ln(factor) + 1 */
  /* LongRoPE frequency scaling and attention factor (RopeOptions::longrope_*) */
  const float* rope_longrope_pair_factors;      /* host, rotary_dim / 2 (long_factor or short_factor); NULL = off */
  float rope_longrope_factor;                   /* for the default attention factor (max / original positions) */
  int32_t rope_longrope_original_max_position;  /* init: 4096 */
  float rope_longrope_attention_factor;         /* 0: sqrt(1 + ln(factor) / ln(original)) */
} jitattn_fwd_options;

/* Writes the defaults into the first struct_size bytes of options and sets options->struct_size.
 * Callers use jitattn_fwd_options_init(); bindings without a C compiler (ctypes) pass their struct's size. */
JITATTN_C_API void jitattn_fwd_options_init_sized(jitattn_fwd_options* options, size_t struct_size);
static inline void jitattn_fwd_options_init(jitattn_fwd_options* options) {
  jitattn_fwd_options_init_sized(options, sizeof *options);
}

/* out = softmax(q k^T * scale) v. q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D], out like q,
 * lse (nullable) [B, Hq, Sq] f32. stream: CUstream / cudaStream_t (NULL = default); a call runs in
 * its stream's context (jitattn.hpp, Stream).
 * v may be [B, Sk, Hkv, Dv] with Dv one of 32, 64, 96, 128, 192 below D (FlashAttention 3's hdim_v);
 * out is then [B, Sq, Hq, Dv] (Runtime::forward).
 * On error nothing is written and jitattn_last_error() says why. */
JITATTN_C_API jitattn_status jitattn_fwd(const jitattn_tensor* q, const jitattn_tensor* k,
                                         const jitattn_tensor* v, const jitattn_tensor* out,
                                         const jitattn_tensor* lse,
                                         const jitattn_fwd_options* options, void* stream);

/* jitattn_fwd with a workspace: calls whose tiles leave the GPU underused are split over
 * their keys (fp32 partial results in the workspace, then a combine kernel), like
 * FlashAttention's forward; options->num_splits may force a count. workspace: device
 * memory of at least jitattn_fwd_workspace_bytes() for the same arguments, 256-byte
 * aligned (may be NULL when that is 0). */
JITATTN_C_API jitattn_status jitattn_fwd_split(const jitattn_tensor* q, const jitattn_tensor* k,
                                               const jitattn_tensor* v, const jitattn_tensor* out,
                                               const jitattn_tensor* lse, const jitattn_fwd_options* options,
                                               void* workspace, size_t workspace_bytes, void* stream);
JITATTN_C_API jitattn_status jitattn_fwd_workspace_bytes(const jitattn_tensor* q, const jitattn_tensor* k,
                                                         const jitattn_tensor* v, const jitattn_tensor* out,
                                                         const jitattn_tensor* lse,
                                                         const jitattn_fwd_options* options, size_t* bytes);

/* Varlen (packed sequences): q [total_q, Hq, D], k/v [total_k, Hkv, D], out like q,
 * lse (nullable) f32 [Hq, total_q]; cu_seqlens_q/k i32 [batch + 1] in device memory;
 * seqused_k nullable i32 [batch]. See VarlenArgs in jitattn.hpp for the contract. */
JITATTN_C_API jitattn_status jitattn_fwd_varlen(const jitattn_tensor* q, const jitattn_tensor* k,
                                                const jitattn_tensor* v, const jitattn_tensor* out,
                                                const jitattn_tensor* lse,
                                                const jitattn_tensor* cu_seqlens_q,
                                                const jitattn_tensor* cu_seqlens_k,
                                                const jitattn_tensor* seqused_k, int32_t max_seqlen_q,
                                                int32_t max_seqlen_k, const jitattn_fwd_options* options,
                                                void* stream);

/* Varlen with a workspace, and over a paged cache (VarlenArgs in jitattn.hpp).
 * block_table NULL: k/v [total_k, Hkv, D]; else k/v paged [pages, page_size, Hkv, D]
 * (page_size a power of two) and block_table i32 [batch, max_pages]: sequence b's keys
 * are the first seqused_k[b] (else cu_seqlens_k[b+1] - cu_seqlens_k[b]) rows of its pages.
 * seqused_k and block_table may be NULL; cu_seqlens_k may be NULL when both are given. */
typedef struct jitattn_varlen_args {
  uint32_t struct_size; /* sizeof(jitattn_varlen_args), set by jitattn_varlen_args_init() */
  const struct jitattn_tensor* cu_seqlens_q;
  const struct jitattn_tensor* cu_seqlens_k;
  const struct jitattn_tensor* seqused_k;
  const struct jitattn_tensor* block_table;
  int32_t max_seqlen_q;
  int32_t max_seqlen_k;
  int64_t total_seqlen_k; /* sum of the sequences' keys if known; 0: unknown (VarlenArgs::total_seqlen_k) */
  int32_t dynamic_splits; /* nonzero: split counts chosen on the device (VarlenArgs::dynamic_splits) */
} jitattn_varlen_args;

/* Zeroes args (every field off) and sets args->struct_size. */
static inline void jitattn_varlen_args_init(jitattn_varlen_args* args) {
  memset(args, 0, sizeof *args);
  args->struct_size = (uint32_t)sizeof *args;
}

/* Calls whose tiles leave the GPU underused split over their keys (options->num_splits:
 * 0 chosen by the library, 1 no split, n forced). workspace: device memory of at least
 * jitattn_fwd_varlen_workspace_bytes() for the same arguments, 256-byte aligned (may be
 * NULL when that is 0). */
JITATTN_C_API jitattn_status jitattn_fwd_varlen_split(const jitattn_tensor* q, const jitattn_tensor* k,
                                                      const jitattn_tensor* v, const jitattn_tensor* out,
                                                      const jitattn_tensor* lse, const jitattn_varlen_args* args,
                                                      const jitattn_fwd_options* options, void* workspace,
                                                      size_t workspace_bytes, void* stream);
JITATTN_C_API jitattn_status jitattn_fwd_varlen_workspace_bytes(const jitattn_tensor* q, const jitattn_tensor* k,
                                                                const jitattn_tensor* v, const jitattn_tensor* out,
                                                                const jitattn_tensor* lse,
                                                                const jitattn_varlen_args* args,
                                                                const jitattn_fwd_options* options, size_t* bytes);

/* KV-cache attention (KVCacheArgs and Runtime::forward_kvcache in jitattn.hpp).
 * k_cache/v_cache [batch_cache, max_seqlen, Hkv, D] or paged [pages, page_size, Hkv, D];
 * cache_seqlens i32 [batch]; block_table (paged) i32 [batch, max_pages], cache_batch_idx
 * i32 [batch], cache_leftpad i32 [batch] and k_new/v_new [batch, seqlen_new, Hkv, D] may be NULL. */
typedef struct jitattn_kvcache_args {
  uint32_t struct_size; /* sizeof(jitattn_kvcache_args), set by jitattn_kvcache_args_init() */
  const struct jitattn_tensor* k_cache;
  const struct jitattn_tensor* v_cache;
  const struct jitattn_tensor* cache_seqlens;
  const struct jitattn_tensor* block_table;
  const struct jitattn_tensor* cache_batch_idx;
  const struct jitattn_tensor* k_new;
  const struct jitattn_tensor* v_new;
  int32_t num_splits;   /* 0: chosen by the library; 1: no split; n: forced (<= 128) */
  int32_t max_seqlen_k; /* longest cache_seqlens + seqlen_new if known; 0: the capacity */
  int64_t total_seqlen_k; /* sum of the keys attended (cache_seqlens + seqlen_new - cache_leftpad) if known
                             (with max_seqlen_k): splits uneven batches; 0: unknown (KVCacheArgs::total_seqlen_k) */
  int32_t dynamic_splits; /* nonzero: split counts chosen on the device from cache_seqlens, for graphs
                             replayed with other lengths (KVCacheArgs::dynamic_splits) */
  const struct jitattn_tensor* cache_leftpad; /* i32 [batch] or NULL: the cache row where sequence b's keys start
                                                 (contiguous caches; KVCacheArgs::cache_leftpad) */
} jitattn_kvcache_args;

/* Zeroes args (every field off) and sets args->struct_size. */
static inline void jitattn_kvcache_args_init(jitattn_kvcache_args* args) {
  memset(args, 0, sizeof *args);
  args->struct_size = (uint32_t)sizeof *args;
}

/* q [B, Sq, Hq, D], out like q, lse (nullable) [B, Hq, Sq] f32. workspace: device memory
 * of at least jitattn_kvcache_workspace_bytes() (may be NULL when that is 0). */
JITATTN_C_API jitattn_status jitattn_fwd_kvcache(const jitattn_tensor* q, const jitattn_kvcache_args* args,
                                                 const jitattn_tensor* out, const jitattn_tensor* lse,
                                                 const jitattn_fwd_options* options, void* workspace,
                                                 size_t workspace_bytes, void* stream);
JITATTN_C_API jitattn_status jitattn_kvcache_workspace_bytes(const jitattn_tensor* q, const jitattn_kvcache_args* args,
                                                             const jitattn_tensor* out, const jitattn_tensor* lse,
                                                             const jitattn_fwd_options* options, size_t* bytes);

/* Merge attention states (see merge_states in jitattn.hpp): states [N, rows, H, D] f32/f16/bf16,
 * lse f32 [N, rows, H] (natural log, -INFINITY = empty state; +INFINITY too), out [rows, H, D] f32/f16/bf16,
 * out_lse (nullable) f32 [rows, H]. out = sum_s exp(lse_s - out_lse) * states_s; 0 when every lse_s is -inf. */
JITATTN_C_API jitattn_status jitattn_merge_states(const jitattn_tensor* states, const jitattn_tensor* lse,
                                                  const jitattn_tensor* out, const jitattn_tensor* out_lse,
                                                  void* stream);

/* Two states in separate tensors: a, b [rows, H, D] (one dtype), lse_a, lse_b f32 [rows, H];
 * out and out_lse as jitattn_merge_states. */
JITATTN_C_API jitattn_status jitattn_merge_state(const jitattn_tensor* a, const jitattn_tensor* lse_a,
                                                 const jitattn_tensor* b, const jitattn_tensor* lse_b,
                                                 const jitattn_tensor* out, const jitattn_tensor* out_lse,
                                                 void* stream);

/* Compile or load one kernel into the cache, e.g. ("fwd.bf16.d128.br128.bc64.w8", "sm_90a")
 * or ("combine.f32.bf16", "sm_90a"). */
JITATTN_C_API jitattn_status jitattn_warm(const char* spec, const char* arch);

/* Configure the process-wide runtime before its first use. NULL keeps the
 * environment's value; cache_dir "" disables the disk cache. log_level: 0 off .. 4 debug, -1 keep.
 * An environment variable is read only for a setting given as NULL or -1. */
JITATTN_C_API jitattn_status jitattn_configure(const char* cache_dir, const char* template_dir,
                                               int log_level);

/* The message of this thread's last jitattn call: its error, or "" if it succeeded. The
 * pointer is valid until this thread's next jitattn call. */
JITATTN_C_API const char* jitattn_last_error(void);
JITATTN_C_API const char* jitattn_version(void);

#ifdef __cplusplus
}
#endif

#endif /* JITATTN_H */
