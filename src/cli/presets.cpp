#include <algorithm>
#include "cli/presets.hpp"

#include <fmt/format.h>

#include "plan.hpp"

namespace jitattn::cli {
namespace {

// The head dims most models use, both dtypes, causal and not: the safe choice
// when the models to serve are not known yet.
std::vector<AttentionShape> all_generated_shapes() {
  std::vector<AttentionShape> shapes;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (int head_dim : {64, 128}) {
      for (bool causal : {true, false}) shapes.push_back({dtype, head_dim, causal});
    }
  }
  return shapes;
}

std::string known_names() {
  std::string names;
  for (const Preset& preset : presets()) names += (names.empty() ? "" : ", ") + preset.name;
  return names;
}

}  // namespace

const std::vector<Preset>& presets() {
  // Decoder LLMs run causal attention in bf16; the older GPT-2/BERT checkpoints
  // are usually served in f16, and BERT's encoder attends both ways.
  static const std::vector<Preset> all = {
      {"default", "bf16 and f16, head_dim 64 and 128, causal and not", all_generated_shapes()},
      {"llama3-8b", "Llama 3 8B: bf16, head_dim 128, causal (32 q / 8 kv heads)", {{DType::bf16, 128, true}}},
      {"llama3-70b", "Llama 3 70B: bf16, head_dim 128, causal (64 q / 8 kv heads)", {{DType::bf16, 128, true}}},
      {"mistral-7b", "Mistral 7B: bf16, head_dim 128, causal (32 q / 8 kv heads)", {{DType::bf16, 128, true}}},
      {"qwen2.5-7b", "Qwen2.5 7B: bf16, head_dim 128, causal (28 q / 4 kv heads)", {{DType::bf16, 128, true}}},
      {"gpt2", "GPT-2: f16, head_dim 64, causal (12 heads)", {{DType::f16, 64, true}}},
      {"bert-base", "BERT base: f16, head_dim 64, bidirectional (12 heads)", {{DType::f16, 64, false}}},
      {"phi3-mini", "Phi-3 mini: bf16, head_dim 96, causal (32 heads)", {{DType::bf16, 96, true}}},
      {"gemma2-9b", "Gemma 2 9B: bf16, head_dim 256, softcap 50, global causal and 4096-token local layers",
       {{DType::bf16, 256, true, false, true}, {DType::bf16, 256, false, true, true}}},
  };
  return all;
}

std::vector<detail::KernelSpec> preset_specs(const std::string& name, const detail::Arch& arch,
                                             const detail::TuningTable* tuning) {
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
      for (const TileConfig& tiles : tile_set) {
        detail::KernelSpec spec;
        spec.dtype = shape.dtype;
        spec.head_dim = shape.head_dim;
        spec.causal = shape.causal;
        spec.local = shape.local;
        spec.softcap = shape.softcap;
        spec.block_q = tiles.block_q;
        spec.block_kv = tiles.block_kv;
        spec.warps = tiles.warps;
        // Surfaces a planner/generator mismatch here rather than as a compile error.
        spec.validate();
        specs.push_back(spec);
      }
    }
    return specs;
  }
  throw Error(ErrorCode::invalid_argument, fmt::format("unknown preset '{}' (known: {})", name, known_names()));
}

}  // namespace jitattn::cli
