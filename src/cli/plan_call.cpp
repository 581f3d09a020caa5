#include "cli/plan_call.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "plan.hpp"
#include "cli/presets.hpp"

namespace jitattn::cli {
namespace {

using detail::KernelSpec;

[[noreturn]] void bad_option(const std::string& message) { throw Error(ErrorCode::invalid_argument, message); }

void require_at_least(const char* option, int64_t value, int64_t least) {
  if (value < least) bad_option(fmt::format("{}: {} must be >= {}", option, value, least));
}

// The whole of `text` as a decimal integer, or nothing.
std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

DType parse_dtype(const char* option, const std::string& text) {
  if (text == "bf16") return DType::bf16;
  if (text == "f16" || text == "fp16") return DType::f16;
  bad_option(fmt::format("{}: '{}' is not bf16 or f16", option, text));
}

// --window L,R: FlashAttention's window_size, -1 = unbounded on that side.
std::pair<int, int> parse_window(const std::string& text) {
  const size_t comma = text.find(',');
  const std::optional<int> left = parse_int(std::string_view(text).substr(0, comma));
  const std::optional<int> right =
      comma == std::string::npos ? std::nullopt : parse_int(std::string_view(text).substr(comma + 1));
  if (!left || !right) {
    bad_option(fmt::format("--window: '{}' is not L,R (keys seen left and right of the diagonal, -1 = unbounded), "
                           "e.g. 4096,0",
                           text));
  }
  for (const int bound : {*left, *right}) {
    if (bound < -1) bad_option(fmt::format("--window: {} in '{}' must be -1 (unbounded) or >= 0", bound, text));
  }
  return {*left, *right};
}

// A tensor of these dimensions must have an element count (and byte size)
// that int64 strides can hold.
void check_elements(const char* tensor, std::initializer_list<int64_t> dims) {
  int64_t bytes = 4;  // the widest element: f32 tables and slopes
  for (const int64_t dim : dims) {
    if (__builtin_mul_overflow(bytes, dim, &bytes)) {
      bad_option(fmt::format("{}: the shape options make it larger than 2^63 bytes", tensor));
    }
  }
}

// Device addresses for the call's tensors. The planner never dereferences a
// pointer, and nothing is launched here: it checks pointers' alignment and
// copies them into launch parameters and tensor-map descriptions (which
// only the launch encodes, through the driver). So each tensor gets an
// address of its own, 1 TiB apart so that a plan's parameters tell them
// apart, aligned to 256 bytes as cudaMalloc's are, which meets every
// alignment rule (16-byte rows, 4-byte i32 vectors, the 256-byte workspace).
enum class Buffer : uintptr_t {
  q = 1, k, v, out, alibi_slopes, rope_cos, rope_sin, cache_seqlens, block_table, k_new, v_new, workspace,
  cu_seqlens_q, cu_seqlens_k, seqused_k, cache_leftpad, learnable_sink
};
void* fake_address(Buffer buffer) { return reinterpret_cast<void*>(static_cast<uintptr_t>(buffer) << 40); }

// Everything one call passes the planner. options and cache point at the
// tensors held here, so it is built in place and never copied.
struct CallArguments {
  bool kvcache = false;
  bool varlen = false;
  bool workspace = true;  // forward, varlen: the overload that takes a workspace
  TensorView q, out;
  TensorView k, v;  // forward and varlen
  TensorView alibi_slopes, learnable_sink, rope_cos, rope_sin, block_table, k_new, v_new, seqused_k, cache_leftpad;
  // LongRoPE's pair factors: their values change the frequencies, never the
  // kernels, so a plan takes ones.
  std::vector<float> longrope_pair_factors;
  ForwardOptions options;
  KVCacheArgs cache;  // kvcache only
  VarlenArgs sequences;  // varlen only

  CallArguments() = default;
  CallArguments(const CallArguments&) = delete;
  CallArguments& operator=(const CallArguments&) = delete;
};

// A paged k/v pool in which each of `batch` sequences owns whole pages for
// `rows` rows, into k and v (named `tensor` in errors), and its block table
// into call.block_table. Returns the rows a sequence's pages hold. V's pages
// follow K's in one allocation, as engines keep a layer's cache ([2, pages,
// page_size, heads_kv, head_dim]): kernels whose one map spans both
// (KernelSpec::interleaved_kv) need them less than 2^40 bytes apart.
int64_t paged_pool(const char* tensor, DType dtype, int64_t batch, int64_t rows, int page_size, int64_t heads_kv,
                   int head_dim, CallArguments& call, TensorView& k, TensorView& v) {
  const int64_t pages = (rows + page_size - 1) / page_size;
  check_elements(tensor, {batch, pages, page_size, heads_kv, head_dim});
  const std::vector<int64_t> shape = {batch * pages, page_size, heads_kv, head_dim};
  k = TensorView::contiguous(fake_address(Buffer::k), dtype, shape);
  v = values_after(k);
  call.block_table = TensorView::contiguous(fake_address(Buffer::block_table), DType::i32, {batch, pages});
  return pages * page_size;
}

// The options into the call's tensors and options. Rules that tie options
// to one another (GQA heads, a cache that holds its keys) are checked here,
// where they can be named; what kernels support is the planner's to say.
void build_arguments(const PlanOptions& o, CallArguments& call) {
  if (o.call != "forward" && o.call != "kvcache" && o.call != "varlen") {
    bad_option(fmt::format("--call: '{}' is not forward, kvcache or varlen", o.call));
  }
  const bool kvcache = call.kvcache = o.call == "kvcache";
  const bool varlen = call.varlen = o.call == "varlen";
  const DType dtype = parse_dtype("--dtype", o.dtype);
  const int head_dim = o.head_dim;
  const int head_dim_v = o.head_dim_v.value_or(head_dim);
  const int64_t batch = o.batch, seqlen_q = o.seqlen_q, heads = o.heads;
  const int64_t heads_kv = o.heads_kv.value_or(heads), seqlen_k = o.seqlen_k.value_or(seqlen_q);
  require_at_least("--head-dim", head_dim, 1);
  require_at_least("--head-dim-v", head_dim_v, 1);
  require_at_least("--batch", batch, 1);
  require_at_least("--seqlen-q", seqlen_q, 1);
  require_at_least("--seqlen-k", seqlen_k, 0);
  require_at_least("--heads", heads, 1);
  require_at_least("--heads-kv", heads_kv, 1);
  if (heads % heads_kv != 0) {
    bad_option(fmt::format("--heads: {} must be a multiple of --heads-kv {} (each KV head serves as many query heads)",
                           heads, heads_kv));
  }
  require_at_least("--splits", o.splits, 0);
  // Options given to a call they do not describe.
  struct Scoped {
    const char* option;
    bool given;
    const char* calls;  // the calls it applies to
    bool applies;
  };
  const Scoped scoped[] = {{"--cache-len", o.cache_len.has_value(), "kvcache", kvcache},
                           {"--new-tokens", o.new_tokens != 0, "kvcache", kvcache},
                           {"--max-seqlen-k", o.max_seqlen_k.has_value(), "kvcache", kvcache},
                           {"--total-q", o.total_q.has_value(), "varlen", varlen},
                           {"--page-size", o.page_size != 0, "kvcache or varlen", kvcache || varlen},
                           {"--total-seqlen-k", o.total_seqlen_k != 0, "kvcache or varlen", kvcache || varlen},
                           {"--dynamic-splits", o.dynamic_splits, "kvcache or varlen", kvcache || varlen},
                           {"--cache-leftpad", o.cache_leftpad, "kvcache", kvcache},
                           {"--head-dim-v", o.head_dim_v.has_value(), "forward or varlen", !kvcache}};
  for (const Scoped& option : scoped) {
    if (option.given && !option.applies) {
      bad_option(fmt::format("{}: applies to --call {} only", option.option, option.calls));
    }
  }
  if (o.head_dim_v.has_value() && o.page_size != 0) {
    bad_option("--head-dim-v: not with --page-size (a paged cache's V has k's head dim)");
  }
  if (kvcache && o.no_workspace) {
    bad_option("--no-workspace: applies to --call forward or varlen only (forward_kvcache always takes a workspace)");
  }
  call.workspace = !o.no_workspace;
  require_at_least("--page-size", o.page_size, 0);
  require_at_least("--total-seqlen-k", o.total_seqlen_k, 0);
  // For varlen this bounds the step's q too: it has at most batch × seqlen_q rows.
  check_elements("q", {batch, seqlen_q, heads, head_dim});
  // varlen: the step's packed query rows and keys, each at least the longest
  // sequence's and at most every sequence's that long.
  const int64_t total_q = o.total_q.value_or(batch * seqlen_q);
  if (varlen) {
    check_elements("k", {batch, seqlen_k, heads_kv, head_dim});
    auto require_step_rows = [&](const char* option, int64_t rows, const char* longest_option, int64_t longest) {
      if (rows < longest || rows > batch * longest) {
        bad_option(fmt::format("{}: {} must be from {} {} (the longest sequence) to --batch x {} {} (every sequence "
                               "that long)",
                               option, rows, longest_option, longest, longest_option, batch * longest));
      }
    };
    require_step_rows("--total-q", total_q, "--seqlen-q", seqlen_q);
    if (o.total_seqlen_k != 0) require_step_rows("--total-seqlen-k", o.total_seqlen_k, "--seqlen-k", seqlen_k);
    if (std::max(seqlen_q, seqlen_k) > INT_MAX) {
      bad_option(fmt::format("--seqlen-{}: {} must be at most {} (max_seqlen_q and max_seqlen_k are int)",
                             seqlen_q > seqlen_k ? 'q' : 'k', std::max(seqlen_q, seqlen_k), INT_MAX));
    }
  }

  ForwardOptions& options = call.options;
  options.causal = o.causal;
  if (!o.window.empty()) std::tie(options.window_left, options.window_right) = parse_window(o.window);
  options.attention_chunk = o.attention_chunk;  // the planner rejects a negative one
  if (!(o.softcap >= 0.f) || !std::isfinite(o.softcap)) {
    bad_option(fmt::format("--softcap: {} must be >= 0 (0 = off) and finite", o.softcap));
  }
  options.softcap = o.softcap;
  if (o.pack_gqa == "yes" || o.pack_gqa == "no") {
    options.pack_gqa = o.pack_gqa == "yes";
  } else if (o.pack_gqa != "auto") {
    bad_option(fmt::format("--pack-gqa: '{}' is not yes, no or auto", o.pack_gqa));
  }
  if (!o.tiles.empty()) options.tiles = parse_tiles(o.tiles);
  if (o.alibi) {
    call.alibi_slopes = TensorView::contiguous(fake_address(Buffer::alibi_slopes), DType::f32, {heads});
    options.alibi_slopes = &call.alibi_slopes;
  }
  if (o.learnable_sink) {
    call.learnable_sink = TensorView::contiguous(fake_address(Buffer::learnable_sink), DType::f32, {heads});
    options.learnable_sink = &call.learnable_sink;
  }

  const std::vector<int64_t> q_shape =
      varlen ? std::vector<int64_t>{total_q, heads, head_dim} : std::vector<int64_t>{batch, seqlen_q, heads, head_dim};
  std::vector<int64_t> out_shape = q_shape;
  out_shape.back() = head_dim_v;
  call.q = TensorView::contiguous(fake_address(Buffer::q), dtype, q_shape);
  call.out = TensorView::contiguous(fake_address(Buffer::out), dtype, out_shape);
  int64_t rope_positions = std::max<int64_t>(seqlen_k, 1);  // forward: the keys' positions
  if (varlen) {
    VarlenArgs& sequences = call.sequences;
    sequences.cu_seqlens_q = TensorView::contiguous(fake_address(Buffer::cu_seqlens_q), DType::i32, {batch + 1});
    sequences.max_seqlen_q = static_cast<int>(seqlen_q);
    sequences.max_seqlen_k = static_cast<int>(seqlen_k);
    sequences.total_seqlen_k = o.total_seqlen_k;
    sequences.dynamic_splits = o.dynamic_splits;
    if (o.page_size == 0) {
      // Packed k/v: the step's keys, every sequence's unless --total-seqlen-k says.
      const int64_t rows = o.total_seqlen_k != 0 ? o.total_seqlen_k : batch * seqlen_k;
      call.k = TensorView::contiguous(fake_address(Buffer::k), dtype, {rows, heads_kv, head_dim});
      call.v = TensorView::contiguous(fake_address(Buffer::v), dtype, {rows, heads_kv, head_dim_v});
      sequences.cu_seqlens_k = TensorView::contiguous(fake_address(Buffer::cu_seqlens_k), DType::i32, {batch + 1});
    } else {
      // A paged cache, each sequence owning whole pages for its keys, read as
      // an engine's step reads it: through the block table and seqused_k,
      // without cu_seqlens_k.
      rope_positions = paged_pool("k", dtype, batch, std::max<int64_t>(seqlen_k, 1), o.page_size, heads_kv, head_dim,
                                  call, call.k, call.v);
      sequences.block_table = &call.block_table;
      call.seqused_k = TensorView::contiguous(fake_address(Buffer::seqused_k), DType::i32, {batch});
      sequences.seqused_k = &call.seqused_k;
    }
    options.num_splits = o.splits;
  } else if (!kvcache) {
    check_elements("k", {batch, seqlen_k, heads_kv, head_dim});
    call.k = TensorView::contiguous(fake_address(Buffer::k), dtype, {batch, seqlen_k, heads_kv, head_dim});
    call.v = TensorView::contiguous(fake_address(Buffer::v), dtype, {batch, seqlen_k, heads_kv, head_dim_v});
    options.num_splits = o.splits;
  } else {
    require_at_least("--new-tokens", o.new_tokens, 0);
    // The call attends to the keys cached before it and those it appends.
    const int64_t keys = seqlen_k + o.new_tokens;
    const int64_t cache_len = o.cache_len.value_or(std::max<int64_t>(keys, 1));
    require_at_least("--cache-len", cache_len, 1);
    if (cache_len > INT_MAX) bad_option(fmt::format("--cache-len: {} must be at most {}", cache_len, INT_MAX));
    if (keys > cache_len) {
      bad_option(fmt::format("--seqlen-k: {} cached keys{} must fit in --cache-len {}", seqlen_k,
                             o.new_tokens > 0 ? fmt::format(" + {} new ones (--new-tokens)", o.new_tokens) : "",
                             cache_len));
    }
    KVCacheArgs& cache = call.cache;
    if (o.page_size == 0) {
      check_elements("k_cache", {batch, cache_len, heads_kv, head_dim});
      cache.k_cache = TensorView::contiguous(fake_address(Buffer::k), dtype, {batch, cache_len, heads_kv, head_dim});
      cache.v_cache = TensorView::contiguous(fake_address(Buffer::v), dtype, {batch, cache_len, heads_kv, head_dim});
      rope_positions = cache_len;
    } else {
      // Each sequence owns enough whole pages for cache_len rows.
      rope_positions = paged_pool("k_cache", dtype, batch, cache_len, o.page_size, heads_kv, head_dim, call,
                                  cache.k_cache, cache.v_cache);
      cache.block_table = &call.block_table;
    }
    cache.cache_seqlens = TensorView::contiguous(fake_address(Buffer::cache_seqlens), DType::i32, {batch});
    if (o.new_tokens > 0) {
      call.k_new = TensorView::contiguous(fake_address(Buffer::k_new), dtype, {batch, o.new_tokens, heads_kv, head_dim});
      call.v_new = TensorView::contiguous(fake_address(Buffer::v_new), dtype, {batch, o.new_tokens, heads_kv, head_dim});
      cache.k_new = &call.k_new;
      cache.v_new = &call.v_new;
    }
    cache.num_splits = o.splits;
    if (o.max_seqlen_k) require_at_least("--max-seqlen-k", *o.max_seqlen_k, 0);
    cache.max_seqlen_k = o.max_seqlen_k.value_or(static_cast<int>(keys));
    cache.total_seqlen_k = o.total_seqlen_k;
    cache.dynamic_splits = o.dynamic_splits;
    if (o.cache_leftpad) {
      call.cache_leftpad = TensorView::contiguous(fake_address(Buffer::cache_leftpad), DType::i32, {batch});
      cache.cache_leftpad = &call.cache_leftpad;
    }
  }

  if (!o.rope.empty()) {
    RopeOptions& rope = options.rope;
    if (o.rope == "half") {
      rope.style = RopeStyle::rotate_half;
    } else if (o.rope == "interleaved") {
      rope.style = RopeStyle::interleaved;
    } else {
      bad_option(fmt::format("--rope: '{}' is not half or interleaved", o.rope));
    }
    if (o.rotary_dim) require_at_least("--rotary-dim", *o.rotary_dim, 1);
    rope.rotary_dim = o.rotary_dim.value_or(head_dim);
    // YaRN's own rules (a positive factor, alone, angles from theta) are the planner's.
    if (o.yarn_factor == 0.f && o.yarn_attention_factor != 0.f) {
      bad_option(fmt::format("--yarn-attention-factor: {} needs a --yarn-factor other than 0 (without YaRN there is "
                             "no attention factor)",
                             o.yarn_attention_factor));
    }
    rope.yarn_factor = o.yarn_factor;
    rope.yarn_attention_factor = o.yarn_attention_factor;
    // LongRoPE's the same way.
    if (o.longrope_factor == 0.f && o.longrope_attention_factor != 0.f) {
      bad_option(fmt::format("--longrope-attention-factor: {} needs a --longrope-factor other than 0 (without "
                             "LongRoPE there is no attention factor)",
                             o.longrope_attention_factor));
    }
    if (o.longrope_factor != 0.f) {
      call.longrope_pair_factors.assign(std::max(rope.rotary_dim / 2, 0), 1.f);
      rope.longrope_pair_factors = call.longrope_pair_factors.data();
      rope.longrope_factor = o.longrope_factor;
      rope.longrope_attention_factor = o.longrope_attention_factor;
    }
    if (o.rope_tables != "none") {
      // FlashAttention's rotary_cos / rotary_sin: [positions, rotary_dim / 2].
      const DType table_dtype = o.rope_tables == "f32" ? DType::f32 : parse_dtype("--rope-tables", o.rope_tables);
      const int64_t pairs = std::max(rope.rotary_dim / 2, 1);
      call.rope_cos = TensorView::contiguous(fake_address(Buffer::rope_cos), table_dtype, {rope_positions, pairs});
      call.rope_sin = TensorView::contiguous(fake_address(Buffer::rope_sin), table_dtype, {rope_positions, pairs});
      rope.cos = &call.rope_cos;
      rope.sin = &call.rope_sin;
    }
  }
}

[[noreturn]] void bad_tiles(const std::string& text, const std::string& why) {
  bad_option(fmt::format("--tiles: '{}' {}; the forms are BQxBKVxW, BQxBKVxWxS (S producer stages), and those "
                         "ending in w (wgmma) or wp (wgmma, persistent grid), e.g. 128x64x4, 128x128x8x2w",
                         text, why));
}

PlannedLaunch launch_of(const char* role, const KernelSpec& spec, unsigned grid) {
  PlannedLaunch launch;
  launch.role = role;
  launch.spec = spec;
  launch.grid = grid;
  launch.threads = spec.threads();
  launch.smem_bytes = spec.smem_bytes();
  return launch;
}

PlannedLaunch attention_launch(const detail::ForwardPlan& plan) {
  PlannedLaunch launch = launch_of("attention", plan.spec, plan.grid);
  launch.splits = plan.num_splits;
  launch.dynamic_splits = plan.spec.dynamic_splits;
  launch.workspace_bytes = plan.workspace_bytes;
  return launch;
}

// The launches of a call that takes a workspace, planned in the runtime's
// order (api.cpp): it first asks the workspace's size (*_workspace_bytes: a
// sizing-only plan), then runs with a workspace of exactly that size, and
// only that plan holds the combine. `plan_with(workspace, bytes,
// sizing_only)` plans the call. A call whose attention has nothing to
// compute launches nothing, as the runtime returns early.
template <typename PlanWith>
std::vector<PlannedLaunch> workspace_launches(const PlanWith& plan_with) {
  const size_t bytes = plan_with(nullptr, 0, true).attention.workspace_bytes;
  const auto plan = plan_with(bytes > 0 ? fake_address(Buffer::workspace) : nullptr, bytes, false);
  std::vector<PlannedLaunch> launches;
  if (plan.attention.grid == 0) return launches;
  if constexpr (std::is_same_v<std::decay_t<decltype(plan)>, detail::KVCachePlan>) {
    if (plan.append.grid != 0) launches.push_back(launch_of("append", plan.append.spec, plan.append.grid));
  }
  launches.push_back(attention_launch(plan.attention));
  if (plan.combine.grid != 0) launches.push_back(launch_of("combine", plan.combine.spec, plan.combine.grid));
  return launches;
}

// The launches of the call, as the runtime makes them.
std::vector<PlannedLaunch> plan_launches(const CallArguments& call, const PlanTarget& target,
                                         const detail::TuningTable* tuning) {
  const detail::Arch& arch = target.arch;
  const int smem = target.max_smem_bytes, sms = target.sm_count;
  if (call.kvcache) {
    return workspace_launches([&](void* workspace, size_t bytes, bool sizing_only) {
      return detail::plan_kvcache(call.q, call.cache, call.out, nullptr, call.options, workspace, bytes, sizing_only,
                                  arch, smem, sms, tuning);
    });
  }
  if (call.workspace && call.varlen) {
    return workspace_launches([&](void* workspace, size_t bytes, bool sizing_only) {
      return detail::plan_forward_varlen_split(call.q, call.k, call.v, call.out, nullptr, call.sequences,
                                               call.options, workspace, bytes, sizing_only, arch, smem, sms, tuning);
    });
  }
  if (call.workspace) {
    return workspace_launches([&](void* workspace, size_t bytes, bool sizing_only) {
      return detail::plan_forward_split(call.q, call.k, call.v, call.out, nullptr, call.options, workspace, bytes,
                                        sizing_only, arch, smem, sms, tuning);
    });
  }
  const detail::ForwardPlan plan =
      call.varlen ? detail::plan_forward_varlen(call.q, call.k, call.v, call.out, nullptr, call.sequences,
                                                call.options, arch, smem, sms, tuning)
                  : detail::plan_forward(call.q, call.k, call.v, call.out, nullptr, call.options, arch, smem, sms,
                                         tuning);
  if (plan.grid == 0) return {};
  return {attention_launch(plan)};
}

const PlannedLaunch* attention_of(const std::vector<PlannedLaunch>& launches) {
  for (const PlannedLaunch& launch : launches) {
    if (launch.role == "attention") return &launch;
  }
  return nullptr;
}

}  // namespace

TileConfig parse_tiles(const std::string& text) {
  TileConfig tiles;
  std::string_view numbers = text;
  if (numbers.size() >= 2 && numbers.substr(numbers.size() - 2) == "wp") {
    tiles.wgmma = tiles.persistent = true;
    numbers.remove_suffix(2);
  } else if (!numbers.empty() && numbers.back() == 'w') {
    tiles.wgmma = true;
    numbers.remove_suffix(1);
  }
  std::vector<int> fields;
  for (size_t start = 0;;) {
    const size_t x = numbers.find('x', start);
    const std::optional<int> field = parse_int(numbers.substr(start, x == std::string_view::npos ? x : x - start));
    if (!field) bad_tiles(text, "is not numbers joined by x");
    if (*field < 1) bad_tiles(text, fmt::format("has {}, but every number must be >= 1", *field));
    fields.push_back(*field);
    if (x == std::string_view::npos) break;
    start = x + 1;
  }
  if (fields.size() != 3 && fields.size() != 4) bad_tiles(text, fmt::format("has {} numbers, not 3 or 4", fields.size()));
  tiles.block_q = fields[0];
  tiles.block_kv = fields[1];
  tiles.warps = fields[2];
  tiles.stages = fields.size() == 4 ? fields[3] : 0;
  return tiles;
}

CallPlan plan_call(const PlanOptions& options, const PlanTarget& target, const detail::TuningTable* tuning) {
  CallArguments call;
  build_arguments(options, call);
  CallPlan plan;
  plan.launches = plan_launches(call, target, tuning);
  // Whether the table decided is seen by planning again without it: the
  // planner may also override a tuned choice (sm_90a's wgmma tiles), and
  // forced tiles leave it nothing to decide.
  const PlannedLaunch* attention = attention_of(plan.launches);
  if (tuning != nullptr && !tuning->empty() && options.tiles.empty() && attention != nullptr) {
    const std::vector<PlannedLaunch> untuned = plan_launches(call, target, nullptr);
    const PlannedLaunch* builtin = attention_of(untuned);
    plan.tiles_tuned = builtin == nullptr || builtin->spec != attention->spec;
  }
  return plan;
}

}  // namespace jitattn::cli
