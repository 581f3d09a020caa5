// Does the way a CTA groups its KV-cache copies change how fast 128 CTAs stream a
// [B, S, Hk, 128] bf16 cache (one CTA per (sequence, KV head), 256-byte rows 2 KB apart)?
//
//  mode 0: the decode kernel's pattern: 4 warps, each streaming its own 32-row K + V chunks
//          (chunks w, w + 4, ...) through 2 stages of its own, synchronising only within the warp.
//  mode 1: cuDNN's decode pattern at batch 16 (read off its SASS with ncu): the whole CTA copies
//          one BLOCK-row K block, then the same rows of V, into two buffers used in turn:
//          wait K_i, use it, refill its buffer with K_{i+1}; wait V_i, use it, refill with V_{i+1}.
//          At most two blocks (2 × BLOCK × 256 bytes) are in flight.
//  mode 2: as mode 1 with BUFFERS (an even number) buffers: K and V of BUFFERS / 2 blocks ahead.
//  modes 3, 4, 5: modes 0, 1, 2 with the copies in cuDNN's order: the first 128 bytes of every row of
//          the chunk or block, then the second 128 bytes of every row.
// DELAY cycles of spinning per block half (K or V) stand in for the attention math.
// Measured on the H200 under ncu at 16 x 8 x 32k (docs/PERFORMANCE.md, 2026-11-23): modes 0, 3 and 5
// as fast as cuDNN's kernel (463-466 us), mode 2 2% and mode 1 6% slower.
//
//   nvcc -O3 -arch=sm_90a -o /tmp/probe_pingpong bench/probe_stream_pingpong.cu
//   /tmp/probe_pingpong BATCH HEADS SEQLEN MODE BLOCK BUFFERS DELAY
// Prints TB/s of K+V read (median of 20 launches).
#include <cstdio>
#include <cstdlib>

#include "../templates/ptx.cuh"  // the kernels' own PTX wrappers
#include "probe_kv.cuh"
using namespace jitattn;

constexpr int kRowBytes = 256, kThreads = 128;

__device__ __forceinline__ void spin(int delay) {
  if (delay) {
    const long long t0 = clock64();
    while (clock64() - t0 < delay) {
    }
  }
}

// Copies rows [row0, row0 + rows) of one head (rows `stride` bytes apart) with `threads` threads
// (thread t of them), 16 bytes per copy. Row order: consecutive threads cover a row. Panel order
// (cuDNN's): the first 128 bytes of every row, then the second 128 bytes of every row.
// ROWS and THREADS are constants so that the piece arithmetic is shifts.
template <bool PANELS, int ROWS, int THREADS>
__device__ __forceinline__ void copy_rows(unsigned char* dst, const char* src, long long row0, long long stride,
                                          int t) {
  constexpr int kPieces = kRowBytes / 16, kPanelPieces = 8, rows = ROWS;
#pragma unroll
  for (int piece = t; piece < rows * kPieces; piece += THREADS) {
    const int panel = piece / (rows * kPanelPieces), in_panel = piece % (rows * kPanelPieces);
    const int r = PANELS ? in_panel / kPanelPieces : piece / kPieces;
    const int c = PANELS ? panel * kPanelPieces + in_panel % kPanelPieces : piece % kPieces;
    cp_async_16(smem_u32(dst + piece * 16), src + (row0 + r) * stride + c * 16, true);
  }
}

template <bool PANELS>
__global__ void __launch_bounds__(kThreads) per_warp(const char* k, const char* v, int heads, int seqlen, int delay,
                                                     unsigned* sink) {
  constexpr int kChunkRows = 32, kChunkBytes = kChunkRows * kRowBytes, kWarps = kThreads / 32, kStages = 2;
  extern __shared__ __align__(1024) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long stride = static_cast<long long>(heads) * kRowBytes;
  const long long base = (static_cast<long long>(blockIdx.x / heads) * seqlen * heads + blockIdx.x % heads) * kRowBytes;
  unsigned char* stages = smem + warp * kStages * 2 * kChunkBytes;
  const int chunks = seqlen / kChunkRows;
  const int count = warp < chunks ? (chunks - warp + kWarps - 1) / kWarps : 0;
  auto issue = [&](int i) {
    unsigned char* stage = stages + (i % kStages) * 2 * kChunkBytes;
    const long long row0 = static_cast<long long>(warp + i * kWarps) * kChunkRows;
    copy_rows<PANELS, kChunkRows, 32>(stage, k + base, row0, stride, lane);
    copy_rows<PANELS, kChunkRows, 32>(stage + kChunkBytes, v + base, row0, stride, lane);
  };
  if (count > 0) issue(0);
  cp_async_commit();
  unsigned acc = 0;
  for (int i = 0; i < count; ++i) {
    __syncwarp();
    if (i + 1 < count) issue(i + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncwarp();
    const unsigned char* stage = stages + (i % kStages) * 2 * kChunkBytes;
    acc ^= *reinterpret_cast<const unsigned*>(stage + lane * 256) ^
           *reinterpret_cast<const unsigned*>(stage + kChunkBytes + lane * 256);
    spin(2 * delay);
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

// BUFFERS buffers of BLOCK rows: K_i in buffer 2 (i mod BUFFERS/2), V_i in the next one.
template <bool PANELS, int BLOCK>
__global__ void __launch_bounds__(kThreads) cta_blocks(const char* k, const char* v, int heads, int seqlen,
                                                       int buffers, int delay, unsigned* sink) {
  constexpr int block = BLOCK;
  extern __shared__ __align__(1024) unsigned char smem[];
  const long long stride = static_cast<long long>(heads) * kRowBytes;
  const long long base = (static_cast<long long>(blockIdx.x / heads) * seqlen * heads + blockIdx.x % heads) * kRowBytes;
  const int block_bytes = block * kRowBytes, ahead = buffers / 2;
  const int count = seqlen / block;
  auto buffer = [&](int i, int which) { return smem + ((i % ahead) * 2 + which) * block_bytes; };
  // Groups are committed in the order K_0, V_0, K_1, V_1, ...; one group per half, empty past the end.
  auto issue = [&](int i, int which) {
    if (i < count) {
      copy_rows<PANELS, BLOCK, kThreads>(buffer(i, which), which ? v + base : k + base,
                                         static_cast<long long>(i) * block, stride, threadIdx.x);
    }
    cp_async_commit();
  };
  for (int i = 0; i < ahead; ++i) {
    issue(i, 0);
    issue(i, 1);
  }
  unsigned acc = 0;
  for (int i = 0; i < count; ++i) {
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      // Groups issued after this half's: the other half of this block and both of the next ahead - 1.
      if (ahead == 1) cp_async_wait<1>(); else if (ahead == 2) cp_async_wait<3>(); else cp_async_wait<5>();
      __syncthreads();
      acc ^= *reinterpret_cast<const unsigned*>(buffer(i, which) + (threadIdx.x % 32) * 256);
      spin(delay);
      __syncthreads();
      issue(i + ahead, which);
    }
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

int main(int argc, char** argv) {
  if (argc != 8) {
    std::printf("usage: %s BATCH HEADS SEQLEN MODE BLOCK BUFFERS DELAY\n", argv[0]);
    return 2;
  }
  const int batch = atoi(argv[1]), heads = atoi(argv[2]), seqlen = atoi(argv[3]), mode = atoi(argv[4]),
            block = atoi(argv[5]), buffers = mode % 3 == 1 ? 2 : atoi(argv[6]), delay = atoi(argv[7]);
  if (mode % 3 != 0 && (buffers < 2 || buffers > 6 || buffers % 2)) {
    std::printf("BUFFERS must be 2, 4 or 6\n");
    return 2;
  }
  const ProbeCache cache = make_probe_cache(static_cast<size_t>(batch) * seqlen * heads * kRowBytes);
  const int grid = batch * heads;
  const int smem = mode % 3 == 0 ? 4 * 2 * 2 * 32 * kRowBytes : buffers * block * kRowBytes;
  const bool panels = mode >= 3;
  auto warp_kernel = panels ? per_warp<true> : per_warp<false>;
  if (mode % 3 != 0 && block != 64 && block != 128 && block != 256) {
    std::printf("BLOCK must be 64, 128 or 256\n");
    return 2;
  }
  auto block_kernel = block == 64 ? (panels ? cta_blocks<true, 64> : cta_blocks<false, 64>)
                      : block == 128 ? (panels ? cta_blocks<true, 128> : cta_blocks<false, 128>)
                                     : (panels ? cta_blocks<true, 256> : cta_blocks<false, 256>);
  cudaFuncSetAttribute(warp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(block_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const float ms = median_launch_ms([&] {
    if (mode % 3 == 0) {
      warp_kernel<<<grid, kThreads, smem>>>(cache.k, cache.v, heads, seqlen, delay, cache.sink);
    } else {
      block_kernel<<<grid, kThreads, smem>>>(cache.k, cache.v, heads, seqlen, buffers, delay, cache.sink);
    }
  });
  std::printf("mode %d block %d buffers %d delay %d: batch %d heads %d seqlen %d: %.4f ms, %.2f TB/s\n", mode, block,
              mode % 3 == 0 ? 0 : buffers, delay, batch, heads, seqlen, ms, kv_tbps(cache, ms));
}
