"""KV-cache calls for the benchmarks (torch tensors through the C API): a paged copy of a
contiguous cache, and a forward_kvcache call with its workspace sized and allocated once.
"""
import ctypes

import torch

from jitattn_ctypes import BF16, I32, KVCacheArgs, check, tensor_of


def shuffled_pages(k_cache, v_cache, page, generator, shuffle=True):
    """The rows of contiguous [batch, kv, heads, dim] caches in pages of `page` rows, placed
    in a random order (or, with shuffle False, in order: each sequence's pages side by side):
    (k_pages, v_pages, block_table [batch, kv / page] int32)."""
    batch, kv, heads, dim = k_cache.shape
    pages_per_seq = kv // page
    if shuffle:
        order = torch.randperm(batch * pages_per_seq, device=k_cache.device, generator=generator).to(torch.int32)
    else:
        order = torch.arange(batch * pages_per_seq, device=k_cache.device, dtype=torch.int32)
    table = order.view(batch, pages_per_seq).contiguous()
    k_pages = torch.empty(batch * pages_per_seq, page, heads, dim, device=k_cache.device, dtype=k_cache.dtype)
    v_pages = torch.empty_like(k_pages)
    k_pages[order.long()] = k_cache.reshape(batch * pages_per_seq, page, heads, dim)
    v_pages[order.long()] = v_cache.reshape(batch * pages_per_seq, page, heads, dim)
    return k_pages, v_pages, table


def kvcache_call(lib, tq, tout, tseqlens, k_cache, v_cache, options, stream, num_splits, max_seqlen_k,
                 block_table=None, total_seqlen_k=0, dynamic_splits=False, lse=None):
    """A callable running jitattn_fwd_kvcache (bf16 caches) into tout (and the tensor struct lse, when
    given); raises with the library's message on failure. The workspace is sized and allocated here,
    once."""
    tk, tv = tensor_of(k_cache, BF16), tensor_of(v_cache, BF16)
    ttable = tensor_of(block_table, I32) if block_table is not None else None
    kv_args = KVCacheArgs(ctypes.addressof(tk), ctypes.addressof(tv), ctypes.addressof(tseqlens),
                          ctypes.addressof(ttable) if ttable is not None else None, None, None, None,
                          num_splits, max_seqlen_k, total_seqlen_k, 1 if dynamic_splits else 0)
    size = ctypes.c_size_t(0)
    tlse = ctypes.byref(lse) if lse is not None else None
    check(lib, lib.jitattn_kvcache_workspace_bytes(ctypes.byref(tq), ctypes.byref(kv_args), ctypes.byref(tout), tlse,
                                                   ctypes.byref(options), ctypes.byref(size)))
    workspace = torch.empty(max(size.value, 256), device="cuda", dtype=torch.uint8)

    def run():
        check(lib, lib.jitattn_fwd_kvcache(ctypes.byref(tq), ctypes.byref(kv_args), ctypes.byref(tout), tlse,
                                           ctypes.byref(options), ctypes.c_void_p(workspace.data_ptr()),
                                           ctypes.c_size_t(size.value), stream))
    run.keep = (tk, tv, ttable, kv_args, workspace, lse)  # the C structs must outlive the calls
    return run
