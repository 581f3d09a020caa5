"""Chunked local attention (ForwardOptions::attention_chunk, FlashAttention 3's attention_chunk, Llama 4's
local layers): one call over the whole sequence beside the same work done the way engines did it before
kernels took chunks, as a "virtual batch" of chunk-long sequences (the same tensors viewed as
[N / chunk, chunk, heads, dim], no copy).

Prefill: bf16, causal, 40 query heads, 8 KV heads, head_dim 128 (Llama 4 Scout), one sequence of N tokens
in chunks of 8192 (and 2048). jitattn with attention_chunk against jitattn on the virtual batch, and
PyTorch's FA2 and cuDNN backends on the virtual batch (K/V expanded to 40 heads before timing). The
chunked output is checked against the virtual batch's before timing.

Decode: one query token per sequence over a cache of 32768 keys with chunks of 8192 (the query sees the
last chunk's 8192 keys) or a window of 4096, against a call over a cache holding only the keys it sees;
TB/s counts the K/V bytes a query sees. With --base-lib, the same calls through another build of the
library (windows only when it predates attention_chunk) show what the split planning change is worth.

  python3 bench/bench_chunk.py --lib build/libjitattn.so [--base-lib build/base-lib/libjitattn.so] [--json FILE]
"""
import argparse
import ctypes
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, I32, check, default_options, force_tiles, load, tensor_of  # noqa: E402
from jitattn_bench import max_difference, write_json  # noqa: E402
from jitattn_kvcache import kvcache_call  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402


def prefill(lib, stream, rows, tiles=""):
    heads_q, heads_kv, dim = 40, 8, 128
    print(f"prefill: bf16, causal, heads {heads_q}/{heads_kv}, d {dim}; ms per call (TFLOP/s of the causal chunks)")
    print(f"{'N':>6} {'chunk':>6} | {'chunked':>16} {'virtual batch':>16} {'FA2 (virtual)':>16} {'cuDNN (virtual)':>16} |"
          f" {'chunked/virtual':>15}")
    for n, chunk in ((8192, 2048), (16384, 2048), (16384, 8192), (32768, 8192), (65536, 8192)):
        gen = torch.Generator(device="cuda").manual_seed(n + chunk)
        q = torch.randn(1, n, heads_q, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(1, n, heads_kv, dim, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
        out, out_virtual = torch.empty_like(q), torch.empty_like(q)
        pieces = n // chunk
        views = [t.view(pieces, chunk, t.shape[2], dim) for t in (q, k, v, out_virtual)]
        tq, tk, tv, to = (tensor_of(t, BF16) for t in (q, k, v, out))
        vq, vk, vv, vo = (tensor_of(t, BF16) for t in views)
        chunked, plain = default_options(lib), default_options(lib)
        chunked.causal = plain.causal = 1
        chunked.attention_chunk = chunk
        force_tiles(chunked, tiles)

        def run_chunked():
            check(lib, lib.jitattn_fwd(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(to), None,
                                       ctypes.byref(chunked), stream))

        def run_virtual():
            check(lib, lib.jitattn_fwd(ctypes.byref(vq), ctypes.byref(vk), ctypes.byref(vv), ctypes.byref(vo), None,
                                       ctypes.byref(plain), stream))

        diff = max_difference(run_chunked, out, run_virtual, out_virtual)
        if not diff <= 1e-2:
            print(f"MISMATCH N={n} chunk={chunk}: max |chunked - virtual batch| = {diff}")
            return 1
        qt = views[0].transpose(1, 2)
        kt, vt = (t.repeat_interleave(heads_q // heads_kv, dim=2).view(pieces, chunk, heads_q, dim).transpose(1, 2)
                  for t in (k, v))

        def torch_backend(backend):
            def run():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
            return run

        r = {"n": n, "chunk": chunk, "heads_q": heads_q, "heads_kv": heads_kv, "head_dim": dim,
             "chunked_ms": median_ms(run_chunked, 30, 5), "virtual_ms": median_ms(run_virtual, 30, 5)}
        for label, backend in (("fa2_ms", SDPBackend.FLASH_ATTENTION), ("cudnn_ms", SDPBackend.CUDNN_ATTENTION)):
            try:
                r[label] = median_ms(torch_backend(backend), 30, 5)
            except RuntimeError as error:
                r[label] = None
                print(f"  {label} unavailable: {str(error).splitlines()[0]}")
        flops = 4 * pieces * chunk * chunk / 2 * heads_q * dim
        cell = lambda ms: f"{ms:7.3f} ({flops / (ms * 1e-3) / 1e12:4.0f})" if ms else f"{'-':>16}"
        print(f"{n:>6} {chunk:>6} | {cell(r['chunked_ms'])} {cell(r['virtual_ms'])} {cell(r['fa2_ms'])} "
              f"{cell(r['cudnn_ms'])} | {r['chunked_ms'] / r['virtual_ms']:14.3f}x", flush=True)
        rows.append(dict(r, kind="prefill"))
        del q, k, v, out, out_virtual, views, kt, vt, qt
        torch.cuda.empty_cache()
    return 0


def decode(libs, stream, rows):
    heads_q, heads_kv, dim, capacity = 32, 8, 128, 32768
    print(f"decode: bf16, heads {heads_q}/{heads_kv}, d {dim}, one query token over {capacity} cached keys; "
          "TB/s of the K/V a query sees")
    names = list(libs)
    print(f"{'batch':>5} {'mask':>12} | " + " ".join(f"{name:>10}" for name in names) + f" | {'seen keys only':>14}")
    for batch in (1, 16):
        for mask in ("chunk 8192", "window 4096"):
            seen = 8192 if mask.startswith("chunk") else 4096
            seen_bytes = batch * seen * heads_kv * dim * 2 * 2
            copies = max(1, min(64, -(-(256 << 20) // (batch * capacity * heads_kv * dim * 4))))
            gen = torch.Generator(device="cuda").manual_seed(batch * seen)
            q = torch.randn(batch, 1, heads_q, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            caches = [tuple(torch.randn(batch, capacity, heads_kv, dim, device="cuda", dtype=torch.bfloat16,
                                        generator=gen) for _ in range(2)) for _ in range(copies)]
            seqlens = torch.full((batch,), capacity, device="cuda", dtype=torch.int32)
            seen_lens = torch.full((batch,), seen, device="cuda", dtype=torch.int32)
            out, out_seen = torch.empty_like(q), torch.empty_like(q)
            tq, tout, tout_seen = tensor_of(q, BF16), tensor_of(out, BF16), tensor_of(out_seen, BF16)
            tseq, tseen = tensor_of(seqlens, I32), tensor_of(seen_lens, I32)
            r = {"kind": "decode", "batch": batch, "mask": mask, "capacity": capacity, "seen_keys": seen}
            cells = []
            for name, lib in libs.items():
                if name != "this" and seen == 8192:  # a build before attention_chunk would ignore it
                    cells.append(f"{'-':>10}")
                    continue
                options = default_options(lib)
                options.causal = 1
                if seen == 8192:
                    options.attention_chunk = 8192
                else:
                    options.window_left = seen - 1
                calls = [kvcache_call(lib, tq, tout, tseq, k, v, options, stream, 0, capacity) for k, v in caches]
                plain = default_options(lib)
                # The keys the query sees, as a cache of their own (the tail of each copy).
                seen_calls = [kvcache_call(lib, tq, tout_seen, tseen, k[:, capacity - seen:], v[:, capacity - seen:],
                                           plain, stream, 0, seen) for k, v in caches]
                diff = max_difference(calls[0], out, seen_calls[0], out_seen)
                if not diff <= 1e-2:
                    print(f"MISMATCH {name} batch={batch} {mask}: max |masked - seen keys only| = {diff}")
                    return 1
                r[name + "_ms"] = median_ms(lambda i: calls[i % copies](), 50, 5, with_index=True)
                r[name + "_seen_ms"] = median_ms(lambda i: seen_calls[i % copies](), 50, 5, with_index=True)
                cells.append(f"{seen_bytes / (r[name + '_ms'] * 1e-3) / 1e12:10.2f}")
            seen_tbps = seen_bytes / (r[names[0] + "_seen_ms"] * 1e-3) / 1e12
            print(f"{batch:>5} {mask:>12} | " + " ".join(cells) + f" | {seen_tbps:14.2f}", flush=True)
            rows.append(r)
            del caches, q, out, out_seen
            torch.cuda.empty_cache()
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libjitattn.so")
    parser.add_argument("--base-lib", default="", help="another build, for the decode calls beside this one")
    parser.add_argument("--json")
    parser.add_argument("--tiles", default="", help="force the chunked prefill calls' tiles (jitattn_ctypes.force_tiles)")
    parser.add_argument("--prefill-only", action="store_true")
    args = parser.parse_args()
    lib = load(args.lib)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    print(f"jitattn {lib.jitattn_version().decode()} | torch {torch.__version__} | {torch.cuda.get_device_name()}")
    rows = []
    status = prefill(lib, stream, rows, args.tiles)
    if args.prefill_only:
        return status
    libs = {"this": lib}
    if args.base_lib:
        libs["base"] = load(args.base_lib)
    status = status or decode(libs, stream, rows)
    write_json(args.json, rows)
    return status


if __name__ == "__main__":
    sys.exit(main())
