// jitattn: warms, inspects and clears the kernel cache, tunes tile choices and
// shows what a call plans to, from the command line.
// This file only parses the command line and dispatches; each command is one
// function in commands.cpp.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fmt/format.h>

#include <jitattn/jitattn.hpp>

#include "cli/commands.hpp"
#include "cli/presets.hpp"

namespace {

constexpr const char* warm_footer = R"(
Without SPEC, --manifest or --preset, warms the `default` preset.
Without --arch, targets the archs of this host's GPUs, or sm_80 and sm_90a
when there is none.

Manifest: one spec per line; blank lines and text after '#' are ignored.
A line may pin archs, which then replace the --arch list for that line:
    fwd.bf16.d128.br128.bc64.w8.causal            # every --arch
    fwd.f16.d64.br128.bc64.w4 @sm_80 @sm_90a      # only these
`jitattn list --manifest` prints a cache's kernels in this form: the kernels a
staging run compiled, to warm on the hosts it deploys to.

Prints a table (spec, arch, hit/miss, compile seconds, cubin KiB) and a total
line; exits 1 if any kernel failed to compile (after compiling the others).)";

constexpr const char* tune_footer = R"(
Each shape class (dtype, head dim, causal, seqlen bucket) is timed on a
problem of batch x seqlen = 16384 tokens and heads x head_dim = 2048: every
candidate tile configuration that fits the GPU's shared memory runs 3 warm-up
calls then --iters timed calls (CUDA events, median). The fastest per class is
merged into <cache dir>/v1/tuning.json, which the planner consults before its
built-in choices; a table from another jitattn or NVRTC version is ignored.
Lists take commas or repeated options: --dtype bf16,f16 or --dtype bf16 --dtype f16.
Candidates are `all` or BQxBKVxW configurations, e.g. 128x64x4,128x128x8.

Prints a table (class, winning tiles, TFLOP/s, built-in tiles, built-in
TFLOP/s, gain %). --dry-run prints the classes and candidates instead and
needs no GPU.)";

constexpr const char* plan_footer = R"(
Plans one call as the library would on the target GPU, without needing one,
and prints its launches in order (append: new keys into the KV cache;
attention; combine: merges split-KV partials): kernel spec, grid (CTAs),
threads, dynamic shared memory, and for the attention its key splits and the
workspace bytes they need. Nothing is compiled or launched.

--call forward plans forward() given a workspace (it may split over the keys;
--no-workspace: forward() without one, which never splits). --call kvcache
plans forward_kvcache() over a cache of --cache-len rows per sequence (pages
of --page-size rows with a block table, or contiguous), each holding
--seqlen-k keys (cache_seqlens) before --new-tokens new ones are appended.
--call varlen plans forward_varlen() given a workspace (--no-workspace:
without one) for a step of --batch packed sequences of --total-q query rows
in all, the longest --seqlen-q queries over --seqlen-k keys; k/v are packed
(cu_seqlens_k; --total-seqlen-k rows, else --batch x --seqlen-k), or with
--page-size a paged cache of --seqlen-k rows per sequence read through a
block table and seqused_k, as an inference engine's step passes them.

Without --arch, --sms and --smem: this host's GPU 0 (its SMs and shared memory
only if it is of the target arch), else sm_90a, 132 SMs and the arch's opt-in
shared memory per block (sm_90: 232448 bytes, sm_80: 166912, other sm_8x:
101376). Tiles come from --tiles, else the tuning table in the cache
directory (as a real call's would), else the planner's built-in choice.
--tiles: BQxBKVxW, BQxBKVxWxS (producer layout, S stages), or that ending in
w (wgmma warpgroups, sm_90a) or wp (wgmma, persistent grid): 128x128x8x2w.

--manifest prints SPEC @ARCH lines, the format `jitattn warm --manifest` reads:
    jitattn plan --head-dim 128 --seqlen-q 1024 --heads 32 --causal --manifest >> specs.txt
    jitattn warm --manifest specs.txt)";

// Repeatable options take one value per occurrence, so a spec written after
// `--arch sm_80` stays a spec.
CLI::Option* add_repeatable(CLI::App* app, const std::string& name, std::vector<std::string>& values,
                            const std::string& help) {
  return app->add_option(name, values, help)->allow_extra_args(false)->type_name("NAME");
}

// --page-size N (repeatable): presets also sweep paged caches of N rows.
CLI::Option* add_page_sizes(CLI::App* app, std::vector<int>& values) {
  return app
      ->add_option("--page-size", values,
                   "Presets also sweep paged caches of N rows (a power of two; repeatable), beside 16, 32, 64 and 256: "
                   "an engine's block size, e.g. 1 (SGLang) or 8")
      ->allow_extra_args(false)
      ->check(CLI::Validator(
          [](const std::string& text) {
            char* end = nullptr;
            const long page = std::strtol(text.c_str(), &end, 10);
            return *end != '\0' ? "not an integer: " + text : jitattn::cli::page_size_error(page);
          },
          "POWER OF TWO"))
      ->type_name("N");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace jitattn;

  CLI::App app{"jitattn: FlashAttention kernels generated just in time. Warms, inspects and clears\n"
               "the on-disk kernel cache (JITATTN_CACHE_DIR, else $XDG_CACHE_HOME/jitattn, else ~/.cache/jitattn),\n"
               "tunes the tile choices for this GPU, and shows the kernels a call shape plans to.",
               "jitattn"};
  app.set_version_flag("--version", "jitattn " + version());
  app.require_subcommand(1);
  app.fallthrough();  // global options may also follow the subcommand
  std::string cache_dir;
  CLI::Option* cache_dir_option =
      app.add_option("--cache-dir", cache_dir, "Cache directory for this run (overrides JITATTN_CACHE_DIR)")
          ->type_name("DIR");

  cli::WarmOptions warm;
  CLI::App* warm_cmd = app.add_subcommand("warm", "Compile kernels into the cache (or find them there)");
  warm_cmd->add_option("spec", warm.specs, "Kernel specs, e.g. fwd.bf16.d128.br128.bc64.w8.causal")->type_name("SPEC");
  warm_cmd->add_option("--manifest", warm.manifest, "File listing specs (format below)")->type_name("FILE");
  add_repeatable(warm_cmd, "--preset", warm.presets, "Model preset (repeatable); `jitattn presets` lists them");
  add_repeatable(warm_cmd, "--arch", warm.archs, "Target arch, e.g. sm_80, sm_90a (repeatable)")->type_name("ARCH");
  add_page_sizes(warm_cmd, warm.page_sizes);
  warm_cmd->add_option("-j,--jobs", warm.jobs, "Compile N kernels at once (default: one per CPU core)")
      ->check(CLI::Range(1, 1024))
      ->option_text("N");
  warm_cmd->add_flag("--json", warm.json, "Print the results as a JSON array instead of a table");
  warm_cmd->footer(warm_footer);

  std::vector<std::string> preset_archs;
  bool presets_json = false;
  CLI::App* presets_cmd = app.add_subcommand("presets", "List the model presets and the specs each warms");
  add_repeatable(presets_cmd, "--arch", preset_archs, "Expand for this arch (repeatable; default as for warm)")->type_name("ARCH");
  std::vector<int> preset_page_sizes;
  add_page_sizes(presets_cmd, preset_page_sizes);
  presets_cmd->add_flag("--json", presets_json, "Print JSON");

  bool list_json = false, list_manifest = false;
  CLI::App* list_cmd = app.add_subcommand("list", "List the cache's entries: spec, arch, cubin size, age, key");
  list_cmd->add_flag("--json", list_json, "Print a JSON array");
  list_cmd->add_flag("--manifest", list_manifest,
                     "Print the valid entries' SPEC @ARCH lines (each once), for jitattn warm --manifest")
      ->excludes("--json");

  CLI::App* clear_cmd = app.add_subcommand("clear", "Remove every cache entry and the tuning table");

  cli::PruneOptions prune;
  CLI::App* prune_cmd = app.add_subcommand(
      "prune", "Remove invalid entries and those of other library or NVRTC versions");
  prune_cmd->add_option("--older-than", prune.older_than_days, "Also remove entries created more than DAYS ago")
      ->type_name("DAYS");
  prune_cmd->add_flag("--dry-run", prune.dry_run, "List what would be removed; remove nothing");
  prune_cmd->add_flag("--json", prune.json, "Print the removed entries as a JSON array");

  cli::TuneOptions tune;
  CLI::App* tune_cmd =
      app.add_subcommand("tune", "Time the tile configurations of each shape class on this GPU; keep the fastest");
  // Comma lists, or one value per occurrence (never swallowing what follows).
  auto add_list = [&](const std::string& name, auto& values, const std::string& help, const std::string& type) {
    return tune_cmd->add_option(name, values, help)->delimiter(',')->allow_extra_args(false)->type_name(type);
  };
  add_list("--dtype", tune.dtypes, "bf16, f16 (default both)", "DTYPE");
  add_list("--head-dim", tune.head_dims, "32, 64, 96, 128, 192, 256 (default 64 and 128)", "D");
  tune_cmd->add_option("--causal", tune.causal, "yes, no or both (default both)")
      ->check(CLI::IsMember({"yes", "no", "both"}))
      ->type_name("WHEN");
  add_list("--seqlen", tune.seqlens, "Sequence lengths, one per bucket (default 512,1024,2048,4096,8192,16384)", "N");
  add_list("--candidates", tune.candidates, "all (default) or tile configurations BQxBKVxW", "TILES");
  tune_cmd->add_option("--iters", tune.iterations, "Timed calls per candidate; the median counts (default 10)")
      ->check(CLI::Range(1, 1000000))
      ->option_text("N");
  tune_cmd->add_flag("--json", tune.json, "Print JSON instead of a table");
  tune_cmd->add_flag("--dry-run", tune.dry_run, "Print the classes and candidates it would time (no GPU needed)");
  tune_cmd->footer(tune_footer);

  bool info_json = false;
  CLI::App* info_cmd = app.add_subcommand("info", "Show version, NVRTC, driver, GPUs, cache and template source");
  info_cmd->add_flag("--json", info_json, "Print a JSON object");

  cli::PlanOptions plan;
  CLI::App* plan_cmd = app.add_subcommand("plan", "Print the kernels and launches a call shape plans to (no GPU needed)");
  plan_cmd->add_option("--call", plan.call, "forward (default), kvcache or varlen")
      ->check(CLI::IsMember({"forward", "kvcache", "varlen"}))
      ->type_name("CALL");
  plan_cmd->add_option("--dtype", plan.dtype, "bf16 (default) or f16")->type_name("DTYPE");
  plan_cmd->add_option("--head-dim", plan.head_dim, "Head dim")->required()->type_name("D");
  plan_cmd->add_option("--head-dim-v", plan.head_dim_v,
                       "V's and the output's head dim, where it differs from q's and k's (e.g. 128 beside 192; "
                       "forward and varlen over packed keys; default --head-dim)")
      ->type_name("DV");
  plan_cmd->add_option("--batch", plan.batch, "Sequences (default 1)")->type_name("B");
  plan_cmd->add_option("--seqlen-q", plan.seqlen_q, "Queries per sequence; varlen: the longest sequence's (max_seqlen_q)")
      ->required()
      ->type_name("N");
  plan_cmd->add_option("--seqlen-k", plan.seqlen_k,
                       "Keys per sequence; kvcache: keys cached before the call; varlen: the longest sequence's "
                       "(max_seqlen_k) (default --seqlen-q)")
      ->type_name("N");
  plan_cmd->add_option("--heads", plan.heads, "Query heads")->required()->type_name("H");
  plan_cmd->add_option("--heads-kv", plan.heads_kv, "KV heads, dividing --heads (default --heads)")->type_name("H");
  plan_cmd->add_flag("--causal", plan.causal, "Causal mask (bottom-right aligned)");
  plan_cmd->add_option("--window", plan.window, "Sliding window: keys left and right of the diagonal, -1 = unbounded")
      ->type_name("L,R");
  plan_cmd->add_option("--attention-chunk", plan.attention_chunk,
                       "Chunked local attention: queries see keys of their own chunk of N keys (0 = off)")
      ->type_name("N");
  plan_cmd->add_option("--softcap", plan.softcap, "Logit softcap (0 = off)")->type_name("X");
  plan_cmd->add_flag("--alibi", plan.alibi, "ALiBi slopes, f32 [heads]");
  plan_cmd->add_flag("--learnable-sink", plan.learnable_sink, "Learnable attention sinks, f32 [heads] (gpt-oss)");
  CLI::Option* rope_option = plan_cmd->add_option("--rope", plan.rope, "Fused RoPE: half (rotate-half) or interleaved")
                                 ->check(CLI::IsMember({"half", "interleaved"}))
                                 ->type_name("STYLE");
  plan_cmd->add_option("--rotary-dim", plan.rotary_dim, "Channels rotated (default --head-dim)")
      ->needs(rope_option)
      ->type_name("R");
  plan_cmd->add_option("--rope-tables", plan.rope_tables,
                       "none (default: angles from theta), or cos/sin tables of f32, bf16 or f16")
      ->check(CLI::IsMember({"none", "f32", "bf16", "f16"}))
      ->needs(rope_option)
      ->type_name("DTYPE");
  CLI::Option* yarn_option =
      plan_cmd->add_option("--yarn-factor", plan.yarn_factor,
                           "YaRN frequency scaling (rope_type yarn; gpt-oss: 32), angles from theta (0 = off)")
          ->needs(rope_option)
          ->type_name("F");
  plan_cmd->add_option("--yarn-attention-factor", plan.yarn_attention_factor,
                       "YaRN's attention factor scaling cos and sin, .rope_scaled unless 1 (default 0 = 0.1 ln F + 1)")
      ->needs(yarn_option)
      ->type_name("A");
  CLI::Option* longrope_option =
      plan_cmd
          ->add_option("--longrope-factor", plan.longrope_factor,
                       "LongRoPE frequency scaling (rope_type longrope; Phi-3.5, Phi-4-mini: 32 = 131072 / 4096 "
                       "positions), angles from theta; the pair factors do not change the kernels (0 = off)")
          ->needs(rope_option)
          ->excludes(yarn_option)
          ->type_name("F");
  plan_cmd->add_option("--longrope-attention-factor", plan.longrope_attention_factor,
                       "LongRoPE's attention factor scaling cos and sin, .rope_scaled unless 1 (default 0 = "
                       "sqrt(1 + ln F / ln 4096))")
      ->needs(longrope_option)
      ->type_name("A");
  plan_cmd->add_option("--tiles", plan.tiles, "Force tiles: BQxBKVxW[xS][w|wp] (format below)")->type_name("TILES");
  plan_cmd->add_option("--splits", plan.splits, "Key splits: 0 = the planner's (default), 1 = none, n forces n")
      ->type_name("N");
  plan_cmd->add_option("--pack-gqa", plan.pack_gqa, "Pack a KV head's query heads into one tile: yes, no or auto")
      ->check(CLI::IsMember({"yes", "no", "auto"}))
      ->type_name("WHEN");
  plan_cmd->add_flag("--no-workspace", plan.no_workspace,
                     "forward, varlen: plan the call without a workspace (never splits)");
  plan_cmd->add_option("--cache-len", plan.cache_len, "kvcache: rows per sequence (default --seqlen-k + --new-tokens)")
      ->type_name("SMAX");
  plan_cmd->add_option("--page-size", plan.page_size,
                       "kvcache, varlen: rows per page of a paged cache, 0 = contiguous cache or packed k/v (default)")
      ->type_name("P");
  plan_cmd->add_option("--new-tokens", plan.new_tokens, "kvcache: new keys appended per sequence (default 0)")
      ->type_name("N");
  plan_cmd->add_option("--max-seqlen-k", plan.max_seqlen_k,
                       "kvcache: KVCacheArgs::max_seqlen_k (default --seqlen-k + --new-tokens; 0 = the capacity)")
      ->type_name("N");
  plan_cmd->add_option("--total-seqlen-k", plan.total_seqlen_k,
                       "kvcache, varlen: total_seqlen_k, the batch's keys in all (default 0 = unknown: every "
                       "sequence --max-seqlen-k long; varlen over packed k/v: k's rows)")
      ->type_name("N");
  plan_cmd->add_flag("--cache-leftpad", plan.cache_leftpad,
                     "kvcache: cache_leftpad, each sequence's keys from its own first row (contiguous caches)");
  plan_cmd->add_flag("--dynamic-splits", plan.dynamic_splits,
                     "kvcache, varlen: dynamic_splits, split counts chosen on the device from the lengths (the "
                     "launch shows the most splits)");
  plan_cmd->add_option("--total-q", plan.total_q,
                       "varlen: the step's packed query rows, from --seqlen-q to --batch x --seqlen-q (default the "
                       "latter)")
      ->type_name("T");
  plan_cmd->add_option("--arch", plan.arch, "Target arch (default: this host's GPU, else sm_90a)")->type_name("ARCH");
  plan_cmd->add_option("--sms", plan.sms, "SM count (default: this host's GPU, else 132)")->type_name("N");
  plan_cmd->add_option("--smem", plan.smem, "Opt-in shared memory per block in bytes (default: the GPU's or arch's)")
      ->type_name("BYTES");
  CLI::Option* plan_json = plan_cmd->add_flag("--json", plan.json, "Print a JSON object instead of a table");
  plan_cmd->add_flag("--manifest", plan.manifest, "Print only SPEC @ARCH lines, for jitattn warm --manifest")
      ->excludes(plan_json);
  plan_cmd->footer(plan_footer);

  std::string source_spec;
  CLI::App* source_cmd = app.add_subcommand("source", "Print the CUDA source rendered for a spec");
  source_cmd->add_option("spec", source_spec, "Kernel spec, e.g. fwd.bf16.d64.br128.bc64.w4")->required()->type_name("SPEC");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    fmt::print(stderr, "jitattn: {}\nRun 'jitattn --help' for usage.\n", e.what());
    return 2;
  }

  try {
    Config config = Config::from_env();
    if (*cache_dir_option) config.cache_dir = cache_dir;
    if (*warm_cmd) return cli::warm(config, warm);
    if (*presets_cmd) return cli::list_presets(config, preset_archs, preset_page_sizes, presets_json);
    if (*list_cmd) return cli::list(config, list_json, list_manifest);
    if (*clear_cmd) return cli::clear(config);
    if (*prune_cmd) return cli::prune(config, prune);
    if (*tune_cmd) return cli::tune(config, tune);
    if (*info_cmd) return cli::info(config, info_json);
    if (*source_cmd) return cli::source(config, source_spec);
    if (*plan_cmd) return cli::plan(config, plan);
  } catch (const std::exception& e) {
    fmt::print(stderr, "jitattn: {}\n", e.what());
    return 1;
  }
  return 1;  // unreachable: require_subcommand(1)
}
