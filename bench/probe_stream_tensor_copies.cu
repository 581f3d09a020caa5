// How fast do tensor copies (TMA) stream a [B, S, Hk, 128] bf16 KV cache with one CTA per
// (sequence, KV head), as the decode kernel's grid? A probe beside probe_stream_bandwidth.cu (which
// times the decode kernel's 16-byte cp.async pattern): one thread per CTA issues 3-D tensor copies
// of (128 channels x 1 head x ROWS rows) for K and V into STAGES stages, no swizzle, no math.
// Measured on the H200 (docs/PERFORMANCE.md, 2026-11-23): 7-10% slower than cp.async at 128 CTAs.
//
//   nvcc -O3 -arch=sm_90a -o /tmp/probe_tc bench/probe_stream_tensor_copies.cu
//   /tmp/probe_tc BATCH HEADS SEQLEN ROWS STAGES   (ROWS x STAGES: 32x4 32x6 64x2 64x3 64x4 128x2 128x3 16x8)
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cstdio>
#include <cstdlib>

#include "../templates/ptx.cuh"  // the kernels' own PTX wrappers
#include "probe_kv.cuh"
using namespace jitattn;
constexpr int kD = 128;
template <int ROWS, int STAGES>
__global__ void __launch_bounds__(128) stream_tma(const __grid_constant__ CUtensorMap km, const __grid_constant__ CUtensorMap vm,
                                                 int heads, int seqlen, unsigned* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) unsigned long long full[STAGES];
  const int batch = blockIdx.x / heads, head = blockIdx.x % heads;
  constexpr int kBox = ROWS * kD * 2;
  const int count = seqlen / ROWS;
  if (threadIdx.x != 0) return;
  for (int s = 0; s < STAGES; ++s) mbarrier_init(smem_u32(&full[s]), 1);
  fence_barrier_init();
  auto issue = [&](int i) {
    const unsigned bar = smem_u32(&full[i % STAGES]);
    const unsigned st = smem_u32(smem + (i % STAGES) * 2 * kBox);
    mbarrier_arrive_expect_bytes(bar, 2 * kBox);
    const int row = batch * seqlen + i * ROWS;
    tensor_copy_3d(st, &km, bar, 0, head, row);
    tensor_copy_3d(st + kBox, &vm, bar, 0, head, row);
  };
  for (int i = 0; i < STAGES && i < count; ++i) issue(i);
  unsigned acc = 0;
  for (int i = 0; i < count; ++i) {
    mbarrier_wait(smem_u32(&full[i % STAGES]), (i / STAGES) & 1);
    const unsigned char* st = smem + (i % STAGES) * 2 * kBox;
    acc ^= *(const volatile unsigned*)st ^ *(const volatile unsigned*)(st + kBox);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    if (i + STAGES < count) issue(i + STAGES);
  }
  if (acc == 0x12345678u) sink[0] = acc;
}
static PFN_cuTensorMapEncodeTiled_v12000 encode;
CUtensorMap make_map(void* base, int batch, int heads, int seqlen, int rows) {
  CUtensorMap m;
  cuuint64_t dims[3] = {kD, (cuuint64_t)heads, (cuuint64_t)batch * seqlen};
  cuuint64_t strides[2] = {kD * 2, (cuuint64_t)heads * kD * 2};
  cuuint32_t box[3] = {kD, 1, (cuuint32_t)rows};
  cuuint32_t es[3] = {1, 1, 1};
  CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) { std::printf("encode failed %d\n", r); std::exit(1); }
  return m;
}
template <int ROWS, int STAGES>
float run(CUtensorMap km, CUtensorMap vm, int grid, int heads, int seqlen, unsigned* sink) {
  const int smem = STAGES * 2 * ROWS * kD * 2;
  cudaFuncSetAttribute(stream_tma<ROWS, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  return median_launch_ms([&] { stream_tma<ROWS, STAGES><<<grid, 128, smem>>>(km, vm, heads, seqlen, sink); });
}
int main(int argc, char** argv) {
  if (argc != 6) { std::printf("usage: %s BATCH HEADS SEQLEN ROWS STAGES\n", argv[0]); return 2; }
  const int batch = atoi(argv[1]), heads = atoi(argv[2]), seqlen = atoi(argv[3]), rows = atoi(argv[4]), stages = atoi(argv[5]);
  cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault, &q);
  const ProbeCache cache = make_probe_cache((size_t)batch * seqlen * heads * kD * 2);
  CUtensorMap km = make_map(cache.k, batch, heads, seqlen, rows), vm = make_map(cache.v, batch, heads, seqlen, rows);
  float ms = 0;
#define C(R, S) if (rows == R && stages == S) ms = run<R, S>(km, vm, batch * heads, heads, seqlen, cache.sink);
  C(32, 2) C(32, 4) C(32, 6) C(64, 2) C(64, 3) C(64, 4) C(128, 2) C(128, 3) C(16, 8)
  if (ms == 0) { std::printf("unsupported\n"); return 2; }
  std::printf("tma batch %d heads %d seqlen %d rows %d stages %d: %.4f ms, %.2f TB/s\n", batch, heads, seqlen, rows, stages, ms,
              kv_tbps(cache, ms));
}
