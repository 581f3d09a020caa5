"""GPU timing for the benchmarks (GPU.md's method): CUDA events around a run of
back-to-back launches after a warm-up, the time per call of each run, median in ms.

Timing one call between two events with a synchronize in between would also
count the host's work to launch it (Python, ctypes, planning). Each run starts
with a spin kernel (torch.cuda._sleep, ~1 ms) that holds the GPU while the host
queues the run's calls, so the events measure GPU time even for calls shorter
than their host overhead (decoding at batch 1). Every library compared is timed
the same way; host overheads are measured apart (bench_host overhead).
"""
import statistics

import torch


def median_ms(fn, iters=20, warmup=3, with_index=False, launches=10):
    """Median over `iters` runs of the time per call of `launches` back-to-back calls of fn()
    (or fn(i), i the call's number, to rotate among input buffers)."""
    call = fn if with_index else (lambda _: fn())
    for i in range(warmup):
        call(i)
    torch.cuda.synchronize()
    times = []
    for run in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(2_000_000)  # cycles: ~1 ms, longer than queueing the run's calls
        start.record()
        for i in range(launches):
            call(run * launches + i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / launches)
    return statistics.median(times)
