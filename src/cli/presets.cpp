#include "cli/presets.hpp"

#include <algorithm>
#include <initializer_list>
#include <set>

#include <fmt/format.h>

#include "plan.hpp"

namespace jitattn::cli {
namespace {

// Fake device addresses: planning never dereferences them.
void* address(uintptr_t a) { return reinterpret_cast<void*>(a); }

// How a call of a shape with a rotary embedding may ask for it: not fused at
// all, angles from theta, or cos/sin tables in q's dtype. Each plans its own
// kernels.
enum class RopeForm { none, theta, tables };

std::vector<RopeForm> rope_forms(const AttentionShape& shape) {
  if (shape.rope == RopeStyle::none) return {RopeForm::none};
  return {RopeForm::none, RopeForm::theta, RopeForm::tables};
}

// The tensors a call's options point at (views kept alive for its plan):
// RoPE tables (RopeForm::tables) and sinks.
struct OptionTensors {
  TensorView cos, sin, sinks;
  std::vector<float> longrope_pair_factors;
};

// `options` of a call with `shape` in `form` whose keys lie at positions
// below `positions` (the tables' rows).
void set_rope(ForwardOptions& options, const AttentionShape& shape, RopeForm form, int64_t positions,
              OptionTensors& tables) {
  if (form == RopeForm::none) return;
  options.rope.style = shape.rope;
  options.rope.rotary_dim = shape.rotary_dim != 0 ? shape.rotary_dim : shape.head_dim;
  // YaRN with Hugging Face's default attention factor (.rope_scaled kernels
  // where it is not 1); tables take none.
  if (form == RopeForm::theta) options.rope.yarn_factor = shape.yarn_factor;
  // LongRoPE the same way (pair factors of 1: their values change no kernel).
  if (form == RopeForm::theta && shape.longrope_factor != 0.f) {
    tables.longrope_pair_factors.assign(options.rope.rotary_dim / 2, 1.f);
    options.rope.longrope_pair_factors = tables.longrope_pair_factors.data();
    options.rope.longrope_factor = shape.longrope_factor;
  }
  if (form == RopeForm::tables) {
    const int64_t pairs = options.rope.rotary_dim / 2;
    tables.cos = TensorView::contiguous(address(0x60000), shape.dtype, {positions, pairs});
    tables.sin = TensorView::contiguous(address(0x70000), shape.dtype, {positions, pairs});
    options.rope.cos = &tables.cos;
    options.rope.sin = &tables.sin;
  }
}

// The options every call of `shape` passes: its mask and softcap (for local
// layers the shape's window, else one of `window_left` keys), its sinks, and
// RoPE in `form`.
ForwardOptions shape_options(const AttentionShape& shape, RopeForm form, int window_left, int64_t positions,
                             OptionTensors& tables) {
  ForwardOptions options;
  options.causal = shape.causal;
  if (shape.local) options.window_left = shape.window > 0 ? shape.window : window_left;
  if (shape.softcap) options.softcap = 50.f;
  if (shape.sink) {
    tables.sinks = TensorView::contiguous(address(0x80000), DType::f32, {shape.heads_q});
    options.learnable_sink = &tables.sinks;
  }
  set_rope(options, shape, form, positions, tables);
  return options;
}

// The head dims most models use, both dtypes, causal and not: the safe choice
// when the models to serve are not known yet.
std::vector<AttentionShape> all_generated_shapes() {
  std::vector<AttentionShape> shapes;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (int head_dim : {64, 128}) {
      for (bool causal : {true, false}) shapes.push_back({dtype, head_dim, causal, false, false, causal});
    }
  }
  return shapes;
}

// `shape` with the model's heads (its calls' GQA ratio and tile counts).
AttentionShape model_heads(AttentionShape shape, int heads_q, int heads_kv) {
  shape.heads_q = heads_q;
  shape.heads_kv = heads_kv;
  return shape;
}

// A decoder shape in bf16 with rotate-half RoPE over `rotary_dim` channels
// and LongRoPE (Phi-3.5, Phi-4-mini), its calls planned with the model's heads.
AttentionShape longrope_shape(int head_dim, int rotary_dim, int heads_q, int heads_kv, float longrope_factor) {
  AttentionShape shape = model_heads({DType::bf16, head_dim, true, false, false, true, RopeStyle::rotate_half, rotary_dim},
                                     heads_q, heads_kv);
  shape.longrope_factor = longrope_factor;
  return shape;
}

// DeepSeek V3's MLA prefill: 128 heads of q/k 192 and v 128, causal.
AttentionShape deepseek_prefill_shape() {
  AttentionShape shape = model_heads({DType::bf16, 192, true}, 128, 128);
  shape.head_dim_v = 128;
  return shape;
}

// The batch of one-token sequences whose tiles (one a KV head) number
// `tiles`: the decode grids' bands are of tiles, so a model with other KV
// heads than 8 reaches them at other batches.
int64_t batch_of_tiles(int64_t tiles, int64_t heads_kv) {
  return std::max<int64_t>(1, (tiles + heads_kv - 1) / heads_kv);
}

// The page sizes a sweep plans: its own (0: a contiguous cache, or packed
// keys), then the caller's (preset_specs' extra_pages: an engine's block
// size the sweeps do not take, such as SGLang's single rows), each once.
std::vector<int> pages_of(std::initializer_list<int> own, const std::vector<int>& extra_pages) {
  std::vector<int> pages(own);
  for (const int page : extra_pages) {
    if (std::find(pages.begin(), pages.end(), page) == pages.end()) pages.push_back(page);
  }
  return pages;
}

// The combine of a call with dynamic splits (which skips the rows of tiles
// that wrote their own), where `attention` is one (sizing-only plans leave
// the combine unplanned).
void add_dynamic_combine(const detail::KernelSpec& attention, const AttentionShape& shape,
                         std::vector<detail::KernelSpec>& specs) {
  if (attention.dynamic_splits) {
    specs.push_back(detail::KernelSpec::combine(DType::f32, shape.dtype, /*elementwise=*/false, /*dynamic_splits=*/true,
                                                shape.sink));
  }
}

// The kernels forward_kvcache plans for `shape` (its query heads over its KV
// heads, new keys appended): one-token decoding of one sequence (one CTA
// per SM) and of many (two per SM, also over caches of 2048 keys, where
// head dims up to 64 take chunks of their own), one split and several, and of batches
// of 160, 224, 320 and 384 tiles (resident tiles of each pipeline size: 20,
// 28, 40 and 48 sequences at 8 KV heads); 8 tokens
// (speculative decoding: at 4 query heads per KV head 32 packed rows, the
// decode kernel's two-tile rows)
// and 16 (64 packed rows, beyond the decode kernel) of one sequence and of
// many; chunked prefill of 2048 tokens over 8192 cached ones, and of 512
// over 4096 (few tiles: split by the heuristic); a contiguous
// cache and pages of 16, 32, 64 and 256 rows each (FlashAttention-2 takes
// only multiples of 256), and of the caller's extra_pages; and the combine
// kernel. Also the kernels of calls captured in CUDA graphs with
// dynamic_splits (KVCacheArgs): 1 and 8 tokens (one 16-row tile a KV head,
// and two) of one sequence and of 64, whose tiles differ, and the combine
// that skips the rows such calls write themselves.
void add_kvcache_specs(const AttentionShape& shape, RopeForm form, const detail::Arch& arch,
                       const std::vector<int>& extra_pages, std::vector<detail::KernelSpec>& specs) {
  const int max_smem = max_smem_of(arch);
  const int64_t heads_kv = shape.heads_kv, heads_q = shape.heads_q;
  struct Call {
    int64_t batch, seqlen_q, capacity;
    int splits;
    bool dynamic_splits;
  };
  // Speculative tokens by their packed rows, whatever the GQA ratio: 32
  // (the decode kernel's two-tile rows) and 64 (beyond it); 8 and 16 tokens
  // at 4 query heads per KV head.
  const int64_t group = std::max<int64_t>(1, heads_q / heads_kv);
  const int64_t two_tiles = std::max<int64_t>(1, 32 / group), beyond = std::max<int64_t>(1, 64 / group);
  // Batches of 512 tiles (two per SM), and of 160, 224, 320 and 384 (the
  // resident bands of each pipeline size) at the model's KV heads.
  const int64_t many = batch_of_tiles(512, heads_kv);
  const Call calls[] = {{1, 1, 4096, 1, false},
                        {1, 1, 4096, 3, false},
                        {many, 1, 4096, 1, false},
                        {many, 1, 4096, 3, false},
                        // Short caches, where head dims up to 64 take chunks of their own.
                        {many, 1, 2048, 0, false},
                        {many, 1, 2048, 1, false},
                        {many, 1, 2048, 0, true},
                        {batch_of_tiles(160, heads_kv), 1, 4096, 0, false},
                        {batch_of_tiles(224, heads_kv), 1, 4096, 0, false},
                        {batch_of_tiles(320, heads_kv), 1, 4096, 0, false},
                        {batch_of_tiles(384, heads_kv), 1, 4096, 0, false},
                        {1, two_tiles, 4096, 1, false},
                        {1, two_tiles, 4096, 3, false},
                        {many, two_tiles, 4096, 1, false},
                        {many, two_tiles, 4096, 3, false},
                        {1, beyond, 4096, 1, false},
                        {1, beyond, 4096, 3, false},
                        {many, beyond, 4096, 1, false},
                        {1, 2048, 8192, 1, false},
                        {1, 512, 4096, 0, false},
                        {1, 1, 4096, 0, true},
                        {many, 1, 4096, 0, true},
                        {1, two_tiles, 4096, 0, true},
                        {many, two_tiles, 4096, 0, true}};
  for (const auto& [batch, seqlen_q, capacity, splits, dynamic_splits] : calls) {
    for (int page : pages_of({0, 16, 32, 64, 256}, extra_pages)) {
      const TensorView q = TensorView::contiguous(address(0x10000), shape.dtype, {batch, seqlen_q, heads_q, shape.head_dim});
      const TensorView k_new = TensorView::contiguous(address(0x20000), shape.dtype, {batch, seqlen_q, heads_kv, shape.head_dim});
      const TensorView table = TensorView::contiguous(address(0x30000), DType::i32, {batch, capacity / std::max(page, 1)});
      KVCacheArgs args;
      args.k_cache = page == 0 ? TensorView::contiguous(address(0x40000), shape.dtype, {batch, capacity, heads_kv, shape.head_dim})
                               : TensorView::contiguous(address(0x40000), shape.dtype,
                                                        {batch * capacity / page, page, heads_kv, shape.head_dim});
      args.v_cache = values_after(args.k_cache);
      args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
      args.block_table = page == 0 ? nullptr : &table;
      args.k_new = args.v_new = &k_new;
      args.num_splits = splits;
      args.dynamic_splits = dynamic_splits;
      OptionTensors tables;
      const ForwardOptions options = shape_options(shape, form, static_cast<int>(capacity / 2), capacity, tables);
      const detail::KVCachePlan plan =
          detail::plan_kvcache(q, args, q, nullptr, options, nullptr, 0, /*sizing_only=*/true, arch, max_smem, 132);
      specs.push_back(plan.attention.spec);
      specs.push_back(plan.append.spec);
      add_dynamic_combine(plan.attention.spec, shape, specs);
    }
  }
  specs.push_back(detail::KernelSpec::combine(DType::f32, shape.dtype, /*elementwise=*/false, /*dynamic_splits=*/false,
                                              shape.sink));
}

// The kernels forward() plans for `shape` with few query rows (its query
// heads over its KV heads, one sequence over 4096 and over 32768 keys, whose
// key blocks differ at head dim 128): 1 and 16 query tokens (the decode
// kernel over dense K/V; packed GQA tiles) and 128 (unpacked), with a
// workspace (split) and without, and the combine kernel.
void add_dense_split_specs(const AttentionShape& shape, RopeForm form, const detail::Arch& arch,
                           std::vector<detail::KernelSpec>& specs) {
  const int max_smem = max_smem_of(arch);
  const int64_t heads_q = shape.heads_q, heads_kv = shape.heads_kv, dim = shape.head_dim;
  for (int64_t seqlen_k : {4096, 32768}) {
    for (int64_t seqlen_q : {1, 16, 128}) {
      const TensorView q = TensorView::contiguous(address(0x10000), shape.dtype, {1, seqlen_q, heads_q, dim});
      const TensorView kv = TensorView::contiguous(address(0x20000), shape.dtype, {1, seqlen_k, heads_kv, dim});
      OptionTensors tables;
      const ForwardOptions options = shape_options(shape, form, 4096, seqlen_k, tables);
      const detail::SplitForwardPlan plan = detail::plan_forward_split(q, kv, values_after(kv), q, nullptr, options, nullptr, 0,
                                                                       /*sizing_only=*/true, arch, max_smem, 132);
      specs.push_back(plan.attention.spec);
      specs.push_back(detail::plan_forward(q, kv, values_after(kv), q, nullptr, options, arch, max_smem, 132).spec);
    }
  }
  specs.push_back(detail::KernelSpec::combine(DType::f32, shape.dtype, /*elementwise=*/false, /*dynamic_splits=*/false,
                                              shape.sink));
}

// The kernels forward_varlen plans for an inference engine's step of
// `shape` (its query heads over its KV heads): 1 decoding step, and steps of
// 128, 160, 224, 320 and 512 tiles (16, 20, 28, 40 and 64 at 8 KV heads)
// over up to 8192 keys (the decode kernel: split, one CTA per SM, resident
// tiles of each pipeline size, two per SM), 4
// sequences of 8 tokens (speculative decoding),
// and 15 steps beside a 512-token prefill chunk (packed GQA tiles); over
// packed K/V and over pages of 16 and 64 rows; with a workspace (split)
// and without, and with dynamic splits (graphs replayed with other lengths:
// VarlenArgs::dynamic_splits).
void add_varlen_specs(const AttentionShape& shape, RopeForm form, const detail::Arch& arch,
                      const std::vector<int>& extra_pages, std::vector<detail::KernelSpec>& specs) {
  const int max_smem = max_smem_of(arch);
  const int64_t heads_q = shape.heads_q, heads_kv = shape.heads_kv, dim = shape.head_dim;
  struct Step {
    int64_t batch, total_q, max_seqlen_q;
  };
  // Speculative steps of 32 packed rows a sequence (8 tokens at 4 query
  // heads per KV head).
  const int64_t speculative = std::max<int64_t>(1, 32 / std::max<int64_t>(1, heads_q / heads_kv));
  // Decoding steps of 128, 160, 224, 320 and 512 tiles at the model's KV heads.
  auto decoding = [&](int64_t tiles) {
    const int64_t batch = batch_of_tiles(tiles, heads_kv);
    return Step{batch, batch, 1};
  };
  for (const auto& [batch, total_q, max_seqlen_q] :
       {Step{1, 1, 1}, decoding(128), decoding(160), decoding(224), decoding(320), decoding(512),
        Step{4, 4 * speculative, speculative}, Step{16, 527, 512}}) {
    for (int page : pages_of({0, 16, 64}, extra_pages)) {
      // Keys in a paged cache were rotated as they were written (forward_kvcache's k_new).
      if (page != 0 && form != RopeForm::none) continue;
      const int64_t max_seqlen_k = 8192;
      const TensorView q = TensorView::contiguous(address(0x10000), shape.dtype, {total_q, heads_q, dim});
      const TensorView kv =
          page == 0 ? TensorView::contiguous(address(0x20000), shape.dtype, {batch * max_seqlen_k, heads_kv, dim})
                    : TensorView::contiguous(address(0x20000), shape.dtype,
                                             {batch * max_seqlen_k / page, page, heads_kv, dim});
      const TensorView table = TensorView::contiguous(address(0x30000), DType::i32, {batch, max_seqlen_k / std::max(page, 1)});
      VarlenArgs varlen;
      varlen.cu_seqlens_q = varlen.cu_seqlens_k = TensorView::contiguous(address(0x40000), DType::i32, {batch + 1});
      varlen.max_seqlen_q = static_cast<int>(max_seqlen_q);
      varlen.max_seqlen_k = static_cast<int>(max_seqlen_k);
      varlen.block_table = page == 0 ? nullptr : &table;
      OptionTensors tables;
      const ForwardOptions options = shape_options(shape, form, 4096, max_seqlen_k, tables);
      specs.push_back(detail::plan_forward_varlen_split(q, kv, values_after(kv), q, nullptr, varlen, options, nullptr, 0,
                                                        /*sizing_only=*/true, arch, max_smem, 132)
                          .attention.spec);
      specs.push_back(detail::plan_forward_varlen(q, kv, values_after(kv), q, nullptr, varlen, options, arch, max_smem, 132).spec);
      varlen.dynamic_splits = true;
      const detail::KernelSpec dynamic = detail::plan_forward_varlen_split(q, kv, values_after(kv), q, nullptr, varlen, options,
                                                                           nullptr, 0, /*sizing_only=*/true, arch,
                                                                           max_smem, 132)
                                             .attention.spec;
      specs.push_back(dynamic);
      add_dynamic_combine(dynamic, shape, specs);
    }
  }
}

// Prefill calls dense enough to cross the planner's bands (tiles a wave,
// rows a tile, the decode kernel's resident CTAs for short sequences): every
// batch with every sequence length, up to 2^20 tokens a call.
constexpr int64_t kPrefillBatches[] = {1,  2,  3,  4,  5,  6,   8,   10,  12,  16,  20,  24,
                                       32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 512, 1024};
constexpr int64_t kPrefillSeqlens[] = {16,  20,  24,  28,  32,  40,   48,   56,   64,   80,    96,    112,   128,  160, 192,
                                       256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768};
constexpr int64_t kMaxPrefillTokens = int64_t{1} << 20;

// The kernels forward() plans for `shape` without RoPE (its query heads over
// its KV heads) over the prefill grid. The tile set by seqlen bucket
// (default_tile_set) is not all of them: where a sequence's rows would leave
// a 192-row tile mostly empty the planner takes 128-row ones, on an ordinary
// or a persistent grid by the tile count, and short sequences take the
// decode kernel over dense keys.
void add_forward_specs(const AttentionShape& shape, const detail::Arch& arch, std::vector<detail::KernelSpec>& specs) {
  const int max_smem = max_smem_of(arch);
  const int64_t dim = shape.head_dim, dim_v = shape.head_dim_v != 0 ? shape.head_dim_v : dim;
  std::set<std::string> seen;
  for (int64_t batch : kPrefillBatches) {
    for (int64_t seqlen : kPrefillSeqlens) {
      if (batch * seqlen > kMaxPrefillTokens) continue;
      OptionTensors tables;
      const ForwardOptions options = shape_options(shape, RopeForm::none, 4096, seqlen, tables);
      const TensorView q = TensorView::contiguous(address(0x10000), shape.dtype, {batch, seqlen, shape.heads_q, dim});
      const TensorView k = TensorView::contiguous(address(0x20000), shape.dtype, {batch, seqlen, shape.heads_kv, dim});
      const TensorView v = TensorView::contiguous(address(0x30000), shape.dtype, {batch, seqlen, shape.heads_kv, dim_v});
      const TensorView out = TensorView::contiguous(address(0x40000), shape.dtype, {batch, seqlen, shape.heads_q, dim_v});
      const detail::KernelSpec spec = detail::plan_forward(q, k, v, out, nullptr, options, arch, max_smem, 132).spec;
      if (seen.insert(spec.text()).second) specs.push_back(spec);
    }
  }
}

// The prefill kernels of `shape` with RoPE in `form` (its query heads over its
// KV heads): batches of 1 to 64 sequences of 128 to 16384 tokens, which reach
// the planner's choices (tiles by head dim, ordinary and persistent grids,
// RoPE tables staged or not), as forward() calls (without RoPE the
// default_tile_set covers those) and as forward_varlen() steps over packed
// k/v, and without RoPE over a paged cache too (prefill after a cached
// prefix); and forward() calls with a workspace where they split (few heads
// and short sequences leave the GPU underused).
void add_prefill_specs(const AttentionShape& shape, RopeForm form, const detail::Arch& arch,
                       const std::vector<int>& extra_pages, std::vector<detail::KernelSpec>& specs) {
  const int max_smem = max_smem_of(arch);
  const int64_t heads_q = shape.heads_q, heads_kv = shape.heads_kv, dim = shape.head_dim;
  const int64_t dim_v = shape.head_dim_v != 0 ? shape.head_dim_v : dim;
  for (int64_t batch = 1; batch <= 64; batch *= 2) {
    for (int64_t seqlen = 128; seqlen <= 16384; seqlen *= 2) {
      OptionTensors tables;
      const ForwardOptions options = shape_options(shape, form, 4096, seqlen, tables);
      {
        const TensorView q = TensorView::contiguous(address(0x10000), shape.dtype, {batch, seqlen, heads_q, dim});
        const TensorView k = TensorView::contiguous(address(0x20000), shape.dtype, {batch, seqlen, heads_kv, dim});
        const TensorView v = TensorView::contiguous(address(0x30000), shape.dtype, {batch, seqlen, heads_kv, dim_v});
        const TensorView out = TensorView::contiguous(address(0x40000), shape.dtype, {batch, seqlen, heads_q, dim_v});
        // (Without RoPE add_forward_specs plans these.)
        if (form != RopeForm::none) {
          specs.push_back(detail::plan_forward(q, k, v, out, nullptr, options, arch, max_smem, 132).spec);
        }
        // Given a workspace, calls of few tiles (few heads, short sequences)
        // split over their keys.
        const detail::KernelSpec split =
            detail::plan_forward_split(q, k, v, out, nullptr, options, nullptr, 0, /*sizing_only=*/true, arch,
                                       max_smem, 132)
                .attention.spec;
        if (split.split) specs.push_back(split);
      }
      for (int page : pages_of({0, 64}, extra_pages)) {
        if (page != 0 && form != RopeForm::none) continue;  // keys rotated as they were written
        if (page != 0 && dim_v != dim) continue;            // V's own head dim: packed keys only
        const TensorView q = TensorView::contiguous(address(0x10000), shape.dtype, {batch * seqlen, heads_q, dim});
        const TensorView out = TensorView::contiguous(address(0x50000), shape.dtype, {batch * seqlen, heads_q, dim_v});
        const TensorView v = TensorView::contiguous(address(0x60000), shape.dtype, {batch * seqlen, heads_kv, dim_v});
        const TensorView kv =
            page == 0 ? TensorView::contiguous(address(0x20000), shape.dtype, {batch * seqlen, heads_kv, dim})
                      : TensorView::contiguous(address(0x20000), shape.dtype,
                                               {batch * (seqlen / std::max(page, 1) + 1), page, heads_kv, dim});
        const TensorView table =
            TensorView::contiguous(address(0x30000), DType::i32, {batch, seqlen / std::max(page, 1) + 1});
        VarlenArgs varlen;
        varlen.cu_seqlens_q = TensorView::contiguous(address(0x40000), DType::i32, {batch + 1});
        varlen.max_seqlen_q = varlen.max_seqlen_k = static_cast<int>(seqlen);
        const TensorView seqused_k = TensorView::contiguous(address(0x50000), DType::i32, {batch});
        if (page == 0) {
          varlen.cu_seqlens_k = varlen.cu_seqlens_q;
        } else {
          varlen.block_table = &table;
          varlen.seqused_k = &seqused_k;
        }
        const TensorView values = page == 0 ? v : values_after(kv);
        specs.push_back(
            detail::plan_forward_varlen(q, kv, values, out, nullptr, varlen, options, arch, max_smem, 132).spec);
      }
    }
  }
}

// The long tail of an inference engine's calls of `shape` with RoPE in
// `form`, on grids dense enough to cross the planner's bands (tiles a wave,
// rows a tile, keys a chunk or split, pages), where the sweeps above take
// one call a band:
//   - prefill and forward() with a workspace, 16 to 32768 tokens (short
//     prompts pack GQA or take the decode kernel over dense keys);
//   - varlen steps of 1–256 sequences: decoding, 2–16 speculative tokens, or
//     a chunk of 24–2048 tokens beside decoding ones, over 64 to 131072 keys,
//     packed or in pages of 16 to 256 rows, without a workspace, split by the
//     heuristic, and with dynamic splits;
//   - forward_kvcache of 1–256 sequences of 1–16 tokens over caches of 64 to
//     131072 rows, contiguous or paged, split the three ways.
// Planning is host arithmetic (a few µs a call), so the grids cost about a
// second a shape; the specs they add are those the calls plan, each once.
void add_engine_sweep_specs(const AttentionShape& shape, RopeForm form, const detail::Arch& arch,
                            const std::vector<int>& extra_pages, std::vector<detail::KernelSpec>& specs) {
  const int max_smem = max_smem_of(arch);
  const int64_t heads_q = shape.heads_q, heads_kv = shape.heads_kv, dim = shape.head_dim;
  const int window = shape.window > 0 ? shape.window : 4096;
  std::set<std::string> seen;
  auto add = [&](const detail::KernelSpec& spec) {
    if (seen.insert(spec.text()).second) specs.push_back(spec);
  };
  auto add_split = [&](const detail::SplitForwardPlan& plan) {
    add(plan.attention.spec);
    if (plan.combine.grid > 0) add(plan.combine.spec);
  };
  void* const workspace = address(0x1000000);
  const size_t workspace_bytes = size_t{1} << 40;
  // Thinner grids lose kernels: batches by powers of two, keys 4× apart, or no pages of 256 rows each drop some
  // (measured over every preset on sm_80 and sm_90a); these give the same specs as grids half again as dense.
  const int64_t batches[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256};
  const int64_t key_lengths[] = {64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 131072};
  const std::vector<int> pages = pages_of({0, 16, 32, 64, 256}, extra_pages);
  // Prefill: forward() with and without a workspace.
  for (int64_t batch : kPrefillBatches) {
    for (int64_t seqlen : kPrefillSeqlens) {
      if (batch * seqlen > kMaxPrefillTokens) continue;
      OptionTensors tables;
      const ForwardOptions options = shape_options(shape, form, window, seqlen, tables);
      const TensorView q = TensorView::contiguous(address(0x10000), shape.dtype, {batch, seqlen, heads_q, dim});
      const TensorView kv = TensorView::contiguous(address(0x20000), shape.dtype, {batch, seqlen, heads_kv, dim});
      // (Without RoPE add_forward_specs plans these over the same grid.)
      if (form != RopeForm::none) {
        add(detail::plan_forward(q, kv, values_after(kv), q, nullptr, options, arch, max_smem, 132).spec);
      }
      add_split(detail::plan_forward_split(q, kv, values_after(kv), q, nullptr, options, workspace, workspace_bytes, false, arch,
                                           max_smem, 132));
    }
  }
  // Varlen steps.
  std::vector<int64_t> query_lengths;
  for (int64_t tokens = 1; tokens <= 16; ++tokens) query_lengths.push_back(tokens);
  for (int64_t chunk : {24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048}) query_lengths.push_back(chunk);
  for (int64_t batch : batches) {
    for (int64_t max_seqlen_q : query_lengths) {
      // Up to 16 tokens every sequence's (speculative decoding); longer, one chunk beside decoding sequences.
      const int64_t total_q = max_seqlen_q <= 16 ? batch * max_seqlen_q : batch - 1 + max_seqlen_q;
      for (int64_t max_seqlen_k : key_lengths) {
        if (max_seqlen_k < max_seqlen_q) continue;
        OptionTensors tables;
        const ForwardOptions options = shape_options(shape, form, window, max_seqlen_k, tables);
        for (int page : pages) {
          // Keys in a paged cache were rotated as they were written.
          if (page != 0 && form != RopeForm::none) continue;
          const int64_t pages_per_sequence = page == 0 ? 1 : (max_seqlen_k + page - 1) / page;
          const TensorView q = TensorView::contiguous(address(0x10000), shape.dtype, {total_q, heads_q, dim});
          const TensorView kv =
              page == 0 ? TensorView::contiguous(address(0x20000), shape.dtype, {batch * max_seqlen_k, heads_kv, dim})
                        : TensorView::contiguous(address(0x20000), shape.dtype,
                                                 {batch * pages_per_sequence, page, heads_kv, dim});
          const TensorView table = TensorView::contiguous(address(0x30000), DType::i32, {batch, pages_per_sequence});
          VarlenArgs varlen;
          varlen.cu_seqlens_q = varlen.cu_seqlens_k = TensorView::contiguous(address(0x40000), DType::i32, {batch + 1});
          varlen.max_seqlen_q = static_cast<int>(max_seqlen_q);
          varlen.max_seqlen_k = static_cast<int>(max_seqlen_k);
          varlen.block_table = page == 0 ? nullptr : &table;
          add(detail::plan_forward_varlen(q, kv, values_after(kv), q, nullptr, varlen, options, arch, max_smem, 132).spec);
          add_split(detail::plan_forward_varlen_split(q, kv, values_after(kv), q, nullptr, varlen, options, workspace,
                                                      workspace_bytes, false, arch, max_smem, 132));
          varlen.dynamic_splits = true;
          add_split(detail::plan_forward_varlen_split(q, kv, values_after(kv), q, nullptr, varlen, options, workspace,
                                                      workspace_bytes, false, arch, max_smem, 132));
        }
      }
    }
  }
  // forward_kvcache.
  for (int64_t batch : batches) {
    for (int64_t tokens = 1; tokens <= 16; ++tokens) {
      for (int64_t capacity : key_lengths) {
        for (int page : pages) {
          const int64_t pages_per_sequence = page == 0 ? 1 : (capacity + page - 1) / page;
          const int64_t rows = page == 0 ? capacity : pages_per_sequence * page;
          OptionTensors tables;
          const ForwardOptions options = shape_options(shape, form, window, rows + tokens, tables);
          const TensorView q = TensorView::contiguous(address(0x10000), shape.dtype, {batch, tokens, heads_q, dim});
          const TensorView k_new = TensorView::contiguous(address(0x20000), shape.dtype, {batch, tokens, heads_kv, dim});
          const TensorView table = TensorView::contiguous(address(0x30000), DType::i32, {batch, pages_per_sequence});
          KVCacheArgs args;
          args.k_cache = page == 0 ? TensorView::contiguous(address(0x40000), shape.dtype, {batch, capacity, heads_kv, dim})
                                   : TensorView::contiguous(address(0x40000), shape.dtype,
                                                            {batch * pages_per_sequence, page, heads_kv, dim});
          args.v_cache = values_after(args.k_cache);
          args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
          args.block_table = page == 0 ? nullptr : &table;
          {
            // New keys change the append kernel only, never the attention's spec: appended calls plan both.
            args.k_new = args.v_new = &k_new;
            for (const auto& [splits, dynamic] : {std::pair<int, bool>{0, false}, {1, false}, {0, true}}) {
              args.num_splits = splits;
              args.dynamic_splits = dynamic;
              const detail::KVCachePlan plan = detail::plan_kvcache(q, args, q, nullptr, options, workspace,
                                                                    workspace_bytes, false, arch, max_smem, 132);
              add(plan.attention.spec);
              if (plan.append.grid > 0) add(plan.append.spec);
              if (plan.combine.grid > 0) add(plan.combine.spec);
            }
          }
        }
      }
    }
  }
}

std::string known_names() {
  std::string names;
  for (const Preset& preset : presets()) names += (names.empty() ? "" : ", ") + preset.name;
  return names;
}

}  // namespace

TensorView values_after(const TensorView& keys) {
  TensorView values = keys;
  values.data = static_cast<char*>(keys.data) +
                keys.shape[0] * keys.strides[0] * static_cast<int64_t>(detail::dtype_size(keys.dtype));
  return values;
}

int max_smem_of(const detail::Arch& arch) {
  // The CUDA programming guide's per-compute-capability limits.
  if (arch.major >= 12) return 99 * 1024;                                        // consumer Blackwell
  if (arch.major >= 9) return 227 * 1024;                                        // Hopper, Blackwell, Thor
  if (arch.minor == 0 || arch.minor == 7) return 163 * 1024;                     // A100, Orin
  return 99 * 1024;                                                              // other sm_8x
}

const std::vector<Preset>& presets() {
  // Decoder LLMs run causal attention in bf16, with rotate-half RoPE over the
  // whole head (Hugging Face's configs: no partial_rotary_factor); the older
  // GPT-2/BERT checkpoints learn absolute positions, are usually served in
  // f16, and BERT's encoder attends both ways.
  constexpr RopeStyle kHalf = RopeStyle::rotate_half;
  static const std::vector<Preset> all = {
      {"default", "bf16 and f16, head_dim 64 and 128, causal and not", all_generated_shapes()},
      {"llama3-8b", "Llama 3 8B: bf16, head_dim 128, causal (32 q / 8 kv heads), RoPE rotate-half",
       {{DType::bf16, 128, true, false, false, true, kHalf}}},
      {"llama3-70b", "Llama 3 70B: bf16, head_dim 128, causal (64 q / 8 kv heads), RoPE rotate-half",
       {model_heads({DType::bf16, 128, true, false, false, true, kHalf}, 64, 8)}},
      {"mistral-7b", "Mistral 7B: bf16, head_dim 128, causal (32 q / 8 kv heads), RoPE rotate-half",
       {{DType::bf16, 128, true, false, false, true, kHalf}}},
      {"qwen2.5-7b", "Qwen2.5 7B: bf16, head_dim 128, causal (28 q / 4 kv heads), RoPE rotate-half",
       {model_heads({DType::bf16, 128, true, false, false, true, kHalf}, 28, 4)}},
      {"gpt2", "GPT-2: f16, head_dim 64, causal (12 heads)",
       {model_heads({DType::f16, 64, true, false, false, true}, 12, 12)}},
      {"bert-base", "BERT base: f16, head_dim 64, bidirectional (12 heads)",
       {model_heads({DType::f16, 64, false}, 12, 12)}},
      {"phi3-mini", "Phi-3 mini (4k): bf16, head_dim 96, causal (32 heads), RoPE rotate-half",
       {model_heads({DType::bf16, 96, true, false, false, true, kHalf}, 32, 32)}},
      {"gemma2-9b", "Gemma 2 9B: bf16, head_dim 256, softcap 50, global causal and 4096-token local layers, RoPE rotate-half",
       {model_heads({DType::bf16, 256, true, false, true, true, kHalf}, 16, 8),
        model_heads({DType::bf16, 256, true, true, true, true, kHalf}, 16, 8)}},
      // gpt-oss's RoPE is rotate-half over the whole head with YaRN (factor
      // 32; theta 150000 and the other YaRN settings are runtime arguments):
      // angles from theta warm its .rope_scaled kernels (attention factor
      // 0.1 ln 32 + 1), tables in q's dtype (built scaled by the engine)
      // unscaled ones.
      {"gpt-oss",
       "gpt-oss 20B/120B: bf16, head_dim 64, learnable sinks, causal and 128-token sliding layers (64 q / 8 kv heads), "
       "RoPE rotate-half with YaRN (factor 32)",
       {{DType::bf16, 64, true, false, false, true, kHalf, 0, /*yarn_factor=*/32.f, /*sink=*/true, /*window=*/0, 64, 8},
        {DType::bf16, 64, true, true, false, true, kHalf, 0, /*yarn_factor=*/32.f, /*sink=*/true, /*window=*/127, 64,
         8}}},
      // LongRoPE over 131072 positions of an original 4096 (factor 32; the
      // pair factors, long or short, are runtime arguments): angles from
      // theta warm .rope_scaled kernels (attention factor sqrt(1 + ln 32 /
      // ln 4096)), tables in q's dtype unscaled ones.
      {"phi3.5-mini",
       "Phi-3.5 mini and Phi-3 mini 128k: bf16, head_dim 96, causal (32 heads), RoPE rotate-half with LongRoPE "
       "(131072 / 4096 positions)",
       {longrope_shape(96, 96, 32, 32, 32.f)}},
      // MLA prefill as engines run it over uncompressed keys: q/k of 192
      // (128 + 64 RoPE channels, rotated by the engine before the call), v of
      // 128, one KV head a query head.
      {"deepseek-v3",
       "DeepSeek V3 / R1 MLA prefill over uncompressed keys: bf16, q/k head_dim 192, v 128 (dv128), causal (128 heads)",
       {deepseek_prefill_shape()}},
      {"phi4-mini",
       "Phi-4-mini: bf16, head_dim 128, causal (24 q / 8 kv heads), RoPE rotate-half over 96 channels with LongRoPE "
       "(131072 / 4096 positions)",
       {longrope_shape(128, 96, 24, 8, 32.f)}},
  };
  return all;
}

std::string page_size_error(long page) {
  if (page >= 1 && page <= (1 << 20) && (page & (page - 1)) == 0) return "";
  return fmt::format("page size {}: a paged cache's pages are a power of two rows, 1 to 2^20", page);
}

std::vector<detail::KernelSpec> preset_specs(const std::string& name, const detail::Arch& arch,
                                             const detail::TuningTable* tuning, const std::vector<int>& extra_pages) {
  for (const int page : extra_pages) {
    if (const std::string error = page_size_error(page); !error.empty()) throw Error(ErrorCode::invalid_argument, error);
  }
  for (const Preset& preset : presets()) {
    if (preset.name != name) continue;
    std::vector<detail::KernelSpec> specs;
    for (const AttentionShape& shape : preset.shapes) {
      // Every tile configuration the planner picks for some seqlen bucket.
      const bool masked = shape.causal || shape.local;  // windows take causal's tiles
      std::vector<TileConfig> tile_set = detail::default_tile_set(shape.dtype, shape.head_dim, masked, arch);
      if (tuning != nullptr) {
        for (const detail::TunedChoice& choice : tuning->choices()) {
          const detail::ShapeClass& c = choice.shape;
          const bool same_class = c.arch == arch && c.dtype == shape.dtype && c.head_dim == shape.head_dim && c.causal == masked;
          const bool known = std::any_of(tile_set.begin(), tile_set.end(), [&](const TileConfig& t) {
            return t.block_q == choice.tiles.block_q && t.block_kv == choice.tiles.block_kv && t.warps == choice.tiles.warps;
          });
          if (same_class && !known) tile_set.push_back(choice.tiles);
        }
      }
      add_forward_specs(shape, arch, specs);
      if (shape.head_dim_v != 0) {
        add_prefill_specs(shape, RopeForm::none, arch, extra_pages, specs);
        continue;
      }
      for (const TileConfig& tiles : tile_set) {
        detail::KernelSpec spec;
        spec.dtype = shape.dtype;
        spec.head_dim = shape.head_dim;
        spec.causal = shape.causal && !shape.local;  // a causal window is local
        spec.local = shape.local;
        spec.softcap = shape.softcap;
        spec.sink = shape.sink;
        detail::apply_tiles(spec, tiles);
        // Surfaces a planner/generator mismatch here rather than as a compile error.
        spec.validate();
        specs.push_back(spec);
      }
      if (shape.decoder) {
        for (RopeForm form : rope_forms(shape)) {
          add_prefill_specs(shape, form, arch, extra_pages, specs);
          add_kvcache_specs(shape, form, arch, extra_pages, specs);
          add_dense_split_specs(shape, form, arch, specs);
          add_varlen_specs(shape, form, arch, extra_pages, specs);
          add_engine_sweep_specs(shape, form, arch, extra_pages, specs);
        }
      }
    }
    // Shapes share append and combine kernels: each spec once, in first-seen order.
    std::vector<detail::KernelSpec> unique;
    for (const detail::KernelSpec& spec : specs) {
      if (std::find(unique.begin(), unique.end(), spec) == unique.end()) unique.push_back(spec);
    }
    return unique;
  }
  throw Error(ErrorCode::invalid_argument, fmt::format("unknown preset '{}' (known: {})", name, known_names()));
}

}  // namespace jitattn::cli
