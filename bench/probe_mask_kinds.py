"""The same causal work through three mask kinds: the causal kernel, a local one (a window that bounds nothing
more than causal) and a chunked one (a chunk as long as the sequence), bf16, 40/8 heads, d128. What each mask
kind's own code costs, apart from the keys it skips (docs/PERFORMANCE.md, attention_chunk).

  python3 bench/probe_mask_kinds.py
"""
import ctypes, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, check, default_options, force_tiles, load, tensor_of
from jitattn_timing import median_ms
lib = load("build/libjitattn.so")
stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
for batch, n in ((4, 8192), (16, 2048)):
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(batch, n, 40, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(batch, n, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    o = torch.empty_like(q)
    tq, tk, tv, to = (tensor_of(t, BF16) for t in (q, k, v, o))
    for label, tiles, setup in (("causal", "", lambda x: None), ("causal bc128", "128x128x8x2w", lambda x: None),
                                ("window n-1 (local)", "128x128x8x2w", lambda x: setattr(x, "window_left", n - 1)),
                                ("chunk n (local.chunk)", "128x128x8x2w", lambda x: setattr(x, "attention_chunk", n))):
        opt = default_options(lib); opt.causal = 1; setup(opt); force_tiles(opt, tiles)
        run = lambda: check(lib, lib.jitattn_fwd(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(to), None, ctypes.byref(opt), stream))
        print(f"{batch} x {n} {label:>22}: {median_ms(run, 30, 5):.4f} ms", flush=True)
