"""jitattn beside PyTorch's scaled_dot_product_attention backends, same tensors, same process.

Grid (GPU.md): head_dim 64 and 128, causal and not, seqlen 512..16k,
batch x seqlen = 16384, heads = 2048 / head_dim. TFLOP/s = 4*B*H*N^2*D / time
(halved when causal); CUDA events, warm-up, median. Checks that jitattn's
output agrees with the FlashAttention backend's before timing.

  python3 bench/compare_torch.py --lib build/libjitattn.so [--dtype bf16|f16|both] [--json FILE]
"""
import argparse
import ctypes
import os
import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import Tensor, check, default_options, force_tiles  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402


DTYPES = {"bf16": (torch.bfloat16, 1), "f16": (torch.float16, 0)}


def as_bshd(t, code):
    """A torch [B, H, S, D] tensor described to jitattn as [B, S, H, D] (strides swapped, no copy)."""
    b, h, s, d = t.shape
    sb, sh, ss, sd = t.stride()
    return Tensor(t.data_ptr(), code, 4, (ctypes.c_int64 * 4)(b, s, h, d), (ctypes.c_int64 * 4)(sb, ss, sh, sd))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libjitattn.so")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "both"])
    parser.add_argument("--json")
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--tiles", default="", help="force jitattn's tiles (jitattn_ctypes.force_tiles), e.g. 128x128x8x2w")
    parser.add_argument("--causal", default="no,yes", help="no, yes, or both (the default)")
    parser.add_argument("--no-mem-efficient", action="store_true", help="skip PyTorch's memory-efficient backend")
    args = parser.parse_args()

    lib = ctypes.CDLL(args.lib)
    lib.jitattn_last_error.restype = ctypes.c_char_p
    lib.jitattn_version.restype = ctypes.c_char_p
    print(f"jitattn {lib.jitattn_version().decode()} | torch {torch.__version__} | {torch.cuda.get_device_name()}")
    rows = []
    header = f"{'dtype':5} {'d':>4} {'causal':>6} {'N':>6} | {'jitattn':>8} {'FA2':>8} {'cuDNN':>8} {'mem-eff':>8} | {'vs FA2':>7} {'vs cuDNN':>8}"
    print(header)
    for name in (["bf16", "f16"] if args.dtype == "both" else [args.dtype]):
        torch_dtype, code = DTYPES[name]
        for head_dim in [int(x) for x in args.head_dims.split(",")]:
            for causal in [c == "yes" for c in args.causal.split(",")]:
                for n in [int(x) for x in args.seqlens.split(",")]:
                    batch, heads = 16384 // n, max(1, 2048 // head_dim)
                    gen = torch.Generator(device="cuda").manual_seed(n * head_dim + causal)
                    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch_dtype, generator=gen)
                               for _ in range(3))
                    out = torch.empty_like(q)
                    tq, tk, tv, to = (as_bshd(t, code) for t in (q, k, v, out))
                    options = default_options(lib)
                    options.causal = int(causal)
                    force_tiles(options, args.tiles)
                    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

                    def run_jitattn():
                        check(lib, lib.jitattn_fwd(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv),
                                                   ctypes.byref(to), None, ctypes.byref(options), stream))

                    def torch_backend(backend):
                        def run():
                            with sdpa_kernel(backend):
                                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        return run

                    out.fill_(float("nan"))
                    run_jitattn()
                    reference = torch_backend(SDPBackend.FLASH_ATTENTION)()
                    max_diff = (out.float() - reference.float()).abs().max().item()
                    tolerance = 2e-2 if name == "bf16" else 4e-3
                    if not max_diff <= tolerance:
                        print(f"MISMATCH d={head_dim} causal={causal} N={n}: max |jitattn - FA2| = {max_diff}")
                        return 1
                    flops = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
                    result = {"dtype": name, "head_dim": head_dim, "causal": causal, "seqlen": n, "batch": batch,
                              "heads": heads, "max_diff_vs_fa2": max_diff}
                    for label, fn in (("jitattn", run_jitattn), ("fa2", torch_backend(SDPBackend.FLASH_ATTENTION)),
                                      ("cudnn", torch_backend(SDPBackend.CUDNN_ATTENTION)),
                                      ("mem_efficient", None if args.no_mem_efficient
                                       else torch_backend(SDPBackend.EFFICIENT_ATTENTION))):
                        if fn is None:
                            result[label] = None
                            continue
                        try:
                            result[label] = flops / median_ms(fn) * 1e-9
                        except RuntimeError as error:  # a backend that refuses the shape
                            result[label] = None
                            print(f"  {label} unavailable: {str(error).splitlines()[0]}")
                    rows.append(result)
                    fmt = lambda x: f"{x:8.1f}" if x else "       -"
                    ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
                    print(f"{name:5} {head_dim:>4} {'yes' if causal else 'no':>6} {n:>6} | {fmt(result['jitattn'])} "
                          f"{fmt(result['fa2'])} {fmt(result['cudnn'])} {fmt(result['mem_efficient'])} | "
                          f"{ratio(result['jitattn'], result['fa2']):>7} {ratio(result['jitattn'], result['cudnn']):>8}",
                          flush=True)
                    del q, k, v, out, reference
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
