"""Decoding a batch whose sequences have different lengths, as an inference engine's decoding step does.

bf16, 32 query heads, 8 KV heads, head_dim 128 (--head-dim), one query token; a contiguous cache of --kv rows
per sequence, of which sequence b uses cache_seqlens[b], by distribution (--dists, seeded):
  uniform   every length kv;
  mixed     uniform in [--low-fraction x kv, kv];
  onelong   one sequence of kv, the others of --short rows;
  bimodal   a quarter of the sequences kv, the rest --short;
  short     every length --short (a cache longer than its sequences). Reported: bytes of K and V the call needs
(sum of cache_seqlens x 8 heads x head_dim x 2 bytes x 2 tensors) per second, for each --splits value
(0: the planner's, told the cache's rows as max_seqlen_k; n: told nothing, max_seqlen_k 0; h: the planner's, told the longest length and the total,
KVCacheArgs::max_seqlen_k and total_seqlen_k; d: told only the cache's rows and dynamic_splits, as a CUDA graph
captured once and replayed with any lengths would be; dN: the same with num_splits N, the most). One wave of sequences ends when its longest does; splitting the keys lets short
pieces fill the SMs that finish early. PyTorch's SDPA has no per-sequence lengths, so the reference is
FA2 over each sequence's own rows, checked before timing. Calls rotate over copies of the cache
adding up to 256 MB or more, so every call reads it from HBM.

  python3 bench/bench_decode_mixed.py --lib build/libjitattn.so [--batches 16,64] [--kv 32768]
      [--dists uniform,mixed,onelong,bimodal] [--low-fraction 0.1] [--short 1024] [--splits 0,1,2,4,8]
      [--seed 1] [--no-check] [--json FILE]
"""
import argparse
import json
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, I32, default_options, load, tensor_of  # noqa: E402
from jitattn_kvcache import kvcache_call  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402


def reference(q, k_cache, v_cache, lengths):
    """FA2 over each sequence's own rows: [batch, 1, heads_q, head_dim]."""
    rows = []
    for b, n in enumerate(lengths):
        qb = q[b:b + 1].transpose(1, 2)
        kb = k_cache[b:b + 1, :n].transpose(1, 2)
        vb = v_cache[b:b + 1, :n].transpose(1, 2)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            rows.append(F.scaled_dot_product_attention(qb, kb, vb, enable_gqa=True).transpose(1, 2))
    return torch.cat(rows)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libjitattn.so")
    parser.add_argument("--json")
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--kv", type=int, default=32768, help="cache rows per sequence (the longest length)")
    parser.add_argument("--low-fraction", type=float, default=0.1,
                        help="lengths are uniform in [this x kv, kv]")
    parser.add_argument("--dists", default="uniform,mixed,onelong,bimodal")
    parser.add_argument("--short", type=int, default=1024, help="length of the short sequences (onelong, bimodal)")
    parser.add_argument("--splits", default="h,0,1,2,4,8",
                        help="num_splits values to time (0: the planner's; h: the planner's told the lengths; "
                             "d: dynamic_splits; dN: dynamic_splits, at most N)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--heads-kv", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-check", action="store_true",
                        help="time without checking against FA2 first (timing-only template variants)")
    args = parser.parse_args()
    lib = load(args.lib)
    stream = __import__("ctypes").c_void_p(torch.cuda.current_stream().cuda_stream)
    heads_kv, head_dim, kv = args.heads_kv, args.head_dim, args.kv
    heads_q = 4 * heads_kv
    splits_list = args.splits.split(",")
    print(f"jitattn {lib.jitattn_version().decode()} | torch {torch.__version__} | {torch.cuda.get_device_name()}"
          f" | d {head_dim}, {heads_q}/{heads_kv} heads, cache {kv} rows")
    print(f"{'batch':>5} {'lengths':>18} | " + " ".join(f"{'splits ' + str(s):>9}" for s in splits_list)
          + "  TB/s of the keys used")
    rows = []
    for batch in [int(x) for x in args.batches.split(",")]:
        gen = torch.Generator(device="cpu").manual_seed(args.seed * 1000 + batch)
        low = max(1, int(args.low_fraction * kv))
        dists = {
            "uniform": [kv] * batch,
            "mixed": torch.randint(low, kv + 1, (batch,), generator=gen).tolist(),
            "onelong": [args.short] * (batch - 1) + [kv],
            "bimodal": [kv if b % 4 == 3 else args.short for b in range(batch)],
            "short": [args.short] * batch,
        }
        for label in args.dists.split(","):
            lengths = dists[label]
            used_bytes = sum(lengths) * heads_kv * head_dim * 2 * 2
            cache_bytes = batch * kv * heads_kv * head_dim * 2 * 2
            copies = max(1, min(64, -(-(256 << 20) // cache_bytes)))
            dgen = torch.Generator(device="cuda").manual_seed(batch * kv + len(label))
            q = torch.randn(batch, 1, heads_q, head_dim, device="cuda", dtype=torch.bfloat16, generator=dgen)
            caches = [(torch.randn(batch, kv, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=dgen),
                       torch.randn(batch, kv, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=dgen))
                      for _ in range(copies)]
            seqlens = torch.tensor(lengths, device="cuda", dtype=torch.int32)
            out = torch.empty_like(q)
            options = default_options(lib)
            tq, tout, tseq = tensor_of(q, BF16), tensor_of(out, BF16), tensor_of(seqlens, I32)
            expected = reference(q, caches[0][0], caches[0][1], lengths)
            r = {"batch": batch, "kv": kv, "lengths": label, "sum_lengths": sum(lengths), "max_length": max(lengths),
                 "used_bytes": used_bytes, "ms": {}, "tbps": {}}
            for splits in splits_list:
                hinted, dynamic, told_nothing = splits == "h", splits.startswith("d"), splits == "n"
                count = 0 if hinted or told_nothing else int(splits[1:] or 0) if dynamic else int(splits)
                longest = max(lengths) if hinted else 0 if told_nothing else kv
                calls = [kvcache_call(lib, tq, tout, tseq, k, v, options, stream, count, longest, None,
                                      sum(lengths) if hinted else 0, dynamic)
                         for k, v in caches]
                out.fill_(float("nan"))
                calls[0]()
                diff = (out.float() - expected.float()).abs().max().item()
                if not diff <= 2e-2 and not args.no_check:
                    print(f"MISMATCH batch={batch} {label} splits={splits}: max |jitattn - FA2| = {diff}")
                    return 1
                ms = median_ms(lambda i: calls[i % copies](), 50, 5, with_index=True)
                r["ms"][splits] = ms
                r["tbps"][splits] = used_bytes / (ms * 1e-3) / 1e12
                del calls
            rows.append(r)
            span = f"{min(lengths)}-{max(lengths)}"
            print(f"{batch:>5} {label + ' ' + span:>18} | "
                  + " ".join(f"{r['tbps'][s]:9.2f}" for s in splits_list), flush=True)
            del caches
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
