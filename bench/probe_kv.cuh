// Shared by the stand-alone KV-cache copy probes (bench/probe_*.cu): a K and a V buffer
// filled with non-zero bytes (never time on zeros), a one-word sink that keeps the reads, the
// median time of repeated launches, and the decode kernel's chunk copies. Each probe is built
// alone with nvcc.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

// Issues one K chunk and one V chunk of CHUNK_ROWS rows of ROW_BYTES (rows row_stride bytes apart in
// memory, packed in the stage: K, then V) by 16-byte cp.async, the calling warp alone, as
// fwd_decode.cuh's load_chunk does. No commit: the caller groups its copies.
template <int ROW_BYTES, int CHUNK_ROWS>
__device__ __forceinline__ void issue_chunk_copies(unsigned char* stage, const char* k_rows, const char* v_rows,
                                                   long long row_stride, int lane) {
  constexpr int kChunkBytes = ROW_BYTES * CHUNK_ROWS;
  static_assert(kChunkBytes % (16 * 32) == 0, "whole warp passes of 16-byte copies");
#pragma unroll
  for (int j = 0; j < kChunkBytes / 16 / 32; ++j) {
    const int index = j * 32 + lane;
    const int row = index / (ROW_BYTES / 16), piece = index % (ROW_BYTES / 16);
    unsigned char* k_to = stage + row * ROW_BYTES + piece * 16;
    const long long from = row * row_stride + piece * 16;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                     static_cast<unsigned>(__cvta_generic_to_shared(k_to))),
                 "l"(k_rows + from));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                     static_cast<unsigned>(__cvta_generic_to_shared(k_to + kChunkBytes))),
                 "l"(v_rows + from));
  }
}

struct ProbeCache {
  char* k = nullptr;
  char* v = nullptr;
  unsigned* sink = nullptr;  // written only if the kernel's checksum hits a sentinel
  size_t bytes = 0;          // of K, and of V
};

inline ProbeCache make_probe_cache(size_t bytes) {
  ProbeCache cache;
  cache.bytes = bytes;
  if (cudaMalloc(&cache.k, bytes) != cudaSuccess || cudaMalloc(&cache.v, bytes) != cudaSuccess ||
      cudaMalloc(&cache.sink, 4) != cudaSuccess) {
    std::printf("cudaMalloc of 2 x %zu bytes failed\n", bytes);
    std::exit(1);
  }
  cudaMemset(cache.k, 1, bytes);
  cudaMemset(cache.v, 2, bytes);
  return cache;
}

// Median milliseconds of `runs` launches, each timed alone with events, after `warmup`
// untimed ones (so ~1% of launch latency is included). Exits on a launch error.
template <class Launch>
float median_launch_ms(Launch&& launch, int runs = 20, int warmup = 3) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  for (int r = 0; r < warmup + runs; ++r) {
    cudaEventRecord(start);
    launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (r >= warmup) times.push_back(ms);
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    std::printf("launch failed: %s\n", cudaGetErrorString(e));
    std::exit(1);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// TB/s of K and V read.
inline double kv_tbps(const ProbeCache& cache, float ms) { return 2.0 * cache.bytes / (ms * 1e-3) / 1e12; }
