// jitattn kernel for spec {spec}
// Rendered from templates/entry_combine.cu: this file only fixes the dtypes,
// the access width, whether pairs may be marked written and whether heads
// have sinks; the kernel is templates/combine.cuh.
#include "combine.cuh"

extern "C" __global__ void __launch_bounds__(jitattn::kCombineThreads)
{entry_name}(const __grid_constant__ jitattn::CombineParams params) {{
  // Split-KV: this grid may be scheduled while the attention grid that
  // writes the partials still runs; it reads nothing before that grid is done.
  jitattn::begin_dependent_grid();  // ptx.cuh: programmatic launch
  jitattn::combine_states</*State=*/{state}, /*Out=*/{out}, /*ELEMENTWISE=*/{elementwise},
                          /*DYNAMIC_SPLITS=*/{dynamic_splits}, /*SINK=*/{sink}>(params);
}}
