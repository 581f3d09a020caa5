// Launch arguments of the forward kernels. This one header is compiled both by
// the host (src/plan/ fills it) and by NVRTC (the kernel reads it), so the
// two layouts cannot drift apart. Plain C++ types only: no toolkit headers.
#pragma once

namespace jitattn {

// A CUDA tensor map (CUtensorMap: 128 opaque bytes, 64-byte aligned), encoded
// on the host by the driver (cuTensorMapEncodeTiled) and read by the kernel's
// tensor copies from its __grid_constant__ parameter.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

struct FwdParams {
  const void* q;  // [batch, seqlen_q, heads_q, head_dim]
  const void* k;  // [batch, seqlen_k, heads_kv, head_dim]
  const void* v;  // [batch, seqlen_k, heads_kv, head_dim]
  void* o;        // like q
  float* lse;     // [batch, heads_q, seqlen_q] or null

  // Strides in elements; the head_dim stride is 1.
  long long q_batch_stride, q_row_stride, q_head_stride;
  long long k_batch_stride, k_row_stride, k_head_stride;
  long long v_batch_stride, v_row_stride, v_head_stride;
  long long o_batch_stride, o_row_stride, o_head_stride;
  long long lse_batch_stride, lse_head_stride, lse_row_stride;

  int batch;
  int heads_q;
  int heads_kv;
  int heads_per_kv;  // heads_q / heads_kv: query head h reads kv head h / heads_per_kv
  int seqlen_q;
  int seqlen_k;
  // ceil(seqlen_q / block_q); the grid is num_q_blocks × heads_q × batch
  // tiles, flattened (a persistent kernel's gridDim.x CTAs walk those tiles).
  int num_q_blocks;
  int head_dim;      // the caller's head dim (<= the kernel's; the rest is zero padding)

  // Local (sliding-window) masks: query i sees keys in
  // [i + sk - sq - window_left, i + sk - sq + window_right]; both >= 0 here
  // (the host turns "unbounded" into a bound past the sequence).
  int window_left;
  int window_right;

  float scale;       // softmax scale applied to q·k
  // Factor from the kernel's running maxima to log2 units: scale × log2(e)
  // for plain scores; log2(e) when scores are rewritten (softcap, ALiBi) first.
  float scale_log2;
  float lse_scale;   // max × lse_scale + ln(sum) is the natural-log LSE
  float softcap;     // cap, when compiled with softcap
  float softcap_scale;  // scale / cap

  const float* alibi_slopes;       // [heads] or [batch, heads], when compiled with ALiBi
  long long alibi_batch_stride;    // 0 for per-head slopes

  // Varlen (packed sequences): batch strides are 0, sequence b starts at
  // row cu_seqlens_q[b] / cu_seqlens_k[b], and seqlen_q / seqlen_k above are
  // the maxima. seqused_k (optional) caps each sequence's keys. Over a paged
  // cache (varlen with block_table below) only the queries are packed;
  // sequence b's keys are its pages' first seqused_k[b] (else
  // cu_seqlens_k[b + 1] − cu_seqlens_k[b]) rows; with seqused_k,
  // cu_seqlens_k may be null there.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  const int* seqused_k;

  // RoPE, when compiled with it (the spec fixes the pairing and rotary_dim):
  // channel pair p < rotary_dim / 2 of a row at position x is rotated by the
  // angle x · rope_inv_freq[p], or by the angle whose cosine and sine are
  // rope_cos / rope_sin [x, p] with tables (f32 entries, or the element
  // type's: the spec fixes which).
  float rope_inv_freq[128];
  const void* rope_cos;  // [rope_table_rows, rope_table_stride] entries, when compiled with tables
  const void* rope_sin;
  long long rope_table_stride;
  int rope_table_rows;  // positions past the tables read their last row
  // Nonzero when both tables and their row stride (in bytes) are 16-byte
  // aligned: four pairs' cos (or sin) come in one load, eight with 16-bit
  // entries.
  int rope_table_vectors;
  // Positions: key j of sequence b is at j + rope_k_offsets[b] (0 when null);
  // query i at i + rope_q_offsets[b], or when null at i + seqlen_k - seqlen_q
  // + the key offset (the bottom-right alignment of the causal mask).
  const int* rope_q_offsets;
  const int* rope_k_offsets;

  // KV cache (with_kvcache): sequence b's keys are cache rows
  // [kv_row_offset[b], seqused_k[b] + seqlen_k_added) (seqused_k is
  // cache_seqlens; new keys were appended at its end; kv_row_offset is
  // cache_leftpad, read only by kernels compiled with it: FwdConfig::kLeftPad;
  // contiguous caches only), in cache batch kv_batch_index[b] (b when null).
  // Key j of the sequence is its row kv_row_offset[b] + j: masks and splits
  // count from there. The cache holds rotated keys, so RoPE rotates only q.
  int seqlen_k_added;
  const int* kv_batch_index;
  const int* kv_row_offset;
  // Paged cache: row r of sequence b is row r & (2^page_shift − 1) of page
  // block_table[b · block_table_stride + (r >> page_shift)]; k_batch_stride
  // and v_batch_stride are the page strides.
  const int* block_table;
  long long block_table_stride;
  int page_shift;

  // Split-KV: CTA split s attends to key blocks [s · blocks_per_split,
  // (s + 1) · blocks_per_split) and writes its normalized fp32 output and LSE
  // to partial_o [num_splits, partial_rows, heads_q, head_dim] and
  // partial_lse [num_splits, partial_rows, heads_q] (contiguous), for the
  // combine kernel to merge. partial_rows is batch × seqlen_q (query i of
  // sequence b at row b · seqlen_q + i), or varlen the packed total_q (at
  // row cu_seqlens_q[b] + i).
  // The decode kernel instead cuts each tile's own visible steps (every warp
  // one chunk) into its splits' pieces, of at least blocks_per_split steps:
  // num_splits pieces, or compiled with dynamic splits as many as its share
  // of the batch's work (split_slots shares) asks for (at most num_splits;
  // fwd_decode.cuh, find_piece). There a CTA takes the batch's piece k, not
  // a fixed tile and split, and the grid holds every piece the lengths can
  // ask for; a tile's splits left without a piece get lse = -inf.
  int num_splits;
  int blocks_per_split;
  int split_slots;
  int partial_rows;
  // Dynamic splits: CTAs resident at once (SMs × CTAs per SM). Placed in what
  // was padding before partial_o, so no other field moved.
  int wave_ctas;
  float* partial_o;
  float* partial_lse;

  // Tiled maps of K and V for kernels whose K/V blocks arrive by tensor copies
  // (FwdConfig::kTensorCopies): elements (head_dim, rows, heads[, batch]),
  // boxes of 64 channels × block_kv rows in wgmma's 128-byte-swizzled panels.
  // Varlen maps have no batch dimension (rows are the packed total). A paged
  // KV cache's map has a page's rows for rows and pages for batches, and
  // boxes of a page's rows where pages are shorter than a block; at head
  // dims of whole panels it spans K and V (k_map_head_panels below).
  TensorMap k_map;
  TensorMap v_map;
  // RoPE tables for kernels that stage them (FwdConfig::kStagedTables):
  // maps of rope_cos and rope_sin (elements rotary_dim / 2 × rope_table_rows,
  // boxes of block_kv rows, unswizzled), and nonzero when they are encoded
  // (the tables are 16-byte aligned: rope_table_vectors). Otherwise such a
  // kernel reads the tables from global memory as the others do.
  TensorMap rope_cos_map;
  TensorMap rope_sin_map;
  int rope_tables_staged;

  // kMaskChunk: the window is cut to the row's chunk of attention_chunk keys
  // (> 0 there; capped by the host so a chunk's end fits in an int). Last,
  // in the struct's tail padding: a field placed beside the window's moved
  // the scalars after it, and ptxas then spilled 32 bytes in a kernel
  // without chunks (d64 w12 KV cache, NVRTC 13.0).
  int attention_chunk;
  // n / attention_chunk for 0 <= n < 2^31 as (umulhi(n, magic) + n) >> shift
  // (Granlund and Montgomery's division by an invariant integer): the
  // kernels divide per key block and row, where a hardware-less 32-bit
  // division cost chunked calls 10% of their time (H200).
  unsigned attention_chunk_magic;
  int attention_chunk_shift;
  // kSink: f32 [heads_q], each query head's learnable sink logit (natural-log
  // units, as the scaled scores; FlashAttention's learnable_sink). Also in
  // the tail padding, so kernels without a sink keep their layout.
  const float* learnable_sink;
  // Kernels compiled with scaled angles (FwdConfig::kRopeScaled): cos and
  // sin from the frequencies are multiplied by this, YaRN's or LongRoPE's
  // attention factor (Hugging Face's attention_factor). In the tail padding too.
  float rope_attention_factor;
  // Paged maps at head dims of whole panels. Kernels that interleave
  // panels (FwdConfig::kInterleavedPanels): k_map and v_map 5-D, (64
  // channels, 8 rows, panels, 8-row groups of a page, pages), KV heads
  // merged into the panels or into the groups: KV head h's box starts at
  // panel h · *_map_head_panels and group h · *_map_head_groups. Kernels
  // that interleave K and V (kInterleavedKV): k_map alone, 5-D (64 channels,
  // 8 rows, panels, K and V, 8-row groups of every page), its base the lower
  // of K and V (V where kv_value_first), kv_map_page_groups groups a page;
  // KV heads merged into the panels, K/V or the groups: head h's box starts
  // at panel h · k_map_head_panels, K/V index h · kv_map_head_pair and group
  // h · k_map_head_groups (+ its page's first). In the tail padding too.
  int k_map_head_panels;
  int k_map_head_groups;
  int v_map_head_panels;
  int v_map_head_groups;
  int kv_map_head_pair;
  int kv_map_page_groups;
  int kv_value_first;
};

}  // namespace jitattn
