// Named model presets for `jitattn warm --preset NAME`: the attention shapes a
// model uses (dtype, head dim, causal), expanded per arch into exactly the
// kernel specs the planner will pick for them, so a warmed cache serves the
// model's first call without compiling.
#pragma once

#include <string>
#include <vector>

#include <jitattn/jitattn.hpp>

#include "spec.hpp"
#include "tune.hpp"

namespace jitattn::cli {

// What a model's attention layers bake into a kernel, and the heads its calls
// are planned with (sequence lengths are swept).
struct AttentionShape {
  DType dtype = DType::bf16;
  int head_dim = 128;
  bool causal = true;
  bool local = false;    // sliding-window layers (with causal: a causal window, as decoders' local layers)
  bool softcap = false;  // logit softcap
  // Decoder layers also decode from a KV cache: the preset warms the kernels
  // forward_kvcache takes for one token (append, decode with and without
  // splits, contiguous and paged caches, combine).
  bool decoder = false;
  // The model's rotary embedding, for decoder shapes: the preset also warms
  // the kernels of those calls (and of prefill) with RoPE fused in, with
  // angles from theta and from cos/sin tables in q's dtype (FlashAttention's
  // rotary_cos / rotary_sin). Theta, scaling and positions are runtime
  // arguments; f32 tables are left to `jitattn plan --rope-tables f32 --manifest`.
  RopeStyle rope = RopeStyle::none;
  int rotary_dim = 0;  // 0 = head_dim
  // YaRN (RopeOptions::yarn_factor; 0 = off), which the model's angles from
  // theta always take, with Hugging Face's default attention factor: not 1
  // for factors above 1, so those kernels scale cos and sin (.rope_scaled),
  // and they are what the preset warms with angles from theta. Tables are
  // used as given (the engine builds them scaled): their kernels are unscaled.
  float yarn_factor = 0.f;
  // Learnable attention sinks (ForwardOptions::learnable_sink): every kernel
  // of the shape folds them in (.sink), split calls in their combine.
  bool sink = false;
  // Local layers' window (window_left, keys before the diagonal); 0: the
  // sweeps' own windows (half the cache, or 4096 keys).
  int window = 0;
  // The heads of the calls the preset sweeps: a KV head's query heads are
  // packed into its tiles, so the GQA ratio (with the query tokens) picks
  // between the decode kernel and tiles of 64 rows or more.
  int heads_q = 32, heads_kv = 8;
  // LongRoPE (RopeOptions::longrope_factor; 0 = off), as YaRN above: the
  // model's angles from theta always take it, with Hugging Face's default
  // attention factor (not 1 for factors above 1: .rope_scaled kernels); its
  // pair factors change no kernel.
  float longrope_factor = 0.f;
  // V's own head dim (ForwardOptions' hdim_v; 0: head_dim), e.g. DeepSeek's
  // MLA prefill over uncompressed keys (192 with 128): such shapes warm their
  // prefill (forward and varlen over packed keys, the calls that take it),
  // not the head dim's generic tiles.
  int head_dim_v = 0;
};

struct Preset {
  std::string name;
  std::string description;
  std::vector<AttentionShape> shapes;
};

// The opt-in shared memory per block of `arch`'s GPUs, for planning without
// one: 227 KB on sm_90-110, 163 KB on sm_80 and sm_87, 99 KB on other sm_8x
// and on sm_12x.
int max_smem_of(const detail::Arch& arch);

// A tensor of keys' shape and strides whose rows start right after the keys'
// last ones: V's pages after K's in one allocation, as engines keep a layer's
// paged cache ([2, pages, page_size, heads_kv, head_dim]). Kernels that bring a
// page's K and V in one tensor copy (KernelSpec::KVStages::interleaved_kv)
// need V apart from K by less than 2^40 bytes; planning a paged cache with V
// the same tensor as K picks the kernels of caches no one map spans instead,
// which are not what engines run.
TensorView values_after(const TensorView& keys);

// Every preset, in the order `jitattn presets` lists them ("default" first).
const std::vector<Preset>& presets();

// The specs preset `name` needs on `arch`: each shape with every tile
// configuration default_tiles() picks for it over the seqlen buckets
// (default_tile_set), plus the tiles `tuning` (if given) chose for the shape
// on that arch, since the planner prefers those; decoder shapes add their
// forward_kvcache, few-row forward and varlen kernels, and with a rotary
// embedding those and prefill's with RoPE fused in; and the kernels of an
// engine's calls swept on grids that cross the planner's bands (batches,
// query tokens, key lengths, pages, split modes), so that calls between the
// sweeps' points find theirs warmed too.
// Why `page` is no page size (a power of two from 1 to 2^20), or "" when
// it is one: preset_specs' rule, and --page-size's.
std::string page_size_error(long page);

// extra_pages: page sizes (powers of two) the paged sweeps take beside their
// own 16, 32, 64 and 256 rows (`--page-size`): an engine's block size, e.g.
// SGLang's 1 or 8, whose decode kernels (.pagedN) and chunked prefill
// differ from those of the sizes swept.
// Throws Error(invalid_argument) for an unknown name (the message lists the
// known ones) or a page size that is not a power of two from 1 to 2^20.
std::vector<detail::KernelSpec> preset_specs(const std::string& name, const detail::Arch& arch,
                                             const detail::TuningTable* tuning = nullptr,
                                             const std::vector<int>& extra_pages = {});

}  // namespace jitattn::cli
