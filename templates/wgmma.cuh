// Warpgroup MMA (wgmma, sm_90a): the asynchronous tensor-core instructions
// of Hopper. A warpgroup (four consecutive warps, 128 threads) issues each
// instruction together; the operands come from shared memory through 64-bit
// matrix descriptors (or, for A, from registers), and the accumulators stay
// in registers. The instructions run asynchronously until a wait on their
// commit group, so the issuing warps are free to do other work meanwhile.
//
// Tiles here use wgmma's 128-byte swizzle: 64-column panels whose rows are
// 128 bytes, 16-byte chunk c of row r stored at chunk c ^ (r % 8), and every
// 8-row group (1 KB) 1 KB aligned. For d ≤ 64 that is exactly the swizzled
// row-major layout of the mma.sync kernels.
#pragma once

namespace jitattn {

// A shared-memory matrix descriptor for the 128-byte swizzle: start address,
// "leading" byte offset (K-major: unused; MN-major: from one 64-element
// panel to the next), "stride" byte offset (from one 8-row group to the
// next: 1 KB within a panel, more where groups of several panels take turns:
// FwdConfig::kKVGroupAtoms), all in 16-byte units.
__device__ __forceinline__ unsigned long long wgmma_descriptor(unsigned address, unsigned leading_bytes,
                                                               unsigned group_bytes = 1024) {
  constexpr unsigned long long kSwizzle128 = 1ull << 62;
  return static_cast<unsigned long long>((address & 0x3ffff) >> 4) |
         static_cast<unsigned long long>((leading_bytes >> 4) & 0x3fff) << 16 |
         static_cast<unsigned long long>((group_bytes >> 4) & 0x3fff) << 32 | kSwizzle128;
}

// The descriptor of `address + bytes` from that of `address`. Shared-window
// addresses are below 256 KB, so the start-address field (bits 0-13, in
// 16-byte units) never carries into the fields above it: a k-step's operand
// is one 32-bit add from its tile's descriptor instead of a descriptor built
// again from its address.
__device__ __forceinline__ unsigned long long wgmma_descriptor_at(unsigned long long descriptor, unsigned bytes) {
  const unsigned low = static_cast<unsigned>(descriptor) + (bytes >> 4);
  return (descriptor & 0xffffffff00000000ull) | low;
}

// Orders this thread's earlier register and shared-memory accesses before the
// next wgmma (required whenever its accumulators or A registers were written
// by ordinary instructions since the last wgmma).
__device__ __forceinline__ void wgmma_fence() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Waits until at most kPending committed wgmma groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Shared-memory writes made by ordinary stores (and cp.async) become visible
// to wgmma's reads (the async proxy) only across this fence.
__device__ __forceinline__ void fence_async_shared() {
#if __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Pins accumulator registers in place: the compiler may not move reads or
// writes of them across this point (a wgmma in flight owns them until its
// wait).
template <int kTiles>
__device__ __forceinline__ void wgmma_hold(float (&d)[kTiles][4]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    asm volatile("" : "+f"(d[t][0]), "+f"(d[t][1]), "+f"(d[t][2]), "+f"(d[t][3])::"memory");
  }
}

// Operand lists of the instructions below: N/8 accumulator tiles of four
// registers, in the order of the mma.sync m16n8 C fragment (tile t holds
// columns 8t..8t+7 of this warp's 16 rows).
// C is the constraint: "+f" (accumulate) or "=f" (overwrite; scale-d 0).
// The register-A forms (RS) also take TRANS_B: "1" for an N-major B (V),
// "0" for a K-major one (K).
#define JITATTN_WGMMA_TILE(C, t) C(d[t][0]), C(d[t][1]), C(d[t][2]), C(d[t][3])

#define JITATTN_WGMMA_SS_N32(TYPES, C, SCALE_D) \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, " SCALE_D ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32" TYPES " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
               "%16, %17, p, 1, 1, 0, 0; }\n" \
               : JITATTN_WGMMA_TILE(C, 0), JITATTN_WGMMA_TILE(C, 1), JITATTN_WGMMA_TILE(C, 2), JITATTN_WGMMA_TILE(C, 3) \
               : "l"(a_descriptor), "l"(b_descriptor))

#define JITATTN_WGMMA_RS_N32(TYPES, C, SCALE_D, TRANS_B) \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, " SCALE_D ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32" TYPES " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
               "{%16, %17, %18, %19}, %20, p, 1, 1, " TRANS_B "; }\n" \
               : JITATTN_WGMMA_TILE(C, 0), JITATTN_WGMMA_TILE(C, 1), JITATTN_WGMMA_TILE(C, 2), JITATTN_WGMMA_TILE(C, 3) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor))

#define JITATTN_WGMMA_SS_N64(TYPES, C, SCALE_D) \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, " SCALE_D ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32" TYPES " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
               "%32, %33, p, 1, 1, 0, 0; }\n" \
               : JITATTN_WGMMA_TILE(C, 0), JITATTN_WGMMA_TILE(C, 1), JITATTN_WGMMA_TILE(C, 2), JITATTN_WGMMA_TILE(C, 3), JITATTN_WGMMA_TILE(C, 4), JITATTN_WGMMA_TILE(C, 5), JITATTN_WGMMA_TILE(C, 6), JITATTN_WGMMA_TILE(C, 7) \
               : "l"(a_descriptor), "l"(b_descriptor))

#define JITATTN_WGMMA_RS_N64(TYPES, C, SCALE_D, TRANS_B) \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, " SCALE_D ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32" TYPES " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
               "{%32, %33, %34, %35}, %36, p, 1, 1, " TRANS_B "; }\n" \
               : JITATTN_WGMMA_TILE(C, 0), JITATTN_WGMMA_TILE(C, 1), JITATTN_WGMMA_TILE(C, 2), JITATTN_WGMMA_TILE(C, 3), JITATTN_WGMMA_TILE(C, 4), JITATTN_WGMMA_TILE(C, 5), JITATTN_WGMMA_TILE(C, 6), JITATTN_WGMMA_TILE(C, 7) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor))

#define JITATTN_WGMMA_SS_N80(TYPES, C, SCALE_D) \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, " SCALE_D ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n80k16.f32" TYPES " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, " \
               "%40, %41, p, 1, 1, 0, 0; }\n" \
               : JITATTN_WGMMA_TILE(C, 0), JITATTN_WGMMA_TILE(C, 1), JITATTN_WGMMA_TILE(C, 2), JITATTN_WGMMA_TILE(C, 3), JITATTN_WGMMA_TILE(C, 4), JITATTN_WGMMA_TILE(C, 5), JITATTN_WGMMA_TILE(C, 6), JITATTN_WGMMA_TILE(C, 7), JITATTN_WGMMA_TILE(C, 8), JITATTN_WGMMA_TILE(C, 9) \
               : "l"(a_descriptor), "l"(b_descriptor))

#define JITATTN_WGMMA_RS_N80(TYPES, C, SCALE_D, TRANS_B) \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, " SCALE_D ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n80k16.f32" TYPES " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, " \
               "{%40, %41, %42, %43}, %44, p, 1, 1, " TRANS_B "; }\n" \
               : JITATTN_WGMMA_TILE(C, 0), JITATTN_WGMMA_TILE(C, 1), JITATTN_WGMMA_TILE(C, 2), JITATTN_WGMMA_TILE(C, 3), JITATTN_WGMMA_TILE(C, 4), JITATTN_WGMMA_TILE(C, 5), JITATTN_WGMMA_TILE(C, 6), JITATTN_WGMMA_TILE(C, 7), JITATTN_WGMMA_TILE(C, 8), JITATTN_WGMMA_TILE(C, 9) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor))

#define JITATTN_WGMMA_SS_N96(TYPES, C, SCALE_D) \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, " SCALE_D ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n96k16.f32" TYPES " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, " \
               "%48, %49, p, 1, 1, 0, 0; }\n" \
               : JITATTN_WGMMA_TILE(C, 0), JITATTN_WGMMA_TILE(C, 1), JITATTN_WGMMA_TILE(C, 2), JITATTN_WGMMA_TILE(C, 3), JITATTN_WGMMA_TILE(C, 4), JITATTN_WGMMA_TILE(C, 5), JITATTN_WGMMA_TILE(C, 6), JITATTN_WGMMA_TILE(C, 7), JITATTN_WGMMA_TILE(C, 8), JITATTN_WGMMA_TILE(C, 9), JITATTN_WGMMA_TILE(C, 10), JITATTN_WGMMA_TILE(C, 11) \
               : "l"(a_descriptor), "l"(b_descriptor))

#define JITATTN_WGMMA_RS_N96(TYPES, C, SCALE_D, TRANS_B) \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, " SCALE_D ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n96k16.f32" TYPES " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, " \
               "{%48, %49, %50, %51}, %52, p, 1, 1, " TRANS_B "; }\n" \
               : JITATTN_WGMMA_TILE(C, 0), JITATTN_WGMMA_TILE(C, 1), JITATTN_WGMMA_TILE(C, 2), JITATTN_WGMMA_TILE(C, 3), JITATTN_WGMMA_TILE(C, 4), JITATTN_WGMMA_TILE(C, 5), JITATTN_WGMMA_TILE(C, 6), JITATTN_WGMMA_TILE(C, 7), JITATTN_WGMMA_TILE(C, 8), JITATTN_WGMMA_TILE(C, 9), JITATTN_WGMMA_TILE(C, 10), JITATTN_WGMMA_TILE(C, 11) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor))

#define JITATTN_WGMMA_SS_N128(TYPES, C, SCALE_D) \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, " SCALE_D ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32" TYPES " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
               "%64, %65, p, 1, 1, 0, 0; }\n" \
               : JITATTN_WGMMA_TILE(C, 0), JITATTN_WGMMA_TILE(C, 1), JITATTN_WGMMA_TILE(C, 2), JITATTN_WGMMA_TILE(C, 3), JITATTN_WGMMA_TILE(C, 4), JITATTN_WGMMA_TILE(C, 5), JITATTN_WGMMA_TILE(C, 6), JITATTN_WGMMA_TILE(C, 7), JITATTN_WGMMA_TILE(C, 8), JITATTN_WGMMA_TILE(C, 9), JITATTN_WGMMA_TILE(C, 10), JITATTN_WGMMA_TILE(C, 11), JITATTN_WGMMA_TILE(C, 12), JITATTN_WGMMA_TILE(C, 13), JITATTN_WGMMA_TILE(C, 14), JITATTN_WGMMA_TILE(C, 15) \
               : "l"(a_descriptor), "l"(b_descriptor))

#define JITATTN_WGMMA_RS_N128(TYPES, C, SCALE_D, TRANS_B) \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, " SCALE_D ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32" TYPES " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
               "{%64, %65, %66, %67}, %68, p, 1, 1, " TRANS_B "; }\n" \
               : JITATTN_WGMMA_TILE(C, 0), JITATTN_WGMMA_TILE(C, 1), JITATTN_WGMMA_TILE(C, 2), JITATTN_WGMMA_TILE(C, 3), JITATTN_WGMMA_TILE(C, 4), JITATTN_WGMMA_TILE(C, 5), JITATTN_WGMMA_TILE(C, 6), JITATTN_WGMMA_TILE(C, 7), JITATTN_WGMMA_TILE(C, 8), JITATTN_WGMMA_TILE(C, 9), JITATTN_WGMMA_TILE(C, 10), JITATTN_WGMMA_TILE(C, 11), JITATTN_WGMMA_TILE(C, 12), JITATTN_WGMMA_TILE(C, 13), JITATTN_WGMMA_TILE(C, 14), JITATTN_WGMMA_TILE(C, 15) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor))

#define JITATTN_WGMMA_SS_N176(TYPES, C, SCALE_D) \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, " SCALE_D ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n176k16.f32" TYPES " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, " \
               "%88, %89, p, 1, 1, 0, 0; }\n" \
               : JITATTN_WGMMA_TILE(C, 0), JITATTN_WGMMA_TILE(C, 1), JITATTN_WGMMA_TILE(C, 2), JITATTN_WGMMA_TILE(C, 3), JITATTN_WGMMA_TILE(C, 4), JITATTN_WGMMA_TILE(C, 5), JITATTN_WGMMA_TILE(C, 6), JITATTN_WGMMA_TILE(C, 7), JITATTN_WGMMA_TILE(C, 8), JITATTN_WGMMA_TILE(C, 9), JITATTN_WGMMA_TILE(C, 10), JITATTN_WGMMA_TILE(C, 11), JITATTN_WGMMA_TILE(C, 12), JITATTN_WGMMA_TILE(C, 13), JITATTN_WGMMA_TILE(C, 14), JITATTN_WGMMA_TILE(C, 15), JITATTN_WGMMA_TILE(C, 16), JITATTN_WGMMA_TILE(C, 17), JITATTN_WGMMA_TILE(C, 18), JITATTN_WGMMA_TILE(C, 19), JITATTN_WGMMA_TILE(C, 20), JITATTN_WGMMA_TILE(C, 21) \
               : "l"(a_descriptor), "l"(b_descriptor))

// The widths N that JITATTN_WGMMA_PICK spells out (callers that choose
// between forms ask here instead of repeating the list).
__host__ __device__ constexpr bool wgmma_picks_width(int n) {
  return n == 32 || n == 64 || n == 80 || n == 96 || n == 128;
}

// Picks the instruction of width N (the form's own arguments follow FORM).
#define JITATTN_WGMMA_PICK(FORM, ...)                    \
  if constexpr (N == 32) FORM##_N32(__VA_ARGS__);        \
  else if constexpr (N == 64) FORM##_N64(__VA_ARGS__);   \
  else if constexpr (N == 80) FORM##_N80(__VA_ARGS__);   \
  else if constexpr (N == 96) FORM##_N96(__VA_ARGS__);   \
  else if constexpr (N == 128) FORM##_N128(__VA_ARGS__); \
  else static_assert(N == 32, "wgmma N must be 32, 64, 80, 96 or 128");

// S = Q Kᵀ also over 176-key blocks (SS only: P V's N is the head dim, at
// most 128 an instruction).
#define JITATTN_WGMMA_PICK_WIDE(FORM, ...)        \
  if constexpr (N == 176) FORM##_N176(__VA_ARGS__); \
  else JITATTN_WGMMA_PICK(FORM, __VA_ARGS__)

// d (+)= A·B for a 64×N tile: A (64×16, K-major) and B (N×16, K-major) from
// shared memory. ACCUMULATE false overwrites d (write-only registers, so no
// instruction has to define them first).
template <class Element, int N, bool ACCUMULATE>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], unsigned long long a_descriptor,
                                         unsigned long long b_descriptor) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  if constexpr (Element::is_bf16 && ACCUMULATE) {
    JITATTN_WGMMA_PICK_WIDE(JITATTN_WGMMA_SS, ".bf16.bf16", "+f", "1")
  } else if constexpr (Element::is_bf16) {
    JITATTN_WGMMA_PICK_WIDE(JITATTN_WGMMA_SS, ".bf16.bf16", "=f", "0")
  } else if constexpr (ACCUMULATE) {
    JITATTN_WGMMA_PICK_WIDE(JITATTN_WGMMA_SS, ".f16.f16", "+f", "1")
  } else {
    JITATTN_WGMMA_PICK_WIDE(JITATTN_WGMMA_SS, ".f16.f16", "=f", "0")
  }
#endif
}

// d += A·B for a 64×N tile: A (64×16) from registers in the mma.sync
// m16n8k16 A-fragment layout (this warp's 16 rows), B (16×N, N-major: rows of
// 16 keys whose N values are contiguous, as V sits in shared memory) through
// its descriptor.
template <class Element, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const unsigned (&a)[4],
                                         unsigned long long b_descriptor) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  if constexpr (Element::is_bf16) {
    JITATTN_WGMMA_PICK(JITATTN_WGMMA_RS, ".bf16.bf16", "+f", "1", "1")
  } else {
    JITATTN_WGMMA_PICK(JITATTN_WGMMA_RS, ".f16.f16", "+f", "1", "1")
  }
#endif
}

// d (+)= A·B for a 64×N tile: A (64×16) from registers in the mma.sync
// m16n8k16 A-fragment layout (this warp's 16 rows), B (N×16, K-major, as K
// sits in shared memory) through its descriptor. ACCUMULATE false overwrites
// d. (S = Q Kᵀ with Q in registers: fused RoPE rotates Q there.)
template <class Element, int N, bool ACCUMULATE>
__device__ __forceinline__ void wgmma_rs_k_major(float (&d)[N / 8][4], const unsigned (&a)[4],
                                                 unsigned long long b_descriptor) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  if constexpr (Element::is_bf16 && ACCUMULATE) {
    JITATTN_WGMMA_PICK(JITATTN_WGMMA_RS, ".bf16.bf16", "+f", "1", "0")
  } else if constexpr (Element::is_bf16) {
    JITATTN_WGMMA_PICK(JITATTN_WGMMA_RS, ".bf16.bf16", "=f", "0", "0")
  } else if constexpr (ACCUMULATE) {
    JITATTN_WGMMA_PICK(JITATTN_WGMMA_RS, ".f16.f16", "+f", "1", "0")
  } else {
    JITATTN_WGMMA_PICK(JITATTN_WGMMA_RS, ".f16.f16", "=f", "0", "0")
  }
#endif
}

// d += A·B over an N-major B of panels (V's tile: 64 columns a panel,
// panel_bytes apart) for a 64×HEAD_DIM output: one wgmma per 128 columns,
// the widest spelled out above, then what is left (192: 64). Each
// instruction starts on a panel, where B's swizzle atoms start.
// b_descriptor: B's first panel (its leading byte offset panel_bytes).
template <class Element, int HEAD_DIM, int FIRST = 0>
__device__ __forceinline__ void wgmma_rs_panels(float (&d)[HEAD_DIM / 8][4], const unsigned (&a)[4],
                                                unsigned long long b_descriptor, unsigned panel_bytes) {
  constexpr int kColumns = HEAD_DIM - FIRST < 128 ? HEAD_DIM - FIRST : 128;
  wgmma_rs<Element, kColumns>(*reinterpret_cast<float(*)[kColumns / 8][4]>(&d[FIRST / 8]), a,
                              wgmma_descriptor_at(b_descriptor, FIRST / 64 * panel_bytes));
  if constexpr (FIRST + 128 < HEAD_DIM) {
    wgmma_rs_panels<Element, HEAD_DIM, FIRST + 128>(d, a, b_descriptor, panel_bytes);
  }
}

#undef JITATTN_WGMMA_PICK_WIDE
#undef JITATTN_WGMMA_PICK

}  // namespace jitattn
