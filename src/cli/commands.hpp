// The `jitattn` tool's subcommands, one function each. main.cpp parses the
// command line into these option structs and calls one; each returns the
// process exit status and lets jitattn::Error escape for main to report.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <jitattn/jitattn.hpp>

namespace jitattn::cli {

struct WarmOptions {
  std::vector<std::string> specs;    // spec texts given on the command line
  std::string manifest;              // path of a manifest file; "" = none
  std::vector<std::string> presets;  // preset names
  std::vector<std::string> archs;    // empty: the local GPUs' archs, else sm_80 and sm_90a
  std::vector<int> page_sizes;       // presets also sweep these page sizes (preset_specs' extra_pages)
  int jobs = 0;  // kernels compiled at once; 0: one per CPU core (an NVRTC compile takes one core and about 0.1 GB)
  bool json = false;
};

struct TuneOptions {
  std::vector<std::string> dtypes;      // "bf16", "f16"; empty: both
  std::vector<int> head_dims;           // empty: 64 and 128
  std::string causal = "both";          // yes, no or both
  std::vector<int> seqlens;             // empty: the buckets 512 … 16384
  std::vector<std::string> candidates;  // "all" or BQxBKVxW; empty: all
  int iterations = 10;
  bool json = false;
  bool dry_run = false;  // print what would be timed; needs no GPU
};

// `jitattn plan`: one call's shape and the GPU to plan it for. Unset
// optionals take the defaults main.cpp's help describes.
struct PlanOptions {
  // forward (forward() with a workspace), kvcache (forward_kvcache()) or
  // varlen (forward_varlen() with a workspace: a step of packed sequences)
  std::string call = "forward";
  std::string dtype = "bf16";
  int head_dim = 0;
  std::optional<int> head_dim_v;   // v's and out's head dim (default head_dim)
  int64_t batch = 1;
  int64_t seqlen_q = 0;             // varlen: the longest sequence's (max_seqlen_q)
  std::optional<int64_t> seqlen_k;  // default seqlen_q; kvcache: the keys cached before the call; varlen: max_seqlen_k
  int64_t heads = 0;
  std::optional<int64_t> heads_kv;  // default heads
  bool causal = false;
  std::string window;  // "L,R" (-1 = unbounded); "" = none
  int attention_chunk = 0;  // ForwardOptions::attention_chunk; 0 = off
  float softcap = 0;
  bool alibi = false;
  bool learnable_sink = false;  // ForwardOptions::learnable_sink, f32 [heads]
  std::string rope;  // "", half or interleaved
  std::optional<int> rotary_dim;   // default head_dim
  std::string rope_tables = "none";  // none (angles from theta), f32, bf16 or f16
  float yarn_factor = 0;             // RopeOptions::yarn_factor; 0 = off
  float yarn_attention_factor = 0;   // RopeOptions::yarn_attention_factor; 0 = Hugging Face's default
  float longrope_factor = 0;            // RopeOptions::longrope_factor; 0 = no LongRoPE
  float longrope_attention_factor = 0;  // RopeOptions::longrope_attention_factor; 0 = Hugging Face's default
  std::string tiles;               // "" = the planner's; else as python/jitattn_ctypes.py force_tiles
  int splits = 0;                  // 0 = the planner's
  std::string pack_gqa = "auto";   // yes, no or auto
  bool no_workspace = false;       // forward() or forward_varlen() without a workspace (never splits)
  // kvcache only
  std::optional<int64_t> cache_len;  // rows per sequence; default seqlen_k + new_tokens
  int new_tokens = 0;                // k_new/v_new rows appended per sequence
  std::optional<int> max_seqlen_k;   // KVCacheArgs::max_seqlen_k; default seqlen_k + new_tokens
  // varlen only
  std::optional<int64_t> total_q;    // packed query rows; default batch × seqlen_q
  // kvcache and varlen
  int page_size = 0;                 // 0 = contiguous cache (varlen: packed k/v)
  int64_t total_seqlen_k = 0;        // KVCacheArgs / VarlenArgs::total_seqlen_k; 0 = unknown
  bool dynamic_splits = false;       // KVCacheArgs / VarlenArgs::dynamic_splits
  bool cache_leftpad = false;        // KVCacheArgs::cache_leftpad (contiguous caches)
  // The target; unset: this host's GPU 0, else sm_90a's
  std::optional<std::string> arch;
  std::optional<int> sms;
  std::optional<int> smem;
  bool json = false;
  bool manifest = false;  // print `SPEC @ARCH` lines for `jitattn warm --manifest`
};

// Compiles (or finds in the disk cache) every requested spec for every arch.
int warm(const Config& config, const WarmOptions& options);
// Lists the presets and the specs each expands to for `archs` (default as for
// warm), with the tiles the cache directory's tuning table adds, as warm does.
int list_presets(const Config& config, const std::vector<std::string>& archs, const std::vector<int>& page_sizes,
                 bool json);
// Lists the disk cache's entries.
// The cache's entries as a table, a JSON array, or (manifest) the `SPEC @ARCH` lines of its valid entries, each
// once and sorted, for `jitattn warm --manifest` on another host: a staging run's cache becomes the deploy's list.
int list(const Config& config, bool json, bool manifest = false);
// Removes every disk cache entry and the tuning table.
int clear(const Config& config);

struct PruneOptions {
  std::optional<double> older_than_days;  // also entries created longer ago than this
  bool dry_run = false;                   // print what would go; remove nothing
  bool json = false;
};
// Removes invalid entries, those of another library version, and (where
// this host has NVRTC) those of another NVRTC version, which it never reads;
// with older_than_days also old ones. Temporary files of writers that died
// go too; each remaining kernel keeps a link for hosts without NVRTC.
int prune(const Config& config, const PruneOptions& options);
// Times the tile candidates of each shape class on this GPU and merges the
// winners into the cache directory's tuning table.
int tune(const Config& config, const TuneOptions& options);
// Library, NVRTC, driver, devices, cache and template source.
int info(const Config& config, bool json);
// Prints the launches the planner makes for one call shape on a target GPU;
// compiles and launches nothing, and needs no GPU.
int plan(const Config& config, const PlanOptions& options);
// Prints the source rendered for one spec.
int source(const Config& config, const std::string& spec_text);

}  // namespace jitattn::cli
