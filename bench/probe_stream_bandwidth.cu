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
//   mode 2: mode 0, with the HEADS CTAs of a sequence launched as one cluster that keeps
//           in step (a split cluster barrier: arrive every SYNC chunks, wait one period later),
//           so that the heads' 256-byte rows of a key position are read close together
//   mode 3: mode 0, but CTA h of a sequence reads the sequence's rows [h, h + 1) / HEADS of
//           all heads as one contiguous stream (the same bytes per CTA, DRAM-friendly order)
//   mode 4: mode 0 with the sequence fastest in the grid instead of the head
//
// Build and run on the GPU host:
//   nvcc -O3 -arch=sm_90a -o /tmp/probe bench/probe_stream_bandwidth.cu
//   /tmp/probe BATCH HEADS SEQLEN STAGES MODE [SYNC]
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
                                                          int batches, int sync_every, unsigned* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) unsigned long long barriers[kWarps][STAGES];
  constexpr bool kAsync = MODE != 1;  // every mode but 1 issues 16-byte cp.async
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int batch = MODE == 4 ? blockIdx.x % batches : blockIdx.x / heads;
  const int head = MODE == 4 ? blockIdx.x / batches : blockIdx.x % heads;
  // Mode 3: the CTA's rows are contiguous, a 1 / HEADS slice of the sequence's [S, HEADS] rows.
  const long long row_stride = MODE == 3 ? kRowBytes : static_cast<long long>(heads) * kRowBytes;
  const long long first_row = MODE == 3 ? static_cast<long long>(batch) * seqlen * heads + head * seqlen
                                        : static_cast<long long>(batch) * seqlen * heads + head;
  const char* k_head = k + first_row * kRowBytes;
  const char* v_head = v + first_row * kRowBytes;
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
    if (kAsync) {
      issue_chunk_copies<kRowBytes, kChunkRows>(stage, k_rows, v_rows, row_stride, lane);
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
    else if (kAsync) asm volatile("cp.async.commit_group;\n" ::);
  }
  for (int i = 0; i < count; ++i) {
    if (MODE == 2 && i % sync_every == 0) {
      // Wait for the arrival of one period ago, then arrive for this one: the cluster's CTAs
      // drift apart by at most two periods.
      if (i > 0) asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
      asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
    }
    __syncwarp();
    if (i + STAGES - 1 < count) issue(i + STAGES - 1);
    else if (kAsync) asm volatile("cp.async.commit_group;\n" ::);
    if (kAsync) {
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
  if (MODE == 2) {
    // Every warp runs the same number of periods only if count is equal across warps; balance
    // the arrivals so that each thread has arrived and waited the same number of times.
    const int periods = (count + sync_every - 1) / sync_every;
    const int max_count = ((seqlen / kChunkRows) + kWarps - 1) / kWarps;
    const int max_periods = (max_count + sync_every - 1) / sync_every;
    for (int extra = periods; extra < max_periods; ++extra) {
      if (extra > 0) asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
      asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
    }
    if (max_periods > 0) asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the reads
}

template <int MODE, int STAGES>
float run(const char* k, const char* v, int batch, int heads, int seqlen, int sync_every, unsigned* sink) {
  const int smem = kWarps * STAGES * 2 * kChunkBytes;
  auto kernel = stream_kv<MODE, STAGES>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (MODE == 2) cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  return median_launch_ms([&] {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(batch * heads);
    config.blockDim = dim3(kWarps * 32);
    config.dynamicSmemBytes = smem;
    cudaLaunchAttribute cluster = {};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = heads;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = MODE == 2 ? 1 : 0;
    cudaLaunchKernelEx(&config, kernel, k, v, heads, seqlen, batch, sync_every, sink);
  });
}

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) {
    std::printf("usage: %s BATCH HEADS SEQLEN STAGES(2-3) MODE(0 cp.async, 1 bulk, 2 cluster in step, 3 contiguous, "
                "4 sequence fastest) [SYNC chunks, mode 2]\n",
                argv[0]);
    return 2;
  }
  const int batch = std::atoi(argv[1]), heads = std::atoi(argv[2]), seqlen = std::atoi(argv[3]);
  const int stages = std::atoi(argv[4]), mode = std::atoi(argv[5]);
  const int sync_every = argc == 7 ? std::atoi(argv[6]) : 8;
  const ProbeCache cache = make_probe_cache(static_cast<size_t>(batch) * seqlen * heads * kRowBytes);
  float ms = 0;
#define CASE(M, S) \
  if (mode == M && stages == S) ms = run<M, S>(cache.k, cache.v, batch, heads, seqlen, sync_every, cache.sink);
  CASE(0, 2) CASE(0, 3) CASE(1, 2) CASE(1, 3) CASE(2, 2) CASE(2, 3) CASE(3, 2) CASE(3, 3) CASE(4, 2) CASE(4, 3)
#undef CASE
  if (ms == 0) {
    std::printf("unsupported stages/mode\n");
    return 2;
  }
  const char* names[] = {"cp.async", "bulk", "cluster in step", "contiguous", "sequence fastest"};
  std::printf("batch %d heads %d seqlen %d stages %d mode %s (sync %d): %.4f ms, %.2f TB/s\n", batch, heads, seqlen,
              stages, names[mode], mode == 2 ? sync_every : 0, ms, kv_tbps(cache, ms));
  return 0;
}
