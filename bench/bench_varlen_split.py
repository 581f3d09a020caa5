"""Varlen batches of an inference engine's step: decoding sequences (one query, or a few for
speculative decoding) and prefill chunks in one packed call, over packed K/V or a paged cache.

jitattn's forward_varlen with a workspace (split-KV where the tiles are few) beside the same call
without one, the same batch over a paged cache (pages of --page rows, shuffled), forward_kvcache
over the same data where every sequence has the same lengths, PyTorch's FlashAttention-2 varlen
kernel (aten._flash_attention_forward with cu_seqlens; it does not split), and the same
forward_varlen from another build of the library (--before-lib, e.g. the last commit's).

A batch is a "+"-joined list of groups NxQxK: N sequences of Q queries over K keys (causal,
bottom-right). bf16, 32 query heads, 8 KV heads (--heads-kv), head_dim 128 (--head-dim). Calls
rotate over copies of K/V adding up to at least 256 MB, so each reads them from HBM. Every output
is compared with PyTorch's math backend per sequence before timing. CUDA events, warm-up, median
(jitattn_timing). TB/s counts the bytes of K and V the sequences use.

  python3 bench/bench_varlen_split.py --lib build/libjitattn.so [--before-lib OLD.so] [--json FILE]
      [--batches 16x1x8192,15x1x8192+1x512x4096,...] [--page 64] [--splits N] [--tiles 64x64x4]

--tiles forces the tiles of every library's call (both builds), e.g. the 4-warp mma.sync tiles that
sm_80 plans, to time them on a Hopper GPU; FA2 and forward_kvcache keep their own.
"""
import argparse
import ctypes
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, I32, VarlenArgs, check, default_options, force_tiles, load, tensor_of  # noqa: E402
from jitattn_kvcache import kvcache_call  # noqa: E402
from jitattn_timing import median_ms  # noqa: E402


def parse_batch(text):
    """[(queries, keys)] per sequence, from "NxQxK+NxQxK..."."""
    sequences = []
    for group in text.split("+"):
        n, q, k = (int(x) for x in group.split("x"))
        sequences += [(q, k)] * n
    return sequences


def paged(k, v, seqlens_k, cu_k, page, generator):
    """Packed K/V rows of each sequence in shuffled pages of `page` rows: (k_pages, v_pages,
    block_table [batch, max_pages] int32)."""
    counts = [-(-n // page) for n in seqlens_k]
    max_pages, total = max(1, max(counts)), sum(counts)
    order = torch.randperm(total, generator=generator, device="cpu").tolist()
    heads, dim = k.shape[1], k.shape[2]
    k_pages = torch.zeros(total, page, heads, dim, device="cuda", dtype=k.dtype)
    v_pages = torch.zeros_like(k_pages)
    table = torch.zeros(len(seqlens_k), max_pages, dtype=torch.int32)
    next_page = 0
    for b, n in enumerate(seqlens_k):
        for p in range(counts[b]):
            page_id = order[next_page]
            next_page += 1
            table[b, p] = page_id
            rows = slice(cu_k[b] + p * page, cu_k[b] + min(n, (p + 1) * page))
            k_pages[page_id, :rows.stop - rows.start] = k[rows]
            v_pages[page_id, :rows.stop - rows.start] = v[rows]
    return k_pages, v_pages, table.cuda()


class VarlenCall:
    """jitattn_fwd_varlen_split (or jitattn_fwd_varlen) of one packed batch into `out`."""

    def __init__(self, lib, q, k, v, out, cu_q, cu_k, max_q, max_k, stream, num_splits=0, block_table=None,
                 workspace=True, pack_gqa=-1, tiles=""):
        self.lib, self.stream, self.workspace_call = lib, stream, workspace
        self.tq, self.tk, self.tv, self.tout = (tensor_of(q, BF16), tensor_of(k, BF16), tensor_of(v, BF16),
                                                tensor_of(out, BF16))
        self.tcu_q, self.tcu_k = tensor_of(cu_q, I32), tensor_of(cu_k, I32)
        self.ttable = tensor_of(block_table, I32) if block_table is not None else None
        self.args = VarlenArgs(ctypes.addressof(self.tcu_q), ctypes.addressof(self.tcu_k), None,
                               ctypes.addressof(self.ttable) if self.ttable is not None else None, max_q, max_k)
        self.options = default_options(lib)
        self.options.causal = 1
        self.options.num_splits = num_splits
        self.options.pack_gqa = pack_gqa
        force_tiles(self.options, tiles)
        self.size = ctypes.c_size_t(0)
        if workspace:
            check(lib, lib.jitattn_fwd_varlen_workspace_bytes(
                ctypes.byref(self.tq), ctypes.byref(self.tk), ctypes.byref(self.tv), ctypes.byref(self.tout), None,
                ctypes.byref(self.args), ctypes.byref(self.options), ctypes.byref(self.size)))
        self.buffer = torch.empty(max(self.size.value, 256), device="cuda", dtype=torch.uint8)

    def __call__(self):
        if self.workspace_call:
            check(self.lib, self.lib.jitattn_fwd_varlen_split(
                ctypes.byref(self.tq), ctypes.byref(self.tk), ctypes.byref(self.tv), ctypes.byref(self.tout), None,
                ctypes.byref(self.args), ctypes.byref(self.options), ctypes.c_void_p(self.buffer.data_ptr()),
                ctypes.c_size_t(self.size.value), self.stream))
        else:
            check(self.lib, self.lib.jitattn_fwd_varlen(
                ctypes.byref(self.tq), ctypes.byref(self.tk), ctypes.byref(self.tv), ctypes.byref(self.tout), None,
                ctypes.byref(self.tcu_q), ctypes.byref(self.tcu_k), None, self.args.max_seqlen_q,
                self.args.max_seqlen_k, ctypes.byref(self.options), self.stream))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libjitattn.so")
    parser.add_argument("--before-lib", help="another build's library: its forward_varlen (no workspace) is timed too")
    parser.add_argument("--json")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--heads-kv", type=int, default=8)
    parser.add_argument("--page", type=int, default=64)
    parser.add_argument("--splits", type=int, default=0, help="options.num_splits of the split calls (0: heuristic)")
    parser.add_argument("--pack-gqa", type=int, default=-1, help="options.pack_gqa of this library's calls "
                                                                "(-1: the planner's, 0 off, 1 on)")
    parser.add_argument("--tiles", default="", help="force the tiles of this library's and --before-lib's calls "
                                                   "(jitattn_ctypes.force_tiles: 64x64x4, 128x128x8x2w, ...)")
    parser.add_argument("--batches", default="1x1x32768,16x1x8192,64x1x4096,4x8x8192,15x1x8192+1x512x4096,"
                                             "60x1x2048+2x256x2048,2x2048x2048")
    args = parser.parse_args()
    lib = load(args.lib)
    before = load(args.before_lib) if args.before_lib else None
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    heads_q, heads_kv, head_dim = 32, args.heads_kv, args.head_dim
    print(f"jitattn {lib.jitattn_version().decode()} | torch {torch.__version__} | {torch.cuda.get_device_name()}")
    print(f"heads {heads_q}/{heads_kv}, head_dim {head_dim}, causal, pages of {args.page}, "
          f"num_splits {args.splits or 'heuristic'}, pack_gqa {args.pack_gqa}, tiles {args.tiles or 'planned'}")
    print(f"{'batch':>24} | {'split':>7} {'paged':>7} {'no ws':>7} {'before':>7} {'kvcache':>7} {'fa2':>7} ms | "
          f"{'split':>5} TB/s | {'no ws':>6} {'before':>6} {'fa2':>6} / split")
    rows = []
    for text in args.batches.split(","):
        sequences = parse_batch(text)
        seqlens_q = [q for q, _ in sequences]
        seqlens_k = [k for _, k in sequences]
        cu_q = [0]
        cu_k = [0]
        for q, k in sequences:
            cu_q.append(cu_q[-1] + q)
            cu_k.append(cu_k[-1] + k)
        total_q, total_k = cu_q[-1], cu_k[-1]
        kv_bytes = total_k * heads_kv * head_dim * 2 * 2
        copies = max(1, min(64, -(-(256 << 20) // kv_bytes)))
        gen = torch.Generator(device="cuda").manual_seed(total_q * 7 + total_k)
        q = torch.randn(total_q, heads_q, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        kvs = [(torch.randn(total_k, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen),
                torch.randn(total_k, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen))
               for _ in range(copies)]
        out = torch.empty_like(q)
        cu_q_t = torch.tensor(cu_q, device="cuda", dtype=torch.int32)
        cu_k_t = torch.tensor(cu_k, device="cuda", dtype=torch.int32)
        max_q, max_k = max(seqlens_q), max(seqlens_k)
        call = lambda library, k, v, **kw: VarlenCall(library, q, k, v, out, cu_q_t, cu_k_t, max_q, max_k, stream,
                                                      tiles=args.tiles, **kw)
        split_calls = [call(lib, k, v, num_splits=args.splits, pack_gqa=args.pack_gqa) for k, v in kvs]
        plain_calls = [call(lib, k, v, workspace=False, pack_gqa=args.pack_gqa) for k, v in kvs]
        before_calls = [call(before, k, v, workspace=False) for k, v in kvs] if before else None
        cpu_gen = torch.Generator().manual_seed(total_k)
        pages = [paged(k, v, seqlens_k, cu_k, args.page, cpu_gen) for k, v in kvs]
        paged_calls = [call(lib, kp, vp, num_splits=args.splits, block_table=table, pack_gqa=args.pack_gqa)
                       for kp, vp, table in pages]
        uniform = len(set(sequences)) == 1
        cache_calls = None
        if uniform:  # the packed rows are a contiguous [batch, K, heads, dim] cache
            batch, (sq, kv) = len(sequences), sequences[0]
            q4, out4 = q.view(batch, sq, heads_q, head_dim), out.view(batch, sq, heads_q, head_dim)
            tq4, tout4 = tensor_of(q4, BF16), tensor_of(out4, BF16)
            seqlens = torch.full((batch,), kv, device="cuda", dtype=torch.int32)
            tseq = tensor_of(seqlens, I32)
            cache_options = default_options(lib)
            cache_options.causal = 1
            cache_calls = [kvcache_call(lib, tq4, tout4, tseq, k.view(batch, kv, heads_kv, head_dim),
                                        v.view(batch, kv, heads_kv, head_dim), cache_options, stream, 0, kv)
                           for k, v in kvs]

        def fa2(i):
            k, v = kvs[i % copies]
            return torch.ops.aten._flash_attention_forward(q, k, v, cu_q_t, cu_k_t, max_q, max_k, 0.0, True, False)

        # Per-sequence reference (math backend, fp32), then every call's output against it.
        reference = torch.empty(total_q, heads_q, head_dim, device="cuda", dtype=torch.float32)
        k0, v0 = kvs[0]
        for b, (sq, kv) in enumerate(sequences):
            qb = q[cu_q[b]:cu_q[b + 1]].transpose(0, 1).float()[None]
            kb = k0[cu_k[b]:cu_k[b + 1]].transpose(0, 1).float()[None]
            vb = v0[cu_k[b]:cu_k[b + 1]].transpose(0, 1).float()[None]
            mask = torch.arange(kv, device="cuda")[None, :] <= torch.arange(sq, device="cuda")[:, None] + (kv - sq)
            with sdpa_kernel(SDPBackend.MATH):
                rb = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, enable_gqa=True)
            reference[cu_q[b]:cu_q[b + 1]] = rb[0].transpose(0, 1)
        labelled = [("split", split_calls[0]), ("paged", paged_calls[0]), ("no ws", plain_calls[0])]
        labelled += [("before", before_calls[0])] if before_calls else []
        labelled += [("kvcache", cache_calls[0])] if cache_calls else []
        for label, run in labelled:
            out.fill_(float("nan"))
            run()
            diff = (out.float() - reference).abs().max().item()
            if not diff <= 2e-2:
                print(f"MISMATCH {text} {label}: max |jitattn - reference| = {diff}")
                return 1
        fa2_ok = True
        try:
            diff = (fa2(0)[0].float() - reference).abs().max().item()
            if not diff <= 2e-2:
                print(f"  fa2 mismatch {diff}: not timed")
                fa2_ok = False
        except RuntimeError as error:
            print(f"  fa2 unavailable: {str(error).splitlines()[0]}")
            fa2_ok = False
        r = {"batch": text, "heads_kv": heads_kv, "head_dim": head_dim, "page": args.page,
             "workspace_bytes": split_calls[0].size.value}
        r["split_ms"] = median_ms(lambda i: split_calls[i % copies](), 30, 5, with_index=True)
        r["paged_ms"] = median_ms(lambda i: paged_calls[i % copies](), 30, 5, with_index=True)
        r["no_workspace_ms"] = median_ms(lambda i: plain_calls[i % copies](), 30, 5, with_index=True)
        r["before_ms"] = median_ms(lambda i: before_calls[i % copies](), 30, 5, with_index=True) if before_calls else None
        r["kvcache_ms"] = median_ms(lambda i: cache_calls[i % copies](), 30, 5, with_index=True) if cache_calls else None
        r["fa2_ms"] = median_ms(fa2, 30, 5, with_index=True) if fa2_ok else None
        r["split_tbps"] = kv_bytes / (r["split_ms"] * 1e-3) / 1e12
        rows.append(r)
        f = lambda x: f"{x:7.3f}" if x else "      -"
        ratio = lambda key: f"{r[key] / r['split_ms']:5.2f}x" if r[key] else "     -"
        print(f"{text:>24} | {f(r['split_ms'])} {f(r['paged_ms'])} {f(r['no_workspace_ms'])} {f(r['before_ms'])} "
              f"{f(r['kvcache_ms'])} {f(r['fa2_ms'])}    | {r['split_tbps']:5.2f}      | "
              f"{ratio('no_workspace_ms')} {ratio('before_ms')} {ratio('fa2_ms')}", flush=True)
        del kvs, pages, split_calls, plain_calls, paged_calls, before_calls, cache_calls
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fp:
            json.dump(rows, fp, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
