"""One prefill shape for profilers: a jitattn call without RoPE, then the same call with fused RoPE
(bf16, causal, 16 heads), each once after a warm-up call, e.g.

  ncu --launch-skip 2 --set full python3 bench/profile_rope.py build/libjitattn.so 128 8 2048

Arguments: library, head_dim, batch, seqlen. TILES=BQxBKVxWARPS forces the RoPE call's tiles.
"""
import ctypes, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, check, default_options, load, tensor_of

lib = load(sys.argv[1])
head_dim, batch, n = (int(x) for x in sys.argv[2:5])
stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
q, k, v = (torch.randn(batch, n, 16, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out = torch.empty_like(q)
views = [tensor_of(t, BF16) for t in (q, k, v, out)]


def options(rope):
    o = default_options(lib)
    o.causal = 1
    o.rope_style = 1 if rope else 0
    if rope and os.environ.get("TILES"):
        o.block_q, o.block_kv, o.warps = (int(x) for x in os.environ["TILES"].split("x"))
    return o


calls = [options(False), options(True)]
for timed in (False, True):  # warm-up (compiles), then the profiled pair
    for o in calls:
        check(lib, lib.jitattn_fwd(*(ctypes.byref(t) for t in views), None, ctypes.byref(o), stream))
    torch.cuda.synchronize()
print("plain, rope: done")
