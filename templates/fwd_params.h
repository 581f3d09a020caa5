// Launch arguments of the forward kernels. This one header is compiled both by
// the host (src/plan.cpp fills it) and by NVRTC (the kernel reads it), so the
// two layouts cannot drift apart. Plain C++ types only: no toolkit headers.
#pragma once

namespace jitattn {

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
  int num_q_blocks;  // ceil(seqlen_q / block_q); the grid is num_q_blocks × heads_q × batch, flattened
  float scale;       // softmax scale applied to q·k
  float scale_log2;  // scale × log2(e): softmax runs in the exp2 domain
};

}  // namespace jitattn
