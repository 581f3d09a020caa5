#include <fmt/format.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "argument_error.hpp"
#include "cli/presets.hpp"
#include "plan.hpp"
#include "reference.hpp"

using namespace jitattn;
using namespace jitattn::detail;

namespace {

// Fake, suitably aligned device addresses: plan never dereferences them.
void* address(uintptr_t base) { return reinterpret_cast<void*>(base); }

// A paged cache's V pages right after K's, in one allocation (as engines
// keep a layer's cache): kernels that read both by one tensor copy need
// them apart (KernelSpec::interleaved_kv).
void values_after_keys(KVCacheArgs& cache) { cache.v_cache = jitattn::cli::values_after(cache.k_cache); }

// A contiguous bf16 KV cache of `batch` sequences of `rows` rows (K, V and
// cache_seqlens at fixed fake addresses).
KVCacheArgs contiguous_cache(int64_t batch, int64_t rows, int64_t heads_kv, int64_t head_dim) {
  KVCacheArgs args;
  args.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {batch, rows, heads_kv, head_dim});
  args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {batch, rows, heads_kv, head_dim});
  args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
  return args;
}

struct Call {
  TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {2, 100, 8, 128});
  TensorView k = TensorView::contiguous(address(0x20000), DType::bf16, {2, 300, 2, 128});
  TensorView v = TensorView::contiguous(address(0x30000), DType::bf16, {2, 300, 2, 128});
  TensorView out = TensorView::contiguous(address(0x40000), DType::bf16, {2, 100, 8, 128});
  TensorView lse = TensorView::contiguous(address(0x50000), DType::f32, {2, 8, 100});
  ForwardOptions options;
  ForwardPlan plan(bool with_lse = true, int smem = 227 * 1024, const char* arch = "sm_90a", int sm_count = 132) const {
    return plan_forward(q, k, v, out, with_lse ? &lse : nullptr, options, Arch::parse(arch), smem, sm_count);
  }
};

// Makes `call` one of batch × seqlen queries and keys, 16 heads of head_dim.
void resize_dense(Call& call, int64_t batch, int64_t seqlen, int64_t head_dim) {
  call.q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, seqlen, 16, head_dim});
  call.k = TensorView::contiguous(address(0x20000), DType::bf16, {batch, seqlen, 16, head_dim});
  call.v = TensorView::contiguous(address(0x30000), DType::bf16, {batch, seqlen, 16, head_dim});
  call.out = TensorView::contiguous(address(0x40000), DType::bf16, {batch, seqlen, 16, head_dim});
  call.lse = TensorView::contiguous(address(0x50000), DType::f32, {batch, 16, seqlen});
}

}  // namespace

TEST_SUITE("plan") {

TEST_CASE("a valid call becomes a spec, launch parameters and a grid") {
  Call call;
  call.options.causal = true;
  const ForwardPlan plan = call.plan();
  // Short causal problems get the built-in small query block.
  CHECK(plan.spec.text() == "fwd.bf16.d128.br64.bc64.w4.causal");
  CHECK(plan.grid == 2 * 8 * 2);  // ceil(100 / 64) × heads × batch
  const FwdParams& p = plan.params;
  CHECK(p.q == call.q.data);
  CHECK(p.lse == call.lse.data);
  CHECK(p.q_batch_stride == 100 * 8 * 128);
  CHECK(p.q_row_stride == 8 * 128);
  CHECK(p.q_head_stride == 128);
  CHECK(p.k_row_stride == 2 * 128);
  CHECK(p.lse_head_stride == 100);
  CHECK(p.heads_per_kv == 4);
  CHECK(p.seqlen_q == 100);
  CHECK(p.seqlen_k == 300);
  CHECK(p.num_q_blocks == 2);
  CHECK(p.scale == doctest::Approx(1 / std::sqrt(128.0)));
  CHECK(p.scale_log2 == doctest::Approx(1 / std::sqrt(128.0) * 1.4426950408889634));
}

TEST_CASE("the built-in tiles follow the seqlen bucket") {
  Call call;
  call.options.causal = true;
  call.k.shape[1] = call.v.shape[1] = 4000;  // bucket 4096
  call.k.strides[0] = call.v.strides[0] = 4000 * 2 * 128;
  CHECK(call.plan().spec.text() == "fwd.bf16.d128.br128.bc64.w4.causal");
  call.options.causal = false;
  call.k.shape[1] = call.v.shape[1] = 300;
  CHECK(call.plan().spec.text() == "fwd.bf16.d128.br128.bc64.w4");
}

TEST_CASE("forced tiles and scale are used") {
  Call call;
  call.options.tiles = {64, 32, 4};
  call.options.softmax_scale = 0.5f;
  const ForwardPlan plan = call.plan(false);
  CHECK(plan.spec.text() == "fwd.bf16.d128.br64.bc32.w4");
  CHECK(plan.grid == 2 * 8 * 2);
  CHECK(plan.params.lse == nullptr);
  CHECK(plan.params.scale == 0.5f);
}

TEST_CASE("GQA: short query sequences pack a KV head's query heads into one tile, unless told otherwise") {
  auto with_queries = [](int64_t seqlen_q) {
    Call call;
    call.q.shape[1] = call.out.shape[1] = call.lse.shape[2] = seqlen_q;
    call.q.strides[0] = call.out.strides[0] = seqlen_q * 8 * 128;
    call.lse.strides[0] = 8 * seqlen_q;
    call.lse.strides[1] = seqlen_q;
    return call;
  };
  Call call = with_queries(12);  // 12 queries × 4 heads per KV head: 48 rows
  ForwardPlan plan = call.plan();
  CHECK(plan.spec.pack_gqa);
  CHECK(plan.spec.text().find(".packgqa") != std::string::npos);
  CHECK(plan.params.num_q_blocks == 1);
  CHECK(plan.grid == 1 * 2 * 2);  // one tile per (KV head, batch)
  call.options.pack_gqa = false;
  plan = call.plan();
  CHECK_FALSE(plan.spec.pack_gqa);
  CHECK(plan.grid == 1 * 8 * 2);
  // At most 32 packed rows (3 queries × 4 heads) take the decode kernel,
  // which always packs; unpacked they take the prefill tiles.
  call = with_queries(3);
  plan = call.plan();
  CHECK(plan.spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.dense");
  CHECK(plan.grid == 1 * 2 * 2);
  call.options.pack_gqa = false;
  CHECK(call.plan().spec.family == Family::fwd);
  CHECK(call.plan().grid == 1 * 8 * 2);
  // Long sequences fill their tiles: no packing unless forced.
  Call long_call;
  CHECK_FALSE(long_call.plan().spec.pack_gqa);
  long_call.options.pack_gqa = true;
  plan = long_call.plan();
  CHECK(plan.spec.pack_gqa);
  CHECK(plan.params.num_q_blocks == (100 * 4 + plan.spec.block_q - 1) / plan.spec.block_q);
  // Without GQA there is nothing to pack.
  long_call.k.shape[2] = long_call.v.shape[2] = 8;
  long_call.k.strides[0] = long_call.v.strides[0] = 300 * 8 * 128;
  long_call.k.strides[1] = long_call.v.strides[1] = 8 * 128;
  CHECK_FALSE(long_call.plan().spec.pack_gqa);
}

TEST_CASE("forced persistent wgmma tiles: one wave of CTAs at most, sized by the SM count") {
  Call call;  // 2 × 8 heads × ceil(100 / 128) = 16 tiles
  call.options.tiles = {128, 128, 8, 2, true, true};
  ForwardPlan plan = call.plan();
  CHECK(plan.spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent");
  CHECK(plan.grid == 16);  // fewer tiles than SMs: one CTA each
  CHECK(plan.params.num_q_blocks == 1);
  // 2 × 8 heads × ceil(1000 / 128) = 128 tiles.
  call.q = TensorView::contiguous(address(0x10000), DType::bf16, {2, 1000, 8, 128});
  call.out = TensorView::contiguous(address(0x40000), DType::bf16, {2, 1000, 8, 128});
  call.lse = TensorView::contiguous(address(0x50000), DType::f32, {2, 8, 1000});
  plan = call.plan(true, 227 * 1024, "sm_90a", 100);
  CHECK(plan.params.num_q_blocks == 8);
  CHECK(plan.grid == 100);  // 128 tiles on 100 SMs, one 192 KB CTA each
  CHECK(call.plan(true, 227 * 1024, "sm_90a", 132).grid == 128);
  CHECK(call.plan(true, 227 * 1024, "sm_90a", 1).grid == 1);
  // The caller may leave SMs to other kernels.
  call.options.sm_limit = 5;
  CHECK(call.plan().grid == 5);
  call.options.sm_limit = 500;
  CHECK(call.plan().grid == 128);
  call.options.sm_limit = -1;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("options.sm_limit=-1 must be >= 0"), Error);
  call.options.sm_limit = 0;
  call.k = call.v = TensorView::contiguous(address(0x20000), DType::bf16, {2, 300, 2, 128});
  // Persistent needs the wgmma tiles; wgmma needs sm_90a.
  call.options.tiles = {128, 128, 8, 2, false, true};
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("options.tiles.persistent needs options.tiles.wgmma"), Error);
  call.options.tiles = {128, 128, 8, 2, true, true};
  CHECK_THROWS_WITH_AS(call.plan(true, 227 * 1024, "sm_90"), doctest::Contains("wgmma needs sm_90a"), Error);
  // Two Q tiles do not fit beside three 64 KB stages at head dim 128.
  call.options.tiles = {128, 128, 8, 3, true, true};
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("bytes of shared memory per block"), Error);
}

TEST_CASE("the planner runs the wgmma tiles persistent with more tiles than SMs where that measured faster") {
  Call call;
  const auto resize = [&](int64_t batch, int64_t seqlen_q, int64_t seqlen_k) {
    call.q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, seqlen_q, 16, 128});
    call.k = TensorView::contiguous(address(0x20000), DType::bf16, {batch, seqlen_k, 16, 128});
    call.v = TensorView::contiguous(address(0x30000), DType::bf16, {batch, seqlen_k, 16, 128});
    call.out = TensorView::contiguous(address(0x40000), DType::bf16, {batch, seqlen_q, 16, 128});
    call.lse = TensorView::contiguous(address(0x50000), DType::f32, {batch, 16, seqlen_q});
  };
  call.options.causal = true;
  resize(2, 2048, 2048);  // 512 tiles
  ForwardPlan plan = call.plan();
  CHECK(plan.spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.causal");
  CHECK(plan.grid == 132);
  CHECK(call.plan(true, 227 * 1024, "sm_90a", 78).grid == 78);
  resize(2, 4096, 4096);
  CHECK(call.plan().spec.persistent);
  resize(2, 8192, 8192);  // more keys: every head's K/V at once exceeds L2
  CHECK_FALSE(call.plan().spec.persistent);
  CHECK(call.plan().spec.wgmma);
  resize(1, 512, 8192);
  CHECK_FALSE(call.plan().spec.persistent);
  resize(2, 1024, 1024);  // 256 tiles: persistent on 132 SMs, not on 256
  CHECK(call.plan().spec.persistent);
  CHECK_FALSE(call.plan(true, 227 * 1024, "sm_90a", 256).spec.persistent);
  // Full causal grids at head dim 128 up to 4096 keys, however many waves
  // of tiles (their 128-row tiles go head by head).
  resize(4, 2048, 2048);  // 1024 tiles
  CHECK(call.plan().spec.persistent);
  resize(8, 2048, 2048);  // 2048 tiles
  CHECK(call.plan().spec.persistent);
  resize(16, 1024, 1024);  // 2048 tiles of 1024 keys
  CHECK(call.plan().spec.persistent);
  resize(8, 4096, 4096);  // 4096 tiles
  CHECK(call.plan().spec.persistent);
  resize(32, 512, 512);  // 2048 tiles of 512 keys
  CHECK(call.plan().spec.persistent);
  // Without a mask at head dim 128: up to 1024 keys.
  call.options.causal = false;
  CHECK(call.plan().spec.persistent);
  resize(2, 1024, 1024);
  CHECK(call.plan().spec.persistent);
  resize(2, 2048, 2048);
  CHECK_FALSE(call.plan().spec.persistent);
  CHECK(call.plan().spec.wgmma);
  call.options.causal = true;
  // RoPE from theta: the same rule.
  call.options.rope.style = RopeStyle::rotate_half;
  call.options.rope.rotary_dim = 128;
  resize(16, 1024, 1024);
  CHECK(call.plan().spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.causal.rope_half_r128");
  resize(2, 8192, 8192);
  CHECK_FALSE(call.plan().spec.persistent);
  // RoPE with f32 tables at 128: the ordinary kernel stages them beside K,
  // the persistent one has no room; persistent up to 2048 keys in 12 waves.
  TensorView cos = TensorView::contiguous(address(0x70000), DType::f32, {16384, 64});
  call.options.rope.style = RopeStyle::rotate_half;
  call.options.rope.rotary_dim = 128;
  call.options.rope.cos = call.options.rope.sin = &cos;
  resize(2, 2048, 2048);
  plan = call.plan();
  CHECK(plan.spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.causal.rope_half_r128.rope_tables");
  CHECK(plan.spec.rope_table_slots() == 0);
  resize(2, 4096, 4096);
  plan = call.plan();
  CHECK_FALSE(plan.spec.persistent);
  CHECK(plan.spec.rope_table_slots() == 1);
  resize(32, 512, 512);
  CHECK_FALSE(call.plan().spec.persistent);
  // 16-bit tables fit beside the second Q tile: the rules above.
  TensorView cos16 = TensorView::contiguous(address(0x70000), DType::bf16, {16384, 64});
  call.options.rope.cos = call.options.rope.sin = &cos16;
  CHECK(call.plan().spec.persistent);
  resize(2, 4096, 4096);
  CHECK(call.plan().spec.persistent);
  call.options.rope = RopeOptions{};
  // Forced tiles stay as forced; other archs have no wgmma.
  call.options.tiles = {128, 128, 8, 2, true};
  CHECK_FALSE(call.plan().spec.persistent);
  call.options.tiles = {};
  CHECK_FALSE(call.plan(true, 227 * 1024, "sm_90").spec.persistent);
  // Three warpgroups with packed GQA would spill: ordinary grid.
  // (96 sequences × 2 KV heads = 192 tiles of 16 queries × 12 heads.)
  call.q = TensorView::contiguous(address(0x10000), DType::bf16, {96, 16, 24, 64});
  call.out = TensorView::contiguous(address(0x40000), DType::bf16, {96, 16, 24, 64});
  call.lse = TensorView::contiguous(address(0x50000), DType::f32, {96, 24, 16});
  call.k = TensorView::contiguous(address(0x20000), DType::bf16, {96, 2048, 2, 64});
  call.v = TensorView::contiguous(address(0x30000), DType::bf16, {96, 2048, 2, 64});
  plan = call.plan();
  CHECK(plan.spec.pack_gqa);
  CHECK(plan.spec.warps == 12);
  CHECK(plan.grid == 192);
  CHECK_FALSE(plan.spec.persistent);
  call.options.pack_gqa = false;  // 96 · 24 heads = 2304 tiles of 16 rows (128-row tiles)
  CHECK(call.plan().spec.persistent);
  CHECK(call.plan().spec.block_q == 128);
}

TEST_CASE("sm_90a takes the wgmma family once its tiles fill the GPU (above head dim 128 too)") {
  Call call;
  const auto resize = [&](int64_t batch, int64_t seqlen, int64_t head_dim) {
    resize_dense(call, batch, seqlen, head_dim);
  };
  call.options.causal = true;
  call.options.rope.style = RopeStyle::rotate_half;
  resize(8, 4096, 64);  // 8 · 16 · 4096 / 128 = 4096 tiles, 2048 keys per tile on average
  ForwardPlan plan = call.plan();
  CHECK(plan.spec.text() == "fwd.bf16.d64.br128.bc128.w8.s4.wgmma.persistent.causal.rope_half_r64");
  CHECK(plan.params.num_q_blocks == 4096 / 128);
  CHECK(plan.spec.threads() == 8 * 32 + 128);
  // Causal at head_dim 64: persistent up to 8192 keys.
  resize(2, 16384, 64);
  CHECK(call.plan().spec.text() == "fwd.bf16.d64.br128.bc128.w8.s4.wgmma.causal.rope_half_r64");
  resize(16, 1024, 64);  // 512 keys per tile
  CHECK(call.plan().spec.text() == "fwd.bf16.d64.br128.bc128.w8.s4.wgmma.persistent.causal.rope_half_r64");
  // RoPE at head_dim 64 with fewer than 256 keys per tile: the mma.sync
  // producer layout (256-row tiles) once it has 128 CTAs, else wgmma.
  resize(8, 256, 64);
  CHECK(call.plan().spec.text() == "fwd.bf16.d64.br256.bc64.w8.s3.causal.rope_half_r64");
  resize(2, 512, 64);  // 64 CTAs of 256 rows, 128 of 128
  CHECK(call.plan().spec.text() == "fwd.bf16.d64.br128.bc128.w8.s4.wgmma.causal.rope_half_r64");
  resize(1, 512, 64);  // 32 CTAs of 256 rows, 64 of 128: the 4-warp kernel
  CHECK(call.plan().spec.stages == 0);
  // Without RoPE: 192-row tiles of three MMA warpgroups and four stages at
  // head dims up to 64; 128 rows and two stages at 128 and 96.
  call.options.rope.style = RopeStyle::none;
  resize(8, 4096, 64);
  plan = call.plan();
  CHECK(plan.spec.text() == "fwd.bf16.d64.br192.bc128.w12.s4.wgmma.persistent.causal");
  CHECK(plan.params.num_q_blocks == (4096 + 191) / 192);
  CHECK(plan.spec.threads() == 12 * 32 + 128);
  resize(8, 2048, 32);
  CHECK(call.plan().spec.text() == "fwd.bf16.d32.br192.bc128.w12.s4.wgmma.persistent.causal");
  call.options.causal = false;
  resize(8, 2048, 64);
  CHECK(call.plan().spec.text() == "fwd.bf16.d64.br192.bc128.w12.s4.wgmma.persistent");
  resize(1, 2048, 64);  // 16 · 11 = 176 CTAs of 192 rows
  CHECK(call.plan().spec.wgmma);
  resize(1, 1536, 64);  // 16 · 8 = 128
  CHECK(call.plan().spec.wgmma);
  resize(1, 1152, 64);  // 16 · 6 = 96
  CHECK_FALSE(call.plan().spec.wgmma);
  // 128-row tiles where 192-row ones would pad a sequence to over 1.25×
  // the rows: a 256-query chunk over 4096 keys (384 rows against 256);
  // 1024 queries keep 192 (1152 rows against 1024).
  resize(16, 1024, 64);
  CHECK(call.plan().spec.block_q == 192);
  call.q = call.out = TensorView::contiguous(address(0x10000), DType::bf16, {16, 256, 16, 64});
  call.lse = TensorView::contiguous(address(0x50000), DType::f32, {16, 16, 256});
  call.k = call.v = TensorView::contiguous(address(0x20000), DType::bf16, {16, 4096, 16, 64});
  CHECK(call.plan().spec.text() == "fwd.bf16.d64.br128.bc128.w8.s4.wgmma.persistent");
  resize(8, 2048, 128);
  CHECK(call.plan().spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma");
  resize(8, 2048, 80);
  CHECK(call.plan().spec.text() == "fwd.bf16.d96.br128.bc128.w8.s2.wgmma.padded");
  // Too few tiles (1 · 16 · 512 / 128 = 64 CTAs), too few keys per CTA
  // without RoPE, other architectures: the mma.sync kernels.
  resize(1, 512, 128);
  CHECK_FALSE(call.plan().spec.wgmma);
  resize(32, 512, 128);
  CHECK(call.plan().spec.wgmma);  // 512 keys at head_dim 128
  call.options.causal = true;     // 256 on average
  CHECK(call.plan().spec.wgmma);
  resize(64, 256, 128);           // 128 on average
  CHECK_FALSE(call.plan().spec.wgmma);
  resize(32, 512, 128);
  call.options.rope.style = RopeStyle::rotate_half;
  CHECK(call.plan().spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.causal.rope_half_r128");
  call.options.rope.style = RopeStyle::none;
  call.options.causal = false;
  resize(32, 512, 64);
  CHECK(call.plan().spec.wgmma);  // 512 keys at head_dim 64
  resize(64, 256, 64);
  CHECK(call.plan().spec.wgmma);  // 256
  resize(128, 128, 64);
  CHECK_FALSE(call.plan().spec.wgmma);  // 128
  resize(32, 512, 32);
  CHECK(call.plan().spec.wgmma);  // 512 keys at head_dim 32
  resize(64, 256, 32);
  CHECK_FALSE(call.plan().spec.wgmma);  // 256
  // Above head dim 128: two stages of the longest key blocks that fit, never
  // persistent (short causal calls included); RoPE included, by tensor maps.
  resize(8, 2048, 256);
  CHECK(call.plan().spec.text() == "fwd.bf16.d256.br128.bc80.w8.s2.wgmma");
  resize(8, 2048, 200);
  CHECK(call.plan().spec.text() == "fwd.bf16.d256.br128.bc80.w8.s2.wgmma.padded");
  call.options.causal = true;
  resize(32, 1024, 192);
  CHECK(call.plan().spec.text() == "fwd.bf16.d192.br128.bc96.w8.s2.wgmma.causal");
  call.options.rope.style = RopeStyle::rotate_half;
  ForwardPlan rope_plan = call.plan();
  CHECK(rope_plan.spec.text() == "fwd.bf16.d192.br128.bc96.w8.s2.wgmma.causal.rope_half_r192");
  CHECK(rope_plan.k_map.rank == 4);
  // Short keys too, as at head dims up to 128 (the mma.sync kernels rotate
  // K on their MMA warps).
  resize(64, 256, 256);
  CHECK(call.plan().spec.text() == "fwd.bf16.d256.br128.bc80.w8.s2.wgmma.causal.rope_half_r256");
  // A view no tensor map describes keeps the mma.sync kernels there.
  call.k.strides[0] = 0;
  CHECK_FALSE(call.plan().spec.wgmma);
  call.options.rope.style = RopeStyle::none;
  call.options.causal = false;
  resize(1, 512, 256);  // 64 CTAs
  CHECK_FALSE(call.plan().spec.wgmma);
  resize(8, 2048, 128);
  CHECK_FALSE(call.plan(true, 227 * 1024, "sm_90").spec.wgmma);
  CHECK_FALSE(call.plan(true, 99 * 1024, "sm_86").spec.wgmma);
  // Forced tiles: the producer layout with or without wgmma; bad forced
  // combinations are refused, naming the option or the rule.
  call.options.tiles = {256, 64, 8, 2};
  CHECK(call.plan().spec.text() == "fwd.bf16.d128.br256.bc64.w8.s2");
  call.options.tiles = {256, 64, 4, 2};
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("needs w=8"), Error);
  call.options.tiles = {128, 64, 8, 3, true};
  CHECK(call.plan().spec.text() == "fwd.bf16.d128.br128.bc64.w8.s3.wgmma");
  CHECK_THROWS_WITH_AS(call.plan(true, 227 * 1024, "sm_90"), doctest::Contains("options.tiles.wgmma needs sm_90a"),
                       Error);
  call.options.tiles = {256, 64, 8, 2, true};
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("wgmma needs br = 16 × w"), Error);
  call.options.tiles = {128, 64, 8, 0, true};
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("options.tiles.wgmma needs options.tiles.stages > 0"), Error);
  call.options.tiles = {192, 64, 12, 3, true};
  CHECK(call.plan().spec.text() == "fwd.bf16.d128.br192.bc64.w12.s3.wgmma");
  call.options.tiles = {192, 128, 12, 2, true};
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("holds at most 96 accumulators"), Error);
}

TEST_CASE("176-key blocks for long calls at head dim 128, causal or without a mask; windows and RoPE keep 128") {
  Call call;
  const auto resize = [&](int64_t batch, int64_t seqlen, int64_t head_dim) {
    resize_dense(call, batch, seqlen, head_dim);
  };
  resize(2, 8192, 128);
  ForwardPlan plan = call.plan();
  CHECK(plan.spec.text() == "fwd.bf16.d128.br128.bc176.w8.s2.wgmma");
  CHECK(plan.k_map.box[1] == 176);  // the tensor copies read a block
  CHECK(plan.spec.smem_bytes() <= 227 * 1024);
  resize(1, 16384, 120);  // padded, softcap
  call.options.softcap = 30.f;
  CHECK(call.plan().spec.text() == "fwd.bf16.d128.br128.bc176.w8.s2.wgmma.softcap.padded");
  call.options.softcap = 0.f;
  resize(4, 4096, 128);  // shorter: the last block would be a third empty
  CHECK(call.plan().spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma");
  resize(2, 8192, 64);  // 192-row tiles of three warpgroups
  CHECK(call.plan().spec.block_kv == 128);
  resize(2, 8192, 128);
  call.options.causal = true;
  CHECK(call.plan().spec.text() == "fwd.bf16.d128.br128.bc176.w8.s2.wgmma.causal");
  resize(4, 4096, 128);  // persistent
  CHECK(call.plan().spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.causal");
  resize(2, 8192, 128);
  call.options.causal = false;
  call.options.window_left = 1000;
  CHECK(call.plan().spec.block_kv == 128);
  call.options.window_left = -1;
  call.options.rope.style = RopeStyle::rotate_half;
  CHECK(call.plan().spec.block_kv == 128);
  call.options.rope.style = RopeStyle::none;
  CHECK(call.plan(true, 227 * 1024, "sm_80").spec.block_kv != 176);
}

TEST_CASE("dense wgmma kernels without RoPE get tile maps of K and V; views a map cannot describe keep mma.sync") {
  Call call;
  call.q = TensorView::contiguous(address(0x10000), DType::bf16, {8, 2048, 16, 128});
  call.out = TensorView::contiguous(address(0x40000), DType::bf16, {8, 2048, 16, 128});
  call.lse = TensorView::contiguous(address(0x50000), DType::f32, {8, 16, 2048});
  // K and V as views of a packed [batch, seqlen, 3, heads, head_dim] buffer.
  for (TensorView* t : {&call.k, &call.v}) {
    t->data = address(t == &call.k ? 0x60000 : 0x60000 + 16 * 128 * 2);
    t->ndim = 4;
    const int64_t shape[4] = {8, 2048, 16, 128}, strides[4] = {2048 * 3 * 16 * 128, 3 * 16 * 128, 128, 1};
    for (int axis = 0; axis < 4; ++axis) t->shape[axis] = shape[axis], t->strides[axis] = strides[axis];
  }
  call.options.causal = true;
  ForwardPlan plan = call.plan();
  REQUIRE(plan.spec.wgmma);
  CHECK(plan.spec.tensor_copies());
  const TileMapLayout& k = plan.k_map;
  CHECK(k.base == call.k.data);
  CHECK(plan.v_map.base == call.v.data);
  CHECK(k.rank == 4);
  CHECK((k.dims[0] == 128 && k.dims[1] == 2048 && k.dims[2] == 16 && k.dims[3] == 8));
  // Bytes: row, head, batch.
  CHECK((k.strides_bytes[0] == 3 * 16 * 128 * 2 && k.strides_bytes[1] == 256 &&
         k.strides_bytes[2] == 2048 * 3 * 16 * 128 * 2));
  CHECK((k.box[0] == 64 && k.box[1] == plan.spec.block_kv && k.box[2] == 1 && k.box[3] == 1));
  // With RoPE the wgmma kernel's producer copies K with cp.async (it rotates
  // what lands): no maps.
  call.options.rope.style = RopeStyle::rotate_half;
  plan = call.plan();
  CHECK(plan.spec.wgmma);
  CHECK_FALSE(plan.spec.tensor_copies());
  CHECK(plan.k_map.rank == 0);
  // K broadcast over the batch (stride 0): no tensor map, so the planner
  // keeps the mma.sync kernels, and forcing wgmma is refused naming the tensor.
  call.options.rope.style = RopeStyle::none;
  call.k.strides[0] = 0;
  plan = call.plan();
  CHECK_FALSE(plan.spec.wgmma);
  CHECK(plan.k_map.rank == 0);
  call.options.tiles = {128, 128, 8, 2, true};
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("k: strides (batch, row, head) = (0, 6144, 128)"), Error);
  // One batch: its stride is never stepped, so any value is fine.
  call.q.shape[0] = call.out.shape[0] = call.k.shape[0] = call.v.shape[0] = call.lse.shape[0] = 1;
  plan = call.plan();
  CHECK(plan.spec.tensor_copies());
  CHECK(plan.k_map.strides_bytes[2] == 16);
  // Dimensions and strides of a packed layout: no batch dimension.
  const int64_t strides[3] = {0, 16 * 128, 128};
  const auto packed = kv_tile_map(address(0x60000), DType::f16, 0, 5000, 16, 120, strides, 64);
  REQUIRE(packed);
  CHECK(packed->rank == 3);
  CHECK(packed->dtype == DType::f16);
  CHECK((packed->dims[0] == 120 && packed->dims[1] == 5000 && packed->dims[2] == 16));
  CHECK((packed->strides_bytes[0] == 16 * 128 * 2 && packed->strides_bytes[1] == 256));
  CHECK(packed->box[1] == 64);
  // No keys at all: nothing to map, nothing copied.
  CHECK(kv_tile_map(address(0x60000), DType::f16, 0, 0, 16, 128, strides, 64)->rank == 0);
  const int64_t negative[3] = {0, -16 * 128, 128};
  CHECK_FALSE(kv_tile_map(address(0x60000), DType::f16, 0, 5000, 16, 128, negative, 64));
}

TEST_CASE("RoPE: YaRN's frequencies as Hugging Face computes them; its attention factor scales the kernels' angles") {
  // gpt-oss: theta 150000, factor 32, betas 32 and 1 over 4096 positions,
  // "truncate": false, head dim 64. The test reference restates Hugging
  // Face's _compute_yarn_parameters in its own way.
  RopeOptions yarn;
  yarn.style = RopeStyle::rotate_half;
  yarn.theta = 150000.f;
  yarn.yarn_factor = 32.f;
  jitattn::test::RopeReference reference;
  reference.theta = 150000.0;
  reference.yarn_factor = 32.0;
  for (bool truncate : {false, true}) {
    for (int rotary_dim : {64, 32, 128}) {
      yarn.yarn_truncate = reference.yarn_truncate = truncate;
      reference.rotary_dim = rotary_dim;
      const std::vector<float> f = rope_inv_frequencies(yarn, rotary_dim);
      const std::vector<double> expected = reference.inverse_frequencies(rotary_dim);
      REQUIRE(f.size() == expected.size());
      int blended = 0;
      for (size_t p = 0; p < f.size(); ++p) {
        CHECK_MESSAGE(f[p] == doctest::Approx(expected[p]).epsilon(1e-6), "pair ", p, " of ", rotary_dim);
        const double theta_frequency = std::pow(150000.0, -2.0 * p / rotary_dim);
        // Pair 0 turns 4096 / 2π ≈ 652 times: theta's frequency; the last
        // pairs turn less than once: divided by the factor; some between.
        if (p == 0) CHECK(f[p] == doctest::Approx(theta_frequency));
        if (p + 1 == f.size()) CHECK(f[p] == doctest::Approx(theta_frequency / 32).epsilon(1e-5));
        blended += f[p] < theta_frequency * 0.999 && f[p] > theta_frequency / 32 * 1.001;
      }
      CHECK(blended > 0);
    }
  }
  // truncate rounds the ramp's bounds outwards: some pair moves.
  yarn.yarn_truncate = false;
  const std::vector<float> exact_bounds = rope_inv_frequencies(yarn, 64);
  yarn.yarn_truncate = true;
  CHECK(exact_bounds != rope_inv_frequencies(yarn, 64));

  // The attention factor: Hugging Face's default 0.1 ln(factor) + 1 scales
  // cos and sin in the kernel (a spec flag), an explicit one as given, and
  // a factor of 1 (DeepSeek V3's mscale ratio, or yarn_factor <= 1) is the
  // unscaled kernel.
  Call call;
  call.options.rope = yarn;
  call.options.rope.rotary_dim = 64;
  ForwardPlan plan = call.plan();
  CHECK(plan.spec.rope_scaled);
  CHECK(plan.spec.text().find(".rope_half_r64.rope_scaled") != std::string::npos);
  CHECK(plan.params.rope_attention_factor == doctest::Approx(0.1 * std::log(32.0) + 1.0));
  CHECK(plan.params.rope_inv_freq[31] == doctest::Approx(std::pow(150000.0, -62.0 / 64) / 32).epsilon(1e-5));
  call.options.rope.yarn_attention_factor = 1.25f;
  plan = call.plan();
  CHECK(plan.spec.rope_scaled);
  CHECK(plan.params.rope_attention_factor == 1.25f);
  call.options.rope.yarn_attention_factor = 1.f;
  plan = call.plan();
  CHECK_FALSE(plan.spec.rope_scaled);
  CHECK(plan.spec.text().find("rope_scaled") == std::string::npos);
  CHECK(plan.params.rope_inv_freq[31] == doctest::Approx(std::pow(150000.0, -62.0 / 64) / 32).epsilon(1e-5));
  call.options.rope.yarn_attention_factor = 0.f;
  call.options.rope.yarn_factor = 1.f;
  CHECK_FALSE(call.plan().spec.rope_scaled);

  // Rejected before anything runs, naming the option and the rule.
  auto rejects = [&](auto&& set, const char* message) {
    Call bad;
    bad.options.rope = yarn;
    set(bad.options.rope);
    CHECK_THROWS_WITH_AS(bad.plan(), doctest::Contains(message), Error);
  };
  rejects([](RopeOptions& r) { r.yarn_factor = -2.f; }, "options.rope.yarn_factor=-2 must be positive");
  rejects([](RopeOptions& r) { r.yarn_factor = NAN; }, "options.rope.yarn_factor=nan must be positive");
  rejects([](RopeOptions& r) { r.linear_scaling = 2.f; }, "yarn_factor=32 comes alone");
  rejects([](RopeOptions& r) { r.llama3_factor = 8.f; }, "yarn_factor=32 comes alone");
  rejects([](RopeOptions& r) { r.yarn_beta_fast = 1.f; }, "need 0 < beta_slow < beta_fast");
  rejects([](RopeOptions& r) { r.yarn_beta_slow = 0.f; }, "need 0 < beta_slow < beta_fast");
  rejects([](RopeOptions& r) { r.yarn_original_max_position = 0; }, "yarn_original_max_position=0 must be positive");
  rejects([](RopeOptions& r) { r.yarn_attention_factor = -1.f; }, "yarn_attention_factor=-1 must be positive");
  rejects([](RopeOptions& r) { r.theta = 1.f; }, "options.rope.theta=1 must be above 1 with yarn_factor");
  TensorView cos = TensorView::contiguous(address(0x70000), DType::f32, {400, 32});
  rejects([&](RopeOptions& r) { r.cos = r.sin = &cos; }, "cos/sin tables are used as given");
}

TEST_CASE("RoPE: LongRoPE's frequencies as Hugging Face computes them (Phi-3.5, Phi-4-mini); its attention factor") {
  // Phi-4-mini: head dim 128 rotated over its first 96 channels, 48 pair
  // factors rising from 1 (long_factor-like), a 131072 / 4096 context. The
  // reference restates Hugging Face's _compute_longrope_parameters.
  std::vector<float> factors(48);
  jitattn::test::RopeReference reference;
  reference.theta = 10000.0;
  for (int p = 0; p < 48; ++p) {
    factors[p] = 1.f + static_cast<float>(p * p) / 45.f;
    reference.longrope_pair_factors.push_back(factors[p]);
  }
  reference.longrope_factor = 32.0;
  RopeOptions longrope;
  longrope.style = RopeStyle::rotate_half;
  longrope.rotary_dim = 96;
  longrope.longrope_pair_factors = factors.data();
  longrope.longrope_factor = 32.f;
  reference.rotary_dim = 96;
  const std::vector<float> f = rope_inv_frequencies(longrope, 96);
  const std::vector<double> expected = reference.inverse_frequencies(128);
  REQUIRE(f.size() == 48);
  for (size_t p = 0; p < f.size(); ++p) {
    CHECK_MESSAGE(f[p] == doctest::Approx(expected[p]).epsilon(1e-6), "pair ", p);
    CHECK(f[p] == doctest::Approx(std::pow(10000.0, -2.0 * p / 96) / factors[p]).epsilon(1e-6));
  }

  // The attention factor: Hugging Face's default sqrt(1 + ln 32 / ln 4096)
  // scales cos and sin in the kernel, an explicit one as given; a factor of
  // 1 is the unscaled kernel.
  Call call;
  call.options.rope = longrope;
  ForwardPlan plan = call.plan();
  CHECK(plan.spec.rope_scaled);
  CHECK(plan.spec.text().find(".rope_half_r96.rope_scaled") != std::string::npos);
  CHECK(plan.params.rope_attention_factor == doctest::Approx(std::sqrt(1.0 + std::log(32.0) / std::log(4096.0))));
  CHECK(plan.params.rope_attention_factor == doctest::Approx(reference.attention_factor()));
  CHECK(plan.params.rope_inv_freq[47] == doctest::Approx(expected[47]).epsilon(1e-6));
  // Frequencies follow the factors' values, not their address: an engine
  // refilling one array with short_factor after long_factor gets new ones.
  factors[47] *= 2.f;
  plan = call.plan();
  CHECK(plan.params.rope_inv_freq[47] == doctest::Approx(expected[47] / 2).epsilon(1e-6));
  factors[47] /= 2.f;
  CHECK(call.plan().params.rope_inv_freq[47] == doctest::Approx(expected[47]).epsilon(1e-6));
  call.options.rope.longrope_original_max_position = 8192;
  CHECK(call.plan().params.rope_attention_factor ==
        doctest::Approx(std::sqrt(1.0 + std::log(32.0) / std::log(8192.0))));
  call.options.rope.longrope_attention_factor = 1.25f;
  plan = call.plan();
  CHECK(plan.spec.rope_scaled);
  CHECK(plan.params.rope_attention_factor == 1.25f);
  call.options.rope.longrope_attention_factor = 1.f;
  CHECK_FALSE(call.plan().spec.rope_scaled);
  call.options.rope.longrope_attention_factor = 0.f;
  call.options.rope.longrope_factor = 1.f;  // a 4k model's short factors
  plan = call.plan();
  CHECK_FALSE(plan.spec.rope_scaled);
  CHECK(plan.spec.text().find("rope_scaled") == std::string::npos);
  CHECK(plan.params.rope_inv_freq[47] == doctest::Approx(expected[47]).epsilon(1e-6));
  // Without pair factors the frequencies are theta's again.
  call.options.rope = RopeOptions{};
  call.options.rope.style = RopeStyle::rotate_half;
  call.options.rope.rotary_dim = 96;
  CHECK(call.plan().params.rope_inv_freq[47] == doctest::Approx(std::pow(10000.0, -94.0 / 96)).epsilon(1e-6));

  // Rejected before anything runs, naming the option and the rule.
  auto rejects = [&](auto&& set, const char* message) {
    Call bad;
    bad.options.rope = longrope;
    set(bad.options.rope);
    CHECK_THROWS_WITH_AS(bad.plan(), doctest::Contains(message), Error);
  };
  std::vector<float> spoiled = factors;
  spoiled[7] = 0.f;
  rejects([&](RopeOptions& r) { r.longrope_pair_factors = spoiled.data(); },
          "options.rope.longrope_pair_factors[7]=0 must be positive and finite (rotary_dim / 2 = 48 factors");
  std::vector<float> infinite = factors;
  infinite[47] = INFINITY;
  rejects([&](RopeOptions& r) { r.longrope_pair_factors = infinite.data(); },
          "options.rope.longrope_pair_factors[47]=inf must be positive");
  rejects([](RopeOptions& r) { r.linear_scaling = 2.f; }, "longrope_pair_factors comes alone");
  rejects([](RopeOptions& r) { r.llama3_factor = 8.f; }, "longrope_pair_factors comes alone");
  rejects([](RopeOptions& r) { r.yarn_factor = 4.f; }, "longrope_pair_factors comes alone");
  rejects([](RopeOptions& r) { r.longrope_factor = 0.f; }, "options.rope.longrope_factor=0 must be positive and finite");
  rejects([](RopeOptions& r) { r.longrope_factor = NAN; }, "options.rope.longrope_factor=nan must be positive");
  rejects([](RopeOptions& r) { r.longrope_original_max_position = 1; },
          "options.rope.longrope_original_max_position=1 must be above 1");
  rejects([](RopeOptions& r) { r.longrope_attention_factor = -1.f; },
          "options.rope.longrope_attention_factor=-1 must be positive");
  rejects([](RopeOptions& r) { r.longrope_pair_factors = nullptr; },
          "longrope_factor=32 and longrope_attention_factor=0 need longrope_pair_factors");
  TensorView cos = TensorView::contiguous(address(0x70000), DType::f32, {400, 48});
  rejects([&](RopeOptions& r) { r.cos = r.sin = &cos; }, "longrope_pair_factors scale angles from theta");
  rejects([&](RopeOptions& r) { r.cos = r.sin = &cos, r.longrope_pair_factors = nullptr; },
          "need longrope_pair_factors");
  // With the attention factor given, the factor and original context are not needed.
  Call given;
  given.options.rope = longrope;
  given.options.rope.longrope_factor = 0.f;
  given.options.rope.longrope_original_max_position = 0;
  given.options.rope.longrope_attention_factor = 1.19f;
  CHECK(given.plan().params.rope_attention_factor == 1.19f);
}

TEST_CASE("RoPE: styles and rotary dims become spec fields; frequencies and tables become parameters") {
  Call call;
  call.options.rope.style = RopeStyle::rotate_half;
  ForwardPlan plan = call.plan();
  CHECK(plan.spec.text().find(".rope_half_r128") != std::string::npos);
  CHECK(plan.params.rope_inv_freq[0] == 1.f);
  CHECK(plan.params.rope_inv_freq[1] == doctest::Approx(std::pow(10000.0, -2.0 / 128)));
  CHECK(plan.params.rope_inv_freq[63] == doctest::Approx(std::pow(10000.0, -126.0 / 128)));
  call.options.rope.style = RopeStyle::interleaved;
  call.options.rope.rotary_dim = 64;
  call.options.rope.linear_scaling = 2.f;
  plan = call.plan();
  CHECK(plan.spec.text().find(".rope_interleaved_r64") != std::string::npos);
  CHECK(plan.params.rope_inv_freq[1] == doctest::Approx(std::pow(10000.0, -2.0 / 64) / 2));
  // Llama 3.1: high frequencies kept, low ones divided by the factor.
  RopeOptions llama;
  llama.style = RopeStyle::rotate_half;
  llama.theta = 500000.f;
  llama.llama3_factor = 8.f;
  const std::vector<float> f = rope_inv_frequencies(llama, 128);
  CHECK(f[0] == 1.f);
  CHECK(f[63] == doctest::Approx(std::pow(500000.0, -126.0 / 128) / 8));
  CHECK_FALSE(plan.spec.rope_scaled);
  CHECK(plan.params.rope_attention_factor == 1.f);  // (read only by scaled kernels)
  // Tables: pointers and strides pass through, no frequencies.
  TensorView cos = TensorView::contiguous(address(0x70000), DType::f32, {400, 64});
  TensorView sin = TensorView::contiguous(address(0x80000), DType::f32, {400, 64});
  cos.strides[0] = sin.strides[0] = 80;
  call.options.rope.cos = &cos;
  call.options.rope.sin = &sin;
  plan = call.plan();
  CHECK(plan.spec.rope_tables);
  CHECK(plan.params.rope_cos == cos.data);
  CHECK(plan.params.rope_table_stride == 80);
  CHECK(plan.params.rope_table_rows == 400);
  // 16-byte rows: four pairs a load. A row stride, or a table, off 16 bytes:
  // pair by pair.
  CHECK(plan.params.rope_table_vectors);
  cos.strides[0] = sin.strides[0] = 81;
  CHECK_FALSE(call.plan().params.rope_table_vectors);
  cos.strides[0] = sin.strides[0] = 80;
  sin.data = address(0x80004);
  CHECK_FALSE(call.plan().params.rope_table_vectors);
  sin.data = address(0x80000);
  CHECK_FALSE(plan.spec.rope_tables16);
  CHECK(plan.spec.text().find(".rope_tables") != std::string::npos);
  CHECK(plan.spec.text().find(".rope_tables16") == std::string::npos);
  // Tables in q's dtype (FlashAttention's rotary_cos / rotary_sin): their
  // own spec, vectors judged by the 2-byte stride.
  TensorView cos16 = TensorView::contiguous(address(0x70000), call.q.dtype, {400, 64});
  TensorView sin16 = TensorView::contiguous(address(0x90000), call.q.dtype, {400, 64});
  call.options.rope.cos = &cos16;
  call.options.rope.sin = &sin16;
  plan = call.plan();
  CHECK(plan.spec.rope_tables);
  CHECK(plan.spec.rope_tables16);
  CHECK(plan.spec.text().find(".rope_tables16") != std::string::npos);
  CHECK(plan.params.rope_cos == cos16.data);
  CHECK(plan.params.rope_table_stride == 64);
  CHECK(plan.params.rope_table_vectors);
  cos16.strides[0] = sin16.strides[0] = 68;  // 136 bytes
  CHECK_FALSE(call.plan().params.rope_table_vectors);
  cos16.strides[0] = sin16.strides[0] = 72;  // 144 bytes
  CHECK(call.plan().params.rope_table_vectors);
  CHECK(call.plan().params.rope_tables_staged == 0);  // (mma.sync tiles here)
  // wgmma tiles at head dim 128 stage tables beside K: maps of the tables'
  // first rotary_dim / 2 entries, a key block's rows a box, unswizzled. Not
  // for rows off 16 bytes.
  call.options.tiles = TileConfig{128, 128, 8, 2, true};
  call.options.rope.rotary_dim = 128;
  plan = call.plan();
  REQUIRE(plan.spec.rope_table_slots() == 2);
  CHECK(plan.params.rope_tables_staged == 1);
  CHECK(plan.rope_cos_map.base == cos16.data);
  CHECK(plan.rope_sin_map.base == sin16.data);
  CHECK(plan.rope_cos_map.rank == 2);
  CHECK(plan.rope_cos_map.dtype == call.q.dtype);
  CHECK((plan.rope_cos_map.dims[0] == 64 && plan.rope_cos_map.dims[1] == 400));
  CHECK(plan.rope_cos_map.strides_bytes[0] == 144);
  CHECK((plan.rope_cos_map.box[0] == 64 && plan.rope_cos_map.box[1] == 128));
  CHECK_FALSE(plan.rope_cos_map.swizzle_128b);
  cos16.strides[0] = sin16.strides[0] = 68;
  CHECK(call.plan().params.rope_tables_staged == 0);
  cos16.strides[0] = sin16.strides[0] = 64;
  call.options.rope.cos = &cos;  // f32, rows of 80 entries
  call.options.rope.sin = &sin;
  plan = call.plan();
  CHECK(plan.spec.rope_table_slots() == 1);
  CHECK(plan.params.rope_tables_staged == 1);
  CHECK(plan.rope_cos_map.dtype == DType::f32);
  CHECK(plan.rope_cos_map.strides_bytes[0] == 320);
  CHECK((plan.rope_cos_map.box[0] == 64 && plan.rope_cos_map.box[1] == 128));
  call.options.tiles = TileConfig{128, 128, 8, 2, true, true};  // persistent: no room for f32 rows
  plan = call.plan();
  CHECK(plan.spec.rope_table_slots() == 0);
  CHECK(plan.params.rope_tables_staged == 0);
  call.options.tiles = TileConfig{};
  call.options.rope.cos = &cos;
  call.options.rope.sin = &sin;
  cos.shape[0] = sin.shape[0] = 299;  // the keys reach position 299
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("options.rope.cos: 299 positions"), Error);
}

TEST_CASE("split-KV heuristic: none when the tiles fill the GPU, else the smallest efficient count") {
  CHECK(num_splits_heuristic(132 * 3, 132, 3, 512, 128) == 1);  // a full wave already
  CHECK(num_splits_heuristic(400, 132, 3, 512, 128) == 1);
  // 8 tiles (batch 1 × 8 KV heads) on 396 slots and 512 key blocks: the
  // eligible counts (those that change the blocks per split) peak at 47
  // (11 blocks each, 376 CTAs, 95% of a wave); 40 (13 blocks, 81%) is the
  // smallest within 85% of that.
  CHECK(num_splits_heuristic(8, 132, 3, 512, 128) == 40);
  // Never more splits than key blocks.
  CHECK(num_splits_heuristic(8, 132, 3, 5, 128) <= 5);
  CHECK(num_splits_heuristic(1, 132, 1, 1, 128) == 1);
}

TEST_CASE("split-KV for decoding grids of one wave and a mostly empty second") {
  // 160 CTAs on 132 SMs (batch 20 × 8 KV heads): 61% wave efficiency
  // unsplit, which the 80%-of-a-wave rule leaves alone. In splits of at
  // least 1024 keys: none at 1024 keys; at 4096 (32 blocks of 128) 3, the
  // smallest within 85% of the best of 1..4 (4: 97%; 3: 91%).
  CHECK(num_splits_heuristic(160, 132, 1, 32, 128) == 1);
  CHECK(partial_wave_splits(160, 132, 1, 8, 1024) == 1);
  CHECK(partial_wave_splits(160, 132, 1, 32, 4096) == 3);
  // 192 CTAs (72.7%): 2 (97%).
  CHECK(partial_wave_splits(192, 132, 1, 256, 32768) == 2);
  // 224 (85%), 256 (97%), one wave or less, two waves or more: none.
  CHECK(partial_wave_splits(224, 132, 1, 256, 32768) == 1);
  CHECK(partial_wave_splits(256, 132, 1, 256, 32768) == 1);
  CHECK(partial_wave_splits(132, 132, 1, 256, 32768) == 1);
  CHECK(partial_wave_splits(100, 132, 1, 256, 32768) == 1);
  CHECK(partial_wave_splits(300, 132, 1, 256, 32768) == 1);
  // Waves count every CTA an SM holds: 320 CTAs two to an SM are 1.2 waves.
  CHECK(partial_wave_splits(320, 132, 2, 256, 32768) == 3);
  // And the planner takes it for a decoding call (not for forward()'s
  // prefill kernels, whose rule is unchanged). Up to 8192 keys batch 20
  // takes resident tiles instead (next case).
  for (const auto& [batch, keys, splits] : {std::tuple<int64_t, int64_t, int>{20, 16384, 3}, {20, 32768, 3},
                                            {24, 32768, 2}, {28, 32768, 1}, {16, 32768, 1}}) {
    const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, 1, 32, 128});
    KVCacheArgs args;
    args.k_cache = args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {batch, keys, 8, 128});
    args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
    const KVCachePlan plan = plan_kvcache(q, args, q, nullptr, ForwardOptions{}, nullptr, 0, true,
                                          Arch::parse("sm_90a"), 227 * 1024, 132);
    CAPTURE(batch);
    CAPTURE(keys);
    CHECK(plan.attention.spec.family == Family::decode);
    CHECK(plan.attention.spec.split == (splits > 1));
    CHECK(plan.attention.num_splits == splits);
    // Not told the longest length, the kernel cuts each sequence's own keys
    // into pieces of at least 1024 (8 steps of 4 × 32 keys), so short
    // sequences in a long cache do not split into slower short pieces.
    if (splits > 1) CHECK(plan.attention.params.blocks_per_split == 8);
  }
}

TEST_CASE("split-KV counts the CTAs an SM holds by the target's shared memory, not the H200's") {
  // An SM holds the per-block opt-in limit plus 1 KB: 164 KB on sm_80, 100
  // KB on sm_86. 228 KB (sm_90) there would count CTAs that do not fit and
  // split grids that already fill the GPU.
  auto kvcache_plan = [](const char* arch, int max_smem, int sms, int64_t batch, int64_t keys, int head_dim) {
    const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, 1, 32, head_dim});
    KVCacheArgs args;
    args.k_cache = args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {batch, keys, 8, head_dim});
    args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
    return plan_kvcache(q, args, q, nullptr, ForwardOptions{}, nullptr, 0, true, Arch::parse(arch), max_smem, sms)
        .attention;
  };
  // sm_80 (A100: 108 SMs, 163 KB a block): batch 32 at d128 is 256 tiles of
  // 100 KB CTAs, one an SM: 2.4 waves, unsplit. (Two an SM would make it
  // 1.2 waves, which partial_wave_splits splits.)
  const ForwardPlan a100 = kvcache_plan("sm_80", 163 * 1024, 108, 32, 4096, 128);
  CHECK(a100.spec.smem_bytes() + 1024 > 164 * 1024 / 2);
  CHECK(a100.num_splits == 1);
  CHECK(a100.grid == 256);
  // sm_86 (84 SMs, 99 KB a block): one token over 4096 keys is 8 tiles of
  // 98 KB CTAs; the heuristic's splits stay within one CTA an SM.
  const ForwardPlan ampere86 = kvcache_plan("sm_86", 99 * 1024, 84, 1, 4096, 64);
  CHECK(ampere86.spec.smem_bytes() + 1024 > 100 * 1024 / 2);
  CHECK(ampere86.num_splits > 1);
  CHECK(ampere86.grid <= 84);
  // Dense forward with a workspace on sm_80: 2 × 16 heads × 8 query tiles of
  // 64 KB CTAs, two an SM (216 slots): a full wave, unsplit.
  Call dense;
  resize_dense(dense, 2, 1024, 128);
  const SplitForwardPlan forward = plan_forward_split(dense.q, dense.k, dense.v, dense.out, &dense.lse, dense.options,
                                                      nullptr, 0, true, Arch::parse("sm_80"), 163 * 1024, 108);
  CHECK(forward.attention.spec.family == Family::fwd);
  CHECK(forward.attention.num_splits == 1);
  CHECK(forward.attention.grid == 2 * 16 * 8);
}

TEST_CASE("decode grids of more tiles than SMs over short caches stay resident, unsplit") {
  // One token, 32/8 heads: batch B is 8 B tiles on 132 SMs. Resident CTAs
  // hold 4 KB chunks (16 keys of 256-byte rows, 32 of 128-byte ones) in the
  // largest of 64 KB, 48 KB and 32 KB pipelines whose bytes over all tiles
  // stay within 12 MB, so that every tile runs at once and no split is needed.
  auto plan_of = [](int64_t batch, int64_t keys, int head_dim, int num_splits = 0, TileConfig tiles = {},
                    int page = 0, bool dynamic_splits = false) {
    const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, 1, 32, head_dim});
    const TensorView table = TensorView::contiguous(address(0x30000), DType::i32, {batch, keys / std::max(page, 1)});
    KVCacheArgs args;
    args.k_cache = args.v_cache =
        page == 0 ? TensorView::contiguous(address(0x40000), DType::bf16, {batch, keys, 8, head_dim})
                  : TensorView::contiguous(address(0x40000), DType::bf16, {batch * keys / page, page, 8, head_dim});
    args.block_table = page == 0 ? nullptr : &table;
    args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
    args.num_splits = num_splits;
    args.dynamic_splits = dynamic_splits;
    ForwardOptions options;
    options.tiles = tiles;
    return plan_kvcache(q, args, q, nullptr, options, nullptr, 0, true, Arch::parse("sm_90a"), 227 * 1024, 132)
        .attention;
  };
  const std::string resident128 = "decode.bf16.d128.br16.bc16.w4.s2";
  // 64 KB (four warps, two stages): 136-192 tiles (batch 17-24, 8.5-12 MB),
  // and 368-392 (batch 46-49: three an SM, nearly even); 48 KB (two warps,
  // three stages): 200-256 (batch 25-32); 32 KB (two, two): 264-360 (batch
  // 33-45). Every one unsplit, all tiles at once on 132 SMs.
  for (const auto& [batch, keys, text, ctas_per_sm] :
       {std::tuple<int64_t, int64_t, std::string, int>{17, 1024, resident128, 3}, {20, 4096, resident128, 3},
        {24, 8192, resident128, 3}, {46, 1024, resident128, 3}, {49, 8192, resident128, 3},
        {25, 4096, "decode.bf16.d128.br16.bc16.w2.s3", 4}, {32, 8192, "decode.bf16.d128.br16.bc16.w2.s3", 4},
        {33, 1024, "decode.bf16.d128.br16.bc16.w2.s2", 6}, {45, 8192, "decode.bf16.d128.br16.bc16.w2.s2", 6}}) {
    CAPTURE(batch);
    CAPTURE(keys);
    const ForwardPlan plan = plan_of(batch, keys, 128);
    CHECK(plan.spec.text() == text);
    CHECK(plan.num_splits == 1);
    CHECK(plan.grid == batch * 8);
    CHECK(ctas_per_sm * (plan.spec.smem_bytes() + 1024) <= 228 * 1024);
    CHECK(plan.grid <= 132 * ctas_per_sm);
  }
  // Past the bands, or over longer caches: the tiles and splits of before.
  CHECK(plan_of(16, 4096, 128).spec.text() == "decode.bf16.d128.br16.bc32.w4.s2");  // one tile an SM
  CHECK(plan_of(50, 4096, 128).spec.text() == "decode.bf16.d128.br16.bc16.w4.s3.split");  // 400: over 12 MB at 32 KB
  CHECK(plan_of(64, 4096, 128).spec.text() == "decode.bf16.d128.br16.bc16.w4.s3");        // 3.88 an SM
  CHECK(plan_of(20, 16384, 128).spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.split");
  CHECK(plan_of(48, 16384, 128).spec.text() == "decode.bf16.d128.br16.bc16.w4.s3.split");
  // Head dim 64: 32-key chunks, the same bytes; the nearly even band is
  // d128's (batch 49: 392 tiles, over 12 MB at 32 KB).
  CHECK(plan_of(20, 4096, 64).spec.text() == "decode.bf16.d64.br16.bc32.w4.s2");
  CHECK(plan_of(20, 4096, 64).num_splits == 1);
  CHECK(plan_of(28, 4096, 64).spec.text() == "decode.bf16.d64.br16.bc32.w2.s3");
  CHECK(plan_of(36, 4096, 64).spec.text() == "decode.bf16.d64.br16.bc32.w2.s2");
  CHECK(plan_of(49, 1024, 64).spec.text() == "decode.bf16.d64.br16.bc64.w2.s3");  // two CTAs an SM, as before
  // Above 128 the rows take 512 bytes: not resident (split, as before).
  CHECK(plan_of(20, 4096, 256).spec.text() == "decode.bf16.d256.br16.bc16.w4.s2.split");
  // Pages shorter than a chunk keep the chunk, which spans them (.pagedN),
  // in the same 64 KB.
  CHECK(plan_of(20, 4096, 64, 0, {}, 16).spec.text() == "decode.bf16.d64.br16.bc32.w4.s2.paged16");
  CHECK(plan_of(20, 4096, 128, 0, {}, 64).spec.text() == "decode.bf16.d128.br16.bc16.w4.s2.paged");
  // A forced split count stays forced; forced tiles keep the split rules of
  // their occupancy (the heuristic over three CTAs an SM); split counts
  // chosen on the device keep the tiles of before.
  CHECK(plan_of(20, 4096, 128, 2).num_splits == 2);
  CHECK(plan_of(20, 4096, 128, 2).spec.text() == resident128 + ".split");
  CHECK(plan_of(20, 4096, 128, 0, TileConfig{16, 16, 4, 2}).num_splits > 1);
  CHECK(plan_of(20, 4096, 128, 0, {}, 0, true).spec.text() != resident128 + ".split.dynsplit");
  // A batch told it is uneven (max_seqlen_k and total_seqlen_k: one 4096-key
  // sequence, nineteen of 256) splits its longest sequences on the tiles of
  // before; told it is even, it stays resident.
  {
    const TensorView q20 = TensorView::contiguous(address(0x10000), DType::bf16, {20, 1, 32, 128});
    KVCacheArgs told;
    told.k_cache = told.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {20, 4096, 8, 128});
    told.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {20});
    told.max_seqlen_k = 4096;
    told.total_seqlen_k = 4096 + 19 * 256;
    auto planned = [&] {
      return plan_kvcache(q20, told, q20, nullptr, ForwardOptions{}, nullptr, 0, true, Arch::parse("sm_90a"),
                          227 * 1024, 132)
          .attention;
    };
    CHECK(planned().spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.split");
    CHECK(planned().num_splits >= 2);
    told.total_seqlen_k = 20 * 4096;
    CHECK(planned().spec.text() == resident128);
  }
  // Speculative decoding (8 tokens: 32 packed rows) is not resident.
  const TensorView q8 = TensorView::contiguous(address(0x10000), DType::bf16, {20, 8, 32, 128});
  KVCacheArgs args;
  args.k_cache = args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {20, 4096, 8, 128});
  args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {20});
  CHECK(plan_kvcache(q8, args, q8, nullptr, ForwardOptions{}, nullptr, 0, true, Arch::parse("sm_90a"), 227 * 1024, 132)
            .attention.spec.block_q == 32);
  // Measured on sm_90 only: A100s keep the tiles and splits of before (136
  // tiles on 108 SMs: partial-wave splits).
  const TensorView q17a = TensorView::contiguous(address(0x10000), DType::bf16, {17, 1, 32, 128});
  args.k_cache = args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {17, 4096, 8, 128});
  args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {17});
  CHECK(plan_kvcache(q17a, args, q17a, nullptr, ForwardOptions{}, nullptr, 0, true, Arch::parse("sm_80"), 163 * 1024,
                     108)
            .attention.spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.split");
  // The bands are bytes in flight, not tiles per SM: on 114 SMs batch 24
  // (192 tiles, 12 MB of 64 KB CTAs) takes 64 KB CTAs, batch 25 48 KB ones;
  // on 100 SMs batch 12 (96 tiles) fills one wave of one CTA an SM.
  auto plan_on = [&](int64_t batch, int sms) {
    const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, 1, 32, 128});
    args.k_cache = args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {batch, 4096, 8, 128});
    args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
    return plan_kvcache(q, args, q, nullptr, ForwardOptions{}, nullptr, 0, true, Arch::parse("sm_90a"), 227 * 1024,
                        sms)
        .attention.spec.text();
  };
  CHECK(plan_on(24, 114) == resident128);
  CHECK(plan_on(25, 114) == "decode.bf16.d128.br16.bc16.w2.s3");
  CHECK(plan_on(12, 100) == "decode.bf16.d128.br16.bc32.w4.s2");
}

TEST_CASE("split-KV for uneven decoding batches: the longest sequence's tiles fill half the SMs") {
  // Batch 16 × 8 KV heads (128 tiles) of 32k keys: even, no split.
  CHECK(uneven_splits(128, 16, 132, 32768, 16 * 32768) == 1);
  CHECK(uneven_splits(128, 16, 132, 32768, 16 * 26215) == 1);  // longest under 1.25x the mean: even enough
  CHECK(uneven_splits(128, 16, 132, 32768, 16 * 26200) == 8);
  // One sequence of 32k keys and fifteen of 1k: its 8 tiles split 8 ways
  // (64 CTAs, half of 132 SMs rounded down), pieces of 4096 keys.
  CHECK(uneven_splits(128, 16, 132, 32768, 32768 + 15 * 1024) == 8);
  // Pieces of about 2048 keys or more: 8k keys split at most 4 ways, 7.8k
  // too (pieces of 1950), 7k 3 ways.
  CHECK(uneven_splits(128, 16, 132, 8192, 8192 + 15 * 1024) == 4);
  CHECK(uneven_splits(128, 16, 132, 7793, 7793 + 15 * 1024) == 4);
  CHECK(uneven_splits(128, 16, 132, 7000, 7000 + 15 * 1024) == 3);
  CHECK(uneven_splits(128, 16, 132, 3000, 3000 + 15 * 100) == 1);
  // Fewer tiles per sequence (MQA) split more, up to 128.
  CHECK(uneven_splits(16, 16, 132, 1 << 20, (1 << 20) + 15 * 1024) == 66);
  CHECK(uneven_splits(1, 2, 264, 1 << 22, (1 << 22) + 1) == 128);
  // One sequence, or no total known: nothing to balance.
  CHECK(uneven_splits(8, 1, 132, 32768, 32768) == 1);
  CHECK(uneven_splits(128, 16, 132, 32768, 0) == 1);
}

TEST_CASE("kvcache: total_seqlen_k splits a decoding batch of uneven lengths, with max_seqlen_k") {
  const int64_t batch = 16;
  const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, 1, 32, 128});
  KVCacheArgs args;
  args.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {batch, 32768, 8, 128});
  args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {batch, 32768, 8, 128});
  args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
  auto splits = [&] {
    return plan_kvcache(q, args, q, nullptr, ForwardOptions{}, nullptr, 0, true, Arch::parse("sm_90a"), 227 * 1024,
                        132)
        .attention.num_splits;
  };
  CHECK(splits() == 1);  // 128 tiles fill the GPU
  args.max_seqlen_k = 32768;
  args.total_seqlen_k = 32768 + 15 * 1024;
  CHECK(splits() == 8);
  args.total_seqlen_k = batch * 32768;  // even
  CHECK(splits() == 1);
  // Without max_seqlen_k the longest is only the capacity: no split.
  args.max_seqlen_k = 0;
  args.total_seqlen_k = 32768 + 15 * 1024;
  CHECK(splits() == 1);
  // A forced count stays forced.
  args.max_seqlen_k = 32768;
  args.num_splits = 2;
  CHECK(splits() == 2);
  args.num_splits = 0;
  // The total lies between the longest sequence and batch times it.
  args.total_seqlen_k = 1000;
  CHECK_THROWS_WITH_AS(splits(), doctest::Contains("total_seqlen_k=1000 must be 0 (unknown) or between"), Error);
  args.total_seqlen_k = batch * 32768 + 1;
  CHECK_THROWS_WITH_AS(splits(), doctest::Contains("total_seqlen_k=524289"), Error);
}

TEST_CASE("varlen decoding with a workspace: uneven batches split by total_seqlen_k, by packed k's rows, or on the device") {
  // Sixteen decoding steps of 32 query heads over 8 KV heads at d128 (128
  // tiles, one CTA per SM: unsplit when even), the longest 32768 keys.
  const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {16, 32, 128});
  const TensorView pages = TensorView::contiguous(address(0x100000), DType::bf16, {8192, 64, 8, 128});
  const TensorView table = TensorView::contiguous(address(0x63000), DType::i32, {16, 512});
  const TensorView seqused = TensorView::contiguous(address(0x62000), DType::i32, {16});
  VarlenArgs varlen;
  varlen.cu_seqlens_q = TensorView::contiguous(address(0x60000), DType::i32, {17});
  varlen.cu_seqlens_k = TensorView::contiguous(address(0x61000), DType::i32, {17});
  varlen.max_seqlen_q = 1;
  varlen.max_seqlen_k = 32768;
  auto splits = [&](const TensorView& k) {
    return plan_forward_varlen_split(q, k, k, q, nullptr, varlen, ForwardOptions{}, nullptr, 0, true,
                                     Arch::parse("sm_90a"), 227 * 1024, 132)
        .attention.num_splits;
  };
  // Paged with seqused_k: nothing known of the lengths but their longest.
  varlen.block_table = &table;
  varlen.seqused_k = &seqused;
  CHECK(splits(pages) == 1);
  varlen.total_seqlen_k = 32768 + 15 * 1024;
  CHECK(splits(pages) == 8);
  varlen.total_seqlen_k = 16 * 32768;
  CHECK(splits(pages) == 1);
  varlen.total_seqlen_k = 100;
  CHECK_THROWS_WITH_AS(splits(pages), doctest::Contains("varlen: total_seqlen_k=100 must be 0 (unknown) or between"),
                       Error);
  // Packed keys without seqused_k: k's rows are the total.
  varlen.block_table = nullptr;
  varlen.seqused_k = nullptr;
  varlen.total_seqlen_k = 0;
  CHECK(splits(TensorView::contiguous(address(0x100000), DType::bf16, {32768 + 15 * 1024, 8, 128})) == 8);
  CHECK(splits(TensorView::contiguous(address(0x100000), DType::bf16, {16 * 32768, 8, 128})) == 1);
  // dynamic_splits, paged with seqused_k (no total known): the launch holds
  // room for one sequence's 8 tiles to fill half the SMs; the decode kernel
  // (.dynsplit) picks each sequence's count from 120 shares of the batch.
  varlen.block_table = &table;
  varlen.seqused_k = &seqused;
  varlen.dynamic_splits = true;
  const ForwardPlan dynamic = plan_forward_varlen_split(q, pages, pages, q, nullptr, varlen, ForwardOptions{}, nullptr,
                                                        0, true, Arch::parse("sm_90a"), 227 * 1024, 132)
                                  .attention;
  CHECK(dynamic.num_splits == 8);
  CHECK(dynamic.spec.dynamic_splits);
  CHECK(dynamic.params.split_slots == 120);
  CHECK(dynamic.workspace_bytes > 0);
}

TEST_CASE("decode splits: pieces from each tile's own keys; dynamic_splits launches the most, counted on the device") {
  const TensorView q16 = TensorView::contiguous(address(0x10000), DType::bf16, {16, 1, 32, 128});
  const TensorView q1 = TensorView::contiguous(address(0x10000), DType::bf16, {1, 1, 32, 128});
  KVCacheArgs args;
  int64_t heads_kv = 8;
  auto plan = [&](const TensorView& q) {
    KVCacheArgs call = args;
    const int64_t batch = q.shape[0];
    call.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {batch, 32768, heads_kv, 128});
    call.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {batch, 32768, heads_kv, 128});
    call.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
    return plan_kvcache(q, call, q, nullptr, ForwardOptions{}, nullptr, 0, true, Arch::parse("sm_90a"), 227 * 1024,
                        132)
        .attention;
  };
  // Batch 1 told nothing: the heuristic's count for the capacity. The
  // kernel cuts each tile's own keys into that many pieces of at least
  // kMinSplitKeys (one 128-key step of 4 warps × 32 keys here), so a
  // sequence shorter than the capacity still fills every split.
  ForwardPlan one = plan(q1);
  CHECK(one.spec.family == Family::decode);
  CHECK(one.num_splits == 14);
  CHECK(one.params.blocks_per_split == 1);
  CHECK(one.params.split_slots == 0);
  CHECK_FALSE(one.spec.dynamic_splits);
  // Batch 16: 128 tiles fill the GPU; no split.
  CHECK(plan(q16).num_splits == 1);
  // dynamic_splits: the launch holds the splits of an even batch of
  // max_seqlen_k keys (batch 1: 14), and at least room for one sequence's 8
  // tiles to fill half the SMs (8); the device cuts the batch's work into
  // 120 shares (132 SMs / 1.1). CTA k takes the batch's piece k: a tile
  // takes at most one piece per share plus one, so the grid is the smaller
  // of tiles × splits and tiles + 120 (batch 1: 112; batch 16: 248, not
  // 1024).
  args.dynamic_splits = true;
  for (const TensorView& q : {q1, q16}) {
    const int expected = q.shape[0] == 1 ? 14 : 8;
    const ForwardPlan dynamic = plan(q);
    CHECK(dynamic.num_splits == expected);
    CHECK(dynamic.params.split_slots == 120);  // 132 SMs / 1.1
    CHECK(dynamic.params.wave_ctas == 132);    // one CTA per SM at these tiles
    CHECK(dynamic.params.blocks_per_split == 1);
    CHECK(dynamic.spec.split);
    CHECK(dynamic.spec.dynamic_splits);  // the kernel's own variant (.dynsplit)
    const int64_t tiles = q.shape[0] * 8;
    CHECK(dynamic.grid == static_cast<unsigned>(std::min<int64_t>(tiles * expected, tiles + 120)));
  }
  // Its combine is the variant that skips the rows of tiles of one piece,
  // which the decode kernel writes itself and marks (.dynsplit); without
  // dynamic splits, the plain combine.
  for (bool dynamic_splits : {true, false}) {
    KVCacheArgs call = args;
    call.dynamic_splits = dynamic_splits;
    call.num_splits = 3;
    call.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {16, 32768, 8, 128});
    call.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {16, 32768, 8, 128});
    call.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {16});
    const KVCachePlan full = plan_kvcache(q16, call, q16, nullptr, ForwardOptions{}, address(0x100000), size_t{1} << 30,
                                          false, Arch::parse("sm_90a"), 227 * 1024, 132);
    CHECK(full.attention.spec.dynamic_splits == dynamic_splits);
    CHECK(full.combine.grid > 0);
    CHECK(full.combine.spec.text() == (dynamic_splits ? "combine.f32.bf16.dynsplit" : "combine.f32.bf16"));
  }
  // Short keys cap it (one 128-key step per split at least).
  args.max_seqlen_k = 500;
  CHECK(plan(q16).num_splits == 4);
  args.max_seqlen_k = 0;
  // num_splits caps it; 1 turns splitting off.
  args.num_splits = 4;
  CHECK(plan(q16).num_splits == 4);
  CHECK(plan(q16).params.split_slots == 120);
  args.num_splits = 1;
  CHECK(plan(q16).num_splits == 1);
  CHECK_FALSE(plan(q16).spec.split);
  args.num_splits = 0;
  // MHA: 32 tiles per sequence, 2 splits.
  heads_kv = 32;
  CHECK(plan(q16).num_splits == 2);
  // Chunked prefill (64 queries × 4 heads per KV head) runs wgmma tiles,
  // not the decode kernel: planned as without the flag.
  heads_kv = 8;
  const TensorView chunk = TensorView::contiguous(address(0x10000), DType::bf16, {16, 64, 32, 128});
  const ForwardPlan prefill = plan(chunk);
  CHECK(prefill.spec.family != Family::decode);
  CHECK(prefill.params.split_slots == 0);
}

TEST_CASE("kvcache: decode tiles fit every architecture's shared memory, up to head dim 256") {
  // Two stages of four warps' 32-key chunks of K and V take 128 KB at head
  // dim 128 (over sm_86's 99 KB), 192 KB at 192 and 256 KB at 256: the
  // planner takes smaller chunks, then fewer warps, instead of asking for
  // more than the block may have.
  struct Target {
    const char* arch;
    int max_smem;
  };
  for (const Target target : {Target{"sm_90a", 227 * 1024}, Target{"sm_80", 163 * 1024}, Target{"sm_86", 99 * 1024}}) {
    for (int64_t head_dim : {64, 128, 192, 256}) {
      for (int64_t batch : {1, 64}) {
        CAPTURE(target.arch);
        CAPTURE(head_dim);
        CAPTURE(batch);
        const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, 1, 32, head_dim});
        KVCacheArgs args;
        args.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {batch, 4096, 8, head_dim});
        args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {batch, 4096, 8, head_dim});
        args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
        ForwardOptions options;
        options.causal = true;
        const KVCachePlan plan = plan_kvcache(q, args, q, nullptr, options, nullptr, 0, true, Arch::parse(target.arch),
                                              target.max_smem, 132);
        const KernelSpec& spec = plan.attention.spec;
        CHECK(spec.family == Family::decode);
        CHECK(spec.stages >= 2);
        CHECK(spec.smem_bytes() <= static_cast<size_t>(target.max_smem));
      }
    }
  }
  // Forced chunks and warps stay as forced.
  const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {1, 1, 32, 256});
  KVCacheArgs args;
  args.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {1, 4096, 8, 256});
  args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {1, 4096, 8, 256});
  args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {1});
  ForwardOptions options;
  options.tiles = {16, 32, 4, 2};
  CHECK_THROWS_WITH_AS(plan_kvcache(q, args, q, nullptr, options, nullptr, 0, true, Arch::parse("sm_90a"), 227 * 1024, 132),
                       doctest::Contains("shared memory"), Error);
}

TEST_CASE("kvcache: decode chunks hold 8 KB of K, and splits at least 128 keys") {
  const Arch arch = Arch::parse("sm_90a");
  // One token of 32 query heads over 8 KV heads; `page` 0 for a contiguous cache.
  auto plan_decode = [&](int64_t head_dim, int64_t batch, int64_t keys, int page = 0) {
    const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, 1, 32, head_dim});
    KVCacheArgs args;
    const TensorView table = TensorView::contiguous(address(0x70000), DType::i32, {batch, keys / std::max(page, 1)});
    if (page != 0) {
      args.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {batch * keys / page, page, 8, head_dim});
      args.block_table = &table;
    } else {
      args.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {batch, keys, 8, head_dim});
    }
    args.v_cache = args.k_cache;
    args.v_cache.data = address(0x40000);
    args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
    ForwardOptions options;
    return plan_kvcache(q, args, q, nullptr, options, nullptr, 0, true, arch, 227 * 1024, 132).attention;
  };
  // 256-byte rows: 32-key chunks; 16 with two CTAs per SM (tiles fill every SM twice).
  CHECK(plan_decode(128, 16, 4096).spec.text() == "decode.bf16.d128.br16.bc32.w4.s2");
  CHECK(plan_decode(128, 64, 32768).spec.text() == "decode.bf16.d128.br16.bc16.w4.s3");
  // 128-byte rows (head dims up to 64): 64-key chunks; two CTAs per SM only
  // for short caches, with two warps each.
  for (int64_t head_dim : {32, 64}) {
    CAPTURE(head_dim);
    const std::string dim = fmt::format("decode.bf16.d{}.br16.bc64", head_dim);
    CHECK(plan_decode(head_dim, 16, 4096).spec.text() == dim + ".w4.s2");
    CHECK(plan_decode(head_dim, 64, 1024).spec.text() == dim + ".w2.s3");
    CHECK(plan_decode(head_dim, 64, 2048).spec.text() == dim + ".w2.s3");
    CHECK(plan_decode(head_dim, 64, 4096).spec.text() == dim + ".w4.s2");
    // Pages shorter than the chunk: the chunk spans two of them.
    CHECK(plan_decode(head_dim, 64, 4096, 32).spec.text() == dim + ".w4.s2.paged32");
    CHECK(plan_decode(head_dim, 64, 4096, 64).spec.text() == dim + ".w4.s2.paged");
  }
  // Splits take whole steps (warps × chunk) of at least 128 keys: head dim
  // 256 steps 64 keys (16-key chunks), so 1024 keys split 8 ways, not 16.
  const ForwardPlan wide = plan_decode(256, 1, 1024);
  CHECK(wide.spec.block_kv * wide.spec.warps == 64);
  CHECK(wide.num_splits == 8);
  CHECK(wide.params.blocks_per_split == 2);
  // Pages of 16 at head dim 128: the contiguous cache's chunks over two
  // pages, and its splits.
  const ForwardPlan contiguous = plan_decode(128, 1, 1024);
  CHECK(contiguous.num_splits == 8);
  const ForwardPlan paged16 = plan_decode(128, 1, 1024, 16);
  CHECK(paged16.spec.text() == contiguous.spec.text().substr(0, contiguous.spec.text().find(".split")) +
                                   ".paged16.split");
  CHECK(paged16.spec.block_kv == 32);
  CHECK(paged16.spec.page_rows == 16);
  CHECK(paged16.num_splits == 8);
  CHECK(paged16.params.blocks_per_split == contiguous.params.blocks_per_split);
  // Pages of 8 too (every head dim's copy passes fit in 8 rows); at head
  // dim 256 (16-key chunks) pages of 8 are two a chunk, and 16 hold one.
  CHECK(plan_decode(128, 16, 4096, 8).spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.paged8");
  CHECK(plan_decode(256, 16, 4096, 8).spec.page_rows == 8);
  CHECK(plan_decode(256, 16, 4096, 16).spec.page_rows == 0);
  // Longer caches: the wave rule alone (the fewest splits whose 8 × splits
  // CTAs fill 85% of the best wave: 14). The kernel cuts each tile's own
  // keys into 14 pieces of whole 64-key steps, two at least (128 keys).
  const ForwardPlan longer = plan_decode(256, 1, 32768);
  CHECK(longer.num_splits == 14);
  CHECK(longer.params.blocks_per_split == 2);
}

TEST_CASE("kvcache: cache_leftpad reaches the kernels' parameters and specs (.leftpad), and is checked") {
  TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {3, 1, 32, 128});
  KVCacheArgs args;
  args.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {3, 8192, 8, 128});
  args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {3, 8192, 8, 128});
  args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {3});
  const TensorView k_new = TensorView::contiguous(address(0x60000), DType::bf16, {3, 1, 8, 128});
  args.k_new = args.v_new = &k_new;
  const Arch arch = Arch::parse("sm_90a");
  ForwardOptions options;
  options.causal = true;
  options.rope.style = RopeStyle::rotate_half;
  for (int64_t seqlen_q : {1, 64}) {  // the decode kernel, and wgmma tiles
    TensorView q_rows = q;
    q_rows.shape[1] = seqlen_q;
    TensorView k_new_rows = k_new;
    k_new_rows.shape[1] = seqlen_q;
    KVCacheArgs plain = args;
    plain.k_new = plain.v_new = &k_new_rows;
    const KVCachePlan without = plan_kvcache(q_rows, plain, q_rows, nullptr, options, nullptr, 0, true, arch, 227 * 1024, 132);
    KVCacheArgs padded = plain;
    const TensorView leftpad = TensorView::contiguous(address(0x70000), DType::i32, {3});
    padded.cache_leftpad = &leftpad;
    const KVCachePlan with = plan_kvcache(q_rows, padded, q_rows, nullptr, options, nullptr, 0, true, arch, 227 * 1024, 132);
    // Compiled in only when asked for: the same kernel with .leftpad.
    CHECK_FALSE(without.attention.spec.leftpad);
    KernelSpec expected = without.attention.spec;
    expected.leftpad = true;
    CHECK(with.attention.spec == expected);
    CHECK(with.attention.spec.text().find(seqlen_q == 1 ? ".rope_half_r128.leftpad.split" : ".kvcache.leftpad.split") !=
          std::string::npos);
    CHECK(KernelSpec::parse(with.attention.spec.text()) == with.attention.spec);
    CHECK(with.append.spec == without.append.spec);  // appends write at cache_seqlens either way
    CHECK(without.attention.params.kv_row_offset == nullptr);
    CHECK(with.attention.params.kv_row_offset == leftpad.data);
    // RoPE positions stay the cache rows' own: q at cache_seqlens + i.
    CHECK(with.attention.params.rope_q_offsets == args.cache_seqlens.data);
  }
  auto rejects = [&](const KVCacheArgs& bad, const char* fragment) {
    CHECK_THROWS_WITH_AS(plan_kvcache(q, bad, q, nullptr, options, nullptr, 0, true, arch, 227 * 1024, 132),
                         doctest::Contains(fragment), Error);
  };
  const TensorView floats = TensorView::contiguous(address(0x70000), DType::f32, {3});
  const TensorView short_pad = TensorView::contiguous(address(0x70000), DType::i32, {2});
  KVCacheArgs bad = args;
  bad.cache_leftpad = &floats;
  rejects(bad, "cache_leftpad: dtype f32 must be i32");
  bad.cache_leftpad = &short_pad;
  rejects(bad, "cache_leftpad");
  // As in FlashAttention, not over pages.
  const TensorView leftpad = TensorView::contiguous(address(0x70000), DType::i32, {3});
  const TensorView table = TensorView::contiguous(address(0x80000), DType::i32, {3, 128});
  KVCacheArgs paged = args;
  paged.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {384, 64, 8, 128});
  paged.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {384, 64, 8, 128});
  paged.block_table = &table;
  CHECK_NOTHROW(plan_kvcache(q, paged, q, nullptr, options, nullptr, 0, true, arch, 227 * 1024, 132));
  paged.cache_leftpad = &leftpad;
  rejects(paged, "cache_leftpad: not supported with a paged cache (block_table)");
}

TEST_CASE("kvcache: decoding packs GQA, splits, sizes the workspace and plans append and combine") {
  TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {2, 1, 32, 128});
  TensorView out = TensorView::contiguous(address(0x20000), DType::bf16, {2, 1, 32, 128});
  KVCacheArgs args = contiguous_cache(2, 8192, 8, 128);
  ForwardOptions options;
  const Arch arch = Arch::parse("sm_90a");
  KVCachePlan plan = plan_kvcache(q, args, out, nullptr, options, nullptr, 0, true, arch, 227 * 1024, 132);
  const KernelSpec& spec = plan.attention.spec;
  // One token of 4 query heads per KV head: the decode kernel, 16-row tile,
  // 32-key chunks, four warps, two 64 KB stages of K and V.
  CHECK(spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.split");
  CHECK(spec.pack_gqa);
  CHECK(spec.kvcache);
  CHECK(plan.attention.num_splits > 1);
  CHECK(plan.attention.grid == plan.attention.num_splits * 8 * 2);  // splits × KV heads × batch, one tile each
  // Splits count CTA steps of 4 warps × 32 keys: the planner's count never
  // leaves a split of the longest sequence without a step, and the kernel's
  // pieces (of each tile's own keys) hold one step at least.
  CHECK(plan.attention.num_splits <= 8192 / 128);
  CHECK(plan.attention.params.blocks_per_split == 1);
  CHECK(plan.attention.params.split_slots == 0);
  {
    // 64 sequences × 8 KV heads fill every SM twice: two CTAs per SM, 16-key
    // chunks, three 32 KB stages; no split.
    TensorView q64 = TensorView::contiguous(address(0x10000), DType::bf16, {64, 1, 32, 128});
    KVCacheArgs args64 = args;
    args64.k_cache = args64.v_cache = TensorView::contiguous(address(0x30000), DType::bf16, {64, 1024, 8, 128});
    args64.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {64});
    const KVCachePlan wide = plan_kvcache(q64, args64, q64, nullptr, options, nullptr, 0, true, arch, 227 * 1024, 132);
    CHECK(wide.attention.spec.text() == "decode.bf16.d128.br16.bc16.w4.s3");
  }
  {
    // Chunked prefill: 1024 queries of 32 heads over 8192 cached keys fill
    // the GPU with 128-row tiles: the wgmma producer layout, one split, not
    // persistent (RoPE rotates only q: the same tiles). Forced splits split
    // those tiles; forced wgmma tiles are the producer layout, split by the
    // heuristic where they are few.
    TensorView chunk = TensorView::contiguous(address(0x10000), DType::bf16, {2, 1024, 32, 128});
    ForwardOptions causal;
    causal.causal = true;
    causal.rope.style = RopeStyle::rotate_half;
    KVCachePlan prefill = plan_kvcache(chunk, args, chunk, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
    CHECK(prefill.attention.spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128.kvcache");
    CHECK(prefill.attention.num_splits == 1);
    CHECK(prefill.attention.workspace_bytes == 0);
    KVCacheArgs split = args;
    split.num_splits = 4;
    prefill = plan_kvcache(chunk, split, chunk, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
    CHECK(prefill.attention.spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128.kvcache.split");
    CHECK(prefill.attention.num_splits == 4);
    CHECK(prefill.attention.grid == 4 * 2 * 32 * 8);  // splits × batch × heads × query tiles
    causal.tiles = {128, 128, 8, 3, true};
    prefill = plan_kvcache(q, args, out, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
    CHECK(prefill.attention.spec.text() ==
          "fwd.bf16.d128.br128.bc128.w8.s3.wgmma.causal.rope_half_r128.packgqa.kvcache.split");
    // 16 tiles (2 × 8 KV heads): 7 splits are the fewest within 85% of the
    // best wave efficiency (112 CTAs on 132 SMs).
    CHECK(prefill.attention.num_splits == 7);
    CHECK(prefill.attention.workspace_bytes > 0);
    // Tokens of speculative decoding (4 × 4 query heads = 16 rows would take
    // the decode kernel; 16 × 4 = 64 rows do not) at batch 2: wgmma tiles,
    // split to fill the GPU.
    TensorView drafts16 = TensorView::contiguous(address(0x10000), DType::bf16, {2, 16, 32, 128});
    ForwardOptions planned_causal;
    planned_causal.causal = true;
    prefill = plan_kvcache(drafts16, args, drafts16, nullptr, planned_causal, nullptr, 0, true, arch, 227 * 1024, 132);
    CHECK(prefill.attention.spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.packgqa.kvcache.split");
    CHECK(prefill.attention.num_splits == 7);
    // Short packed chunks (12 tokens × 4 query heads of 64 sequences) whose
    // 64-row mma.sync tiles fill every SM twice keep those over a contiguous
    // cache; paged ones take the wgmma tiles.
    TensorView speculative = TensorView::contiguous(address(0x10000), DType::bf16, {64, 12, 32, 128});
    KVCacheArgs many = args;
    many.k_cache = many.v_cache = TensorView::contiguous(address(0x30000), DType::bf16, {64, 8192, 8, 128});
    many.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {64});
    ForwardOptions planned;
    planned.causal = true;
    const KVCachePlan drafts =
        plan_kvcache(speculative, many, speculative, nullptr, planned, nullptr, 0, true, arch, 227 * 1024, 132);
    CHECK_FALSE(drafts.attention.spec.wgmma);
    CHECK(drafts.attention.spec.block_q == 64);
    TensorView pages = TensorView::contiguous(address(0x30000), DType::bf16, {64 * 128, 64, 8, 128});
    TensorView draft_table = TensorView::contiguous(address(0x70000), DType::i32, {64, 128});
    KVCacheArgs paged_many = many;
    paged_many.k_cache = pages;
    values_after_keys(paged_many);
    paged_many.block_table = &draft_table;
    const KVCachePlan paged_drafts =
        plan_kvcache(speculative, paged_many, speculative, nullptr, planned, nullptr, 0, true, arch, 227 * 1024, 132);
    CHECK(paged_drafts.attention.spec.text() == "fwd.bf16.d128.br128.bc128.w8.s3.wgmma.causal.packgqa.kvcache.paged");
    // Forced wgmma tiles with forced splits: the producer layout, split.
    const KVCachePlan forced_split =
        plan_kvcache(q, split, out, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
    CHECK(forced_split.attention.spec.text() ==
          "fwd.bf16.d128.br128.bc128.w8.s3.wgmma.causal.rope_half_r128.packgqa.kvcache.split");
    CHECK(forced_split.attention.num_splits == 4);
    // The wgmma kernel reads the cache by tensor copies: a contiguous
    // cache's map spans its cache batches and capacity, one box per block.
    CHECK(prefill.attention.spec.tensor_copies());
    CHECK(prefill.attention.k_map.rank == 4);
    CHECK(prefill.attention.k_map.dims[1] == 8192);
    CHECK(prefill.attention.k_map.box[1] == 128);
    // Paged: one map spans K's and V's pages (paged_pair_map), 5-D: 64
    // channels, 8 rows, panels (the heads merged in), K/V, and the 8-row
    // groups of every page; a box reads every panel of K and V of a page
    // shorter than a key block (pages of at least 8 rows), so every page size
    // from 8 keeps the wgmma tiles. Smaller pages keep the mma.sync kernel.
    causal.tiles = {};
    TensorView pages_table = TensorView::contiguous(address(0x70000), DType::i32, {2, 128});
    KVCacheArgs paged = args;
    paged.block_table = &pages_table;
    paged.k_cache = TensorView::contiguous(address(0x100000), DType::bf16, {256, 64, 8, 128});
    values_after_keys(paged);
    prefill = plan_kvcache(chunk, paged, chunk, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
    CHECK(prefill.attention.spec.text() == "fwd.bf16.d128.br128.bc128.w8.s3.wgmma.causal.rope_half_r128.kvcache.paged");
    REQUIRE(prefill.attention.spec.interleaved_kv());
    {
      const TileMapLayout& k = prefill.attention.k_map;
      CHECK(k.base == paged.k_cache.data);
      CHECK(k.rank == 5);
      CHECK((k.dims[0] == 64 && k.dims[1] == 8 && k.dims[2] == 2 * 8 && k.dims[3] == 2 && k.dims[4] == 256 * 64 / 8));
      CHECK((k.strides_bytes[0] == 8 * 128 * 2 && k.strides_bytes[1] == 128 &&
             k.strides_bytes[2] == 256 * 64 * 8 * 128 * 2 && k.strides_bytes[3] == 8 * 8 * 128 * 2));
      CHECK((k.box[0] == 64 && k.box[1] == 8 && k.box[2] == 2 && k.box[3] == 2 && k.box[4] == 64 / 8));
      CHECK((k.head_panels == 2 && k.head_pair == 0 && k.head_groups == 0 && k.page_groups == 64 / 8));
      CHECK((prefill.attention.params.k_map_head_panels == 2 && prefill.attention.params.kv_map_page_groups == 8));
      CHECK(prefill.attention.params.kv_value_first == 0);
      CHECK(prefill.attention.v_map.rank == 0);  // V comes with K
    }
    for (const int64_t page_size : {8, 16, 256}) {
      CAPTURE(page_size);
      TensorView table = TensorView::contiguous(address(0x70000), DType::i32, {2, 8192 / page_size});
      paged.block_table = &table;
      paged.k_cache = TensorView::contiguous(address(0x100000), DType::bf16, {2 * 8192 / page_size, page_size, 8, 128});
      values_after_keys(paged);
      prefill = plan_kvcache(chunk, paged, chunk, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
      CHECK(prefill.attention.spec.wgmma);
      CHECK(prefill.attention.spec.block_kv == 128);
      CHECK(prefill.attention.k_map.box[4] == std::min<int64_t>(page_size, 128) / 8);
      CHECK(prefill.attention.k_map.page_groups == page_size / 8);
    }
    // A cache of [pages, heads, page rows, head dim] (heads apart by a
    // page's rows): the heads merge with the 8-row groups instead.
    {
      TensorView table = TensorView::contiguous(address(0x70000), DType::i32, {2, 8192 / 16});
      KVCacheArgs by_head = paged;
      by_head.block_table = &table;
      by_head.k_cache = TensorView::contiguous(address(0x100000), DType::bf16, {2 * 8192 / 16, 8, 16, 128});
      std::swap(by_head.k_cache.shape[1], by_head.k_cache.shape[2]);
      std::swap(by_head.k_cache.strides[1], by_head.k_cache.strides[2]);
      values_after_keys(by_head);
      prefill = plan_kvcache(chunk, by_head, chunk, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
      REQUIRE(prefill.attention.spec.interleaved_kv());
      const TileMapLayout& k = prefill.attention.k_map;
      CHECK((k.dims[2] == 2 && k.dims[4] == 2 * 8192 / 16 * 8 * 2 && k.box[4] == 2));
      CHECK((k.strides_bytes[0] == 128 * 2 && k.strides_bytes[3] == 8 * 128 * 2));
      CHECK((k.head_panels == 0 && k.head_groups == 2 && k.page_groups == 8 * 2));
      // V's pages before K's: the map starts at V.
      KVCacheArgs swapped = by_head;
      std::swap(swapped.k_cache.data, swapped.v_cache.data);
      prefill = plan_kvcache(chunk, swapped, chunk, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
      CHECK((prefill.attention.k_map.base == swapped.v_cache.data && prefill.attention.params.kv_value_first == 1));
      // Heads neither beside each other, nor a page's rows apart, nor K and
      // V side by side per head; pages whose rows do not follow the last
      // page's; K and V in one tensor or of other strides: no map spans
      // both, so forced three-stage tiles are refused with the rule, and the
      // planner takes two stages, which copy K and V apart (every panel of a
      // page in one box), where their own maps describe them (not spread
      // heads: the mma.sync kernel reads those).
      KVCacheArgs spread = paged;
      spread.block_table = &table;
      spread.k_cache = TensorView::contiguous(address(0x100000), DType::bf16, {2 * 8192 / 16, 16, 8, 256});
      spread.k_cache.shape[3] = 128;
      values_after_keys(spread);
      KVCacheArgs gapped = paged;
      gapped.block_table = &table;
      gapped.k_cache = TensorView::contiguous(address(0x100000), DType::bf16, {2 * 8192 / 16, 17, 8, 128});
      gapped.k_cache.shape[1] = 16;
      values_after_keys(gapped);
      KVCacheArgs same = by_head;
      same.v_cache = same.k_cache;
      KVCacheArgs unlike = by_head;
      unlike.v_cache.strides[1] = 8 * 128, unlike.v_cache.strides[2] = 128;
      for (const KVCacheArgs* cache : {&spread, &gapped, &same, &unlike}) {
        prefill = plan_kvcache(chunk, *cache, chunk, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
        if (cache == &spread) {
          CHECK_FALSE(prefill.attention.spec.wgmma);
        } else {
          CHECK(prefill.attention.spec.text() ==
                "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128.kvcache.paged");
          CHECK(prefill.attention.spec.interleaved_panels());
          CHECK(prefill.attention.v_map.rank == 5);
        }
        ForwardOptions forced = causal;
        forced.tiles = {128, 128, 8, 3, true};
        CHECK_THROWS_WITH_AS(
            plan_kvcache(chunk, *cache, chunk, nullptr, forced, nullptr, 0, true, arch, 227 * 1024, 132),
            doctest::Contains("K and V of the same strides, a positive multiple of 16 bytes below 2^40 apart"), Error);
      }
      // A head's K and V side by side ([pages, 16, 8, 2, 128]): the heads
      // merge with K/V (index 2h is head h's K).
      KVCacheArgs pairs = paged;
      pairs.block_table = &table;
      pairs.k_cache = TensorView::contiguous(address(0x100000), DType::bf16, {2 * 8192 / 16, 16, 8, 256});
      pairs.k_cache.shape[3] = 128;
      pairs.v_cache = pairs.k_cache;
      pairs.v_cache.data = address(0x100000 + 128 * 2);
      prefill = plan_kvcache(chunk, pairs, chunk, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
      REQUIRE(prefill.attention.spec.interleaved_kv());
      CHECK((prefill.attention.k_map.dims[3] == 2 * 8 && prefill.attention.k_map.strides_bytes[2] == 128 * 2));
      CHECK((prefill.attention.k_map.head_panels == 0 && prefill.attention.k_map.head_pair == 2));
      // Two stages, forced: K and V copied apart, each copy every panel of
      // a page (KernelSpec::interleaved_panels, paged_panel_map), so K and V
      // may be one tensor; the heads merge into the panels or the groups
      // only.
      ForwardOptions two_stages = causal;
      two_stages.tiles = {128, 128, 8, 2, true};
      prefill = plan_kvcache(chunk, same, chunk, nullptr, two_stages, nullptr, 0, true, arch, 227 * 1024, 132);
      REQUIRE(prefill.attention.spec.interleaved_panels());
      {
        const TileMapLayout& k = prefill.attention.k_map;
        CHECK((k.dims[2] == 2 && k.dims[3] == 2 * 8 && k.dims[4] == 2 * 8192 / 16 && k.box[2] == 2 && k.box[3] == 2));
        CHECK((k.head_panels == 0 && k.head_groups == 2 && prefill.attention.params.v_map_head_groups == 2));
        CHECK(prefill.attention.v_map.rank == 5);
      }
      CHECK_THROWS_WITH_AS(
          plan_kvcache(chunk, spread, chunk, nullptr, two_stages, nullptr, 0, true, arch, 227 * 1024, 132),
          doctest::Contains("a head stride of head_dim"), Error);
    }
    // Head dim 64 without RoPE: the dense tiles, 192 rows where they do not
    // pad the chunk much more than 128 would (test above); with RoPE, 128.
    {
      KVCacheArgs small = args;
      small.k_cache = small.v_cache = TensorView::contiguous(address(0x30000), DType::bf16, {2, 8192, 8, 64});
      TensorView chunk64 = TensorView::contiguous(address(0x10000), DType::bf16, {2, 1024, 32, 64});
      ForwardOptions plain;
      plain.causal = true;
      CHECK(plan_kvcache(chunk64, small, chunk64, nullptr, plain, nullptr, 0, true, arch, 227 * 1024, 132)
                .attention.spec.text() == "fwd.bf16.d64.br192.bc128.w12.s4.wgmma.causal.kvcache");
      TensorView short_chunk = TensorView::contiguous(address(0x10000), DType::bf16, {8, 256, 32, 64});
      KVCacheArgs eight = small;
      eight.k_cache = eight.v_cache = TensorView::contiguous(address(0x30000), DType::bf16, {8, 8192, 8, 64});
      eight.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {8});
      CHECK(plan_kvcache(short_chunk, eight, short_chunk, nullptr, plain, nullptr, 0, true, arch, 227 * 1024, 132)
                .attention.spec.block_q == 128);
      plain.rope.style = RopeStyle::rotate_half;
      CHECK(plan_kvcache(chunk64, small, chunk64, nullptr, plain, nullptr, 0, true, arch, 227 * 1024, 132)
                .attention.spec.text() == "fwd.bf16.d64.br128.bc128.w8.s4.wgmma.causal.rope_half_r64.kvcache");
      // Pages at head dim 64 (one panel): K and V interleave as at 128.
      // vLLM's [2, pages, 16, 8, 64]: V's pages follow K's.
      constexpr int64_t kPages = 2 * 8192 / 16, kPageElems = 16 * 8 * 64;
      TensorView table64 = TensorView::contiguous(address(0x70000), DType::i32, {2, 8192 / 16});
      KVCacheArgs paged64 = small;
      paged64.block_table = &table64;
      paged64.k_cache = TensorView::contiguous(address(0x100000), DType::bf16, {kPages, 16, 8, 64});
      values_after_keys(paged64);
      const KVCachePlan pages64 =
          plan_kvcache(chunk64, paged64, chunk64, nullptr, plain, nullptr, 0, true, arch, 227 * 1024, 132);
      CHECK(pages64.attention.spec.text() == "fwd.bf16.d64.br128.bc128.w8.s4.wgmma.causal.rope_half_r64.kvcache.paged");
      REQUIRE(pages64.attention.spec.interleaved_kv());
      const TileMapLayout& k = pages64.attention.k_map;
      CHECK((k.dims[0] == 64 && k.dims[1] == 8 && k.dims[2] == 8 && k.dims[3] == 2 && k.dims[4] == kPages * 2));
      CHECK((k.strides_bytes[0] == 8 * 64 * 2 && k.strides_bytes[1] == 128 &&
             k.strides_bytes[2] == kPages * kPageElems * 2 && k.strides_bytes[3] == 8 * 8 * 64 * 2));
      CHECK((k.box[0] == 64 && k.box[1] == 8 && k.box[2] == 1 && k.box[3] == 2 && k.box[4] == 2));
      CHECK((k.head_panels == 1 && k.head_pair == 0 && k.head_groups == 0 && k.page_groups == 2));
      // K and V in one tensor: no map spans both, so two stages, whose
      // copies read K and V apart (a box per page each, 4-D maps).
      KVCacheArgs same64 = paged64;
      same64.v_cache = same64.k_cache;
      const KVCachePlan apart =
          plan_kvcache(chunk64, same64, chunk64, nullptr, plain, nullptr, 0, true, arch, 227 * 1024, 132);
      CHECK(apart.attention.spec.text() == "fwd.bf16.d64.br128.bc128.w8.s2.wgmma.causal.rope_half_r64.kvcache.paged");
      CHECK_FALSE(apart.attention.spec.interleaved_kv());
      CHECK((apart.attention.k_map.rank == 4 && apart.attention.v_map.rank == 4 && apart.attention.k_map.box[1] == 16));
    }
    // Above head dim 128: the dense tiles over a contiguous cache (128 × 96
    // at 192, 128 × 80 at 256), 64-key blocks over a paged one, whose blocks
    // must tile its pages; padded head dims take the next kernel.
    {
      ForwardOptions wide = causal;
      for (const int head_dim : {160, 192, 256}) {
        CAPTURE(head_dim);
        const int kernel_dim = head_dim <= 192 ? 192 : 256;
        TensorView wide_chunk = TensorView::contiguous(address(0x10000), DType::bf16, {2, 1024, 32, head_dim});
        KVCacheArgs contiguous = args;
        contiguous.k_cache = contiguous.v_cache =
            TensorView::contiguous(address(0x30000), DType::bf16, {2, 8192, 8, head_dim});
        const std::string padded = head_dim != kernel_dim ? ".padded" : "";
        wide.rope.style = RopeStyle::none;
        CHECK(plan_kvcache(wide_chunk, contiguous, wide_chunk, nullptr, wide, nullptr, 0, true, arch, 227 * 1024, 132)
                  .attention.spec.text() ==
              fmt::format("fwd.bf16.d{}.br128.bc{}.w8.s2.wgmma.causal.kvcache{}", kernel_dim,
                          kernel_dim == 192 ? 96 : 80, padded));
        TensorView table = TensorView::contiguous(address(0x70000), DType::i32, {2, 8192 / 16});
        KVCacheArgs wide_paged = args;
        wide_paged.block_table = &table;
        wide_paged.k_cache = TensorView::contiguous(address(0x100000), DType::bf16, {2 * 8192 / 16, 16, 8, head_dim});
        values_after_keys(wide_paged);
        wide.rope.style = RopeStyle::rotate_half;
        const KVCachePlan wide_plan =
            plan_kvcache(wide_chunk, wide_paged, wide_chunk, nullptr, wide, nullptr, 0, true, arch, 227 * 1024, 132);
        CHECK(wide_plan.attention.spec.text() ==
              fmt::format("fwd.bf16.d{}.br128.bc64.w8.s{}.wgmma.causal.rope_half_r{}.kvcache.paged{}", kernel_dim,
                          kernel_dim == 192 ? 3 : 2, head_dim, padded));
        // Whole panels interleave with V's (a box of 16 rows × every panel ×
        // K and V); padded head dims keep a box per panel (the map's channels
        // end at the caller's head dim, and zeros fill the rest).
        // (Three stages at 192: K's and V's panels in one box; two at 256:
        // K's or V's.)
        CHECK(wide_plan.attention.spec.interleaved_kv() == (padded.empty() && kernel_dim == 192));
        CHECK(wide_plan.attention.spec.interleaved_panels() == (padded.empty() && kernel_dim == 256));
        if (padded.empty()) {
          const uint32_t(&box)[5] = wide_plan.attention.k_map.box;
          CHECK(box[2] == kernel_dim / 64);
          CHECK((kernel_dim == 192 ? box[3] == 2 && box[4] == 2 : box[3] == 2 && box[4] == 1));
        } else {
          CHECK(wide_plan.attention.k_map.box[1] == 16);
        }
        ForwardOptions straddling = wide;
        straddling.tiles = {128, 80, 8, 2, true};
        CHECK_THROWS_WITH_AS(
            plan_kvcache(wide_chunk, wide_paged, wide_chunk, nullptr, straddling, nullptr, 0, true, arch, 227 * 1024, 132),
            doctest::Contains("key blocks of a paged cache tile its pages"), Error);
      }
    }
    TensorView small_table = TensorView::contiguous(address(0x70000), DType::i32, {2, 2048});
    paged.block_table = &small_table;
    paged.k_cache = paged.v_cache = TensorView::contiguous(address(0x30000), DType::bf16, {4096, 4, 8, 128});
    prefill = plan_kvcache(chunk, paged, chunk, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
    CHECK(prefill.attention.spec.family == Family::fwd);
    CHECK_FALSE(prefill.attention.spec.wgmma);
    // Forced wgmma tiles over such pages: the kernel copies them a row at a
    // time itself (FwdConfig::kMinTensorCopyPageShift), so no map is
    // encoded (a box holds whole 8-row groups).
    causal.tiles = {128, 128, 8, 2, true};
    prefill = plan_kvcache(chunk, paged, chunk, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
    CHECK(prefill.attention.spec.wgmma);
    CHECK(prefill.attention.k_map.rank == 0);
    causal.tiles = {};
  }
  const size_t partials = static_cast<size_t>(plan.attention.num_splits) * 2 * 1 * 32;
  CHECK(plan.attention.workspace_bytes == (partials * 128 * 4 + 255) / 256 * 256 + partials * 4);
  CHECK(plan.append.grid == 0);
  // With the workspace the combine is planned too; without, the call is refused.
  std::vector<char> storage(plan.attention.workspace_bytes + 256);
  void* workspace = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(storage.data()) + 255) / 256 * 256);
  plan = plan_kvcache(q, args, out, nullptr, options, workspace, plan.attention.workspace_bytes, false, arch, 227 * 1024, 132);
  CHECK(plan.combine.grid > 0);
  CHECK(plan.combine.spec.text() == "combine.f32.bf16");
  CHECK(plan.attention.params.partial_o == workspace);
  CHECK_THROWS_WITH_AS(plan_kvcache(q, args, out, nullptr, options, workspace, 100, false, arch, 227 * 1024, 132),
                       doctest::Contains("workspace: 100 bytes given"), Error);
  // One split asked for: no workspace, no combine.
  args.num_splits = 1;
  plan = plan_kvcache(q, args, out, nullptr, options, nullptr, 0, false, arch, 227 * 1024, 132);
  CHECK_FALSE(plan.attention.spec.split);
  CHECK(plan.attention.workspace_bytes == 0);
  CHECK(plan.combine.grid == 0);
  // New keys with RoPE: an append launch whose spec carries the rotation; q rotates at cache_seqlens.
  TensorView k_new = TensorView::contiguous(address(0x60000), DType::bf16, {2, 1, 8, 128});
  args.k_new = &k_new;
  args.v_new = &k_new;
  options.rope.style = RopeStyle::rotate_half;
  options.rope.rotary_dim = 64;
  plan = plan_kvcache(q, args, out, nullptr, options, nullptr, 0, false, arch, 227 * 1024, 132);
  CHECK(plan.append.spec.text() == "append.bf16.rope_half_r64");
  CHECK(plan.append.grid == (2 * 1 * 8 + 3) / 4);
  // YaRN's attention factor: q's kernel and the append both scale (the
  // cache keeps keys as Hugging Face's scaled caches leave them).
  options.rope.yarn_factor = 4.f;
  plan = plan_kvcache(q, args, out, nullptr, options, nullptr, 0, false, arch, 227 * 1024, 132);
  CHECK(plan.append.spec.text() == "append.bf16.rope_half_r64.rope_scaled");
  CHECK(plan.attention.spec.rope_scaled);
  CHECK(plan.append.params.rope_attention_factor == doctest::Approx(0.1 * std::log(4.0) + 1.0));
  CHECK(plan.attention.params.rope_attention_factor == plan.append.params.rope_attention_factor);
  CHECK(plan.append.params.rope_inv_freq[31] == plan.attention.params.rope_inv_freq[31]);
  options.rope.yarn_factor = 0.f;
  // LongRoPE the same way: its frequencies and attention factor in both.
  std::vector<float> pair_factors(32, 3.f);
  options.rope.longrope_pair_factors = pair_factors.data();
  options.rope.longrope_factor = 32.f;
  plan = plan_kvcache(q, args, out, nullptr, options, nullptr, 0, false, arch, 227 * 1024, 132);
  CHECK(plan.append.spec.text() == "append.bf16.rope_half_r64.rope_scaled");
  CHECK(plan.attention.spec.rope_scaled);
  CHECK(plan.append.params.rope_attention_factor == doctest::Approx(std::sqrt(1.0 + std::log(32.0) / std::log(4096.0))));
  CHECK(plan.attention.params.rope_attention_factor == plan.append.params.rope_attention_factor);
  CHECK(plan.append.params.rope_inv_freq[31] == doctest::Approx(std::pow(10000.0, -62.0 / 64) / 3).epsilon(1e-6));
  CHECK(plan.attention.params.rope_inv_freq[31] == plan.append.params.rope_inv_freq[31]);
  options.rope.longrope_pair_factors = nullptr;
  options.rope.longrope_factor = 0.f;
  CHECK(plan.attention.params.seqlen_k_added == 1);
  CHECK(plan.attention.params.rope_q_offsets == args.cache_seqlens.data);
  // Paged: page sizes must be powers of two. Pages of at least 8 rows take
  // the decode kernel (its chunks span pages shorter than themselves);
  // smaller ones the prefill kernel: on sm_90a its wgmma tiles where pages
  // hold 8 rows (a tensor copy per page), else the mma.sync tiles' per-row
  // copy (64-key blocks).
  TensorView table = TensorView::contiguous(address(0x70000), DType::i32, {2, 128});
  args.block_table = &table;
  args.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {256, 64, 8, 128});
  args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {256, 64, 8, 128});
  plan = plan_kvcache(q, args, out, nullptr, options, nullptr, 0, false, arch, 227 * 1024, 132);
  CHECK(plan.attention.spec.paged);
  CHECK(plan.attention.spec.family == Family::decode);
  CHECK(plan.attention.spec.block_kv == 32);
  CHECK(plan.attention.params.page_shift == 6);
  CHECK(plan.append.spec.text() == "append.bf16.rope_half_r64.paged");
  {
    KVCacheArgs small = args;
    TensorView k8 = TensorView::contiguous(address(0x30000), DType::bf16, {2048, 8, 8, 128});
    TensorView table8 = TensorView::contiguous(address(0x70000), DType::i32, {2, 1024});
    small.k_cache = small.v_cache = k8;
    small.block_table = &table8;
    plan = plan_kvcache(q, small, out, nullptr, options, nullptr, 0, false, arch, 227 * 1024, 132);
    CHECK(plan.attention.spec.family == Family::decode);
    CHECK(plan.attention.spec.block_kv == 32);
    CHECK(plan.attention.spec.page_rows == 8);
    plan = plan_kvcache(q, small, out, nullptr, options, nullptr, 0, false, Arch::parse("sm_80"), 163 * 1024, 108);
    CHECK(plan.attention.spec.family == Family::decode);
    CHECK(plan.attention.spec.page_rows == 8);
    // Single-row pages too at head dims whose rows divide a copy pass (32,
    // 64, 128, 256): each copy takes its row's page.
    TensorView k1 = TensorView::contiguous(address(0x30000), DType::bf16, {16384, 1, 8, 128});
    TensorView table1 = TensorView::contiguous(address(0x70000), DType::i32, {2, 8192});
    small.k_cache = small.v_cache = k1;
    small.block_table = &table1;
    plan = plan_kvcache(q, small, out, nullptr, options, nullptr, 0, false, arch, 227 * 1024, 132);
    CHECK(plan.attention.spec.family == Family::decode);
    CHECK(plan.attention.spec.text().find(".paged1") != std::string::npos);
    // Head dim 96 (rows of 12 copies) reads pages of at least 8 rows; pages
    // of 4 take the prefill kernel (before sm_90a its mma.sync tiles' per-row
    // copy), and forced decode tiles are refused.
    TensorView q96 = TensorView::contiguous(address(0x10000), DType::bf16, {2, 1, 32, 96});
    TensorView k4 = TensorView::contiguous(address(0x30000), DType::bf16, {4096, 4, 8, 96});
    TensorView table4 = TensorView::contiguous(address(0x70000), DType::i32, {2, 2048});
    KVCacheArgs small96 = small;
    small96.k_cache = small96.v_cache = k4;
    small96.block_table = &table4;
    small96.k_new = small96.v_new = nullptr;
    ForwardOptions plain96;
    plan = plan_kvcache(q96, small96, q96, nullptr, plain96, nullptr, 0, false, Arch::parse("sm_80"), 163 * 1024, 108);
    CHECK(plan.attention.spec.family == Family::fwd);
    CHECK_FALSE(plan.attention.spec.wgmma);
    CHECK(plan.attention.spec.block_kv == 64);
    small96.k_cache.shape[1] = small96.v_cache.shape[1] = 8;  // pages of 8: the decode kernel
    small96.k_cache.shape[0] = small96.v_cache.shape[0] = 2048;
    small96.k_cache.strides[0] = small96.v_cache.strides[0] = 8 * 8 * 96;
    plan = plan_kvcache(q96, small96, q96, nullptr, plain96, nullptr, 0, false, arch, 227 * 1024, 132);
    CHECK(plan.attention.spec.family == Family::decode);
    CHECK(plan.attention.spec.page_rows == 8);
    small96.k_cache = small96.v_cache = k4;
    ForwardOptions forced = plain96;
    forced.tiles.stages = 2;
    CHECK_THROWS_WITH_AS(plan_kvcache(q96, small96, q96, nullptr, forced, nullptr, 0, false, arch, 227 * 1024, 132),
                         doctest::Contains("reads pages of at least 8 rows at head_dim 96; page_size is 4"), Error);
  }
  // Forced tiles: without stages the prefill kernel; with them the decode
  // kernel as given.
  {
    ForwardOptions forced = options;
    forced.tiles = {64, 64, 4, 0};
    plan = plan_kvcache(q, args, out, nullptr, forced, nullptr, 0, false, arch, 227 * 1024, 132);
    CHECK(plan.attention.spec.text().rfind("fwd.bf16.d128.br64.bc64.w4.rope_half_r64.packgqa.kvcache.paged", 0) == 0);
    forced.tiles = {32, 32, 2, 3};
    plan = plan_kvcache(q, args, out, nullptr, forced, nullptr, 0, false, arch, 227 * 1024, 132);
    CHECK(plan.attention.spec.text().rfind("decode.bf16.d128.br32.bc32.w2.s3.rope_half_r64.paged", 0) == 0);
    CHECK(plan.attention.params.num_q_blocks == 1);
    forced.pack_gqa = false;
    CHECK_THROWS_WITH_AS(plan_kvcache(q, args, out, nullptr, forced, nullptr, 0, false, arch, 227 * 1024, 132),
                         doctest::Contains("options.pack_gqa=false: the decode kernel"), Error);
  }
  args.k_cache.shape[1] = args.v_cache.shape[1] = 48;
  CHECK_THROWS_WITH_AS(plan_kvcache(q, args, out, nullptr, options, nullptr, 0, false, arch, 227 * 1024, 132),
                       doctest::Contains("page_size=48"), Error);
}

TEST_CASE("forward with a workspace splits calls whose tiles leave the GPU underused; without one nothing splits") {
  const Arch hopper = Arch::parse("sm_90a"), ampere = Arch::parse("sm_80");
  auto plan_split = [](const Call& c, const Arch& arch, void* workspace = nullptr, size_t bytes = 0,
                       bool sizing_only = true) {
    return plan_forward_split(c.q, c.k, c.v, c.out, &c.lse, c.options, workspace, bytes, sizing_only, arch, 227 * 1024,
                              132);
  };
  // One token of 32 query heads over 32768 keys of 8 KV heads: 4 packed
  // rows per KV head, the decode kernel over dense K/V (8 CTAs alone), split
  // 14 ways (112 CTAs: the fewest within 85% of the best wave) in steps of
  // 4 warps × 32 keys, on sm_90a and sm_80 alike.
  Call decode;
  decode.q = decode.out = TensorView::contiguous(address(0x10000), DType::bf16, {1, 1, 32, 128});
  decode.k = decode.v = TensorView::contiguous(address(0x20000), DType::bf16, {1, 32768, 8, 128});
  decode.lse = TensorView::contiguous(address(0x50000), DType::f32, {1, 32, 1});
  SplitForwardPlan split = plan_split(decode, hopper);
  CHECK(split.attention.spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.dense.split");
  CHECK_FALSE(split.attention.spec.kvcache);
  CHECK(split.attention.num_splits == 14);
  CHECK(split.attention.grid == 14 * 8);
  CHECK(split.attention.params.blocks_per_split == 1);  // pieces of one step or more, cut by the kernel
  // fp32 outputs (256-byte aligned), then the LSEs, of every split × row × head.
  CHECK(split.attention.partial_o_bytes == (14 * 32 * 128 * 4 + 255) / 256 * 256);
  CHECK(split.attention.workspace_bytes == split.attention.partial_o_bytes + 14 * 32 * 4);
  CHECK(split.combine.grid == 0);  // sizing only: no combine planned
  CHECK(plan_split(decode, ampere).attention.spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.dense.split");
  // The same call without a workspace: the decode kernel, one split.
  const ForwardPlan unsplit = decode.plan();
  CHECK(unsplit.spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.dense");
  CHECK(unsplit.workspace_bytes == 0);
  // With RoPE (the decode kernel does not rotate keys) the prefill tiles
  // take it: wgmma on sm_90a, split 14 ways; 64-row mma.sync tiles on sm_80,
  // 29 ways (two CTAs per SM).
  Call rotated = decode;
  rotated.options.rope.style = RopeStyle::rotate_half;
  CHECK(plan_split(rotated, hopper).attention.spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.rope_half_r128.packgqa.split");
  CHECK(plan_split(rotated, hopper).attention.num_splits == 14);
  CHECK(plan_split(rotated, ampere).attention.spec.text() == "fwd.bf16.d128.br64.bc128.w4.rope_half_r128.packgqa.split");
  CHECK(plan_split(rotated, ampere).attention.num_splits == 29);
  // With the workspace: partials in it, and the combine into out and lse.
  const size_t bytes = split.attention.workspace_bytes;
  split = plan_split(decode, hopper, address(0x100000), bytes, false);
  CHECK(split.attention.params.partial_o == address(0x100000));
  CHECK(reinterpret_cast<uintptr_t>(split.attention.params.partial_lse) ==
        0x100000 + split.attention.partial_o_bytes);
  CHECK(split.combine.grid > 0);
  CHECK(split.combine.spec.text() == "combine.f32.bf16");
  CHECK(split.combine.params.num_states == 14);
  CHECK(split.attention.params.seqlen_k == 32768);  // dense keys: one length for every sequence
  // Forced counts, and 1 for none.
  decode.options.num_splits = 3;
  CHECK(plan_split(decode, hopper).attention.num_splits == 3);
  decode.options.num_splits = 1;
  CHECK_FALSE(plan_split(decode, hopper).attention.spec.split);
  CHECK(plan_split(decode, hopper).attention.workspace_bytes == 0);
  decode.options.num_splits = 0;
  // Grids that fill the GPU do not split, and keep plan_forward's kernel.
  Call prefill;
  prefill.q = prefill.out = TensorView::contiguous(address(0x10000), DType::bf16, {4, 4096, 32, 128});
  prefill.k = prefill.v = TensorView::contiguous(address(0x20000), DType::bf16, {4, 4096, 8, 128});
  prefill.lse = TensorView::contiguous(address(0x50000), DType::f32, {4, 32, 4096});
  prefill.options.causal = true;
  CHECK(plan_split(prefill, hopper).attention.spec == prefill.plan().spec);
  CHECK(plan_split(prefill, hopper).attention.workspace_bytes == 0);
  // 128 causal queries over 32768 keys: unpacked wgmma tiles of 176-key
  // blocks (the long-call rule), 4 splits.
  Call chunk = decode;
  chunk.q = chunk.out = TensorView::contiguous(address(0x10000), DType::bf16, {1, 128, 32, 128});
  chunk.lse = TensorView::contiguous(address(0x50000), DType::f32, {1, 32, 128});
  chunk.options.causal = true;
  CHECK(plan_split(chunk, hopper).attention.spec.text() == "fwd.bf16.d128.br128.bc176.w8.s2.wgmma.causal.split");
  CHECK(plan_split(chunk, hopper).attention.num_splits == 4);
  // Kernels that do not split: head dims that are not a multiple of 8 run
  // unsplit under the heuristic and refuse forced counts, as persistent grids do.
  Call odd = decode;
  odd.q = odd.out = TensorView::contiguous(address(0x10000), DType::bf16, {1, 1, 32, 59});
  odd.k = odd.v = TensorView::contiguous(address(0x20000), DType::bf16, {1, 32768, 8, 59});
  CHECK_FALSE(plan_split(odd, hopper).attention.spec.split);
  odd.options.num_splits = 3;
  CHECK_THROWS_WITH_AS(plan_split(odd, hopper), doctest::Contains("options.num_splits=3: fwd.bf16.d64"), Error);
  Call persistent = prefill;
  persistent.options.tiles = {128, 128, 8, 2, true, true};
  persistent.options.num_splits = 2;
  CHECK_THROWS_WITH_AS(plan_split(persistent, hopper), doctest::Contains("does not split (persistent grids"), Error);
  // A count forced on a call whose planner-chosen kernel would be persistent
  // takes the ordinary grid instead of being refused.
  Call wave = prefill;
  wave.q = wave.out = TensorView::contiguous(address(0x10000), DType::bf16, {4, 1024, 16, 128});
  wave.k = wave.v = TensorView::contiguous(address(0x20000), DType::bf16, {4, 1024, 16, 128});
  wave.lse = TensorView::contiguous(address(0x50000), DType::f32, {4, 16, 1024});
  wave.options.causal = false;
  REQUIRE(wave.plan().spec.persistent);
  wave.options.num_splits = 2;
  const auto forced = plan_split(wave, hopper);
  CHECK(forced.attention.spec.split);
  CHECK_FALSE(forced.attention.spec.persistent);
  CHECK(forced.attention.num_splits == 2);
  // So does the RoPE producer layout at head dim 64 (256-row mma.sync tiles, no partial results).
  Call rope = wave;
  rope.q = rope.out = TensorView::contiguous(address(0x10000), DType::bf16, {1, 2048, 32, 64});
  rope.k = rope.v = TensorView::contiguous(address(0x20000), DType::bf16, {1, 200, 32, 64});
  rope.lse = TensorView::contiguous(address(0x50000), DType::f32, {1, 32, 2048});
  rope.options.rope.style = RopeStyle::rotate_half;
  rope.options.num_splits = 0;
  REQUIRE(plan_split(rope, hopper).attention.spec.text().find(".br256.bc64.w8.s3.") != std::string::npos);
  rope.options.num_splits = 2;
  const auto rope_forced = plan_split(rope, hopper);
  INFO(rope_forced.attention.spec.text());
  CHECK(rope_forced.attention.spec.split);
  CHECK(rope_forced.attention.num_splits == 2);
  // Forced counts need a workspace; a short or misaligned one is refused.
  decode.options.num_splits = 3;
  CHECK_THROWS_WITH_AS(decode.plan(), doctest::Contains("options.num_splits=3: splitting needs a workspace"), Error);
  decode.options.num_splits = 129;
  CHECK_THROWS_WITH_AS(plan_split(decode, hopper), doctest::Contains("options.num_splits=129 must be 0"), Error);
  decode.options.num_splits = 0;
  CHECK_THROWS_WITH_AS(plan_split(decode, hopper, address(0x100000), bytes - 1, false),
                       doctest::Contains(fmt::format("workspace: {} bytes given; this call needs {} (ask "
                                                     "forward_workspace_bytes)", bytes - 1, bytes).c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(plan_split(decode, hopper, address(0x100080), bytes, false),
                       doctest::Contains("256-byte aligned"), Error);
  // forward_kvcache takes its count from its own arguments.
  KVCacheArgs args;
  args.k_cache = args.v_cache = decode.k;
  args.cache_seqlens = TensorView::contiguous(address(0x60000), DType::i32, {1});
  ForwardOptions options;
  options.num_splits = 2;
  CHECK_THROWS_WITH_AS(plan_kvcache(decode.q, args, decode.out, nullptr, options, nullptr, 0, true, hopper, 227 * 1024, 132),
                       doctest::Contains("options.num_splits=2: forward_kvcache takes its split count from KVCacheArgs"),
                       Error);
}

TEST_CASE("varlen with a workspace splits over the longest sequence's keys; a block table pages the keys") {
  const Arch hopper = Arch::parse("sm_90a");
  // Four decoding steps (one query each) of 32 query heads over 8 KV heads
  // at d128; keys packed [4 × 8192, 8, 128], or paged [512, 64, 8, 128] with
  // a [4, 128] block table; out heads-major, lse [32, 4] padded.
  struct Batch {
    TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {4, 32, 128});
    TensorView k = TensorView::contiguous(address(0x100000), DType::bf16, {4 * 8192, 8, 128});
    TensorView pages = TensorView::contiguous(address(0x100000), DType::bf16, {512, 64, 8, 128});
    // V's pages after K's, in one allocation (values_after_keys).
    TensorView value_pages = TensorView::contiguous(address(0x100000 + 512 * 64 * 8 * 128 * 2), DType::bf16,
                                                    {512, 64, 8, 128});
    TensorView out = TensorView::contiguous(address(0x40000), DType::bf16, {4, 32, 128});
    TensorView lse = TensorView::contiguous(address(0x50000), DType::f32, {32, 4});
    TensorView seqused = TensorView::contiguous(address(0x62000), DType::i32, {4});
    TensorView table = TensorView::contiguous(address(0x63000), DType::i32, {4, 128});
    VarlenArgs varlen;
    ForwardOptions options;
    bool paged = false;
    Batch() {
      out.strides[0] = 128;
      out.strides[1] = 4 * 128;
      lse.strides[0] = 8;
      varlen.cu_seqlens_q = TensorView::contiguous(address(0x60000), DType::i32, {5});
      varlen.cu_seqlens_k = TensorView::contiguous(address(0x61000), DType::i32, {5});
      varlen.max_seqlen_q = 1;
      varlen.max_seqlen_k = 8192;
    }
    const TensorView& keys() const { return paged ? pages : k; }
    const TensorView& values() const { return paged ? value_pages : k; }
    ForwardPlan plan() {
      varlen.block_table = paged ? &table : nullptr;
      return plan_forward_varlen(q, keys(), values(), out, &lse, varlen, options, Arch::parse("sm_90a"), 227 * 1024,
                                 132);
    }
    SplitForwardPlan split(void* workspace = nullptr, size_t bytes = 0, bool sizing_only = true) {
      varlen.block_table = paged ? &table : nullptr;
      return plan_forward_varlen_split(q, keys(), values(), out, &lse, varlen, options, workspace, bytes, sizing_only,
                                       Arch::parse("sm_90a"), 227 * 1024, 132);
    }
  };

  Batch call;
  // Without a workspace: the decode kernel over packed keys, 32 CTAs.
  const ForwardPlan unsplit = call.plan();
  CHECK(unsplit.spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.dense.varlen");
  CHECK(unsplit.grid == 4 * 8);
  CHECK(unsplit.params.cu_seqlens_q == static_cast<const int*>(call.varlen.cu_seqlens_q.data));
  CHECK(unsplit.params.batch == 4);
  // With one: split as a dense call of 4 × 8192 keys would be (heuristic
  // over 32 tiles of 64 steps), partial rows the 4 packed queries.
  SplitForwardPlan split = call.split();
  CHECK(split.attention.spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.dense.split.varlen");
  const int splits = split.attention.num_splits;
  CHECK(splits > 1);
  CHECK(split.attention.grid == static_cast<unsigned>(splits * 4 * 8));
  CHECK(split.attention.params.partial_rows == 4);
  CHECK(split.attention.partial_o_bytes == (static_cast<size_t>(splits) * 4 * 32 * 128 * 4 + 255) / 256 * 256);
  CHECK(split.attention.workspace_bytes == split.attention.partial_o_bytes + static_cast<size_t>(splits) * 4 * 32 * 4);
  {  // the same call as a dense one splits the same way
    Call dense;
    dense.q = dense.out = TensorView::contiguous(address(0x10000), DType::bf16, {4, 1, 32, 128});
    dense.k = dense.v = TensorView::contiguous(address(0x100000), DType::bf16, {4, 8192, 8, 128});
    dense.lse = TensorView::contiguous(address(0x50000), DType::f32, {4, 32, 1});
    CHECK(plan_forward_split(dense.q, dense.k, dense.v, dense.out, &dense.lse, dense.options, nullptr, 0, true, hopper,
                             227 * 1024, 132)
              .attention.num_splits == splits);
  }
  // The combine: one "batch" of the 4 packed rows, into out's and lse's strides.
  const size_t bytes = split.attention.workspace_bytes;
  split = call.split(address(0x200000), bytes, false);
  CHECK(split.combine.grid > 0);
  const CombineParams& merge = split.combine.params;
  CHECK(merge.num_states == splits);
  CHECK((merge.batch == 1 && merge.seqlen == 4 && merge.heads == 32 && merge.head_dim == 128));
  CHECK((merge.out_batch_stride == 0 && merge.out_row_stride == 128 && merge.out_head_stride == 4 * 128));
  CHECK((merge.out_lse_batch_stride == 0 && merge.out_lse_row_stride == 1 && merge.out_lse_head_stride == 8));
  CHECK(merge.states == split.attention.params.partial_o);
  // Rows past cu_seqlens_q[batch] (no sequence's) are left alone.
  CHECK(merge.rows_used == static_cast<const int*>(call.varlen.cu_seqlens_q.data) + 4);
  CHECK_THROWS_WITH_AS(call.split(address(0x200000), bytes - 4, false),
                       doctest::Contains("(ask forward_varlen_workspace_bytes)"), Error);
  {  // No queries: nothing to split, no workspace needed, heuristic or forced.
    Batch empty;
    empty.q = empty.out = TensorView::contiguous(address(0x10000), DType::bf16, {0, 32, 128});
    empty.lse = TensorView::contiguous(address(0x50000), DType::f32, {32, 0});
    empty.varlen.max_seqlen_q = 0;
    for (int splits : {0, 3}) {
      empty.options.num_splits = splits;
      const SplitForwardPlan none = empty.split(nullptr, 0, false);
      CHECK(none.attention.grid == 0);
      CHECK(none.attention.workspace_bytes == 0);
      CHECK(none.combine.grid == 0);
    }
  }
  // Forced counts; 1 for none; without a workspace only 0 or 1.
  call.options.num_splits = 3;
  CHECK(call.split().attention.num_splits == 3);
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("options.num_splits=3: splitting needs a workspace"), Error);
  call.options.num_splits = 1;
  CHECK_FALSE(call.split().attention.spec.split);
  call.options.num_splits = 0;

  // Over a paged cache: the keys are pages (kvcache implied in decode specs;
  // page stride as the batch stride), the lengths varlen's.
  call.paged = true;
  const ForwardPlan paged = call.plan();
  CHECK(paged.spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.paged.varlen");
  CHECK(paged.params.block_table == static_cast<const int*>(call.table.data));
  CHECK(paged.params.block_table_stride == 128);
  CHECK(paged.params.page_shift == 6);
  CHECK(paged.params.k_batch_stride == 64 * 8 * 128);
  CHECK(paged.params.k_row_stride == 8 * 128);
  CHECK(paged.params.seqlen_k_added == 0);
  CHECK(call.split().attention.spec.text() == "decode.bf16.d128.br16.bc32.w4.s2.paged.split.varlen");
  CHECK(call.split().attention.num_splits == splits);
  {  // With pages and seqused_k, cu_seqlens_k may be left out (FlashAttention-3's
     // and vLLM's calls): the kernels then never read it. Anywhere else it
     // is required, by name.
    Batch no_cu_k = call;
    no_cu_k.varlen.cu_seqlens_k = TensorView{};
    no_cu_k.varlen.seqused_k = &no_cu_k.seqused;
    const ForwardPlan without = no_cu_k.plan();
    CHECK(without.spec.text() == paged.spec.text());
    CHECK(without.params.cu_seqlens_k == nullptr);
    CHECK(without.params.seqused_k == static_cast<const int*>(no_cu_k.seqused.data));
    CHECK(no_cu_k.split().attention.num_splits == splits);
    no_cu_k.varlen.seqused_k = nullptr;
    CHECK_THROWS_WITH_AS(no_cu_k.plan(), doctest::Contains("cu_seqlens_k: required unless both block_table and seqused_k"),
                         Error);
    no_cu_k.varlen.seqused_k = &no_cu_k.seqused;
    no_cu_k.paged = false;
    CHECK_THROWS_WITH_AS(no_cu_k.plan(), doctest::Contains("cu_seqlens_k: required unless both block_table and seqused_k"),
                         Error);
    // A given one is still checked.
    no_cu_k.paged = true;
    no_cu_k.varlen.cu_seqlens_k = TensorView::contiguous(address(0x61000), DType::i32, {4});
    CHECK_THROWS_WITH_AS(no_cu_k.plan(), doctest::Contains("cu_seqlens_k: shape [4] must be [batch + 1] = [5]"), Error);
  }
  // Chunks of 512 queries over the pages: wgmma tiles whose tensor copies
  // read whole pages, every panel of K and V at once (two per 128-key
  // block), through a 5-D map of both (the pages' 8-row groups outermost).
  Batch chunks;
  chunks.paged = true;
  chunks.q = chunks.out = TensorView::contiguous(address(0x10000), DType::bf16, {4 * 512, 32, 128});
  chunks.lse = TensorView::contiguous(address(0x50000), DType::f32, {32, 4 * 512});
  chunks.varlen.max_seqlen_q = 512;
  chunks.options.causal = true;
  const ForwardPlan prefill = chunks.plan();
  CHECK(prefill.spec.text() == "fwd.bf16.d128.br128.bc128.w8.s3.wgmma.causal.kvcache.paged.varlen");
  REQUIRE(prefill.spec.tensor_copies());
  CHECK(prefill.k_map.rank == 5);
  CHECK((prefill.k_map.dims[3] == 2 && prefill.k_map.dims[4] == 512 * 64 / 8 && prefill.k_map.box[4] == 64 / 8));
  CHECK(prefill.v_map.rank == 0);  // one map of K's and V's pages
  // Query heads are packed by the average sequence: a chunk of 512 queries
  // beside 15 decoding steps packs (each step's K/V read once per KV head),
  // four chunks of 512 do not.
  CHECK_FALSE(prefill.spec.pack_gqa);
  Batch mixed = chunks;
  mixed.q = mixed.out = TensorView::contiguous(address(0x10000), DType::bf16, {512 + 15, 32, 128});
  mixed.lse = TensorView::contiguous(address(0x50000), DType::f32, {32, 512 + 15});
  mixed.varlen.cu_seqlens_q = mixed.varlen.cu_seqlens_k = TensorView::contiguous(address(0x60000), DType::i32, {17});
  mixed.seqused = TensorView::contiguous(address(0x62000), DType::i32, {16});
  mixed.table = TensorView::contiguous(address(0x63000), DType::i32, {16, 128});
  const ForwardPlan mixed_plan = mixed.plan();
  CHECK(mixed_plan.spec.text() == "fwd.bf16.d128.br128.bc128.w8.s3.wgmma.causal.packgqa.kvcache.paged.varlen");
  CHECK(mixed_plan.grid == (512 * 4 + 127) / 128 * 8 * 16);
  mixed.paged = false;
  CHECK(mixed.plan().spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.packgqa.varlen");
  // Rejected by name: RoPE over pages, k of the wrong rank, lengths past
  // the table's capacity, head dims that are not a multiple of 8.
  Batch bad;
  bad.paged = true;
  bad.options.rope.style = RopeStyle::rotate_half;
  CHECK_THROWS_WITH_AS(bad.plan(), doctest::Contains("options.rope: not supported over a paged cache"), Error);
  bad.options.rope.style = RopeStyle::none;
  // A hint past the table's capacity (FlashAttention takes over-estimates) plans as the capacity.
  bad.varlen.max_seqlen_k = 128 * 64 + 1;
  CHECK(bad.plan().params.seqlen_k == 8192);
  bad.varlen.max_seqlen_k = -1;
  CHECK_THROWS_WITH_AS(bad.plan(), doctest::Contains("varlen: max_seqlen_k=-1 must be at least 0"), Error);
  bad.varlen.max_seqlen_k = 8192;
  bad.varlen.block_table = &bad.table;
  CHECK_THROWS_WITH_AS(plan_forward_varlen(bad.q, bad.k, bad.k, bad.out, nullptr, bad.varlen, bad.options, hopper,
                                           227 * 1024, 132),
                       doctest::Contains("k: must have 4 dimensions"), Error);
  bad.table = TensorView::contiguous(address(0x63000), DType::i32, {3, 128});
  CHECK_THROWS_WITH_AS(bad.plan(), doctest::Contains("block_table: must be i32 [batch, max_pages] = [4, >= 1]"), Error);
  // Stages without wgmma over pages select the decode kernel, as over a KV
  // cache; rows it does not take are refused under options.tiles.
  Batch forced = chunks;
  forced.options.tiles = {128, 64, 8, 2};
  CHECK_THROWS_WITH_AS(forced.plan(), doctest::Contains("options.tiles = {block_q 128, block_kv 64, warps 8, stages 2}: "
                                                        "spec 'decode."),
                       Error);
  CHECK_THROWS_WITH_AS(forced.plan(), doctest::Contains("br=128 is not one of 16, 32"), Error);
  forced.options.tiles = {32, 32, 4, 2};
  CHECK(forced.plan().spec.text().rfind("decode.", 0) == 0);
  Batch odd;
  odd.paged = true;
  odd.q = odd.out = TensorView::contiguous(address(0x10000), DType::bf16, {4, 32, 60});
  odd.pages = TensorView::contiguous(address(0x100000), DType::bf16, {512, 64, 8, 60});
  CHECK_THROWS_WITH_AS(odd.plan(), doctest::Contains("q: head_dim=60 must be a multiple of 8"), Error);
}

TEST_CASE("empty problems plan to an empty grid") {
  Call call;
  call.q.shape[1] = call.out.shape[1] = call.lse.shape[2] = 0;
  CHECK(call.plan().grid == 0);
  // With a workspace too: nothing splits, so no workspace is needed.
  const SplitForwardPlan split = plan_forward_split(call.q, call.k, call.v, call.out, &call.lse, call.options, nullptr,
                                                    0, false, Arch::parse("sm_90a"), 227 * 1024, 132);
  CHECK(split.attention.grid == 0);
  CHECK(split.attention.workspace_bytes == 0);
  CHECK(split.combine.grid == 0);
}

TEST_CASE("every rule is enforced with a message naming the argument") {
  auto rejects = [](Call call, const char* message) {
    CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains(message), Error);
  };
  { Call c; c.k.shape[2] = c.v.shape[2] = 3; rejects(c, "k: heads_kv=3 must divide heads_q=8"); }
  { Call c; c.q.ndim = 3; rejects(c, "q: must have 4 dimensions"); }
  { Call c; c.v.dtype = DType::f16; rejects(c, "must all match q's"); }
  { Call c; c.q.dtype = c.k.dtype = c.v.dtype = c.out.dtype = DType::f32; rejects(c, "q: dtype f32 is not f16 or bf16"); }
  { Call c; c.k.strides[3] = 2; rejects(c, "k: head_dim stride is 2"); }
  { Call c; c.v.strides[1] = 100; rejects(c, "v: seqlen stride 100 must be a multiple of 8"); }
  { Call c; c.out.data = address(0x40008); rejects(c, "out: data pointer must be 16-byte aligned"); }
  { Call c; c.q.data = nullptr; rejects(c, "q: data is null"); }
  { Call c; c.k.shape[0] = c.v.shape[0] = 3; rejects(c, "k: batch=3 must equal q's batch=2"); }
  { Call c; c.v.shape[1] = 299; rejects(c, "v: shape [2, 299, 2, 128] must equal k's shape [2, 300, 2, 128]"); }
  { Call c; c.out.shape[1] = 99; rejects(c, "out: shape"); }
  { Call c; c.lse.dtype = DType::bf16; rejects(c, "lse: dtype bf16 must be f32"); }
  { Call c; c.lse.shape[2] = 101; rejects(c, "lse: shape [2, 8, 101] must be [batch, heads_q, seqlen_q] = [2, 8, 100]"); }
  { Call c; c.options.softmax_scale = -1.f; rejects(c, "options.softmax_scale=-1 must be positive and finite"); }
  { Call c; c.options.softmax_scale = NAN; rejects(c, "options.softmax_scale"); }
  { Call c; c.q.shape[3] = c.k.shape[3] = c.v.shape[3] = c.out.shape[3] = 0; rejects(c, "q: head_dim=0 must be at least 1"); }
  { Call c; c.options.window_left = -2; rejects(c, "options.window_left=-2 must be -1 (unbounded) or >= 0"); }
  { Call c; c.options.window_right = -5; rejects(c, "options.window_right=-5"); }
  { Call c; c.options.softcap = -1.f; rejects(c, "options.softcap=-1 must be >= 0"); }
  { Call c; TensorView slopes = TensorView::contiguous(address(0x60000), DType::f32, {7});
    c.options.alibi_slopes = &slopes; rejects(c, "alibi_slopes: shape [7] must be [heads_q] = [8] or [batch, heads_q] = [2, 8]"); }
  { Call c; TensorView slopes = TensorView::contiguous(address(0x60000), DType::bf16, {8});
    c.options.alibi_slopes = &slopes; rejects(c, "alibi_slopes: dtype bf16 must be f32"); }
  { Call c; c.options.tiles = {64, 64, 8}; rejects(c, "8 query rows per warp"); }
  { Call c; c.q.shape[0] = -1; rejects(c, "q: batch=-1 is negative"); }
}

TEST_CASE("RoPE fields without a style, local masks past 2^29 keys, paged capacities past 2^31 and views of more than 4 dimensions are refused by name") {
  auto rejects = [](Call call, const char* message) {
    CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains(message), Error);
  };
  // FlashAttention rotates whenever rotary_cos is given: here the style asks, and a table without it is an error.
  const TensorView table = TensorView::contiguous(address(0x60000), DType::f32, {400, 64});
  const TensorView offsets = TensorView::contiguous(address(0x61000), DType::i32, {2});
  const float pair_factors[64] = {};
  { Call c; c.options.rope.cos = c.options.rope.sin = &table;
    rejects(c, "options.rope.cos is given but options.rope.style is none"); }
  { Call c; c.options.rope.k_offsets = &offsets; rejects(c, "options.rope.k_offsets is given but"); }
  { Call c; c.options.rope.longrope_pair_factors = pair_factors; rejects(c, "options.rope.longrope_pair_factors is given"); }
  { Call c; c.options.rope.rotary_dim = 64; rejects(c, "options.rope.rotary_dim is given but"); }
  { Call c; c.options.rope.yarn_factor = 4.f; rejects(c, "options.rope.yarn_factor is given but"); }
  { Call c; c.options.rope.llama3_factor = 8.f; rejects(c, "options.rope.llama3_factor is given but"); }
  { Call c; c.options.rope.theta = 500000.f; CHECK(c.plan().grid > 0); }  // a default-valued field: nothing asked
  { Call c; c.options.rope.style = RopeStyle::rotate_half; c.options.rope.cos = c.options.rope.sin = &table;
    CHECK(c.plan().spec.text().find("rope") != std::string::npos); }
  // A one-sided window over 600M keys: the open side would become a bound at 2^29.
  {
    Call c;
    c.q = c.out = TensorView::contiguous(address(0x10000), DType::bf16, {1, 1, 1, 64});
    c.k = c.v = TensorView::contiguous(address(0x20000), DType::bf16, {1, 600'000'000, 1, 64});
    c.lse = TensorView::contiguous(address(0x50000), DType::f32, {1, 1, 1});
    c.options.window_right = 1;
    rejects(c, "local masks are supported up to 536870911 queries and keys together");
    c.options.window_right = -1;
    c.options.causal = true;  // causal alone takes no bound: planned
    CHECK(c.plan().grid > 0);
  }
  // Views: a dimension count past 4 is named, not read past.
  { Call c; TensorView slopes = TensorView::contiguous(address(0x60000), DType::f32, {8}); slopes.ndim = 7;
    c.options.alibi_slopes = &slopes; rejects(c, "alibi_slopes: shape of ndim=7 (at most 4 dimensions)"); }
  // Messages name each layout's dimensions.
  { Call c; c.k.ndim = 3; rejects(c, "k: must have 4 dimensions [batch, seqlen, heads, head_dim], got 3"); }
  const Arch arch = Arch::parse("sm_90a");
  const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {2, 1, 8, 128});
  KVCacheArgs paged;
  paged.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {64, 1024, 2, 128});
  paged.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {64, 1024, 2, 128});
  paged.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {2});
  const TensorView huge_table = TensorView::contiguous(address(0x60000), DType::i32, {2, int64_t{1} << 22});
  paged.block_table = &huge_table;
  CHECK_THROWS_WITH_AS(plan_kvcache(q, paged, q, nullptr, ForwardOptions{}, nullptr, 0, true, arch, 227 * 1024, 132),
                       doctest::Contains("block_table: page_size × max_pages = 1024 × 4194304 = 4294967296 rows exceeds "
                                         "2^31-1"),
                       Error);
  const TensorView table_of_4 = TensorView::contiguous(address(0x60000), DType::i32, {2, 4});
  paged.block_table = &table_of_4;
  paged.k_cache.ndim = 3;
  CHECK_THROWS_WITH_AS(plan_kvcache(q, paged, q, nullptr, ForwardOptions{}, nullptr, 0, true, arch, 227 * 1024, 132),
                       doctest::Contains("k_cache: must have 4 dimensions [num_pages, page_size, heads, head_dim]"),
                       Error);
  VarlenArgs varlen;
  varlen.cu_seqlens_q = TensorView::contiguous(address(0x60000), DType::i32, {3});
  varlen.cu_seqlens_k = TensorView::contiguous(address(0x61000), DType::i32, {3});
  const TensorView packed_q = TensorView::contiguous(address(0x10000), DType::bf16, {10, 8, 128});
  const TensorView dense_k = TensorView::contiguous(address(0x20000), DType::bf16, {2, 10, 2, 128});
  CHECK_THROWS_WITH_AS(plan_forward_varlen(packed_q, dense_k, dense_k, packed_q, nullptr, varlen, ForwardOptions{}, arch,
                                           227 * 1024, 132),
                       doctest::Contains("k: must have 3 dimensions [total_k, heads, head_dim], got 4"), Error);
}

TEST_CASE("a value head dim of its own (FlashAttention 3's hdim_v): .dvN specs over dense and varlen K/V, never split") {
  const Arch hopper = Arch::parse("sm_90a"), ampere = Arch::parse("sm_80");
  // DeepSeek's prefill: q and k 192 wide, v and out 128, 16 heads.
  auto deepseek = [](int64_t batch, int64_t seqlen, int64_t head_dim, int64_t head_dim_v) {
    Call call;
    call.q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, seqlen, 16, head_dim});
    call.k = TensorView::contiguous(address(0x20000), DType::bf16, {batch, seqlen, 16, head_dim});
    call.v = TensorView::contiguous(address(0x30000), DType::bf16, {batch, seqlen, 16, head_dim_v});
    call.out = TensorView::contiguous(address(0x40000), DType::bf16, {batch, seqlen, 16, head_dim_v});
    call.lse = TensorView::contiguous(address(0x50000), DType::f32, {batch, 16, seqlen});
    call.options.causal = true;
    return call;
  };
  const Call long_call = deepseek(4, 4096, 192, 128);
  const ForwardPlan plan = long_call.plan();
  // 128-key blocks: V's narrower stages leave room for them.
  CHECK(plan.spec.text() == "fwd.bf16.d192.br128.bc128.w8.s2.wgmma.causal.dv128");
  // The default scale is q's head dim's.
  CHECK(plan.params.scale == doctest::Approx(1 / std::sqrt(192.0)));
  // V's tensor map spans V's 128 channels (two panels), K's 192.
  REQUIRE(plan.spec.tensor_copies());
  CHECK(plan.k_map.dims[0] == 192);
  CHECK(plan.v_map.dims[0] == 128);
  CHECK(plan.v_map.base == long_call.v.data);
  CHECK(plan.params.v_row_stride == 16 * 128);
  CHECK(plan.params.o_row_stride == 16 * 128);
  // sm_80: the 4-warp kernels, with the same flag.
  CHECK(long_call.plan(true, 163 * 1024, "sm_80").spec.text().find(".dv128") != std::string::npos);
  CHECK(long_call.plan(true, 163 * 1024, "sm_80").spec.wgmma == false);
  // Head dim 128 with V 64: persistent wgmma tiles (V's narrower stages),
  // and padded q/k head dims keep V's exact one.
  CHECK(deepseek(2, 2048, 128, 64).plan().spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.causal.dv64");
  CHECK(deepseek(2, 256, 160, 128).plan().spec.text().find(".d192.") != std::string::npos);
  CHECK(deepseek(2, 256, 160, 128).plan().spec.text().find(".padded.dv128") != std::string::npos);
  // One query row: the prefill kernels (the decode kernel's V is head_dim
  // wide), and no split even with a workspace; forcing splits is refused.
  Call one = deepseek(1, 1, 192, 128);
  one.k = TensorView::contiguous(address(0x20000), DType::bf16, {1, 32768, 16, 192});
  one.v = TensorView::contiguous(address(0x30000), DType::bf16, {1, 32768, 16, 128});
  one.options.causal = false;
  CHECK(one.plan().spec.family == Family::fwd);
  const SplitForwardPlan unsplit =
      plan_forward_split(one.q, one.k, one.v, one.out, &one.lse, one.options, nullptr, 0, true, hopper, 227 * 1024, 132);
  CHECK(unsplit.attention.spec.head_dim_v == 128);
  CHECK_FALSE(unsplit.attention.spec.split);
  CHECK(unsplit.attention.workspace_bytes == 0);
  one.options.num_splits = 3;
  CHECK_THROWS_WITH_AS(plan_forward_split(one.q, one.k, one.v, one.out, &one.lse, one.options, nullptr, 0, true,
                                          ampere, 163 * 1024, 108),
                       doctest::Contains("V's own head dim, dvN, do not"), Error);
  // The rules, each naming the argument.
  auto rejects = [](const Call& call, const char* message) {
    CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains(message), Error);
  };
  rejects(deepseek(1, 64, 128, 80), "v: head_dim=80 differs from q's head_dim=128: it must then be one of 32, 64, 96");
  rejects(deepseek(1, 64, 128, 192), "below q's");
  rejects(deepseek(1, 64, 100, 64), "q's head_dim=100, which must then be a multiple of 8");
  {
    Call c = deepseek(1, 64, 192, 128);
    c.out.shape[3] = 192;
    rejects(c, "out: shape [1, 64, 16, 192] must be q's shape [1, 64, 16, 192] with v's head_dim 128");
  }
  {
    Call c = deepseek(1, 64, 192, 128);
    c.v.shape[1] = 63;
    rejects(c, "v: shape [1, 63, 16, 128] must equal k's shape [1, 64, 16, 192] but for head_dim");
  }
  // Varlen: packed K/V take it; a paged cache does not (nor does forward_kvcache).
  VarlenArgs varlen;
  varlen.cu_seqlens_q = TensorView::contiguous(address(0x60000), DType::i32, {4});
  varlen.cu_seqlens_k = TensorView::contiguous(address(0x61000), DType::i32, {4});
  varlen.max_seqlen_q = 300;
  varlen.max_seqlen_k = 700;
  const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {900, 16, 192});
  const TensorView k = TensorView::contiguous(address(0x20000), DType::bf16, {900, 16, 192});
  const TensorView v = TensorView::contiguous(address(0x30000), DType::bf16, {900, 16, 128});
  const TensorView out = TensorView::contiguous(address(0x40000), DType::bf16, {900, 16, 128});
  const ForwardPlan packed = plan_forward_varlen(q, k, v, out, nullptr, varlen, ForwardOptions{}, hopper, 227 * 1024, 132);
  CHECK(packed.spec.varlen);
  CHECK(packed.spec.head_dim_v == 128);
  CHECK(packed.spec.block_kv == 96);  // varlen keeps 96-key blocks at 192
  const TensorView pages_k = TensorView::contiguous(address(0x20000), DType::bf16, {64, 64, 16, 192});
  const TensorView pages_v = TensorView::contiguous(address(0x30000), DType::bf16, {64, 64, 16, 128});
  const TensorView table = TensorView::contiguous(address(0x63000), DType::i32, {3, 16});
  varlen.block_table = &table;
  CHECK_THROWS_WITH_AS(
      plan_forward_varlen(q, pages_k, pages_v, out, nullptr, varlen, ForwardOptions{}, hopper, 227 * 1024, 132),
      doctest::Contains("v: shape [64, 64, 16, 128] must equal k's shape [64, 64, 16, 192]"), Error);
  KVCacheArgs args;
  args.k_cache = TensorView::contiguous(address(0x40000), DType::bf16, {2, 1024, 16, 192});
  args.v_cache = TensorView::contiguous(address(0x80000), DType::bf16, {2, 1024, 16, 128});
  args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {2});
  const TensorView decode_q = TensorView::contiguous(address(0x10000), DType::bf16, {2, 1, 16, 192});
  const TensorView decode_out = TensorView::contiguous(address(0x70000), DType::bf16, {2, 1, 16, 128});
  CHECK_THROWS_WITH_AS(plan_kvcache(decode_q, args, decode_out, nullptr, ForwardOptions{}, nullptr, 0, true, hopper,
                                    227 * 1024, 132),
                       doctest::Contains("v: shape [2, 1024, 16, 128] must equal k's shape"), Error);
}

TEST_CASE("head dims map to the next generated one, padded in the kernel") {
  auto spec_for_head_dim = [](int64_t d) {
    Call c;
    for (TensorView* t : {&c.q, &c.k, &c.v, &c.out}) {
      *t = TensorView::contiguous(t->data, DType::bf16, {t->shape[0], t->shape[1], t->shape[2], d});
    }
    const ForwardPlan plan = c.plan();
    CHECK(plan.params.head_dim == d);
    CHECK(plan.params.scale == doctest::Approx(1 / std::sqrt(double(d))));  // the caller's head dim, not the kernel's
    return plan.spec;
  };
  CHECK(spec_for_head_dim(32).text() == "fwd.bf16.d32.br128.bc64.w4");
  CHECK(spec_for_head_dim(40).text() == "fwd.bf16.d64.br128.bc128.w4.padded");
  CHECK(spec_for_head_dim(96).text() == "fwd.bf16.d96.br128.bc64.w4");
  CHECK(spec_for_head_dim(104).head_dim == 128);
  CHECK(spec_for_head_dim(160).text() == "fwd.bf16.d192.br128.bc64.w8.padded");
  CHECK(spec_for_head_dim(256).text() == "fwd.bf16.d256.br128.bc128.w8");
  Call c;
  for (TensorView* t : {&c.q, &c.k, &c.v, &c.out}) {
    *t = TensorView::contiguous(t->data, DType::bf16, {t->shape[0], t->shape[1], t->shape[2], 264});
  }
  CHECK_THROWS_WITH_AS(c.plan(), doctest::Contains("head_dim=264 is above the largest supported, 256"), Error);
}

TEST_CASE("head dims that are not a multiple of 8: element-wise rows in 4-warp kernels, staged rows in wgmma ones") {
  // Contiguous rows of 59 or 111 elements start on 2-byte boundaries.
  // Head dim d; seqlen > 0 sets the query and key lengths.
  auto call_for = [](int64_t d, int64_t seqlen = 0) {
    Call c;
    if (seqlen > 0) c.lse.shape[2] = seqlen;
    for (TensorView* t : {&c.q, &c.k, &c.v, &c.out}) {
      *t = TensorView::contiguous(t->data, DType::bf16, {t->shape[0], seqlen > 0 ? seqlen : t->shape[1], t->shape[2], d});
    }
    return c;
  };
  for (const char* arch : {"sm_90a", "sm_80"}) {
    Call c = call_for(59);
    c.options.causal = true;
    ForwardPlan plan = c.plan(true, 227 * 1024, arch);
    CHECK(plan.spec.text() == "fwd.bf16.d64.br64.bc64.w4.causal.unaligned_d59");
    CHECK(plan.params.head_dim == 59);
    CHECK(plan.params.scale == doctest::Approx(1 / std::sqrt(59.0)));
    CHECK(plan.params.q_row_stride == 8 * 59);
  }
  // Long enough for the wgmma tiles: on sm_90a the 128-row ones of two
  // warpgroups, whose producer stages and shifts the rows (64-key blocks
  // above head dim 64, for shared memory); on sm_80 still the 4-warp ones.
  const Call longer = call_for(111, 4096);
  ForwardPlan plan = longer.plan();
  CHECK(plan.spec.text() == "fwd.bf16.d128.br128.bc64.w8.s2.wgmma.unaligned_d111");
  CHECK(plan.spec.smem_bytes() <= 227 * 1024);
  CHECK_FALSE(plan.spec.padded);
  CHECK(longer.plan(true, 163 * 1024, "sm_80").spec.text() == "fwd.bf16.d128.br128.bc64.w4.unaligned_d111");
  CHECK(call_for(59, 4096).plan().spec.text() == "fwd.bf16.d64.br128.bc128.w8.s2.wgmma.unaligned_d59");
  // Any element stride and 2-byte alignment: a packed qkv view [B, S, 3, H, 59].
  Call packed = call_for(59);
  packed.k.shape[2] = packed.v.shape[2] = 8;
  packed.q.strides[1] = packed.k.strides[1] = packed.v.strides[1] = 3 * 8 * 59;
  packed.q.data = address(0x10002);
  CHECK(packed.plan().spec.unaligned_dim == 59);
  packed.k.data = address(0x20001);
  CHECK_THROWS_WITH_AS(packed.plan(), doctest::Contains("k: data pointer must be 2-byte aligned"), Error);
  // Rules: producer stages only with wgmma tiles of an ordinary grid; the
  // rotary dim fits the caller's head dim.
  Call staged = call_for(59);
  staged.options.tiles.stages = 2;
  CHECK_THROWS_WITH_AS(staged.plan(), doctest::Contains("options.tiles.stages=2: head_dim=59 (not a multiple of 8)"), Error);
  staged.options.tiles = {128, 64, 8, 3, true};
  CHECK(staged.plan().spec.text() == "fwd.bf16.d64.br128.bc64.w8.s3.wgmma.unaligned_d59");
  staged.options.tiles.persistent = true;
  CHECK_THROWS_WITH_AS(staged.plan(), doctest::Contains("ordinary-grid wgmma tiles"), Error);
  Call rope = call_for(59);
  rope.options.rope.style = RopeStyle::rotate_half;
  CHECK_THROWS_WITH_AS(rope.plan(), doctest::Contains("options.rope.rotary_dim=0 (0 = head_dim = 59)"), Error);
  rope.options.rope.rotary_dim = 48;
  const KernelSpec rope_spec = rope.plan().spec;
  CHECK(rope_spec.text().find(".w4.rope_half_r48.unaligned_d59") != std::string::npos);
  CHECK(rope_spec.stages == 0);
  // The spec text round-trips and its rules hold without a planner.
  const KernelSpec parsed = KernelSpec::parse("fwd.f16.d128.br128.bc64.w4.local.varlen.unaligned_d111");
  CHECK(parsed.unaligned_dim == 111);
  CHECK(parsed.packed() != KernelSpec::parse("fwd.f16.d128.br128.bc64.w4.local.varlen").packed());
  CHECK(parsed.packed() != KernelSpec::parse("fwd.f16.d128.br128.bc64.w4.local.varlen.unaligned_d109").packed());
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br128.bc64.w4.unaligned_d56"),
                       doctest::Contains("unaligned_d56 must be below head_dim=64 and not a multiple of 8"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br128.bc64.w4.unaligned_d67"),
                       doctest::Contains("unaligned_d67 must be below head_dim=64"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br128.bc64.w8.s2.unaligned_d59"),
                       doctest::Contains("unaligned_d59 with s2 needs wgmma tiles of w=8"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br192.bc64.w12.s2.wgmma.unaligned_d59"),
                       doctest::Contains("needs wgmma tiles of w=8 (not w=12)"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br128.bc64.w8.s2.wgmma.persistent.unaligned_d59"),
                       doctest::Contains("does not combine with kvcache, split, padded or persistent"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br64.bc64.w4.packgqa.kvcache.unaligned_d59"),
                       doctest::Contains("does not combine with kvcache"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br64.bc64.w4.rope_half_r64.unaligned_d59"),
                       doctest::Contains("rotary_dim=64 is above the caller's head dim 59"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d64.br16.bc32.w4.s4.unaligned_d59"),
                       doctest::Contains("unaligned_dN"), Error);
  // KV-cache calls keep 16-byte rows (FlashAttention's with_kvcache pads a copy of the cache instead).
  const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {1, 1, 8, 59});
  KVCacheArgs args;
  args.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {1, 256, 8, 59});
  args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {1, 256, 8, 59});
  args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {1});
  CHECK_THROWS_WITH_AS(plan_kvcache(q, args, q, nullptr, ForwardOptions{}, nullptr, 0, true, Arch::parse("sm_90a"),
                                    227 * 1024, 132),
                       doctest::Contains("q: head_dim=59 must be a multiple of 8 for KV-cache calls"), Error);
}

TEST_CASE("windows, softcap and ALiBi select kernel features and runtime bounds") {
  Call c;
  c.options.causal = true;
  c.options.window_left = 50;
  ForwardPlan plan = c.plan();
  CHECK(plan.spec.local);
  CHECK_FALSE(plan.spec.causal);
  CHECK(plan.params.window_left == 50);
  CHECK(plan.params.window_right == 0);

  Call right_only;
  right_only.options.window_right = 0;  // exactly causal
  CHECK(right_only.plan().spec.causal);

  Call unbounded;
  unbounded.options.window_right = 7;  // left unbounded: bounded past the sequence
  plan = unbounded.plan();
  CHECK(plan.spec.local);
  CHECK(plan.params.window_left >= 100 + 300);
  CHECK(plan.params.window_right == 7);

  // An unbounded right side must reach the last key from the first row even
  // when seqlen_q > seqlen_k (the diagonal starts at key sk - sq < 0).
  Call left_only;
  left_only.options.window_left = 40;
  plan = left_only.plan();
  CHECK(0 + (300 - 100) + plan.params.window_right >= 300 - 1);
  Call tall;  // seqlen_q 500 > seqlen_k 300
  for (TensorView* t : {&tall.q, &tall.out}) *t = TensorView::contiguous(t->data, DType::bf16, {2, 500, 8, 128});
  tall.lse = TensorView::contiguous(tall.lse.data, DType::f32, {2, 8, 500});
  tall.options.window_left = 40;
  plan = tall.plan();
  CHECK(0 + (300 - 500) + plan.params.window_right >= 300 - 1);

  Call softcap;
  softcap.options.softcap = 30.f;
  plan = softcap.plan();
  CHECK(plan.spec.text() == "fwd.bf16.d128.br128.bc64.w4.softcap");
  CHECK(plan.params.scale_log2 == 1.f);  // scores are rewritten to log2 units in the kernel
  CHECK(plan.params.lse_scale == doctest::Approx(std::log(2.0)));
  CHECK(plan.params.softcap_scale == doctest::Approx(plan.params.scale / 30.f));

  Call alibi;
  TensorView slopes = TensorView::contiguous(address(0x60000), DType::f32, {2, 8});
  alibi.options.alibi_slopes = &slopes;
  plan = alibi.plan();
  CHECK(plan.spec.alibi);
  CHECK(plan.params.alibi_slopes == slopes.data);
  CHECK(plan.params.alibi_batch_stride == 8);
  TensorView per_head = TensorView::contiguous(address(0x60000), DType::f32, {8});
  alibi.options.alibi_slopes = &per_head;
  CHECK(alibi.plan().params.alibi_batch_stride == 0);
}

TEST_CASE("learnable_sink: compiled in as .sink where final rows are written, left to the combine where partials split") {
  // Dense, every mask kind: the flag and the pointer; the spec is the one
  // without sinks plus .sink.
  const TensorView sinks = TensorView::contiguous(address(0x70000), DType::f32, {8});
  for (int mask = 0; mask < 3; ++mask) {
    Call c;
    c.options.causal = mask == 1;
    c.options.window_left = mask == 2 ? 50 : -1;
    const ForwardPlan plain = c.plan();
    c.options.learnable_sink = &sinks;
    const ForwardPlan plan = c.plan();
    CAPTURE(plan.spec.text());
    CHECK(plan.spec.sink);
    CHECK(plan.spec.text().find(".sink") != std::string::npos);
    CHECK(plan.params.learnable_sink == sinks.data);
    KernelSpec without = plan.spec;
    without.sink = false;
    CHECK(without == plain.spec);
    CHECK(plain.params.learnable_sink == nullptr);
  }
  // Bad tensors are rejected naming the argument and the rule.
  Call bad;
  auto rejects = [&](const TensorView& tensor, const char* why) {
    bad.options.learnable_sink = &tensor;
    CHECK_THROWS_WITH_AS(bad.plan(), doctest::Contains(why), Error);
  };
  rejects(TensorView::contiguous(address(0x70000), DType::bf16, {8}), "learnable_sink: dtype bf16 must be f32");
  rejects(TensorView::contiguous(address(0x70000), DType::f32, {2}), "learnable_sink: shape [2] must be [heads_q] = [8]");
  rejects(TensorView::contiguous(address(0x70000), DType::f32, {2, 8}), "must be [heads_q] = [8]");
  TensorView strided = TensorView::contiguous(address(0x70000), DType::f32, {8});
  strided.strides[0] = 2;
  rejects(strided, "learnable_sink: stride 2 must be 1");
  rejects(TensorView::contiguous(nullptr, DType::f32, {8}), "learnable_sink: data is null");
  rejects(TensorView::contiguous(address(0x70002), DType::f32, {8}), "learnable_sink: data pointer must be 4-byte aligned");

  // Split calls: the partials do not count the sink, their combine does.
  const Arch hopper = Arch::parse("sm_90a");
  Call decode;
  decode.q = decode.out = TensorView::contiguous(address(0x10000), DType::bf16, {1, 1, 32, 128});
  decode.k = decode.v = TensorView::contiguous(address(0x20000), DType::bf16, {1, 32768, 8, 128});
  decode.lse = TensorView::contiguous(address(0x50000), DType::f32, {1, 32, 1});
  const TensorView sinks32 = TensorView::contiguous(address(0x70000), DType::f32, {32});
  decode.options.learnable_sink = &sinks32;
  const SplitForwardPlan split = plan_forward_split(decode.q, decode.k, decode.v, decode.out, &decode.lse,
                                                    decode.options, address(0x100000), size_t{1} << 30, false, hopper,
                                                    227 * 1024, 132);
  CHECK(split.attention.spec.split);
  CHECK_FALSE(split.attention.spec.sink);
  CHECK(split.combine.spec.text() == "combine.f32.bf16.sink");
  CHECK(split.combine.params.sinks == sinks32.data);
  // Dense calls split into the wgmma tiles likewise (RoPE keeps them off the
  // decode kernel).
  decode.options.rope.style = RopeStyle::rotate_half;
  const SplitForwardPlan rotated = plan_forward_split(decode.q, decode.k, decode.v, decode.out, &decode.lse,
                                                      decode.options, address(0x100000), size_t{1} << 30, false,
                                                      hopper, 227 * 1024, 132);
  CHECK(rotated.attention.spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.rope_half_r128.packgqa.split");
  CHECK(rotated.combine.spec.sink);

  // KV cache: the decode kernel unsplit keeps the flag; split, the
  // combine has it; dynamic splits keep it in both (tiles of one piece
  // write their own rows).
  KVCacheArgs args;
  const TensorView q16 = TensorView::contiguous(address(0x10000), DType::bf16, {16, 1, 32, 128});
  args.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {16, 32768, 8, 128});
  args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {16, 32768, 8, 128});
  args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {16});
  ForwardOptions options;
  options.learnable_sink = &sinks32;
  for (int splits : {1, 3}) {
    for (bool dynamic_splits : {false, true}) {
      if (splits == 1 && dynamic_splits) continue;
      CAPTURE(splits);
      CAPTURE(dynamic_splits);
      KVCacheArgs call = args;
      call.num_splits = splits;
      call.dynamic_splits = dynamic_splits;
      const KVCachePlan plan = plan_kvcache(q16, call, q16, nullptr, options, address(0x100000), size_t{1} << 30,
                                            false, hopper, 227 * 1024, 132);
      CHECK(plan.attention.spec.family == Family::decode);
      CHECK(plan.attention.spec.split == (splits > 1));
      CHECK(plan.attention.spec.sink == (splits == 1 || dynamic_splits));
      CHECK(plan.attention.params.learnable_sink == sinks32.data);
      if (splits > 1) {
        CHECK(plan.combine.spec.sink);
        CHECK(plan.combine.params.sinks == sinks32.data);
      }
    }
  }
  // Varlen.
  const TensorView packed = TensorView::contiguous(address(0x10000), DType::bf16, {4096, 32, 128});
  VarlenArgs varlen;
  varlen.cu_seqlens_q = varlen.cu_seqlens_k = TensorView::contiguous(address(0x60000), DType::i32, {5});
  varlen.max_seqlen_q = varlen.max_seqlen_k = 2048;
  options.causal = true;
  const ForwardPlan varlen_plan =
      plan_forward_varlen(packed, packed, packed, packed, nullptr, varlen, options, hopper, 227 * 1024, 132);
  CHECK(varlen_plan.spec.varlen);
  CHECK(varlen_plan.spec.sink);
  // merge_states has no sinks.
  CHECK_FALSE(plan_merge_states(TensorView::contiguous(address(0x10000), DType::f32, {3, 10, 4, 64}),
                                TensorView::contiguous(address(0x20000), DType::f32, {3, 10, 4}),
                                TensorView::contiguous(address(0x30000), DType::bf16, {10, 4, 64}), nullptr)
                   .spec.sink);
}

TEST_CASE("short sliding windows (at most 256 keys) on sm_90a take 64-row tiles of 64-key blocks on 4 warps") {
  // gpt-oss's sliding layers: 64 query heads over 8, head dim 64, a 128-key
  // causal window. Prefill and speculative tokens over a long cache, where
  // each tile sees a few key blocks however long the call.
  const Arch hopper = Arch::parse("sm_90a");
  Call c;
  c.q = c.out = TensorView::contiguous(address(0x10000), DType::bf16, {1, 8192, 64, 64});
  c.k = c.v = TensorView::contiguous(address(0x20000), DType::bf16, {1, 8192, 8, 64});
  c.lse = TensorView::contiguous(address(0x50000), DType::f32, {1, 64, 8192});
  c.options.causal = true;
  CHECK(c.plan().spec.wgmma);  // full causal layers
  c.options.window_left = 127;
  ForwardPlan plan = c.plan();
  CHECK(plan.spec.text() == "fwd.bf16.d64.br64.bc64.w4.local");
  c.options.window_left = 255;  // the span is 256 keys: still short
  CHECK(c.plan().spec.text() == "fwd.bf16.d64.br64.bc64.w4.local");
  c.options.window_left = 256;
  CHECK(c.plan().spec.wgmma);
  // Chunks of up to 256 keys are short windows too; with RoPE the planner
  // keeps its RoPE kernels; sm_80 keeps its own tiles; forced tiles stay.
  c.options.window_left = -1;
  c.options.attention_chunk = 200;
  CHECK(c.plan().spec.text() == "fwd.bf16.d64.br64.bc64.w4.local.chunk");
  c.options.attention_chunk = 0;
  c.options.window_left = 127;
  c.options.rope.style = RopeStyle::rotate_half;
  CHECK(c.plan().spec.block_kv != 64);
  c.options.rope.style = RopeStyle::none;
  CHECK(c.plan(true, 163 * 1024, "sm_80").spec.text() != "fwd.bf16.d64.br64.bc64.w4.local");
  c.options.tiles = {128, 128, 8, 2, true};
  CHECK(c.plan().spec.wgmma);
  c.options.tiles = {};
  // Speculative tokens over a KV cache: 4-warp tiles of 64-key blocks, split
  // where they are few; single tokens keep the decode kernel.
  KVCacheArgs args;
  args.k_cache = args.v_cache = TensorView::contiguous(address(0x30000), DType::bf16, {8, 32768, 8, 64});
  args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {8});
  for (int64_t tokens : {1, 16, 64}) {
    const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {8, tokens, 64, 64});
    const KVCachePlan cache = plan_kvcache(q, args, q, nullptr, c.options, nullptr, 0, true, hopper, 227 * 1024, 132);
    CAPTURE(tokens);
    if (tokens == 1) {
      CHECK(cache.attention.spec.family == Family::decode);
    } else {
      CHECK(cache.attention.spec.block_q == 64);
      CHECK(cache.attention.spec.block_kv == 64);
      CHECK(cache.attention.spec.warps == 4);
      CHECK_FALSE(cache.attention.spec.wgmma);
    }
  }
}

TEST_CASE("attention_chunk: a local mask compiled in as .chunk, in every call kind, with the chunk as a runtime bound") {
  // Dense: causal becomes a window of right bound 0 cut to chunks; the
  // kernel without chunks is the same spec less .chunk.
  Call c;
  c.options.causal = true;
  const ForwardPlan causal = c.plan();
  c.options.attention_chunk = 64;
  ForwardPlan plan = c.plan();
  CHECK(plan.spec.chunk);
  CHECK(plan.spec.local);
  CHECK_FALSE(plan.spec.causal);
  CHECK(plan.spec.text().find(".local.chunk") != std::string::npos);
  CHECK(plan.params.attention_chunk == 64);
  CHECK(plan.params.window_right == 0);
  CHECK(plan.params.window_left >= 100 + 300);  // unbounded: only the chunk bounds the left
  KernelSpec unchunked = plan.spec;
  unchunked.chunk = false;
  unchunked.local = false;
  unchunked.causal = true;
  CHECK(unchunked == causal.spec);
  // With a window and without causal: both bounds stay, the chunk cuts them.
  c.options.causal = false;
  c.options.window_left = 10, c.options.window_right = 20;
  plan = c.plan();
  CHECK(plan.spec.chunk);
  CHECK(plan.params.window_left == 10);
  CHECK(plan.params.window_right == 20);
  // Without a window or causal the chunk alone is the mask.
  c.options.window_left = c.options.window_right = -1;
  CHECK(c.plan().spec.text().find(".local.chunk") != std::string::npos);
  // The kernels divide by the chunk with a magic number (FwdParams): exact
  // for every position below 2^31, at chunks of 1, powers of two and others.
  for (int chunk : {1, 2, 3, 7, 48, 100, 333, 1024, 8192, 10000, INT_MAX / 4}) {
    c.options.attention_chunk = chunk;
    const FwdParams p = c.plan().params;
    CAPTURE(chunk);
    for (uint32_t n : {0u, 1u, 2u, 99u, 100u, 101u, 8191u, 8192u, 123456789u, (1u << 30) + 7u, (1u << 31) - 1u}) {
      const uint32_t high = static_cast<uint32_t>((uint64_t{n} * p.attention_chunk_magic) >> 32);
      const uint32_t quotient = (high + n) >> p.attention_chunk_shift;
      CHECK(quotient == n / static_cast<uint32_t>(chunk));
    }
  }
  // Chunks far past every position are capped to an int-safe bound.
  c.options.attention_chunk = INT_MAX;
  CHECK(c.plan().params.attention_chunk == INT_MAX / 4);
  c.options.attention_chunk = -1;
  CHECK_THROWS_WITH_AS(c.plan(), doctest::Contains("options.attention_chunk=-1 must be >= 0 (0 = off)"), Error);
  c.options.attention_chunk = 0;
  CHECK_FALSE(c.plan().spec.local);
  // Causal chunks are causal attention over sequences of a chunk's keys: at
  // head dim 128 they take the causal persistent rule on the chunk (up to
  // 4096 keys), not on the whole sequence.
  Call scout;  // Llama 4 Scout: 40 query heads over 8, head dim 128
  scout.q = scout.out = TensorView::contiguous(address(0x10000), DType::bf16, {1, 16384, 40, 128});
  scout.k = scout.v = TensorView::contiguous(address(0x20000), DType::bf16, {1, 16384, 8, 128});
  scout.lse = TensorView::contiguous(address(0x50000), DType::f32, {1, 40, 16384});
  scout.options.causal = true;
  for (int chunk : {1024, 2048, 4096, 8192}) {
    scout.options.attention_chunk = chunk;
    CAPTURE(chunk);
    CHECK(scout.plan().spec.persistent == (chunk <= 4096));
    CHECK(scout.plan().spec.block_kv == 128);
  }
  scout.options.causal = false;  // chunks seen whole by every query: not causal attention
  scout.options.attention_chunk = 2048;
  CHECK_FALSE(scout.plan().spec.persistent);

  // KV cache: the decode kernel, a paged one, and the wgmma tiles of a chunk of queries.
  TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {4, 1, 32, 128});
  KVCacheArgs args;
  args.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {4, 32768, 8, 128});
  args.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {4, 32768, 8, 128});
  args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {4});
  ForwardOptions options;
  options.causal = true;
  options.attention_chunk = 8192;
  const Arch hopper = Arch::parse("sm_90a");
  KVCachePlan decode = plan_kvcache(q, args, q, nullptr, options, nullptr, 0, true, hopper, 227 * 1024, 132);
  CHECK(decode.attention.spec.family == Family::decode);
  CHECK(decode.attention.spec.chunk);
  CHECK(decode.attention.params.attention_chunk == 8192);
  // Splits are planned on the keys a query sees (one chunk), not on the
  // cache: one sequence's 8 tiles split into pieces that cut 8192 keys, as
  // many as a plain call of 8192 keys takes. Windows likewise.
  // One sequence of `tokens` queries over a cache of `capacity` keys, and
  // its split pieces.
  auto one_sequence = [&](int64_t tokens, int64_t capacity, const ForwardOptions& o) {
    KVCacheArgs a = args;
    a.k_cache.shape[0] = a.v_cache.shape[0] = 1;
    a.k_cache.shape[1] = a.v_cache.shape[1] = capacity;
    a.cache_seqlens.shape[0] = 1;
    TensorView one = q;
    one.shape[0] = 1;
    one.shape[1] = tokens;
    return plan_kvcache(one, a, one, nullptr, o, nullptr, 0, true, hopper, 227 * 1024, 132).attention;
  };
  auto pieces = [](const ForwardPlan& plan) { return std::pair{plan.params.num_splits, plan.params.blocks_per_split}; };
  auto decode_pieces = [&](int64_t capacity, const ForwardOptions& o) { return pieces(one_sequence(1, capacity, o)); };
  ForwardOptions causal_only;
  causal_only.causal = true;
  const auto chunked = decode_pieces(32768, options);
  CHECK(chunked == decode_pieces(8192, causal_only));
  CHECK(chunked.first > 4);
  ForwardOptions window = causal_only;
  window.window_left = 4095;
  CHECK(decode_pieces(32768, window) == decode_pieces(4096, causal_only));
  // The 4-warp and wgmma split kernels cut each tile's own visible blocks
  // too: 16 speculative tokens (64 packed rows: wgmma tiles) with a 128-key
  // window over 32k cached keys see two blocks, and split no more than a
  // cache of those keys would; a 4096-key window splits as 4096 keys.
  auto prefill_splits = [&](int64_t capacity, const ForwardOptions& o) {
    const ForwardPlan plan = one_sequence(16, capacity, o);
    CHECK(plan.spec.wgmma);
    return pieces(plan);
  };
  ForwardOptions sliding = causal_only;
  sliding.window_left = 127;
  CHECK(prefill_splits(32768, sliding).first <= 2);
  CHECK(prefill_splits(32768, causal_only).first > 8);
  sliding.window_left = 4095;
  CHECK(prefill_splits(32768, sliding) == prefill_splits(4096 + 16, causal_only));
  TensorView q_chunk = q;
  q_chunk.shape[1] = 64;
  const KVCachePlan chunked_prefill = plan_kvcache(q_chunk, args, q_chunk, nullptr, options, nullptr, 0, true, hopper,
                                                   227 * 1024, 132);
  CHECK(chunked_prefill.attention.spec.wgmma);
  CHECK(chunked_prefill.attention.spec.text().find(".local.chunk") != std::string::npos);
  // Varlen.
  const TensorView packed = TensorView::contiguous(address(0x10000), DType::bf16, {4096, 16, 128});
  VarlenArgs varlen;
  varlen.cu_seqlens_q = varlen.cu_seqlens_k = TensorView::contiguous(address(0x60000), DType::i32, {5});
  varlen.max_seqlen_q = varlen.max_seqlen_k = 2048;
  const ForwardPlan varlen_plan =
      plan_forward_varlen(packed, packed, packed, packed, nullptr, varlen, options, hopper, 227 * 1024, 132);
  CHECK(varlen_plan.spec.varlen);
  CHECK(varlen_plan.spec.chunk);
  CHECK(varlen_plan.params.attention_chunk == 8192);
}

TEST_CASE("tiles that exceed the device's shared memory are refused") {
  Call call;
  call.options.tiles = {128, 128, 8};
  CHECK_THROWS_WITH_AS(call.plan(true, 64 * 1024), doctest::Contains("shared memory"), Error);
  CHECK_NOTHROW(call.plan(true, 227 * 1024));
}

TEST_CASE("varlen causal calls at head dim 128 go persistent up to 2048 keys with at most 128 sequences, else within 12 waves") {
  // Up to 128 sequences the persistent kernel walks the sequences' own
  // tiles head by head, as dense calls do (FwdConfig::kSequenceOrder), and
  // takes their rule up to 2048 keys; beyond, tiles go heaviest first across every head,
  // whose full grids measured slower than ordinary ones.
  const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {200 * 1024, 16, 128});
  const TensorView kv = TensorView::contiguous(address(0x20000), DType::bf16, {200 * 1024, 16, 128});
  VarlenArgs varlen;
  varlen.max_seqlen_q = varlen.max_seqlen_k = 1024;
  ForwardOptions options;
  options.causal = true;
  const Arch hopper = Arch::parse("sm_90a");
  auto plan_for = [&](int64_t sequences) {
    varlen.cu_seqlens_q = varlen.cu_seqlens_k =
        TensorView::contiguous(address(0x60000), DType::i32, {sequences + 1});
    return plan_forward_varlen(q, kv, kv, q, nullptr, varlen, options, hopper, 227 * 1024, 132);
  };
  const std::string ordered = "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.causal.varlen";
  CHECK(plan_for(16).spec.text() == ordered);   // 2048 tiles over the longest sequence
  CHECK(plan_for(128).spec.text() == ordered);  // 16384
  CHECK(plan_for(128).spec.sequence_order_bytes() == (4 * KernelSpec::kOrderedSequences + 4) * 4);
  CHECK(plan_for(129).spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.varlen");
  CHECK(plan_for(200).spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.varlen");
  varlen.max_seqlen_q = varlen.max_seqlen_k = 512;
  CHECK(plan_for(200).spec.persistent);  // up to 512 keys, however many tiles
  varlen.max_seqlen_q = varlen.max_seqlen_k = 8192;
  CHECK_FALSE(plan_for(16).spec.persistent);
  // Over 2048 keys the old rule again (32 query heads over 8).
  const TensorView gqa_q = TensorView::contiguous(address(0x10000), DType::bf16, {8 * 4096, 32, 128});
  const TensorView gqa_kv = TensorView::contiguous(address(0x20000), DType::bf16, {8 * 4096, 8, 128});
  auto gqa_plan = [&](int64_t sequences, int max_seqlen) {
    varlen.cu_seqlens_q = varlen.cu_seqlens_k =
        TensorView::contiguous(address(0x60000), DType::i32, {sequences + 1});
    varlen.max_seqlen_q = varlen.max_seqlen_k = max_seqlen;
    return plan_forward_varlen(gqa_q, gqa_kv, gqa_kv, gqa_q, nullptr, varlen, options, hopper, 227 * 1024, 132).spec;
  };
  CHECK(gqa_plan(8, 2048).persistent);
  CHECK_FALSE(gqa_plan(4, 4096).persistent);  // 4096 tiles
  const TensorView dense_q = TensorView::contiguous(address(0x10000), DType::bf16, {16, 1024, 16, 128});
  CHECK(plan_forward(dense_q, dense_q, dense_q, dense_q, nullptr, options, hopper, 227 * 1024, 132).spec.text() ==
        "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.causal");
}

TEST_CASE("varlen: packed tensors plan to a varlen spec, a per-sequence grid and packed strides") {
  // 3 sequences in q [500, 8, 128] taken from a packed qkv buffer [500, 8 + 2 + 2, 128]
  // (row stride 12·128), k/v [900, 2, 128], out heads-major [8, 500, 128], lse
  // [8, 500] with a padded head stride.
  struct VarlenCall {
    TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {500, 8, 128});
    TensorView k = TensorView::contiguous(address(0x20000), DType::bf16, {900, 2, 128});
    TensorView v = TensorView::contiguous(address(0x30000), DType::bf16, {900, 2, 128});
    TensorView out = TensorView::contiguous(address(0x40000), DType::bf16, {500, 8, 128});
    TensorView lse = TensorView::contiguous(address(0x50000), DType::f32, {8, 500});
    TensorView seqused = TensorView::contiguous(address(0x62000), DType::i32, {3});
    VarlenArgs varlen;
    ForwardOptions options;
    bool with_lse = true, with_seqused = true;
    VarlenCall() {
      q.strides[0] = 12 * 128;
      out.strides[0] = 128;
      out.strides[1] = 500 * 128;
      lse.strides[0] = 512;
      varlen.cu_seqlens_q = TensorView::contiguous(address(0x60000), DType::i32, {4});
      varlen.cu_seqlens_k = TensorView::contiguous(address(0x61000), DType::i32, {4});
      varlen.max_seqlen_q = 300;
      varlen.max_seqlen_k = 700;
    }
    ForwardPlan plan() {
      varlen.seqused_k = with_seqused ? &seqused : nullptr;
      return plan_forward_varlen(q, k, v, out, with_lse ? &lse : nullptr, varlen, options, Arch::parse("sm_90a"),
                                 227 * 1024, 132);
    }
  };

  VarlenCall call;
  call.options.causal = true;
  const ForwardPlan plan = call.plan();
  CHECK(plan.spec.varlen);
  CHECK(plan.spec.text().find(".varlen") != std::string::npos);
  CHECK(plan.spec.causal);
  const unsigned blocks = (300 + plan.spec.block_q - 1) / plan.spec.block_q;
  CHECK(plan.grid == blocks * 8 * 3);  // ceil(max_seqlen_q / block_q) × heads_q × batch
  const FwdParams& p = plan.params;
  CHECK(p.batch == 3);
  CHECK(p.heads_q == 8);
  CHECK(p.heads_kv == 2);
  CHECK(p.heads_per_kv == 4);
  CHECK(p.head_dim == 128);
  CHECK(p.q == call.q.data);
  CHECK(p.k == call.k.data);
  CHECK(p.v == call.v.data);
  CHECK(p.o == call.out.data);
  CHECK(p.lse == call.lse.data);
  CHECK(p.q_row_stride == 12 * 128);  // dims 0 (rows) and 1 (heads) of the packed tensors
  CHECK(p.q_head_stride == 128);
  CHECK(p.k_row_stride == 2 * 128);
  CHECK(p.k_head_stride == 128);
  CHECK(p.v_row_stride == 2 * 128);
  CHECK(p.v_head_stride == 128);
  CHECK(p.o_row_stride == 128);
  CHECK(p.o_head_stride == 500 * 128);
  CHECK(p.lse_head_stride == 512);  // lse [heads_q, total_q]: dims 0 and 1
  CHECK(p.lse_row_stride == 1);
  CHECK(p.cu_seqlens_q == static_cast<const int*>(call.varlen.cu_seqlens_q.data));
  CHECK(p.cu_seqlens_k == static_cast<const int*>(call.varlen.cu_seqlens_k.data));
  CHECK(p.seqused_k == static_cast<const int*>(call.seqused.data));
  CHECK(p.scale == doctest::Approx(1 / std::sqrt(128.0)));

  {  // wgmma varlen kernels read K and V by tensor copies: 3-D maps over the packed rows
    VarlenCall wide;
    wide.options.tiles = {128, 128, 8, 2, true};
    const ForwardPlan mapped = wide.plan();
    REQUIRE(mapped.spec.wgmma);
    CHECK(mapped.spec.varlen);
    CHECK(mapped.spec.tensor_copies());
    for (const TileMapLayout* map : {&mapped.k_map, &mapped.v_map}) {
      CHECK(map->rank == 3);
      CHECK((map->dims[0] == 128 && map->dims[1] == 900 && map->dims[2] == 2));
      CHECK((map->strides_bytes[0] == 2 * 128 * 2 && map->strides_bytes[1] == 128 * 2));
      CHECK((map->box[0] == 64 && map->box[1] == 128 && map->box[2] == 1));
    }
    CHECK(mapped.k_map.base == wide.k.data);
    CHECK(mapped.v_map.base == wide.v.data);
    // K rows broadcast (stride 0): no map, so forced wgmma tiles are refused naming the tensor.
    wide.k.strides[0] = 0;
    CHECK_THROWS_WITH_AS(wide.plan(), doctest::Contains("k: strides (batch, row, head) = (0, 0, 128)"), Error);
  }
  {  // without seqused_k and lse
    VarlenCall bare;
    bare.with_seqused = bare.with_lse = false;
    const ForwardPlan without = bare.plan();
    CHECK(without.params.seqused_k == nullptr);
    CHECK(without.params.lse == nullptr);
    CHECK(without.params.cu_seqlens_q != nullptr);
  }
  {  // a dense call carries no varlen pointers and no .varlen flag
    Call dense;
    const ForwardPlan plan_dense = dense.plan();
    CHECK_FALSE(plan_dense.spec.varlen);
    CHECK(plan_dense.spec.text().find("varlen") == std::string::npos);
    CHECK(plan_dense.params.cu_seqlens_q == nullptr);
    CHECK(plan_dense.params.cu_seqlens_k == nullptr);
    CHECK(plan_dense.params.seqused_k == nullptr);
  }
  {  // no queries at all: an empty grid
    VarlenCall empty;
    empty.q.shape[0] = empty.out.shape[0] = empty.lse.shape[1] = 0;
    empty.varlen.max_seqlen_q = 0;
    CHECK(empty.plan().grid == 0);
  }

  auto rejects = [](VarlenCall c, const char* message) {
    INFO("expected an error containing: ", message);
    CHECK_THROWS_WITH_AS(c.plan(), doctest::Contains(message), Error);
  };
  { VarlenCall c; c.q = TensorView::contiguous(c.q.data, DType::bf16, {1, 500, 8, 128});
    rejects(c, "q: must have 3 dimensions [total_q, heads, head_dim]"); }
  { VarlenCall c; c.varlen.cu_seqlens_q.dtype = DType::f32; rejects(c, "cu_seqlens_q: dtype"); }
  { VarlenCall c; c.varlen.cu_seqlens_q.dtype = DType::bf16; rejects(c, "cu_seqlens_q: dtype"); }
  { VarlenCall c; c.varlen.cu_seqlens_k.shape[0] = 5; rejects(c, "cu_seqlens_k: shape"); }  // batch + 2
  { VarlenCall c; c.varlen.cu_seqlens_k.shape[0] = 3; rejects(c, "cu_seqlens_k: shape"); }  // another batch
  { VarlenCall c; c.varlen.max_seqlen_q = 0; rejects(c, "max_seqlen_q="); }
  { VarlenCall c; c.varlen.max_seqlen_q = -1; rejects(c, "max_seqlen_q="); }
  {
    // Over-estimated hints (FlashAttention takes them) plan as the tensors' bounds: all 500 queries, all 900 keys.
    VarlenCall c;
    c.varlen.max_seqlen_q = 4096;
    c.varlen.max_seqlen_k = 100000;
    const ForwardPlan loose = c.plan();
    CHECK(loose.params.seqlen_q == 500);
    CHECK(loose.params.seqlen_k == 900);
    CHECK(loose.grid == (500 + loose.spec.block_q - 1) / loose.spec.block_q * 8 * 3);
  }
  { VarlenCall c; c.seqused.shape[0] = 4; rejects(c, "seqused_k: shape"); }
  { VarlenCall c; c.seqused.shape[0] = 2; rejects(c, "seqused_k: shape"); }
  { VarlenCall c; c.lse.shape[1] = 501; rejects(c, "lse: shape"); }
  { VarlenCall c; c.lse = TensorView::contiguous(c.lse.data, DType::f32, {500, 8}); rejects(c, "lse: shape"); }
  { VarlenCall c; c.lse = TensorView::contiguous(c.lse.data, DType::f32, {1, 8, 500}); rejects(c, "lse: shape"); }
}


TEST_CASE("kvcache: new keys must fit the cache, and a max_seqlen_k hint must hold them") {
  const Arch arch = Arch::parse("sm_90a");
  TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {2, 4, 8, 128});
  TensorView out = TensorView::contiguous(address(0x20000), DType::bf16, {2, 4, 8, 128});
  KVCacheArgs args = contiguous_cache(2, 64, 2, 128);
  auto new_keys = [](int64_t rows) { return TensorView::contiguous(address(0x60000), DType::bf16, {2, rows, 2, 128}); };
  auto plan = [&](const KVCacheArgs& a) { return plan_kvcache(q, a, out, nullptr, ForwardOptions{}, nullptr, 0, true, arch, 227 * 1024, 132); };
  // As many new keys as the cache holds: planned (the device's cache_seqlens are the caller's to keep in range).
  TensorView k_new = new_keys(64);
  args.k_new = args.v_new = &k_new;
  CHECK(plan(args).append.grid > 0);
  // More than the cache holds would be written past it: refused, naming the rule.
  k_new = new_keys(100);
  CHECK_THROWS_WITH_AS(plan(args), doctest::Contains("k_new: seqlen_new=100 must be at most the cache's capacity 64 "
                                                     "(k_cache's seqlen)"), Error);
  // Over pages: the capacity is the block table's (2 pages of 16 rows a sequence).
  KVCacheArgs paged = args;
  paged.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {8, 16, 2, 128});
  paged.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {8, 16, 2, 128});
  const TensorView table = TensorView::contiguous(address(0x70000), DType::i32, {2, 2});
  paged.block_table = &table;
  k_new = new_keys(33);
  CHECK_THROWS_WITH_AS(plan(paged), doctest::Contains("k_new: seqlen_new=33 must be at most the cache's capacity 32 "
                                                      "(page_size × max_pages)"), Error);
  k_new = new_keys(32);
  CHECK(plan(paged).append.grid > 0);
  // A hint shorter than the new keys cannot be true.
  k_new = new_keys(16);
  args.max_seqlen_k = 4;
  CHECK_THROWS_WITH_AS(plan(args), doctest::Contains("max_seqlen_k=4 must be at least seqlen_new=16"), Error);
  args.max_seqlen_k = 16;
  CHECK(plan(args).append.grid > 0);
  // RoPE tables cover the cache's rows: with cache_leftpad a max_seqlen_k hint counts keys from the pad, and the
  // positions still reach the capacity.
  {
    KVCacheArgs padded = contiguous_cache(2, 64, 2, 128);
    const TensorView pads = TensorView::contiguous(address(0x80000), DType::i32, {2});
    padded.cache_leftpad = &pads;
    padded.max_seqlen_k = 30;
    const TensorView table = TensorView::contiguous(address(0x90000), DType::f32, {40, 64});
    ForwardOptions rope;
    rope.rope.style = RopeStyle::rotate_half;
    rope.rope.cos = rope.rope.sin = &table;
    CHECK_THROWS_WITH_AS(plan_kvcache(q, padded, out, nullptr, rope, nullptr, 0, true, arch, 227 * 1024, 132),
                         doctest::Contains("options.rope.cos: 40 positions; the keys reach position 63"), Error);
  }
  // No queries: nothing to attend, the new keys still appended (Runtime launches the append alone).
  q = out = TensorView::contiguous(address(0x10000), DType::bf16, {2, 0, 8, 128});
  const KVCachePlan no_queries = plan(args);
  CHECK(no_queries.attention.grid == 0);
  CHECK(no_queries.append.grid > 0);
  // A batch of none: its empty vectors need not point anywhere.
  KVCacheArgs empty = contiguous_cache(0, 64, 2, 128);
  empty.cache_seqlens.data = nullptr;
  q = out = TensorView::contiguous(address(0x10000), DType::bf16, {0, 1, 8, 128});
  CHECK(plan(empty).attention.grid == 0);
  // The same of a paged cache (block_table [0, 4]) with ALiBi slopes per
  // batch and head ([0, 8]): empty tensors, as PyTorch's, with null data.
  KVCacheArgs empty_paged;
  empty_paged.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {8, 64, 2, 128});
  empty_paged.v_cache = TensorView::contiguous(address(0x40000), DType::bf16, {8, 64, 2, 128});
  empty_paged.cache_seqlens = TensorView::contiguous(nullptr, DType::i32, {0});
  const TensorView no_pages = TensorView::contiguous(nullptr, DType::i32, {0, 4});
  empty_paged.block_table = &no_pages;
  const TensorView no_slopes = TensorView::contiguous(nullptr, DType::f32, {0, 8});
  ForwardOptions alibi;
  alibi.alibi_slopes = &no_slopes;
  CHECK(plan_kvcache(q, empty_paged, out, nullptr, alibi, nullptr, 0, true, arch, 227 * 1024, 132).attention.grid == 0);
  // One sequence: the same null pointers are refused, each by name.
  q = out = TensorView::contiguous(address(0x10000), DType::bf16, {1, 1, 8, 128});
  const TensorView one_page_row = TensorView::contiguous(nullptr, DType::i32, {1, 4});
  empty_paged.block_table = &one_page_row;
  empty_paged.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {1});
  CHECK_THROWS_WITH_AS(plan_kvcache(q, empty_paged, out, nullptr, ForwardOptions{}, nullptr, 0, true, arch, 227 * 1024, 132),
                       doctest::Contains("block_table: data pointer must be non-null"), Error);
  const TensorView one_sequence_table = TensorView::contiguous(address(0x60000), DType::i32, {1, 4});
  empty_paged.block_table = &one_sequence_table;
  const TensorView null_slopes = TensorView::contiguous(nullptr, DType::f32, {1, 8});
  alibi.alibi_slopes = &null_slopes;
  CHECK_THROWS_WITH_AS(plan_kvcache(q, empty_paged, out, nullptr, alibi, nullptr, 0, true, arch, 227 * 1024, 132),
                       doctest::Contains("alibi_slopes: data is null"), Error);
}

TEST_CASE("an unbounded window side reaches every key whatever the max_seqlen hints say") {
  const Arch arch = Arch::parse("sm_90a");
  // Varlen: 2 sequences packed into 300 keys, max_seqlen_k 0 (no hint), a window open on the left.
  const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {100, 8, 128});
  const TensorView k = TensorView::contiguous(address(0x20000), DType::bf16, {300, 8, 128});
  const TensorView v = TensorView::contiguous(address(0x30000), DType::bf16, {300, 8, 128});
  VarlenArgs varlen;
  varlen.cu_seqlens_q = TensorView::contiguous(address(0x40000), DType::i32, {3});
  varlen.cu_seqlens_k = TensorView::contiguous(address(0x50000), DType::i32, {3});
  varlen.max_seqlen_q = 50;
  varlen.max_seqlen_k = 0;
  ForwardOptions options;
  options.window_left = -1;
  options.window_right = 4;
  const ForwardPlan plan = plan_forward_varlen(q, k, v, q, nullptr, varlen, options, arch, 227 * 1024, 132);
  // A row sees keys from i + sk - sq - window_left: past key 0 for any sequence of these 100 queries and 300 keys.
  CHECK(plan.params.window_left >= 100 + 300);
  CHECK(plan.params.window_right == 4);
  // KV cache: a short max_seqlen_k hint (it only sizes splits) leaves causal's open side open.
  const TensorView cq = TensorView::contiguous(address(0x10000), DType::bf16, {2, 1, 32, 128});
  KVCacheArgs args = contiguous_cache(2, 8192, 8, 128);
  args.max_seqlen_k = 100;
  ForwardOptions causal;
  causal.causal = true;
  const KVCachePlan cache_plan = plan_kvcache(cq, args, cq, nullptr, causal, nullptr, 0, true, arch, 227 * 1024, 132);
  CHECK(cache_plan.attention.params.window_left >= 8192 + 1);
}

TEST_CASE("dimensions of extent 1 may have any stride: they are never stepped") {
  // settled_strides: extents 0 and 1 take the packed value, the last dimension 1.
  TensorView t = TensorView::contiguous(address(0x10000), DType::bf16, {1, 7, 1, 64});
  t.strides[0] = 3, t.strides[1] = 24 * 64, t.strides[2] = 5;
  TensorView settled = settled_strides(t);
  CHECK((settled.strides[0] == 7 * 24 * 64 && settled.strides[1] == 24 * 64 && settled.strides[2] == 64 &&
         settled.strides[3] == 1));
  t.shape[3] = 1, t.strides[3] = 9;
  CHECK(settled_strides(t).strides[3] == 1);
  t.shape[3] = 64, t.strides[3] = 1, t.shape[1] = 0;  // no rows: that stride is settled too
  CHECK(settled_strides(t).strides[1] == 64);
  CHECK(settled_strides(t).strides[0] == 0);
  t.shape[0] = 2, t.shape[1] = 7;  // extents above 1 keep their strides
  CHECK((settled_strides(t).strides[0] == 3 && settled_strides(t).strides[1] == 24 * 64));

  // Dense: batch 1, one KV head, odd strides on those dimensions everywhere.
  Call call;
  call.q.shape[0] = call.k.shape[0] = call.v.shape[0] = call.out.shape[0] = call.lse.shape[0] = 1;
  call.k.shape[2] = call.v.shape[2] = 1;
  call.k.strides[1] = call.v.strides[1] = 128;
  call.q.strides[0] = 12, call.k.strides[0] = 7, call.v.strides[0] = 1, call.out.strides[0] = 5;
  call.k.strides[2] = 3, call.v.strides[2] = 1;
  const FwdParams p = call.plan().params;
  CHECK(p.q_batch_stride == 100 * 8 * 128);
  CHECK(p.k_batch_stride == 300 * 128);
  CHECK(p.o_batch_stride == 100 * 8 * 128);
  CHECK((p.k_head_stride == 128 && p.v_head_stride == 128));
  // A dimension that is stepped keeps the rule.
  call.q.shape[0] = call.k.shape[0] = call.v.shape[0] = call.out.shape[0] = call.lse.shape[0] = 2;
  call.k.strides[0] = call.v.strides[0] = 300 * 128, call.out.strides[0] = 100 * 8 * 128;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("q: batch stride 12 must be a multiple of 8"), Error);

  // KV cache: one query row and one new row whose row strides are odd (q[:, -1:] of a
  // wider tensor, k[:, None]); the append steps the packed strides.
  const Arch arch = Arch::parse("sm_90a");
  TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {4, 1, 32, 128});
  TensorView out = TensorView::contiguous(address(0x20000), DType::bf16, {4, 1, 32, 128});
  q.strides[1] = 3, out.strides[1] = 1;
  KVCacheArgs args = contiguous_cache(4, 4096, 8, 128);
  TensorView k_new = TensorView::contiguous(address(0x60000), DType::bf16, {4, 1, 8, 128});
  TensorView v_new = TensorView::contiguous(address(0x70000), DType::bf16, {4, 1, 8, 128});
  k_new.strides[1] = 5, v_new.strides[1] = 1;
  args.k_new = &k_new, args.v_new = &v_new;
  const KVCachePlan plan = plan_kvcache(q, args, out, nullptr, ForwardOptions{}, nullptr, 0, true, arch, 227 * 1024, 132);
  CHECK(plan.attention.params.q_row_stride == 32 * 128);
  CHECK(plan.attention.params.o_row_stride == 32 * 128);
  CHECK(plan.append.params.k_new_strides[1] == 8 * 128);
  CHECK(plan.append.params.v_new_strides[1] == 8 * 128);
  CHECK(plan.append.params.k_new_strides[0] == 8 * 128);

  // The small tensors of one batch or one head: cache_seqlens (lens[:, 0] of
  // a [1, 2] tensor), a one-page block table, one head's ALiBi slope and sink.
  const TensorView q1 = TensorView::contiguous(address(0x10000), DType::bf16, {1, 1, 8, 128});
  KVCacheArgs one = contiguous_cache(1, 256, 1, 128);
  one.cache_seqlens.strides[0] = 2;
  const TensorView table = [] {
    TensorView t = TensorView::contiguous(address(0x80000), DType::i32, {1, 1});
    t.strides[0] = 3, t.strides[1] = 5;
    return t;
  }();
  KVCacheArgs paged = one;
  paged.k_cache = TensorView::contiguous(address(0x30000), DType::bf16, {4, 256, 1, 128});
  paged.v_cache = cli::values_after(paged.k_cache);
  paged.block_table = &table;
  TensorView slope = TensorView::contiguous(address(0x90000), DType::f32, {1, 1});
  slope.strides[0] = 7, slope.strides[1] = 9;
  TensorView sink = TensorView::contiguous(address(0xa0000), DType::f32, {1});
  sink.strides[0] = 4;
  ForwardOptions features;
  features.alibi_slopes = &slope;
  const TensorView mqa_q = TensorView::contiguous(address(0x10000), DType::bf16, {1, 1, 1, 128});
  CHECK_NOTHROW(plan_kvcache(q1, one, q1, nullptr, ForwardOptions{}, nullptr, 0, true, arch, 227 * 1024, 132));
  CHECK_NOTHROW(plan_kvcache(q1, paged, q1, nullptr, ForwardOptions{}, nullptr, 0, true, arch, 227 * 1024, 132));
  CHECK_NOTHROW(plan_kvcache(mqa_q, one, mqa_q, nullptr, features, nullptr, 0, true, arch, 227 * 1024, 132));
  features.alibi_slopes = nullptr;
  features.learnable_sink = &sink;
  CHECK_NOTHROW(plan_kvcache(mqa_q, one, mqa_q, nullptr, features, nullptr, 0, true, arch, 227 * 1024, 132));
  // Two sequences step cache_seqlens: the rule holds there.
  KVCacheArgs two = contiguous_cache(2, 256, 1, 128);
  two.cache_seqlens.strides[0] = 2;
  const TensorView q2 = TensorView::contiguous(address(0x10000), DType::bf16, {2, 1, 8, 128});
  CHECK_THROWS_WITH_AS(plan_kvcache(q2, two, q2, nullptr, ForwardOptions{}, nullptr, 0, true, arch, 227 * 1024, 132),
                       doctest::Contains("cache_seqlens: must be contiguous"), Error);

  // A refused stride is named as the caller gave it, not as settled from it.
  Call odd;
  odd.q.shape[0] = odd.k.shape[0] = odd.v.shape[0] = odd.out.shape[0] = odd.lse.shape[0] = 1;
  odd.q.strides[1] = 8 * 128 + 4;
  odd.q.strides[0] = 0;
  CHECK_THROWS_WITH_AS(odd.plan(), doctest::Contains("q: seqlen stride 1028 must be a multiple of 8"), Error);
}

}  // TEST_SUITE
