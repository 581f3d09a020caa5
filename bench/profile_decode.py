"""Decode shapes for profilers: three jitattn forward_kvcache calls and three PyTorch cuDNN SDPA calls per shape
(bf16, 32/8 heads, head_dim 128, one token), e.g.

  ncu --cache-control none --clock-control none --metrics gpu__time_duration.sum,launch__grid_size \
      python3 bench/profile_decode.py build/libjitattn.so

TILES=BQxBKVxWARPSxSTAGES forces jitattn's tiles (as bench_decode.py --tiles); SHAPES=16x32768,1x1024 picks
the (batch, KV length) pairs.
"""
import ctypes, os, sys
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, I32, KVCacheArgs, default_options, load, tensor_of

lib = load(sys.argv[1] if len(sys.argv) > 1 else "build/libjitattn.so")
tiles = os.environ.get("TILES", "")
stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
shapes = os.environ.get("SHAPES", "1x1024,1x32768,16x1024,16x32768,64x1024,64x32768")
for batch, kv in [tuple(int(x) for x in shape.split("x")) for shape in shapes.split(",")]:
    q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, kv, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    seqlens = torch.full((batch,), kv, device="cuda", dtype=torch.int32)
    options = default_options(lib)
    if tiles:
        options.block_q, options.block_kv, options.warps, options.stages = (int(x) for x in tiles.split("x"))
    tq, tk, tv, tout = (tensor_of(t, BF16) for t in (q, k, v, out))
    tseq = tensor_of(seqlens, I32)
    args = KVCacheArgs(ctypes.addressof(tk), ctypes.addressof(tv), ctypes.addressof(tseq), None, None, None, None, 0, kv)
    size = ctypes.c_size_t(0)
    assert lib.jitattn_kvcache_workspace_bytes(ctypes.byref(tq), ctypes.byref(args), ctypes.byref(tout), None,
                                               ctypes.byref(options), ctypes.byref(size)) == 0
    ws = torch.empty(max(size.value, 256), device="cuda", dtype=torch.uint8)
    torch.cuda.nvtx.range_push(f"b{batch}_kv{kv}")
    for _ in range(3):
        assert lib.jitattn_fwd_kvcache(ctypes.byref(tq), ctypes.byref(args), ctypes.byref(tout), None, ctypes.byref(options),
                                       ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(size.value), stream) == 0
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(3):
            F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    print(f"b{batch} kv{kv} splits-workspace={size.value}", flush=True)
