"""A value head dim of its own (FlashAttention 3's hdim_v; DeepSeek V3/R1's prefill attention: q and k 192
wide, v and out 128): what the .dvN kernels cost beside the ways an engine runs it otherwise.

Prefill, bf16, causal and not, 16 heads (DeepSeek V3's 128 over tensor parallelism 8), batch x N = 16384
tokens. Each row times:
  - jitattn dv128: v [B, N, H, 128] and out [B, N, H, 128] as they are;
  - jitattn padded: v zero-padded to 192 (a copy made once, outside the timing) and out 192 wide, the
    kernel that serves q/k/v of one head dim: what engines do on kernels without hdim_v;
  - PyTorch's SDPA backends that take v of another head dim (cuDNN and memory-efficient are tried; each
    that refuses the shapes is reported as such).
TFLOP/s count 2·B·H·N²·(192 + 128) (halved when causal). dv128's output is checked against the padded
call's first 128 columns, and against PyTorch's, before timing.

  python3 bench/bench_value_dim.py [--lib build/libjitattn.so] [--tiles 128x128x8x2w] [--json FILE]

--tiles forces the dv128 call's tiles (jitattn_ctypes.force_tiles), to compare them with the planner's.
"""
import argparse
import ctypes
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, default_options, force_tiles, load, tensor_of  # noqa: E402
from jitattn_bench import forward_call, max_difference, write_json  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402

HEADS, DIM, DIM_V, TOKENS = 16, 192, 128, 16384


def torch_backend(backend, q, k, v, causal):
    """SDPA on [B, H, N, D] views through one backend, or None where it refuses these shapes."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    try:
        run()
        torch.cuda.synchronize()
    except RuntimeError:
        return None
    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libjitattn.so")
    parser.add_argument("--tiles", default="")
    parser.add_argument("--json")
    args = parser.parse_args()
    lib = load(args.lib)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    print(f"jitattn {lib.jitattn_version().decode()} | torch {torch.__version__} | {torch.cuda.get_device_name()}")
    print(f"prefill: bf16, heads {HEADS}, q/k {DIM}, v {DIM_V}; ms per call (TFLOP/s)")
    print(f"{'N':>6} {'causal':>6} | {'dv128':>15} {'padded v':>15} {'cuDNN':>15} {'mem-eff':>15} | {'padded/dv128':>12}")
    rows = []
    for n in (1024, 4096, 16384):
        batch = TOKENS // n
        gen = torch.Generator(device="cuda").manual_seed(n)
        q = torch.randn(batch, n, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(batch, n, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(batch, n, HEADS, DIM_V, device="cuda", dtype=torch.bfloat16, generator=gen)
        v_padded = torch.nn.functional.pad(v, (0, DIM - DIM_V))
        out = torch.empty(batch, n, HEADS, DIM_V, device="cuda", dtype=torch.bfloat16)
        out_padded = torch.empty(batch, n, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
        tq, tk, tv, tvp, to, top = (tensor_of(t, BF16) for t in (q, k, v, v_padded, out, out_padded))
        for causal in (True, False):
            options, padded_options = default_options(lib), default_options(lib)
            options.causal = padded_options.causal = 1 if causal else 0
            force_tiles(options, args.tiles)
            run_dv = forward_call(lib, stream, tq, tk, tv, to, options)
            run_padded = forward_call(lib, stream, tq, tk, tvp, top, padded_options)
            narrow = out_padded[..., :DIM_V]
            diff = max_difference(run_dv, out, run_padded, narrow)
            if not diff <= 1e-2:
                print(f"MISMATCH N={n} causal={causal}: max |dv128 - padded| = {diff}")
                return 1
            r = {"n": n, "batch": batch, "causal": causal, "dv_ms": median_ms(run_dv, 20, 3),
                 "padded_ms": median_ms(run_padded, 20, 3)}
            for label, backend in (("cudnn_ms", SDPBackend.CUDNN_ATTENTION),
                                   ("mem_efficient_ms", SDPBackend.EFFICIENT_ATTENTION)):
                run = torch_backend(backend, q, k, v, causal)
                if run is None:
                    r[label] = None
                    continue
                reference = run().transpose(1, 2)
                run_dv()
                torch.cuda.synchronize()
                error = (reference.float() - out.float()).abs().max().item()
                if not error <= 2e-2:
                    print(f"MISMATCH N={n} causal={causal}: max |dv128 - {label}| = {error}")
                    return 1
                r[label] = median_ms(run, 20, 3)
            flops = 2 * batch * HEADS * n * n * (DIM + DIM_V) / (2 if causal else 1)

            def cell(ms):
                return f"{'refused':>15}" if ms is None else f"{ms:7.3f} ({flops / ms / 1e9:4.0f})"

            print(f"{n:>6} {str(causal):>6} | {cell(r['dv_ms'])} {cell(r['padded_ms'])} {cell(r['cudnn_ms'])} "
                  f"{cell(r['mem_efficient_ms'])} | {r['padded_ms'] / r['dv_ms']:11.3f}x", flush=True)
            rows.append(r)
        del q, k, v, v_padded, out, out_padded
        torch.cuda.empty_cache()
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
