// Which SM each CTA of a one-CTA-per-SM grid lands on, by block index, and
// when it starts: the placement that fwd_decode.cuh's find_piece spreads its
// first wave over (the hardware hands consecutive CTAs to the two SMs of one
// TPC on the H200, docs/PERFORMANCE.md).
//
//   nvcc -O3 -arch=sm_90a -o /tmp/placement bench/probe_cta_placement.cu && /tmp/placement [grid ...]
//
// Each CTA takes the decode kernel's shared memory at head dim 128 (one CTA
// per SM) and holds its SM for 20 µs, so a grid past one wave shows which
// CTAs wait for a free SM.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int kSharedBytes = 135168;  // decode.bf16.d128.br16.bc32.w4.s2
constexpr unsigned long long kHoldNs = 20000;

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void record_placement(int* sm_of_cta, unsigned long long* start_of_cta) {
  extern __shared__ char shared_bytes[];
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const unsigned long long start = global_ns();
  if (threadIdx.x == 0) {
    sm_of_cta[blockIdx.x] = static_cast<int>(sm);
    start_of_cta[blockIdx.x] = start;
    shared_bytes[0] = 1;
  }
  while (global_ns() - start < kHoldNs) {
  }
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> grids;
  for (int i = 1; i < argc; ++i) grids.push_back(std::atoi(argv[i]));
  if (grids.empty()) grids = {152, 248};
  check(cudaFuncSetAttribute(record_placement, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
        "shared memory attribute");
  for (const int grid : grids) {
    int* sm_of_cta;
    unsigned long long* start_of_cta;
    check(cudaMalloc(&sm_of_cta, grid * sizeof(int)), "cudaMalloc");
    check(cudaMalloc(&start_of_cta, grid * sizeof(unsigned long long)), "cudaMalloc");
    // The second launch is the one read: the first warms the clocks.
    for (int launch = 0; launch < 2; ++launch) record_placement<<<grid, 128, kSharedBytes>>>(sm_of_cta, start_of_cta);
    check(cudaDeviceSynchronize(), "launch");
    std::vector<int> sms(grid);
    std::vector<unsigned long long> starts(grid);
    check(cudaMemcpy(sms.data(), sm_of_cta, grid * sizeof(int), cudaMemcpyDeviceToHost), "copy");
    check(cudaMemcpy(starts.data(), start_of_cta, grid * sizeof(unsigned long long), cudaMemcpyDeviceToHost), "copy");
    unsigned long long first = starts[0];
    for (const unsigned long long start : starts) first = start < first ? start : first;
    std::printf("grid %d: cta:sm(start, us after the first)\n", grid);
    for (int cta = 0; cta < grid; ++cta) {
      std::printf("%d:%d(%.0f)%s", cta, sms[cta], (starts[cta] - first) / 1000.0, cta % 12 == 11 ? "\n" : " ");
    }
    std::printf("\n");
    check(cudaFree(sm_of_cta), "cudaFree");
    check(cudaFree(start_of_cta), "cudaFree");
  }
  return 0;
}
