// plan_problem: one attention launch from a validated call. The steps, in
// order: the options' checks (check_options), the kernel and its tiles
// (choose_kernel, tiles.cpp), K/V tensor maps, the launch parameters
// (fill_params), split-KV (plan_splits, splits.cpp), a persistent grid.
#include "plan/internal.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <vector>

namespace jitattn::detail {
namespace {

// The scalar options, RoPE's tensors and the mask kind, validated.
CallFacts check_options(const Problem& problem, const ForwardOptions& options, bool varlen) {
  const int64_t batch = problem.batch, seqlen_q = problem.seqlen_q, seqlen_k = problem.seqlen_k;
  const int64_t heads_q = problem.heads_q, head_dim = problem.head_dim;
  CallFacts facts;
  facts.kernel_dim = kernel_head_dim(head_dim);
  facts.unaligned = head_dim % 8 != 0;
  if (problem.head_dim_v != head_dim) facts.value_dim = check_value_dim(head_dim, problem.head_dim_v);
  float& scale = facts.scale;
  scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (options.softmax_scale) {
    scale = *options.softmax_scale;
    if (!(scale > 0.f) || !std::isfinite(scale)) {
      reject(fmt::format("options.softmax_scale={} must be positive and finite", scale));
    }
  }
  if (options.window_left < -1) reject(fmt::format("options.window_left={} must be -1 (unbounded) or >= 0", options.window_left));
  if (options.window_right < -1) reject(fmt::format("options.window_right={} must be -1 (unbounded) or >= 0", options.window_right));
  if (options.attention_chunk < 0) {
    reject(fmt::format("options.attention_chunk={} must be >= 0 (0 = off)", options.attention_chunk));
  }
  if (!(options.softcap >= 0.f) || !std::isfinite(options.softcap)) {
    reject(fmt::format("options.softcap={} must be >= 0 (0 = off) and finite", options.softcap));
  }
  if (options.alibi_slopes != nullptr) facts.alibi_batch_stride = check_alibi(*options.alibi_slopes, batch, heads_q);
  if (options.learnable_sink != nullptr) check_learnable_sink(*options.learnable_sink, heads_q);
  const RopeOptions& rope = options.rope;
  const bool has_rope = facts.has_rope = rope.style != RopeStyle::none;
  if (!has_rope) {
    // Rotation is asked for by its style alone. A field that only means
    // something with a rotation is refused rather than ignored: FlashAttention
    // rotates whenever rotary_cos is given, so a call ported from it would
    // otherwise run unrotated without a word.
    const char* given = rope.cos != nullptr                     ? "options.rope.cos"
                        : rope.sin != nullptr                   ? "options.rope.sin"
                        : rope.q_offsets != nullptr             ? "options.rope.q_offsets"
                        : rope.k_offsets != nullptr             ? "options.rope.k_offsets"
                        : rope.longrope_pair_factors != nullptr ? "options.rope.longrope_pair_factors"
                        : rope.rotary_dim != 0                  ? "options.rope.rotary_dim"
                        : rope.llama3_factor != 0.f             ? "options.rope.llama3_factor"
                        : rope.yarn_factor != 0.f               ? "options.rope.yarn_factor"
                                                                : nullptr;
    if (given != nullptr) {
      reject(fmt::format("{} is given but options.rope.style is none: set rotate_half or interleaved to rotate q "
                         "and k (or leave the RoPE fields at their defaults)", given));
    }
  }
  const int rotary_dim = facts.rotary_dim = has_rope ? check_rope_scalars(rope, head_dim) : 0;
  if (has_rope) facts.rope_attention_factor = rope_attention_factor(rope);
  if (has_rope && rope.cos != nullptr) {
    check_rope_tables(rope, rotary_dim, problem.dtype);
    const bool offsets = rope.q_offsets != nullptr || rope.k_offsets != nullptr;
    if (!offsets && !varlen) {
      // Default positions are checkable here: keys 0 .. sk−1 and queries
      // sk − sq .. sk − 1 (a KV cache's queries sit at cache_seqlens + i,
      // never below 0).
      if (seqlen_q > seqlen_k && !problem.kvcache) {
        reject(fmt::format("options.rope: with tables, queries at negative positions (seqlen_q={} > seqlen_k={}) "
                           "need rope.q_offsets", seqlen_q, seqlen_k));
      }
      // Positions are rows of the cache: past a cache_leftpad, up to the
      // capacity, whatever a max_seqlen_k hint (counted from the pad) says.
      const int64_t positions = problem.kv_row_offset != nullptr ? problem.keys_bound : seqlen_k;
      if (rope.cos->shape[0] < positions) {
        reject(fmt::format("options.rope.cos: {} positions; the keys reach position {}", rope.cos->shape[0],
                           positions - 1));
      }
    }
  }
  if (has_rope && rope.q_offsets != nullptr) check_i32_vector("options.rope.q_offsets", *rope.q_offsets, batch, "batch");
  if (has_rope && rope.k_offsets != nullptr) check_i32_vector("options.rope.k_offsets", *rope.k_offsets, batch, "batch");

  // The mask kind: causal is a window with right bound 0; a window that
  // bounds nothing is no mask. Chunks are a local mask whose bounds also
  // depend on the row's chunk, as in FlashAttention 3 (a query of negative
  // position, sq > sk, is in chunk -1 and sees no key).
  facts.right = options.causal ? 0 : options.window_right;
  facts.left = options.window_left;
  facts.chunk = options.attention_chunk;
  facts.causal = facts.right == 0 && facts.left < 0 && facts.chunk == 0;
  facts.local = !facts.causal && (facts.left >= 0 || facts.right >= 0 || facts.chunk > 0);
  // The kernels take a local mask's sides as int bounds below 2^29, an open
  // side as one past every key: longer sequences would have it cut keys off.
  if (facts.local && problem.queries_bound + problem.keys_bound > INT_MAX / 4) {
    reject(fmt::format("options.window_left/window_right/attention_chunk: local masks are supported up to {} queries "
                       "and keys together; this call has up to {} queries and {} keys",
                       INT_MAX / 4, problem.queries_bound, problem.keys_bound));
  }
  facts.masked_like_causal = facts.causal || facts.local;
  if (facts.local) {
    const int64_t window = facts.left >= 0 && facts.right >= 0 ? int64_t{facts.left} + facts.right + 1 : 0;
    const int64_t chunk = facts.chunk;
    facts.window_span = window > 0 && chunk > 0 ? std::min(window, chunk) : std::max(window, chunk);
  }
  facts.group = problem.heads_q / problem.heads_kv;
  facts.tiles_forced = options.tiles.block_q != 0 || options.tiles.block_kv != 0 || options.tiles.warps != 0;
  return facts;
}

// The tensor maps of K and V for kernels that read them by tensor copies.
void set_tensor_maps(ForwardPlan& plan, const Problem& problem) {
  if (!plan.spec.tensor_copies()) return;
  const KernelSpec::KVStages layout = plan.spec.kv_stages();
  const bool interleaved_panels = layout == KernelSpec::KVStages::interleaved_panels;
  const bool interleaved_kv = layout == KernelSpec::KVStages::interleaved_kv;
  const auto maps = kv_maps_of(problem, plan.spec.block_kv, layout);
  if (!maps) {
    if (interleaved_kv) {
      reject(fmt::format(
          "k, v: strides (page, row, head) = ({}, {}, {}) and ({}, {}, {}) elements, {} bytes apart: {} reads a "
          "page's K and V rows by one tensor copy, which needs K and V of the same strides, a positive multiple of "
          "16 bytes below 2^40 apart, pages whose rows follow the last page's (page stride page_size × the row "
          "stride, × heads_kv with heads outermost), and a head stride of head_dim (heads side by side in a row), "
          "of twice their distance (a head's K and V side by side) or of page_size × the row stride (a head's "
          "rows side by side in a page)",
          problem.k_strides[0], problem.k_strides[1], problem.k_strides[2], problem.v_strides[0],
          problem.v_strides[1], problem.v_strides[2],
          static_cast<long long>(reinterpret_cast<intptr_t>(problem.v) - reinterpret_cast<intptr_t>(problem.k)),
          plan.spec.text()));
    }
    const bool k_fails =
        !kv_map_of(problem, problem.k, problem.k_strides, plan.spec.block_kv, false, interleaved_panels);
    const int64_t(&strides)[3] = k_fails ? problem.k_strides : problem.v_strides;
    reject(fmt::format("{}: strides (batch, row, head) = ({}, {}, {}) elements: {} reads K and V by tensor copies, "
                       "which need a positive stride below 2^40 bytes in every dimension of more than one element{}",
                       k_fails ? "k" : "v", strides[0], strides[1], strides[2], plan.spec.text(),
                       interleaved_panels ? ", and over pages a head stride of head_dim (heads side by side in a "
                                            "row) or of page_size × the row stride (a head's rows side by side in a "
                                            "page)"
                                          : ""));
  }
  plan.k_map = maps->k;
  plan.v_map = maps->v;
  plan.params.k_map_head_panels = maps->k.head_panels;
  plan.params.k_map_head_groups = maps->k.head_groups;
  plan.params.v_map_head_panels = maps->v.head_panels;
  plan.params.v_map_head_groups = maps->v.head_groups;
  plan.params.kv_map_head_pair = maps->k.head_pair;
  plan.params.kv_map_page_groups = maps->k.page_groups;
  plan.params.kv_value_first = maps->k.value_first ? 1 : 0;
}

// The launch parameters: pointers, strides, sizes, mask bounds, score
// modifiers, RoPE and the KV cache. Returns the grid before any split.
int64_t fill_params(ForwardPlan& plan, const Problem& problem, const ForwardOptions& options, const CallFacts& facts) {
  const int64_t batch = problem.batch, seqlen_q = problem.seqlen_q, seqlen_k = problem.seqlen_k;
  const int64_t heads_q = problem.heads_q, heads_kv = problem.heads_kv, head_dim = problem.head_dim;
  const int left = facts.left, right = facts.right;
  const float scale = facts.scale;
  const bool has_rope = facts.has_rope;
  const int rotary_dim = facts.rotary_dim;
  const RopeOptions& rope = options.rope;
  const int64_t rows = packed_rows(problem, plan.spec);
  if (rows > INT_MAX) reject(fmt::format("q: seqlen_q × heads_q / heads_kv = {} exceeds 2^31-1", rows));
  const int64_t num_q_blocks = (rows + plan.spec.block_q - 1) / plan.spec.block_q;
  int64_t grid = num_q_blocks * (plan.spec.pack_gqa ? heads_kv : heads_q) * batch;
  if (grid > INT_MAX) reject(fmt::format("q: batch × heads × ceil(seqlen_q / {}) = {} exceeds 2^31-1 blocks", plan.spec.block_q, grid));

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
  // overflows an int. From the bounds, not the max_seqlen hints: a hint
  // that is 0 or short must not turn a window's open side into a bound.
  const int unbounded =
      static_cast<int>(std::min<int64_t>(problem.queries_bound + problem.keys_bound, INT_MAX / 4));
  p.window_left = left < 0 ? unbounded : std::min(left, INT_MAX / 4);
  p.window_right = right < 0 ? unbounded : std::min(right, INT_MAX / 4);
  // Chunks beyond every position act alike (chunk 0 holds every key), so
  // capping them keeps the kernel's chunk ends within an int.
  p.attention_chunk = std::min(facts.chunk, INT_MAX / 4);
  if (p.attention_chunk > 0) {
    // The magic number of dividing by the chunk (FwdParams): shift =
    // ceil(log2(chunk)), magic = floor(2^32 (2^shift - chunk) / chunk) + 1.
    const uint64_t chunk = static_cast<uint64_t>(p.attention_chunk);
    int shift = 0;
    while ((uint64_t{1} << shift) < chunk) ++shift;
    p.attention_chunk_shift = shift;
    p.attention_chunk_magic = static_cast<unsigned>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - chunk)) / chunk + 1);
  }
  p.scale = scale;
  const bool rewrite_scores = plan.spec.softcap || plan.spec.alibi;
  p.scale_log2 = rewrite_scores ? 1.f : scale * 1.4426950408889634f;
  p.lse_scale = rewrite_scores ? 0.6931471805599453f : scale;
  p.softcap = options.softcap;
  p.softcap_scale = options.softcap > 0.f ? scale / options.softcap : 0.f;
  p.alibi_slopes = options.alibi_slopes != nullptr ? static_cast<const float*>(options.alibi_slopes->data) : nullptr;
  p.alibi_batch_stride = facts.alibi_batch_stride;
  p.learnable_sink =
      options.learnable_sink != nullptr ? static_cast<const float*>(options.learnable_sink->data) : nullptr;
  if (has_rope) {
    if (rope.cos != nullptr) {
      p.rope_cos = rope.cos->data;
      p.rope_sin = rope.sin->data;
      p.rope_table_stride = rope.cos->strides[0];
      p.rope_table_rows = static_cast<int>(rope.cos->shape[0]);
      p.rope_table_vectors = (reinterpret_cast<uintptr_t>(rope.cos->data) | reinterpret_cast<uintptr_t>(rope.sin->data) |
                              static_cast<uintptr_t>(rope.cos->strides[0] * dtype_size(rope.cos->dtype))) % 16 == 0;
      // Kernels that stage tables beside K read a block's rows by
      // tensor copies where a map can describe the tables (16-byte aligned,
      // rows apart, at least a block of them); otherwise from L2 as the
      // other kernels do.
      if (plan.spec.rope_table_slots() > 0 && p.rope_table_vectors && rope.cos->strides[0] > 0 &&
          rope.cos->shape[0] >= plan.spec.block_kv) {
        auto map_of = [&](const TensorView& table) {
          return rope_table_map(table.data, table.dtype, table.shape[0], table.strides[0], rotary_dim,
                                plan.spec.block_kv);
        };
        plan.rope_cos_map = map_of(*rope.cos);
        plan.rope_sin_map = map_of(*rope.sin);
        p.rope_tables_staged = 1;
      }
    } else {
      // Frequencies depend only on the options: remember the last set, so a
      // model's calls do not recompute them.
      thread_local RopeOptions last_options{};
      thread_local int last_rotary_dim = 0;
      thread_local std::vector<float> last_frequencies;
      // LongRoPE's pair factors by value: the caller may refill its array.
      thread_local std::vector<float> last_pair_factors;
      const bool longrope = rope.longrope_pair_factors != nullptr;
      const bool same = last_rotary_dim == rotary_dim && last_options.theta == rope.theta &&
                        last_options.linear_scaling == rope.linear_scaling &&
                        last_options.llama3_factor == rope.llama3_factor &&
                        last_options.llama3_low_freq_factor == rope.llama3_low_freq_factor &&
                        last_options.llama3_high_freq_factor == rope.llama3_high_freq_factor &&
                        last_options.llama3_original_max_position == rope.llama3_original_max_position &&
                        last_options.yarn_factor == rope.yarn_factor &&
                        last_options.yarn_beta_fast == rope.yarn_beta_fast &&
                        last_options.yarn_beta_slow == rope.yarn_beta_slow &&
                        last_options.yarn_original_max_position == rope.yarn_original_max_position &&
                        last_options.yarn_truncate == rope.yarn_truncate &&
                        (last_options.longrope_pair_factors != nullptr) == longrope &&
                        (!longrope || std::equal(last_pair_factors.begin(), last_pair_factors.end(),
                                                 rope.longrope_pair_factors));
      if (!same) {
        last_frequencies = rope_inv_frequencies(rope, rotary_dim);
        last_options = rope;
        last_rotary_dim = rotary_dim;
        last_pair_factors.assign(rope.longrope_pair_factors, rope.longrope_pair_factors + (longrope ? rotary_dim / 2 : 0));
      }
      std::copy(last_frequencies.begin(), last_frequencies.end(), p.rope_inv_freq);
      p.rope_attention_factor = facts.rope_attention_factor;
    }
    p.rope_q_offsets = rope.q_offsets != nullptr ? static_cast<const int*>(rope.q_offsets->data) : nullptr;
    p.rope_k_offsets = rope.k_offsets != nullptr ? static_cast<const int*>(rope.k_offsets->data) : nullptr;
    // KV cache: query i of sequence b is at cache_seqlens[b] + i.
    if (problem.kvcache) p.rope_q_offsets = problem.seqused_k;
  }
  if (problem.kvcache) {
    p.seqlen_k_added = problem.seqlen_k_added;
    p.kv_batch_index = problem.kv_batch_index;
    p.kv_row_offset = problem.kv_row_offset;
    p.block_table = problem.block_table;
    p.block_table_stride = problem.block_table_stride;
    p.page_shift = problem.page_shift;
  }
  return grid;
}

}  // namespace

std::vector<float> rope_inv_frequencies(const RopeOptions& rope, int rotary_dim) {
  std::vector<float> frequencies(rotary_dim / 2);
  const double two_pi = 6.283185307179586;
  // YaRN: the pairs between ramp_low and ramp_high blend from theta's
  // frequency (below: pairs that turn more than beta_fast times in the
  // original context) to it divided by the factor (above: fewer than
  // beta_slow turns). Pair p turns original · theta^(−2p / rotary_dim) / 2π
  // times, hence Hugging Face's find_correction_dim below, and its clamps.
  double ramp_low = 0.0, ramp_high = 0.0;
  if (rope.yarn_factor != 0.f) {
    auto pair_turning = [&](double turns) {
      return rotary_dim * std::log(rope.yarn_original_max_position / (turns * two_pi)) /
             (2.0 * std::log(static_cast<double>(rope.theta)));
    };
    ramp_low = pair_turning(rope.yarn_beta_fast);
    ramp_high = pair_turning(rope.yarn_beta_slow);
    if (rope.yarn_truncate) {
      ramp_low = std::floor(ramp_low);
      ramp_high = std::ceil(ramp_high);
    }
    ramp_low = std::max(ramp_low, 0.0);
    ramp_high = std::min(ramp_high, rotary_dim - 1.0);
    if (ramp_low == ramp_high) ramp_high += 0.001;  // as Hugging Face's linear_ramp_factor
  }
  for (int pair = 0; pair < rotary_dim / 2; ++pair) {
    double frequency = std::pow(static_cast<double>(rope.theta), -2.0 * pair / rotary_dim) / rope.linear_scaling;
    if (rope.yarn_factor != 0.f) {
      const double ramp = std::clamp((pair - ramp_low) / (ramp_high - ramp_low), 0.0, 1.0);
      frequency = frequency * (1.0 - ramp) + frequency / rope.yarn_factor * ramp;
    }
    if (rope.longrope_pair_factors != nullptr) frequency /= rope.longrope_pair_factors[pair];
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

ForwardPlan plan_problem(const Problem& problem, const ForwardOptions& options, const Arch& arch, int max_smem_bytes,
                         const TuningTable* tuning, bool varlen) {
  const CallFacts facts = check_options(problem, options, varlen);
  ForwardPlan plan;
  const KernelChoice choice = choose_kernel(plan.spec, problem, options, facts, arch, max_smem_bytes, tuning, varlen);
  set_tensor_maps(plan, problem);
  int64_t grid = fill_params(plan, problem, options, facts);
  grid = plan_splits(plan, problem, choice, grid, max_smem_bytes, varlen);
  if (plan.spec.persistent) {
    // One wave of CTAs at most, as many per SM as shared memory holds; the
    // kernel hands them the grid's tiles (FwdConfig::kPersistent).
    const int64_t ctas_per_sm = ctas_per_sm_by_smem(plan.spec.smem_bytes(), max_smem_bytes);
    int64_t sms = std::max(1, problem.sm_count);
    if (options.sm_limit > 0) sms = std::min<int64_t>(sms, options.sm_limit);
    grid = std::min<int64_t>(grid, sms * ctas_per_sm);
  }
  plan.spec.validate();
  plan.grid = static_cast<unsigned>(grid);
  return plan;
}

}  // namespace jitattn::detail
