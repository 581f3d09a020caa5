// Does the order in which CTAs read a [B, S, Hk, 128] bf16 KV cache change how fast it streams?
//  layout 0: CTA per (batch, head), batch-major: 256-byte rows 2 KB apart (the decode kernel's grid)
//  layout 2: the same CTAs in head-major order
//  layout 1: CTA per contiguous range of whole rows (all heads), any grid size
// 4 warps, each streaming its own 8 KB K + 8 KB V chunks through 2 cp.async stages;
// DELAY cycles of spinning per chunk model the attention math. Measured on the H200
// (docs/PERFORMANCE.md, 2026-11-23): every layout within 1%, and 1000 cycles of delay cost nothing.
//
//   nvcc -O3 -arch=sm_90a -o /tmp/probe_order bench/probe_stream_order.cu
//   /tmp/probe_order BATCH HEADS SEQLEN LAYOUT GRID DELAY      (GRID is used by layout 1 only)
#include <cstdio>
#include <cstdlib>

#include "../templates/ptx.cuh"  // the kernels' own PTX wrappers
#include "probe_kv.cuh"
using namespace jitattn;
constexpr int kChunk = 8192, kWarps = 4, kStages = 2;
template <int layout>
__global__ void __launch_bounds__(128) stream(const char* k, const char* v, int heads, int seqlen, long long total_rows,
                                             int grid, int delay, unsigned* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned char* st = smem + warp * kStages * 2 * kChunk;
  // piece p (16 B) of chunk c: address
  long long chunk_rows;  // rows per chunk
  long long row_bytes, row_stride, base_row, rows;
  if (layout != 1) {
    const int b = layout == 0 ? blockIdx.x / heads : blockIdx.x % (gridDim.x / heads);
    const int h = layout == 0 ? blockIdx.x % heads : blockIdx.x / (gridDim.x / heads);
    row_bytes = 256; row_stride = heads * 256LL; rows = seqlen;
    base_row = (long long)b * seqlen * heads * 256 + h * 256;  // byte offset
  } else {
    row_bytes = heads * 256LL; row_stride = row_bytes;
    const long long first = total_rows * blockIdx.x / grid, last = total_rows * (blockIdx.x + 1) / grid;
    rows = last - first; base_row = first * row_bytes;
  }
  chunk_rows = kChunk / row_bytes;
  const long long chunks = rows / chunk_rows;
  const long long count = warp < chunks ? (chunks - warp + kWarps - 1) / kWarps : 0;
  const int pieces_per_row = layout != 1 ? 16 : 128;
  auto issue = [&](long long i) {
    const long long c = warp + i * kWarps;
    unsigned char* s = st + (i % kStages) * 2 * kChunk;
    for (int j = lane; j < kChunk / 16; j += 32) {
      const long long r = j / pieces_per_row, pc = j % pieces_per_row;
      const long long off = base_row + (c * chunk_rows + r) * row_stride + pc * 16;
      cp_async_16(smem_u32(s + j * 16), k + off, true);
      cp_async_16(smem_u32(s + kChunk + j * 16), v + off, true);
    }
    cp_async_commit();
  };
  if (count > 0) issue(0); else cp_async_commit();
  unsigned acc = 0;
  for (long long i = 0; i < count; ++i) {
    __syncwarp();
    if (i + 1 < count) issue(i + 1); else cp_async_commit();
    cp_async_wait<1>();
    __syncwarp();
    const unsigned char* s = st + (i % kStages) * 2 * kChunk;
    acc ^= *(const unsigned*)(s + lane * 256) ^ *(const unsigned*)(s + kChunk + lane * 256);
    if (delay) { long long t0 = clock64(); while (clock64() - t0 < delay) {} }
  }
  if (acc == 0x12345678u) sink[0] = acc;
}
int main(int argc, char** argv) {
  if (argc != 7) { std::printf("usage: %s BATCH HEADS SEQLEN LAYOUT GRID DELAY\n", argv[0]); return 2; }
  const int batch = atoi(argv[1]), heads = atoi(argv[2]), seqlen = atoi(argv[3]), layout = atoi(argv[4]), grid_arg = atoi(argv[5]),
            delay = atoi(argv[6]);
  const ProbeCache cache = make_probe_cache((size_t)batch * seqlen * heads * 256);
  const int grid = layout != 1 ? batch * heads : grid_arg;
  auto kernel = layout == 0 ? stream<0> : layout == 1 ? stream<1> : stream<2>;
  const int smem = kWarps * kStages * 2 * kChunk;
  { cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); if (e) std::printf("attr: %s\n", cudaGetErrorString(e)); }
  const float ms = median_launch_ms([&] {
    kernel<<<grid, 128, smem>>>(cache.k, cache.v, heads, seqlen, (long long)batch * seqlen, grid, delay, cache.sink);
  });
  std::printf("layout %d grid %d delay %d: batch %d heads %d seqlen %d: %.4f ms, %.2f TB/s\n", layout, grid, delay, batch, heads,
              seqlen, ms, kv_tbps(cache, ms));
}
