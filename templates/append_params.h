// Launch arguments of the KV-cache append kernel (templates/append.cuh),
// shared by the host (src/plan/ fills it) and NVRTC. Plain C++ types only.
#pragma once

namespace jitattn {

struct AppendParams {
  const void* k_new;  // [batch, seqlen_new, heads_kv, head_dim]
  const void* v_new;
  void* k_cache;      // [batch_cache, max_seqlen, heads_kv, head_dim] or paged [pages, page_size, ...]
  void* v_cache;
  // Strides in elements (batch, row, head); the head_dim stride is 1. For a
  // paged cache the batch stride is the page stride.
  long long k_new_strides[3];
  long long v_new_strides[3];
  long long k_cache_strides[3];
  long long v_cache_strides[3];

  // Row j of sequence b goes to cache row cache_seqlens[b] + j: of cache
  // batch kv_batch_index[b] (b when null), or of page
  // block_table[b · block_table_stride + (row >> page_shift)] (paged).
  const int* cache_seqlens;
  const int* kv_batch_index;
  const int* block_table;
  long long block_table_stride;
  int page_shift;

  int batch;
  int seqlen_new;
  int heads_kv;
  int head_dim;

  // RoPE for the new keys (the spec fixes style and rotary_dim): angles
  // position · rope_inv_freq[p], or the tables rope_cos / rope_sin
  // [rope_table_rows, rope_table_stride] at the row's position (f32 entries
  // or the element type's, as the spec says).
  float rope_inv_freq[128];
  const void* rope_cos;
  const void* rope_sin;
  long long rope_table_stride;
  int rope_table_rows;
  // AppendConfig::kRopeScaled: cos and sin from the frequencies multiplied
  // by YaRN's or LongRoPE's attention factor.
  float rope_attention_factor;
};

}  // namespace jitattn
