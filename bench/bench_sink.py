"""Learnable attention sinks (ForwardOptions::learnable_sink, FlashAttention's learnable_sink; gpt-oss):
what folding the sink into the kernel costs, and what it saves against applying it after a call without
sinks.

gpt-oss-120b's attention: bf16, 64 query heads over 8 KV heads, head_dim 64, a sink logit per query head;
its layers alternate between full causal attention and a causal window of 128 keys.

Prefill (one sequence of N tokens, causal, and causal with the 128-key window): jitattn with sinks,
jitattn without, and "after": jitattn without sinks writing lse, then out *= sigmoid(lse - sink) in
PyTorch, which is the same result (out · Σ / (Σ + e^sink) = out · σ(lse − sink)) by two more kernels.
Decode (one query token over a KV cache of batch × L keys, full causal layers): the same three, TB/s of
K + V read. Every result with sinks is checked against "after" before timing.

  python3 bench/bench_sink.py [--lib build/libjitattn.so] [--json FILE]
"""
import argparse
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, F32, I32, default_options, load, tensor_of  # noqa: E402
from jitattn_bench import forward_call, max_difference, random_sinks, write_json  # noqa: E402
from jitattn_kvcache import kvcache_call  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402

HEADS_Q, HEADS_KV, DIM = 64, 8, 64


def sink_options(lib, sinks, window):
    """Options with the sinks tensor attached (None: without), and the struct that must outlive them."""
    options = default_options(lib)
    options.causal = 1
    if window:
        options.window_left = window - 1
    keep = None
    if sinks is not None:
        keep = tensor_of(sinks, F32)
        options.learnable_sink = ctypes.addressof(keep)
    return options, keep


def apply_after(out, lse, sinks):
    """out *= sigmoid(lse - sink), out [B, S, H, D], lse [B, H, S]: the sink folded in after the call."""
    scale = torch.sigmoid(lse - sinks.view(1, -1, 1)).transpose(1, 2).unsqueeze(-1)
    out.mul_(scale.to(out.dtype))


def prefill(lib, stream, rows):
    print(f"prefill: bf16, heads {HEADS_Q}/{HEADS_KV}, d {DIM}, one sequence; ms per call")
    print(f"{'N':>6} {'mask':>10} | {'sinks':>8} {'none':>8} {'after':>8} | {'sinks/none':>10} {'after/sinks':>11}")
    gen = torch.Generator(device="cuda").manual_seed(7)
    sinks = random_sinks(HEADS_Q, gen)
    for n in (2048, 8192, 32768):
        q = torch.randn(1, n, HEADS_Q, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(1, n, HEADS_KV, DIM, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
        out, out_plain = torch.empty_like(q), torch.empty_like(q)
        lse = torch.empty(1, HEADS_Q, n, device="cuda", dtype=torch.float32)
        tq, tk, tv, to, tp, tl = (tensor_of(q, BF16), tensor_of(k, BF16), tensor_of(v, BF16), tensor_of(out, BF16),
                                  tensor_of(out_plain, BF16), tensor_of(lse, F32))
        for window in (0, 128):
            with_sinks, keep = sink_options(lib, sinks, window)
            plain, _ = sink_options(lib, None, window)
            run_sinks = forward_call(lib, stream, tq, tk, tv, to, with_sinks)
            run_plain = forward_call(lib, stream, tq, tk, tv, tp, plain)
            plain_with_lse = forward_call(lib, stream, tq, tk, tv, tp, plain, lse=tl)

            def run_after():
                plain_with_lse()
                apply_after(out_plain, lse, sinks)

            diff = max_difference(run_sinks, out, run_after, out_plain)
            if not diff <= 2e-2:
                print(f"MISMATCH N={n} window={window}: max |sinks - after| = {diff}")
                return 1
            r = {"kind": "prefill", "n": n, "window": window, "sinks_ms": median_ms(run_sinks, 30, 5),
                 "none_ms": median_ms(run_plain, 30, 5), "after_ms": median_ms(run_after, 30, 5)}
            mask = f"window {window}" if window else "causal"
            print(f"{n:>6} {mask:>10} | {r['sinks_ms']:8.3f} {r['none_ms']:8.3f} {r['after_ms']:8.3f} | "
                  f"{r['sinks_ms'] / r['none_ms']:9.3f}x {r['after_ms'] / r['sinks_ms']:10.3f}x", flush=True)
            rows.append(r)
            del keep
        del q, k, v, out, out_plain, lse
        torch.cuda.empty_cache()
    return 0


def decode(lib, stream, rows):
    print(f"decode: bf16, heads {HEADS_Q}/{HEADS_KV}, d {DIM}, one query token, causal; TB/s of K + V read")
    print(f"{'batch':>5} {'keys':>6} | {'sinks':>8} {'none':>8} {'after':>8} | {'sinks/none':>10} {'after/sinks':>11}")
    gen = torch.Generator(device="cuda").manual_seed(11)
    sinks = random_sinks(HEADS_Q, gen)
    for batch in (1, 16, 64):
        for keys in (4096, 32768):
            kv_bytes = batch * keys * HEADS_KV * DIM * 2 * 2
            copies = max(1, min(64, -(-(256 << 20) // kv_bytes)))
            q = torch.randn(batch, 1, HEADS_Q, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
            caches = [tuple(torch.randn(batch, keys, HEADS_KV, DIM, device="cuda", dtype=torch.bfloat16,
                                        generator=gen) for _ in range(2)) for _ in range(copies)]
            seqlens = torch.full((batch,), keys, device="cuda", dtype=torch.int32)
            out, out_plain = torch.empty_like(q), torch.empty_like(q)
            lse = torch.empty(batch, HEADS_Q, 1, device="cuda", dtype=torch.float32)
            tq, to, tp, tseq, tl = (tensor_of(q, BF16), tensor_of(out, BF16), tensor_of(out_plain, BF16),
                                    tensor_of(seqlens, I32), tensor_of(lse, F32))
            with_sinks, keep = sink_options(lib, sinks, 0)
            plain, _ = sink_options(lib, None, 0)
            sink_calls = [kvcache_call(lib, tq, to, tseq, k, v, with_sinks, stream, 0, keys) for k, v in caches]
            plain_calls = [kvcache_call(lib, tq, tp, tseq, k, v, plain, stream, 0, keys) for k, v in caches]
            lse_calls = [kvcache_call(lib, tq, tp, tseq, k, v, plain, stream, 0, keys, lse=tl) for k, v in caches]

            def after(i):
                lse_calls[i % copies]()
                apply_after(out_plain, lse, sinks)

            diff = max_difference(sink_calls[0], out, lambda: after(0), out_plain)
            if not diff <= 2e-2:
                print(f"MISMATCH batch={batch} keys={keys}: max |sinks - after| = {diff}")
                return 1
            r = {"kind": "decode", "batch": batch, "keys": keys,
                 "sinks_ms": median_ms(lambda i: sink_calls[i % copies](), 50, 5, with_index=True),
                 "none_ms": median_ms(lambda i: plain_calls[i % copies](), 50, 5, with_index=True),
                 "after_ms": median_ms(after, 50, 5, with_index=True)}
            tbps = lambda ms: kv_bytes / (ms * 1e-3) / 1e12
            print(f"{batch:>5} {keys:>6} | {tbps(r['sinks_ms']):8.2f} {tbps(r['none_ms']):8.2f} "
                  f"{tbps(r['after_ms']):8.2f} | {r['sinks_ms'] / r['none_ms']:9.3f}x "
                  f"{r['after_ms'] / r['sinks_ms']:10.3f}x", flush=True)
            rows.append(r)
            del caches, q, out, out_plain, keep
            torch.cuda.empty_cache()
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libjitattn.so")
    parser.add_argument("--json")
    args = parser.parse_args()
    lib = load(args.lib)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    print(f"jitattn {lib.jitattn_version().decode()} | torch {torch.__version__} | {torch.cuda.get_device_name()}")
    rows = []
    status = prefill(lib, stream, rows) or decode(lib, stream, rows)
    write_json(args.json, rows)
    return status


if __name__ == "__main__":
    sys.exit(main())
