"""Persistent wgmma prefill beside the ordinary grid: the same tiles (forced), one
CTA per tile against at most one CTA per SM walking the tiles.

bf16, 16 heads, head_dim 64 and 128, causal and not, with and without RoPE; grids
of batch 2 (few waves) and of 16384 / N tokens per batch (a full GPU). Before
timing, the persistent output is compared with the ordinary one: both compute
every tile in the same order, so they must agree exactly. CUDA events, warm-up,
median (jitattn_timing).

  python3 bench/bench_persistent.py --lib build/libjitattn.so [--json FILE]
"""
import argparse
import ctypes
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, check, default_options, force_tiles, load, tensor_of  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402

# The planner's wgmma tiles (src/plan/tiles.cpp, wgmma_tiles) per head dim and RoPE.
TILES = {(64, False): "192x128x12x4w", (64, True): "128x128x8x4w", (128, False): "128x128x8x2w",
         (128, True): "128x128x8x2w"}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libjitattn.so")
    parser.add_argument("--json")
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--grids", default="issue,full", help="issue (batch 2), full (16384 / N tokens), or both")
    parser.add_argument("--causal", default="yes,no")
    parser.add_argument("--rope", default="no,yes")
    args = parser.parse_args()
    lib = load(args.lib)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    rows = []
    print(f"jitattn {lib.jitattn_version().decode()} | torch {torch.__version__} | {torch.cuda.get_device_name()}")
    print(f"{'d':>4} {'causal':>6} {'rope':>4} {'batch':>5} {'N':>6} {'tiles':>6} | {'ordinary ms':>11} "
          f"{'persistent ms':>13} | {'pers/ord':>8} | {'max diff':>8}")
    for head_dim in [int(x) for x in args.head_dims.split(",")]:
        for causal in [c == "yes" for c in args.causal.split(",")]:
            for rope in [r == "yes" for r in args.rope.split(",")]:
                tiles = TILES[(head_dim, rope)]
                block_q = int(tiles.split("x")[0])
                for per_gpu in [g == "full" for g in args.grids.split(",")]:
                    for n in [int(x) for x in args.seqlens.split(",")]:
                        batch, heads = (max(1, 16384 // n) if per_gpu else 2), 16
                        if not per_gpu and n > 8192:
                            continue
                        gen = torch.Generator(device="cuda").manual_seed(n + head_dim)
                        q, k, v = (torch.randn(batch, n, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                                               generator=gen) for _ in range(3))
                        outs = {}
                        times = {}
                        for persistent in (False, True):
                            out = torch.full_like(q, float("nan"))
                            options = default_options(lib)
                            options.causal = 1 if causal else 0
                            if rope:
                                options.rope_style = 1
                                options.rotary_dim = head_dim
                            force_tiles(options, tiles + ("p" if persistent else ""))
                            tq, tk, tv, to = (tensor_of(t, BF16) for t in (q, k, v, out))

                            def call():
                                check(lib, lib.jitattn_fwd(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv),
                                                           ctypes.byref(to), None, ctypes.byref(options), stream))

                            call()
                            torch.cuda.synchronize()
                            outs[persistent] = out
                            times[persistent] = median_ms(call)
                        diff = (outs[True].float() - outs[False].float()).abs().max().item()
                        if not diff == 0.0:
                            print(f"MISMATCH: persistent and ordinary outputs differ by {diff}")
                        tile_count = batch * heads * ((n + block_q - 1) // block_q)
                        ratio = times[True] / times[False]
                        print(f"{head_dim:>4} {'yes' if causal else 'no':>6} {'yes' if rope else 'no':>4} {batch:>5} "
                              f"{n:>6} {tile_count:>6} | {times[False]:>11.4f} {times[True]:>13.4f} | {ratio:>8.3f} | "
                              f"{diff:>8.2g}", flush=True)
                        rows.append(dict(head_dim=head_dim, causal=causal, rope=rope, batch=batch, seqlen=n,
                                         heads=heads, tiles=tiles, tile_count=tile_count, ordinary_ms=times[False],
                                         persistent_ms=times[True], max_diff=diff))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
