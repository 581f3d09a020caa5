// tune: per-shape-class tile choices measured on the GPU.
//
// A shape class is (arch, dtype, head_dim, causal, seqlen bucket). `jitattn
// tune` times the candidate tile configurations of each class and stores the
// winners in <cache_dir>/v1/tuning.json, stamped with the library and NVRTC
// versions; a table from another version is ignored (and replaced by the next
// tune). The planner asks the table first and falls back to the built-in
// choices, which themselves came from tuning on the H200.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <jitattn/jitattn.hpp>

#include "spec.hpp"

namespace jitattn::detail {

// max(seqlen_q, seqlen_k) rounded up to a power of two, clamped to [512, 16384].
int seqlen_bucket(int64_t seqlen_q, int64_t seqlen_k);

struct ShapeClass {
  Arch arch;
  DType dtype = DType::bf16;
  int head_dim = 128;
  bool causal = false;
  int seqlen_bucket = 512;

  uint64_t packed() const;   // hot-path key
  std::string text() const;  // "sm_90a.bf16.d128.causal.n4096"
};

struct TunedChoice {
  ShapeClass shape;
  TileConfig tiles;
  double tflops = 0;          // of the winner, on the tuning problem
  double default_tflops = 0;  // of the built-in choice, same problem (0 if not measured)
};

// The NVRTC version a tuning table in cache_dir must carry for a host whose
// NVRTC is nvrtc_version: its own; without NVRTC ("none"), the version that
// warmed the cache (warmed_nvrtc), as that host planned with the table only
// then.
std::string table_nvrtc_for(const std::string& cache_dir, const std::string& nvrtc_version);

class TuningTable {
 public:
  // Reads <cache_dir>/v1/tuning.json. Missing, unreadable or from another
  // library/NVRTC version: an empty table (logged at info level, never thrown).
  // With an nvrtc_version of "none" (no NVRTC here: kernels are served as
  // the cache holds them) the table must be of the NVRTC version that last
  // stored a kernel in the cache (<cache_dir>/v1/compiler), as the host that
  // warmed it planned with the table only then.
  static TuningTable load(const std::string& cache_dir, const std::string& library_version,
                          const std::string& nvrtc_version);
  // Writes atomically (temporary file + rename). Throws Error(cache_error) on failure.
  void save(const std::string& cache_dir) const;

  std::optional<TileConfig> lookup(const ShapeClass& shape) const;
  void set(const TunedChoice& choice);
  const std::vector<TunedChoice>& choices() const { return choices_; }
  bool empty() const { return choices_.empty(); }

  std::string library_version;
  std::string nvrtc_version;

 private:
  std::vector<TunedChoice> choices_;
  std::unordered_map<uint64_t, size_t> index_;  // ShapeClass::packed() → choices_
};

// The tile configurations worth timing for a head dim (all that fit).
std::vector<TileConfig> tile_candidates(int head_dim);

struct TuneRequest {
  std::vector<DType> dtypes = {DType::bf16, DType::f16};
  std::vector<int> head_dims = {64, 128};
  std::vector<bool> causal = {false, true};
  std::vector<int> seqlens = {512, 1024, 2048, 4096, 8192, 16384};
  std::vector<TileConfig> candidates;  // empty: tile_candidates(head_dim)
  int64_t tokens = 16384;              // batch × seqlen of each timing problem
  int64_t model_dim = 2048;            // heads × head_dim
  int iterations = 10;                 // timed calls per candidate (median)
};

// Times every candidate of every requested class on the current GPU (random
// inputs, CUDA events, median) through `runtime`, and returns the winners.
// Needs a GPU; throws Error(cuda_error) otherwise.
std::vector<TunedChoice> tune(Runtime& runtime, const TuneRequest& request);

}  // namespace jitattn::detail
