"""Split-KV prefill tiles under a sliding window over a long KV cache: speculative decoding and short chunks
on gpt-oss's sliding layers (bf16, 64 query heads over 8, head_dim 64, learnable sinks, causal, a window of
128 or 4096 keys), one call over a cache of 32768 keys against the same call over a cache holding only the
keys the window lets the queries see (the same window). With --base-lib, the same calls through another build (one whose
4-warp and wgmma split kernels cut the whole cache into pieces).

  python3 bench/bench_window_splits.py [--lib build/libjitattn.so] [--base-lib DIR/libjitattn.so] [--json FILE]
"""
import argparse
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, F32, I32, default_options, load, tensor_of  # noqa: E402
from jitattn_bench import max_difference, random_sinks, write_json  # noqa: E402
from jitattn_kvcache import kvcache_call  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402

HEADS_Q, HEADS_KV, DIM, CAPACITY = 64, 8, 64, 32768


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libjitattn.so")
    parser.add_argument("--base-lib", default="")
    parser.add_argument("--json")
    args = parser.parse_args()
    libs = {"this": load(args.lib)}
    if args.base_lib:
        libs["base"] = load(args.base_lib)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    print(f"jitattn {libs['this'].jitattn_version().decode()} | torch {torch.__version__} | {torch.cuda.get_device_name()}")
    print(f"bf16, heads {HEADS_Q}/{HEADS_KV}, d {DIM}, sinks, causal; {CAPACITY} cached keys; us per call")
    names = list(libs)
    print(f"{'batch':>5} {'tokens':>6} {'window':>6} | " + " ".join(f"{n:>8}" for n in names) + f" | {'seen only':>9}")
    gen = torch.Generator(device="cuda").manual_seed(5)
    sinks = random_sinks(HEADS_Q, gen)
    tsinks = tensor_of(sinks, F32)
    rows = []
    for batch in (1, 8):
        for tokens in (16, 64):
            for window in (128, 4096):
                seen = window - 1 + tokens  # the window of the first query to the last query
                copies = max(1, min(32, -(-(256 << 20) // (batch * CAPACITY * HEADS_KV * DIM * 4))))
                q = torch.randn(batch, tokens, HEADS_Q, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
                caches = [tuple(torch.randn(batch, CAPACITY, HEADS_KV, DIM, device="cuda", dtype=torch.bfloat16,
                                            generator=gen) for _ in range(2)) for _ in range(copies)]
                # The queries are the cache's last `tokens` keys' positions: seqlens count the cached keys.
                seqlens = torch.full((batch,), CAPACITY, device="cuda", dtype=torch.int32)
                seen_lens = torch.full((batch,), seen, device="cuda", dtype=torch.int32)
                out, out_seen = torch.empty_like(q), torch.empty_like(q)
                tq, tout, tseen_out = tensor_of(q, BF16), tensor_of(out, BF16), tensor_of(out_seen, BF16)
                tseq, tseen = tensor_of(seqlens, I32), tensor_of(seen_lens, I32)
                r = {"batch": batch, "tokens": tokens, "window": window}
                cells = []
                for name, lib in libs.items():
                    options = default_options(lib)
                    options.causal = 1
                    options.window_left = window - 1
                    options.learnable_sink = ctypes.addressof(tsinks)
                    calls = [kvcache_call(lib, tq, tout, tseq, k, v, options, stream, 0, CAPACITY) for k, v in caches]
                    seen_calls = [kvcache_call(lib, tq, tseen_out, tseen, k[:, CAPACITY - seen:], v[:, CAPACITY - seen:],
                                               options, stream, 0, seen) for k, v in caches]
                    diff = max_difference(calls[0], out, seen_calls[0], out_seen)
                    if not diff <= 1e-2:
                        print(f"MISMATCH {name} batch={batch} tokens={tokens} window={window}: {diff}")
                        return 1
                    r[name + "_us"] = 1e3 * median_ms(lambda i: calls[i % copies](), 50, 5, with_index=True)
                    r[name + "_seen_us"] = 1e3 * median_ms(lambda i: seen_calls[i % copies](), 50, 5, with_index=True)
                    cells.append(f"{r[name + '_us']:8.1f}")
                print(f"{batch:>5} {tokens:>6} {window:>6} | " + " ".join(cells) + f" | {r['this_seen_us']:9.1f}",
                      flush=True)
                rows.append(r)
                del caches, q, out, out_seen
                torch.cuda.empty_cache()
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
