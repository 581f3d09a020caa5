// The `jitattn` tool's subcommands, one function each. main.cpp parses the
// command line into these option structs and calls one; each returns the
// process exit status and lets jitattn::Error escape for main to report.
#pragma once

#include <string>
#include <vector>

#include <jitattn/jitattn.hpp>

namespace jitattn::cli {

struct WarmOptions {
  std::vector<std::string> specs;    // spec texts given on the command line
  std::string manifest;              // path of a manifest file; "" = none
  std::vector<std::string> presets;  // preset names
  std::vector<std::string> archs;    // empty: the local GPUs' archs, else sm_80 and sm_90a
  int jobs = 1;
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

// Compiles (or finds in the disk cache) every requested spec for every arch.
int warm(const Config& config, const WarmOptions& options);
// Lists the presets and the specs each expands to for `archs` (default as for warm).
int list_presets(const std::vector<std::string>& archs, bool json);
// Lists the disk cache's entries.
int list(const Config& config, bool json);
// Removes every disk cache entry and the tuning table.
int clear(const Config& config);
// Times the tile candidates of each shape class on this GPU and merges the
// winners into the cache directory's tuning table.
int tune(const Config& config, const TuneOptions& options);
// Library, NVRTC, driver, devices, cache and template source.
int info(const Config& config, bool json);
// Prints the source rendered for one spec.
int source(const Config& config, const std::string& spec_text);

}  // namespace jitattn::cli
