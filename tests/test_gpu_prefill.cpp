// The prefill kernel against references, on a GPU. Small shapes are checked
// against the float64 CPU reference, large ones against the GPU reference
// kernel (itself checked against the CPU one). Tolerance, as FlashAttention's
// tests: max |out − exact| ≤ 2 × max |out16 − exact|, where out16 is the same
// attention computed with 16-bit rounding of its intermediates.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "gpu_support.hpp"
#include "render.hpp"
#include "spec.hpp"

using namespace jitattn;
using namespace jitattn::test;

namespace {

// unit_dims_odd: padded, with an odd stride on every dimension of extent 1
// (never stepped; PyTorch leaves such strides after slicing or unsqueeze).
enum class Layout { contiguous, padded, heads_major, unit_dims_odd };

void strides_for(Layout layout, const int64_t (&shape)[4], int64_t (&strides)[4]) {
  switch (layout) {
    case Layout::contiguous: contiguous_strides(shape, strides); break;
    case Layout::padded: padded_strides(shape, strides); break;
    case Layout::heads_major: heads_major_strides(shape, strides); break;
    case Layout::unit_dims_odd:
      padded_strides(shape, strides);
      for (int axis = 0; axis < 3; ++axis) strides[axis] = shape[axis] == 1 ? 3 + 2 * axis : strides[axis];
      break;
  }
}

struct Problem {
  AttentionShape shape;
  DType dtype = DType::bf16;
  Layout layout = Layout::contiguous;
};

// Inputs on the device plus their logical values on the host.
struct Inputs {
  std::vector<float> q, k, v;
  std::unique_ptr<DeviceTensor> dq, dk, dv;
};

Inputs make_inputs(const Problem& problem, std::mt19937_64& rng) {
  const auto& s = problem.shape;
  const int64_t q_shape[4] = {s.batch, s.seqlen_q, s.heads_q, s.head_dim};
  const int64_t kv_shape[4] = {s.batch, s.seqlen_k, s.heads_kv, s.head_dim};
  int64_t q_strides[4], kv_strides[4];
  strides_for(problem.layout, q_shape, q_strides);
  strides_for(problem.layout, kv_shape, kv_strides);
  Inputs in;
  in.q = random_values(static_cast<size_t>(s.batch) * s.seqlen_q * s.heads_q * s.head_dim, problem.dtype, rng);
  in.k = random_values(static_cast<size_t>(s.batch) * s.seqlen_k * s.heads_kv * s.head_dim, problem.dtype, rng);
  in.v = random_values(in.k.size(), problem.dtype, rng);
  in.dq = std::make_unique<DeviceTensor>(in.q, problem.dtype, q_shape, q_strides);
  in.dk = std::make_unique<DeviceTensor>(in.k, problem.dtype, kv_shape, kv_strides);
  in.dv = std::make_unique<DeviceTensor>(in.v, problem.dtype, kv_shape, kv_strides);
  return in;
}

struct KernelRun {
  std::vector<float> out;
  std::vector<float> lse;
  std::string spec;
  std::string repeat_mismatch;  // launch_repeated: a repeat that read back other bits
};

// Runs jitattn with out (and lse) poisoned with NaN first.
KernelRun run_kernel(const Problem& problem, const Inputs& in, TileConfig tiles) {
  const auto& s = problem.shape;
  const int64_t q_shape[4] = {s.batch, s.seqlen_q, s.heads_q, s.head_dim};
  int64_t out_strides[4];
  // Output in a different layout than the inputs, to exercise its strides
  // (odd unit-dimension strides in out too).
  const Layout out_layout = problem.layout == Layout::unit_dims_odd ? Layout::unit_dims_odd
                            : problem.layout == Layout::contiguous  ? Layout::heads_major
                                                                     : Layout::contiguous;
  strides_for(out_layout, q_shape, out_strides);
  DeviceTensor out(problem.dtype, q_shape, out_strides);
  const size_t lse_count = static_cast<size_t>(s.batch) * s.heads_q * s.seqlen_q;
  DeviceBuffer lse(lse_count * 4);
  TensorView lse_view = TensorView::contiguous(lse.get(), DType::f32, {s.batch, s.heads_q, s.seqlen_q});
  ForwardOptions options;
  options.causal = s.causal;
  if (s.scale > 0.f) options.softmax_scale = s.scale;
  options.tiles = tiles;
  std::string mismatch;
  KernelRun run = launch_repeated(
      [&] {
        out.buffer.fill_bytes(0xff);
        lse.fill_bytes(0xff);
        gpu_tests_runtime().forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), &lse_view, options,
                                    nullptr);
        return read_outputs<KernelRun>(out, lse, lse_count);
      },
      mismatch);
  run.spec = gpu_tests_runtime().spec_for(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), &lse_view, options);
  run.repeat_mismatch = std::move(mismatch);
  return run;
}

// out for a problem's q shape, contiguous, NaN-poisoned.
DeviceTensor contiguous_output(const Problem& problem) {
  const auto& s = problem.shape;
  const int64_t shape[4] = {s.batch, s.seqlen_q, s.heads_q, s.head_dim};
  int64_t strides[4];
  contiguous_strides(shape, strides);
  return DeviceTensor(problem.dtype, shape, strides);
}

double max_abs_error(const std::vector<double>& reference, const std::vector<float>& values) {
  double worst = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double error = std::fabs(double(values[i]) - reference[i]);
    if (!(error <= worst)) worst = std::isnan(error) ? INFINITY : error;
  }
  return worst;
}
double max_abs_error(const std::vector<double>& reference, const std::vector<double>& values) {
  return max_abs_error(reference, std::vector<float>(values.begin(), values.end()));
}

std::string describe(const Problem& p, const std::string& spec, uint64_t seed) {
  const auto& s = p.shape;
  return fmt::format("{} batch={} seqlen_q={} seqlen_k={} heads={}/{} layout={} seed={}", spec, s.batch, s.seqlen_q,
                     s.seqlen_k, s.heads_q, s.heads_kv, static_cast<int>(p.layout), seed);
}

// Every output element written and finite, error within the 16-bit yardstick,
// lse within fp32 rounding, rows with no visible key exactly 0 / -inf.
void check_against(const Problem& problem, const KernelRun& run, const ReferenceOutput& exact,
                   const ReferenceOutput& rounded, uint64_t seed) {
  const std::string what = describe(problem, run.spec, seed);
  INFO(what);
  size_t non_finite = 0;
  for (float x : run.out) non_finite += !std::isfinite(x);
  CHECK_MESSAGE(non_finite == 0, fmt::format("{} output elements are NaN/inf (unwritten or overflowed)", non_finite));
  const double kernel_error = max_abs_error(exact.out, run.out);
  const double yardstick = max_abs_error(exact.out, rounded.out);
  CHECK_MESSAGE(kernel_error <= 2 * yardstick + 1e-5,
                fmt::format("max error {:.3g} > 2 × 16-bit reference error {:.3g}", kernel_error, yardstick));
  size_t lse_bad = 0;
  for (size_t i = 0; i < run.lse.size(); ++i) {
    const double want = exact.lse[i];
    const double got = run.lse[i];
    const bool ok = std::isinf(want) ? (std::isinf(got) && got < 0) : std::fabs(got - want) <= 1e-3 * std::max(1.0, std::fabs(want));
    lse_bad += !ok;
  }
  CHECK_MESSAGE(lse_bad == 0, fmt::format("{} lse values off", lse_bad));
  if (!run.repeat_mismatch.empty()) FAIL_CHECK(run.repeat_mismatch);
}

const std::vector<TileConfig> kAllTiles = {
    {64, 32, 4}, {64, 64, 4}, {64, 128, 4}, {128, 32, 4}, {128, 64, 4}, {128, 128, 4},
    {128, 32, 8}, {128, 64, 8}, {128, 128, 8},
};

// The tile shapes the generator accepts at a head dim (some exceed the
// register budget; the spec refuses those, which test_spec checks).
std::vector<TileConfig> tiles_for(int head_dim) {
  std::vector<TileConfig> tiles;
  for (const TileConfig& t : kAllTiles) {
    detail::KernelSpec spec;
    spec.head_dim = head_dim;
    spec.block_q = t.block_q;
    spec.block_kv = t.block_kv;
    spec.warps = t.warps;
    if (spec.accumulator_registers() <= 192) tiles.push_back(t);
  }
  return tiles;
}

std::string spec_text(DType dtype, int head_dim, TileConfig t, bool causal) {
  detail::KernelSpec spec;
  spec.dtype = dtype;
  spec.head_dim = head_dim;
  spec.block_q = t.block_q;
  spec.block_kv = t.block_kv;
  spec.warps = t.warps;
  spec.causal = causal;
  return spec.text();
}

}  // namespace

TEST_SUITE("gpu") {

TEST_CASE("prefill matches the float64 CPU reference on small shapes, every tile config") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const std::vector<std::pair<int, int>> seqlens = {{1, 1}, {1, 239}, {113, 203}, {128, 217}, {512, 256}, {17, 0}};
  std::vector<std::string> specs;
  for (DType dtype : {DType::f16, DType::bf16})
    for (int head_dim : {64, 128})
      for (bool causal : {false, true})
        for (const auto& tiles : tiles_for(head_dim)) specs.push_back(spec_text(dtype, head_dim, tiles, causal));
  warm_or_fail(specs);
  int index = 0;
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (int head_dim : {64, 128}) {
      for (bool causal : {false, true}) {
        for (const auto& [seqlen_q, seqlen_k] : seqlens) {
          Problem problem;
          problem.dtype = dtype;
          problem.layout = static_cast<Layout>(index++ % 3);
          const bool gqa = index % 2 == 0;
          problem.shape = {2, seqlen_q, seqlen_k, gqa ? 4 : 3, gqa ? 2 : 3, head_dim, causal, 0.f};
          const Inputs in = make_inputs(problem, rng);
          const ReferenceOutput exact = attention_exact(problem.shape, in.q, in.k, in.v);
          const ReferenceOutput rounded = attention_16bit(problem.shape, in.q, in.k, in.v, dtype);
          for (const auto& tiles : tiles_for(head_dim)) check_against(problem, run_kernel(problem, in, tiles), exact, rounded, seed);
        }
      }
    }
  }
}

TEST_CASE("the GPU reference kernel agrees with the float64 CPU reference") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (bool causal : {false, true}) {
      Problem problem;
      problem.dtype = dtype;
      problem.layout = Layout::padded;
      problem.shape = {2, 300, 451, 4, 2, 128, causal, 0.f};
      const Inputs in = make_inputs(problem, rng);
      const ReferenceOutput cpu_exact = attention_exact(problem.shape, in.q, in.k, in.v);
      const ReferenceOutput cpu_rounded = attention_16bit(problem.shape, in.q, in.k, in.v, dtype);
      const ReferenceOutput gpu_exact = gpu_reference(problem.shape, *in.dq, *in.dk, *in.dv, true);
      const ReferenceOutput gpu_rounded = gpu_reference(problem.shape, *in.dq, *in.dk, *in.dv, false);
      INFO(describe(problem, "reference", seed));
      CHECK(max_abs_error(cpu_exact.out, gpu_exact.out) < 1e-4);
      CHECK(max_abs_error(cpu_exact.lse, gpu_exact.lse) < 1e-3);
      // The rounded variant differs from the CPU one only where fp32 sums in
      // another order round differently: its error must be of the same size.
      const double cpu_error = max_abs_error(cpu_exact.out, std::vector<float>(cpu_rounded.out.begin(), cpu_rounded.out.end()));
      const double gpu_error = max_abs_error(cpu_exact.out, std::vector<float>(gpu_rounded.out.begin(), gpu_rounded.out.end()));
      CHECK(gpu_error > 0.25 * cpu_error);
      CHECK(gpu_error < 4 * cpu_error);
    }
  }
}

TEST_CASE("prefill matches the GPU reference on large shapes with non-default strides") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const std::vector<std::pair<int, int>> seqlens = {{1023, 1024}, {1024, 1023}, {2048, 2048}};
  const std::vector<TileConfig> tile_choices = {{}, {64, 64, 4}, {128, 128, 8}};
  std::vector<std::string> specs;
  for (DType dtype : {DType::f16, DType::bf16})
    for (int head_dim : {64, 128})
      for (bool causal : {false, true})
        for (const auto& tiles : tile_choices) {
          if (tiles.block_q != 0) specs.push_back(spec_text(dtype, head_dim, tiles, causal));
        }
  warm_or_fail(specs);
  int index = 0;
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (int head_dim : {64, 128}) {
      for (bool causal : {false, true}) {
        for (const auto& [seqlen_q, seqlen_k] : seqlens) {
          Problem problem;
          problem.dtype = dtype;
          problem.layout = index++ % 2 == 0 ? Layout::padded : Layout::heads_major;
          problem.shape = {2, seqlen_q, seqlen_k, 4, 2, head_dim, causal, 0.f};
          const Inputs in = make_inputs(problem, rng);
          const ReferenceOutput exact = gpu_reference(problem.shape, *in.dq, *in.dk, *in.dv, true);
          const ReferenceOutput rounded = gpu_reference(problem.shape, *in.dq, *in.dk, *in.dv, false);
          for (const auto& tiles : tile_choices) check_against(problem, run_kernel(problem, in, tiles), exact, rounded, seed);
        }
      }
    }
  }
}

TEST_CASE("dimensions of extent 1 may have any stride") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  // batch 1, one query row or one KV head: the strides of those dimensions are
  // odd (not 16-byte steps) in q, k, v and out; the planner takes them as packed.
  const std::vector<AttentionShape> shapes = {
      {1, 1, 300, 4, 1, 64, false, 0.f}, {1, 1, 300, 4, 1, 64, true, 0.f}, {1, 77, 190, 2, 1, 128, true, 0.f},
      {1, 200, 200, 1, 1, 64, false, 0.f}};
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (const AttentionShape& shape : shapes) {
      Problem problem;
      problem.dtype = dtype;
      problem.layout = Layout::unit_dims_odd;
      problem.shape = shape;
      const Inputs in = make_inputs(problem, rng);
      const ReferenceOutput exact = gpu_reference(problem.shape, *in.dq, *in.dk, *in.dv, true);
      const ReferenceOutput rounded = gpu_reference(problem.shape, *in.dq, *in.dk, *in.dv, false);
      check_against(problem, run_kernel(problem, in, {}), exact, rounded, seed);
    }
  }
}

TEST_CASE("first_difference (JITATTN_TEST_REPEAT's comparison) sees every bit, NaN payloads and -0 included") {
  auto float_of = [](uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
  };
  const float nan_a = float_of(0x7fc00001u), nan_b = float_of(0x7fc00002u);
  const std::vector<float> first = {1.f, nan_a, 0.f, -2.5f};
  CHECK(first_difference("out", first, first).empty());
  std::vector<float> again = first;
  again[1] = nan_b;  // another NaN: == would call both unequal, memcmp tells them apart
  CHECK(first_difference("out", first, again).find("out[1]") != std::string::npos);
  again = first;
  again[2] = -0.f;  // equal as floats, not as bits
  CHECK(first_difference("lse", first, again).find("lse[2]") != std::string::npos);
  again.pop_back();
  CHECK(first_difference("out", first, again).find("4 values, then 3") != std::string::npos);
}

TEST_CASE("softmax_scale is honoured and lse is optional") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  Problem problem;
  problem.shape = {1, 77, 300, 2, 1, 64, true, 0.37f};
  const Inputs in = make_inputs(problem, rng);
  check_against(problem, run_kernel(problem, in, {}), attention_exact(problem.shape, in.q, in.k, in.v),
                attention_16bit(problem.shape, in.q, in.k, in.v, problem.dtype), seed);

  DeviceTensor out = contiguous_output(problem);
  ForwardOptions options;
  options.causal = true;
  options.softmax_scale = 0.37f;
  gpu_tests_runtime().forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options, nullptr);
  const ReferenceOutput exact = attention_exact(problem.shape, in.q, in.k, in.v);
  CHECK(max_abs_error(exact.out, out.read()) < 2e-2);
}

TEST_CASE("a rejected call writes nothing") {
  std::mt19937_64 rng(clock_seed());
  Problem problem;
  problem.shape = {1, 64, 64, 6, 6, 64, false, 0.f};
  const Inputs in = make_inputs(problem, rng);
  const int64_t bad_shape[4] = {1, 64, 4, 64};  // heads_kv = 4 does not divide heads_q = 6
  int64_t bad_strides[4];
  contiguous_strides(bad_shape, bad_strides);
  DeviceTensor bad_k(random_values(64 * 4 * 64, problem.dtype, rng), problem.dtype, bad_shape, bad_strides);
  DeviceTensor out = contiguous_output(problem);
  CHECK_THROWS_WITH_AS(
      gpu_tests_runtime().forward(in.dq->view(), bad_k.view(), bad_k.view(), out.view(), nullptr, {}, nullptr),
      doctest::Contains("heads_kv=4 must divide heads_q=6"), Error);
  for (uint16_t bits : out.raw()) REQUIRE(bits == 0xffff);
}

TEST_CASE("a call with no current context uses the primary context") {
  std::mt19937_64 rng(clock_seed());
  Problem problem;
  problem.shape = {1, 130, 130, 2, 2, 128, false, 0.f};
  const Inputs in = make_inputs(problem, rng);
  DeviceTensor out = contiguous_output(problem);
  std::string error;
  std::thread([&] {
    try {
      CUcontext current = nullptr;
      detail::driver().cuCtxGetCurrent(&current);
      if (current != nullptr) error = "new thread unexpectedly has a current context";
      gpu_tests_runtime().forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, {}, nullptr);
      detail::driver().cuCtxSynchronize();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  CHECK(error.empty());
  const ReferenceOutput exact = attention_exact(problem.shape, in.q, in.k, in.v);
  CHECK(max_abs_error(exact.out, out.read()) < 2e-2);
}

TEST_CASE("a runtime outlives the contexts it ran in: each new context gets its function, unloading needs none") {
  // Engines and tests create and destroy contexts (one per GPU, per worker,
  // per test), and a Runtime kept in a static is destroyed after them: its
  // kernels are libraries of no context, unloaded when it ends whichever
  // contexts are gone. (Under compute-sanitizer an unload into a destroyed
  // context is reported as an API error.)
  const uint64_t seed = clock_seed();
  std::string error;
  std::vector<float> outs[2];
  Problem problem;
  problem.shape = {1, 96, 160, 4, 2, 64, true, 0.f};
  std::vector<float> q[2], k[2], v[2];
  std::thread([&] {
    try {
      Runtime runtime(gpu_tests_runtime().config());
      std::mt19937_64 rng(seed);
      for (int round = 0; round < 2; ++round) {
        const CUcontext context = create_context();
        {
          const Inputs in = make_inputs(problem, rng);
          q[round] = in.q, k[round] = in.k, v[round] = in.v;
          DeviceTensor out = contiguous_output(problem);
          ForwardOptions options;
          options.causal = true;
          try {
            runtime.forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options, nullptr);
            outs[round] = out.read();
          } catch (const std::exception& e) {
            error += e.what();
          }
        }
        destroy_context(context);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  INFO("seed " << seed);
  REQUIRE_MESSAGE(error.empty(), error);
  for (int round = 0; round < 2; ++round) {
    CHECK(max_abs_error(attention_exact(problem.shape, q[round], k[round], v[round]).out, outs[round]) < 2e-2);
  }
  // And the tests' own runtime still runs in the primary context.
  std::mt19937_64 rng(seed + 1);
  const Inputs in = make_inputs(problem, rng);
  DeviceTensor out = contiguous_output(problem);
  ForwardOptions options;
  options.causal = true;
  gpu_tests_runtime().forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options, nullptr);
  CHECK(max_abs_error(attention_exact(problem.shape, in.q, in.k, in.v).out, out.read()) < 2e-2);
}

TEST_CASE("a call runs in its stream's context, whichever context is current") {
  // Tensors and a stream of a second context on the device; the call is made
  // with none current (so the primary context becomes current), as a worker
  // thread of a multi-GPU engine might. The launch must go to the stream's
  // context, and leave the thread's current context as it found it.
  const auto& d = detail::driver();
  const uint64_t seed = clock_seed();
  INFO("seed " << seed);
  Problem problem;
  problem.shape = {2, 130, 257, 4, 2, 64, true, 0.f};
  std::vector<float> q, k, v, got;
  std::string error;
  std::thread([&] {
    try {
      const CUcontext other = create_context();
      {
        std::mt19937_64 rng(seed);
        const Inputs in = make_inputs(problem, rng);
        q = in.q, k = in.k, v = in.v;
        DeviceTensor out = contiguous_output(problem);
        CUstream stream = nullptr;
        detail::check_cuda(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        CUcontext popped = nullptr;
        detail::check_cuda(d.cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
        ForwardOptions options;
        options.causal = true;
        try {
          gpu_tests_runtime().forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options,
                                      stream);
        } catch (const std::exception& e) {
          error = e.what();
        }
        // The thread had no current context, and has none after: no primary
        // context was made current for a stream of another.
        CUcontext current = nullptr;
        d.cuCtxGetCurrent(&current);
        if (current != nullptr) error += " the call left a context current";
        detail::check_cuda(d.cuCtxPushCurrent(other), "cuCtxPushCurrent");
        detail::check_cuda(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
        got = out.read();
        d.cuStreamDestroy(stream);
      }
      destroy_context(other);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  REQUIRE_MESSAGE(error.empty(), error);
  CHECK(max_abs_error(attention_exact(problem.shape, q, k, v).out, got) < 2e-2);
}

TEST_CASE("threads share one runtime: concurrent first calls of the same kernels, each thread on its own stream") {
  // A serving process's first requests: many threads, a cold cache, the same
  // few kernels asked for at once (the registry loads each once; the others
  // wait for it). Every call's output is checked, each kernel is stored, and
  // nothing deadlocks.
  const uint64_t seed = clock_seed();
  INFO("seed " << seed);
  const std::string cache_dir =
      (std::filesystem::temp_directory_path() / fmt::format("jitattn-threads-{}", seed % 1000000)).string();
  std::filesystem::remove_all(cache_dir);
  Config config = gpu_tests_runtime().config();
  config.cache_dir = cache_dir;
  Runtime runtime(config);
  const std::vector<AttentionShape> shapes = {{1, 150, 230, 4, 2, 64, true, 0.f},
                                              {1, 150, 230, 4, 2, 64, false, 0.f},
                                              {1, 97, 301, 2, 1, 128, true, 0.f},
                                              {1, 97, 301, 2, 1, 128, false, 0.f}};
  std::set<std::string> specs;
  constexpr int kThreads = 8, kCallsPerThread = 3;
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  std::mutex specs_mutex;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      CUstream stream = nullptr;
      try {
        std::mt19937_64 rng(seed + t);
        // A new thread has no current context: the primary one, for its stream.
        detail::current_or_primary_context();
        detail::check_cuda(detail::driver().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        for (int call = 0; call < kCallsPerThread; ++call) {
          Problem problem;
          problem.shape = shapes[(t + call) % shapes.size()];
          const auto& s = problem.shape;
          const Inputs in = make_inputs(problem, rng);
          DeviceTensor out = contiguous_output(problem);
          ForwardOptions options;
          options.causal = s.causal;
          runtime.forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options, stream);
          detail::check_cuda(detail::driver().cuStreamSynchronize(stream), "cuStreamSynchronize");
          const double error = max_abs_error(attention_exact(s, in.q, in.k, in.v).out, out.read());
          if (!(error < 2e-2)) {
            failures[t] += fmt::format("thread {} call {}: max error {:.3g}; ", t, call, error);
          }
          const std::string spec = runtime.spec_for(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr,
                                                    options);
          std::lock_guard<std::mutex> lock(specs_mutex);
          specs.insert(spec);
        }
      } catch (const std::exception& e) {
        failures[t] += e.what();
      }
      if (stream != nullptr) detail::driver().cuStreamDestroy(stream);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::string& failure : failures) CHECK_MESSAGE(failure.empty(), failure);
  // Each kernel the calls planned is in the cache, once.
  size_t entries = 0;
  for (const auto& file : std::filesystem::recursive_directory_iterator(cache_dir)) {
    entries += file.path().extension() == ".entry";
  }
  CHECK(entries == specs.size());
  CHECK(specs.size() >= 2);
  std::filesystem::remove_all(cache_dir);
}

TEST_CASE("a kernel NVRTC rejects fails each call with its log, compiled once") {
  // Threads and calls after the first get the same failure without another
  // compile (which would take seconds each).
  namespace fs = std::filesystem;
  const uint64_t seed = clock_seed();
  const fs::path dir = fs::temp_directory_path() / fmt::format("jitattn-rejected-{}", seed % 1000000);
  fs::remove_all(dir);
  fs::create_directories(dir / "templates");
  for (const auto& entry : detail::embedded_templates()) {
    std::ofstream(dir / "templates" / entry.name, std::ios::binary) << entry.text;
  }
  std::ofstream(dir / "templates" / "entry_fwd.cu", std::ios::app) << "\nthis_is_not_cuda;\n";
  Config config;
  config.cache_dir = (dir / "cache").string();
  config.template_dir = (dir / "templates").string();
  Runtime runtime(config);
  std::mt19937_64 rng(seed);
  Problem problem;
  problem.shape = {1, 64, 64, 2, 2, 64, false, 0.f};
  const Inputs in = make_inputs(problem, rng);
  DeviceTensor out = contiguous_output(problem);
  double seconds[2] = {0, 0};
  for (double& taken : seconds) {
    const auto start = std::chrono::steady_clock::now();
    try {
      runtime.forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, {}, nullptr);
      FAIL("a rejected kernel launched");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::compile_failed);
      CHECK(e.log().find("this_is_not_cuda") != std::string::npos);
    }
    taken = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  INFO("first call " << seconds[0] << " s, second " << seconds[1] << " s");
  CHECK(seconds[1] < seconds[0] / 5);
  for (uint16_t bits : out.raw()) REQUIRE(bits == 0xffff);
  fs::remove_all(dir);
}

TEST_CASE("calls are graph-capturable once warm; compiling during capture is a clear error") {
  const auto& d = detail::driver();
  std::mt19937_64 rng(clock_seed());
  Problem problem;
  problem.shape = {2, 200, 333, 4, 4, 64, true, 0.f};
  const Inputs in = make_inputs(problem, rng);
  DeviceTensor out = contiguous_output(problem);
  ForwardOptions options;
  options.causal = true;
  CUstream stream = nullptr;
  REQUIRE(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  // warm
  gpu_tests_runtime().forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options, stream);
  REQUIRE(d.cuStreamSynchronize(stream) == CUDA_SUCCESS);
  out.buffer.fill_bytes(0xff);

  CUgraph graph = nullptr;
  REQUIRE(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  gpu_tests_runtime().forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options, stream);
  REQUIRE(d.cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  REQUIRE(d.cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS);
  REQUIRE(d.cuGraphLaunch(exec, stream) == CUDA_SUCCESS);
  REQUIRE(d.cuStreamSynchronize(stream) == CUDA_SUCCESS);
  const ReferenceOutput exact = attention_exact(problem.shape, in.q, in.k, in.v);
  CHECK(max_abs_error(exact.out, out.read()) < 2e-2);
  d.cuGraphExecDestroy(exec);
  d.cuGraphDestroy(graph);

  // In the disk cache but not loaded by this runtime: drivers from CUDA 12.3
  // load it during the capture; older ones refuse, with advice.
  {
    Runtime fresh(gpu_tests_runtime().config());
    out.buffer.fill_bytes(0xff);
    REQUIRE(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    if (d.version >= 12030) {
      fresh.forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options, stream);
      CUgraph loaded_in_capture = nullptr;
      REQUIRE(d.cuStreamEndCapture(stream, &loaded_in_capture) == CUDA_SUCCESS);
      CUgraphExec replay = nullptr;
      REQUIRE(d.cuGraphInstantiateWithFlags(&replay, loaded_in_capture, 0) == CUDA_SUCCESS);
      REQUIRE(d.cuGraphLaunch(replay, stream) == CUDA_SUCCESS);
      REQUIRE(d.cuStreamSynchronize(stream) == CUDA_SUCCESS);
      CHECK(max_abs_error(exact.out, out.read()) < 2e-2);
      d.cuGraphExecDestroy(replay);
      d.cuGraphDestroy(loaded_in_capture);
    } else {
      CHECK_THROWS_WITH_AS(
          fresh.forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options, stream),
          doctest::Contains("make the same call once before capture"), Error);
      CUgraph aborted = nullptr;
      d.cuStreamEndCapture(stream, &aborted);
      if (aborted != nullptr) d.cuGraphDestroy(aborted);
    }
  }

  // A spec never compiled in an empty cache: capture must fail with advice.
  const std::string empty_cache = (std::filesystem::temp_directory_path() / fmt::format("jitattn-capture-{}", clock_seed() % 1000000)).string();
  Config config;
  config.cache_dir = empty_cache;
  Runtime cold(config);
  ForwardOptions cold_options;
  cold_options.tiles = {64, 32, 4};
  REQUIRE(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  try {
    cold.forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, cold_options, stream);
    FAIL("compiling during capture did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::graph_capture);
    CHECK(std::string(e.what()).find("warm") != std::string::npos);
  }
  CUgraph aborted = nullptr;
  d.cuStreamEndCapture(stream, &aborted);
  if (aborted != nullptr) d.cuGraphDestroy(aborted);
  d.cuStreamDestroy(stream);
  std::filesystem::remove_all(empty_cache);
}

TEST_CASE("back-to-back calls on one stream read what the previous call wrote (programmatic launches keep order)") {
  // On sm_90+ every kernel is launched as a programmatic dependent of the
  // previous one and waits for it before touching memory. Each call here
  // reads the previous call's output (and, for the KV cache, the row the
  // previous call appended) with no synchronization between them; outputs
  // start as NaN, so a read that ran ahead would show.
  const auto& d = detail::driver();
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  CUstream stream = nullptr;
  REQUIRE(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  const DType dtype = DType::bf16;
  auto tensor = [&](int batch, int rows, int heads, int head_dim, bool random) {
    const int64_t shape[4] = {batch, rows, heads, head_dim};
    int64_t strides[4];
    contiguous_strides(shape, strides);
    if (!random) return std::make_unique<DeviceTensor>(dtype, shape, strides);
    return std::make_unique<DeviceTensor>(random_values(static_cast<size_t>(batch) * rows * heads * head_dim, dtype, rng),
                                          dtype, shape, strides);
  };
  auto check = [&](const AttentionShape& shape, const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                   const DeviceTensor& out, const char* what) {
    const ReferenceOutput exact = gpu_reference(shape, q, k, v, true);
    const double error = max_abs_error(exact.out, out.read());
    CHECK_MESSAGE(error < 2e-2, fmt::format("{}: max error {} (seed {})", what, error, seed));
  };

  SUBCASE("prefill: three chained calls, each long enough to overlap the next launch") {
    const AttentionShape shape = AttentionShape::dense(2, 2048, 2048, 8, 8, 128, true);
    const auto q = tensor(2, 2048, 8, 128, true), k = tensor(2, 2048, 8, 128, true), v = tensor(2, 2048, 8, 128, true);
    const auto out1 = tensor(2, 2048, 8, 128, false), out2 = tensor(2, 2048, 8, 128, false),
               out3 = tensor(2, 2048, 8, 128, false);
    ForwardOptions options;
    options.causal = true;
    for (int round = 0; round < 2; ++round) {  // the first round compiles; the second runs warm, back to back
      for (DeviceTensor* out : {out1.get(), out2.get(), out3.get()}) out->buffer.fill_bytes(0xff);
      gpu_tests_runtime().forward(q->view(), k->view(), v->view(), out1->view(), nullptr, options, stream);
      gpu_tests_runtime().forward(out1->view(), k->view(), v->view(), out2->view(), nullptr, options, stream);
      gpu_tests_runtime().forward(out2->view(), k->view(), v->view(), out3->view(), nullptr, options, stream);
      REQUIRE(d.cuStreamSynchronize(stream) == CUDA_SUCCESS);
    }
    check(shape, *q, *k, *v, *out1, "call 1");
    check(shape, *out1, *k, *v, *out2, "call 2 (q = call 1's output)");
    check(shape, *out2, *k, *v, *out3, "call 3 (q = call 2's output)");
  }

  SUBCASE("kvcache: append + split + combine, then a call reading its output and the appended row") {
    const int batch = 4, cached = 4095, capacity = cached + 1;
    const AttentionShape shape = AttentionShape::dense(batch, 1, capacity, 32, 8, 128, true);
    const auto q = tensor(batch, 1, 32, 128, true), k_new = tensor(batch, 1, 8, 128, true),
               v_new = tensor(batch, 1, 8, 128, true);
    const auto k_cache = tensor(batch, capacity, 8, 128, true), v_cache = tensor(batch, capacity, 8, 128, true);
    const auto out1 = tensor(batch, 1, 32, 128, false), out2 = tensor(batch, 1, 32, 128, false);
    std::vector<int32_t> before(batch, cached), after(batch, capacity);
    DeviceBuffer seqlens_before(batch * 4), seqlens_after(batch * 4);
    seqlens_before.upload(before.data(), batch * 4);
    seqlens_after.upload(after.data(), batch * 4);
    const TensorView k_new_view = k_new->view(), v_new_view = v_new->view();
    KVCacheArgs append_args{k_cache->view(), v_cache->view(),
                            TensorView::contiguous(seqlens_before.get(), DType::i32, {batch})};
    append_args.k_new = &k_new_view;
    append_args.v_new = &v_new_view;
    append_args.num_splits = 3;
    KVCacheArgs read_args{k_cache->view(), v_cache->view(),
                          TensorView::contiguous(seqlens_after.get(), DType::i32, {batch})};
    ForwardOptions options;
    options.causal = true;
    Runtime& runtime = gpu_tests_runtime();
    const size_t bytes =
        std::max(runtime.kvcache_workspace_bytes(q->view(), append_args, out1->view(), nullptr, options),
                 runtime.kvcache_workspace_bytes(out1->view(), read_args, out2->view(), nullptr, options));
    DeviceBuffer workspace(std::max<size_t>(bytes, 256));
    for (int round = 0; round < 2; ++round) {
      out1->buffer.fill_bytes(0xff);
      out2->buffer.fill_bytes(0xff);
      gpu_tests_runtime().forward_kvcache(q->view(), append_args, out1->view(), nullptr, options, workspace.get(),
                                     workspace.bytes(), stream);
      gpu_tests_runtime().forward_kvcache(out1->view(), read_args, out2->view(), nullptr, options, workspace.get(),
                                     workspace.bytes(), stream);
      REQUIRE(d.cuStreamSynchronize(stream) == CUDA_SUCCESS);
    }
    check(shape, *q, *k_cache, *v_cache, *out1, "kvcache call 1 (appends, splits in 3)");
    check(shape, *out1, *k_cache, *v_cache, *out2, "kvcache call 2 (q = call 1's output, reads the appended row)");
  }
  d.cuStreamDestroy(stream);
}

}  // TEST_SUITE
