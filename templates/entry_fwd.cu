// jitattn kernel for spec {spec}
// Rendered from templates/entry_fwd.cu: this file only fixes the constants;
// the kernel is templates/fwd_prefill.cuh.
#include "fwd_prefill.cuh"

using Config = jitattn::FwdConfig<jitattn::{element}, /*HEAD_DIM=*/{head_dim}, /*BLOCK_Q=*/{block_q},
                                  /*BLOCK_KV=*/{block_kv}, /*WARPS=*/{warps}, /*MASK=*/jitattn::{mask},
                                  /*SOFTCAP=*/{softcap}, /*ALIBI=*/{alibi}, /*PADDED=*/{padded},
                                  /*VARLEN=*/{varlen}, /*PACK_GQA=*/{pack_gqa}, /*ROPE=*/jitattn::{rope},
                                  /*ROTARY_DIM=*/{rotary_dim}, /*ROPE_TABLES=*/{rope_tables},
                                  /*KVCACHE=*/{kvcache}, /*PAGED=*/{paged}, /*SPLIT=*/{split},
                                  /*STAGES=*/{stages}, /*WGMMA=*/{wgmma}, /*PERSISTENT=*/{persistent},
                                  /*UNALIGNED_DIM=*/{unaligned_dim}, /*LEFTPAD=*/{leftpad},
                                  /*SINK=*/{sink}, /*HEAD_DIM_V=*/{head_dim_v},
                                  /*ROPE_SCALED=*/{rope_scaled}>;
// The host launches with KernelSpec::smem_bytes(); the two must agree.
static_assert(Config::kSmemBytes == {smem_bytes}, "shared memory: the kernel's layout and the host's size differ");

extern "C" __global__ void __launch_bounds__(Config::kThreads, 1)
{entry_name}(const __grid_constant__ jitattn::FwdParams params) {{
  // ptx.cuh: programmatic launch. The next grid is let in at the end of the
  // main loop (fwd_prefill), not here.
  jitattn::wait_for_primary_grid();
  jitattn::fwd_prefill<Config>(params);
}}
