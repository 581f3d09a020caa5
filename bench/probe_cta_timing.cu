// When does each CTA of a one-wave decoding grid finish? A probe for issue 4's batch-16 shapes (128 tiles of
// one (sequence, KV head) each on 132 SMs): the decode kernel's copies (per-warp 32-row chunks of 16-byte
// cp.async, as probe_stream_bandwidth.cu mode 0) with an optional spin per chunk standing in for the math,
// recording each CTA's SM, start and end (%globaltimer). If the grid's time is set by a few slow CTAs, balancing
// could pay more than the 4 idle SMs; if every CTA ends together, those SMs are all there is.
//
//   mode 0: one CTA per tile (the decode kernel's grid)
//   mode 1: one CTA per tile plus HELPERS CTAs (one per idle SM): tile t's owner reads its first chunks and the
//           last 1 / (1 + tiles per helper) of them go to helper t % HELPERS, which streams its pieces one after
//           another through one continuous pipeline (no drain between pieces). Copies only: what a static split
//           over every SM could reach before the partial results and their merge are paid for.
//   mode 2: one CTA per SM; each warp claims its tile's chunks one at a time from a per-tile counter (atomicAdd,
//           its answer waited for within the iteration); a CTA whose own tile is used up (or that has none) claims
//           chunks of the tile with the most left. Copies only: what balancing by claims could reach before partial
//           results are merged. The last CTA to finish sets the counters back to zero.
//   modes 3-5: one CTA per SM; a tile's counter word holds chunks claimed from its front (low 16 bits) and from
//           its back (high 16). A tile's own CTA claims CLAIM (1, 2, 4) chunks at a time from the front, one claim
//           ahead, so that the atomic's round trip hides behind a chunk's copies; a warp whose tile is used up
//           claims single chunks from the back of the tile with the most left.
//
// Measured (H200, docs/PERFORMANCE.md "Decoding at batch 16: when each CTA ends"): mode 0's CTAs end over a
// 20-30% spread, and modes 4-5 even them out for 0-3% more TB/s.
//
// Build and run on the GPU host:
//   nvcc -O3 -arch=sm_90a -o /tmp/cta_timing bench/probe_cta_timing.cu
//   /tmp/cta_timing BATCH HEADS SEQLEN MODE SPIN_CYCLES
// Prints the median time of 20 launches (TB/s of K+V), then for the last launch each CTA's start and end
// relative to the first start (µs): spread, slowest SMs.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_kv.cuh"

constexpr int kHeadDim = 128;
constexpr int kRowBytes = kHeadDim * 2;
constexpr int kChunkRows = 32;
constexpr int kChunkBytes = kChunkRows * kRowBytes;  // one K or V chunk
constexpr int kWarps = 4;
constexpr int kStages = 2;

struct CtaTime {
  unsigned long long start, end;
  unsigned sm, pad;
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The tile with the most chunks left (left_of(t) > 0), -1 when none has any; every lane of the warp calls it
// and gets the same answer.
template <class LeftOf>
__device__ __forceinline__ int richest_tile(int tiles, int lane, LeftOf&& left_of) {
  int best = -1, best_left = 0;
  for (int t = lane; t < tiles; t += 32) {
    const int left = left_of(t);
    if (left > best_left) best_left = left, best = t;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const int other_left = __shfl_xor_sync(0xffffffffu, best_left, offset);
    const int other = __shfl_xor_sync(0xffffffffu, best, offset);
    if (other_left > best_left || (other_left == best_left && other > best)) best_left = other_left, best = other;
  }
  return best;
}

// The first row of chunk `chunk` of tile t (sequence t / heads, head t % heads) in a [batch, seqlen, heads] cache.
__device__ __forceinline__ const char* chunk_rows(const char* cache, int t, int chunk, int heads, int seqlen) {
  const long long first_row = static_cast<long long>(t / heads) * seqlen * heads + t % heads;
  return cache + (first_row + static_cast<long long>(chunk) * kChunkRows * heads) * kRowBytes;
}

// "Reads" a landed chunk: one word per lane of K and of V (kept by the checksum), then SPIN_CYCLES of spinning in
// place of the math.
__device__ __forceinline__ void touch_chunk(const unsigned char* stage, int lane, int spin, unsigned& acc) {
  acc ^= *reinterpret_cast<const unsigned*>(stage + lane * kRowBytes) ^
         *reinterpret_cast<const unsigned*>(stage + kChunkBytes + lane * kRowBytes);
  if (spin > 0) {
    const long long until = clock64() + spin;
    while (clock64() < until) {
    }
  }
}

// Records the CTA's SM, start and end; with `claims`, the last CTA to finish (the count after the tiles' words)
// sets the words and the count back to zero for the next launch.
__device__ __forceinline__ void finish_cta(unsigned long long start, CtaTime* times, unsigned* claims, int tiles,
                                           bool* last_cta) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    times[blockIdx.x] = CtaTime{start, global_ns(), sm, 0};
    if (claims != nullptr) {
      __threadfence();
      *last_cta = atomicAdd(claims + tiles, 1u) == gridDim.x - 1;
    }
  }
  if (claims == nullptr) return;
  __syncthreads();
  if (*last_cta) {
    for (int t = threadIdx.x; t <= tiles; t += blockDim.x) claims[t] = 0;
  }
}

template <int MODE>
__global__ void __launch_bounds__(kWarps * 32) stream_kv(const char* k, const char* v, int heads, int seqlen, int tiles,
                                                          int helpers, int spin, CtaTime* times, unsigned* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned long long start = global_ns();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long row_stride = static_cast<long long>(heads) * kRowBytes;
  const int total_chunks = seqlen / kChunkRows;
  const int tiles_per_helper = helpers > 0 ? (tiles + helpers - 1) / helpers : 0;
  const int piece_chunks = MODE == 1 ? max(1, total_chunks / (1 + tiles_per_helper)) : 1;
  const int owner_chunks = MODE == 1 ? total_chunks - piece_chunks : total_chunks;
  const bool helper = MODE == 1 && static_cast<int>(blockIdx.x) >= tiles;
  const int h = blockIdx.x - tiles;
  // The CTA's flattened chunk list: an owner's chunks of its tile, or a helper's pieces back to back.
  const int pieces = helper ? (tiles - h + helpers - 1) / helpers : 0;
  const int list = helper ? pieces * piece_chunks : owner_chunks;
  auto address = [&](int f, const char* base) {
    int tile = blockIdx.x, chunk = f;
    if (helper) {
      tile = h + helpers * (f / piece_chunks);
      chunk = owner_chunks + f % piece_chunks;
    }
    return chunk_rows(base, tile, chunk, heads, seqlen);
  };
  unsigned char* stages = smem + warp * kStages * 2 * kChunkBytes;
  const int count = warp < list ? (list - warp + kWarps - 1) / kWarps : 0;
  auto issue = [&](int i) {
    const int f = warp + i * kWarps;
    unsigned char* stage = stages + (i % kStages) * 2 * kChunkBytes;
    const char* k_rows = address(f, k);
    const char* v_rows = address(f, v);
    issue_chunk_copies<kRowBytes, kChunkRows>(stage, k_rows, v_rows, row_stride, lane);
    asm volatile("cp.async.commit_group;\n" ::);
  };
  unsigned acc = 0;
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < count) issue(i);
    else asm volatile("cp.async.commit_group;\n" ::);
  }
  for (int i = 0; i < count; ++i) {
    __syncwarp();
    if (i + kStages - 1 < count) issue(i + kStages - 1);
    else asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1) : "memory");
    __syncwarp();
    const unsigned char* stage = stages + (i % kStages) * 2 * kChunkBytes;
    touch_chunk(stage, lane, spin, acc);
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the reads
  finish_cta(start, times, nullptr, tiles, nullptr);
}

// Mode 2: chunks claimed one at a time from per-tile counters (claims[tiles], then a finished-CTA count).
__global__ void __launch_bounds__(kWarps * 32) stream_kv_claimed(const char* k, const char* v, int heads, int seqlen,
                                                                  int tiles, int spin, CtaTime* times, unsigned* claims,
                                                                  unsigned* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ bool last_cta;
  const unsigned long long start = global_ns();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long row_stride = static_cast<long long>(heads) * kRowBytes;
  const int total_chunks = seqlen / kChunkRows;
  // Claims the next chunk: of `tile` while it has any, else of the richest tile. Returns false when none is left.
  int tile = static_cast<int>(blockIdx.x) < tiles ? static_cast<int>(blockIdx.x) : -1;
  auto claim = [&](int& claimed_tile, int& claimed_chunk) {
    for (;;) {
      if (tile < 0) {
        tile = richest_tile(tiles, lane, [&](int t) {
          return total_chunks - static_cast<int>(*reinterpret_cast<volatile unsigned*>(claims + t));
        });
        if (tile < 0) return false;
      }
      unsigned c = 0;
      if (lane == 0) c = atomicAdd(claims + tile, 1u);
      c = __shfl_sync(0xffffffffu, c, 0);
      if (static_cast<int>(c) < total_chunks) {
        claimed_tile = tile;
        claimed_chunk = static_cast<int>(c);
        return true;
      }
      tile = -1;
    }
  };
  unsigned char* stages = smem + warp * kStages * 2 * kChunkBytes;
  auto issue = [&](int slot, int t, int chunk) {
    issue_chunk_copies<kRowBytes, kChunkRows>(stages + slot * 2 * kChunkBytes, chunk_rows(k, t, chunk, heads, seqlen),
                                              chunk_rows(v, t, chunk, heads, seqlen), row_stride, lane);
  };
  static_assert(kStages == 2, "one chunk in flight ahead of the one read");
  unsigned acc = 0;
  int t0, c0, t1, c1;
  bool have0 = claim(t0, c0);
  if (have0) issue(0, t0, c0);
  asm volatile("cp.async.commit_group;\n" ::);
  bool have1 = have0 && claim(t1, c1);
  for (int i = 0; have0; ++i) {
    __syncwarp();
    if (have1) issue((i + 1) % kStages, t1, c1);
    asm volatile("cp.async.commit_group;\n" ::);
    // The claim after next, made (and waited for) while this chunk's copies are in flight.
    int t2 = 0, c2 = 0;
    const bool have2 = have1 && claim(t2, c2);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1) : "memory");
    __syncwarp();
    const unsigned char* stage = stages + (i % kStages) * 2 * kChunkBytes;
    touch_chunk(stage, lane, spin, acc);
    have0 = have1, t0 = t1, c0 = c1;
    have1 = have2, t1 = t2, c1 = c2;
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the reads
  // Every other CTA has made its last claim once it counts itself finished.
  finish_cta(start, times, claims, tiles, &last_cta);
}

// Mode 3: owners claim CLAIM chunks from the front of their tile's word, one claim ahead; thieves single chunks
// from the back of the richest tile.
template <int CLAIM>
__global__ void __launch_bounds__(kWarps * 32) stream_kv_two_ended(const char* k, const char* v, int heads,
                                                                    int seqlen, int tiles, int spin, CtaTime* times,
                                                                    unsigned* words, unsigned* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ bool last_cta;
  const unsigned long long start = global_ns();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long row_stride = static_cast<long long>(heads) * kRowBytes;
  const int total = seqlen / kChunkRows;
  auto left_of = [&](unsigned word) { return total - static_cast<int>(word & 0xffffu) - static_cast<int>(word >> 16); };
  // A thief's claim: one chunk from the back of the richest tile; false when no chunk is left anywhere.
  auto steal = [&](int& t, int& chunk) {
    for (;;) {
      const int victim =
          richest_tile(tiles, lane, [&](int t) { return left_of(*reinterpret_cast<volatile unsigned*>(words + t)); });
      if (victim < 0) return false;
      unsigned old = 0;
      if (lane == 0) old = atomicAdd(words + victim, 1u << 16);
      old = __shfl_sync(0xffffffffu, old, 0);
      if (left_of(old) > 0) {
        t = victim;
        chunk = total - 1 - static_cast<int>(old >> 16);
        return true;
      }
    }
  };
  const int home = static_cast<int>(blockIdx.x) < tiles ? static_cast<int>(blockIdx.x) : -1;
  bool home_left = home >= 0;
  // The owner's claims: `pending` is lane 0's answer to the claim in flight; `run`/`run_end` the chunks in hand.
  unsigned pending = 0;
  int run = 0, run_end = 0;
  auto send_claim = [&]() {
    if (lane == 0) pending = atomicAdd(words + home, static_cast<unsigned>(CLAIM));
  };
  // The next chunk to copy: from the run in hand, else the claim in flight (and the next claim is sent), else
  // stolen.
  auto next = [&](int& t, int& chunk) {
    if (run < run_end) {
      t = home, chunk = run++;
      return true;
    }
    if (home_left) {
      const unsigned old = __shfl_sync(0xffffffffu, pending, 0);
      const int front = static_cast<int>(old & 0xffffu);
      const int end = min(front + CLAIM, total - static_cast<int>(old >> 16));
      if (front < end) {
        run = front, run_end = end;
        send_claim();
        t = home, chunk = run++;
        return true;
      }
      home_left = false;
    }
    return steal(t, chunk);
  };
  if (home_left) send_claim();
  unsigned char* stages = smem + warp * kStages * 2 * kChunkBytes;
  auto issue = [&](int slot, int t, int chunk) {
    issue_chunk_copies<kRowBytes, kChunkRows>(stages + slot * 2 * kChunkBytes, chunk_rows(k, t, chunk, heads, seqlen),
                                              chunk_rows(v, t, chunk, heads, seqlen), row_stride, lane);
  };
  unsigned acc = 0;
  int t0, c0, t1, c1;
  bool have0 = next(t0, c0);
  if (have0) issue(0, t0, c0);
  asm volatile("cp.async.commit_group;\n" ::);
  for (int i = 0; have0; ++i) {
    __syncwarp();
    const bool have1 = next(t1, c1);
    if (have1) issue((i + 1) % kStages, t1, c1);
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1) : "memory");
    __syncwarp();
    const unsigned char* stage = stages + (i % kStages) * 2 * kChunkBytes;
    touch_chunk(stage, lane, spin, acc);
    have0 = have1, t0 = t1, c0 = c1;
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the reads
  finish_cta(start, times, words, tiles, &last_cta);
}

int main(int argc, char** argv) {
  if (argc != 6) {
    std::printf("usage: %s BATCH HEADS SEQLEN MODE SPIN_CYCLES (MODE: 0 one CTA per tile, 1 plus helpers, "
                "2 claimed chunks, 3/4/5 two-ended with owners claiming 1/2/4)\n",
                argv[0]);
    return 2;
  }
  const int batch = std::atoi(argv[1]), heads = std::atoi(argv[2]), seqlen = std::atoi(argv[3]);
  const int mode = std::atoi(argv[4]), spin = std::atoi(argv[5]);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int tiles = batch * heads;
  const int helpers = mode == 1 ? std::max(0, sms - tiles) : 0;
  const int grid = mode >= 2 ? sms : tiles + helpers;
  unsigned* claims = nullptr;
  cudaMalloc(&claims, (tiles + 1) * sizeof(unsigned));
  cudaMemset(claims, 0, (tiles + 1) * sizeof(unsigned));
  const ProbeCache cache = make_probe_cache(static_cast<size_t>(batch) * seqlen * heads * kRowBytes);
  CtaTime* times = nullptr;
  cudaMalloc(&times, grid * sizeof(CtaTime));
  const int smem = kWarps * kStages * 2 * kChunkBytes;
  auto kernel = mode == 1 ? stream_kv<1> : stream_kv<0>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(stream_kv_claimed, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(stream_kv_two_ended<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(stream_kv_two_ended<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(stream_kv_two_ended<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const float ms = median_launch_ms([&] {
    if (mode >= 3) {
      auto two_ended = mode == 3 ? stream_kv_two_ended<1> : mode == 4 ? stream_kv_two_ended<2> : stream_kv_two_ended<4>;
      two_ended<<<grid, kWarps * 32, smem>>>(cache.k, cache.v, heads, seqlen, tiles, spin, times, claims, cache.sink);
    } else if (mode == 2) {
      stream_kv_claimed<<<grid, kWarps * 32, smem>>>(cache.k, cache.v, heads, seqlen, tiles, spin, times, claims,
                                                     cache.sink);
    } else {
      kernel<<<grid, kWarps * 32, smem>>>(cache.k, cache.v, heads, seqlen, tiles, helpers, spin, times, cache.sink);
    }
  });
  std::vector<unsigned> left(tiles + 1);
  cudaMemcpy(left.data(), claims, left.size() * sizeof(unsigned), cudaMemcpyDeviceToHost);
  for (unsigned c : left) {
    if (c != 0) {
      std::printf("a claim counter was not reset (%u)\n", c);
      return 1;
    }
  }
  std::vector<CtaTime> host(grid);
  cudaMemcpy(host.data(), times, grid * sizeof(CtaTime), cudaMemcpyDeviceToHost);
  unsigned long long first = ~0ull, last_start = 0, last = 0;
  for (const CtaTime& t : host) {
    first = std::min(first, t.start);
    last_start = std::max(last_start, t.start);
    last = std::max(last, t.end);
  }
  std::vector<double> ends;
  for (const CtaTime& t : host) ends.push_back((t.end - first) * 1e-3);
  std::vector<double> sorted = ends;
  std::sort(sorted.begin(), sorted.end());
  std::printf("batch %d heads %d seqlen %d mode %d spin %d: grid %d (%d helpers), %.4f ms, %.2f TB/s\n", batch, heads,
              seqlen, mode, spin, grid, helpers, ms, kv_tbps(cache, ms));
  std::printf("  last launch: starts within %.2f us; ends (us after first start) min %.1f p10 %.1f median %.1f "
              "p90 %.1f "
              "max %.1f\n",
              (last_start - first) * 1e-3, sorted.front(), sorted[sorted.size() / 10], sorted[sorted.size() / 2],
              sorted[sorted.size() * 9 / 10], sorted.back());
  // The slowest and fastest CTAs with their SMs.
  std::vector<int> order(grid);
  for (int i = 0; i < grid; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return ends[a] < ends[b]; });
  std::printf("  fastest:");
  for (int i = 0; i < std::min(grid, 6); ++i) {
    std::printf(" cta %d sm %u %.1f;", order[i], host[order[i]].sm, ends[order[i]]);
  }
  std::printf("\n  slowest:");
  for (int i = std::max(0, grid - 6); i < grid; ++i) {
    std::printf(" cta %d sm %u %.1f;", order[i], host[order[i]].sm, ends[order[i]]);
  }
  std::printf("\n  ends by SM (sm:us):");
  std::vector<double> by_sm(sms, -1);
  for (int i = 0; i < grid; ++i) by_sm[host[i].sm] = ends[i];
  for (int s = 0; s < sms; ++s) std::printf(" %d:%.0f", s, by_sm[s]);
  std::printf("\n");
  return 0;
}
