// Two patterns of the prefill kernels that compute-sanitizer's synccheck reported (run 194,
// docs/measurements/2026-11-25-gpu-suite-parallel-and-sanitizers.txt), reduced to one small
// kernel each, correct by construction and checked on the host, to tell the tool's limits from
// real faults.
//
// Modes 0-2: does synccheck understand cp.async copies whose completion is tracked on an
// mbarrier? The prefill producer (templates/fwd_pipeline.cuh) copies some
// blocks with every producer thread's cp.async and signals the stage's barrier, whose
// expected count is 1 (the tensor-copy path's single arrival), like this:
//
//   mode 0 (the producer's): each thread cp.async.mbarrier.arrive WITHOUT .noinc (adds a
//          pending arrival, then arrives once its copies land: net zero), a named barrier
//          among the copying threads, then one ordinary arrival from thread 0.
//   mode 1: each thread cp.async.mbarrier.arrive.noinc, expected count = copying threads.
//   mode 2: each thread cp.async.wait_all, then an ordinary arrival; expected count =
//          copying threads (no asynchronous arrival at all).
//
// Modes 3 and 4: a CTA-wide barrier reached from two call sites, chosen by a condition that is
// uniform within each warp but not across the CTA (the 4-warp mma.sync kernel's idle warps):
//   mode 3: __syncthreads() at both sites;
//   mode 4: `bar.sync 0, 256` (inline PTX) at both sites. PTX requires barrier.sync.aligned to be
//          reached by every thread of a warp at the same instruction, which each warp does.
//
// One CTA: warps 0-3 copy ITERS blocks of 128 × 16 bytes through a ring of two stages,
// warps 4-7 wait for each block on its stage's "landed" barrier, sum it, and free the stage.
// The sums are checked on the host, so a mode that is wrong fails without the sanitizer.
//
//   nvcc -O3 -arch=sm_90a -o probe_synccheck bench/probe_synccheck.cu
//   compute-sanitizer --tool synccheck ./probe_synccheck MODE
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../templates/ptx.cuh"  // the kernels' own PTX wrappers
using namespace jitattn;

constexpr int kCopyThreads = 128, kThreads = 256, kStages = 2, kIters = 64;
constexpr int kBlockWords = kCopyThreads * 4;  // 16 bytes a copying thread

__global__ void __launch_bounds__(kThreads) ring(const unsigned* source, unsigned* sums, int mode) {
  __shared__ __align__(128) unsigned stages[kStages][kBlockWords];
  __shared__ __align__(8) unsigned long long landed[kStages], free_[kStages];
  const int t = threadIdx.x;
  if (t == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(smem_u32(&landed[s]), mode == 0 ? 1 : kCopyThreads);
      mbarrier_init(smem_u32(&free_[s]), kThreads - kCopyThreads);
    }
  }
  __syncthreads();
  if (t < kCopyThreads) {
    for (int i = 0; i < kIters; ++i) {
      const int s = i % kStages;
      if (i >= kStages) mbarrier_wait(smem_u32(&free_[s]), (i / kStages - 1) & 1);
      cp_async_16(smem_u32(&stages[s][t * 4]), source + (static_cast<long long>(i) * kBlockWords + t * 4), true);
      const unsigned barrier = smem_u32(&landed[s]);
      if (mode == 0) {
        cp_async_mbarrier_track(barrier);
        cp_async_commit();
        named_barrier_sync<1, kCopyThreads>();
        if (t == 0) mbarrier_arrive(barrier);
      } else if (mode == 1) {
        cp_async_mbarrier_arrive(barrier);
        cp_async_commit();
      } else {
        cp_async_commit();
        cp_async_wait<0>();
        mbarrier_arrive(barrier);
      }
    }
    cp_async_wait<0>();
  } else {
    const int c = t - kCopyThreads;
    unsigned sum = 0;
    for (int i = 0; i < kIters; ++i) {
      const int s = i % kStages;
      mbarrier_wait(smem_u32(&landed[s]), (i / kStages) & 1);
      for (int w = 0; w < 4; ++w) sum += stages[s][c * 4 + w];
      mbarrier_arrive(smem_u32(&free_[s]));
    }
    sums[c] = sum;
  }
}

// Warps 0-3 write a block, every warp waits, warps 4-7 read it, every warp waits; ITERS times.
template <bool kInlineBarrier>
__global__ void __launch_bounds__(kThreads) two_sites(const unsigned* source, unsigned* sums) {
  __shared__ unsigned block[kBlockWords];
  const int t = threadIdx.x, warp = t / 32;
  auto barrier = [] {
    if constexpr (kInlineBarrier) {
      named_barrier_sync<0, kThreads>();
    } else {
      __syncthreads();
    }
  };
  unsigned sum = 0;
  for (int i = 0; i < kIters; ++i) {
    if (warp < 4) {  // uniform within each warp
      for (int w = 0; w < 4; ++w) block[t * 4 + w] = source[static_cast<long long>(i) * kBlockWords + t * 4 + w];
      barrier();
    } else {
      barrier();
      for (int w = 0; w < 4; ++w) sum += block[(t - kCopyThreads) * 4 + w];
    }
    barrier();  // the block is read before the next one overwrites it
  }
  if (t >= kCopyThreads) sums[t - kCopyThreads] = sum;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::printf("usage: %s MODE (0: track + one arrival, 1: noinc, 2: wait then arrive, 3: __syncthreads at two "
                "sites, 4: bar.sync at two sites)\n", argv[0]);
    return 2;
  }
  const int mode = atoi(argv[1]);
  std::vector<unsigned> host(static_cast<size_t>(kIters) * kBlockWords);
  unsigned state = 12345u;
  for (unsigned& word : host) word = (state = state * 1664525u + 1013904223u) >> 8;
  std::vector<unsigned> expected(kCopyThreads, 0u);
  for (int i = 0; i < kIters; ++i)
    for (int c = 0; c < kCopyThreads; ++c)
      for (int w = 0; w < 4; ++w) expected[c] += host[static_cast<size_t>(i) * kBlockWords + c * 4 + w];
  unsigned *source = nullptr, *sums = nullptr;
  cudaMalloc(&source, host.size() * sizeof(unsigned));
  cudaMalloc(&sums, kCopyThreads * sizeof(unsigned));
  cudaMemcpy(source, host.data(), host.size() * sizeof(unsigned), cudaMemcpyHostToDevice);
  cudaMemset(sums, 0xff, kCopyThreads * sizeof(unsigned));  // poisoned
  if (mode == 3) {
    two_sites<false><<<1, kThreads>>>(source, sums);
  } else if (mode == 4) {
    two_sites<true><<<1, kThreads>>>(source, sums);
  } else {
    ring<<<1, kThreads>>>(source, sums, mode);
  }
  const cudaError_t error = cudaDeviceSynchronize();
  std::vector<unsigned> got(kCopyThreads);
  cudaMemcpy(got.data(), sums, kCopyThreads * sizeof(unsigned), cudaMemcpyDeviceToHost);
  int wrong = 0;
  for (int c = 0; c < kCopyThreads; ++c) wrong += got[c] != expected[c];
  std::printf("mode %d: %s, %d of %d sums wrong\n", mode, cudaGetErrorString(error), wrong, kCopyThreads);
  return error != cudaSuccess || wrong != 0;
}
