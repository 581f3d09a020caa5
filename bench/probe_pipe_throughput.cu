// Which execution pipes do the softmax's and the RoPE rotation's instructions
// share? Measures per-SM throughput (warp lanes per SM clock) of the
// instructions the wgmma kernels' non-MMA work is made of, alone and
// interleaved: if two kinds interleaved take as long as the sum of each
// alone, they share a pipe.
//
//   ffma   fp32 fused multiply-add
//   ex2    ex2.approx.ftz.f32 (the softmax's exponentials)
//   cvt    cvt.rn.bf16x2.f32 (packing P, and cos/sin for packed rotation)
//   ipack  two integer adds and a byte permute: two fp32 rounded (half up)
//          to bf16 and packed, without a conversion instruction
//   hfma2  fma.rn.bf16x2 (the packed rotation)
//   and pairs of them, one of each per step.
//
// Build and run on the GPU host:
//   nvcc -O3 -arch=sm_90a -o /tmp/pipes bench/probe_pipe_throughput.cu && /tmp/pipes
// One CTA of 1024 threads per SM, eight independent chains per thread; the
// SM clock comes from clock64 inside each CTA, so no clock speed is assumed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

constexpr int kChains = 8;
constexpr int kSteps = 2048;
constexpr int kThreads = 1024;

enum Mode { kFfma, kEx2, kCvt, kIpack, kHfma2, kEx2Cvt, kEx2Ipack, kCvtHfma2, kEx2Hfma2, kModes };
constexpr const char* kNames[kModes] = {"ffma",      "ex2",        "cvt",         "ipack",      "hfma2",
                                        "ex2+cvt",   "ex2+ipack",  "cvt+hfma2",   "ex2+hfma2"};
// Instructions (warp-wide) per chain step, and what each counts as.
constexpr int kInstructions[kModes] = {1, 1, 1, 3, 1, 2, 4, 2, 2};

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(-x));
  return y;
}
__device__ __forceinline__ unsigned cvt(float lo, float hi) {
  unsigned packed;
  asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}
__device__ __forceinline__ unsigned ipack(float lo, float hi) {
  unsigned a, b, packed;
  asm volatile("add.u32 %0, %1, 0x8000;" : "=r"(a) : "r"(__float_as_uint(lo)));
  asm volatile("add.u32 %0, %1, 0x8000;" : "=r"(b) : "r"(__float_as_uint(hi)));
  asm volatile("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(packed) : "r"(a), "r"(b));
  return packed;
}
__device__ __forceinline__ unsigned hfma2(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm volatile("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ float ffma(float a, float b, float c) {
  float d;
  asm volatile("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}

template <int MODE>
__global__ void __launch_bounds__(kThreads) run(float seed, float* sink, long long* cycles) {
  float f[kChains], g[kChains];
  unsigned u[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) {
    f[c] = seed + 0.01f * (threadIdx.x % 7 + c);
    g[c] = 0.5f + f[c];
    u[c] = 0x3f003f00u + c;
  }
  __syncthreads();
  const long long start = clock64();
#pragma unroll 4
  for (int step = 0; step < kSteps; ++step) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (MODE == kFfma) f[c] = ffma(f[c], 0.999f, 0.001f);
      if constexpr (MODE == kEx2) f[c] = ex2(f[c]);
      if constexpr (MODE == kCvt) f[c] = __uint_as_float(cvt(f[c], g[c]));
      if constexpr (MODE == kIpack) f[c] = __uint_as_float(ipack(f[c], g[c]));
      if constexpr (MODE == kHfma2) u[c] = hfma2(u[c], 0x3f803f80u, 0x3c003c00u);
      if constexpr (MODE == kEx2Cvt) {
        f[c] = ex2(f[c]);
        g[c] = __uint_as_float(cvt(g[c], f[c]));
      }
      if constexpr (MODE == kEx2Ipack) {
        f[c] = ex2(f[c]);
        g[c] = __uint_as_float(ipack(g[c], f[c]));
      }
      if constexpr (MODE == kCvtHfma2) {
        f[c] = __uint_as_float(cvt(f[c], g[c]));
        u[c] = hfma2(u[c], 0x3f803f80u, 0x3c003c00u);
      }
      if constexpr (MODE == kEx2Hfma2) {
        f[c] = ex2(f[c]);
        u[c] = hfma2(u[c], 0x3f803f80u, 0x3c003c00u);
      }
    }
  }
  const long long stop = clock64();
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) total += f[c] + g[c] + __uint_as_float(u[c]);
  if (total == 12345.f) sink[threadIdx.x] = total;  // keeps the chains live
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
}

template <int MODE>
void measure(int sms, float* sink, long long* cycles_device) {
  std::vector<long long> cycles(sms);
  run<MODE><<<sms, kThreads>>>(0.25f, sink, cycles_device);  // warm-up
  run<MODE><<<sms, kThreads>>>(0.25f, sink, cycles_device);
  cudaMemcpy(cycles.data(), cycles_device, sms * sizeof(long long), cudaMemcpyDeviceToHost);
  std::sort(cycles.begin(), cycles.end());
  const double median = static_cast<double>(cycles[sms / 2]);
  const double steps = static_cast<double>(kThreads) * kSteps * kChains;
  std::printf("%-10s %7.1f lanes/clk/SM per instruction, %9.0f cycles\n", kNames[MODE],
              steps * kInstructions[MODE] / median, median);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* sink;
  long long* cycles;
  cudaMalloc(&sink, kThreads * sizeof(float));
  cudaMalloc(&cycles, sms * sizeof(long long));
  measure<kFfma>(sms, sink, cycles);
  measure<kEx2>(sms, sink, cycles);
  measure<kCvt>(sms, sink, cycles);
  measure<kIpack>(sms, sink, cycles);
  measure<kHfma2>(sms, sink, cycles);
  measure<kEx2Cvt>(sms, sink, cycles);
  measure<kEx2Ipack>(sms, sink, cycles);
  measure<kCvtHfma2>(sms, sink, cycles);
  measure<kEx2Hfma2>(sms, sink, cycles);
  const cudaError_t error = cudaDeviceSynchronize();
  if (error != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(error));
    return 1;
  }
  return 0;
}
