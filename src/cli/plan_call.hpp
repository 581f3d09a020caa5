// `jitattn plan`'s bridge to the planner: a call shape from the command line
// → the tensors and options a real call of that shape passes → the launches
// the planner makes for it. Every choice (family, tiles, splits, grids) is
// the planner's; this only builds its inputs and reads its plans.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <jitattn/jitattn.hpp>

#include "cli/commands.hpp"
#include "spec.hpp"
#include "tune.hpp"

namespace jitattn::cli {

// The GPU a call is planned for: what the runtime reads from the device.
struct PlanTarget {
  detail::Arch arch;
  int sm_count = 0;
  int max_smem_bytes = 0;  // opt-in dynamic shared memory per block
};

// One kernel launch of a planned call.
struct PlannedLaunch {
  std::string role;  // append, attention or combine
  detail::KernelSpec spec;
  unsigned grid = 0;  // CTAs
  int threads = 0;    // per CTA
  size_t smem_bytes = 0;  // dynamic shared memory per CTA
  // attention only: the key splits (1 = not split) and the workspace they need
  int splits = 1;
  bool dynamic_splits = false;  // splits is the most; each sequence's count is chosen on the device
  size_t workspace_bytes = 0;
};

struct CallPlan {
  std::vector<PlannedLaunch> launches;  // in launch order; empty when the call computes nothing
  // The tuning table changed the attention kernel: without it the planner
  // would have taken another.
  bool tiles_tuned = false;
};

// --tiles text, as python/jitattn_ctypes.py's force_tiles reads it:
// BQxBKVxW, BQxBKVxWxS (the producer layout with S stages), or that ending
// in "w" (wgmma warpgroups) or "wp" (wgmma, persistent grid). Throws
// Error(invalid_argument) naming --tiles.
TileConfig parse_tiles(const std::string& text);

// Plans the call `options` describes, as the runtime would on `target` with
// `tuning` (null: none). Throws Error(invalid_argument) naming the option
// and the rule for options that describe no call; the planner's own errors
// pass through unchanged.
CallPlan plan_call(const PlanOptions& options, const PlanTarget& target, const detail::TuningTable* tuning);

}  // namespace jitattn::cli
