// jitattn kernel for spec {spec}
// Rendered from templates/entry_append.cu: this file only fixes the constants;
// the kernel is templates/append.cuh.
#include "append.cuh"

using Config = jitattn::AppendConfig<jitattn::{element}, /*ROPE=*/jitattn::{rope}, /*ROTARY_DIM=*/{rotary_dim},
                                     /*ROPE_TABLES=*/{rope_tables}, /*PAGED=*/{paged},
                                     /*ROPE_SCALED=*/{rope_scaled}>;

extern "C" __global__ void __launch_bounds__(Config::kThreads)
{entry_name}(const __grid_constant__ jitattn::AppendParams params) {{
  jitattn::begin_dependent_grid();  // ptx.cuh: programmatic launch
  jitattn::append_kv<Config>(params);
}}
