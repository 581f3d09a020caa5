// How fast can one CTA per (sequence, KV head) stream a KV cache, and does it
// depend on how the copies are issued? A probe for the decode kernel's
// memory side, with no attention math: each CTA reads its head's K and V rows
// (row r of head h at [b][r][h][:], 256-byte rows 2 KB apart, as in a
// [B, S, Hk, 128] bf16 cache) into a per-warp pipeline of 32-row chunks, the
// decode kernel's pattern, and only touches one word per chunk.
//
//   mode 0: 16-byte cp.async (what fwd_decode.cuh issues: 16 per lane per K chunk)
//   mode 1: one cp.async.bulk per 256-byte row (one K and one V row per lane),
//           completion counted by an mbarrier per stage
//
// Build and run on the GPU host:
//   nvcc -O3 -arch=sm_90a -o /tmp/probe bench/probe_stream_bandwidth.cu
//   /tmp/probe BATCH HEADS SEQLEN STAGES MODE
// Prints TB/s of K+V read (median of 20 runs).
#include <cstdio>
#include <cstdlib>

#include "probe_kv.cuh"

constexpr int kHeadDim = 128;
constexpr int kRowBytes = kHeadDim * 2;
constexpr int kChunkRows = 32;
constexpr int kChunkBytes = kChunkRows * kRowBytes;  // one K or V chunk
constexpr int kWarps = 4;

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

template <int MODE, int STAGES>
__global__ void __launch_bounds__(kWarps * 32) stream_kv(const char* k, const char* v, int heads, int seqlen,
                                                          unsigned* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) unsigned long long barriers[kWarps][STAGES];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int batch = blockIdx.x / heads, head = blockIdx.x % heads;
  const long long row_stride = static_cast<long long>(heads) * kRowBytes;
  const char* k_head = k + (static_cast<long long>(batch) * seqlen * heads + head) * kRowBytes;
  const char* v_head = v + (static_cast<long long>(batch) * seqlen * heads + head) * kRowBytes;
  unsigned char* stages = smem + warp * STAGES * 2 * kChunkBytes;
  const int chunks = seqlen / kChunkRows;
  const int count = warp < chunks ? (chunks - warp + kWarps - 1) / kWarps : 0;

  if (MODE == 1) {
    if (lane < STAGES) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(&barriers[warp][lane])));
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncwarp();
  }

  auto issue = [&](int i) {
    const int chunk = warp + i * kWarps;
    unsigned char* stage = stages + (i % STAGES) * 2 * kChunkBytes;
    const char* k_rows = k_head + static_cast<long long>(chunk) * kChunkRows * row_stride;
    const char* v_rows = v_head + static_cast<long long>(chunk) * kChunkRows * row_stride;
    if (MODE == 0) {
#pragma unroll
      for (int j = 0; j < kChunkBytes / 16 / 32; ++j) {
        const int index = j * 32 + lane;
        const int row = index / (kRowBytes / 16), piece = index % (kRowBytes / 16);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(stage + row * kRowBytes + piece * 16)),
                     "l"(k_rows + row * row_stride + piece * 16));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                         smem_u32(stage + kChunkBytes + row * kRowBytes + piece * 16)),
                     "l"(v_rows + row * row_stride + piece * 16));
      }
      asm volatile("cp.async.commit_group;\n" ::);
    } else {
      const unsigned barrier = smem_u32(&barriers[warp][i % STAGES]);
      if (lane == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(2 * kChunkBytes)
                     : "memory");
      }
      __syncwarp();
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
              smem_u32(stage + lane * kRowBytes)),
          "l"(k_rows + lane * row_stride), "n"(kRowBytes), "r"(barrier)
          : "memory");
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
              smem_u32(stage + kChunkBytes + lane * kRowBytes)),
          "l"(v_rows + lane * row_stride), "n"(kRowBytes), "r"(barrier)
          : "memory");
    }
  };

  unsigned acc = 0;
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < count) issue(i);
    else if (MODE == 0) asm volatile("cp.async.commit_group;\n" ::);
  }
  for (int i = 0; i < count; ++i) {
    __syncwarp();
    if (i + STAGES - 1 < count) issue(i + STAGES - 1);
    else if (MODE == 0) asm volatile("cp.async.commit_group;\n" ::);
    if (MODE == 0) {
      asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1) : "memory");
    } else {
      const unsigned barrier = smem_u32(&barriers[warp][i % STAGES]);
      const unsigned parity = (i / STAGES) & 1;
      unsigned done = 0;
      while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
            : "=r"(done)
            : "r"(barrier), "r"(parity)
            : "memory");
      }
    }
    __syncwarp();
    const unsigned char* stage = stages + (i % STAGES) * 2 * kChunkBytes;
    acc ^= *reinterpret_cast<const unsigned*>(stage + lane * kRowBytes) ^
           *reinterpret_cast<const unsigned*>(stage + kChunkBytes + lane * kRowBytes);
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the reads
}

template <int MODE, int STAGES>
float run(const char* k, const char* v, int batch, int heads, int seqlen, unsigned* sink) {
  const int smem = kWarps * STAGES * 2 * kChunkBytes;
  cudaFuncSetAttribute(stream_kv<MODE, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  return median_launch_ms(
      [&] { stream_kv<MODE, STAGES><<<batch * heads, kWarps * 32, smem>>>(k, v, heads, seqlen, sink); });
}

int main(int argc, char** argv) {
  if (argc != 6) {
    std::printf("usage: %s BATCH HEADS SEQLEN STAGES(2-3) MODE(0 cp.async, 1 bulk)\n", argv[0]);
    return 2;
  }
  const int batch = std::atoi(argv[1]), heads = std::atoi(argv[2]), seqlen = std::atoi(argv[3]);
  const int stages = std::atoi(argv[4]), mode = std::atoi(argv[5]);
  const ProbeCache cache = make_probe_cache(static_cast<size_t>(batch) * seqlen * heads * kRowBytes);
  float ms = 0;
#define CASE(M, S) \
  if (mode == M && stages == S) ms = run<M, S>(cache.k, cache.v, batch, heads, seqlen, cache.sink);
  CASE(0, 2) CASE(0, 3) CASE(1, 2) CASE(1, 3)
#undef CASE
  if (ms == 0) {
    std::printf("unsupported stages/mode\n");
    return 2;
  }
  std::printf("batch %d heads %d seqlen %d stages %d mode %s: %.4f ms, %.2f TB/s\n", batch, heads, seqlen, stages,
              mode ? "bulk" : "cp.async", ms, kv_tbps(cache, ms));
  return 0;
}
