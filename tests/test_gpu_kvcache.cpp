// forward_kvcache on a GPU, modelled on FlashAttention's kvcache and split-KV
// tests: contiguous and paged caches (pages shuffled), random cache_seqlens,
// optional cache_batch_idx and cache_leftpad, new keys/values appended in the kernel with RoPE
// (both styles, partial rotary dims, frequencies or tables), split counts 1,
// 3 and the heuristic, MHA/GQA/MQA. The references append on the host, rotate
// the queries at cache_seqlens + i and run plain attention per sequence
// (float64, and 16-bit rounding for the yardstick). After the call the cache
// itself is checked: appended values bit-exact, appended keys within one
// rounding of the host rotation, every other row untouched. Inputs are fresh
// random values (the seed is printed with every failure); outputs, LSE and
// workspace are poisoned first.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "plan.hpp"

using namespace jitattn;
using namespace jitattn::test;

namespace {

struct Case {
  DType dtype = DType::bf16;
  int batch = 2, seqlen_q = 1, seqlen_k = 128, heads_q = 6, heads_kv = 2, head_dim = 128;
  bool causal = true;
  int window_left = -1;
  int attention_chunk = 0;  // ForwardOptions::attention_chunk
  std::vector<float> learnable_sink;  // ForwardOptions::learnable_sink: heads_q logits, or empty (off)
  bool append = false;  // seqlen_new = seqlen_q new rows
  RopeStyle rope = RopeStyle::none;
  double rotary_fraction = 1.0;
  bool tables = false;
  bool tables16 = false;  // the tables in q's dtype (FlashAttention's rotary_cos / rotary_sin), not f32
  // YaRN angles (theta 150000, an original context of 256 positions): this
  // factor (0 = off); or LongRoPE's (rotation_of's pair factors), this
  // factor (0 = off) over 4096 original positions. Either with this
  // attention factor (0: Hugging Face's default).
  double yarn_factor = 0.0;
  double longrope_factor = 0.0;
  double attention_factor = 0.0;
  int page_size = 0;  // 0: contiguous cache
  // Paged: each page [heads_kv, page_size, head_dim] ([num_pages, heads,
  // page_size, head_dim] storage viewed as FlashAttention's [num_pages,
  // page_size, heads, head_dim]), as FlashInfer's HND caches.
  bool heads_outer_pages = false;
  // Paged: where K's and V's pages lie (kernels at head dim 64 read both by
  // one tensor copy through a map that spans them: paged_pair_map).
  //   separate: two allocations;
  //   pool_k_first / pool_v_first: one allocation, the other tensor's pages
  //     after the first's (vLLM's [2, num_pages, ...]);
  //   heads_paired: one allocation of [num_pages, page_size, heads_kv, 2,
  //     head_dim], a head's K and V side by side;
  //   one_tensor: V is K (the same values; no appends), which no map of
  //     both describes: the planner's two-stage tiles copy them apart.
  enum class Storage { separate, pool_k_first, pool_v_first, heads_paired, one_tensor } kv_storage = Storage::separate;
  bool batch_index = false;
  // cache_leftpad (contiguous caches): each sequence's keys start at a random
  // row of its cache (one at its cache_seqlens: only new keys, or none).
  bool leftpad = false;
  int num_splits = 0;
  // One sequence at seqlen_k, the others at most an eighth of it, and the
  // call told their total (KVCacheArgs::total_seqlen_k) and longest.
  bool uneven = false;
  // KVCacheArgs::dynamic_splits: split counts chosen on the device.
  bool dynamic = false;
  // Every sequence at the full length (seqlen_k), so that a graph replayed
  // with other lengths reads no NaN-poisoned row of an unused tail.
  bool full_lengths = false;
  // Forced kernel tiles (stages > 0: the decode kernel, or with wgmma the
  // producer layout); zeros: the planner's.
  TileConfig tiles{};
  bool gpu_reference = false;  // check_in_groups' field; the references here are CPU ones
};

std::string describe(const Case& c, const std::string& spec, uint64_t seed) {
  return fmt::format(
      "{} {} batch={} seqlen_q={} seqlen_k={} heads={}/{} head_dim={} causal={} window_left={} chunk={} sinks={} append={} rope={} "
      "fraction={} yarn={} longrope={} attention_factor={} tables={}{} page_size={}{} cache_batch_idx={} leftpad={} num_splits={} uneven={} dynamic={} tiles={}x{}x{}x{} "
      "seed={}",
      spec.empty() ? "(no spec)" : spec, c.dtype == DType::bf16 ? "bf16" : "f16", c.batch, c.seqlen_q, c.seqlen_k,
      c.heads_q, c.heads_kv, c.head_dim, c.causal, c.window_left, c.attention_chunk,
      c.learnable_sink.empty() ? "off" : fmt::format("[{}]", fmt::join(c.learnable_sink, ", ")), c.append,
      static_cast<int>(c.rope),
      c.rotary_fraction, c.yarn_factor, c.longrope_factor, c.attention_factor, c.tables, c.tables16 ? "(16-bit)" : "", c.page_size,
      std::string(c.heads_outer_pages ? " (heads outer)" : "") +
          (c.kv_storage == Case::Storage::separate      ? ""
           : c.kv_storage == Case::Storage::pool_k_first ? " (K, V in one pool)"
           : c.kv_storage == Case::Storage::pool_v_first ? " (V, K in one pool)"
           : c.kv_storage == Case::Storage::heads_paired ? " (K, V side by side per head)"
                                                         : " (V is K)"),
      c.batch_index, c.leftpad, c.num_splits,
      c.uneven, c.dynamic, c.tiles.block_q, c.tiles.block_kv,
      c.tiles.warps, c.tiles.stages, seed);
}

int rotary_dim_of(const Case& c) { return static_cast<int>(c.rotary_fraction * c.head_dim) / 16 * 16; }

RopeReference rotation_of(const Case& c) {
  RopeReference r;
  r.style = c.rope;
  r.rotary_dim = rotary_dim_of(c);
  if (c.yarn_factor != 0.0) {
    r.theta = 150000.0;
    r.yarn_factor = c.yarn_factor;
    r.yarn_original_max_position = 256;
    r.yarn_attention_factor = c.attention_factor;
  }
  if (c.longrope_factor != 0.0) {
    // Phi's shape of long_factor: from 1 at the fastest pair to tens at the
    // slowest, so that positions of a few thousand turn the slow pairs
    // visibly less than theta alone would.
    const int pairs = r.rotary_dim / 2;
    for (int p = 0; p < pairs; ++p) r.longrope_pair_factors.push_back(1.0 + 40.0 * p * p / (pairs * pairs));
    r.longrope_factor = c.longrope_factor;
    r.longrope_attention_factor = c.attention_factor;
  }
  return r;
}

std::unique_ptr<DeviceBuffer> upload(const void* data, size_t bytes) {
  auto buffer = std::make_unique<DeviceBuffer>(std::max<size_t>(bytes, 4));
  buffer->upload(data, bytes);
  return buffer;
}

// The cache as the host models it: per sequence b, logical rows
// [0, capacity) of [heads_kv, head_dim] floats, stored in pages or in a
// cache batch.
struct Inputs {
  int seqlen_new = 0;
  int capacity = 0;      // rows per sequence
  int cache_batches = 0; // contiguous: batch of the cache tensor
  int num_pages = 0;
  std::vector<int> cache_seqlens, batch_index, block_table;
  std::vector<int> leftpad;  // empty without cache_leftpad
  // Sequence b's first cached row (its cache_leftpad) and key count.
  int first_row(int b) const { return leftpad.empty() ? 0 : leftpad[b]; }
  int keys(int b) const { return cache_seqlens[b] - first_row(b) + seqlen_new; }
  std::vector<float> q, k_new, v_new;
  std::vector<float> k_store, v_store;  // the cache tensors' logical contents
  std::unique_ptr<DeviceTensor> dq, dk_new, dv_new, dk_cache, dv_cache;
  // Case::kv_storage other than separate: one allocation holding both, and
  // K's and V's views of it.
  std::unique_ptr<DeviceTensor> dkv_pool;
  TensorView k_cache_view, v_cache_view;
  std::unique_ptr<DeviceBuffer> seqlens, indices, pads, table, cos, sin, sinks;
  RopeTables tables;

  // Offset in k_store/v_store of (sequence b, logical row, head 0, channel 0).
  size_t at(const Case& c, int b, int row) const {
    if (c.page_size > 0) {
      const int page = block_table[static_cast<size_t>(b) * (capacity / c.page_size) + row / c.page_size];
      return ((static_cast<size_t>(page) * c.page_size + row % c.page_size) * c.heads_kv) * c.head_dim;
    }
    const int cache_batch = batch_index.empty() ? b : batch_index[b];
    return ((static_cast<size_t>(cache_batch) * capacity + row) * c.heads_kv) * c.head_dim;
  }
};

Inputs make_inputs(const Case& c, std::mt19937_64& rng) {
  Inputs in;
  in.seqlen_new = c.append ? c.seqlen_q : 0;
  // Room for the longest sequence, rounded to whole pages.
  in.capacity = c.seqlen_k;
  if (c.page_size > 0) in.capacity = (c.seqlen_k + c.page_size - 1) / c.page_size * c.page_size;
  std::uniform_int_distribution<int> length(c.uneven ? 0 : std::max(0, c.seqlen_k - in.seqlen_new - c.seqlen_k / 3),
                                            c.uneven ? c.seqlen_k / 8 : c.seqlen_k - in.seqlen_new);
  for (int b = 0; b < c.batch; ++b) in.cache_seqlens.push_back(length(rng));
  in.cache_seqlens[0] = c.seqlen_k - in.seqlen_new;  // one sequence at the full length
  if (c.full_lengths) std::fill(in.cache_seqlens.begin(), in.cache_seqlens.end(), c.seqlen_k - in.seqlen_new);
  if (c.leftpad) {
    for (int b = 0; b < c.batch; ++b) in.leftpad.push_back(std::uniform_int_distribution<int>(0, in.cache_seqlens[b])(rng));
    if (c.batch > 1) in.leftpad[1] = in.cache_seqlens[1];  // every cached row padding
  }
  const size_t row = static_cast<size_t>(c.heads_kv) * c.head_dim;
  if (c.page_size > 0) {
    const int pages_per_sequence = in.capacity / c.page_size;
    in.num_pages = pages_per_sequence * c.batch + 3;  // a few pages nobody uses
    std::vector<int> pages(in.num_pages);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    in.block_table.assign(pages.begin(), pages.begin() + pages_per_sequence * c.batch);
    in.k_store = random_values(static_cast<size_t>(in.num_pages) * c.page_size * row, c.dtype, rng);
  } else {
    in.cache_batches = c.batch + (c.batch_index ? 2 : 0);
    if (c.batch_index) {
      std::vector<int> order(in.cache_batches);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      in.batch_index.assign(order.begin(), order.begin() + c.batch);
    }
    in.k_store = random_values(static_cast<size_t>(in.cache_batches) * in.capacity * row, c.dtype, rng);
  }
  in.v_store = random_values(in.k_store.size(), c.dtype, rng);
  if (c.kv_storage == Case::Storage::one_tensor) in.v_store = in.k_store;
  // Rows no sequence uses (before its cache_leftpad, past its cache_seqlens
  // + seqlen_new, unused pages and cache batches) hold NaN, as freshly
  // allocated memory may: a
  // kernel that multiplies a P of 0 by such a V row, or appends into the
  // wrong row, shows NaN. Rows the append writes stay NaN until it does.
  const size_t row_count = in.k_store.size() / row;
  std::vector<char> live(row_count, 0);
  for (int b = 0; b < c.batch; ++b) {
    for (int j = in.first_row(b); j < in.cache_seqlens[b]; ++j) live[in.at(c, b, j) / row] = 1;
  }
  for (size_t r = 0; r < row_count; ++r) {
    if (live[r]) continue;
    std::fill_n(in.k_store.begin() + r * row, row, std::nanf(""));
    std::fill_n(in.v_store.begin() + r * row, row, std::nanf(""));
  }
  if (c.page_size > 0) {
    // Table entries past a sequence's pages may be unset: they point far
    // past the cache, so a kernel that read through one would fault.
    const int pages_per_sequence = in.capacity / c.page_size;
    for (int b = 0; b < c.batch; ++b) {
      const int used = (in.cache_seqlens[b] + in.seqlen_new + c.page_size - 1) / c.page_size;
      for (int page = used; page < pages_per_sequence; ++page) {
        in.block_table[static_cast<size_t>(b) * pages_per_sequence + page] = 1 << 28;
      }
    }
  }
  in.q = random_values(static_cast<size_t>(c.batch) * c.seqlen_q * c.heads_q * c.head_dim, c.dtype, rng);
  const int64_t q_shape[4] = {c.batch, c.seqlen_q, c.heads_q, c.head_dim};
  int64_t q_strides[4];
  padded_strides(q_shape, q_strides);
  in.dq = std::make_unique<DeviceTensor>(in.q, c.dtype, q_shape, q_strides);
  if (c.append) {
    in.k_new = random_values(static_cast<size_t>(c.batch) * in.seqlen_new * row, c.dtype, rng);
    in.v_new = random_values(in.k_new.size(), c.dtype, rng);
    const int64_t shape[4] = {c.batch, in.seqlen_new, c.heads_kv, c.head_dim};
    int64_t strides[4];
    heads_major_strides(shape, strides);
    in.dk_new = std::make_unique<DeviceTensor>(in.k_new, c.dtype, shape, strides);
    in.dv_new = std::make_unique<DeviceTensor>(in.v_new, c.dtype, shape, strides);
  }
  const int64_t cache_shape[4] = {c.page_size > 0 ? in.num_pages : in.cache_batches,
                                  c.page_size > 0 ? c.page_size : in.capacity, c.heads_kv, c.head_dim};
  int64_t cache_strides[4];
  if (c.page_size > 0 && c.heads_outer_pages) {
    heads_major_strides(cache_shape, cache_strides);
  } else {
    contiguous_strides(cache_shape, cache_strides);
  }
  if (c.kv_storage == Case::Storage::one_tensor) {
    REQUIRE_FALSE(c.append);  // K's and V's appended rows would be one row
    in.dk_cache = std::make_unique<DeviceTensor>(in.k_store, c.dtype, cache_shape, cache_strides);
    in.k_cache_view = in.v_cache_view = in.dk_cache->view();
  } else if (c.page_size == 0 || c.kv_storage == Case::Storage::separate) {
    in.dk_cache = std::make_unique<DeviceTensor>(in.k_store, c.dtype, cache_shape, cache_strides);
    in.dv_cache = std::make_unique<DeviceTensor>(in.v_store, c.dtype, cache_shape, cache_strides);
    in.k_cache_view = in.dk_cache->view();
    in.v_cache_view = in.dv_cache->view();
  } else if (c.kv_storage == Case::Storage::heads_paired) {
    // [pages, page_size, heads, 2 × head_dim]: K's channels, then V's.
    const int64_t pool_shape[4] = {cache_shape[0], cache_shape[1], cache_shape[2], 2 * c.head_dim};
    int64_t pool_strides[4];
    contiguous_strides(pool_shape, pool_strides);
    std::vector<float> pool(2 * in.k_store.size());
    for (size_t r = 0; r < in.k_store.size() / c.head_dim; ++r) {
      std::copy_n(in.k_store.begin() + r * c.head_dim, c.head_dim, pool.begin() + 2 * r * c.head_dim);
      std::copy_n(in.v_store.begin() + r * c.head_dim, c.head_dim, pool.begin() + (2 * r + 1) * c.head_dim);
    }
    in.dkv_pool = std::make_unique<DeviceTensor>(pool, c.dtype, pool_shape, pool_strides);
    in.k_cache_view = in.v_cache_view = in.dkv_pool->view();
    in.k_cache_view.shape[3] = in.v_cache_view.shape[3] = c.head_dim;
    in.v_cache_view.data = static_cast<char*>(in.v_cache_view.data) + c.head_dim * 2;
  } else {
    // [2 × pages, page_size, heads, head_dim]: the first tensor's pages, then the other's.
    const bool k_first = c.kv_storage == Case::Storage::pool_k_first;
    const int64_t pool_shape[4] = {2 * cache_shape[0], cache_shape[1], cache_shape[2], cache_shape[3]};
    int64_t pool_strides[4];
    if (c.heads_outer_pages) {
      heads_major_strides(pool_shape, pool_strides);
    } else {
      contiguous_strides(pool_shape, pool_strides);
    }
    std::vector<float> pool = k_first ? in.k_store : in.v_store;
    const std::vector<float>& second = k_first ? in.v_store : in.k_store;
    pool.insert(pool.end(), second.begin(), second.end());
    in.dkv_pool = std::make_unique<DeviceTensor>(pool, c.dtype, pool_shape, pool_strides);
    in.k_cache_view = in.v_cache_view = in.dkv_pool->view();
    in.k_cache_view.shape[0] = in.v_cache_view.shape[0] = cache_shape[0];
    char* const second_pages = static_cast<char*>(in.k_cache_view.data) + cache_shape[0] * pool_strides[0] * 2;
    (k_first ? in.v_cache_view : in.k_cache_view).data = second_pages;
  }
  in.seqlens = upload(in.cache_seqlens.data(), in.cache_seqlens.size() * 4);
  if (!in.batch_index.empty()) in.indices = upload(in.batch_index.data(), in.batch_index.size() * 4);
  if (!in.leftpad.empty()) in.pads = upload(in.leftpad.data(), in.leftpad.size() * 4);
  if (!c.learnable_sink.empty()) in.sinks = upload(c.learnable_sink.data(), c.learnable_sink.size() * 4);
  if (!in.block_table.empty()) in.table = upload(in.block_table.data(), in.block_table.size() * 4);
  if (c.rope != RopeStyle::none && c.tables) {
    in.tables = rope_tables(rotation_of(c), c.head_dim, c.seqlen_k + 1);
    if (c.tables16) round_tables(in.tables, c.dtype);
    const std::vector<unsigned char> cos_bytes = table_bytes(in.tables.cos, in.tables.dtype);
    const std::vector<unsigned char> sin_bytes = table_bytes(in.tables.sin, in.tables.dtype);
    in.cos = upload(cos_bytes.data(), cos_bytes.size());
    in.sin = upload(sin_bytes.data(), sin_bytes.size());
  }
  return in;
}

// New keys after the append as the references see them: rotated at
// cache_seqlens[b] + j (exact or rounded), else as given.
std::vector<float> appended_keys(const Case& c, const Inputs& in, bool exact) {
  std::vector<float> keys = in.k_new;
  if (c.rope != RopeStyle::none && c.append) {
    rotate_reference(keys, c.batch, in.seqlen_new, c.heads_kv, c.head_dim, rotation_of(c),
                     c.tables ? &in.tables : nullptr, [&](int b, int j) { return in.cache_seqlens[b] + j; }, exact,
                     c.dtype);
  }
  return keys;
}

References make_references(const Case& c, const Inputs& in) {
  References r;
  const size_t row = static_cast<size_t>(c.heads_kv) * c.head_dim;
  const size_t q_row = static_cast<size_t>(c.heads_q) * c.head_dim;
  r.exact.out.assign(static_cast<size_t>(c.batch) * c.seqlen_q * q_row, 0);
  r.exact.lse.assign(static_cast<size_t>(c.batch) * c.heads_q * c.seqlen_q, 0);
  r.rounded = r.exact;
  const std::vector<float> keys_new[2] = {appended_keys(c, in, true), appended_keys(c, in, false)};  // exact, rounded
  for (int b = 0; b < c.batch; ++b) {
    const int seqlen_k = in.keys(b), first_row = in.first_row(b);
    AttentionShape shape = AttentionShape::dense(1, c.seqlen_q, seqlen_k, c.heads_q, c.heads_kv, c.head_dim, c.causal);
    shape.window_left = c.window_left;
    shape.attention_chunk = c.attention_chunk;
    shape.learnable_sink = c.learnable_sink;
    std::vector<float> q[2], k[2], v(static_cast<size_t>(seqlen_k) * row);  // q, k: [0] exact, [1] rounded
    for (int rounded = 0; rounded < 2; ++rounded) {
      q[rounded].assign(in.q.begin() + b * c.seqlen_q * q_row, in.q.begin() + (b + 1) * c.seqlen_q * q_row);
      if (c.rope != RopeStyle::none) {
        rotate_reference(q[rounded], 1, c.seqlen_q, c.heads_q, c.head_dim, rotation_of(c),
                         c.tables ? &in.tables : nullptr, [&](int, int i) { return in.cache_seqlens[b] + i; },
                         rounded == 0, c.dtype);
      }
      k[rounded].resize(v.size());
      // Key j is cache row first_row + j: cached, else appended.
      for (int j = 0; j < seqlen_k; ++j) {
        const float* k_source;
        const float* v_source;
        const int cache_row = first_row + j;
        if (cache_row < in.cache_seqlens[b]) {
          k_source = in.k_store.data() + in.at(c, b, cache_row);
          v_source = in.v_store.data() + in.at(c, b, cache_row);
        } else {
          const size_t n = (static_cast<size_t>(b) * in.seqlen_new + (cache_row - in.cache_seqlens[b])) * row;
          k_source = keys_new[rounded].data() + n;
          v_source = in.v_new.data() + n;
        }
        std::copy(k_source, k_source + row, k[rounded].begin() + j * row);
        std::copy(v_source, v_source + row, v.begin() + j * row);
      }
    }
    for (int rounded = 0; rounded < 2; ++rounded) {
      const ReferenceOutput o = rounded ? attention_16bit(shape, q[1], k[1], v, c.dtype) : attention_exact(shape, q[0], k[0], v);
      ReferenceOutput& into = rounded ? r.rounded : r.exact;
      std::copy(o.out.begin(), o.out.end(), into.out.begin() + b * c.seqlen_q * q_row);
      std::copy(o.lse.begin(), o.lse.end(), into.lse.begin() + static_cast<size_t>(b) * c.heads_q * c.seqlen_q);
    }
    if (c.rope != RopeStyle::none) {
      r.rounded.logit_rounding = std::max(r.rounded.logit_rounding, logit_rounding(shape, q[0], k[0], q[1], k[1]));
    }
  }
  return r;
}

struct Run {
  std::vector<float> out, lse;
  std::string spec;
  std::string repeat_mismatch;  // launch_repeated: a repeat that read back other bits
};

struct CallViews {
  KVCacheArgs args;
  TensorView block_table, batch_index, leftpad, k_new, v_new, cos, sin, sinks;
  std::vector<float> longrope_pair_factors;
  ForwardOptions options;
};

void fill_call(const Case& c, const Inputs& in, CallViews& v) {
  v.args.k_cache = in.k_cache_view;
  v.args.v_cache = in.v_cache_view;
  v.args.cache_seqlens = TensorView::contiguous(in.seqlens->get(), DType::i32, {c.batch});
  if (in.table) {
    v.block_table = TensorView::contiguous(in.table->get(), DType::i32, {c.batch, in.capacity / c.page_size});
    v.args.block_table = &v.block_table;
  }
  if (in.indices) {
    v.batch_index = TensorView::contiguous(in.indices->get(), DType::i32, {c.batch});
    v.args.cache_batch_idx = &v.batch_index;
  }
  if (in.pads) {
    v.leftpad = TensorView::contiguous(in.pads->get(), DType::i32, {c.batch});
    v.args.cache_leftpad = &v.leftpad;
  }
  if (c.append) {
    v.k_new = in.dk_new->view();
    v.v_new = in.dv_new->view();
    v.args.k_new = &v.k_new;
    v.args.v_new = &v.v_new;
  }
  v.args.num_splits = c.num_splits;
  v.args.dynamic_splits = c.dynamic;
  v.options.tiles = c.tiles;
  v.args.max_seqlen_k = c.seqlen_k;
  if (c.uneven) {
    for (int b = 0; b < c.batch; ++b) v.args.total_seqlen_k += in.keys(b);
  }
  v.options.causal = c.causal;
  v.options.window_left = c.window_left;
  v.options.attention_chunk = c.attention_chunk;
  if (in.sinks) {
    v.sinks = TensorView::contiguous(in.sinks->get(), DType::f32, {c.heads_q});
    v.options.learnable_sink = &v.sinks;
  }
  if (c.rope != RopeStyle::none) {
    rotation_of(c).set_options(v.options.rope, v.longrope_pair_factors);
    if (in.cos) {
      v.cos = TensorView::contiguous(in.cos->get(), in.tables.dtype, {in.tables.positions, in.tables.pairs});
      v.sin = TensorView::contiguous(in.sin->get(), in.tables.dtype, {in.tables.positions, in.tables.pairs});
      v.options.rope.cos = &v.cos;
      v.options.rope.sin = &v.sin;
    }
  }
}

// Builds a case's inputs (from `seed`) and call views and hands both to
// `inspect`: for checks of what the planner makes of a call before it runs.
template <class Inspect>
void inspect_call(const Case& c, uint64_t seed, Inspect&& inspect) {
  std::mt19937_64 inputs_rng(seed);
  const Inputs in = make_inputs(c, inputs_rng);
  CallViews v;
  fill_call(c, in, v);
  inspect(in, v);
}

// The plan of a case's call (with a workspace) on this GPU.
detail::KVCachePlan plan_on_this_gpu(const Inputs& in, const CallViews& v) {
  const TensorView q = in.dq->view();
  return detail::plan_kvcache(q, v.args, q, nullptr, v.options, nullptr, 0, true, detail::Arch::parse(current_arch()),
                              current_max_smem_per_block(), current_sm_count());
}

// What the kernels of scaled-angle cases (YaRN, LongRoPE) were: the
// attention's and the append's .rope_scaled exactly where the attention
// factor is not 1.
void check_scaled_kernels(const std::vector<Case>& cases, uint64_t seed) {
  for (const Case& c : cases) {
    inspect_call(c, seed, [&](const Inputs& in, CallViews& v) {
      const detail::KVCachePlan plan = plan_on_this_gpu(in, v);
      const bool scaled = rotation_of(c).attention_factor() != 1.0;
      CHECK_MESSAGE(plan.attention.spec.rope_scaled == scaled, describe(c, plan.attention.spec.text(), seed));
      CHECK_MESSAGE(plan.append.spec.rope_scaled == scaled, describe(c, plan.append.spec.text(), seed));
    });
  }
}

// Checks the cache after the call: appended rows as the host rotation says
// (values bit-exact, keys within one 16-bit rounding), everything else as
// uploaded. Returns a description of the first mismatch, or "".
std::string check_cache(const Case& c, const Inputs& in) {
  std::vector<float> k_after, v_after;
  if (in.dkv_pool) {
    // Back from the pool's logical order (Case::kv_storage).
    const std::vector<float> pool = in.dkv_pool->read();
    if (c.kv_storage == Case::Storage::heads_paired) {
      for (size_t r = 0; r < pool.size() / (2 * c.head_dim); ++r) {
        k_after.insert(k_after.end(), pool.begin() + 2 * r * c.head_dim, pool.begin() + (2 * r + 1) * c.head_dim);
        v_after.insert(v_after.end(), pool.begin() + (2 * r + 1) * c.head_dim, pool.begin() + (2 * r + 2) * c.head_dim);
      }
    } else {
      const auto middle = pool.begin() + static_cast<std::ptrdiff_t>(pool.size() / 2);
      std::vector<float> first(pool.begin(), middle), second(middle, pool.end());
      k_after = c.kv_storage == Case::Storage::pool_k_first ? first : second;
      v_after = c.kv_storage == Case::Storage::pool_k_first ? second : first;
    }
  } else {
    k_after = in.dk_cache->read();
    v_after = in.dv_cache ? in.dv_cache->read() : k_after;
  }
  std::vector<float> k_want = in.k_store, v_want = in.v_store;
  const std::vector<float> keys_new = appended_keys(c, in, false);
  const size_t row = static_cast<size_t>(c.heads_kv) * c.head_dim;
  std::vector<char> appended(k_want.size(), 0);
  for (int b = 0; b < c.batch; ++b) {
    for (int j = 0; j < in.seqlen_new; ++j) {
      const size_t to = in.at(c, b, in.cache_seqlens[b] + j);
      const size_t from = (static_cast<size_t>(b) * in.seqlen_new + j) * row;
      std::copy(keys_new.begin() + from, keys_new.begin() + from + row, k_want.begin() + to);
      std::copy(in.v_new.begin() + from, in.v_new.begin() + from + row, v_want.begin() + to);
      std::fill(appended.begin() + to, appended.begin() + to + row, 1);
    }
  }
  const double ulp = c.dtype == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
  for (size_t i = 0; i < k_want.size(); ++i) {
    if (v_after[i] != v_want[i] && !(std::isnan(v_after[i]) && std::isnan(v_want[i]))) {
      return fmt::format("v_cache element {} is {} (want {}; appended row: {})", i, v_after[i], v_want[i], appended[i]);
    }
    const bool key_ok = appended[i] ? std::fabs(k_after[i] - k_want[i]) <= ulp * std::max(1.0f, std::fabs(k_want[i]))
                                    : k_after[i] == k_want[i] || (std::isnan(k_after[i]) && std::isnan(k_want[i]));
    if (!key_ok) return fmt::format("k_cache element {} is {} (want {}; appended row: {})", i, k_after[i], k_want[i], appended[i]);
  }
  return {};
}

// A call's out [batch, seqlen_q, heads_q, head_dim] and lse [batch, heads_q,
// seqlen_q] on the device, LSE poisoned.
struct Outputs {
  explicit Outputs(const Case& c)
      : shape{c.batch, c.seqlen_q, c.heads_q, c.head_dim},
        out(c.dtype, shape, contiguous()),
        lse_count(static_cast<size_t>(c.batch) * c.heads_q * c.seqlen_q),
        lse(lse_count * 4),
        lse_view(TensorView::contiguous(lse.get(), DType::f32, {c.batch, c.heads_q, c.seqlen_q})) {
    lse.fill_bytes(0xff);
  }
  Run read() const { return read_outputs<Run>(out, lse, lse_count); }
  // The contiguous strides of shape, filled in (members above out, so they
  // are set before out is made).
  const int64_t (&contiguous())[4] {
    contiguous_strides(shape, strides);
    return strides;
  }
  int64_t shape[4];
  int64_t strides[4] = {};
  DeviceTensor out;
  size_t lse_count;
  DeviceBuffer lse;
  TensorView lse_view;
};

// A warm forward_kvcache call on a stream of its own (it compiles and loads
// the kernels), then the same call captured into a CUDA graph, to replay.
class CapturedCall {
 public:
  explicit CapturedCall(const std::function<void(CUstream)>& call) {
    REQUIRE(drv_.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    call(stream_);
    REQUIRE(drv_.cuStreamSynchronize(stream_) == CUDA_SUCCESS);
    REQUIRE(drv_.cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    call(stream_);
    REQUIRE(drv_.cuStreamEndCapture(stream_, &graph_) == CUDA_SUCCESS);
    REQUIRE(drv_.cuGraphInstantiateWithFlags(&exec_, graph_, 0) == CUDA_SUCCESS);
  }
  ~CapturedCall() {
    if (exec_ != nullptr) drv_.cuGraphExecDestroy(exec_);
    if (graph_ != nullptr) drv_.cuGraphDestroy(graph_);
    if (stream_ != nullptr) drv_.cuStreamDestroy(stream_);
  }
  CapturedCall(const CapturedCall&) = delete;
  CapturedCall& operator=(const CapturedCall&) = delete;
  // One replay, waited for.
  void replay() {
    REQUIRE(drv_.cuGraphLaunch(exec_, stream_) == CUDA_SUCCESS);
    REQUIRE(drv_.cuStreamSynchronize(stream_) == CUDA_SUCCESS);
  }

 private:
  const detail::Driver& drv_ = detail::driver();
  CUstream stream_ = nullptr;
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
};

// through_graph: the call captured into a CUDA graph (CapturedCall) and
// replayed twice on re-poisoned outputs (an append writes the same rows to
// the same places every time).
Run run_kernel(const Case& c, const Inputs& in, bool through_graph = false) {
  Outputs outputs(c);
  DeviceTensor& out = outputs.out;
  DeviceBuffer& lse = outputs.lse;
  const TensorView& lse_view = outputs.lse_view;
  CallViews v;
  fill_call(c, in, v);
  Runtime& runtime = gpu_tests_runtime();
  const size_t workspace_bytes = runtime.kvcache_workspace_bytes(in.dq->view(), v.args, out.view(), &lse_view, v.options);
  DeviceBuffer workspace(std::max<size_t>(workspace_bytes, 256));
  workspace.fill_bytes(0xff);
  auto read_back = [&] { return outputs.read(); };
  if (!through_graph) {
    // A repeat appends the same rows to the same places again.
    std::string mismatch;
    Run run = launch_repeated(
        [&] {
          out.buffer.fill_bytes(0xff);
          lse.fill_bytes(0xff);
          workspace.fill_bytes(0xff);
          runtime.forward_kvcache(in.dq->view(), v.args, out.view(), &lse_view, v.options, workspace.get(),
                                  workspace_bytes, nullptr);
          return read_back();
        },
        mismatch);
    run.spec = fmt::format("workspace={}", workspace_bytes);
    run.repeat_mismatch = std::move(mismatch);
    return run;
  }
  CapturedCall captured([&](CUstream stream) {
    runtime.forward_kvcache(in.dq->view(), v.args, out.view(), &lse_view, v.options, workspace.get(), workspace_bytes,
                            stream);
  });
  for (int replay = 0; replay < 2; ++replay) {
    out.buffer.fill_bytes(0xff);
    lse.fill_bytes(0xff);
    workspace.fill_bytes(0xff);
    captured.replay();
  }
  Run run = read_back();
  run.spec = fmt::format("workspace={}", workspace_bytes);
  return run;
}

// Four sequences of seqlen_q queries over seqlen_k keys, 8 query heads on 2
// KV heads: the base of the feature cases below.
Case four_sequences(int seqlen_q, int seqlen_k) {
  Case c;
  c.batch = 4;
  c.seqlen_q = seqlen_q;
  c.seqlen_k = seqlen_k;
  c.heads_q = 8;
  c.heads_kv = 2;
  return c;
}

void check_cases(const std::vector<Case>& cases, std::mt19937_64& rng, uint64_t seed, bool through_graph = false) {
  check_in_groups(
      cases, [&](const Case& c) { return make_inputs(c, rng); }, make_references,
      [&](const Case& c, const Inputs& in, const References& r) {
        const auto ran = run_case(r, [&] { return describe(c, "", seed); },
                                  [&] { return run_kernel(c, in, through_graph); });
        if (!ran) return;
        const auto& run = *ran;
        AttentionShape shape = AttentionShape::dense(c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.head_dim);
        shape.learnable_sink = c.learnable_sink;  // judge: rows that see no key have lse = their sink
        const Verdict verdict = judge(shape, run.out, run.lse, r.exact, r.rounded);
        std::string lse_detail;  // the first LSE mismatches, to point at the rows
        for (size_t i = 0, shown = 0; i < run.lse.size() && shown < 4; ++i) {
          const double want = r.exact.lse[i], got = run.lse[i];
          const bool ok = std::isinf(want) ? (std::isinf(got) && got < 0)
                                           : std::fabs(got - want) <= 1e-3 * std::max(1.0, std::fabs(want));
          if (ok) continue;
          const size_t b = i / (c.heads_q * c.seqlen_q), h = i / c.seqlen_q % c.heads_q, row = i % c.seqlen_q;
          lse_detail += fmt::format(" [b={} h={} i={} cache_seqlen={}: lse {} want {}]", b, h, row, in.cache_seqlens[b], got, want);
          ++shown;
        }
        CHECK_MESSAGE(verdict.ok(), fmt::format("{}: {}{}", describe(c, run.spec, seed), verdict.summary(), lse_detail));
        if (!run.repeat_mismatch.empty()) FAIL_CHECK(std::string(describe(c, run.spec, seed) + ": " + run.repeat_mismatch));
        const std::string cache = check_cache(c, in);
        CHECK_MESSAGE(cache.empty(), fmt::format("{}: {}", describe(c, run.spec, seed), cache));
      });
}

}  // namespace

TEST_SUITE("gpu") {

TEST_CASE("kvcache: FlashAttention's grid of lengths, splits, heads, appends, RoPE and paging") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const std::pair<int, int> seqlens[] = {{1, 128},    {1, 339},  {3, 1024}, {64, 800},    {64, 256},     {3, 799},
                                         {64, 2048},  {16, 20000}, {1, 131072}, {16, 131072}, {128, 128}};
  // Pages shorter than a decode chunk: the case "decode chunks over pages
  // shorter than themselves" below; pages of 4 rows (the prefill tiles):
  // the producer-layout case.
  const int page_sizes[] = {0, 16, 64, 256};
  const RopeStyle styles[] = {RopeStyle::none, RopeStyle::rotate_half, RopeStyle::interleaved};
  std::vector<Case> cases;
  int index = 0;
  for (const auto& [seqlen_q, seqlen_k] : seqlens) {
    for (int num_splits : {1, 3, 0}) {
      for (int variant = 0; variant < 2; ++variant, ++index) {
        Case c;
        c.dtype = index % 2 == 0 ? DType::bf16 : DType::f16;
        c.seqlen_q = seqlen_q;
        c.seqlen_k = seqlen_k;
        const bool long_keys = seqlen_k >= 20000;
        c.batch = long_keys ? 1 : 3;
        const int kv_heads[] = {6, 2, 1};
        c.heads_kv = kv_heads[index % 3];
        if (long_keys && c.heads_kv == 6) c.heads_kv = 2;
        c.head_dim = (index / 3) % 3 == 2 ? 64 : 128;
        c.causal = index % 4 != 1;
        if (index % 7 == 5) c.window_left = 100;
        c.append = variant == 1 && seqlen_q <= seqlen_k / 2;
        c.rope = styles[index % 3];
        c.rotary_fraction = index % 5 < 3 ? 1.0 : 0.5;
        c.tables = index % 4 == 3;
        c.tables16 = c.tables && index % 8 == 7;
        c.page_size = page_sizes[index % 4];
        c.batch_index = c.page_size == 0 && index % 3 == 1;
        c.num_splits = num_splits;
        c.dynamic = num_splits != 1 && index % 4 == 2;
        cases.push_back(c);
      }
    }
  }
  // The same shapes through the kernel the planner does not pick for them:
  // the prefill kernel for short packed tiles, and decode tiles of every
  // chunk size, warp count and depth (several query tiles where the packed
  // rows exceed one) for the rest and for short tiles alike.
  const TileConfig decode_tiles[] = {{0, 16, 4, 4}, {0, 32, 2, 3}, {32, 64, 2, 2}, {16, 16, 1, 8}, {0, 16, 8, 2}};
  for (size_t i = 0; i < cases.size(); i += 3) {
    Case c = cases[i];
    const bool planner_decodes = c.seqlen_q * (c.heads_q / c.heads_kv) <= 32;
    if (planner_decodes && i % 2 == 0) {
      c.tiles = {64, 128, 4, 0};
      if (c.page_size != 0 && c.page_size < 128) c.tiles.block_kv = 64;
    } else {
      c.tiles = decode_tiles[(i / 3) % 5];
      if (c.head_dim > 128 && c.tiles.block_q == 32) c.tiles.block_q = 16;
      // (Chunks longer than the pages span them: .pagedN.)
    }
    cases.push_back(c);
  }
  // Head dims 192 and 256 with the planner's tiles: two stages of its usual
  // chunks would exceed a block's shared memory, so it takes smaller ones.
  const std::pair<int, int> wide_seqlens[] = {{1, 339}, {3, 1024}, {1, 20000}};
  for (int head_dim : {192, 256}) {
    for (const auto& [seqlen_q, seqlen_k] : wide_seqlens) {
      Case c;
      c.dtype = head_dim == 192 ? DType::f16 : DType::bf16;
      c.seqlen_q = seqlen_q;
      c.seqlen_k = seqlen_k;
      c.batch = seqlen_k >= 20000 ? 1 : 3;
      c.heads_kv = 2;
      c.head_dim = head_dim;
      c.causal = true;
      c.append = seqlen_q == 3;
      c.rope = seqlen_q == 3 ? RopeStyle::rotate_half : RopeStyle::none;
      c.page_size = seqlen_k == 339 ? 64 : 0;
      c.num_splits = 0;
      cases.push_back(c);
    }
  }
  check_cases(cases, rng, seed);
}

TEST_CASE("kvcache: cache_leftpad (keys from each sequence's own first row) on every kernel family") {
  // FlashAttention's cache_leftpad: rows before a sequence's pad are NaN, so
  // a kernel that read them, or counted its keys from row 0 (masks, splits,
  // the keys' count), fails. Contiguous caches only, as there.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  auto add = [&](int seqlen_q, int seqlen_k, auto&& set) {
    Case c = four_sequences(seqlen_q, seqlen_k);
    c.leftpad = true;
    set(c);
    cases.push_back(c);
  };
  // The decode kernel: heuristic splits, appends with RoPE.
  add(1, 1000, [](Case& c) { c.append = true, c.rope = RopeStyle::rotate_half; });
  add(1, 2048, [](Case& c) { c.dtype = DType::f16, c.head_dim = 64, c.num_splits = 3, c.window_left = 100; });
  add(3, 1024, [](Case& c) {
    c.append = true, c.rope = RopeStyle::interleaved, c.tables = c.tables16 = true, c.batch_index = true;
    c.dynamic = true;
  });
  add(1, 339, [](Case& c) { c.heads_kv = 1, c.causal = false, c.num_splits = 1; });
  add(16, 20000, [](Case& c) { c.batch = 2, c.append = true, c.rope = RopeStyle::rotate_half, c.rotary_fraction = 0.5; });
  // Tiles of 64 query rows and more (wgmma on sm_90a, with tensor copies of
  // K and V), split or not; forced mma.sync tiles; head dim 256.
  add(64, 800, [](Case& c) { c.append = true, c.rope = RopeStyle::rotate_half; });
  add(64, 2048, [](Case& c) { c.heads_kv = 8, c.heads_q = 8, c.num_splits = 3, c.window_left = 500; });
  add(64, 800, [](Case& c) { c.tiles = {64, 128, 4, 0}, c.causal = false, c.dtype = DType::f16; });
  add(3, 1024, [](Case& c) { c.head_dim = 256, c.append = true, c.rope = RopeStyle::rotate_half, c.batch_index = true; });
  check_cases(cases, rng, seed);
}

TEST_CASE("kvcache: YaRN angles, keys appended scaled by the attention factor, on every kernel family") {
  // q rotated at cache_seqlens + i by the decode kernel and the prefill
  // tiles, and the new keys by the append, all with YaRN's frequencies and
  // cos and sin times the attention factor: the cache then holds keys as
  // Hugging Face's and vLLM's scaled caches do (check_cache), and the cached
  // ones are read as they are. An attention factor of exactly 1 takes the
  // unscaled kernels.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  auto add = [&](int seqlen_q, int seqlen_k, auto&& set) {
    Case c = four_sequences(seqlen_q, seqlen_k);
    c.append = true;
    c.rope = RopeStyle::rotate_half;
    c.yarn_factor = 32.0;
    set(c);
    cases.push_back(c);
  };
  // The decode kernel: heuristic, forced and dynamic splits, pages, partial rotation.
  add(1, 1000, [](Case&) {});
  add(1, 2048, [](Case& c) { c.rope = RopeStyle::interleaved, c.num_splits = 3, c.page_size = 64; });
  add(3, 1024, [](Case& c) { c.dynamic = true, c.page_size = 16, c.rotary_fraction = 0.5, c.yarn_factor = 4.0; });
  add(1, 700, [](Case& c) { c.dtype = DType::f16, c.head_dim = 64, c.window_left = 127, c.attention_factor = 1.5; });
  add(1, 339, [](Case& c) { c.attention_factor = 1.0, c.batch_index = true; });
  // Tiles of 64 query rows and more (wgmma on sm_90a), split or not; forced
  // mma.sync tiles; head dim 256.
  add(64, 800, [](Case&) {});
  add(64, 2048, [](Case& c) { c.rope = RopeStyle::interleaved, c.num_splits = 3, c.page_size = 64; });
  add(64, 800, [](Case& c) { c.tiles = {64, 128, 4, 0}, c.causal = false, c.dtype = DType::f16; });
  add(3, 1024, [](Case& c) { c.head_dim = 256, c.attention_factor = 1.25; });
  check_cases(cases, rng, seed);
  check_scaled_kernels(cases, seed);
}

TEST_CASE("kvcache: LongRoPE angles (Phi-3.5, Phi-4-mini), keys appended scaled, on the decode kernel and the tiles") {
  // LongRoPE's pair factors divide theta's frequencies (host-computed), and
  // its attention factor scales cos and sin in the same .rope_scaled kernels
  // as YaRN's: q at cache_seqlens + i, the appended keys (check_cache), the
  // cached ones read as they are. Phi-3.5's head dim 96 rotated whole and
  // Phi-4-mini's 128 rotated over 96 channels; an attention factor of 1 (a
  // factor up to 1) takes the unscaled kernels.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  auto add = [&](int seqlen_q, int seqlen_k, auto&& set) {
    Case c = four_sequences(seqlen_q, seqlen_k);
    c.append = true;
    c.rope = RopeStyle::rotate_half;
    c.head_dim = 96;
    c.longrope_factor = 32.0;
    set(c);
    cases.push_back(c);
  };
  add(1, 3000, [](Case&) {});
  add(1, 2048, [](Case& c) { c.head_dim = 128, c.rotary_fraction = 0.75, c.num_splits = 3, c.page_size = 64; });
  add(3, 1024, [](Case& c) { c.head_dim = 128, c.rotary_fraction = 0.75, c.dynamic = true, c.page_size = 16; });
  add(1, 700, [](Case& c) { c.dtype = DType::f16, c.attention_factor = 1.5, c.heads_kv = 8; });
  add(1, 339, [](Case& c) { c.longrope_factor = 1.0, c.batch_index = true; });
  add(64, 800, [](Case& c) { c.head_dim = 128, c.rotary_fraction = 0.75; });
  add(64, 2048, [](Case& c) { c.num_splits = 3, c.page_size = 64; });
  add(64, 800, [](Case& c) { c.tiles = {64, 128, 4, 0}, c.causal = false, c.dtype = DType::f16; });
  check_cases(cases, rng, seed);
  check_scaled_kernels(cases, seed);
  // The pair factors alone change the appended keys (check_cache's
  // expectation): the unscaled case's keys rotated by theta alone differ.
  Case c = cases[4];
  REQUIRE(rotation_of(c).attention_factor() == 1.0);
  const Inputs in = make_inputs(c, rng);
  const std::vector<float> factored = appended_keys(c, in, true);
  c.longrope_factor = 0.0;
  const std::vector<float> theta_only = appended_keys(c, in, true);
  CHECK_MESSAGE(max_deviation(std::vector<double>(factored.begin(), factored.end()), theta_only) > 0.1,
                describe(c, "longrope sanity", seed));
}

TEST_CASE("kvcache: attention_chunk (keys of the query's own chunk) on every kernel family") {
  // Positions count from each sequence's first key (cache_leftpad's row), so
  // with random lengths a sequence's queries fall anywhere in their chunk,
  // and speculative rows and 64-row tiles straddle chunk boundaries. A
  // kernel that ignored the chunk, cut it from another origin, or planned
  // its splits or key blocks from the whole cache fails.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  auto add = [&](int seqlen_q, int seqlen_k, int chunk, auto&& set) {
    Case c = four_sequences(seqlen_q, seqlen_k);
    c.attention_chunk = chunk;
    set(c);
    cases.push_back(c);
  };
  // The decode kernel: heuristic, forced and dynamic splits; appends with
  // RoPE; pages; a window inside the chunk; leftpad.
  add(1, 2048, 256, [](Case& c) { c.append = true, c.rope = RopeStyle::rotate_half; });
  add(1, 20000, 4096, [](Case& c) { c.num_splits = 3, c.page_size = 64; });
  add(3, 1024, 100, [](Case& c) { c.dynamic = true, c.page_size = 16, c.append = true, c.rope = RopeStyle::interleaved; });
  add(1, 1000, 333, [](Case& c) { c.dtype = DType::f16, c.head_dim = 64, c.window_left = 50, c.leftpad = true; });
  add(16, 4096, 1000, [](Case& c) { c.batch = 2, c.heads_kv = 1, c.num_splits = 1, c.batch_index = true; });
  add(1, 339, 64, [](Case& c) { c.causal = false; });
  // Tiles of 64 query rows and more (wgmma on sm_90a): chunks below, at and
  // above the tile, split or not; forced mma.sync tiles; head dim 256.
  add(64, 2048, 48, [](Case& c) { c.append = true, c.rope = RopeStyle::rotate_half; });
  add(64, 2048, 128, [](Case& c) { c.heads_kv = 8, c.heads_q = 8, c.num_splits = 3, c.page_size = 64; });
  add(64, 800, 200, [](Case& c) { c.tiles = {64, 128, 4, 0}, c.causal = false, c.dtype = DType::f16; });
  add(3, 1024, 512, [](Case& c) { c.head_dim = 256, c.append = true, c.rope = RopeStyle::rotate_half; });
  check_cases(cases, rng, seed);
}

TEST_CASE("kvcache: learnable_sink on every kernel family, split and not, with appends, windows and pages") {
  // The decode kernel writes final rows (unsplit, and a dynamic split's
  // tiles of one piece) with the sink folded in; split partials leave it to
  // the combine. Windowed decode rows and causal chunks of queries over
  // short caches include rows of no key (lse = the sink).
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  auto add = [&](int seqlen_q, int seqlen_k, auto&& set) {
    Case c = four_sequences(seqlen_q, seqlen_k);
    set(c);
    c.learnable_sink = random_sinks(c.heads_q, rng);
    cases.push_back(c);
  };
  // The decode kernel: unsplit, heuristic, forced and dynamic splits;
  // appends with RoPE; pages; gpt-oss's 128-key window; MQA; head dim 64.
  add(1, 2048, [](Case& c) { c.num_splits = 1, c.append = true, c.rope = RopeStyle::rotate_half; });
  add(1, 20000, [](Case& c) { c.page_size = 64, c.window_left = 127; });
  add(1, 20000, [](Case& c) { c.num_splits = 3, c.dtype = DType::f16, c.head_dim = 64, c.heads_q = 16; });
  add(3, 4096, [](Case& c) { c.dynamic = true, c.page_size = 16, c.append = true, c.rope = RopeStyle::interleaved; });
  add(1, 1000, [](Case& c) { c.dynamic = true, c.full_lengths = true; });
  add(16, 4096, [](Case& c) { c.batch = 2, c.heads_kv = 1, c.batch_index = true; });
  // Tiles of 64 query rows and more (wgmma on sm_90a), split or not; forced
  // mma.sync tiles; head dim 256.
  add(64, 2048, [](Case& c) { c.append = true, c.rope = RopeStyle::rotate_half; });
  add(64, 2048, [](Case& c) { c.heads_kv = 8, c.num_splits = 3, c.page_size = 64, c.window_left = 100; });
  add(64, 40, [](Case& c) { c.tiles = {64, 128, 4, 0}, c.dtype = DType::f16; });
  add(3, 1024, [](Case& c) { c.head_dim = 256, c.append = true, c.rope = RopeStyle::rotate_half; });
  check_cases(cases, rng, seed);
}

TEST_CASE("kvcache: windows and chunks over long caches split each tile's own keys, on every split kernel") {
  // The 4-warp and wgmma split kernels, like the decode kernel, cut each
  // tile's visible blocks into pieces planned on the window's span: a
  // kernel that cut the whole cache (most pieces empty, the window in one)
  // or lost a piece's keys fails. Random lengths put the windows anywhere.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  auto add = [&](int seqlen_q, int seqlen_k, auto&& set) {
    Case c = four_sequences(seqlen_q, seqlen_k);
    set(c);
    cases.push_back(c);
  };
  // wgmma tiles: speculative tokens under gpt-oss's 128-key window, wider
  // windows and chunks, heuristic and forced splits, pages.
  add(16, 20000, [](Case& c) { c.window_left = 127, c.head_dim = 64; });
  add(64, 20000, [](Case& c) { c.window_left = 700, c.append = true, c.rope = RopeStyle::rotate_half; });
  add(64, 20000, [](Case& c) { c.window_left = 3000, c.num_splits = 5, c.page_size = 64; });
  add(64, 20000, [](Case& c) { c.attention_chunk = 1000, c.dtype = DType::f16; });
  add(64, 8000, [](Case& c) { c.window_left = 200, c.causal = false, c.dynamic = true; });
  // 4-warp tiles, forced.
  add(64, 20000, [](Case& c) { c.tiles = {64, 128, 4, 0}, c.window_left = 500; });
  add(64, 20000, [](Case& c) { c.tiles = {64, 64, 4, 0}, c.window_left = 900, c.num_splits = 7, c.page_size = 64; });
  check_cases(cases, rng, seed);
}

TEST_CASE("kvcache: uneven batches split by total_seqlen_k or dynamic_splits (one long sequence, fifteen short)") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  for (int variant = 0; variant < 8; ++variant) {
    Case c;
    c.uneven = true;
    // Variants 4-7: the same told nothing of the lengths but to split on the
    // device.
    c.dynamic = variant >= 4;
    c.batch = 16;
    c.seqlen_q = variant % 4 == 3 ? 3 : 1;
    c.seqlen_k = 8192;
    // 16 × 8 tiles of one CTA per SM at head dim 128: unsplit by the
    // heuristic, which counts tiles only. MHA in variant 2.
    const int shape = variant % 4;
    c.heads_q = shape == 2 ? 8 : 32;
    c.heads_kv = 8;
    c.head_dim = 128;
    c.dtype = variant % 2 == 0 ? DType::bf16 : DType::f16;
    c.causal = true;
    c.append = shape == 1 || shape == 3;
    c.rope = shape == 1 ? RopeStyle::rotate_half : shape == 3 ? RopeStyle::interleaved : RopeStyle::none;
    c.page_size = shape == 1 ? 64 : shape == 3 ? 256 : (variant == 6 ? 16 : 0);
    c.batch_index = variant == 2;
    if (shape == 3) c.window_left = 2000;
    cases.push_back(c);
  }
  // The planner splits these (a workspace), and not the same batch told
  // nothing of its lengths; dynamic splits need no total.
  for (const Case& c : cases) {
    CAPTURE(describe(c, "", seed));
    inspect_call(c, seed, [&](const Inputs& in, CallViews& v) {
      Runtime& runtime = gpu_tests_runtime();
      const TensorView q = in.dq->view();  // also stands for out: only the sizes are planned
      CHECK(runtime.kvcache_workspace_bytes(q, v.args, q, nullptr, v.options) > 0);
      v.args.total_seqlen_k = 0;
      CHECK((runtime.kvcache_workspace_bytes(q, v.args, q, nullptr, v.options) > 0) == c.dynamic);
    });
  }
  check_cases(cases, rng, seed);
}

TEST_CASE("kvcache: resident decode tiles (64, 48 and 32 KB pipelines, every tile at once), unsplit") {
  // One token, 32/8 heads, caches of 2048 and 1024 keys: batches of 1.2
  // tiles per SM of this GPU, 28 and 40 sequences (224 and 320 tiles) and
  // 2.85 tiles per SM, which the planner decodes unsplit in resident CTAs of
  // 64, 48, 32 and 64 KB on a 132-SM sm_90 (plan/tiles.cpp,
  // decode_grid_resident): contiguous and paged, appends with both RoPE
  // styles and tables, windows, head dims 128 and 64, and a forced split of
  // the same tiles.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const int sms = current_sm_count();
  const int little_more = (sms * 6 / 5 + 7) / 8, nearly_three = sms * 57 / 20 / 8;
  const int batches[] = {little_more, little_more, little_more, little_more, little_more, 28, 40, nearly_three,
                         nearly_three};
  std::vector<Case> cases;
  for (int variant = 0; variant < 9; ++variant) {
    Case c;
    c.batch = batches[variant];
    c.heads_q = 32;
    c.heads_kv = 8;
    c.head_dim = variant == 3 ? 64 : 128;
    c.seqlen_k = c.batch * 8 <= sms * 3 / 2 ? 2048 : 1024;  // the CPU references' time grows with batch × keys
    c.dtype = variant % 2 == 0 ? DType::bf16 : DType::f16;
    c.causal = variant != 2;
    c.append = variant % 3 != 0;
    c.rope = variant == 1 || variant == 7 ? RopeStyle::rotate_half
             : variant == 4 || variant == 5 ? RopeStyle::interleaved
                                            : RopeStyle::none;
    c.rotary_fraction = variant == 7 ? 0.5 : 1.0;
    c.tables = variant == 4;
    const int pages[] = {0, 64, 16, 256, 0, 16, 64, 64, 0};
    c.page_size = pages[variant];
    c.batch_index = variant == 8;
    if (variant == 2 || variant == 6) c.window_left = 500;
    c.num_splits = variant == 4 ? 3 : 0;
    cases.push_back(c);
  }
  // On sm_90 the planner takes resident CTAs for these (4 KB chunks: 16 keys
  // of 256-byte rows, 32 of 128-byte ones), unsplit (no workspace) unless
  // forced, with every tile resident at once.
  const bool hopper = current_arch().rfind("sm_90", 0) == 0;
  for (const Case& c : cases) {
    if (!hopper) break;
    CAPTURE(describe(c, "", seed));
    inspect_call(c, seed, [&](const Inputs& in, CallViews& v) {
      const TensorView q = in.dq->view();
      const detail::KernelSpec spec = plan_on_this_gpu(in, v).attention.spec;
      const int chunk_keys = c.head_dim == 64 ? 32 : 16;
      CHECK(spec.block_kv == chunk_keys);
      CHECK(spec.page_rows == (c.page_size != 0 && c.page_size < chunk_keys ? c.page_size : 0));
      const int row_bytes = c.head_dim <= 64 ? 128 : 256;
      const int pipeline_bytes = spec.warps * spec.stages * chunk_keys * 2 * row_bytes;
      CHECK((pipeline_bytes == 64 * 1024 || pipeline_bytes == 48 * 1024 || pipeline_bytes == 32 * 1024));
      const int ctas_per_sm = (current_max_smem_per_block() + 1024) / static_cast<int>(spec.smem_bytes() + 1024);
      CHECK(c.batch * c.heads_kv <= sms * ctas_per_sm);
      CHECK(spec.split == (c.num_splits > 1));
      CHECK((gpu_tests_runtime().kvcache_workspace_bytes(q, v.args, q, nullptr, v.options) > 0) == (c.num_splits > 1));
    });
  }
  if (!hopper) MESSAGE("resident decode tiles are planned on sm_90 only: the cases run this GPU's other tiles");
  check_cases(cases, rng, seed);
}

TEST_CASE("kvcache: decode chunks over pages shorter than themselves (pages of 1-32 rows, .pagedN)") {
  // The decode kernel keeps its chunk (8 KB of K: 64 keys of 128-byte rows,
  // 32 of 256-byte ones, 16 of 512-byte ones) over shorter pages, each copy
  // pass (or, in pages shorter than a pass, each copy) taking its page from
  // the lane that read that page's table entry.
  // Every head dim, the page sizes each spans, lengths that end inside a
  // page and a chunk, shuffled pages, table entries past a sequence's pages
  // that would fault, appends with both RoPE styles, splits forced, chosen
  // and on the device, windows, learnable sinks, GQA and MQA, and forced
  // tiles of other chunk sizes over the same pages.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  struct Shape {
    int head_dim, page_size, seqlen_q, seqlen_k, batch;
  };
  const Shape shapes[] = {{32, 8, 1, 1000, 3},   {32, 16, 2, 777, 2},   {64, 16, 1, 2049, 3},  {64, 32, 4, 3001, 2},
                          {64, 8, 1, 515, 4},    {80, 16, 1, 1300, 3},  {128, 16, 1, 4099, 3}, {128, 8, 3, 1029, 2},
                          {128, 16, 8, 20000, 1}, {256, 8, 1, 700, 3},  {192, 8, 2, 1500, 2},  {64, 16, 1, 131072, 1},
                          // Pages shorter than a copy pass: each copy takes its row's page.
                          {64, 1, 1, 1500, 3},   {128, 1, 2, 1031, 2},  {128, 4, 1, 3000, 2},  {32, 2, 1, 900, 3},
                          {256, 1, 1, 600, 2},   {64, 2, 4, 2500, 2},   {128, 2, 1, 40000, 1}};
  std::vector<Case> cases;
  int index = 0;
  for (const Shape& shape : shapes) {
    Case c;
    c.dtype = index % 2 == 0 ? DType::bf16 : DType::f16;
    c.head_dim = shape.head_dim;
    c.page_size = shape.page_size;
    c.seqlen_q = shape.seqlen_q;
    c.seqlen_k = shape.seqlen_k;
    c.batch = shape.batch;
    c.heads_q = index % 3 == 2 ? 4 : 6;
    c.heads_kv = index % 3 == 0 ? 2 : index % 3 == 1 ? 1 : 4;
    c.causal = index % 4 != 3;
    if (index % 5 == 1) c.window_left = 300;
    c.append = index % 3 != 1 && c.seqlen_q <= c.seqlen_k / 2;
    c.rope = c.append ? (index % 2 == 0 ? RopeStyle::rotate_half : RopeStyle::interleaved) : RopeStyle::none;
    c.rotary_fraction = index % 4 == 0 ? 0.5 : 1.0;
    const int splits[] = {0, 1, 3, 0};
    c.num_splits = splits[index % 4];
    c.dynamic = index % 4 == 3;
    cases.push_back(c);
    ++index;
  }
  // Learnable sinks on the same kernels.
  Case capped = cases[2];
  capped.append = false;
  capped.rope = RopeStyle::none;
  for (int h = 0; h < capped.heads_q; ++h) capped.learnable_sink.push_back(0.75f * static_cast<float>(h % 4) - 1.0f);
  cases.push_back(capped);
  // Forced decode tiles whose chunks span 2-8 pages of 8 or 16 rows.
  const TileConfig forced[] = {{16, 64, 2, 3}, {32, 32, 4, 2}, {16, 64, 2, 2}};
  for (int i = 0; i < 3; ++i) {
    Case c = cases[static_cast<size_t>(i) * 3 + 1];
    if (c.head_dim > 128) continue;
    c.tiles = forced[i];
    cases.push_back(c);
  }
  // Each case's planned kernel spans its pages: .pagedN of the page size.
  for (const Case& c : cases) {
    inspect_call(c, seed, [&](const Inputs& in, CallViews& v) {
      const detail::KernelSpec spec = plan_on_this_gpu(in, v).attention.spec;
      CHECK_MESSAGE(spec.family == detail::Family::decode, describe(c, spec.text(), seed));
      CHECK_MESSAGE(spec.page_rows == (c.page_size < spec.block_kv ? c.page_size : 0), describe(c, spec.text(), seed));
    });
  }
  check_cases(cases, rng, seed);
}

TEST_CASE("kvcache: dynamic_splits follow the lengths of each CUDA graph replay") {
  // One call captured with every sequence full, then replayed with the
  // device's cache_seqlens rewritten: one long sequence and fifteen short,
  // every one short, random lengths with 0 and 1, and full again. The graph
  // keeps its launches; the outputs must follow the lengths of the replay.
  // Tiles of one piece write their rows and mark them in the workspace for
  // the combine to skip; the last two replays find the workspace as the
  // replay before left it (marks included), as an engine's replays do.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  // Variants 3 and 4 take the kernel's general way to its piece (batch over
  // 32; two query tiles a sequence), the others one sequence per lane.
  for (int variant = 0; variant < 5; ++variant) {
    Case c;
    c.batch = variant == 3 ? 40 : 16;
    c.seqlen_k = 4096;
    if (variant == 4) {
      c.seqlen_q = 8;  // 32 packed rows: two 16-row tiles
      c.tiles = {16, 32, 4, 2};
    }
    c.heads_q = 32;
    c.heads_kv = 8;
    c.head_dim = variant == 2 ? 64 : 128;
    c.dtype = variant == 1 ? DType::f16 : DType::bf16;
    c.causal = true;
    c.window_left = variant == 2 ? 1000 : -1;
    c.page_size = variant == 1 ? 64 : 0;
    c.dynamic = true;
    c.full_lengths = true;
    Inputs in = make_inputs(c, rng);
    CallViews v;
    fill_call(c, in, v);
    Outputs outputs(c);
    Runtime& runtime = gpu_tests_runtime();
    const size_t workspace_bytes =
        runtime.kvcache_workspace_bytes(in.dq->view(), v.args, outputs.out.view(), &outputs.lse_view, v.options);
    REQUIRE(workspace_bytes > 0);
    DeviceBuffer workspace(workspace_bytes);
    CapturedCall captured([&](CUstream stream) {
      runtime.forward_kvcache(in.dq->view(), v.args, outputs.out.view(), &outputs.lse_view, v.options,
                              workspace.get(), workspace_bytes, stream);
    });
    std::uniform_int_distribution<int> short_length(0, c.seqlen_k / 16), any_length(0, c.seqlen_k);
    const char* names[] = {"one long, fifteen short", "all short", "random with 0 and 1", "full"};
    for (int replay = 0; replay < 4; ++replay) {
      std::vector<int> lengths(c.batch, c.seqlen_k);
      for (int b = 0; b < c.batch; ++b) {
        if (replay == 0 && b != 5) lengths[b] = short_length(rng);
        if (replay == 1) lengths[b] = short_length(rng);
        if (replay == 2) lengths[b] = b == 0 ? 0 : b == 1 ? 1 : any_length(rng);
      }
      in.cache_seqlens = lengths;
      in.seqlens->upload(lengths.data(), lengths.size() * 4);
      const References r = make_references(c, in);
      outputs.out.buffer.fill_bytes(0xff);
      outputs.lse.fill_bytes(0xff);
      if (replay < 2) workspace.fill_bytes(0xff);
      captured.replay();
      const Run run = outputs.read();
      const AttentionShape shape =
          AttentionShape::dense(c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.head_dim);
      const Verdict verdict = judge(shape, run.out, run.lse, r.exact, r.rounded);
      CHECK_MESSAGE(verdict.ok(), fmt::format("{} replay {} ({}): {}", describe(c, "", seed), replay, names[replay],
                                              verdict.summary()));
    }
  }
}

namespace {

// The chunked-prefill grid of the wgmma cases: four variants per (seqlen_q,
// seqlen_k) pair, cycling dtype, KV heads, masks, appends (variants 2 and 3,
// where the chunk fits), RoPE style, fraction and tables over a running
// index; `finish(c, index, variant)` sets the head dim, pages and tiles.
// A contiguous cache reads through cache_batch_idx in a third of them.
// Split counts the wgmma grids cycle through: one, the heuristic's, three.
constexpr int kSplitChoices[] = {1, 0, 3};

template <class Finish>
std::vector<Case> wgmma_cache_grid(const std::vector<std::pair<int, int>>& seqlens, int batch, Finish finish) {
  const RopeStyle styles[] = {RopeStyle::none, RopeStyle::rotate_half, RopeStyle::interleaved};
  const int kv_heads[] = {6, 2, 1};
  std::vector<Case> cases;
  int index = 0;
  for (const auto& [seqlen_q, seqlen_k] : seqlens) {
    for (int variant = 0; variant < 4; ++variant, ++index) {
      Case c;
      c.dtype = index % 2 == 0 ? DType::bf16 : DType::f16;
      c.seqlen_q = seqlen_q;
      c.seqlen_k = seqlen_k;
      c.batch = batch;
      c.heads_kv = kv_heads[index % 3];
      c.causal = index % 4 != 1;
      if (index % 5 == 3) c.window_left = 100;
      c.append = variant >= 2 && seqlen_q <= seqlen_k / 2;
      c.rope = styles[index % 3];
      c.rotary_fraction = index % 5 < 3 ? 1.0 : 0.5;
      c.tables = index % 4 == 3;
      c.tables16 = c.tables && index % 8 == 7;
      finish(c, index, variant);
      c.batch_index = c.page_size == 0 && index % 3 == 1;
      cases.push_back(c);
    }
  }
  return cases;
}

// The planner's own choice for a chunk long enough to fill the GPU (3 × 6
// heads × 8 query tiles; test_plan): the wgmma tiles, one split. 1024
// queries over 3000 cached keys, causal, pages of 64, rotate-half RoPE.
Case planner_chunk(int head_dim) {
  Case chunk;
  chunk.seqlen_q = 1024;
  chunk.seqlen_k = 3000;
  chunk.batch = 3;
  chunk.causal = true;
  chunk.head_dim = head_dim;
  chunk.page_size = 64;
  chunk.rope = RopeStyle::rotate_half;
  return chunk;
}

}  // namespace

TEST_CASE("kvcache on the wgmma producer layout (sm_90a): chunked prefill, contiguous and paged, appends, RoPE, GQA") {
  // Many queries over a cache: the producer copies the cache's blocks by
  // tensor copies (a box per block, or per page where pages are shorter;
  // a last block past the sequence by zero-filling cp.async)
  // and the MMA warpgroups rotate q at positions cache_seqlens + i.
  if (!sm90a_or_skip("the wgmma family")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const std::vector<std::pair<int, int>> seqlens = {{64, 800}, {128, 128}, {300, 2048}, {3, 1024}, {200, 339}, {129, 4000}};
  // Pages from 8 rows are read a page per tensor copy; pages of 4 rows (not
  // whole swizzle atoms) by the producer's per-row cp.async.
  const int page_sizes[] = {0, 16, 64, 256, 8, 4};
  std::vector<Case> cases = wgmma_cache_grid(seqlens, 3, [&](Case& c, int index, int variant) {
    c.head_dim = variant % 2 == 0 ? 128 : 64;
    c.page_size = page_sizes[(index / 2) % 6];
    // One split, the heuristic's (most of these grids are few tiles), or 3.
    c.num_splits = kSplitChoices[(index / 2) % 3];
    // Head dim 64: mostly three MMA warpgroups (192-row tiles).
    // A page's K and V come by one copy through a map of both, wherever
    // they lie (Case::kv_storage), with three stages or more; with two (head
    // dim 128, every other case), K's or V's panels by one copy, through
    // maps whose heads merge with the panels or the groups (not K and V
    // side by side per head).
    c.kv_storage = static_cast<Case::Storage>(index / 2 % 4);
    const int stages_128 = index % 2 == 0 || c.kv_storage == Case::Storage::heads_paired ? 3 : 2;
    c.tiles = c.head_dim <= 64 && index % 3 != 2 ? TileConfig{192, 128, 12, 4, true}
                                                 : TileConfig{128, 128, 8, c.head_dim > 64 ? stages_128 : 4, true};
  });
  Case chunk = planner_chunk(128);
  cases.push_back(chunk);
  // Small pages: the same tiles, one tensor copy per page (every panel of
  // it: KernelSpec::interleaved_panels).
  chunk.page_size = 16;
  chunk.rope = RopeStyle::none;
  chunk.dtype = DType::f16;
  cases.push_back(chunk);
  // Pages whose heads are outermost (the map merges heads with the pages'
  // 8-row groups instead of the panels), at 16 and 256 rows, appended.
  for (const int page_size : {16, 256}) {
    Case outer = chunk;
    outer.page_size = page_size;
    outer.heads_outer_pages = true;
    outer.append = page_size == 16;
    outer.seqlen_q = page_size == 16 ? 300 : 1024;
    outer.rope = page_size == 16 ? RopeStyle::interleaved : RopeStyle::none;
    cases.push_back(outer);
  }
  // Head dim 64 over pages, the planner's tiles: V's pages before K's in
  // one pool (pages of 16, appended, RoPE: 128-row tiles), a head's K and V
  // side by side (pages of 8, 192-row tiles), and heads outermost in a pool
  // of K's pages, then V's (pages of 256: a box per key block, appended).
  struct PairedPages {
    Case::Storage storage;
    int page_size, seqlen_q;
    bool append, heads_outer;
    RopeStyle rope;
  };
  for (const PairedPages& paired : {PairedPages{Case::Storage::pool_v_first, 16, 300, true, false, RopeStyle::rotate_half},
                                    PairedPages{Case::Storage::heads_paired, 8, 1536, false, false, RopeStyle::none},
                                    PairedPages{Case::Storage::pool_k_first, 256, 1024, true, true, RopeStyle::none}}) {
    Case pair = chunk;
    pair.head_dim = 64;
    pair.kv_storage = paired.storage;
    pair.page_size = paired.page_size;
    pair.seqlen_q = paired.seqlen_q;
    pair.append = paired.append;
    pair.heads_outer_pages = paired.heads_outer;
    pair.rope = paired.rope;
    cases.push_back(pair);
  }
  // V is K (one tensor): no map spans both, so the planner's two-stage
  // tiles copy them apart, at head dims 64 and 128 (pages of 16).
  for (const int head_dim : {64, 128}) {
    Case one = chunk;
    one.head_dim = head_dim;
    one.kv_storage = Case::Storage::one_tensor;
    one.append = false;
    one.seqlen_q = 700;
    cases.push_back(one);
  }
  // Head dim 64 without RoPE: the planner's 192-row tiles (3 × 6 heads × 8
  // query tiles).
  chunk.head_dim = 64;
  chunk.seqlen_q = 1536;
  chunk.page_size = 0;
  chunk.dtype = DType::bf16;
  cases.push_back(chunk);
  // Speculative decoding: 16 tokens of 3 query heads per KV head (48 rows,
  // beyond the decode kernel) in two sequences: the planner's wgmma tiles,
  // split to fill the GPU; appended and rotated, contiguous and paged.
  Case drafts;
  drafts.seqlen_q = 16;
  drafts.seqlen_k = 5000;
  drafts.append = true;
  drafts.rope = RopeStyle::rotate_half;
  cases.push_back(drafts);
  drafts.page_size = 64;
  drafts.rope = RopeStyle::interleaved;
  drafts.dtype = DType::f16;
  cases.push_back(drafts);
  drafts.page_size = 8;
  drafts.append = false;
  drafts.rope = RopeStyle::none;
  drafts.head_dim = 64;
  drafts.window_left = 700;
  drafts.kv_storage = Case::Storage::pool_v_first;
  cases.push_back(drafts);
  check_cases(cases, rng, seed);
}

TEST_CASE("kvcache on the wgmma producer layout above head dim 128: contiguous and paged, appends, RoPE, GQA") {
  // Head dims 192 and 256 (and 160, 224 padded onto them): 128-row tiles of
  // 96 or 80 keys over a contiguous cache, 64 keys over a paged one (blocks
  // must tile pages), two or three stages. The producer walks the block
  // table with 40-56 registers; the last block past a sequence is copied a
  // row at a time (load_paged_rows), pages shorter than 8 rows always are.
  if (!sm90a_or_skip("the wgmma family")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const std::vector<std::pair<int, int>> seqlens = {{64, 800}, {300, 2048}, {200, 339}, {129, 4000}};
  const int head_dims[] = {192, 256, 160, 224};
  const int page_sizes[] = {0, 16, 64, 256, 8, 4};
  std::vector<Case> cases = wgmma_cache_grid(seqlens, 2, [&](Case& c, int index, int) {
    c.head_dim = head_dims[(index + index / 4) % 4];
    c.page_size = page_sizes[index % 6];
    const int kernel_dim = c.head_dim <= 192 ? 192 : 256;
    c.tiles = c.page_size != 0 ? TileConfig{128, 64, 8, kernel_dim == 192 ? 3 : 2, true}
                               : TileConfig{128, kernel_dim == 192 ? 96 : 80, 8, 2, true};
    c.num_splits = kSplitChoices[index % 3];
    // K and V side by side per head: not at 256 (two stages, K and V apart).
    c.kv_storage = static_cast<Case::Storage>(index / 3 % 4);
    if (kernel_dim == 256 && c.kv_storage == Case::Storage::heads_paired) c.kv_storage = Case::Storage::pool_v_first;
  });
  Case chunk = planner_chunk(256);
  cases.push_back(chunk);
  Case outer = chunk;  // pages of heads outermost (8 rows: one group a box)
  outer.page_size = 8;
  outer.heads_outer_pages = true;
  outer.kv_storage = Case::Storage::pool_v_first;
  cases.push_back(outer);
  chunk.head_dim = 192;
  chunk.page_size = 0;
  chunk.rope = RopeStyle::none;
  chunk.dtype = DType::f16;
  cases.push_back(chunk);
  check_cases(cases, rng, seed);
}

TEST_CASE("kvcache: warm calls are graph-capturable (append, RoPE, splits and combine; every kernel)") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  for (int page_size : {0, 64}) {
    for (int seqlen_q : {1, 48}) {  // the decode kernel; the prefill kernel
      Case c;
      c.batch = 2;
      c.seqlen_q = seqlen_q;
      c.seqlen_k = 3000;
      c.append = true;
      c.rope = RopeStyle::rotate_half;
      c.page_size = page_size;
      c.num_splits = 0;  // the heuristic splits this small grid, so the combine kernel runs too
      cases.push_back(c);
    }
    // The wgmma producer layout (sm_90a): its tensor maps travel in the
    // captured launch's parameters.
    if (sm90a_or_skip("the wgmma kvcache graph case")) {
      Case c;
      c.batch = 2;
      c.seqlen_q = 200;
      c.seqlen_k = 3000;
      c.append = true;
      c.rope = RopeStyle::rotate_half;
      c.page_size = page_size;
      c.num_splits = 1;
      c.tiles = {128, 128, 8, 2, true};
      cases.push_back(c);
    }
  }
  check_cases(cases, rng, seed, true);
}

TEST_CASE("kvcache: bad arguments are rejected before launch, naming the argument") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  INFO("seed=", seed);
  Case c;
  c.batch = 2;
  c.seqlen_k = 256;
  c.page_size = 64;
  Inputs in = make_inputs(c, rng);
  const int64_t q_shape[4] = {c.batch, c.seqlen_q, c.heads_q, c.head_dim};
  int64_t strides[4];
  contiguous_strides(q_shape, strides);
  DeviceTensor out(c.dtype, q_shape, strides);
  auto expect_rejected = [&](const std::function<void(CallViews&)>& spoil, const std::string& fragment) {
    INFO("expected an error containing: ", fragment);
    CallViews v;
    fill_call(c, in, v);
    spoil(v);
    CHECK_THROWS_WITH_AS(gpu_tests_runtime().forward_kvcache(in.dq->view(), v.args, out.view(), nullptr, v.options,
                                                             nullptr, 0, nullptr),
                         doctest::Contains(fragment.c_str()), Error);
    size_t written = 0;
    for (uint16_t bits : out.raw()) written += bits != 0xffff;
    CHECK_MESSAGE(written == 0, fmt::format("{} output elements written by a rejected call", written));
  };
  expect_rejected([](CallViews& v) { v.args.num_splits = 129; }, "num_splits=129 must be 0 (heuristic) or 1 to 128");
  expect_rejected([](CallViews& v) { v.args.num_splits = 4; }, "workspace: 0 bytes given; this call needs");
  expect_rejected([](CallViews& v) { v.args.cache_seqlens.dtype = DType::f32; }, "cache_seqlens: dtype f32 must be i32");
  expect_rejected([](CallViews& v) { v.block_table.shape[0] = 1; }, "block_table: must be i32 [batch, max_pages]");
  expect_rejected([](CallViews& v) { v.args.k_cache.shape[1] = v.args.v_cache.shape[1] = 48; },
                  "page_size=48 (dimension 1 of a paged cache) must be a power of two");
  expect_rejected([&](CallViews& v) { v.args.k_new = in.dq.get() ? &v.args.k_cache : nullptr; }, "k_new, v_new: give both or neither");
  expect_rejected([](CallViews& v) { v.args.max_seqlen_k = 100000; }, "max_seqlen_k=100000 must be between 0");
  expect_rejected([](CallViews& v) { v.args.cache_leftpad = &v.args.cache_seqlens; },
                  "cache_leftpad: not supported with a paged cache (block_table)");
  // More new keys than the cache holds would be written past it.
  const int64_t long_shape[4] = {c.batch, in.capacity + 1, c.heads_kv, c.head_dim};
  contiguous_strides(long_shape, strides);
  DeviceTensor too_long(c.dtype, long_shape, strides);
  expect_rejected([&](CallViews& v) {
    v.k_new = v.v_new = too_long.view();
    v.args.k_new = &v.k_new;
    v.args.v_new = &v.v_new;
  }, fmt::format("k_new: seqlen_new={} must be at most the cache's capacity {}", in.capacity + 1, in.capacity));
  CHECK(too_long.count_written_outside(0) == 0);
}

TEST_CASE("kvcache: new keys and values of a call without queries are still appended") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  INFO("seed=", seed);
  for (int page_size : {0, 64}) {
    Case c;
    c.batch = 3;
    c.seqlen_q = 8;  // the new rows (Case::append); the call's q has none
    c.seqlen_k = 300;
    c.append = true;
    c.rope = RopeStyle::rotate_half;
    c.page_size = page_size;
    Inputs in = make_inputs(c, rng);
    CallViews v;
    fill_call(c, in, v);
    TensorView q = in.dq->view();
    q.shape[1] = 0;
    const int64_t out_shape[4] = {c.batch, c.seqlen_q, c.heads_q, c.head_dim};
    int64_t strides[4];
    contiguous_strides(out_shape, strides);
    DeviceTensor out(c.dtype, out_shape, strides);
    TensorView out_view = out.view();
    out_view.shape[1] = 0;
    gpu_tests_runtime().forward_kvcache(q, v.args, out_view, nullptr, v.options, nullptr, 0, nullptr);
    const std::string cache = check_cache(c, in);
    CHECK_MESSAGE(cache.empty(), fmt::format("{}: {}", describe(c, "", seed), cache));
    CHECK(out.count_written_outside(0) == 0);
  }
}

}  // TEST_SUITE
