"""Fused RoPE: jitattn with RoPE in the kernel beside the same attention without RoPE,
and beside rotating with PyTorch ops before PyTorch's FlashAttention-2 backend.

Issue grid: bf16, causal, 16 heads, head_dim 64 and 128, seqlen 512..8192. Two
batch sizes: 2 (GPU.md's peer measurement) and 16384 / seqlen tokens (a full GPU).
Tables are timed twice: f32 and bf16 (q's dtype, as FlashAttention takes them).
CUDA events, warm-up, median of 30. Before timing, the fused output is checked
against rotate-then-attend in PyTorch.

  python3 bench/bench_rope.py --lib build/libjitattn.so [--json FILE]
"""
import argparse
import ctypes
import json
import math
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, F32, check, default_options, force_tiles, load, tensor_of  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402


def yarn_inv_freq(head_dim, theta, factor, original=4096, beta_fast=32.0, beta_slow=1.0):
    """Hugging Face's YaRN frequencies (truncate true) and attention factor."""
    def pair_turning(turns):
        return head_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))
    low = max(math.floor(pair_turning(beta_fast)), 0)
    high = min(math.ceil(pair_turning(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    pairs = torch.arange(head_dim // 2, device="cuda", dtype=torch.float32)
    ramp = ((pairs - low) / (high - low)).clamp(0, 1)
    base = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device="cuda", dtype=torch.float32) / head_dim))
    return base * (1 - ramp) + base / factor * ramp, 0.1 * math.log(factor) + 1.0


def longrope_pair_factors(head_dim):
    """Pair factors of the shape of Phi's long_factor: 1 at the fastest pair, 41 at the slowest."""
    pairs = head_dim // 2
    return [1.0 + 40.0 * p * p / (pairs * pairs) for p in range(pairs)]


def longrope_inv_freq(head_dim, theta, factor, original=4096):
    """Hugging Face's LongRoPE frequencies (longrope_pair_factors) and default attention factor."""
    pair_factors = torch.tensor(longrope_pair_factors(head_dim), device="cuda", dtype=torch.float32)
    base = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device="cuda", dtype=torch.float32) / head_dim))
    return base / pair_factors, math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libjitattn.so")
    parser.add_argument("--json")
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192")
    parser.add_argument("--rope-tiles", default="", help="force tiles of the RoPE runs, e.g. 64x64x4, 256x64x8x3 (producer layout, 3 stages), "
                        "128x128x8x2w (producer layout with wgmma warpgroups)")
    parser.add_argument("--plain-tiles", default="", help="force tiles of the runs without RoPE (same format)")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--grids", default="issue,full", help="issue (batch 2), full (16384 / N tokens), or both")
    parser.add_argument("--quick", action="store_true", help="time plain and fused RoPE only (no tables, no PyTorch)")
    parser.add_argument("--table-dtypes", default="f32,bf16",
                        help="dtypes of the cos/sin tables to time (bf16 needs a library that takes 16-bit tables)")
    parser.add_argument("--yarn", type=float, default=0.0,
                        help="also time YaRN angles of this factor (betas 32 and 1 over 4096 positions, Hugging Face's "
                             "attention factor, so the kernels scale cos and sin), checked against PyTorch too")
    parser.add_argument("--longrope", type=float, default=0.0,
                        help="or LongRoPE angles of this factor (Phi's: 32; pair factors of the shape of Phi's "
                             "long_factor, Hugging Face's attention factor: the same scaled kernels as YaRN's)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the check against PyTorch (timing experimental templates that compute wrong results)")
    args = parser.parse_args()
    if args.yarn and args.longrope:
        parser.error("--yarn and --longrope are one frequency scaling at a time")
    scaled = "yarn" if args.yarn else "longrope" if args.longrope else ""
    lib = load(args.lib)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    rows = []
    print(f"jitattn {lib.jitattn_version().decode()} | torch {torch.__version__} | {torch.cuda.get_device_name()}")
    print(f"{'d':>4} {'batch':>5} {'N':>6} | {'plain ms':>9} {'rope ms':>9} {'tables ms':>9} {'tab16 ms':>9} | "
          f"{'rope/plain':>10} {'tab/plain':>9} {'tab16/plain':>11} | {'torch rope+FA2 ms':>17} {'FA2 ms':>8}")
    grids = args.grids.split(",")
    for head_dim in [int(x) for x in args.head_dims.split(",")]:
        for per_gpu in [g == "full" for g in grids]:
            for n in [int(x) for x in args.seqlens.split(",")]:
                batch, heads = (max(1, 16384 // n) if per_gpu else 2), 16
                gen = torch.Generator(device="cuda").manual_seed(n + head_dim)
                q, k, v = (torch.randn(batch, n, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                           for _ in range(3))
                out = torch.empty_like(q)
                positions = torch.arange(n, device="cuda", dtype=torch.float32)
                inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, device="cuda", dtype=torch.float32) / head_dim))
                angles = torch.outer(positions, inv_freq)
                cos_table, sin_table = angles.cos().contiguous(), angles.sin().contiguous()
                mscale = 1.0
                if scaled:
                    scaled_freq, mscale = (yarn_inv_freq(head_dim, 10000.0, args.yarn) if args.yarn
                                           else longrope_inv_freq(head_dim, 10000.0, args.longrope))
                    scaled_angles = torch.outer(positions, scaled_freq)
                    scaled_cos, scaled_sin = scaled_angles.cos() * mscale, scaled_angles.sin() * mscale
                pair_factors = (ctypes.c_float * (head_dim // 2))(*longrope_pair_factors(head_dim))
                tq, tk, tv, to = (tensor_of(t, BF16) for t in (q, k, v, out))
                tcos = tensor_of(cos_table, F32)
                tsin = tensor_of(sin_table, F32)
                cos16, sin16 = cos_table.to(torch.bfloat16), sin_table.to(torch.bfloat16)
                tcos16, tsin16 = tensor_of(cos16, BF16), tensor_of(sin16, BF16)

                def options(rope, tables=None, scaling=""):
                    o = default_options(lib)
                    if scaling == "yarn":
                        o.rope_yarn_factor = args.yarn
                    elif scaling == "longrope":
                        o.rope_longrope_pair_factors = pair_factors
                        o.rope_longrope_factor = args.longrope
                    o.causal = 1
                    o.rope_style = 1 if rope else 0
                    forced = args.rope_tiles if rope else args.plain_tiles
                    force_tiles(o, forced)
                    if tables is not None:
                        o.rope_cos = ctypes.addressof(tcos if tables == "f32" else tcos16)
                        o.rope_sin = ctypes.addressof(tsin if tables == "f32" else tsin16)
                    return o

                plain, fused, fused_scaled = options(False), options(True), options(True, scaling=scaled)
                tabled, tabled16 = options(True, "f32"), options(True, "bf16")

                def call(o):
                    def run():
                        check(lib, lib.jitattn_fwd(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv),
                                                   ctypes.byref(to), None, ctypes.byref(o), stream))
                    return run

                def full(table):
                    return torch.cat([table, table], dim=-1)[None, :, None, :]

                cos_full, sin_full = full(cos_table), full(sin_table)

                def rotate(x, cos, sin, fp32):
                    # Timed: in bf16, as a framework would. Checked against: fp32 arithmetic rounded once
                    # (the kernels rotate q so), since YaRN's (or LongRoPE's) attention factor sharpens the scores enough for
                    # bf16 rotation's own error to reach the check's bound.
                    dtype = torch.float32 if fp32 else torch.bfloat16
                    x, cos, sin = x.to(dtype), cos.to(dtype), sin.to(dtype)
                    half = x.shape[-1] // 2
                    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
                    return (x * cos + rotated * sin).to(torch.bfloat16)

                def torch_rope_fa2(cos=cos_full, sin=sin_full, fp32=False):
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return F.scaled_dot_product_attention(rotate(q, cos, sin, fp32).transpose(1, 2),
                                                              rotate(k, cos, sin, fp32).transpose(1, 2),
                                                              v.transpose(1, 2), is_causal=True)

                def torch_fa2():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                              is_causal=True)

                table_dtypes = [] if args.quick else args.table_dtypes.split(",")
                timed = {"f32": tabled, "bf16": tabled16}
                checked = [(fused, (cos_full, sin_full))] + [(timed[t], (cos_full, sin_full)) for t in table_dtypes]
                if scaled:
                    checked.append((fused_scaled, (full(scaled_cos), full(scaled_sin))))
                for o, tables in () if args.no_check else checked:
                    out.fill_(float("nan"))
                    call(o)()
                    reference = torch_rope_fa2(*tables, fp32=True).transpose(1, 2)
                    diff = (out.float() - reference.float()).abs().max().item()
                    # The attention factor scales the scores, and the roundings that reach the output, by mscale².
                    bound = 3e-2 * (mscale ** 2 if o is fused_scaled else 1.0)
                    if not diff <= bound:
                        print(f"MISMATCH d={head_dim} N={n} batch={batch} {scaled or 'theta'}={o is fused_scaled}: "
                              f"max |fused - torch rope+FA2| = {diff}")
                        return 1
                nan = float("nan")
                r = {"head_dim": head_dim, "batch": batch, "heads": heads, "seqlen": n, "causal": True,
                     "plain_ms": median_ms(call(plain), 30, 5), "rope_ms": median_ms(call(fused), 30, 5),
                     "rope_tables_ms": median_ms(call(tabled), 30, 5) if "f32" in table_dtypes else nan,
                     "rope_tables16_ms": median_ms(call(tabled16), 30, 5) if "bf16" in table_dtypes else nan,
                     "scaled": scaled, "rope_scaled_ms": median_ms(call(fused_scaled), 30, 5) if scaled else nan,
                     "torch_rope_fa2_ms": nan if args.quick else median_ms(torch_rope_fa2, 30, 5),
                     "fa2_ms": nan if args.quick else median_ms(torch_fa2, 30, 5)}
                rows.append(r)
                print(f"{head_dim:>4} {batch:>5} {n:>6} | {r['plain_ms']:9.4f} {r['rope_ms']:9.4f} "
                      f"{r['rope_tables_ms']:9.4f} {r['rope_tables16_ms']:9.4f} | {r['rope_ms'] / r['plain_ms']:9.3f}x "
                      f"{r['rope_tables_ms'] / r['plain_ms']:8.3f}x {r['rope_tables16_ms'] / r['plain_ms']:10.3f}x | "
                      f"{r['torch_rope_fa2_ms']:17.4f} {r['fa2_ms']:8.4f}"
                      + (f" | {scaled} {r['rope_scaled_ms']:.4f} ms, {r['rope_scaled_ms'] / r['rope_ms']:.3f}x rope"
                         if scaled else ""),
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
