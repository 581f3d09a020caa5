"""Steps the benchmarks share around their timings: a forward call as a closure, checking two ways of computing
the same output agree before either is timed, random sink logits, and writing the rows of results."""
import ctypes
import json

import torch


def forward_call(lib, stream, q, k, v, out, options, lse=None):
    """A closure that runs jitattn_fwd on ctypes tensors (lse: a tensor, or None to skip it)."""
    from jitattn_ctypes import check

    def run():
        check(lib, lib.jitattn_fwd(ctypes.byref(q), ctypes.byref(k), ctypes.byref(v), ctypes.byref(out),
                                   ctypes.byref(lse) if lse is not None else None, ctypes.byref(options), stream))

    return run


def max_difference(first, first_out, second, second_out):
    """Runs first() and second() with their outputs poisoned (NaN and inf) and returns the largest
    |first_out - second_out|: NaN or inf where either left an element unwritten."""
    first_out.fill_(float("nan"))
    second_out.fill_(float("inf"))
    first()
    second()
    return (first_out.float() - second_out.float()).abs().max().item()


def random_sinks(heads, generator):
    """f32 sink logits, one per query head, uniform in [-2, 4] (learnable_sink)."""
    return torch.empty(heads, device="cuda", dtype=torch.float32).uniform_(-2, 4, generator=generator)


def write_json(path, rows):
    """The result rows as JSON at path (nothing when path is empty)."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
