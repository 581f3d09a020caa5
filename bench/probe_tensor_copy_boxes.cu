// How fast do tensor copies (TMA) of small boxes stream, against the box size and the number of
// threads that issue them? 128-byte-swizzled 64-channel bf16 panels (the wgmma kernels' K/V boxes;
// a page of 16 rows is a 2 KB box), boxes spread over the buffer like shuffled pages, GRID CTAs with
// one warp each, ISSUERS lanes issuing, 4 stages of 32 KB. A region that fits in L2 (16 MB) times
// the copy path; a large one (4096 MB) adds HBM. Measured on the H200: docs/PERFORMANCE.md, 2026-11-23.
//
//   nvcc -O3 -arch=sm_90a -o /tmp/probe_boxes bench/probe_tensor_copy_boxes.cu
//   /tmp/probe_boxes MBYTES BOX_ROWS ISSUERS GRID STAGES_PER_CTA     (e.g. 16 16 8 132 1000)
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../templates/ptx.cuh"  // the kernels' own PTX wrappers
using namespace jitattn;
constexpr int kStageBytes = 32768, kStages = 4;
__global__ void __launch_bounds__(128) boxes(const __grid_constant__ CUtensorMap map, int box_rows, int issuers, long long rows_total,
                                            int stages_total, unsigned* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) unsigned long long full[kStages];
  const int lane = threadIdx.x;
  if (threadIdx.x >= 32) return;
  if (lane == 0) for (int s = 0; s < kStages; ++s) mbarrier_init(smem_u32(&full[s]), 1);
  fence_barrier_init();
  __syncwarp();
  const int box_bytes = box_rows * 128, boxes_per_stage = kStageBytes / box_bytes;
  auto issue = [&](int i) {
    const unsigned bar = smem_u32(&full[i % kStages]);
    if (lane == 0) mbarrier_arrive_expect_bytes(bar, kStageBytes);
    __syncwarp();
    for (int b = lane; b < boxes_per_stage; b += issuers) {
      if (lane >= issuers) break;
      // rows: spread over the tensor so consecutive boxes are not adjacent (as pages)
      const long long row = ((long long)(blockIdx.x * 7919 + i * boxes_per_stage + b) * 104729 % (rows_total / box_rows)) * box_rows;
      tensor_copy_3d(smem_u32(smem + (i % kStages) * kStageBytes + b * box_bytes), &map, bar, 0, (int)row, 0);
    }
  };
  for (int i = 0; i < kStages; ++i) issue(i);
  unsigned acc = 0;
  for (int i = 0; i < stages_total; ++i) {
    mbarrier_wait(smem_u32(&full[i % kStages]), (i / kStages) & 1);
    acc ^= *(const volatile unsigned*)(smem + (i % kStages) * kStageBytes + lane * 4);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();
    if (i + kStages < stages_total) issue(i + kStages);
  }
  if (acc == 0x12345678u) sink[0] = acc;
}
int main(int argc, char** argv) {
  if (argc != 6) { std::printf("usage: %s MBYTES BOX_ROWS ISSUERS GRID STAGES_PER_CTA\n", argv[0]); return 2; }
  const long long mbytes = atoll(argv[1]); const int box_rows = atoi(argv[2]), issuers = atoi(argv[3]), grid = atoi(argv[4]),
                  stages_total = atoi(argv[5]);
  PFN_cuTensorMapEncodeTiled_v12000 encode; cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault, &q);
  const long long bytes = mbytes << 20, rows = bytes / 128;
  void* buf; unsigned* sink; cudaMalloc(&buf, bytes); cudaMalloc(&sink, 4); cudaMemset(buf, 1, bytes);
  CUtensorMap m; cuuint64_t dims[3] = {64, (cuuint64_t)rows, 1}; cuuint64_t strides[2] = {128, (cuuint64_t)bytes};
  cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}; cuuint32_t es[3] = {1, 1, 1};
  if (encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, buf, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::printf("encode failed\n"); return 1; }
  const int smem = kStages * kStageBytes;
  cudaFuncSetAttribute(boxes, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> t;
  for (int r = 0; r < 13; ++r) {
    cudaEventRecord(a);
    boxes<<<grid, 128, smem>>>(m, box_rows, issuers, rows, stages_total, sink);
    cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); if (r >= 3) t.push_back(ms);
  }
  cudaError_t e = cudaGetLastError(); if (e) { std::printf("failed: %s\n", cudaGetErrorString(e)); return 1; }
  std::sort(t.begin(), t.end()); const float ms = t[t.size() / 2];
  const double total = (double)grid * stages_total * kStageBytes;
  std::printf("region %lld MB box %d rows (%d B) issuers %d grid %d: %.3f ms, %.2f TB/s total, %.1f GB/s per CTA\n", mbytes, box_rows,
              box_rows * 128, issuers, grid, ms, total / (ms * 1e-3) / 1e12, total / grid / (ms * 1e-3) / 1e9);
}
