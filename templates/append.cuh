// Appends new keys and values to a KV cache before attention reads it:
// copies each new row into its cache row (contiguous or paged), rotating the
// keys with RoPE on the way (the cache holds rotated keys, as FlashAttention's
// with_kvcache leaves it). One warp per (batch, row, head): each lane moves
// one 16-byte chunk of the row (head dims up to 256).
#pragma once

#include "append_params.h"
#include "ptx.cuh"
#include "rope.cuh"

namespace jitattn {

template <class Element_, int ROPE, int ROTARY_DIM, int ROPE_TABLES, bool PAGED, bool ROPE_SCALED = false>
struct AppendConfig {
  using Element = Element_;
  static constexpr int kRope = ROPE;
  static constexpr int kRotaryDim = ROTARY_DIM;
  // Bytes of a cos/sin table entry: 4 (f32), 2 (the element type), 0 (no
  // tables: angles from the frequencies).
  static constexpr int kRopeTableBytes = ROPE_TABLES;
  // Angles from the frequencies scaled by YaRN's or LongRoPE's attention
  // factor (rope.cuh, scale_angle): the cache keeps keys rotated as Hugging
  // Face's and vLLM's scaled cos/sin caches leave them.
  static constexpr bool kRopeScaled = ROPE_SCALED;
  static constexpr bool kPaged = PAGED;
  static constexpr int kThreads = 128;  // four rows per CTA
};

template <class Cfg>
__device__ void append_kv(const AppendParams& p) {
  using Element = typename Cfg::Element;
  const int lane = threadIdx.x & 31;
  const long long row_index = static_cast<long long>(blockIdx.x) * (Cfg::kThreads / 32) + (threadIdx.x >> 5);
  if (row_index >= static_cast<long long>(p.batch) * p.seqlen_new * p.heads_kv) return;
  const int head = static_cast<int>(row_index % p.heads_kv);
  const int j = static_cast<int>(row_index / p.heads_kv % p.seqlen_new);
  const int batch = static_cast<int>(row_index / p.heads_kv / p.seqlen_new);
  const int chunks = p.head_dim / 8;
  if (lane >= chunks) return;

  const int position = p.cache_seqlens[batch] + j;
  long long k_row, v_row;  // element offsets of the destination rows
  if constexpr (Cfg::kPaged) {
    const long long page = p.block_table[batch * p.block_table_stride + (position >> p.page_shift)];
    const long long in_page = position & ((1 << p.page_shift) - 1);
    k_row = page * p.k_cache_strides[0] + in_page * p.k_cache_strides[1];
    v_row = page * p.v_cache_strides[0] + in_page * p.v_cache_strides[1];
  } else {
    const long long cache_batch = p.kv_batch_index != nullptr ? p.kv_batch_index[batch] : batch;
    k_row = cache_batch * p.k_cache_strides[0] + static_cast<long long>(position) * p.k_cache_strides[1];
    v_row = cache_batch * p.v_cache_strides[0] + static_cast<long long>(position) * p.v_cache_strides[1];
  }
  k_row += head * p.k_cache_strides[2];
  v_row += head * p.v_cache_strides[2];
  const unsigned short* k_source = static_cast<const unsigned short*>(p.k_new) + batch * p.k_new_strides[0] +
                                   j * p.k_new_strides[1] + head * p.k_new_strides[2];
  const unsigned short* v_source = static_cast<const unsigned short*>(p.v_new) + batch * p.v_new_strides[0] +
                                   j * p.v_new_strides[1] + head * p.v_new_strides[2];
  unsigned short* k_cache = static_cast<unsigned short*>(p.k_cache) + k_row;
  unsigned short* v_cache = static_cast<unsigned short*>(p.v_cache) + v_row;

  // Values are copied as they are: appended V is bit-exact.
  *reinterpret_cast<uint4*>(v_cache + lane * 8) = *reinterpret_cast<const uint4*>(v_source + lane * 8);

  uint4 key = *reinterpret_cast<const uint4*>(k_source + lane * 8);
  if constexpr (Cfg::kRope == kRopeHalf) {
    // Lane c < rotary_dim / 16 rotates its chunk with chunk c + rotary_dim / 16
    // (its partner's lane takes the partner's result from here).
    constexpr int kHalfChunks = Cfg::kRotaryDim / 16;
    const int partner_lane = lane < kHalfChunks ? lane + kHalfChunks : lane - kHalfChunks;
    uint4 partner;
    partner.x = __shfl_sync(0xffffffffu >> (32 - chunks), key.x, partner_lane);
    partner.y = __shfl_sync(0xffffffffu >> (32 - chunks), key.y, partner_lane);
    partner.z = __shfl_sync(0xffffffffu >> (32 - chunks), key.z, partner_lane);
    partner.w = __shfl_sync(0xffffffffu >> (32 - chunks), key.w, partner_lane);
    if (lane < 2 * kHalfChunks) {
      const bool first_half = lane < kHalfChunks;
      const int pair0 = (first_half ? lane : lane - kHalfChunks) * 8;
      unsigned* mine = reinterpret_cast<unsigned*>(&key);
      const unsigned* other = reinterpret_cast<const unsigned*>(&partner);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        float m0, m1, o0, o1, s0, c0, s1, c1;
        unpack2<Element>(mine[w], m0, m1);
        unpack2<Element>(other[w], o0, o1);
        rope_angle<Cfg::kRopeTableBytes, Cfg::kRopeScaled, Element>(p, position, pair0 + 2 * w, s0, c0);
        rope_angle<Cfg::kRopeTableBytes, Cfg::kRopeScaled, Element>(p, position, pair0 + 2 * w + 1, s1, c1);
        // First half: x·cos − y·sin; second half: y·cos + x·sin.
        mine[w] = first_half ? pack2<Element>(m0 * c0 - o0 * s0, m1 * c1 - o1 * s1)
                             : pack2<Element>(m0 * c0 + o0 * s0, m1 * c1 + o1 * s1);
      }
    }
  } else if constexpr (Cfg::kRope == kRopeInterleaved) {
    if (lane < Cfg::kRotaryDim / 8) {
      unsigned* words = reinterpret_cast<unsigned*>(&key);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        float x, y, s, c;
        unpack2<Element>(words[w], x, y);
        rope_angle<Cfg::kRopeTableBytes, Cfg::kRopeScaled, Element>(p, position, lane * 4 + w, s, c);
        words[w] = pack2<Element>(x * c - y * s, y * c + x * s);
      }
    }
  }
  *reinterpret_cast<uint4*>(k_cache + lane * 8) = key;
}

}  // namespace jitattn
