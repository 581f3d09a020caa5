"""Which kernel family serves short sliding windows (gpt-oss's 128 keys) fastest: the planner's choice
against forced wgmma and 4-warp mma.sync tiles, for prefill and for speculative tokens over a long KV cache
(bf16, sinks, causal, window 128; 64/8 heads at d64 as gpt-oss, 32/8 at d128). A tile under such a window
sees two to four key blocks, as a tile of a short call does (tiles.cpp, short_window).

  python3 bench/probe_window_kernels.py [--head-dim 64|128]
"""
import argparse
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, F32, I32, check, default_options, force_tiles, load, tensor_of  # noqa: E402
from jitattn_kvcache import kvcache_call  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--head-dim", type=int, default=64)
DIM = parser.parse_args().head_dim
HEADS = 64 if DIM <= 64 else 32
lib = load("build/libjitattn.so")
stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
gen = torch.Generator(device="cuda").manual_seed(3)
sinks = torch.empty(HEADS, device="cuda", dtype=torch.float32).uniform_(-2, 4, generator=gen)
tsinks = tensor_of(sinks, F32)
TILES = ("", "128x128x8x2w", "64x128x4", "128x64x4", "64x64x4")


def options_with(tiles):
    o = default_options(lib)
    o.causal = 1
    o.window_left = 127
    o.learnable_sink = ctypes.addressof(tsinks)
    force_tiles(o, tiles)
    return o


print(f"head dim {DIM}, {HEADS}/8 heads")
print("prefill, one sequence: ms per call for tiles " + ", ".join(t or "planner" for t in TILES))
for n in (2048, 8192, 32768):
    q = torch.randn(1, n, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(1, n, 8, DIM, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    out = torch.empty_like(q)
    tq, tk, tv, to = (tensor_of(t, BF16) for t in (q, k, v, out))
    cells = []
    for tiles in TILES:
        o = options_with(tiles)
        run = lambda: check(lib, lib.jitattn_fwd(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv),
                                                 ctypes.byref(to), None, ctypes.byref(o), stream))
        cells.append(f"{median_ms(run, 30, 5):8.4f}")
    print(f"N={n:>6}: " + " ".join(cells), flush=True)

print("KV cache of 32768 keys: us per call for tiles " + ", ".join(t or "planner" for t in TILES))
for batch in (1, 8, 32):
    for tokens in (16, 64):
        q = torch.randn(batch, tokens, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        kc, vc = (torch.randn(batch, 32768, 8, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
                  for _ in range(2))
        seqlens = torch.full((batch,), 32768, device="cuda", dtype=torch.int32)
        out = torch.empty_like(q)
        tq, to, tseq = tensor_of(q, BF16), tensor_of(out, BF16), tensor_of(seqlens, I32)
        cells = []
        for tiles in TILES:
            o = options_with(tiles)
            call = kvcache_call(lib, tq, to, tseq, kc, vc, o, stream, 0, 32768)
            cells.append(f"{1e3 * median_ms(call, 50, 5):8.1f}")
        print(f"batch={batch:>2} tokens={tokens:>2}: " + " ".join(cells), flush=True)
