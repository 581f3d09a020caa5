"""GPU timing for the benchmarks: CUDA events around single calls after a warm-up, median in ms."""
import statistics

import torch


def median_ms(fn, iters=20, warmup=3, with_index=False):
    """Median time of fn() (or fn(i), i the call's number, to rotate among input buffers)."""
    call = fn if with_index else (lambda _: fn())
    for i in range(warmup):
        call(i)
    times = []
    for i in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
