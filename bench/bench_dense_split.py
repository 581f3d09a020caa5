"""Dense forward calls with few tiles over long keys: split-KV (forward with a workspace) beside the
same call without one, the same attention through forward_kvcache, and PyTorch's backends.

Shapes are BATCHxSQxKV, causal (bottom-right) unless suffixed with "n". bf16, 32 query heads,
8 KV heads (--heads-kv), head_dim 128 (--head-dim). Calls rotate over copies of K/V adding up to
at least 256 MB, so each reads them from HBM. Every jitattn output is compared with PyTorch's
FlashAttention-2 backend before timing. CUDA events, warm-up, median (jitattn_timing). TB/s
counts the bytes of K and V; TFLOP/s the visible (causal: bottom-right) scores.

  python3 bench/bench_dense_split.py --lib build/libjitattn.so [--json FILE] [--shapes 1x64x32768,...]
      [--splits N] [--tiles 64x128x4]
"""
import argparse
import ctypes
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, I32, check, default_options, force_tiles, load, tensor_of  # noqa: E402
from jitattn_kvcache import kvcache_call  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libjitattn.so")
    parser.add_argument("--json")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--heads-kv", type=int, default=8)
    parser.add_argument("--splits", type=int, default=0, help="options.num_splits of the split calls (0: heuristic)")
    parser.add_argument("--tiles", default="", help="force the split calls' tiles (jitattn_ctypes.force_tiles)")
    parser.add_argument("--shapes", default="1x1x32768n,1x16x32768n,1x64x32768,1x128x32768,1x256x16384,"
                                            "2x128x8192,1x512x8192,4x64x4096,1x1024x32768")
    args = parser.parse_args()
    lib = load(args.lib)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    heads_q, heads_kv, head_dim = 32, args.heads_kv, args.head_dim
    print(f"jitattn {lib.jitattn_version().decode()} | torch {torch.__version__} | {torch.cuda.get_device_name()}")
    print(f"heads {heads_q}/{heads_kv}, head_dim {head_dim}, num_splits {args.splits or 'heuristic'}"
          f"{', tiles ' + args.tiles if args.tiles else ''}")
    print(f"{'shape':>16} | {'split':>7} {'unsplit':>7} {'kvcache':>7} {'cudnn':>7} {'fa2':>7} ms | "
          f"{'split':>6} TB/s {'TFLOP/s':>7} | {'unsplit/split':>13} {'fa2/split':>9} {'cudnn/split':>11}")
    rows = []
    for shape in args.shapes.split(","):
        causal = not shape.endswith("n")
        batch, sq, kv = (int(x) for x in shape.rstrip("n").split("x"))
        kv_bytes = batch * kv * heads_kv * head_dim * 2 * 2
        copies = max(1, min(64, -(-(256 << 20) // kv_bytes)))
        gen = torch.Generator(device="cuda").manual_seed(batch * sq + kv)
        q = torch.randn(batch, sq, heads_q, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        kvs = [(torch.randn(batch, kv, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen),
                torch.randn(batch, kv, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen))
               for _ in range(copies)]
        out = torch.empty_like(q)
        tq, tout = tensor_of(q, BF16), tensor_of(out, BF16)
        tkv = [(tensor_of(k, BF16), tensor_of(v, BF16)) for k, v in kvs]
        plain = default_options(lib)
        plain.causal = int(causal)
        split = default_options(lib)
        split.causal = int(causal)
        split.num_splits = args.splits
        force_tiles(split, args.tiles)
        size = ctypes.c_size_t(0)
        check(lib, lib.jitattn_fwd_workspace_bytes(ctypes.byref(tq), ctypes.byref(tkv[0][0]), ctypes.byref(tkv[0][1]),
                                                   ctypes.byref(tout), None, ctypes.byref(split), ctypes.byref(size)))
        workspace = torch.empty(max(size.value, 256), device="cuda", dtype=torch.uint8)

        def dense(i, options=plain):
            tk, tv = tkv[i % copies]
            check(lib, lib.jitattn_fwd(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(tout), None,
                                       ctypes.byref(options), stream))

        def dense_split(i):
            tk, tv = tkv[i % copies]
            check(lib, lib.jitattn_fwd_split(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(tout),
                                             None, ctypes.byref(split), ctypes.c_void_p(workspace.data_ptr()),
                                             ctypes.c_size_t(size.value), stream))

        seqlens = torch.full((batch,), kv, device="cuda", dtype=torch.int32)
        tseq = tensor_of(seqlens, I32)
        cache_options = default_options(lib)
        cache_options.causal = int(causal)
        cache_calls = [kvcache_call(lib, tq, tout, tseq, k, v, cache_options, stream, 0, kv) for k, v in kvs]
        torch_kv = [(k.transpose(1, 2), v.transpose(1, 2)) for k, v in kvs]
        qt = q.transpose(1, 2)
        # PyTorch's is_causal is top-left aligned; causal_lower_right is FlashAttention's bottom-right mask.
        bias = causal_lower_right(sq, kv) if causal else None
        mask = None
        if causal:
            mask = torch.arange(kv, device="cuda")[None, :] <= torch.arange(sq, device="cuda")[:, None] + (kv - sq)

        def torch_backend(backend):
            def run(i):
                k, v = torch_kv[i % copies]
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, k, v, attn_mask=bias, enable_gqa=True)
            return run

        with sdpa_kernel(SDPBackend.MATH):
            k0, v0 = torch_kv[0]
            reference = F.scaled_dot_product_attention(qt.float(), k0.float(), v0.float(), attn_mask=mask,
                                                       enable_gqa=True).transpose(1, 2)
        for label, call in (("split", dense_split), ("unsplit", dense), ("kvcache", lambda i: cache_calls[0]())):
            out.fill_(float("nan"))
            call(0)
            diff = (out.float() - reference).abs().max().item()
            if not diff <= 2e-2:
                print(f"MISMATCH {shape} {label}: max |jitattn - reference| = {diff}")
                return 1
        r = {"batch": batch, "seqlen_q": sq, "kv": kv, "causal": causal, "heads_kv": heads_kv, "head_dim": head_dim,
             "workspace_bytes": size.value}
        r["split_ms"] = median_ms(dense_split, 30, 5, with_index=True)
        r["unsplit_ms"] = median_ms(dense, 30, 5, with_index=True)
        r["kvcache_ms"] = median_ms(lambda i: cache_calls[i % copies](), 30, 5, with_index=True)
        for label, run in (("cudnn_ms", torch_backend(SDPBackend.CUDNN_ATTENTION)),
                           ("fa2_ms", torch_backend(SDPBackend.FLASH_ATTENTION))):
            try:
                r[label] = median_ms(run, 30, 5, with_index=True)
            except RuntimeError as error:
                r[label] = None
                print(f"  {label} unavailable: {str(error).splitlines()[0]}")
        visible = sq * kv - (sq * (sq - 1) // 2 if causal else 0)
        r["split_tbps"] = kv_bytes / (r["split_ms"] * 1e-3) / 1e12
        r["split_tflops"] = 4 * batch * heads_q * visible * head_dim / (r["split_ms"] * 1e-3) / 1e12
        rows.append(r)
        f = lambda x: f"{x:7.3f}" if x else "      -"
        ratio = lambda key: f"{r[key] / r['split_ms']:.2f}x" if r[key] else "-"
        print(f"{shape:>16} | {f(r['split_ms'])} {f(r['unsplit_ms'])} {f(r['kvcache_ms'])} {f(r['cudnn_ms'])} "
              f"{f(r['fa2_ms'])}    | {r['split_tbps']:6.2f}      {r['split_tflops']:7.1f} | "
              f"{ratio('unsplit_ms'):>13} {ratio('fa2_ms'):>9} {ratio('cudnn_ms'):>11}", flush=True)
        del kvs, torch_kv, cache_calls
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fp:
            json.dump(rows, fp, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
