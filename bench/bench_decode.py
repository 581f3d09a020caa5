"""Decoding: jitattn's forward_kvcache beside PyTorch's SDPA backends (cuDNN, FlashAttention-2).

Issue grid (the defaults): bf16, 32 query heads, 8 KV heads, head_dim 128 (--head-dim), one query token
(--seqlen-q N: N tokens per sequence, as in speculative decoding; not causal, as PyTorch's is_causal is
top-left);
batch 1, 16, 64 x KV length 1k, 4k, 16k, 32k. Reported: bytes of K and V read
per second (batch x KV length x 8 heads x head_dim x 2 bytes x 2 tensors / time).
jitattn runs on a contiguous cache and on a paged one (page 64 or --page, pages
shuffled, or --page-order sequential); PyTorch on the same contiguous K/V in [B, H, S, D] form. The outputs
are checked against the FA2 backend before timing. CUDA events, warm-up,
median; calls rotate over copies of the KV cache that add up to 256 MB or more (4x L2), so every call reads
its cache from HBM.

  python3 bench/bench_decode.py --lib build/libjitattn.so [--json FILE] [--tiles 16x16x4x4] [--head-dim D] [--page P]
"""
import argparse
import ctypes
import json
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, I32, default_options, force_tiles, load, tensor_of  # noqa: E402
from jitattn_kvcache import kvcache_call, shuffled_pages  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libjitattn.so")
    parser.add_argument("--json")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--kv-lengths", default="1024,4096,16384,32768")
    parser.add_argument("--tiles", default="",
                        help="force jitattn tiles: BQxBKVxWARPS (prefill kernel, e.g. 64x128x4), "
                             "BQxBKVxWARPSxSTAGES (decode kernel, e.g. 16x16x4x4; BQ 0 = planner's) or that "
                             "ending in w (wgmma tiles, e.g. 128x128x8x2w)")
    parser.add_argument("--splits", type=int, default=0)
    parser.add_argument("--dynamic", action="store_true",
                        help="KVCacheArgs::dynamic_splits: split counts chosen on the device from the lengths")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seqlen-q", type=int, default=1, help="query tokens per sequence")
    parser.add_argument("--page", type=int, default=64, help="rows per page of the paged cache")
    parser.add_argument("--page-order", choices=("shuffled", "sequential"), default="shuffled",
                        help="pages in a random order (default), or each sequence's side by side")
    parser.add_argument("--heads-kv", type=int, default=8,
                        help="KV heads (query heads = 4 x this); changes the grid's CTA count at a given batch")
    args = parser.parse_args()
    lib = load(args.lib)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    heads_kv, head_dim, page = args.heads_kv, args.head_dim, args.page
    heads_q = 4 * heads_kv
    seqlen_q = args.seqlen_q
    print(f"jitattn {lib.jitattn_version().decode()} | torch {torch.__version__} | {torch.cuda.get_device_name()}"
          f" | d {head_dim}, {seqlen_q} query token(s)")
    print(f"{'batch':>5} {'KV':>6} | {'jitattn':>8} {'paged' + str(page):>8} {'cuDNN':>8} {'FA2':>8} TB/s | "
          f"{'vs cuDNN':>8} {'paged/contig':>12}")
    rows = []
    for batch in [int(x) for x in args.batches.split(",")]:
        for kv in [int(x) for x in args.kv_lengths.split(",")]:
            kv_bytes = batch * kv * heads_kv * head_dim * 2 * 2
            # Calls rotate over enough copies of the cache that each reads it from HBM, as a decoding step
            # does between other layers' work: at least 256 MB in all, four times the H200's L2 (60 MB).
            copies = max(1, min(256, -(-(256 << 20) // kv_bytes)))
            gen = torch.Generator(device="cuda").manual_seed(batch * kv)
            q = torch.randn(batch, seqlen_q, heads_q, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            caches = [(torch.randn(batch, kv, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen),
                       torch.randn(batch, kv, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen))
                      for _ in range(copies)]
            seqlens = torch.full((batch,), kv, device="cuda", dtype=torch.int32)
            out = torch.empty_like(q)
            options = default_options(lib)
            force_tiles(options, args.tiles)
            tq, tout, tseq = tensor_of(q, BF16), tensor_of(out, BF16), tensor_of(seqlens, I32)

            # Paged copies: the same rows in pages, shuffled unless --page-order sequential.
            paged = [shuffled_pages(k_cache, v_cache, page, gen, args.page_order == "shuffled")
                     for k_cache, v_cache in caches]

            def make_call(k_cache, v_cache, table=None):
                return kvcache_call(lib, tq, tout, tseq, k_cache, v_cache, options, stream, args.splits, kv, table,
                                    dynamic_splits=args.dynamic)

            contiguous_calls = [make_call(k, v) for k, v in caches]
            paged_calls = [make_call(k, v, t) for k, v, t in paged]
            torch_kv = [(k.transpose(1, 2), v.transpose(1, 2)) for k, v in caches]
            qt = q.transpose(1, 2)

            def torch_backend(backend):
                def run(i):
                    k, v = torch_kv[i % copies]
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(qt, k, v, enable_gqa=True)
                return run

            reference = torch_backend(SDPBackend.FLASH_ATTENTION)(0).transpose(1, 2)
            for label, call in (("contiguous", contiguous_calls[0]), ("paged", paged_calls[0])):
                out.fill_(float("nan"))
                call()
                diff = (out.float() - reference.float()).abs().max().item()
                if not diff <= 2e-2:
                    print(f"MISMATCH batch={batch} kv={kv} {label}: max |jitattn - FA2| = {diff}")
                    return 1
            r = {"batch": batch, "kv": kv, "heads_kv": heads_kv, "seqlen_q": seqlen_q, "kv_bytes": kv_bytes}
            r["jitattn_ms"] = median_ms(lambda i: contiguous_calls[i % copies](), 50, 5, with_index=True)
            r["paged_ms"] = median_ms(lambda i: paged_calls[i % copies](), 50, 5, with_index=True)
            for label, backend in (("cudnn_ms", SDPBackend.CUDNN_ATTENTION), ("fa2_ms", SDPBackend.FLASH_ATTENTION)):
                try:
                    r[label] = median_ms(torch_backend(backend), 50, 5, with_index=True)
                except RuntimeError as error:
                    r[label] = None
                    print(f"  {label} unavailable: {str(error).splitlines()[0]}")
            tbps = lambda ms: kv_bytes / (ms * 1e-3) / 1e12 if ms else None
            fmt = lambda x: f"{x:8.2f}" if x else "       -"
            for key in ("jitattn", "paged", "cudnn", "fa2"):
                r[key + "_tbps"] = tbps(r[key + "_ms"])
            rows.append(r)
            print(f"{batch:>5} {kv:>6} | {fmt(r['jitattn_tbps'])} {fmt(r['paged_tbps'])} {fmt(r['cudnn_tbps'])} "
                  f"{fmt(r['fa2_tbps'])}      | {r['cudnn_ms'] / r['jitattn_ms'] if r['cudnn_ms'] else 0:7.2f}x "
                  f"{r['paged_ms'] / r['jitattn_ms']:11.3f}x", flush=True)
            del caches, paged, contiguous_calls, paged_calls, torch_kv
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
