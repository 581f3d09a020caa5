// Thin wrappers over the PTX instructions the kernels use. Inline PTX instead
// of toolkit intrinsics keeps every kernel free of CUDA headers, so a host with
// only the driver and libnvrtc can compile it.
#pragma once

namespace jitattn {

// 16-bit element types. Values live as raw bits (unsigned short); arithmetic is
// done in fp32 and by the tensor cores.
struct f16 {
  static constexpr bool is_bf16 = false;
};
struct bf16 {
  static constexpr bool is_bf16 = true;
};

// No <cmath> (INFINITY) under NVRTC without the toolkit: build it from its bits.
#define kInfinity __int_as_float(0x7f800000)

__device__ __forceinline__ unsigned smem_u32(const void* pointer) {
  unsigned address;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }\n"
      : "=r"(address)
      : "l"(pointer));
  return address;
}

// 16-byte global→shared copy that bypasses L1. A false `valid` writes zeros
// (src-size 0) and reads nothing: out-of-range rows become zeros, never garbage
// that could turn into NaN after a multiply by 0.
__device__ __forceinline__ void cp_async_16(unsigned smem_address, const void* global, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address), "l"(global),
               "r"(src_bytes));
}

// Copies the first `bytes` (0-16) of an aligned 16-byte block and zeroes
// the rest of the destination's 16. Only those bytes are read (PTX src-size),
// but compute-sanitizer's memcheck counts the whole block: a row that ends
// within 16 bytes of an allocation's end is reported as read past it.
__device__ __forceinline__ void cp_async_16_prefix(unsigned smem_address, const void* global, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address), "l"(global), "r"(bytes));
}
// The same copy with an L2 evict-first policy, for data read once per call
// (the decode kernel's KV-cache chunks): its lines go before others when L2
// needs room. Measured on the H200 (docs/PERFORMANCE.md): decoding at batch
// 1 runs up to 3% faster, larger batches the same or up to 2% faster.
__device__ __forceinline__ void cp_async_16_evict_first(unsigned smem_address, const void* global, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem_address),
               "l"(global), "r"(src_bytes), "l"(policy));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Programmatic dependent launch (sm_90 and newer; no-ops before, and when
// the grids were launched without the programmatic-serialization attribute).
// A primary grid's CTAs allow the next grid on the stream to be scheduled;
// that grid waits, before reading anything the primary writes, until the
// primary has completed and its writes are visible.
__device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_primary_grid() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The first statement of the decode, append and combine kernels (the
// prefill kernel waits first too, and lets the next grid in later). The
// runtime launches each grid as a programmatic dependent of the previous work
// on the stream (sm_90 and newer, Runtime::Config::programmatic_launch), so a
// grid's CTAs may be resident before that work has finished: they wait here,
// before touching global memory, which keeps stream order for every read and
// write. Then they let the next grid be scheduled, so its launch overlaps
// this grid's run (it becomes resident only as this grid's last CTAs leave
// room).
__device__ __forceinline__ void begin_dependent_grid() {
  wait_for_primary_grid();
  allow_dependent_launch();
}

// Shared-memory mbarriers (sm_80 and newer; the producer-warpgroup prefill
// kernel hands tiles between warps with them). A barrier completes a phase
// when its expected count of arrivals has arrived; waiters name the phase by
// its parity. Arrivals release and completed waits acquire (CTA scope), so
// shared-memory writes before an arrival are visible after the wait.
__device__ __forceinline__ void mbarrier_init(unsigned barrier, unsigned count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(unsigned barrier) {
  asm volatile("{ .reg .b64 state; mbarrier.arrive.shared.b64 state, [%0]; }\n" ::"r"(barrier) : "memory");
}

// Arrives once every cp.async this thread issued so far has landed (the
// barrier's count includes this arrival: noinc).
__device__ __forceinline__ void cp_async_mbarrier_arrive(unsigned barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(barrier) : "memory");
}

// Arrives once every cp.async this thread issued so far has landed, adding
// a pending arrival first (no noinc): the barrier's expected count does not
// include these, so another thread's ordinary arrival completes the phase
// once every tracked copy has landed. That arrival must come after every
// thread has issued this (a barrier among them), or the phase may complete
// early. compute-sanitizer synccheck does not model the added pending
// arrival: it reports "Barrier overflow" (and then "Missing wait") on this
// pattern even in a minimal correct kernel (bench/probe_synccheck.cu, mode 0).
__device__ __forceinline__ void cp_async_mbarrier_track(unsigned barrier) {
  asm volatile("cp.async.mbarrier.arrive.shared.b64 [%0];\n" ::"r"(barrier) : "memory");
}

// Makes barrier initializations visible to the copy engine, whose tensor
// copies complete on them (sm_90; thread 0 after initializing).
__device__ __forceinline__ void fence_barrier_init() {
#if __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Tensor copies (sm_90): one thread arrives, announcing `bytes` to come, and
// the copies it then issues complete the phase once that many have landed.
// (Declared for every target so that templates parse; used on sm_90 only.)
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(unsigned barrier, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
#endif
}

// One box of a tiled tensor map (a __grid_constant__ parameter) at the
// given coordinates, innermost first, into shared memory at `destination`;
// elements outside the tensor are zero-filled. Completes on `barrier`.
__device__ __forceinline__ void tensor_copy_2d(unsigned destination, const void* map, unsigned barrier, int c0, int c1) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(destination),
      "l"(map), "r"(c0), "r"(c1), "r"(barrier)
      : "memory");
#endif
}

__device__ __forceinline__ void tensor_copy_3d(unsigned destination, const void* map, unsigned barrier, int c0, int c1,
                                               int c2) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(destination),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(barrier)
      : "memory");
#endif
}

__device__ __forceinline__ void tensor_copy_4d(unsigned destination, const void* map, unsigned barrier, int c0, int c1,
                                               int c2, int c3) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(destination),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(barrier)
      : "memory");
#endif
}

__device__ __forceinline__ void tensor_copy_5d(unsigned destination, const void* map, unsigned barrier, int c0, int c1,
                                               int c2, int c3, int c4) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, "
      "%6}], [%7];\n" ::"r"(destination),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(barrier)
      : "memory");
#endif
}

__device__ __forceinline__ void mbarrier_wait(unsigned barrier, unsigned parity) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "{ .reg .pred done;\n"
      "wait_%=: mbarrier.try_wait.parity.shared.b64 done, [%0], %1;\n"
      "@!done bra wait_%=; }\n" ::"r"(barrier), "r"(parity)
      : "memory");
#else
  asm volatile(
      "{ .reg .pred done;\n"
      "wait_%=: mbarrier.test_wait.parity.shared.b64 done, [%0], %1;\n"
      "@!done bra wait_%=; }\n" ::"r"(barrier), "r"(parity)
      : "memory");
#endif
}

// A barrier among `kThreads` threads (whole warps) under hardware barrier
// `kId`; 0 is __syncthreads'.
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// The same with a barrier chosen at run time (one per warpgroup).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Counts this warp's arrival on a named barrier of `threads` without waiting
// for the others (they wait with named_barrier_sync).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Moves registers between the warpgroups of a CTA (sm_90a): a warpgroup that
// needs few gives some back, one that needs many takes them. Elsewhere a
// no-op: every warp keeps the launch's per-thread count.
template <int kRegisters>
__device__ __forceinline__ void warpgroup_registers_release() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#endif
}

template <int kRegisters>
__device__ __forceinline__ void warpgroup_registers_claim() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#endif
}

// Four 8×8 16-bit matrices from shared memory; lanes 8i..8i+7 give the row
// addresses of matrix i, and register i receives matrix i's fragment.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned smem_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address));
}

// As ldmatrix_x4, each matrix transposed: rows in shared memory become columns.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned smem_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address));
}

// d += a·b for one m16n8k16 tile: a row-major 16×16, b column-major 16×8, fp32 accumulators.
template <class Element>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (Element::is_bf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two fp32 values rounded to nearest and packed into one register, `lo` in the low half.
template <class Element>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  unsigned packed;
  if constexpr (Element::is_bf16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
  }
  return packed;
}

// The two 16-bit values of a packed register as fp32 (`lo` from the low half).
template <class Element>
__device__ __forceinline__ void unpack2(unsigned packed, float& lo, float& hi) {
  if constexpr (Element::is_bf16) {
    // bf16 is the top half of an fp32.
    lo = __uint_as_float(packed << 16);
    hi = __uint_as_float(packed & 0xffff0000u);
  } else {
    const unsigned short lo_bits = static_cast<unsigned short>(packed & 0xffffu);
    const unsigned short hi_bits = static_cast<unsigned short>(packed >> 16);
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(lo) : "h"(lo_bits));
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(hi) : "h"(hi_bits));
  }
}

// Packed 16-bit arithmetic on both halves of a register at once, each result
// rounded once to the element type (one instruction for two values).
template <class Element>
__device__ __forceinline__ unsigned mul2(unsigned a, unsigned b) {
  unsigned d;
  if constexpr (Element::is_bf16) {
    // mul.bf16x2 needs sm_90; a fused multiply-add of −0 is the same product
    // (exact, signed zeros kept) from sm_80 on.
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  } else {
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  }
  return d;
}

template <class Element>
__device__ __forceinline__ unsigned fma2(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  if constexpr (Element::is_bf16) {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  } else {
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  }
  return d;
}

// Hides a value's origin from the compiler. Applied to shared-memory tile
// bases once per main-loop iteration, it makes the per-fragment addresses
// derived from them cheap to recompute rather than loop invariants that ptxas
// would keep live (and spill) across the whole loop.
__device__ __forceinline__ unsigned opaque(unsigned value) {
  asm volatile("" : "+r"(value));
  return value;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// sin and cos of an fp32 angle of any magnitude (RoPE angles reach 10^5
// radians): Cody–Waite reduction by a two-part 2π to [-π, π], where the MUFU
// approximations are accurate to about 2^-21 absolute.
__device__ __forceinline__ void sincos_reduced(float angle, float& sine, float& cosine) {
  float turns, reduced;
  asm("cvt.rni.f32.f32 %0, %1;\n" : "=f"(turns) : "f"(angle * 0.159154943091895336f));
  // 2π = 6.28318548202514648 (nearest float) - 1.74845553e-7.
  asm("fma.rn.f32 %0, %1, %2, %3;\n" : "=f"(reduced) : "f"(-turns), "f"(6.28318548202514648f), "f"(angle));
  asm("fma.rn.f32 %0, %1, %2, %3;\n" : "=f"(reduced) : "f"(turns), "f"(1.74845553e-7f), "f"(reduced));
  asm("sin.approx.ftz.f32 %0, %1;\n" : "=f"(sine) : "f"(reduced));
  asm("cos.approx.ftz.f32 %0, %1;\n" : "=f"(cosine) : "f"(reduced));
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace jitattn
