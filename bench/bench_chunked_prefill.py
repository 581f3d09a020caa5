"""Chunked prefill: forward_kvcache with many query tokens beside the same attention as a dense
forward call.

A chunk of Sq new tokens attends (causal, bottom-right) to a KV cache holding KV rows
(the chunk's own keys included), as inference engines run long prompts in chunks.
The dense call computes exactly the same thing from the same K/V (q [B, Sq], k/v
[B, KV]), so the ratio is what the KV-cache path costs over the prefill kernels.
bf16, 32 query heads, 8 KV heads, head_dim 128 (--head-dim); contiguous cache and pages of 64 (--page N)
(shuffled). Outputs are compared with the dense call before timing. CUDA events,
warm-up, median (jitattn_timing). TFLOP/s counts the causal half of Sq × KV.

  python3 bench/bench_chunked_prefill.py --lib build/libjitattn.so [--json FILE] [--page N] [--head-dim D]
      [--tiles 192x128x12x4w]
"""
import argparse
import ctypes
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, I32, check, default_options, force_tiles, load, tensor_of  # noqa: E402
from jitattn_kvcache import kvcache_call, shuffled_pages  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libjitattn.so")
    parser.add_argument("--json")
    parser.add_argument("--page", type=int, default=64, help="page size of the paged cache")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--tiles", default="",
                        help="force the KV-cache calls' tiles (jitattn_ctypes.force_tiles: e.g. 192x128x12x4w)")
    parser.add_argument("--shapes", default="1x2048x8192,1x2048x32768,4x1024x4096,4x512x16384,16x256x4096",
                        help="BATCHxSQxKV,...")
    args = parser.parse_args()
    lib = load(args.lib)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    heads_q, heads_kv, head_dim, page = 32, 8, args.head_dim, args.page
    print(f"jitattn {lib.jitattn_version().decode()} | torch {torch.__version__} | {torch.cuda.get_device_name()}")
    print(f"{'batch':>5} {'Sq':>6} {'KV':>6} | {'kvcache':>8} {'paged' + str(page):>8} {'dense':>8} ms | "
          f"{'kvcache':>8} {'dense':>8} TFLOP/s | {'kvcache/dense':>13}")
    rows = []
    for shape in args.shapes.split(","):
        batch, sq, kv = (int(x) for x in shape.split("x"))
        gen = torch.Generator(device="cuda").manual_seed(batch * sq + kv)
        q = torch.randn(batch, sq, heads_q, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(batch, kv, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(batch, kv, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        seqlens = torch.full((batch,), kv, device="cuda", dtype=torch.int32)
        k_pages, v_pages, table = shuffled_pages(k, v, page, gen)
        out = torch.empty_like(q)
        options = default_options(lib)
        options.causal = 1
        tq, tout, tseq = tensor_of(q, BF16), tensor_of(out, BF16), tensor_of(seqlens, I32)
        tk, tv = tensor_of(k, BF16), tensor_of(v, BF16)

        def dense():
            check(lib, lib.jitattn_fwd(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(tout), None,
                                       ctypes.byref(options), stream))

        cache_options = default_options(lib)
        cache_options.causal = 1
        force_tiles(cache_options, args.tiles)
        contiguous = kvcache_call(lib, tq, tout, tseq, k, v, cache_options, stream, 0, kv)
        paged = kvcache_call(lib, tq, tout, tseq, k_pages, v_pages, cache_options, stream, 0, kv, table)
        out.fill_(float("nan"))
        dense()
        reference = out.clone()
        for label, call in (("contiguous", contiguous), ("paged", paged)):
            out.fill_(float("nan"))
            call()
            diff = (out.float() - reference.float()).abs().max().item()
            if not diff <= 2e-2:
                print(f"MISMATCH batch={batch} sq={sq} kv={kv} {label}: max |kvcache - dense| = {diff}")
                return 1
        r = {"batch": batch, "seqlen_q": sq, "kv": kv}
        r["kvcache_ms"] = median_ms(contiguous, 20, 3)
        r["paged_ms"] = median_ms(paged, 20, 3)
        r["dense_ms"] = median_ms(dense, 20, 3)
        # Causal bottom-right: query i sees KV - Sq + i + 1 keys.
        flops = 4.0 * batch * heads_q * head_dim * sq * (kv - sq + (sq + 1) / 2)
        tflops = lambda ms: flops / (ms * 1e-3) / 1e12
        rows.append(r)
        print(f"{batch:>5} {sq:>6} {kv:>6} | {r['kvcache_ms']:8.3f} {r['paged_ms']:8.3f} {r['dense_ms']:8.3f}    | "
              f"{tflops(r['kvcache_ms']):8.1f} {tflops(r['dense_ms']):8.1f}         | "
              f"{r['kvcache_ms'] / r['dense_ms']:12.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
