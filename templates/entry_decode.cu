// jitattn kernel for spec {spec}
// Rendered from templates/entry_decode.cu: this file only fixes the constants;
// the kernel is templates/fwd_decode.cuh.
#include "fwd_decode.cuh"

using Config = jitattn::DecodeConfig<jitattn::{element}, /*HEAD_DIM=*/{head_dim}, /*ROWS=*/{block_q},
                                     /*KEYS=*/{block_kv}, /*WARPS=*/{warps}, /*STAGES=*/{stages},
                                     /*MASK=*/jitattn::{mask}, /*SOFTCAP=*/{softcap}, /*ALIBI=*/{alibi},
                                     /*PADDED=*/{padded}, /*ROPE=*/jitattn::{rope}, /*ROTARY_DIM=*/{rotary_dim},
                                     /*ROPE_TABLES=*/{rope_tables}, /*KVCACHE=*/{kvcache}, /*PAGED=*/{paged},
                                     /*SPLIT=*/{split}, /*DYNAMIC_SPLITS=*/{dynamic_splits},
                                     /*VARLEN=*/{varlen}, /*LEFTPAD=*/{leftpad}, /*SINK=*/{sink},
                                     /*ROPE_SCALED=*/{rope_scaled}, /*PAGE_ROWS=*/{page_rows}>;

extern "C" __global__ void __launch_bounds__(Config::kCtaThreads)
{entry_name}(const __grid_constant__ jitattn::FwdParams params) {{
  jitattn::begin_dependent_grid();  // ptx.cuh: programmatic launch
  jitattn::fwd_decode<Config>(params);
}}
