// Host-side costs of the JIT path.
//   jitattn_bench_host compile [ARCH [SPEC...]]   cold NVRTC compile time and ptxas resources of each
//                                                  default-set kernel, or of the given specs (no GPU needed)
//   jitattn_bench_host first-call       first forward call in this process (disk cache as configured)
//   jitattn_bench_host overhead [N]     host µs per cached call: jitattn::forward vs a bare cuLaunchKernel
//   jitattn_bench_host plan [N]         host µs to plan typical calls for an H100/H200 (sm_90a, 132 SMs): what
//                                       every cached call pays before its launches (no GPU needed)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <jitattn/jitattn.hpp>

#include <cstdlib>

#include "compile.hpp"
#include "driver.hpp"
#include "kernels.hpp"
#include "plan.hpp"
#include "render.hpp"

using namespace jitattn;
using namespace jitattn::detail;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point start) { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); }

// First integer after `label` in ptxas' report (e.g. "Used " → registers).
int report_value(const std::string& log, const std::string& before, const std::string& after) {
  const size_t end = log.find(after);
  if (end == std::string::npos) return -1;
  const size_t start = log.rfind(before, end);
  return start == std::string::npos ? -1 : std::atoi(log.c_str() + start + before.size());
}

// Cold compile of every kernel the planner can pick by default, with ptxas'
// resource report (registers, spill bytes) for each.
// Specs given on the command line replace the default set.
int bench_compile(const std::string& arch_text, const std::vector<std::string>& spec_texts) {
  const Arch arch = Arch::parse(arch_text);
  std::vector<KernelSpec> specs;
  for (const auto& text : spec_texts) specs.push_back(KernelSpec::parse(text));
  if (specs.empty()) {
    for (DType dtype : {DType::f16, DType::bf16})
      for (int head_dim : {64, 128})
        for (bool causal : {false, true})
          for (const TileConfig& t : default_tile_set(dtype, head_dim, causal, arch)) {
            KernelSpec spec{Family::fwd, dtype, head_dim};
            spec.causal = causal;
            apply_tiles(spec, t);
            specs.push_back(spec);
          }
  }
  // JITATTN_TEMPLATE_DIR, as for the runtime: compare template variants.
  const char* template_dir = std::getenv("JITATTN_TEMPLATE_DIR");
  const TemplateSet templates(template_dir != nullptr ? template_dir : "");
  const bool whole_log = std::getenv("JITATTN_BENCH_LOG") != nullptr;
  fmt::print("{:<40} {:>8} {:>10} {:>10} {:>12}\n", "spec", "seconds", "cubin KiB", "registers", "spill bytes");
  for (const KernelSpec& spec : specs) {
    const auto start = Clock::now();
    const CompileOutput out = compile_cubin(render(spec, templates), spec.text() + ".cu", arch, spec.text());
    fmt::print("{:<40} {:>8.2f} {:>10.1f} {:>10} {:>12}\n", spec.text(), ms_since(start) / 1000,
               out.cubin.size() / 1024.0, report_value(out.log, "Used ", " registers"),
               report_value(out.log, "frame, ", " bytes spill stores"));
    // ptxas' warnings, e.g. wgmma instructions it had to serialize (the
    // whole log with JITATTN_BENCH_LOG set).
    size_t line_start = 0;
    while (line_start < out.log.size()) {
      const size_t line_end = std::min(out.log.find('\n', line_start), out.log.size());
      const std::string line = out.log.substr(line_start, line_end - line_start);
      if (line.find("arning") != std::string::npos || whole_log) {
        fmt::print("  {}\n", line);
      }
      line_start = line_end + 1;
    }
  }
  return 0;
}

// A small problem whose kernel is short, so launch costs dominate.
struct SmallProblem {
  CUdeviceptr q = 0, k = 0, v = 0, o = 0;
  TensorView qv, kv, vv, ov;
  SmallProblem() {
    const auto& d = driver();
    const size_t bytes = 1 * 128 * 2 * 64 * 2;
    for (CUdeviceptr* p : {&q, &k, &v, &o}) {
      check_cuda(d.cuMemAlloc(p, bytes), "cuMemAlloc");
      check_cuda(d.cuMemsetD8(*p, 0x3c, bytes), "cuMemsetD8");  // 0x3c3c: a finite f16 value
    }
    qv = TensorView::contiguous(reinterpret_cast<void*>(q), DType::f16, {1, 128, 2, 64});
    kv = TensorView::contiguous(reinterpret_cast<void*>(k), DType::f16, {1, 128, 2, 64});
    vv = TensorView::contiguous(reinterpret_cast<void*>(v), DType::f16, {1, 128, 2, 64});
    ov = TensorView::contiguous(reinterpret_cast<void*>(o), DType::f16, {1, 128, 2, 64});
  }
};

int bench_first_call() {
  auto start = Clock::now();
  current_or_primary_context();
  const double context_ms = ms_since(start);
  SmallProblem problem;
  start = Clock::now();
  forward(problem.qv, problem.kv, problem.vv, problem.ov);
  check_cuda(driver().cuCtxSynchronize(), "cuCtxSynchronize");
  const double first_ms = ms_since(start);
  start = Clock::now();
  forward(problem.qv, problem.kv, problem.vv, problem.ov);
  check_cuda(driver().cuCtxSynchronize(), "cuCtxSynchronize");
  fmt::print("context creation {:.1f} ms; first call {:.2f} ms; second call {:.3f} ms (each including the kernel and a sync)\n",
             context_ms, first_ms, ms_since(start));
  return 0;
}

int bench_overhead(int calls) {
  current_or_primary_context();
  const auto& d = driver();
  SmallProblem problem;
  forward(problem.qv, problem.kv, problem.vv, problem.ov);  // warm
  // The same kernel and arguments, launched directly.
  CUdevice device;
  int major = 0, minor = 0, smem = 0, sm_count = 0;
  d.cuCtxGetDevice(&device);
  d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  d.cuDeviceGetAttribute(&smem, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device);
  d.cuDeviceGetAttribute(&sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
  const Arch arch = Arch::for_device(major, minor);
  ForwardPlan plan = plan_forward(problem.qv, problem.kv, problem.vv, problem.ov, nullptr, {}, arch, smem, sm_count);
  KernelBuilder builder(TemplateSet(), std::make_unique<FileCache>(Config::from_env().cache_dir));
  const BuiltKernel built = builder.build(plan.spec, arch);
  CUmodule module;
  CUfunction function;
  check_cuda(d.cuModuleLoadData(&module, built.entry.cubin.data()), "cuModuleLoadData");
  check_cuda(d.cuModuleGetFunction(&function, module, entry_name(plan.spec)), "cuModuleGetFunction");
  check_cuda(d.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(plan.spec.smem_bytes())), "attr");
  void* args[] = {&plan.params};

  // Batches of 100 launches then a sync, so the launch queue never fills and
  // blocks the host; the median batch is reported.
  auto time_batches = [&](auto&& launch) {
    std::vector<double> per_call;
    for (int batch = 0; batch < calls / 100; ++batch) {
      check_cuda(d.cuCtxSynchronize(), "sync");
      const auto start = Clock::now();
      for (int i = 0; i < 100; ++i) launch();
      per_call.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / 100);
    }
    check_cuda(d.cuCtxSynchronize(), "sync");
    std::sort(per_call.begin(), per_call.end());
    return per_call[per_call.size() / 2];
  };
  const double raw = time_batches([&] {
    check_cuda(d.cuLaunchKernel(function, plan.grid, 1, 1, plan.spec.threads(), 1, 1, unsigned(plan.spec.smem_bytes()),
                                nullptr, args, nullptr), "cuLaunchKernel");
  });
  const double full = time_batches([&] { forward(problem.qv, problem.kv, problem.vv, problem.ov); });
  const double raw_again = time_batches([&] {
    check_cuda(d.cuLaunchKernel(function, plan.grid, 1, 1, plan.spec.threads(), 1, 1, unsigned(plan.spec.smem_bytes()),
                                nullptr, args, nullptr), "cuLaunchKernel");
  });
  fmt::print("host time per call over {} calls (median of batches of 100):\n", calls);
  fmt::print("  cuLaunchKernel alone: {:.2f} µs (again: {:.2f} µs)\n", raw, raw_again);
  fmt::print("  jitattn::forward:     {:.2f} µs\n", full);
  fmt::print("  jitattn overhead:     {:.2f} µs per call\n", full - std::min(raw, raw_again));
  // The same call on wgmma tiles (sm_90a) reads K and V by tensor copies:
  // every call also encodes their two tensor maps (cuTensorMapEncodeTiled).
  if (arch.major == 9 && arch.minor == 0 && arch.arch_specific) {
    ForwardOptions tensor_copies;
    tensor_copies.tiles = {128, 128, 8, 2, true};
    forward(problem.qv, problem.kv, problem.vv, problem.ov, nullptr, tensor_copies);  // warm
    const std::string spec = plan_forward(problem.qv, problem.kv, problem.vv, problem.ov, nullptr, tensor_copies, arch,
                                          smem, sm_count).spec.text();
    const double mapped =
        time_batches([&] { forward(problem.qv, problem.kv, problem.vv, problem.ov, nullptr, tensor_copies); });
    fmt::print("  jitattn::forward, {} (two tensor maps encoded per call): {:.2f} µs\n", spec, mapped);
  }
  return 0;
}

// Planning alone, for the calls an inference engine makes most: the plan is
// what a cached call computes before its launches (plus the registry lookup
// and, for tensor copies, encoding the maps). Pointers are placeholders:
// planning reads no device memory.
int bench_plan(int calls) {
  const Arch arch = Arch::parse("sm_90a");
  const int smem = 232448, sm_count = 132;
  char* const base = reinterpret_cast<char*>(uintptr_t{1} << 30);
  auto dense = [&](std::initializer_list<int64_t> shape) { return TensorView::contiguous(base, DType::bf16, shape); };
  auto ints = [&](std::initializer_list<int64_t> shape) { return TensorView::contiguous(base, DType::i32, shape); };
  void* const workspace = base;
  const size_t workspace_bytes = size_t{1} << 32;
  ForwardOptions causal;
  causal.causal = true;

  // Prefill: 2 × 2048 tokens, 32 / 8 heads, d128.
  const TensorView q_prefill = dense({2, 2048, 32, 128}), kv_prefill = dense({2, 2048, 8, 128});
  // Decoding: batch 16, one token, a paged cache of 32k keys a sequence (pages of 64).
  const TensorView q_decode = dense({16, 1, 32, 128}), pages = dense({16 * 512, 64, 8, 128});
  const TensorView block_table = ints({16, 512}), cache_seqlens = ints({16});
  KVCacheArgs cache;
  cache.k_cache = pages;
  cache.v_cache = pages;
  cache.cache_seqlens = cache_seqlens;
  cache.block_table = &block_table;
  cache.max_seqlen_k = 32768;
  // An engine step: 15 decoding sequences beside a 512-token chunk, packed
  // queries, keys in pages of 64.
  const TensorView q_step = dense({527, 32, 128}), step_pages = dense({2048, 64, 8, 128});
  const TensorView step_table = ints({16, 128}), cu_q = ints({17}), used_k = ints({16});
  VarlenArgs step;
  step.cu_seqlens_q = cu_q;
  step.seqused_k = &used_k;
  step.block_table = &step_table;
  step.max_seqlen_q = 512;
  step.max_seqlen_k = 8192;

  struct Timed {
    const char* what;
    std::function<std::string()> plan;
  };
  const std::vector<Timed> timed = {
      {"dense prefill 2 x 2048, 32/8 heads, d128, causal",
       [&] { return plan_forward(q_prefill, kv_prefill, kv_prefill, q_prefill, nullptr, causal, arch, smem, sm_count).spec.text(); }},
      {"dense prefill, with a workspace (may split)",
       [&] {
         return plan_forward_split(q_prefill, kv_prefill, kv_prefill, q_prefill, nullptr, causal, workspace,
                                   workspace_bytes, false, arch, smem, sm_count).attention.spec.text();
       }},
      {"decode: batch 16 over 32k keys in pages of 64, split",
       [&] {
         return plan_kvcache(q_decode, cache, q_decode, nullptr, causal, workspace, workspace_bytes, false, arch, smem,
                             sm_count).attention.spec.text();
       }},
      {"engine step: 15 x 1 token + 1 x 512 over pages, split",
       [&] {
         return plan_forward_varlen_split(q_step, step_pages, step_pages, q_step, nullptr, step, causal, workspace,
                                          workspace_bytes, false, arch, smem, sm_count).attention.spec.text();
       }},
  };
  fmt::print("host time to plan a call (median of batches of 100, {} calls each; sm_90a, 132 SMs):\n", calls);
  for (const Timed& t : timed) {
    const std::string spec = t.plan();
    std::vector<double> per_call;
    for (int batch = 0; batch < std::max(1, calls / 100); ++batch) {
      const auto start = Clock::now();
      for (int i = 0; i < 100; ++i) t.plan();
      per_call.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / 100);
    }
    std::sort(per_call.begin(), per_call.end());
    fmt::print("  {:<52} {:6.2f} µs  ({})\n", t.what, per_call[per_call.size() / 2], spec);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "compile") {
      return bench_compile(argc > 2 ? argv[2] : "sm_90a", std::vector<std::string>(argv + std::min(argc, 3), argv + argc));
    }
    if (mode == "first-call") return bench_first_call();
    if (mode == "overhead") return bench_overhead(argc > 2 ? std::atoi(argv[2]) : 10000);
    if (mode == "plan") return bench_plan(argc > 2 ? std::atoi(argv[2]) : 10000);
  } catch (const std::exception& e) {
    fmt::print(stderr, "jitattn_bench_host: {}\n", e.what());
    return 1;
  }
  fmt::print(stderr, "usage: jitattn_bench_host compile [ARCH [SPEC...]] | first-call | overhead [CALLS] | plan [CALLS]\n");
  return 2;
}
