// Varlen (packed variable-length batches, FlashAttention's
// flash_attn_varlen_func) on a GPU. Sequence b owns query rows
// cu_seqlens_q[b]..cu_seqlens_q[b+1] and key rows from cu_seqlens_k[b] (the
// first seqused_k[b] of them when seqused_k is given); every other semantic
// (causal and windows aligned per sequence, softcap, ALiBi, GQA, rows that see
// no key) is the dense one, per sequence. The references run the dense ones
// per sequence (attention_varlen in reference.hpp); the verdict is
// FlashAttention's tolerance rule (judge), over the rows the sequences own.
// Packed tensors get spare rows at the end that no sequence owns: the kernel
// must leave them (and every stride gap) poisoned. Inputs are fresh random
// values every run (the seed is printed with every failure); lengths include
// 0 and 1 (queries and keys), and keys shorter than queries, so causal rows
// that see nothing occur. Key rows a sequence stores past its seqused_k hold
// NaN: a kernel must never let them into a result. With RoPE the references
// rotate each sequence's rows first (query i of sequence b at position
// i + seqlen_k(b) − seqlen_q(b), key j at j).
// With a workspace the calls may split over keys; the workspace is poisoned
// too. Over a paged cache (VarlenArgs::block_table) each sequence's keys are
// copied into pages in shuffled order; every other page row holds NaN, and
// block-table entries past a sequence's pages name a page of NaN.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu_support.hpp"
#include "plan.hpp"

using namespace jitattn;
using namespace jitattn::test;

namespace {

// q/k/v storage. contiguous: each its own packed [total, heads, head_dim];
// padded: gaps after every head and row (head stride head_dim + 8); qkv: q, k
// and v are slices of one [total, heads_q + 2·heads_kv, head_dim] buffer (row
// stride (heads_q + 2·heads_kv)·head_dim; needs total_q == total_k).
enum class Layout { contiguous, padded, qkv };

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::contiguous: return "contiguous";
    case Layout::padded: return "padded";
    case Layout::qkv: return "qkv";
  }
  return "?";
}

struct Case {
  VarlenShape shape;  // lengths, heads, features (window, softcap, ALiBi slopes)
  DType dtype = DType::bf16;
  Layout layout = Layout::contiguous;
  // The slopes tensor is [batch, heads_q] (shape.common.alibi_slopes then
  // holds batch·heads_q values), else [heads_q].
  bool slopes_per_batch = false;
  // Added to max_seqlen_q/k (they are upper bounds), within the totals.
  int slack = 0;
  // Judge against the GPU reference kernel (large shapes) instead of the CPU one.
  bool gpu_reference = false;
  TileConfig tiles;  // forced tiles (zeros: the planner's)
  int sm_limit = 0;  // ForwardOptions::sm_limit (persistent grids)
  std::optional<RopeReference> rope;  // RoPE on q and k (theta 10000)
  // With rope: angles from cos/sin tables in q's dtype (FlashAttention's),
  // one row per position up to total_k (rope_table_positions).
  bool rope_tables16 = false;
  // The workspace overload with options.num_splits (0: the heuristic); none:
  // the call without a workspace.
  std::optional<int> num_splits;
  // > 0: K/V in a paged cache of pages of this many rows (contiguous layout).
  int page_size = 0;
  // Paged with seqused_k: cu_seqlens_k left out of the call (it is then
  // never read; the kernels would fault on the null pointer).
  bool omit_cu_seqlens_k = false;
  // VarlenArgs::total_seqlen_k: the sum of the keys the sequences use.
  bool total_hint = false;
  // VarlenArgs::dynamic_splits: split counts chosen on the device.
  bool dynamic = false;
};

// A paged case's pages per sequence (at least one column in the table), and
// every page: each sequence's plus one of NaN.
int max_pages_of(const Case& c) {
  int pages = 1;
  for (int b = 0; b < c.shape.batch(); ++b) {
    const int stored = c.shape.cu_seqlens_k[b + 1] - c.shape.cu_seqlens_k[b];
    pages = std::max(pages, (stored + c.page_size - 1) / c.page_size);
  }
  return pages;
}
int num_pages_of(const Case& c) {
  int pages = 1;
  for (int b = 0; b < c.shape.batch(); ++b) {
    pages += (c.shape.cu_seqlens_k[b + 1] - c.shape.cu_seqlens_k[b] + c.page_size - 1) / c.page_size;
  }
  return pages;
}

int max_seqlen_q_of(const Case& c) { return std::min(c.shape.total_q, std::max(1, c.shape.max_seqlen_q()) + c.slack); }
int max_seqlen_k_of(const Case& c) {
  const int capacity = c.page_size > 0 ? max_pages_of(c) * c.page_size : c.shape.total_k;
  return std::min(capacity, std::max(1, c.shape.max_seqlen_k()) + c.slack);
}

// "(q,k)" per sequence, "(q,k/used)" with seqused_k.
std::string lengths_text(const VarlenShape& s) {
  std::string text;
  for (int b = 0; b < s.batch(); ++b) {
    text += fmt::format("{}({},{}", b ? " " : "", s.seqlen_q(b), s.cu_seqlens_k[b + 1] - s.cu_seqlens_k[b]);
    if (!s.seqused_k.empty()) text += fmt::format("/{}", s.seqused_k[b]);
    text += ")";
  }
  return text;
}

std::string describe(const Case& c, const std::string& spec, uint64_t seed) {
  const auto& s = c.shape;
  const auto& a = s.common;
  std::string slopes = "off";
  if (!a.alibi_slopes.empty()) slopes = c.slopes_per_batch ? "[batch, heads_q]" : "[heads_q]";
  return fmt::format(
      "{} {} batch={} lengths(q,k)=[{}] total_q={} total_k={} max_seqlen=({}, {}) heads={}/{} head_dim={} causal={} "
      "window=({}, {}) chunk={} softcap={} alibi={} sinks={} rope={} layout={} pages={} num_splits={}{} reference={} sm_limit={} "
      "seed={}",
      spec.empty() ? "(no spec)" : spec, c.dtype == DType::bf16 ? "bf16" : "f16", s.batch(), lengths_text(s), s.total_q,
      s.total_k, max_seqlen_q_of(c), max_seqlen_k_of(c), a.heads_q, a.heads_kv, a.head_dim, a.causal, a.window_left,
      a.window_right, a.attention_chunk, a.softcap, slopes,
      a.learnable_sink.empty() ? "off" : fmt::format("[{}]", fmt::join(a.learnable_sink, ", ")),
      !c.rope ? std::string("off")
              : fmt::format("{} r{}{}", c.rope->style == RopeStyle::rotate_half ? "half" : "interleaved",
                            c.rope->rotary_dim, c.rope_tables16 ? " tables16" : ""),
      layout_name(c.layout), c.page_size > 0 ? fmt::format("{} rows", c.page_size) : std::string("off"),
      c.num_splits ? fmt::format("{}", *c.num_splits) : std::string("no workspace"), c.dynamic ? " dynamic" : "",
      c.gpu_reference ? "gpu" : "cpu",
      c.sm_limit, seed);
}

std::unique_ptr<DeviceBuffer> upload_i32(const std::vector<int>& values) {
  auto buffer = std::make_unique<DeviceBuffer>(values.size() * 4);
  buffer->upload(values.data(), values.size() * 4);
  return buffer;
}

// Inputs on the device plus their logical values on the host.
struct Inputs {
  std::vector<float> q, k, v;  // packed, contiguous: [total_q, heads_q, head_dim], [total_k, heads_kv, head_dim]
  std::unique_ptr<DeviceTensor> dq, dk, dv;  // contiguous and padded layouts
  std::unique_ptr<DeviceTensor> dqkv;        // qkv layout
  TensorView q_view, k_view, v_view;         // what the kernel gets
  std::unique_ptr<DeviceBuffer> cu_seqlens_q, cu_seqlens_k, seqused_k, slopes, sinks;  // seqused_k/slopes/sinks: null when off
  std::unique_ptr<DeviceTensor> k_pages, v_pages;  // paged: [pages, page_size, heads_kv, head_dim]
  std::unique_ptr<DeviceBuffer> block_table;       // paged: i32 [batch, max_pages]
  RopeTables tables;                                // rope_tables16: entries as handed over
  std::unique_ptr<DeviceBuffer> cos, sin;
};

// Rows of a case's RoPE tables: every key position of every sequence.
int rope_table_positions(const Case& c) { return c.shape.total_k + 1; }

// Copies packed key rows into shuffled pages: row r of sequence b goes to
// row r % page_size of page table[b][r / page_size]. Every other row is NaN,
// and so is the page that table entries past a sequence's pages name.
void page_keys(const Case& c, const std::vector<float>& k, const std::vector<float>& v, std::mt19937_64& rng,
               Inputs& in) {
  const auto& s = c.shape;
  const auto& a = s.common;
  const int pages = num_pages_of(c), max_pages = max_pages_of(c);
  std::vector<int> order(pages);
  for (int i = 0; i < pages; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  const int nan_page = order.back();
  std::vector<int> table(static_cast<size_t>(s.batch()) * max_pages, nan_page);
  const size_t row = static_cast<size_t>(a.heads_kv) * a.head_dim;
  std::vector<float> k_pages(static_cast<size_t>(pages) * c.page_size * row, NAN), v_pages = k_pages;
  int next = 0;
  for (int b = 0; b < s.batch(); ++b) {
    const int stored = s.cu_seqlens_k[b + 1] - s.cu_seqlens_k[b];
    for (int p = 0; p * c.page_size < stored; ++p) table[static_cast<size_t>(b) * max_pages + p] = order[next++];
    for (int r = 0; r < stored; ++r) {
      const size_t from = (s.cu_seqlens_k[b] + r) * row;
      const size_t to = (static_cast<size_t>(table[static_cast<size_t>(b) * max_pages + r / c.page_size]) * c.page_size +
                         r % c.page_size) * row;
      std::copy_n(k.begin() + from, row, k_pages.begin() + to);
      std::copy_n(v.begin() + from, row, v_pages.begin() + to);
    }
  }
  const int64_t shape[4] = {pages, c.page_size, a.heads_kv, a.head_dim};
  int64_t strides[4];
  contiguous_strides(shape, strides);
  in.k_pages = std::make_unique<DeviceTensor>(k_pages, c.dtype, shape, strides);
  in.v_pages = std::make_unique<DeviceTensor>(v_pages, c.dtype, shape, strides);
  in.k_view = in.k_pages->view();
  in.v_view = in.v_pages->view();
  in.block_table = upload_i32(table);
}

Inputs make_inputs(const Case& c, std::mt19937_64& rng) {
  const auto& s = c.shape;
  const auto& a = s.common;
  Inputs in;
  // Spare rows get values too: a kernel reading them would go wrong.
  in.q = random_values(static_cast<size_t>(s.total_q) * a.heads_q * a.head_dim, c.dtype, rng);
  in.k = random_values(static_cast<size_t>(s.total_k) * a.heads_kv * a.head_dim, c.dtype, rng);
  in.v = random_values(static_cast<size_t>(s.total_k) * a.heads_kv * a.value_dim(), c.dtype, rng);
  if (a.value_dim() != a.head_dim && (c.layout == Layout::qkv || c.page_size > 0)) {
    throw std::invalid_argument("a value head dim of its own: packed k/v in the contiguous or padded layout");
  }
  if (c.rope && c.rope_tables16) {
    in.tables = rope_tables(*c.rope, a.head_dim, rope_table_positions(c));
    round_tables(in.tables, c.dtype);
    const std::vector<unsigned char> cos = table_bytes(in.tables.cos, c.dtype), sin = table_bytes(in.tables.sin, c.dtype);
    in.cos = std::make_unique<DeviceBuffer>(cos.size());
    in.cos->upload(cos.data(), cos.size());
    in.sin = std::make_unique<DeviceBuffer>(sin.size());
    in.sin->upload(sin.data(), sin.size());
  }
  if (!s.seqused_k.empty()) {
    const size_t row = static_cast<size_t>(a.heads_kv) * a.head_dim, v_row = static_cast<size_t>(a.heads_kv) * a.value_dim();
    for (int b = 0; b < s.batch(); ++b) {
      const int first = s.cu_seqlens_k[b] + s.seqused_k[b], end = s.cu_seqlens_k[b + 1];
      std::fill(in.k.begin() + first * row, in.k.begin() + end * row, NAN);
      std::fill(in.v.begin() + first * v_row, in.v.begin() + end * v_row, NAN);
    }
  }
  if (c.layout == Layout::qkv) {
    if (s.total_q != s.total_k) throw std::invalid_argument("the qkv layout needs total_q == total_k");
    const int heads = a.heads_q + 2 * a.heads_kv;
    const size_t d = a.head_dim;
    std::vector<float> qkv(static_cast<size_t>(s.total_q) * heads * d);
    for (int r = 0; r < s.total_q; ++r) {
      float* row = qkv.data() + static_cast<size_t>(r) * heads * d;
      std::copy_n(in.q.begin() + static_cast<size_t>(r) * a.heads_q * d, a.heads_q * d, row);
      std::copy_n(in.k.begin() + static_cast<size_t>(r) * a.heads_kv * d, a.heads_kv * d, row + a.heads_q * d);
      std::copy_n(in.v.begin() + static_cast<size_t>(r) * a.heads_kv * d, a.heads_kv * d, row + (a.heads_q + a.heads_kv) * d);
    }
    const int64_t shape[4] = {1, s.total_q, heads, a.head_dim};
    int64_t strides[4];
    contiguous_strides(shape, strides);
    in.dqkv = std::make_unique<DeviceTensor>(qkv, c.dtype, shape, strides);
    in.q_view = packed_view(*in.dqkv, 0, a.heads_q);
    in.k_view = packed_view(*in.dqkv, a.heads_q, a.heads_kv);
    in.v_view = packed_view(*in.dqkv, a.heads_q + a.heads_kv, a.heads_kv);
  } else {
    const int64_t q_shape[4] = {1, s.total_q, a.heads_q, a.head_dim};
    const int64_t kv_shape[4] = {1, s.total_k, a.heads_kv, a.head_dim};
    const int64_t v_shape[4] = {1, s.total_k, a.heads_kv, a.value_dim()};
    int64_t q_strides[4], kv_strides[4], v_strides[4];
    if (c.layout == Layout::padded) {
      padded_strides(q_shape, q_strides);
      padded_strides(kv_shape, kv_strides);
      padded_strides(v_shape, v_strides);
    } else {
      contiguous_strides(q_shape, q_strides);
      contiguous_strides(kv_shape, kv_strides);
      contiguous_strides(v_shape, v_strides);
    }
    in.dq = std::make_unique<DeviceTensor>(in.q, c.dtype, q_shape, q_strides);
    in.dk = std::make_unique<DeviceTensor>(in.k, c.dtype, kv_shape, kv_strides);
    in.dv = std::make_unique<DeviceTensor>(in.v, c.dtype, v_shape, v_strides);
    in.q_view = packed_view(*in.dq);
    in.k_view = packed_view(*in.dk);
    in.v_view = packed_view(*in.dv);
  }
  if (c.page_size > 0) page_keys(c, in.k, in.v, rng, in);
  in.cu_seqlens_q = upload_i32(s.cu_seqlens_q);
  in.cu_seqlens_k = upload_i32(s.cu_seqlens_k);
  if (!s.seqused_k.empty()) in.seqused_k = upload_i32(s.seqused_k);
  if (!a.alibi_slopes.empty()) {
    in.slopes = std::make_unique<DeviceBuffer>(a.alibi_slopes.size() * 4);
    in.slopes->upload(a.alibi_slopes.data(), a.alibi_slopes.size() * 4);
  }
  if (!a.learnable_sink.empty()) {
    in.sinks = std::make_unique<DeviceBuffer>(a.learnable_sink.size() * 4);
    in.sinks->upload(a.learnable_sink.data(), a.learnable_sink.size() * 4);
  }
  return in;
}

TensorView slopes_view(const Case& c, void* data) {
  if (c.slopes_per_batch) return TensorView::contiguous(data, DType::f32, {c.shape.batch(), c.shape.common.heads_q});
  return TensorView::contiguous(data, DType::f32, {c.shape.common.heads_q});
}

// Views of a case's 16-bit RoPE tables at `cos` and `sin`.
TensorView table_view(const Case& c, void* data) {
  return TensorView::contiguous(data, c.dtype, {rope_table_positions(c), c.rope->rotary_dim / 2});
}

// The learnable_sink tensor of a case: f32 [heads_q].
TensorView sinks_view(const Case& c, void* data) {
  return TensorView::contiguous(data, DType::f32, {c.shape.common.heads_q});
}

ForwardOptions options_for(const Case& c, const TensorView* slopes, const TensorView* sinks,
                           const TensorView* cos = nullptr, const TensorView* sin = nullptr) {
  const auto& a = c.shape.common;
  ForwardOptions options;
  options.causal = a.causal;
  options.window_left = a.window_left;
  options.window_right = a.window_right;
  options.attention_chunk = a.attention_chunk;
  options.softcap = a.softcap;
  options.alibi_slopes = slopes;
  options.learnable_sink = sinks;
  if (a.scale > 0.f) options.softmax_scale = a.scale;
  options.tiles = c.tiles;
  options.sm_limit = c.sm_limit;
  if (c.rope) {
    options.rope.style = c.rope->style;
    options.rope.rotary_dim = c.rope->rotary_dim;
    options.rope.cos = cos;
    options.rope.sin = sin;
  }
  options.num_splits = c.num_splits.value_or(0);
  return options;
}

// The i32 vectors and maxima of a call; the views point at `data` (device
// buffers for a run, placeholders for planning).
struct VarlenViews {
  TensorView cu_seqlens_q, cu_seqlens_k, seqused_k, block_table;
  VarlenArgs args;
};

void make_varlen(const Case& c, void* cu_q, void* cu_k, void* seqused, VarlenViews& views, void* table = nullptr) {
  const int64_t batch = c.shape.batch();
  views.cu_seqlens_q = TensorView::contiguous(cu_q, DType::i32, {batch + 1});
  views.cu_seqlens_k = TensorView::contiguous(cu_k, DType::i32, {batch + 1});
  views.args.cu_seqlens_q = views.cu_seqlens_q;
  views.args.cu_seqlens_k = c.omit_cu_seqlens_k ? TensorView{} : views.cu_seqlens_k;
  views.args.max_seqlen_q = max_seqlen_q_of(c);
  views.args.max_seqlen_k = max_seqlen_k_of(c);
  views.args.seqused_k = nullptr;
  if (!c.shape.seqused_k.empty()) {
    views.seqused_k = TensorView::contiguous(seqused, DType::i32, {batch});
    views.args.seqused_k = &views.seqused_k;
  }
  views.args.total_seqlen_k = 0;
  views.args.dynamic_splits = c.dynamic;
  if (c.total_hint) {
    for (int b = 0; b < batch; ++b) views.args.total_seqlen_k += c.shape.seqlen_k(b);
  }
  views.args.block_table = nullptr;
  if (c.page_size > 0) {
    views.block_table = TensorView::contiguous(table, DType::i32, {batch, max_pages_of(c)});
    views.args.block_table = &views.block_table;
  }
}

// The spec a case will use (default tiles: the runtime may prefer tuned
// ones), planned on placeholder pointers (planning reads no memory); "" when
// planning rejects it (the run then reports why).
std::string spec_of(const Case& c) {
  const auto& s = c.shape;
  const auto& a = s.common;
  void* placeholder = reinterpret_cast<void*>(uintptr_t{1} << 20);
  const TensorView q = TensorView::contiguous(placeholder, c.dtype, {s.total_q, a.heads_q, a.head_dim});
  const TensorView kv =
      c.page_size > 0
          ? TensorView::contiguous(placeholder, c.dtype, {num_pages_of(c), c.page_size, a.heads_kv, a.head_dim})
          : TensorView::contiguous(placeholder, c.dtype, {s.total_k, a.heads_kv, a.head_dim});
  const TensorView v = c.page_size > 0 ? kv : TensorView::contiguous(placeholder, c.dtype, {s.total_k, a.heads_kv, a.value_dim()});
  const TensorView out = TensorView::contiguous(placeholder, c.dtype, {s.total_q, a.heads_q, a.value_dim()});
  const TensorView lse = TensorView::contiguous(placeholder, DType::f32, {a.heads_q, s.total_q});
  const TensorView slopes = slopes_view(c, placeholder);
  const TensorView sinks = sinks_view(c, placeholder);
  VarlenViews varlen;
  make_varlen(c, placeholder, placeholder, placeholder, varlen, placeholder);
  const TensorView table = c.rope_tables16 ? table_view(c, placeholder) : TensorView{};
  const ForwardOptions options = options_for(c, a.alibi_slopes.empty() ? nullptr : &slopes,
                                             a.learnable_sink.empty() ? nullptr : &sinks,
                                             c.rope_tables16 ? &table : nullptr, c.rope_tables16 ? &table : nullptr);
  // Planned for this GPU, as the runtime plans (its shared memory bounds
  // the tiles and counts the CTAs an SM holds).
  const detail::Arch arch = detail::Arch::parse(current_arch());
  const int max_smem = current_max_smem_per_block(), sms = current_sm_count();
  try {
    if (c.num_splits) {
      return detail::plan_forward_varlen_split(q, kv, v, out, &lse, varlen.args, options, nullptr, 0, true, arch,
                                               max_smem, sms)
          .attention.spec.text();
    }
    return detail::plan_forward_varlen(q, kv, v, out, &lse, varlen.args, options, arch, max_smem, sms).spec.text();
  } catch (const std::exception&) {
    return {};
  }
}

struct KernelRun {
  std::vector<float> out;  // [total_q, heads_q, head_dim], contiguous
  std::vector<float> lse;  // [heads_q, total_q], contiguous
  size_t out_written_outside = 0;  // out elements written past the owned rows or in stride gaps
  size_t lse_written_outside = 0;  // likewise for lse
  std::string spec;
  std::string repeat_mismatch;  // launch_repeated: a repeat that read back other bits
};

// Runs jitattn with out and lse poisoned (every byte 0xff) first. The output
// is in another layout than the inputs, and lse has a padded head stride
// except in the contiguous layout.
KernelRun run_kernel(const Case& c, const Inputs& in) {
  const auto& s = c.shape;
  const auto& a = s.common;
  const int64_t out_shape[4] = {1, s.total_q, a.heads_q, a.value_dim()};
  int64_t out_strides[4];
  switch (c.layout) {
    case Layout::contiguous: heads_major_strides(out_shape, out_strides); break;  // [heads, total, head_dim]
    case Layout::padded: contiguous_strides(out_shape, out_strides); break;
    case Layout::qkv: padded_strides(out_shape, out_strides); break;
  }
  DeviceTensor out(c.dtype, out_shape, out_strides);
  const int64_t lse_head_stride = c.layout == Layout::contiguous ? s.total_q : s.total_q + 5;
  DeviceBuffer lse(static_cast<size_t>(a.heads_q) * lse_head_stride * 4);
  TensorView lse_view;
  lse_view.data = lse.get();
  lse_view.dtype = DType::f32;
  lse_view.ndim = 2;
  lse_view.shape[0] = a.heads_q, lse_view.shape[1] = s.total_q;
  lse_view.strides[0] = lse_head_stride, lse_view.strides[1] = 1;
  VarlenViews varlen;
  make_varlen(c, in.cu_seqlens_q->get(), in.cu_seqlens_k->get(), in.seqused_k ? in.seqused_k->get() : nullptr, varlen,
              in.block_table ? in.block_table->get() : nullptr);
  TensorView slopes, sinks;
  if (in.slopes) slopes = slopes_view(c, in.slopes->get());
  if (in.sinks) sinks = sinks_view(c, in.sinks->get());
  TensorView cos, sin;
  if (in.cos) cos = table_view(c, in.cos->get()), sin = table_view(c, in.sin->get());
  const ForwardOptions options = options_for(c, in.slopes ? &slopes : nullptr, in.sinks ? &sinks : nullptr,
                                             in.cos ? &cos : nullptr, in.cos ? &sin : nullptr);
  Runtime& runtime = gpu_tests_runtime();
  // The workspace poisoned: a split must write every partial it reads.
  size_t workspace_bytes = 0;
  if (c.num_splits) {
    workspace_bytes = runtime.forward_varlen_workspace_bytes(in.q_view, in.k_view, in.v_view, packed_view(out),
                                                             &lse_view, varlen.args, options);
  }
  DeviceBuffer workspace(std::max<size_t>(workspace_bytes, 256));
  std::string mismatch;
  KernelRun run = launch_repeated(
      [&] {
        out.buffer.fill_bytes(0xff);
        lse.fill_bytes(0xff);
        workspace.fill_bytes(0xff);
        if (c.num_splits) {
          runtime.forward_varlen(in.q_view, in.k_view, in.v_view, packed_view(out), &lse_view, varlen.args, options,
                                 workspace_bytes > 0 ? workspace.get() : nullptr, workspace_bytes, nullptr);
        } else {
          runtime.forward_varlen(in.q_view, in.k_view, in.v_view, packed_view(out), &lse_view, varlen.args, options,
                                 nullptr);
        }
        KernelRun read;
        read.out = out.read();
        read.out_written_outside = out.count_written_outside(s.used_q());
        std::vector<uint32_t> bits(static_cast<size_t>(a.heads_q) * lse_head_stride);
        lse.download(bits.data(), bits.size() * 4);
        read.lse.resize(static_cast<size_t>(a.heads_q) * s.total_q);
        for (int h = 0; h < a.heads_q; ++h) {
          for (int64_t i = 0; i < lse_head_stride; ++i) {
            const uint32_t word = bits[h * lse_head_stride + i];
            if (i < s.used_q()) {
              std::memcpy(&read.lse[static_cast<size_t>(h) * s.total_q + i], &word, 4);
            } else {
              read.lse_written_outside += word != 0xffffffffu;
              if (i < s.total_q) read.lse[static_cast<size_t>(h) * s.total_q + i] = NAN;  // not judged
            }
          }
        }
        return read;
      },
      mismatch);
  run.spec = spec_of(c);
  run.repeat_mismatch = std::move(mismatch);
  return run;
}

// Rotates packed q and k rows as a framework would before attention (exact:
// in float64): query i of sequence b at position i + seqlen_k(b) −
// seqlen_q(b), key j at j; spare rows at 0. Angles from `tables` where not
// null (before the first key: its first row).
void rotate_packed(const Case& c, const RopeTables* tables, bool exact, std::vector<float>& q, std::vector<float>& k) {
  const auto& s = c.shape;
  const auto& a = s.common;
  std::vector<int> q_positions(s.total_q, 0), k_positions(s.total_k, 0);
  for (int b = 0; b < s.batch(); ++b) {
    for (int i = 0; i < s.seqlen_q(b); ++i) q_positions[s.cu_seqlens_q[b] + i] = i + s.seqlen_k(b) - s.seqlen_q(b);
    for (int j = s.cu_seqlens_k[b]; j < s.cu_seqlens_k[b + 1]; ++j) k_positions[j] = j - s.cu_seqlens_k[b];
  }
  rotate_reference(q, 1, s.total_q, a.heads_q, a.head_dim, *c.rope, tables,
                   [&](int, int row) { return q_positions[row]; }, exact, c.dtype);
  rotate_reference(k, 1, s.total_k, a.heads_kv, a.head_dim, *c.rope, tables,
                   [&](int, int row) { return k_positions[row]; }, exact, c.dtype, /*packed16=*/true);
}

// The cases checked in groups (check_in_groups): the kernel against both
// references, and its poison check. Returns, per case, how many (row, head)
// pairs see no key.
std::vector<size_t> check_cases(const std::vector<Case>& cases, std::mt19937_64& rng, uint64_t seed) {
  return check_in_groups(
      cases, [&](const Case& c) { return make_inputs(c, rng); },
      [](const Case& c, const Inputs& in) {
        References r;
        std::vector<float> q[2] = {in.q, in.q}, k[2] = {in.k, in.k};  // [0] exact, [1] rounded
        for (bool exact : {true, false}) {
          std::vector<float>&q_ref = q[!exact], &k_ref = k[!exact];
          if (c.rope) rotate_packed(c, c.rope_tables16 ? &in.tables : nullptr, exact, q_ref, k_ref);
          if (c.gpu_reference) {
            (exact ? r.exact : r.rounded) = gpu_reference_varlen(c.shape, q_ref, k_ref, in.v, c.dtype, exact);
          } else {
            (exact ? r.exact : r.rounded) = exact ? attention_varlen_exact(c.shape, q_ref, k_ref, in.v)
                                                  : attention_varlen_16bit(c.shape, q_ref, k_ref, in.v, c.dtype);
          }
        }
        // (GPU references are for calls of many rows, whose LSE yardstick is
        // stable; the CPU pass over every pair would cost what they save.)
        if (c.rope && !c.gpu_reference) r.rounded.logit_rounding = logit_rounding_varlen(c.shape, q[0], k[0], q[1], k[1]);
        return r;
      },
      [&](const Case& c, const Inputs& in, const References& r) {
        const auto ran = run_case(r, [&] { return describe(c, spec_of(c), seed); }, [&] { return run_kernel(c, in); });
        if (!ran) return;
        const auto& run = *ran;
        const Verdict verdict = judge_varlen(c.shape, run.out, run.lse, r.exact, r.rounded);
        CHECK_MESSAGE(verdict.ok(), fmt::format("{}: {}", describe(c, run.spec, seed), verdict.summary()));
        CHECK_MESSAGE(run.out_written_outside + run.lse_written_outside == 0,
                      fmt::format("{}: {} out and {} lse elements written outside the sequences' rows (spare rows or "
                                  "stride gaps)",
                                  describe(c, run.spec, seed), run.out_written_outside, run.lse_written_outside));
        if (!run.repeat_mismatch.empty()) FAIL_CHECK(std::string(describe(c, run.spec, seed) + ": " + run.repeat_mismatch));
      });
}

// 0 and 1 one time in eight each, 2..64 one time in eight, else 0..max.
int random_length(std::mt19937_64& rng, int max) {
  switch (std::uniform_int_distribution<int>(0, 7)(rng)) {
    case 0: return 0;
    case 1: return 1;
    case 2: return std::uniform_int_distribution<int>(2, 64)(rng);
    default: return std::uniform_int_distribution<int>(0, max)(rng);
  }
}

// 1..9 sequences with independent query and key lengths (keys often fewer
// than queries), then 1..4 spare rows in q and in k.
VarlenShape random_batch(const AttentionShape& common, std::mt19937_64& rng, int max_length = 700) {
  const int batch = std::uniform_int_distribution<int>(1, 9)(rng);
  std::vector<int> seqlens_q(batch), seqlens_k(batch);
  for (int b = 0; b < batch; ++b) {
    seqlens_q[b] = random_length(rng, max_length);
    seqlens_k[b] = random_length(rng, max_length);
  }
  std::uniform_int_distribution<int> spare(1, 4);
  const int spare_q = spare(rng);
  return VarlenShape::packed(common, seqlens_q, seqlens_k, spare_q, spare(rng));
}

// Self-attention: each sequence's keys are its queries (what the qkv layout needs).
VarlenShape random_self_batch(const AttentionShape& common, std::mt19937_64& rng, int max_length = 700) {
  const int batch = std::uniform_int_distribution<int>(1, 9)(rng);
  std::vector<int> seqlens(batch);
  for (auto& length : seqlens) length = random_length(rng, max_length);
  const int spare = std::uniform_int_distribution<int>(1, 4)(rng);
  return VarlenShape::packed(common, seqlens, seqlens, spare, spare);
}

// seqused_k[b] anywhere in 0..stored keys, with 0 and "all" one time in four each.
std::vector<int> random_seqused(const VarlenShape& s, std::mt19937_64& rng) {
  std::vector<int> used(s.batch());
  for (int b = 0; b < s.batch(); ++b) {
    const int stored = s.cu_seqlens_k[b + 1] - s.cu_seqlens_k[b];
    switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
      case 0: used[b] = 0; break;
      case 1: used[b] = stored; break;
      default: used[b] = std::uniform_int_distribution<int>(0, stored)(rng);
    }
  }
  return used;
}

// Slopes in (0, 1].
std::vector<float> random_slopes(size_t count, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  std::vector<float> slopes(count);
  for (auto& slope : slopes) slope = 1.f - uniform(rng);
  return slopes;
}

// Gives c ALiBi slopes: one row per sequence, or one per head.
void add_slopes(Case& c, bool per_batch, std::mt19937_64& rng) {
  c.slopes_per_batch = per_batch;
  const int heads = c.shape.common.heads_q;
  c.shape.common.alibi_slopes = random_slopes(per_batch ? static_cast<size_t>(c.shape.batch()) * heads : heads, rng);
}

AttentionShape make_common(int heads_q, int heads_kv, int head_dim, bool causal) {
  AttentionShape s;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.head_dim = head_dim;
  s.causal = causal;
  return s;
}

// Five sequences decoding one token each over 1 to 3000 keys (8 query heads
// over 2, head dim 128, causal), with spare rows in q and k.
VarlenShape decoding_steps(std::mt19937_64& rng) {
  std::vector<int> ones(5, 1), keys;
  for (int b = 0; b < 5; ++b) keys.push_back(std::uniform_int_distribution<int>(1, 3000)(rng));
  return VarlenShape::packed(make_common(8, 2, 128, true), ones, keys, 2, 3);
}

const DType kDTypes[] = {DType::f16, DType::bf16};

}  // namespace

TEST_SUITE("gpu") {

TEST_CASE("varlen: random packed batches, f16/bf16, head dims 64/128/80/59, MHA/GQA/MQA, causal and not") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const std::pair<int, int> heads[] = {{6, 6}, {6, 2}, {6, 1}};
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : kDTypes) {
    for (int head_dim : {64, 128, 80, 59}) {
      for (const auto& [heads_q, heads_kv] : heads) {
        for (bool causal : {false, true}) {
          Case c;
          c.dtype = dtype;
          c.layout = index % 2 == 0 ? Layout::contiguous : Layout::padded;
          c.slack = index % 4 == 3 ? 37 : 0;
          c.shape = random_batch(make_common(heads_q, heads_kv, head_dim, causal), rng);
          cases.push_back(c);
          ++index;
        }
      }
    }
  }
  // Every edge in one batch: no queries (with and without keys), no keys, one
  // of each, keys far fewer than queries (causal rows that see nothing) and
  // the other way round, near-equal long sequences.
  const size_t edge_first = cases.size();
  for (DType dtype : kDTypes) {
    for (bool causal : {false, true}) {
      Case c;
      c.dtype = dtype;
      c.layout = causal ? Layout::padded : Layout::contiguous;
      c.shape = VarlenShape::packed(make_common(6, causal ? 2 : 1, dtype == DType::bf16 ? 128 : 80, causal),
                                    {0, 0, 5, 1, 1, 300, 650, 700, 129}, {0, 17, 0, 1, 300, 1, 700, 120, 129}, 3, 2);
      cases.push_back(c);
    }
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  const std::vector<size_t> empty = check_cases(cases, rng, seed);
  size_t edge_empty_rows = 0;  // causal edge batches: (5, 0), (300, 1) and (700, 120) leave rows without keys
  for (size_t i = edge_first; i < cases.size(); ++i) edge_empty_rows += cases[i].shape.common.causal ? empty[i] : 0;
  CHECK_MESSAGE(edge_empty_rows > 0, "the causal edge batches were meant to include rows that see no key");
}

TEST_CASE("varlen: decoding batches of uneven lengths split their keys (total_seqlen_k, packed k's rows, or "
          "dynamic_splits)") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  // Sixteen decoding steps of 32 query heads over 8 KV heads at d128 (128
  // tiles, unsplit when even): one sequence of 20000 keys, fifteen of up to
  // 2500. Packed k/v (their rows tell the total), then paged with seqused_k
  // and the total given.
  std::uniform_int_distribution<int> short_length(0, 2500);
  std::vector<int> seqlens_k{20000};
  for (int b = 1; b < 16; ++b) seqlens_k.push_back(short_length(rng));
  std::vector<Case> cases;
  for (int variant = 0; variant < 4; ++variant) {
    Case c;
    c.dtype = variant % 2 == 0 ? DType::bf16 : DType::f16;
    c.shape = VarlenShape::packed(make_common(32, 8, 128, true), std::vector<int>(16, 1), seqlens_k);
    c.num_splits = 0;
    // Variants 2 and 3: dynamic splits, told nothing of the total (paged
    // with seqused_k in 3, with one sequence of no keys).
    c.dynamic = variant >= 2;
    if (variant == 3) {
      c.page_size = 16;
      c.shape.seqused_k = seqlens_k;
      c.shape.seqused_k[7] = 0;
    }
    if (variant == 1) {
      c.page_size = 64;
      c.shape.seqused_k = seqlens_k;
      c.shape.seqused_k[3] /= 2;
      c.total_hint = true;
    }
    CAPTURE(describe(c, spec_of(c), seed));
    CHECK(spec_of(c).find(".split") != std::string::npos);
    if (variant == 1) {
      Case told_nothing = c;
      told_nothing.total_hint = false;
      CHECK(spec_of(told_nothing).find(".split") == std::string::npos);
    }
    cases.push_back(c);
  }
  check_cases(cases, rng, seed);
}

TEST_CASE("varlen: decoding steps on resident decode tiles (64, 48 and 32 KB CTAs), packed and paged") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  // 20, 28 and 40 one-token steps of 32 query heads over 8 KV heads (160-320
  // tiles on 132 SMs), up to 1500 keys each, some of 0 and 1: on sm_90 the
  // planner runs every tile at once in CTAs of 64, 48 and 32 KB, unsplit,
  // with a workspace or without (plan/tiles.cpp, decode_grid_resident).
  std::uniform_int_distribution<int> length(0, 1500);
  std::vector<Case> cases;
  const int batches[] = {20, 28, 40, 20, 28, 40};
  for (int variant = 0; variant < 6; ++variant) {
    const int batch = batches[variant];
    std::vector<int> seqlens_k;
    for (int b = 0; b < batch; ++b) seqlens_k.push_back(b == 1 ? 0 : b == 2 ? 1 : length(rng));
    Case c;
    c.dtype = variant % 2 == 0 ? DType::bf16 : DType::f16;
    c.shape = VarlenShape::packed(make_common(32, 8, variant == 3 ? 64 : 128, variant != 4),
                                  std::vector<int>(batch, 1), seqlens_k);
    if (variant >= 3) c.num_splits = 0;
    if (variant == 1 || variant == 5) c.page_size = 64;
    if (variant == 2) c.page_size = 16;
    if (variant == 5) c.shape.seqused_k = seqlens_k;
    CAPTURE(describe(c, spec_of(c), seed));
    if (current_arch().rfind("sm_90", 0) == 0) {
      const std::string spec = spec_of(c);
      CHECK(spec.find(".split") == std::string::npos);
      const int chunk_keys = variant == 3 && c.page_size != 16 ? 32 : 16;
      CHECK(spec.find(fmt::format(".br16.bc{}.w{}.s", chunk_keys, batch <= 24 ? 4 : 2)) != std::string::npos);
    }
    cases.push_back(c);
  }
  check_cases(cases, rng, seed);
}

TEST_CASE("varlen: q, k and v as slices of one packed qkv buffer (row stride (heads_q + 2 heads_kv) head_dim)") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  for (DType dtype : kDTypes) {
    for (bool causal : {false, true}) {
      for (const auto& [heads_q, heads_kv, head_dim] : {std::tuple{6, 2, 128}, std::tuple{4, 4, 64}, std::tuple{6, 2, 111}}) {
        Case c;
        c.dtype = dtype;
        c.layout = Layout::qkv;
        c.shape = random_self_batch(make_common(heads_q, heads_kv, head_dim, causal), rng);
        if (causal && heads_kv == 2) c.shape.seqused_k = random_seqused(c.shape, rng);  // rows without keys
        cases.push_back(c);
      }
    }
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  check_cases(cases, rng, seed);
}

TEST_CASE("varlen: sliding windows, softcap, ALiBi per head and per sequence, seqused_k") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : kDTypes) {
    auto add = [&](Case c) {
      c.dtype = dtype;
      c.layout = index % 2 == 0 ? Layout::padded : Layout::contiguous;
      cases.push_back(std::move(c));
      ++index;
    };
    {  // a two-sided window
      Case c;
      c.shape = random_batch(make_common(6, 2, 64, false), rng);
      c.shape.common.window_left = 30;
      c.shape.common.window_right = 7;
      add(c);
    }
    {  // causal + left window
      Case c;
      c.shape = random_batch(make_common(6, 1, 128, true), rng);
      c.shape.common.window_left = 50;
      add(c);
    }
    {  // softcap and per-sequence ALiBi, causal
      Case c;
      c.shape = random_batch(make_common(6, 2, 128, true), rng);
      c.shape.common.softcap = 20.f;
      add_slopes(c, true, rng);
      add(c);
    }
    {  // a small softcap, per-head ALiBi and a left window, padded head dim
      Case c;
      c.shape = random_batch(make_common(6, 6, 80, false), rng);
      c.shape.common.softcap = 5.f;
      c.shape.common.window_left = 40;
      add_slopes(c, false, rng);
      add(c);
    }
    {  // seqused_k, causal: alignment to the used keys
      Case c;
      c.shape = random_batch(make_common(6, 2, 64, true), rng);
      c.shape.seqused_k = random_seqused(c.shape, rng);
      add(c);
    }
    {  // seqused_k with a window, per-sequence ALiBi and a loose max_seqlen
      Case c;
      c.shape = random_batch(make_common(6, 2, 128, false), rng);
      c.shape.seqused_k = random_seqused(c.shape, rng);
      c.shape.common.window_left = 20;
      c.shape.common.window_right = 100;
      add_slopes(c, true, rng);
      c.slack = 50;
      add(c);
    }
    {  // everything at once
      Case c;
      c.shape = random_batch(make_common(6, 2, 80, true), rng);
      c.shape.seqused_k = random_seqused(c.shape, rng);
      c.shape.common.window_left = 64;
      c.shape.common.softcap = 30.f;
      add_slopes(c, true, rng);
      add(c);
    }
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  check_cases(cases, rng, seed);
}

TEST_CASE("varlen with the producer layouts (sm_90a): wgmma and mma.sync, masks, softcap, ALiBi, seqused_k, RoPE, edges") {
  // A CTA past its sequence's queries leaves before the warpgroups split;
  // the producer reads each sequence's keys through cu_seqlens/seqused_k.
  if (!sm90a_or_skip("the wgmma family")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : kDTypes) {
    // 59 and 111: rows staged and shifted by the producer (FwdConfig::kStagedRows).
    // 192 and 256: O in 128-column wgmmas; K and V by tensor copies, RoPE
    // included (the producer rotates K once it has landed).
    for (int head_dim : {64, 128, 80, 59, 111, 192, 256}) {
      for (bool causal : {false, true}) {
        const bool unaligned = head_dim % 8 != 0;
        Case c;
        c.dtype = dtype;
        c.layout = index % 2 == 0 ? Layout::contiguous : Layout::padded;
        c.shape = random_batch(make_common(6, index % 3 == 0 ? 6 : 2, head_dim, causal), rng);
        if (index % 4 == 1) c.shape.common.window_left = 40;
        if (index % 5 == 2) c.shape.common.softcap = 30.f;
        if (index % 3 == 2) add_slopes(c, index % 2 == 0, rng);
        if (index % 4 == 3) c.shape.seqused_k = random_seqused(c.shape, rng);
        if (index % 2 == 1) {
          // RoPE, full or half rotation, both styles (the producer rotates
          // each sequence's K blocks from its own first key).
          RopeReference rope;
          rope.style = index % 4 == 1 ? RopeStyle::rotate_half : RopeStyle::interleaved;
          rope.rotary_dim = index % 3 == 0 ? head_dim / 16 * 16 : head_dim / 2 / 16 * 16;
          c.rope = rope;
          // 16-bit tables: staged beside K at head dims 65-128 on wgmma
          // tiles (FwdConfig::kStagedTables), loaded from L2 elsewhere.
          c.rope_tables16 = index % 8 == 3 || index % 8 == 5;
        }
        // Two 64 KB stages fill shared memory at head dims above 64 (the
        // planner's 96- and 80-key blocks at 192 and 256).
        c.tiles = index % 6 == 5 && !unaligned && head_dim <= 128
                      ? TileConfig{256, 64, 8, 3}
                      : TileConfig{128, head_dim > 128 ? (head_dim == 192 ? 96 : 80) : head_dim > 64 && !unaligned ? 128 : 64,
                                   8, head_dim > 64 ? 2 : 2 + index % 3, true};
        cases.push_back(c);
        ++index;
      }
    }
    Case edges;  // no queries, no keys, one of each, rows that see nothing
    edges.dtype = dtype;
    edges.shape = VarlenShape::packed(make_common(6, 2, 128, true), {0, 0, 5, 1, 1, 300, 650, 700, 129},
                                      {0, 17, 0, 1, 300, 1, 700, 120, 129}, 3, 2);
    edges.tiles = {128, 128, 8, 2, true};
    cases.push_back(edges);
    edges.rope = RopeReference{};
    edges.rope->rotary_dim = 128;
    edges.shape.seqused_k = {0, 10, 0, 1, 129, 0, 640, 120, 64};
    cases.push_back(edges);
    // Three MMA warpgroups (192 rows): the 32-register producer copies the
    // V block that ends past a sequence (NaN rows past seqused_k) itself.
    Case three;
    three.dtype = dtype;
    three.shape = random_batch(make_common(6, 2, 64, true), rng);
    three.shape.seqused_k = random_seqused(three.shape, rng);
    three.tiles = {192, 128, 12, 4, true};
    cases.push_back(three);
  }
  // Persistent: CTAs walk the tiles of every sequence and skip those past a
  // sequence's queries; 1-5 CTAs give each many tiles.
  const size_t ordinary = cases.size();
  for (size_t i = 0; i < ordinary; ++i) {
    Case c = cases[i];
    // Unaligned rows and head dims above 128: ordinary grids only.
    if (!c.tiles.wgmma || c.shape.common.head_dim % 8 != 0 || c.shape.common.head_dim > 128) continue;
    c.tiles.persistent = true;
    c.sm_limit = 1 + static_cast<int>(i % 5);
    cases.push_back(c);
  }
  // Long keys beside short ones: 3 sequences × 6 heads × 2 query blocks of
  // very different weights on 5 CTAs.
  Case long_keys;
  long_keys.gpu_reference = true;
  long_keys.shape = VarlenShape::packed(make_common(6, 2, 128, true), {200, 129, 256}, {40000, 31000, 256}, 3, 2);
  long_keys.tiles = {128, 128, 8, 2, true, true};
  long_keys.sm_limit = 5;
  cases.push_back(long_keys);
  // Up to 128 sequences the persistent CTAs walk the sequences' own tiles,
  // longest keys first (FwdConfig::kSequenceOrder); from 129 the grid's
  // order. Both sides of that limit, with empty sequences, decoding rows
  // beside prefill chunks, and as many tiles as CTAs or fewer.
  for (int sequences : {128, 129}) {
    for (int ctas : {7, 132}) {
      std::vector<int> seqlens_q(sequences), seqlens_k(sequences);
      for (int b = 0; b < sequences; ++b) {
        const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
        seqlens_q[b] = kind == 0 ? 0 : kind <= 6 ? 1 : std::uniform_int_distribution<int>(2, 300)(rng);
        seqlens_k[b] = std::uniform_int_distribution<int>(seqlens_q[b], seqlens_q[b] + 400)(rng);
      }
      Case many;
      many.shape = VarlenShape::packed(make_common(6, 2, 128, true), seqlens_q, seqlens_k, 2, 3);
      many.tiles = {128, 128, 8, 2, true, true};
      many.sm_limit = ctas;
      cases.push_back(many);
    }
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  check_cases(cases, rng, seed);
}

TEST_CASE("varlen with a workspace and over paged caches: splits 1/3/heuristic, shuffled pages of 8-256, decode and "
          "prefill tiles, masks, GQA") {
  // Decoding steps (one query, or a few for speculative decoding) over long
  // keys take the decode kernel and split; mixed batches of prefill chunks
  // take the prefill tiles (wgmma on sm_90a), split only where forced or few.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  auto lengths = [&](int batch, int max_q, int max_k) {
    std::pair<std::vector<int>, std::vector<int>> l;
    for (int b = 0; b < batch; ++b) {
      l.first.push_back(std::uniform_int_distribution<int>(0, 7)(rng) == 0 ? 0 : std::uniform_int_distribution<int>(1, max_q)(rng));
      l.second.push_back(std::uniform_int_distribution<int>(0, 7)(rng) == 0 ? std::uniform_int_distribution<int>(0, 3)(rng)
                                                                            : std::uniform_int_distribution<int>(1, max_k)(rng));
    }
    return l;
  };
  int index = 0;
  for (DType dtype : kDTypes) {
    for (int page_size : {0, 8, 16, 64, 256}) {
      for (const std::optional<int>& splits : {std::optional<int>{}, std::optional<int>{1}, std::optional<int>{3},
                                               std::optional<int>{0}}) {
        for (int kind = 0; kind < 3; ++kind) {  // decoding steps, speculative decoding, mixed chunks
          const int head_dim = index % 5 == 4 ? 256 : index % 3 == 0 ? 64 : 128;
          const auto [heads_q, heads_kv] = index % 3 == 0 ? std::pair{6, 6} : index % 3 == 1 ? std::pair{8, 2} : std::pair{6, 1};
          const auto [seqlens_q, seqlens_k] =
              kind == 0 ? lengths(1 + index % 5, 1, 3000) : kind == 1 ? lengths(3, 4, 2000) : lengths(4, 300, 900);
          Case c;
          c.dtype = dtype;
          c.page_size = page_size;
          c.num_splits = splits;
          c.shape = VarlenShape::packed(make_common(heads_q, heads_kv, head_dim, kind != 0 || index % 2 == 0), seqlens_q,
                                        seqlens_k, 2, 3);
          if (index % 4 == 1) c.shape.common.window_left = 200;
          if (index % 5 == 2) c.shape.common.softcap = 30.f;
          if (index % 6 == 3) add_slopes(c, index % 4 == 3, rng);
          if (index % 3 == 2) c.shape.seqused_k = random_seqused(c.shape, rng);
          if (page_size > 0 && index % 4 == 1) {  // every kind, decode kernel and prefill tiles
            if (c.shape.seqused_k.empty()) c.shape.seqused_k = random_seqused(c.shape, rng);
            c.omit_cu_seqlens_k = true;
          }
          if (page_size == 0 && index % 7 == 5) c.layout = Layout::padded;
          cases.push_back(c);
          ++index;
        }
      }
    }
  }
  // Forced kernels over pages: 4-warp tiles, split; the decode kernel with
  // a deeper pipeline (over a cache, stages without wgmma select it).
  for (const TileConfig& tiles : {TileConfig{64, 64, 4}, TileConfig{32, 32, 2, 4}}) {
    Case c;
    c.page_size = 64;
    c.tiles = tiles;
    c.num_splits = 3;
    c.shape = VarlenShape::packed(make_common(8, 2, 128, true), {1, 0, tiles.stages == 0 ? 130 : 3, 7},
                                  {2000, 0, 700, 7}, 2, 3);
    cases.push_back(c);
  }
  // Decoding steps over single-row pages and pages of 4 (the decode kernel
  // takes each copy's page from its row's table entry).
  for (int page_size : {1, 4}) {
    Case c;
    c.page_size = page_size;
    c.num_splits = page_size == 1 ? std::optional<int>{} : std::optional<int>{3};
    const auto [seqlens_q, seqlens_k] = lengths(5, page_size == 1 ? 1 : 3, 2500);
    c.shape = VarlenShape::packed(make_common(8, 2, page_size == 1 ? 128 : 64, true), seqlens_q, seqlens_k, 2, 3);
    cases.push_back(c);
  }
  // Edges: no queries, no keys, keys fewer than queries (rows that see
  // nothing), one of each, over pages and split.
  Case edges;
  edges.page_size = 16;
  edges.num_splits = 0;
  edges.shape = VarlenShape::packed(make_common(6, 2, 128, true), {0, 0, 5, 1, 1, 300}, {0, 17, 0, 1, 300, 1}, 3, 2);
  cases.push_back(edges);
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  size_t split = 0, decode = 0, prefill = 0, without_cu_k = 0, spanning = 0;
  for (const Case& c : cases) {
    without_cu_k += c.omit_cu_seqlens_k;
    const std::string spec = spec_of(c);
    split += spec.find(".split") != std::string::npos;
    decode += spec.rfind("decode.", 0) == 0;
    prefill += spec.rfind("fwd.", 0) == 0;
    // Decode chunks over pages of 1-16 rows (.paged1 ... .paged16).
    for (const char* flag : {".paged1.", ".paged4.", ".paged8.", ".paged16."}) spanning += (spec + ".").find(flag) != std::string::npos;
  }
  MESSAGE(fmt::format("{} cases: {} split, {} on the decode kernel ({} spanning pages), {} on prefill tiles, {} "
                      "without cu_seqlens_k", cases.size(), split, decode, spanning, prefill, without_cu_k));
  CHECK(without_cu_k >= 8);
  CHECK(spanning >= 8);
  CHECK(split >= cases.size() / 3);
  CHECK(decode > 10);
  CHECK(prefill > 10);
  check_cases(cases, rng, seed);
}

TEST_CASE("varlen: attention_chunk per sequence, packed and paged, decoding steps and prefill, split") {
  // Each sequence's chunks count from its own first key; seqused_k moves its
  // diagonal, and so its chunks.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  for (DType dtype : kDTypes) {
    auto add = [&](Case c) {
      c.dtype = dtype;
      cases.push_back(std::move(c));
    };
    {  // causal chunks smaller than a tile, GQA
      Case c;
      c.shape = random_batch(make_common(8, 2, 128, true), rng);
      c.shape.common.attention_chunk = 48;
      add(c);
    }
    {  // a two-sided window cut to chunks, padded head dim, seqused_k
      Case c;
      c.layout = Layout::padded;
      c.shape = random_batch(make_common(6, 2, 80, false), rng);
      c.shape.common.window_left = 70, c.shape.common.window_right = 20;
      c.shape.common.attention_chunk = 100;
      c.shape.seqused_k = random_seqused(c.shape, rng);
      add(c);
    }
    {  // decoding steps over pages of 16, split 3 ways
      Case c;
      c.page_size = 16;
      c.num_splits = 3;
      c.shape = decoding_steps(rng);
      c.shape.common.attention_chunk = 300;
      add(c);
    }
    {  // mixed prefill chunks over pages of 64, the heuristic's splits
      Case c;
      c.page_size = 64;
      c.num_splits = 0;
      c.shape = VarlenShape::packed(make_common(6, 1, 64, true), {1, 200, 37, 0}, {900, 700, 37, 5}, 2, 3);
      c.shape.common.attention_chunk = 128;
      add(c);
    }
    {  // long sequences against the GPU reference
      Case c;
      c.gpu_reference = true;
      c.shape = VarlenShape::packed(make_common(8, 2, 128, true), {1500, 1437, 1561}, {1500, 1600, 1311}, 3, 2);
      c.shape.common.attention_chunk = 512;
      add(c);
    }
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  for (const Case& c : cases) CHECK_MESSAGE(spec_of(c).find(".local.chunk") != std::string::npos, spec_of(c));
  check_cases(cases, rng, seed);
}

TEST_CASE("varlen: learnable_sink per query head, packed and paged, decoding steps and prefill, split and not") {
  // Sequences of no keys (and a window's rows past every key) write 0 with
  // lse = their head's sink; split calls leave the sink to the combine, of
  // both split kinds.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  for (DType dtype : kDTypes) {
    auto add = [&](Case c) {
      c.dtype = dtype;
      c.shape.common.learnable_sink = random_sinks(c.shape.common.heads_q, rng);
      cases.push_back(std::move(c));
    };
    {  // causal prefill with a 128-key window (gpt-oss's sliding layers), GQA
      Case c;
      c.shape = random_batch(make_common(8, 2, 64, true), rng);
      c.shape.common.window_left = 127;
      add(c);
    }
    {  // no mask, softcap, padded head dim, seqused_k
      Case c;
      c.layout = Layout::padded;
      c.shape = random_batch(make_common(6, 2, 80, false), rng);
      c.shape.common.softcap = 20.f;
      c.shape.seqused_k = random_seqused(c.shape, rng);
      add(c);
    }
    {  // decoding steps over pages of 16, split 3 ways
      Case c;
      c.page_size = 16;
      c.num_splits = 3;
      c.shape = decoding_steps(rng);
      add(c);
    }
    {  // decoding steps with split counts chosen on the device
      Case c;
      c.page_size = 64;
      c.num_splits = 0;
      c.dynamic = true;
      std::vector<int> ones(4, 1);
      c.shape = VarlenShape::packed(make_common(8, 1, 128, true), ones, {4000, 60, 2500, 0}, 1, 0);
      add(c);
    }
    {  // mixed prefill chunks and a sequence of no keys, the heuristic's splits
      Case c;
      c.num_splits = 0;
      c.shape = VarlenShape::packed(make_common(8, 2, 64, true), {1, 200, 37, 5}, {900, 700, 37, 0}, 2, 3);
      add(c);
    }
    {  // long sequences against the GPU reference (wgmma tiles)
      Case c;
      c.gpu_reference = true;
      c.shape = VarlenShape::packed(make_common(8, 2, 128, true), {1500, 1437, 1561}, {1500, 1600, 1311}, 3, 2);
      add(c);
    }
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  for (const Case& c : cases) {
    const std::string spec = spec_of(c);
    // Split attention leaves the sink to its combine (which the run's result
    // then shows); a dynamic split's decode keeps it for tiles of one piece.
    const bool split = spec.find(".split") != std::string::npos;
    const bool dynamic = spec.find(".dynsplit") != std::string::npos;
    CHECK_MESSAGE((spec.find(".sink") != std::string::npos) == (!split || dynamic), spec);
  }
  check_cases(cases, rng, seed);
}

TEST_CASE("varlen: a value head dim of its own (192/128, 128/64), packed batches with empty sequences, seqused_k, "
          "a workspace") {
  // Packed v and out narrower than q and k: sequences of no queries or no
  // keys, one of each, causal rows that see nothing; the 4-warp and wgmma
  // kernels (persistent too) as the planner takes them; a workspace that
  // must stay unused (these calls never split).
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : kDTypes) {
    for (const auto& [head_dim, head_dim_v] : {std::pair{192, 128}, std::pair{128, 64}, std::pair{256, 192}}) {
      for (bool causal : {false, true}) {
        Case c;
        c.dtype = dtype;
        c.layout = index % 2 == 0 ? Layout::contiguous : Layout::padded;
        AttentionShape common = make_common(8, index % 3 == 0 ? 8 : 2, head_dim, causal);
        common.head_dim_v = head_dim_v;
        if (index % 4 == 1) common.window_left = 150;
        if (index % 4 == 2) common.learnable_sink = random_sinks(8, rng);
        c.shape = index % 3 == 2 ? VarlenShape::packed(common, {0, 0, 5, 1, 300, 650, 129}, {0, 17, 0, 1, 1, 700, 129}, 3, 2)
                                 : random_batch(common, rng);
        if (index % 5 == 3) c.shape.seqused_k = random_seqused(c.shape, rng);
        if (index % 4 == 3) c.num_splits = 0;
        cases.push_back(c);
        ++index;
      }
    }
  }
  // Long sequences on the wgmma tiles (the persistent ones at 128/64).
  for (const auto& [head_dim, head_dim_v] : {std::pair{192, 128}, std::pair{128, 64}}) {
    Case c;
    c.layout = Layout::padded;
    AttentionShape common = make_common(8, 2, head_dim, true);
    common.head_dim_v = head_dim_v;
    c.shape = VarlenShape::packed(common, {1500, 900, 1}, {1500, 1300, 1200});
    c.gpu_reference = true;
    cases.push_back(c);
  }
  warm_cases(cases, spec_of);
  bool wgmma = false, persistent = false;
  for (const Case& c : cases) {
    const std::string spec = spec_of(c);
    CHECK_MESSAGE(spec.find(fmt::format(".varlen.dv{}", c.shape.common.head_dim_v)) != std::string::npos, spec);
    wgmma = wgmma || spec.find(".wgmma") != std::string::npos;
    persistent = persistent || spec.find(".persistent") != std::string::npos;
  }
  if (current_arch() == "sm_90a") {
    CHECK(wgmma);
    CHECK(persistent);
  }
  const std::vector<size_t> empty = check_cases(cases, rng, seed);
  size_t empty_rows = 0;
  for (size_t i = 0; i < cases.size(); ++i) empty_rows += cases[i].shape.common.causal ? empty[i] : 0;
  CHECK_MESSAGE(empty_rows > 0, "the causal edge batches were meant to include rows that see no key");
}

TEST_CASE("varlen: long sequences (~1500) against the GPU reference, per sequence") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  for (DType dtype : kDTypes) {
    Case plain;
    plain.dtype = dtype;
    plain.gpu_reference = true;
    plain.shape = VarlenShape::packed(make_common(8, 2, 128, true), {1500, 1437, 1561}, {1500, 1600, 1311}, 3, 2);
    cases.push_back(plain);

    Case features = plain;  // non-causal window, softcap, per-sequence ALiBi; padded strides; head dim 64
    features.layout = Layout::padded;
    features.shape = VarlenShape::packed(make_common(8, 2, 64, false), {1500, 1437, 1561}, {1500, 1600, 1311}, 3, 2);
    features.shape.common.window_left = 256;
    features.shape.common.window_right = 64;
    features.shape.common.softcap = 30.f;
    add_slopes(features, true, rng);
    cases.push_back(features);
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  check_cases(cases, rng, seed);
}

TEST_CASE("varlen: a rejected call writes nothing; a batch without queries writes nothing") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  INFO("seed=", seed);
  Case c;
  c.dtype = DType::bf16;
  c.shape = VarlenShape::packed(make_common(6, 2, 64, false), {30, 20}, {40, 10}, 2, 1);
  const auto& s = c.shape;
  const Inputs in = make_inputs(c, rng);
  const int64_t out_shape[4] = {1, s.total_q, 6, 64};
  int64_t out_strides[4];
  contiguous_strides(out_shape, out_strides);
  DeviceTensor out(c.dtype, out_shape, out_strides);
  DeviceBuffer lse(static_cast<size_t>(6) * s.total_q * 4);
  lse.fill_bytes(0xff);
  const TensorView lse_view = TensorView::contiguous(lse.get(), DType::f32, {6, s.total_q});
  DeviceBuffer spare(16 * 4);  // backs the wrongly shaped i32 vectors (never read)
  VarlenViews valid;
  make_varlen(c, in.cu_seqlens_q->get(), in.cu_seqlens_k->get(), nullptr, valid);
  CHECK(valid.args.max_seqlen_q == 30);
  CHECK(valid.args.max_seqlen_k == 40);

  auto count_written = [&] {
    size_t written = 0;
    for (uint16_t bits : out.raw()) written += bits != 0xffff;
    std::vector<uint32_t> lse_bits(static_cast<size_t>(6) * s.total_q);
    lse.download(lse_bits.data(), lse_bits.size() * 4);
    for (uint32_t bits : lse_bits) written += bits != 0xffffffffu;
    return written;
  };
  auto expect_rejected = [&](const TensorView& q, const TensorView* lse_arg, const VarlenArgs& varlen,
                             const std::string& fragment) {
    INFO("expected an error containing: ", fragment);
    CHECK_THROWS_WITH_AS(gpu_tests_runtime().forward_varlen(q, in.k_view, in.v_view, packed_view(out), lse_arg, varlen,
                                                            {}, nullptr),
                         doctest::Contains(fragment.c_str()), Error);
    const size_t written = count_written();
    CHECK_MESSAGE(written == 0, fmt::format("{} output/lse elements written by a rejected call", written));
  };

  // q as the dense [1, total_q, heads, head_dim] of the same memory.
  expect_rejected(in.dq->view(), &lse_view, valid.args, "q: must have 3 dimensions [total_q, heads, head_dim]");
  for (DType wrong : {DType::f32, DType::f16}) {
    VarlenArgs args = valid.args;
    args.cu_seqlens_q.dtype = wrong;
    expect_rejected(in.q_view, &lse_view, args, "cu_seqlens_q: dtype");
  }
  const TensorView cu_long = TensorView::contiguous(spare.get(), DType::i32, {4});   // batch + 2
  const TensorView cu_short = TensorView::contiguous(spare.get(), DType::i32, {2});  // another batch
  for (const TensorView* wrong : {&cu_long, &cu_short}) {
    VarlenArgs args = valid.args;
    args.cu_seqlens_k = *wrong;
    expect_rejected(in.q_view, &lse_view, args, "cu_seqlens_k: shape");
  }
  for (int max_seqlen_q : {0, -3}) {
    VarlenArgs args = valid.args;
    args.max_seqlen_q = max_seqlen_q;
    expect_rejected(in.q_view, &lse_view, args, "max_seqlen_q=");
  }
  const TensorView used_long = TensorView::contiguous(spare.get(), DType::i32, {3});  // batch + 1
  const TensorView used_short = TensorView::contiguous(spare.get(), DType::i32, {1});
  for (const TensorView* wrong : {&used_long, &used_short}) {
    VarlenArgs args = valid.args;
    args.seqused_k = wrong;
    expect_rejected(in.q_view, &lse_view, args, "seqused_k: shape");
  }
  const TensorView lse_wide = TensorView::contiguous(lse.get(), DType::f32, {6, s.total_q + 1});
  const TensorView lse_transposed = TensorView::contiguous(lse.get(), DType::f32, {s.total_q, 6});
  const TensorView lse_dense = TensorView::contiguous(lse.get(), DType::f32, {1, 6, s.total_q});
  for (const TensorView* wrong : {&lse_wide, &lse_transposed, &lse_dense}) {
    expect_rejected(in.q_view, wrong, valid.args, "lse: shape");
  }

  // The same call, valid, does write every owned element (the poison was
  // live), and nothing past them.
  gpu_tests_runtime().forward_varlen(in.q_view, in.k_view, in.v_view, packed_view(out), &lse_view, valid.args, {},
                                     nullptr);
  size_t still_poisoned = 0;
  const std::vector<float> values = out.read();
  for (size_t e = 0; e < static_cast<size_t>(s.used_q()) * 6 * 64; ++e) still_poisoned += std::isnan(values[e]);
  CHECK(still_poisoned == 0);
  CHECK(out.count_written_outside(s.used_q()) == 0);

  // Sequences without queries (keys only) and spare rows: nothing to write.
  Case none;
  none.dtype = DType::bf16;
  none.shape = VarlenShape::packed(make_common(6, 2, 64, true), {0, 0}, {5, 3}, 4, 1);
  const Inputs none_in = make_inputs(none, rng);
  const int64_t none_shape[4] = {1, none.shape.total_q, 6, 64};
  int64_t none_strides[4];
  contiguous_strides(none_shape, none_strides);
  DeviceTensor none_out(none.dtype, none_shape, none_strides);
  DeviceBuffer none_lse(static_cast<size_t>(6) * none.shape.total_q * 4);
  none_lse.fill_bytes(0xff);
  const TensorView none_lse_view = TensorView::contiguous(none_lse.get(), DType::f32, {6, none.shape.total_q});
  VarlenViews none_varlen;
  make_varlen(none, none_in.cu_seqlens_q->get(), none_in.cu_seqlens_k->get(), nullptr, none_varlen);
  CHECK(none_varlen.args.max_seqlen_q == 1);
  ForwardOptions causal;
  causal.causal = true;
  CHECK_NOTHROW(gpu_tests_runtime().forward_varlen(none_in.q_view, none_in.k_view, none_in.v_view, packed_view(none_out),
                                                   &none_lse_view, none_varlen.args, causal, nullptr));
  CHECK(none_out.count_written_outside(0) == 0);
  std::vector<uint32_t> none_bits(static_cast<size_t>(6) * none.shape.total_q);
  none_lse.download(none_bits.data(), none_bits.size() * 4);
  CHECK(std::all_of(none_bits.begin(), none_bits.end(), [](uint32_t bits) { return bits == 0xffffffffu; }));
}

}  // TEST_SUITE
