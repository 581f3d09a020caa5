// The forward kernel's optional features on a GPU: head dims other than
// 64/128, sliding windows, logit softcap and ALiBi, each against the exact and
// the 16-bit references (CPU for small shapes, the GPU reference kernel for
// large ones) with FlashAttention's tolerance rule: max |out − exact| ≤
// 2 × max |out16 − exact| + 1e-5, lse within fp32 rounding, rows that see no
// key exactly 0 with lse -inf. Inputs are fresh random values every run (the
// seed is printed with every failure); outputs are poisoned (0xff) first.
//
// Some machinery here resembles test_gpu_prefill.cpp's (inputs, strides, the
// run): the shared parts live in gpu_support; the rest is kept local so that
// each file stays readable on its own.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu_support.hpp"

using namespace jitattn;
using namespace jitattn::test;

namespace {

enum class Strides { contiguous, padded, heads_major };

void make_strides(Strides kind, const int64_t (&shape)[4], int64_t (&strides)[4]) {
  switch (kind) {
    case Strides::contiguous: contiguous_strides(shape, strides); break;
    case Strides::padded: padded_strides(shape, strides); break;
    case Strides::heads_major: heads_major_strides(shape, strides); break;
  }
}

const char* strides_name(Strides kind) {
  switch (kind) {
    case Strides::contiguous: return "contiguous";
    case Strides::padded: return "padded";
    case Strides::heads_major: return "heads_major";
  }
  return "?";
}

// One kernel check. The features live in `shape` (window, softcap, ALiBi
// slopes); the kernel gets the same values through ForwardOptions.
struct Case {
  AttentionShape shape;
  DType dtype = DType::bf16;
  Strides layout = Strides::contiguous;
  // The slopes tensor is [batch, heads_q] (shape.alibi_slopes then holds
  // batch·heads_q values), else [heads_q].
  bool slopes_per_batch = false;
  // q and k are multiplied by this (and rounded again): larger logits, so a
  // small softcap really bites.
  float gain = 1.f;
  // Judge against the GPU reference kernel (large shapes) instead of the CPU one.
  bool gpu_reference = false;
};

std::string describe(const Case& c, const std::string& spec, uint64_t seed) {
  const auto& s = c.shape;
  std::string slopes = "off";
  if (!s.alibi_slopes.empty()) slopes = c.slopes_per_batch ? "[batch, heads_q]" : "[heads_q]";
  return fmt::format(
      "{} {} batch={} seqlen_q={} seqlen_k={} heads={}/{} head_dim={} head_dim_v={} causal={} window=({}, {}) "
      "chunk={} softcap={} alibi={} sinks={} gain={} layout={} reference={} seed={}",
      spec.empty() ? "(no spec)" : spec, c.dtype == DType::bf16 ? "bf16" : "f16", s.batch, s.seqlen_q, s.seqlen_k,
      s.heads_q, s.heads_kv, s.head_dim, s.value_dim(), s.causal, s.window_left, s.window_right, s.attention_chunk, s.softcap, slopes,
      s.learnable_sink.empty() ? "off" : fmt::format("[{}]", fmt::join(s.learnable_sink, ", ")), c.gain,
      strides_name(c.layout), c.gpu_reference ? "gpu" : "cpu", seed);
}

// Inputs on the device plus their logical values on the host.
struct Inputs {
  std::vector<float> q, k, v;
  std::unique_ptr<DeviceTensor> dq, dk, dv;
  std::unique_ptr<DeviceBuffer> slopes;  // null without ALiBi
  std::unique_ptr<DeviceBuffer> sinks;   // null without learnable sinks
};

std::vector<float> random_scaled(size_t count, DType dtype, float gain, std::mt19937_64& rng) {
  std::vector<float> values = random_values(count, dtype, rng);
  if (gain != 1.f) {
    for (auto& value : values) value = round_to(value * gain, dtype);
  }
  return values;
}

Inputs make_inputs(const Case& c, std::mt19937_64& rng) {
  const auto& s = c.shape;
  const int64_t q_shape[4] = {s.batch, s.seqlen_q, s.heads_q, s.head_dim};
  const int64_t kv_shape[4] = {s.batch, s.seqlen_k, s.heads_kv, s.head_dim};
  const int64_t v_shape[4] = {s.batch, s.seqlen_k, s.heads_kv, s.value_dim()};
  int64_t q_strides[4], kv_strides[4], v_strides[4];
  make_strides(c.layout, q_shape, q_strides);
  make_strides(c.layout, kv_shape, kv_strides);
  make_strides(c.layout, v_shape, v_strides);
  Inputs in;
  in.q = random_scaled(static_cast<size_t>(s.batch) * s.seqlen_q * s.heads_q * s.head_dim, c.dtype, c.gain, rng);
  in.k = random_scaled(static_cast<size_t>(s.batch) * s.seqlen_k * s.heads_kv * s.head_dim, c.dtype, c.gain, rng);
  in.v = random_values(static_cast<size_t>(s.batch) * s.seqlen_k * s.heads_kv * s.value_dim(), c.dtype, rng);
  in.dq = std::make_unique<DeviceTensor>(in.q, c.dtype, q_shape, q_strides);
  in.dk = std::make_unique<DeviceTensor>(in.k, c.dtype, kv_shape, kv_strides);
  in.dv = std::make_unique<DeviceTensor>(in.v, c.dtype, v_shape, v_strides);
  if (!s.alibi_slopes.empty()) {
    in.slopes = std::make_unique<DeviceBuffer>(s.alibi_slopes.size() * 4);
    in.slopes->upload(s.alibi_slopes.data(), s.alibi_slopes.size() * 4);
  }
  if (!s.learnable_sink.empty()) {
    in.sinks = std::make_unique<DeviceBuffer>(s.learnable_sink.size() * 4);
    in.sinks->upload(s.learnable_sink.data(), s.learnable_sink.size() * 4);
  }
  return in;
}

TensorView slopes_view(const Case& c, void* data) {
  if (c.slopes_per_batch) return TensorView::contiguous(data, DType::f32, {c.shape.batch, c.shape.heads_q});
  return TensorView::contiguous(data, DType::f32, {c.shape.heads_q});
}

// The learnable_sink tensor of a case: f32 [heads_q].
TensorView sinks_view(const Case& c, void* data) { return TensorView::contiguous(data, DType::f32, {c.shape.heads_q}); }

ForwardOptions options_for(const Case& c, const TensorView* slopes, const TensorView* sinks) {
  ForwardOptions options;
  options.causal = c.shape.causal;
  options.window_left = c.shape.window_left;
  options.window_right = c.shape.window_right;
  options.attention_chunk = c.shape.attention_chunk;
  options.softcap = c.shape.softcap;
  options.alibi_slopes = slopes;
  options.learnable_sink = sinks;
  if (c.shape.scale > 0.f) options.softmax_scale = c.shape.scale;
  return options;
}

// The spec a case will use, planned on placeholder pointers (planning reads
// no memory); "" when planning rejects it (the run then reports why).
std::string spec_of(const Case& c) {
  const auto& s = c.shape;
  void* placeholder = reinterpret_cast<void*>(uintptr_t{1} << 20);
  const TensorView q = TensorView::contiguous(placeholder, c.dtype, {s.batch, s.seqlen_q, s.heads_q, s.head_dim});
  const TensorView kv = TensorView::contiguous(placeholder, c.dtype, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim});
  const TensorView v = TensorView::contiguous(placeholder, c.dtype, {s.batch, s.seqlen_k, s.heads_kv, s.value_dim()});
  const TensorView out = TensorView::contiguous(placeholder, c.dtype, {s.batch, s.seqlen_q, s.heads_q, s.value_dim()});
  const TensorView lse = TensorView::contiguous(placeholder, DType::f32, {s.batch, s.heads_q, s.seqlen_q});
  const TensorView slopes = slopes_view(c, placeholder);
  const TensorView sinks = sinks_view(c, placeholder);
  try {
    return gpu_tests_runtime().spec_for(q, kv, v, out, &lse,
                                        options_for(c, s.alibi_slopes.empty() ? nullptr : &slopes,
                                                    s.learnable_sink.empty() ? nullptr : &sinks));
  } catch (const std::exception&) {
    return {};
  }
}

struct KernelRun {
  std::vector<float> out;  // logical contiguous [batch, seqlen_q, heads_q, head_dim]
  std::vector<float> lse;
  std::string spec;
  std::string repeat_mismatch;  // launch_repeated: a repeat that read back other bits
};

// Runs jitattn with out and lse poisoned (every byte 0xff) first.
KernelRun run_kernel(const Case& c, const Inputs& in) {
  const auto& s = c.shape;
  const int64_t out_shape[4] = {s.batch, s.seqlen_q, s.heads_q, s.value_dim()};
  int64_t out_strides[4];
  // Output in another layout than the inputs, to exercise its strides.
  make_strides(c.layout == Strides::contiguous ? Strides::heads_major : Strides::contiguous, out_shape, out_strides);
  DeviceTensor out(c.dtype, out_shape, out_strides);
  const size_t lse_count = static_cast<size_t>(s.batch) * s.heads_q * s.seqlen_q;
  DeviceBuffer lse(lse_count * 4);
  const TensorView lse_view = TensorView::contiguous(lse.get(), DType::f32, {s.batch, s.heads_q, s.seqlen_q});
  TensorView slopes, sinks;
  if (in.slopes) slopes = slopes_view(c, in.slopes->get());
  if (in.sinks) sinks = sinks_view(c, in.sinks->get());
  const ForwardOptions options = options_for(c, in.slopes ? &slopes : nullptr, in.sinks ? &sinks : nullptr);
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

// The cases checked in groups (check_in_groups): the kernel against both
// references. Returns, per case, how many rows see no key (so tests can prove
// their coverage).
std::vector<size_t> check_cases(const std::vector<Case>& cases, std::mt19937_64& rng, uint64_t seed) {
  return check_in_groups(
      cases, [&](const Case& c) { return make_inputs(c, rng); },
      [](const Case& c, const Inputs& in) {
        References r;
        if (c.gpu_reference) {
          r.exact = gpu_reference(c.shape, *in.dq, *in.dk, *in.dv, true);
          r.rounded = gpu_reference(c.shape, *in.dq, *in.dk, *in.dv, false);
        } else {
          r.exact = attention_exact(c.shape, in.q, in.k, in.v);
          r.rounded = attention_16bit(c.shape, in.q, in.k, in.v, c.dtype);
        }
        return r;
      },
      [&](const Case& c, const Inputs& in, const References& r) {
        const auto ran = run_case(r, [&] { return describe(c, spec_of(c), seed); }, [&] { return run_kernel(c, in); });
        if (!ran) return;
        const auto& run = *ran;
        const Verdict verdict = judge(c.shape, run.out, run.lse, r.exact, r.rounded);
        CHECK_MESSAGE(verdict.ok(), fmt::format("{}: {}", describe(c, run.spec, seed), verdict.summary()));
        if (!run.repeat_mismatch.empty()) FAIL_CHECK(std::string(describe(c, run.spec, seed) + ": " + run.repeat_mismatch));
      });
}

// Slopes in (0, 1].
std::vector<float> random_slopes(size_t count, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  std::vector<float> slopes(count);
  for (auto& slope : slopes) slope = 1.f - uniform(rng);
  return slopes;
}

// -1 (unbounded) one time in four, else 0..max.
int random_bound(std::mt19937_64& rng, int max) {
  if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) return -1;
  return std::uniform_int_distribution<int>(0, max)(rng);
}

size_t lse_mismatches(const std::vector<double>& want, const std::vector<double>& got, double tolerance) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool ok = std::isinf(want[i]) ? (std::isinf(got[i]) && got[i] < 0)
                                        : std::fabs(got[i] - want[i]) <= tolerance * std::max(1.0, std::fabs(want[i]));
    bad += !ok;
  }
  return bad;
}

const DType kDTypes[] = {DType::f16, DType::bf16};

// A case's (seqlen_q, seqlen_k), and whether the GPU reference judges it
// (lengths a CPU reference would take too long over).
struct Seqlens {
  int q, k;
  bool gpu_reference;
};

}  // namespace

TEST_SUITE("gpu") {

TEST_CASE("the GPU reference kernel agrees with the CPU references with windows, softcap and ALiBi") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  for (DType dtype : kDTypes) {
    Case windowed;  // a two-sided window; head_dim 40
    windowed.dtype = dtype;
    windowed.layout = Strides::padded;
    windowed.shape = AttentionShape::dense(2, 300, 451, 4, 2, 40, false);
    windowed.shape.window_left = 30;
    windowed.shape.window_right = 7;
    cases.push_back(windowed);

    Case everything = windowed;  // causal + left, softcap, per-batch ALiBi
    everything.shape = AttentionShape::dense(2, 300, 451, 4, 2, 128, true);
    everything.shape.window_left = 50;
    everything.shape.softcap = 20.f;
    everything.shape.alibi_slopes = random_slopes(2 * 4, rng);
    everything.slopes_per_batch = true;
    cases.push_back(everything);

    Case sparse;  // seqlen_q > seqlen_k and a narrow window: rows 0..149 see nothing; per-head ALiBi
    sparse.dtype = dtype;
    sparse.layout = Strides::heads_major;
    sparse.shape = AttentionShape::dense(2, 451, 300, 4, 4, 64, false);
    sparse.shape.window_left = 3;
    sparse.shape.window_right = 1;
    sparse.shape.alibi_slopes = random_slopes(4, rng);
    cases.push_back(sparse);

    Case capped;  // a small softcap on large logits, no window
    capped.dtype = dtype;
    capped.shape = AttentionShape::dense(1, 200, 333, 2, 1, 96, false);
    capped.shape.softcap = 5.f;
    capped.gain = 3.f;
    cases.push_back(capped);
  }
  for (const auto& c : cases) {
    const Inputs in = make_inputs(c, rng);
    const ReferenceOutput cpu_exact = attention_exact(c.shape, in.q, in.k, in.v);
    const ReferenceOutput cpu_rounded = attention_16bit(c.shape, in.q, in.k, in.v, c.dtype);
    const ReferenceOutput gpu_exact = gpu_reference(c.shape, *in.dq, *in.dk, *in.dv, true);
    const ReferenceOutput gpu_rounded = gpu_reference(c.shape, *in.dq, *in.dk, *in.dv, false);
    INFO(describe(c, "reference", seed));
    // fp32 against float64: logits (ALiBi biases up to ~450) carry ~1e-5 of
    // rounding; a window edge off by one key moves outputs by ~1e-2.
    CHECK(max_deviation(cpu_exact.out, gpu_exact.out) < 5e-4);
    // lse: fp32 rounding for the exact kernel, 16-bit logit rounding for the
    // rounded one; rows with no visible key -inf in both.
    CHECK(lse_mismatches(cpu_exact.lse, gpu_exact.lse, 2e-4) == 0);
    CHECK(lse_mismatches(cpu_exact.lse, gpu_rounded.lse, 5e-2) == 0);
    // The rounded variants differ only where fp32 sums in another order (or
    // tanhf and tanh) round differently: their errors must be of one size.
    const double cpu_error = max_deviation(cpu_exact.out, cpu_rounded.out);
    const double gpu_error = max_deviation(cpu_exact.out, gpu_rounded.out);
    if (cpu_error == 0) {
      CHECK(gpu_error == 0);
    } else {
      CHECK(gpu_error > 0.25 * cpu_error);
      CHECK(gpu_error < 4 * cpu_error);
    }
  }
}

TEST_CASE("features: every head dim (multiples of 8 up to 256, and 59 and 111), causal and not, GQA/MQA") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const std::vector<std::pair<int, int>> seqlens = {{113, 203}, {128, 217}, {1, 239}, {512, 256}};
  const int kv_heads[] = {6, 2, 1};
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : kDTypes) {
    // 59 and 111 (FlashAttention's test grid): rows start on 2-byte
    // boundaries, read element by element (KernelSpec::unaligned_dim).
    for (int head_dim : {32, 40, 59, 64, 80, 96, 104, 111, 128, 160, 192, 224, 256}) {
      for (bool causal : {false, true}) {
        for (const auto& [seqlen_q, seqlen_k] : seqlens) {
          Case c;
          c.dtype = dtype;
          c.layout = static_cast<Strides>(index / 3 % 3);
          const int batch = seqlen_q * seqlen_k > 100000 ? 1 : 2;  // keeps the CPU references quick
          c.shape = AttentionShape::dense(batch, seqlen_q, seqlen_k, 6, kv_heads[index % 3], head_dim, causal);
          cases.push_back(c);
          ++index;
        }
      }
    }
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  check_cases(cases, rng, seed);
}

TEST_CASE("features: sliding windows, one- and two-sided, with causal, tiny and wider than the sequence") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const Seqlens seqlens[] = {{113, 203, false}, {512, 256, false}, {1024, 1023, true}};
  const std::pair<int, int> fixed[] = {
      {0, 0},        // the aligned key only
      {7, 3},        // far smaller than a tile
      {-1, 5},       // right only
      {40, -1},      // left only
      {100, 50},
      {3000, -1},    // wider than the sequence on the left
      {5000, 5000},  // wider than the sequence: no window at all
  };
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : kDTypes) {
    for (const auto& sl : seqlens) {
      std::vector<std::pair<std::pair<int, int>, bool>> windows;  // ((left, right), causal)
      for (const auto& w : fixed) windows.push_back({w, false});
      for (int r = 0; r < 2; ++r) windows.push_back({{random_bound(rng, 300), random_bound(rng, 300)}, false});
      for (int left : {0, 31, 200}) windows.push_back({{left, -1}, true});  // causal + left
      for (const auto& [window, causal] : windows) {
        Case c;
        c.dtype = dtype;
        c.layout = static_cast<Strides>(index / 3 % 3);
        c.gpu_reference = sl.gpu_reference;
        const int head_dims[] = {64, 128, 96};
        c.shape = AttentionShape::dense(sl.q == 512 ? 1 : 2, sl.q, sl.k, 4, index % 2 == 0 ? 2 : 4, head_dims[index % 3], causal);
        c.shape.window_left = window.first;
        c.shape.window_right = window.second;
        cases.push_back(c);
        ++index;
      }
    }
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  const std::vector<size_t> empty = check_cases(cases, rng, seed);
  size_t empty_rows = 0;  // in the (512, 256) cases
  for (size_t i = 0; i < cases.size(); ++i) empty_rows += cases[i].shape.seqlen_q == 512 ? empty[i] : 0;
  CHECK_MESSAGE(empty_rows > 0, "the (512, 256) cases were meant to include rows that see no key");
}

TEST_CASE("features: attention_chunk (FlashAttention 3's chunked local attention), with causal and windows") {
  // Each row sees only keys of its own chunk of c keys, counted from key 0
  // along the bottom-right-aligned diagonal; chunks smaller than a tile and
  // larger, not dividing the tiles (100, 333), of one key, and wider than
  // the sequence; queries before the first key ((512, 256)) in chunk -1.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const Seqlens seqlens[] = {{113, 203, false}, {512, 256, false}, {3, 799, false}, {1024, 1023, true}, {2048, 2048, true}};
  const int chunks[] = {1, 7, 64, 100, 128, 333, 1024, 5000};
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : kDTypes) {
    for (const auto& sl : seqlens) {
      for (int variant = 0; variant < 4; ++variant) {
        Case c;
        c.dtype = dtype;
        c.layout = static_cast<Strides>(index % 3);
        c.gpu_reference = sl.gpu_reference;
        const int head_dims[] = {64, 128, 96};
        const bool causal = variant != 1;
        c.shape = AttentionShape::dense(sl.q >= 512 ? 1 : 2, sl.q, sl.k, 4, index % 2 == 0 ? 2 : 1, head_dims[index % 3],
                                        causal);
        c.shape.attention_chunk = chunks[index % 8];
        if (variant == 2) c.shape.window_left = 50;  // causal + left: the tighter bound wins per row
        if (variant == 3) c.shape.window_left = 300, c.shape.causal = false, c.shape.window_right = 20;
        cases.push_back(c);
        ++index;
      }
    }
    // Llama 4's shape: causal chunks of 8192 over 16k tokens would not fit a
    // CPU reference; 1024-key chunks over 4096 at head dim 128, GQA 8/2.
    Case llama;
    llama.dtype = dtype;
    llama.gpu_reference = true;
    llama.shape = AttentionShape::dense(1, 4096, 4096, 8, 2, 128, true);
    llama.shape.attention_chunk = 1024;
    cases.push_back(llama);
  }
  // The chunks do bite: without them the same inputs give other outputs.
  {
    const Case& c = cases[1];  // (113, 203), chunk 7
    const Inputs in = make_inputs(c, rng);
    AttentionShape whole = c.shape;
    whole.attention_chunk = 0;
    CHECK_MESSAGE(max_deviation(attention_exact(whole, in.q, in.k, in.v).out,
                                attention_exact(c.shape, in.q, in.k, in.v).out) > 0.05,
                  describe(c, "chunk sanity", seed));
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  for (const Case& c : cases) {
    const std::string spec = spec_of(c);
    CHECK_MESSAGE(spec.find(".local.chunk") != std::string::npos, describe(c, spec, seed));
  }
  const std::vector<size_t> empty = check_cases(cases, rng, seed);
  size_t empty_rows = 0;  // the (512, 256) cases' queries before the first key
  for (size_t i = 0; i < cases.size(); ++i) empty_rows += cases[i].shape.seqlen_q == 512 ? empty[i] : 0;
  CHECK_MESSAGE(empty_rows > 0, "the (512, 256) cases were meant to include rows that see no key");
}

TEST_CASE("features: learnable_sink (gpt-oss's attention sinks) with every mask, softcap, ALiBi, GQA, every kernel family") {
  // One more softmax column per query head, of the head's sink logit and no
  // value: it lowers every output of the row and raises its lse; a row that
  // sees no key (causal with seqlen_q > seqlen_k) writes 0 with lse = the
  // sink. Head 0's sink outweighs the scores (random_sinks), and head 1's
  // is -inf (no sink) where there are four heads or more.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const Seqlens seqlens[] = {{113, 203, false}, {512, 256, false}, {3, 799, false}, {1024, 1023, true}};
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : kDTypes) {
    for (const auto& sl : seqlens) {
      for (int variant = 0; variant < 4; ++variant) {
        Case c;
        c.dtype = dtype;
        c.layout = static_cast<Strides>(index % 3);
        c.gpu_reference = sl.gpu_reference;
        const int head_dims[] = {64, 128, 40, 256};
        const int heads_kv[] = {8, 2, 1};
        c.shape = AttentionShape::dense(sl.q >= 512 ? 1 : 2, sl.q, sl.k, 8, heads_kv[index % 3], head_dims[index % 4],
                                        variant != 0);
        if (variant == 2) c.shape.window_left = 127;  // gpt-oss's sliding layers: causal, 128 keys
        if (variant == 3) c.shape.attention_chunk = 100;
        if (index % 3 == 1) c.shape.softcap = 30.f;
        if (index % 5 == 2) c.shape.alibi_slopes = random_slopes(8, rng);
        c.shape.learnable_sink = random_sinks(8, rng);
        cases.push_back(c);
        ++index;
      }
    }
    // Long calls on the wgmma tiles, ordinary and persistent grids (the
    // latter's producer copies the output out), 192-row tiles at head dim 64.
    for (int head_dim : {64, 128}) {
      for (int batch : {1, 4}) {
        Case c;
        c.dtype = dtype;
        c.gpu_reference = true;
        c.shape = AttentionShape::dense(batch, 2048, 2048, 8, 2, head_dim, true);
        if (batch == 1) c.shape.window_left = 127;
        c.shape.learnable_sink = random_sinks(8, rng);
        cases.push_back(c);
      }
    }
  }
  // The sinks do bite: without them the same inputs give other outputs.
  {
    const Case& c = cases[1];
    const Inputs in = make_inputs(c, rng);
    AttentionShape plain = c.shape;
    plain.learnable_sink.clear();
    CHECK_MESSAGE(max_deviation(attention_exact(plain, in.q, in.k, in.v).out,
                                attention_exact(c.shape, in.q, in.k, in.v).out) > 0.05,
                  describe(c, "sink sanity", seed));
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  bool mma_sync = false, wgmma = false, persistent = false;
  for (const Case& c : cases) {
    const std::string spec = spec_of(c);
    CHECK_MESSAGE(spec.find(".sink") != std::string::npos, describe(c, spec, seed));
    persistent = persistent || spec.find(".persistent") != std::string::npos;
    wgmma = wgmma || (spec.find(".wgmma") != std::string::npos && spec.find(".persistent") == std::string::npos);
    mma_sync = mma_sync || spec.find(".wgmma") == std::string::npos;
  }
  CHECK(mma_sync);
  CHECK(wgmma);
  CHECK(persistent);
  check_cases(cases, rng, seed);
  // The (512, 256) causal cases' first 256 rows see no key.
  size_t empty_rows = 0;
  for (const Case& c : cases) {
    if (c.shape.seqlen_q != 512 || !c.shape.causal) continue;
    for (int i = 0; i < c.shape.seqlen_q; ++i) {
      const auto [first, last] = c.shape.visible_keys(i);
      empty_rows += first == last;
    }
  }
  CHECK_MESSAGE(empty_rows > 0, "the (512, 256) causal cases were meant to include rows that see no key");
}

TEST_CASE("features: a value head dim of its own (FlashAttention 3's hdim_v, DeepSeek's 192/128), the planner's kernels") {
  // V and out narrower than q and k, on whatever the planner takes: short
  // calls on the 4-warp kernels, long ones on wgmma tiles (persistent at
  // head dim 128 and below), one query row on the prefill kernels (the
  // decode kernel's V is head_dim wide); masks, softcap, ALiBi, sinks, GQA,
  // strided layouts, and q/k head dims that run padded (160 on 192).
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  struct Dims {
    int head_dim, head_dim_v;
  };
  const Dims dims[] = {{192, 128}, {128, 64}, {64, 32}, {256, 128}, {160, 128}, {96, 64}, {256, 192}, {128, 96}};
  const Seqlens seqlens[] = {{113, 203, false}, {1, 239, false}, {512, 256, false}, {2048, 2048, true},
                             {1024, 1023, true}};
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : kDTypes) {
    for (const auto& sl : seqlens) {
      for (int variant = 0; variant < 4; ++variant, ++index) {
        const Dims& d = dims[index % 8];
        Case c;
        c.dtype = dtype;
        c.layout = static_cast<Strides>(index % 3);
        c.gpu_reference = sl.gpu_reference;
        const int heads_kv[] = {16, 4, 1};
        c.shape = AttentionShape::dense(2, sl.q, sl.k, 16, heads_kv[index % 3], d.head_dim,
                                        variant != 1);
        c.shape.head_dim_v = d.head_dim_v;
        if (variant == 2) c.shape.window_left = 200;
        if (index % 5 == 1) c.shape.softcap = 30.f;
        if (index % 7 == 3) c.shape.alibi_slopes = random_slopes(16, rng);
        if (index % 4 == 3) c.shape.learnable_sink = random_sinks(16, rng);
        cases.push_back(c);
      }
    }
  }
  warm_cases(cases, spec_of);
  bool mma_sync = false, wgmma = false, persistent = false, padded = false;
  for (const Case& c : cases) {
    const std::string spec = spec_of(c);
    CHECK_MESSAGE(spec.find(fmt::format(".dv{}", c.shape.head_dim_v)) != std::string::npos, describe(c, spec, seed));
    persistent = persistent || spec.find(".persistent") != std::string::npos;
    wgmma = wgmma || (spec.find(".wgmma") != std::string::npos && spec.find(".persistent") == std::string::npos);
    mma_sync = mma_sync || spec.find(".wgmma") == std::string::npos;
    padded = padded || spec.find(".padded") != std::string::npos;
  }
  CHECK(mma_sync);
  if (current_arch() == "sm_90a") {
    CHECK(wgmma);
    CHECK(persistent);
  }
  CHECK(padded);
  check_cases(cases, rng, seed);
}

TEST_CASE("features: softcap 50, and softcap 5 on large logits, causal and not") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  struct Cap {
    float softcap, gain;
  };
  const Cap caps[] = {{50.f, 1.f}, {5.f, 3.f}};
  const std::pair<int, int> seqlens[] = {{113, 203}, {1, 239}, {512, 256}};
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : kDTypes) {
    for (const auto& cap : caps) {
      for (bool causal : {false, true}) {
        for (const auto& [seqlen_q, seqlen_k] : seqlens) {
          Case c;
          c.dtype = dtype;
          c.layout = static_cast<Strides>(index % 3);
          c.gain = cap.gain;
          c.shape = AttentionShape::dense(seqlen_q == 512 ? 1 : 2, seqlen_q, seqlen_k, 4, 2, index % 2 == 0 ? 64 : 128, causal);
          c.shape.softcap = cap.softcap;
          cases.push_back(c);
          ++index;
        }
      }
    }
  }
  // The small cap does bite: without it the same inputs give other outputs.
  {
    const Case& c = *std::find_if(cases.begin(), cases.end(), [](const Case& candidate) {
      return candidate.shape.softcap == 5.f && candidate.shape.seqlen_q == 113;
    });
    const Inputs in = make_inputs(c, rng);
    const ReferenceOutput capped = attention_exact(c.shape, in.q, in.k, in.v);
    AttentionShape uncapped_shape = c.shape;
    uncapped_shape.softcap = 0.f;
    const ReferenceOutput uncapped = attention_exact(uncapped_shape, in.q, in.k, in.v);
    CHECK_MESSAGE(max_deviation(uncapped.out, capped.out) > 0.1, describe(c, "softcap sanity", seed));
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  check_cases(cases, rng, seed);
}

TEST_CASE("features: ALiBi slopes per head and per batch x head, causal and not, with a window") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const std::pair<int, int> seqlens[] = {{113, 203}, {128, 217}, {1, 239}};
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : kDTypes) {
    for (bool per_batch : {false, true}) {
      for (bool causal : {false, true}) {
        for (bool windowed : {false, true}) {
          const auto& [seqlen_q, seqlen_k] = seqlens[index % 3];
          Case c;
          c.dtype = dtype;
          c.layout = static_cast<Strides>(index / 3 % 3);
          c.shape = AttentionShape::dense(2, seqlen_q, seqlen_k, 6, 2, index % 2 == 0 ? 64 : 128, causal);
          if (windowed) {
            c.shape.window_left = causal ? 40 : 50;
            c.shape.window_right = causal ? -1 : 20;
          }
          c.slopes_per_batch = per_batch;
          c.shape.alibi_slopes = random_slopes(per_batch ? 2 * 6 : 6, rng);
          cases.push_back(c);
          ++index;
        }
      }
    }
    // Everything at once on a large problem, judged by the GPU reference.
    Case all;
    all.dtype = dtype;
    all.layout = Strides::padded;
    all.gpu_reference = true;
    all.shape = AttentionShape::dense(2, 1024, 1023, 8, 2, 128, true);
    all.shape.window_left = 64;
    all.shape.softcap = 30.f;
    all.slopes_per_batch = true;
    all.shape.alibi_slopes = random_slopes(2 * 8, rng);
    cases.push_back(all);
  }
  warm_cases(cases, spec_of);  // every kernel up front, in parallel
  check_cases(cases, rng, seed);
}

TEST_CASE("features: a rejected call writes nothing") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  INFO("seed=", seed);
  const DType dtype = DType::bf16;

  // head_dim 264 (any head dim up to 256 runs): rows padded to 272 elements
  // so only head_dim itself is wrong.
  {
    const int64_t shape[4] = {1, 64, 2, 264};
    const int64_t strides[4] = {64 * 2 * 272, 2 * 272, 272, 1};
    DeviceTensor q(random_values(64 * 2 * 264, dtype, rng), dtype, shape, strides);
    DeviceTensor k(random_values(64 * 2 * 264, dtype, rng), dtype, shape, strides);
    DeviceTensor v(random_values(64 * 2 * 264, dtype, rng), dtype, shape, strides);
    DeviceTensor out(dtype, shape, strides);
    DeviceBuffer lse(64 * 2 * 4);
    lse.fill_bytes(0xff);
    const TensorView lse_view = TensorView::contiguous(lse.get(), DType::f32, {1, 2, 64});
    CHECK_THROWS_WITH_AS(gpu_tests_runtime().forward(q.view(), k.view(), v.view(), out.view(), &lse_view, {}, nullptr),
                         doctest::Contains("head_dim=264 is above the largest supported, 256"), Error);
    for (uint16_t bits : out.raw()) REQUIRE(bits == 0xffff);
    std::vector<uint32_t> lse_bits(64 * 2);
    lse.download(lse_bits.data(), lse_bits.size() * 4);
    for (uint32_t bits : lse_bits) REQUIRE(bits == 0xffffffffu);
  }

  // Valid tensors, invalid options.
  Case c;
  c.dtype = dtype;
  c.shape = AttentionShape::dense(2, 64, 80, 6, 2, 64, false);
  const Inputs in = make_inputs(c, rng);
  const int64_t q_shape[4] = {2, 64, 6, 64};
  int64_t strides[4];
  contiguous_strides(q_shape, strides);
  DeviceTensor out(dtype, q_shape, strides);
  DeviceBuffer lse(2 * 6 * 64 * 4);
  lse.fill_bytes(0xff);
  const TensorView lse_view = TensorView::contiguous(lse.get(), DType::f32, {2, 6, 64});
  DeviceBuffer slopes(2 * 6 * 4);
  const std::vector<float> slope_values = random_slopes(2 * 6, rng);
  slopes.upload(slope_values.data(), slope_values.size() * 4);

  auto expect_rejected = [&](const ForwardOptions& options, const std::string& fragment) {
    INFO("expected an error containing: ", fragment);
    CHECK_THROWS_WITH_AS(gpu_tests_runtime().forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), &lse_view,
                                                     options, nullptr),
                         doctest::Contains(fragment.c_str()), Error);
    size_t written = 0;
    for (uint16_t bits : out.raw()) written += bits != 0xffff;
    std::vector<uint32_t> lse_bits(2 * 6 * 64);
    lse.download(lse_bits.data(), lse_bits.size() * 4);
    for (uint32_t bits : lse_bits) written += bits != 0xffffffffu;
    CHECK_MESSAGE(written == 0, fmt::format("{} output/lse elements written by a rejected call", written));
  };

  ForwardOptions left;
  left.window_left = -2;
  expect_rejected(left, "options.window_left=-2 must be -1 (unbounded) or >= 0");
  ForwardOptions right;
  right.window_right = -2;
  expect_rejected(right, "window_right");
  ForwardOptions cap;
  cap.softcap = -1.f;
  expect_rejected(cap, "options.softcap=-1 must be >= 0");
  ForwardOptions chunk;
  chunk.attention_chunk = -4;
  expect_rejected(chunk, "options.attention_chunk=-4 must be >= 0 (0 = off)");
  const TensorView sinks_per_batch = TensorView::contiguous(slopes.get(), DType::f32, {2, 6});  // must be [heads_q]
  const TensorView sinks_too_few = TensorView::contiguous(slopes.get(), DType::f32, {2});
  for (const TensorView* bad : {&sinks_per_batch, &sinks_too_few}) {
    ForwardOptions options;
    options.learnable_sink = bad;
    expect_rejected(options, "learnable_sink: shape");
  }

  const TensorView too_many = TensorView::contiguous(slopes.get(), DType::f32, {7});            // heads_q is 6
  const TensorView wrong_batch = TensorView::contiguous(slopes.get(), DType::f32, {1, 6});      // batch is 2
  const TensorView wrong_heads = TensorView::contiguous(slopes.get(), DType::f32, {2, 3});      // heads_q is 6
  const TensorView wrong_dtype = TensorView::contiguous(slopes.get(), DType::f16, {6});         // must be f32
  const TensorView three_dims = TensorView::contiguous(slopes.get(), DType::f32, {2, 1, 6});
  for (const TensorView* bad : {&too_many, &wrong_batch, &wrong_heads, &wrong_dtype, &three_dims}) {
    ForwardOptions options;
    options.alibi_slopes = bad;
    expect_rejected(options, "alibi_slopes: ");
  }

  // And the same call with valid options does write (the poison was live).
  ForwardOptions fine;
  const TensorView valid = TensorView::contiguous(slopes.get(), DType::f32, {2, 6});
  fine.alibi_slopes = &valid;
  gpu_tests_runtime().forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), &lse_view, fine, nullptr);
  size_t still_poisoned = 0;
  for (uint16_t bits : out.raw()) still_poisoned += bits == 0xffff;
  CHECK(still_poisoned == 0);
}

}  // TEST_SUITE
