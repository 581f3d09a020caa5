// Planning merges of attention states (the combine family) without a GPU:
// spec choice, CombineParams (strides, the thread layout), and every rule a
// call can break, each rejected naming the argument before anything launches.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include <unistd.h>

#include "driver.hpp"
#include "merge.hpp"

using namespace jitattn;
using namespace jitattn::detail;

namespace {

// Fake, suitably aligned device addresses: planning never dereferences them.
void* address(uintptr_t base) { return reinterpret_cast<void*>(base); }

struct MergeCall {
  TensorView states = TensorView::contiguous(address(0x100000), DType::f32, {5, 7, 3, 128});
  TensorView lse = TensorView::contiguous(address(0x200000), DType::f32, {5, 7, 3});
  TensorView out = TensorView::contiguous(address(0x300000), DType::bf16, {7, 3, 128});
  TensorView out_lse = TensorView::contiguous(address(0x400000), DType::f32, {7, 3});
  bool with_out_lse = true;
  CombinePlan plan() const { return plan_merge_states(states, lse, out, with_out_lse ? &out_lse : nullptr); }
};

struct PairCall {
  TensorView a = TensorView::contiguous(address(0x100000), DType::f16, {9, 4, 64});
  TensorView lse_a = TensorView::contiguous(address(0x200000), DType::f32, {9, 4});
  TensorView b = TensorView::contiguous(address(0x500000), DType::f16, {9, 4, 64});
  TensorView lse_b = TensorView::contiguous(address(0x600000), DType::f32, {9, 4});
  TensorView out = TensorView::contiguous(address(0x300000), DType::f16, {9, 4, 64});
  CombinePlan plan(const TensorView* out_lse = nullptr) const {
    return plan_merge_state(a, lse_a, b, lse_b, out, out_lse);
  }
};

// A split-KV style problem: [splits, batch, seqlen, heads, head_dim] fp32 partials.
CombineProblem split_kv_problem() {
  CombineProblem q;
  q.state_dtype = DType::f32;
  q.out_dtype = DType::bf16;
  q.num_states = 16, q.batch = 4, q.seqlen = 2, q.heads = 8, q.head_dim = 128;
  q.states = address(0x100000);
  q.lse = static_cast<const float*>(address(0x200000));
  q.out = address(0x300000);
  const int64_t d = 128, h = 8, s = 2, b = 4;
  const int64_t states_strides[4] = {b * s * h * d, s * h * d, h * d, d};
  const int64_t lse_strides[4] = {b * s * h, s * h, h, 1};
  const int64_t out_strides[3] = {s * h * d, h * d, d};
  std::copy(states_strides, states_strides + 4, q.states_strides);
  std::copy(lse_strides, lse_strides + 4, q.lse_strides);
  std::copy(out_strides, out_strides + 3, q.out_strides);
  return q;
}

}  // namespace

TEST_SUITE("merge") {

TEST_CASE("merge_states plans a combine spec, strides and a thread layout") {
  const MergeCall call;
  const CombinePlan plan = call.plan();
  CHECK(plan.spec.text() == "combine.f32.bf16");
  CHECK(plan.spec.threads() == kCombineThreads);
  const CombineParams& p = plan.params;
  CHECK(p.states == call.states.data);
  CHECK(p.lse == call.lse.data);
  CHECK(p.out == call.out.data);
  CHECK(p.out_lse == call.out_lse.data);
  CHECK(p.states_b == nullptr);
  CHECK(p.lse_b == nullptr);
  CHECK(p.num_states == 5);
  CHECK(p.batch == 1);
  CHECK(p.seqlen == 7);
  CHECK(p.heads == 3);
  CHECK(p.head_dim == 128);
  CHECK(p.pairs == 21);
  CHECK(p.states_state_stride == 7 * 3 * 128);
  CHECK(p.states_row_stride == 3 * 128);
  CHECK(p.states_head_stride == 128);
  CHECK(p.lse_state_stride == 21);
  CHECK(p.lse_row_stride == 3);
  CHECK(p.lse_head_stride == 1);
  CHECK(p.out_row_stride == 3 * 128);
  CHECK(p.out_head_stride == 128);
  CHECK(p.out_lse_row_stride == 3);
  CHECK(p.out_lse_head_stride == 1);
  // 16 chunks of 8 elements; 5 states → 2 state lanes of up to 4 states; 4 pairs per CTA.
  CHECK(p.chunk_lanes == 16);
  CHECK(p.state_lanes == 2);
  CHECK(p.pairs_per_block == 4);
  CHECK(plan.grid == 6);
}

TEST_CASE("the thread layout covers head_dim, packs small groups, and keeps the CTA's weights in bounds") {
  for (int head_dim = 8; head_dim <= kCombineMaxHeadDim; head_dim += 8) {
    for (int states : {1, 2, 3, 5, 17, 32, 55, 97, 128, 129, 1000, 1024}) {
      MergeCall call;
      call.states = TensorView::contiguous(address(0x100000), DType::f16, {states, 10, 2, head_dim});
      call.lse = TensorView::contiguous(address(0x200000), DType::f32, {states, 10, 2});
      call.out = TensorView::contiguous(address(0x300000), DType::f32, {10, 2, head_dim});
      call.with_out_lse = false;
      const CombineParams p = call.plan().params;
      const int group = p.chunk_lanes * p.state_lanes;
      CHECK(p.chunk_lanes * 8 >= head_dim);
      CHECK(p.chunk_lanes < 2 * std::max(1, head_dim / 8));  // the smallest power of two that covers it
      CHECK((p.chunk_lanes & (p.chunk_lanes - 1)) == 0);
      CHECK((p.state_lanes & (p.state_lanes - 1)) == 0);
      CHECK(group * p.pairs_per_block == kCombineThreads);
      CHECK(p.pairs_per_block * states <= kCombineMaxStates);
      // Each lane has at most one batch of states, unless the pair already has the whole CTA.
      CHECK((p.state_lanes * kCombineStatesInFlight >= states || group == kCombineThreads));
      CHECK((p.state_lanes == 1 || (p.state_lanes / 2) * kCombineStatesInFlight < states));
    }
  }
}

TEST_CASE("plan_combine takes split-KV partials on two row levels") {
  const CombineProblem q = split_kv_problem();
  const CombinePlan plan = plan_combine(q);
  CHECK(plan.spec.text() == "combine.f32.bf16");
  const CombineParams& p = plan.params;
  CHECK(p.batch == 4);
  CHECK(p.seqlen == 2);
  CHECK(p.pairs == 64);
  CHECK(p.states_state_stride == 4 * 2 * 8 * 128);
  CHECK(p.states_batch_stride == 2 * 8 * 128);
  CHECK(p.lse_batch_stride == 16);
  CHECK(p.out_batch_stride == 2 * 8 * 128);
  CHECK(p.out_lse == nullptr);
  CHECK(plan.grid == 32);

  CombineProblem empty = q;
  empty.batch = 0;
  empty.states = nullptr;
  empty.lse = nullptr;
  empty.out = nullptr;
  CHECK(plan_combine(empty).grid == 0);  // nothing to merge: null pointers are fine

  CHECK_FALSE(plan.spec.elementwise);
  CombineProblem bad = q;
  bad.states_strides[1] = 102;  // not a whole number of 16-byte vectors of f32: element by element
  CHECK(plan_combine(bad).spec.text() == "combine.f32.bf16.elementwise");
  bad = q;
  bad.batch = 1;
  bad.states_strides[1] = 3;  // the stride of a dimension of extent 1 is never used
  CHECK(plan_combine(bad).grid == 8);
  bad = q;
  bad.out_dtype = DType::i32;
  CHECK_THROWS_WITH_AS(plan_combine(bad), doctest::Contains("out: dtype i32 is not f32, f16 or bf16"), Error);
  bad = q;
  bad.separate_b = true;
  CHECK_THROWS_WITH_AS(plan_combine(bad), doctest::Contains("states_b: a separate second state needs num_states=2, got 16"), Error);
  bad = q;
  bad.batch = 1 << 16, bad.seqlen = 1 << 16;
  CHECK_THROWS_WITH_AS(plan_combine(bad), doctest::Contains("exceeds 2^31-1 (row, head) pairs"), Error);
}

TEST_CASE("merge_states: any strides with a contiguous head_dim") {
  MergeCall call;
  // states stored [rows, num_states, heads, head_dim + 8], out [heads, rows, head_dim].
  call.states.strides[1] = 5 * 3 * 136, call.states.strides[0] = 3 * 136, call.states.strides[2] = 136;
  call.lse.strides[0] = 1, call.lse.strides[1] = 5 * 3, call.lse.strides[2] = 5;
  call.out.strides[1] = 7 * 128, call.out.strides[0] = 128;
  call.out_lse.strides[0] = 1, call.out_lse.strides[1] = 7;
  const CombineParams p = call.plan().params;
  CHECK(p.states_state_stride == 3 * 136);
  CHECK(p.states_row_stride == 5 * 3 * 136);
  CHECK(p.states_head_stride == 136);
  CHECK(p.lse_state_stride == 1);
  CHECK(p.lse_row_stride == 15);
  CHECK(p.lse_head_stride == 5);
  CHECK(p.out_row_stride == 128);
  CHECK(p.out_head_stride == 7 * 128);
  CHECK(p.out_lse_row_stride == 1);
  CHECK(p.out_lse_head_stride == 7);
}

TEST_CASE("merge_states rejects bad dtypes naming the argument") {
  MergeCall call;
  call.states.dtype = DType::i32;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("states: dtype i32 is not f32, f16 or bf16"), Error);
  call = MergeCall();
  call.lse.dtype = DType::bf16;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("lse: dtype bf16 must be f32"), Error);
  call = MergeCall();
  call.out.dtype = DType::i32;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("out: dtype i32 is not f32, f16 or bf16"), Error);
  call = MergeCall();
  call.out_lse.dtype = DType::f16;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("out_lse: dtype f16 must be f32"), Error);
}

TEST_CASE("merge_states rejects shape mismatches naming the argument and the expected shape") {
  MergeCall call;
  call.states.ndim = 3;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("states: must have 4 dimensions [num_states, rows, heads, head_dim], got 3"), Error);
  call = MergeCall();
  call.lse = TensorView::contiguous(address(0x200000), DType::f32, {4, 7, 3});
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("lse: shape [4, 7, 3] must be [num_states, rows, heads] = [5, 7, 3]"), Error);
  call = MergeCall();
  call.out = TensorView::contiguous(address(0x300000), DType::bf16, {7, 3, 64});
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("out: shape [7, 3, 64] must be [rows, heads, head_dim] = [7, 3, 128]"), Error);
  call = MergeCall();
  call.out_lse = TensorView::contiguous(address(0x400000), DType::f32, {3, 7});
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("out_lse: shape [3, 7] must be [rows, heads] = [7, 3]"), Error);
  call = MergeCall();
  call.states.shape[1] = -1;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("states: rows=-1 is negative"), Error);
}

TEST_CASE("merge_states rejects a non-contiguous last dimension and misaligned elements; rows off 16 bytes go elementwise") {
  MergeCall call;
  call.states.strides[3] = 2;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("states: head_dim stride is 2; the last dimension must be contiguous"), Error);
  call = MergeCall();
  call.out.strides[2] = 2;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("out: head_dim stride is 2; the last dimension must be contiguous"), Error);
  // Rows that do not start on 16 bytes take the elementwise kernel.
  CHECK_FALSE(MergeCall().plan().spec.elementwise);
  call = MergeCall();
  call.out.strides[0] = 3 * 128 + 4;
  CHECK(call.plan().spec.elementwise);
  call = MergeCall();
  call.states.strides[0] = 7 * 3 * 128 + 2;
  CHECK(call.plan().spec.elementwise);
  call = MergeCall();
  call.states.data = address(0x100008);
  CHECK(call.plan().spec.elementwise);
  // A pointer must still hold whole elements.
  call = MergeCall();
  call.states.data = address(0x100002);
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("states: data pointer must be 4-byte aligned (f32)"), Error);
  call = MergeCall();
  call.out.data = address(0x300001);
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("out: data pointer must be 2-byte aligned (bf16)"), Error);
  call = MergeCall();
  call.lse.data = address(0x200002);
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("lse: data pointer must be 4-byte aligned"), Error);
}

TEST_CASE("merge_states rejects null pointers, unless there is nothing to merge") {
  for (int which = 0; which < 4; ++which) {
    MergeCall call;
    TensorView* views[] = {&call.states, &call.lse, &call.out, &call.out_lse};
    const char* names[] = {"states: data is null", "lse: data is null", "out: data is null", "out_lse: data is null"};
    views[which]->data = nullptr;
    CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains(names[which]), Error);
  }
  MergeCall empty;
  empty.states.shape[1] = empty.lse.shape[1] = empty.out.shape[0] = empty.out_lse.shape[0] = 0;
  empty.states.data = empty.lse.data = empty.out.data = empty.out_lse.data = nullptr;
  CHECK(empty.plan().grid == 0);
}

TEST_CASE("merge_states rejects state counts and head dims the kernel does not serve") {
  MergeCall call;
  call.states.shape[0] = call.lse.shape[0] = 0;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("states: num_states=0 must be at least 1"), Error);
  call = MergeCall();
  call.states.shape[0] = call.lse.shape[0] = 1025;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("num_states=1025 is above the most one merge supports, 1024"), Error);
  try {
    call.plan();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::unsupported);
  }
  call = MergeCall();
  call.states.shape[3] = call.out.shape[2] = 0;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("states: head_dim=0 must be positive"), Error);
  // Head dims that are not a multiple of 8 are merged element by element.
  call = MergeCall();
  call.states = TensorView::contiguous(address(0x100000), DType::f32, {5, 7, 3, 59});
  call.out = TensorView::contiguous(address(0x300000), DType::bf16, {7, 3, 59});
  CHECK(call.plan().spec.text() == "combine.f32.bf16.elementwise");
  CHECK(call.plan().params.head_dim == 59);
  // Chunk lanes cover the partial last chunk too.
  for (const auto& [head_dim, lanes] : {std::pair<int, int>{59, 8}, {13, 2}, {3, 1}, {17, 4}, {509, 64}}) {
    CAPTURE(head_dim);
    call.states = TensorView::contiguous(address(0x100000), DType::f32, {5, 7, 3, head_dim});
    call.out = TensorView::contiguous(address(0x300000), DType::bf16, {7, 3, head_dim});
    CHECK(call.plan().params.chunk_lanes == lanes);
  }
  call = MergeCall();
  call.states = TensorView::contiguous(address(0x100000), DType::f32, {5, 7, 3, 520});
  call.out = TensorView::contiguous(address(0x300000), DType::bf16, {7, 3, 520});
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("head_dim=520 is above the largest supported, 512"), Error);
  call.states = TensorView::contiguous(address(0x100000), DType::f32, {1024, 7, 3, 512});
  call.lse = TensorView::contiguous(address(0x200000), DType::f32, {1024, 7, 3});
  call.out = TensorView::contiguous(address(0x300000), DType::bf16, {7, 3, 512});
  CHECK(call.plan().grid == 21);
}

TEST_CASE("merge_state reads b from its own buffer with its own strides") {
  PairCall call;
  call.b.strides[0] = 4 * 72, call.b.strides[1] = 72;  // padded heads
  call.lse_b.strides[0] = 1, call.lse_b.strides[1] = 9;  // [heads, rows]
  const TensorView out_lse = TensorView::contiguous(address(0x700000), DType::f32, {9, 4});
  const CombinePlan plan = call.plan(&out_lse);
  CHECK(plan.spec.text() == "combine.f16.f16");
  const CombineParams& p = plan.params;
  CHECK(p.num_states == 2);
  CHECK(p.states == call.a.data);
  CHECK(p.states_b == call.b.data);
  CHECK(p.lse == call.lse_a.data);
  CHECK(p.lse_b == call.lse_b.data);
  CHECK(p.states_row_stride == 4 * 64);
  CHECK(p.states_b_row_stride == 4 * 72);
  CHECK(p.states_b_head_stride == 72);
  CHECK(p.lse_b_row_stride == 1);
  CHECK(p.lse_b_head_stride == 9);
  CHECK(p.out_lse == out_lse.data);
  CHECK(p.pairs == 36);
  // 8 chunks × 1 state lane (both states in one batch): 16 pairs per CTA.
  CHECK(p.chunk_lanes == 8);
  CHECK(p.state_lanes == 1);
  CHECK(p.pairs_per_block == 16);
  CHECK(plan.grid == 3);
}

TEST_CASE("merge_state rejects mismatched inputs naming a, b, lse_a, lse_b") {
  PairCall call;
  call.b = TensorView::contiguous(address(0x500000), DType::f16, {9, 4, 128});
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("b: shape [9, 4, 128] must equal a's shape [9, 4, 64]"), Error);
  call = PairCall();
  call.b.dtype = DType::bf16;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("b: dtype bf16 must equal a's dtype f16"), Error);
  call = PairCall();
  call.lse_b = TensorView::contiguous(address(0x600000), DType::f32, {9, 5});
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("lse_b: shape [9, 5] must be [rows, heads] = [9, 4] (from a)"), Error);
  call = PairCall();
  call.lse_a.dtype = DType::f16;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("lse_a: dtype f16 must be f32"), Error);
  call = PairCall();
  call.b.strides[2] = 2;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("b: head_dim stride is 2"), Error);
  call = PairCall();
  call.b.data = nullptr;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("b: data is null"), Error);
  call = PairCall();
  call.lse_b.data = nullptr;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("lse_b: data is null"), Error);
  call = PairCall();
  call.a.data = address(0x100004);
  CHECK(call.plan().spec.elementwise);
  call = PairCall();
  call.b.strides[0] = 4 * 64 + 4;
  CHECK(call.plan().spec.elementwise);
  call = PairCall();
  call.b.data = address(0x100003);
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("b: data pointer must be"), Error);
  call = PairCall();
  call.a.ndim = 4;
  CHECK_THROWS_WITH_AS(call.plan(), doctest::Contains("a: must have 3 dimensions [rows, heads, head_dim], got 4"), Error);
}

TEST_CASE("the runtime validates merges before it needs a GPU, and launches nothing on bad input") {
  namespace fs = std::filesystem;
  Config config;
  config.cache_dir = (fs::temp_directory_path() / ("jitattn-merge-" + std::to_string(::getpid()))).string();
  Runtime runtime(config);
  MergeCall call;
  call.out.strides[2] = 3;
  // Fake device addresses: reaching a launch would fault, so passing means validation stopped the call.
  CHECK_THROWS_WITH_AS(runtime.merge_states(call.states, call.lse, call.out, &call.out_lse),
                       doctest::Contains("out: head_dim stride is 3"), Error);
  PairCall pair;
  pair.lse_a.dtype = DType::bf16;
  CHECK_THROWS_WITH_AS(runtime.merge_state(pair.a, pair.lse_a, pair.b, pair.lse_b, pair.out),
                       doctest::Contains("lse_a: dtype bf16 must be f32"), Error);
  CHECK(runtime.warm("combine.bf16.f32", "sm_80").cubin_bytes > 0);
  if (driver().available) {
    MESSAGE("a GPU is present: the no-GPU path is not reachable here");
  } else {
    const MergeCall valid;
    try {
      runtime.merge_states(valid.states, valid.lse, valid.out, &valid.out_lse);
      FAIL("a valid merge without a GPU did not fail");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::cuda_error);
      CHECK(std::string(e.what()).find("no usable GPU") != std::string::npos);
    }
  }
  fs::remove_all(config.cache_dir);
}

}  // TEST_SUITE
