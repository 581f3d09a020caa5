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

// Compiles (or finds in the disk cache) every requested spec for every arch.
int warm(const Config& config, const WarmOptions& options);
// Lists the presets and the specs each expands to for `archs` (default as for warm).
int list_presets(const std::vector<std::string>& archs, bool json);
// Lists the disk cache's entries.
int list(const Config& config, bool json);
// Removes every disk cache entry.
int clear(const Config& config);
// Library, NVRTC, driver, devices, cache and template source.
int info(const Config& config, bool json);
// Prints the source rendered for one spec.
int source(const Config& config, const std::string& spec_text);

}  // namespace jitattn::cli
