// Prefill throughput on the GPU.md grid: head_dim 64 and 128, causal and not,
// seqlen 512 … 16k with batch × seqlen = 16384 and heads = 2048 / head_dim.
// TFLOP/s = 4·B·H·N²·D / time (halved when causal); CUDA events, warm-up,
// median of the timed calls. With --tiles all every tile configuration is
// timed (used to choose the planner's defaults). With --varlen the same
// tokens go through forward_varlen as packed sequences whose odd-numbered
// ones are 37 tokens shorter (their last blocks end mid-block), and
// TFLOP/s counts each sequence's own N².
//
//   jitattn_bench_prefill [--dtype bf16|f16|both] [--tiles default|all|BQxBKVxW,...] [--varlen] [--iters N] [--json FILE]
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <jitattn/jitattn.hpp>

#include "driver.hpp"
#include "plan.hpp"
#include "spec.hpp"

using namespace jitattn;
using namespace jitattn::detail;

namespace {

constexpr int64_t kTokens = 16384;   // batch × seqlen
constexpr int64_t kModelDim = 2048;  // heads × head_dim

struct Options {
  std::vector<DType> dtypes = {DType::bf16, DType::f16};
  std::string tiles = "default";
  int iters = 20;
  bool varlen = false;
  std::string json_path;
};

// Sequence lengths of a --varlen call: batch sequences of about n tokens.
std::vector<int> varlen_lengths(int64_t batch, int64_t n) {
  std::vector<int> lengths;
  for (int64_t b = 0; b < batch; ++b) lengths.push_back(static_cast<int>(b % 2 == 1 || batch == 1 ? n - 37 : n));
  return lengths;
}

std::vector<TileConfig> tile_list(const std::string& text) {
  if (text == "default") return {TileConfig{}};
  if (text == "all") {
    return {{64, 32, 4}, {64, 64, 4}, {64, 128, 4}, {128, 32, 4}, {128, 64, 4},
            {128, 128, 4}, {128, 32, 8}, {128, 64, 8}, {128, 128, 8}};
  }
  std::vector<TileConfig> tiles;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    TileConfig t;
    if (std::sscanf(text.substr(start, end - start).c_str(), "%dx%dx%d", &t.block_q, &t.block_kv, &t.warps) != 3) {
      throw Error(ErrorCode::invalid_argument, "--tiles: expected default, all or BQxBKVxW[,...]");
    }
    tiles.push_back(t);
    start = end + 1;
  }
  return tiles;
}

// Device buffers big enough for every shape of the grid, filled with random
// 16-bit values of the given dtype (never zeros).
struct Buffers {
  CUdeviceptr q = 0, k = 0, v = 0, o = 0;
  explicit Buffers(DType dtype) {
    const auto& d = driver();
    const size_t count = kTokens * kModelDim;
    std::vector<uint16_t> host(count);
    std::mt19937 rng(12345 + static_cast<int>(dtype));
    std::uniform_real_distribution<float> uniform(-2.f, 2.f);
    for (CUdeviceptr* p : {&q, &k, &v, &o}) {
      check_cuda(d.cuMemAlloc(p, count * 2), "cuMemAlloc");
      for (auto& x : host) {
        float value = uniform(rng);
        uint32_t bits;
        std::memcpy(&bits, &value, 4);
        // Truncation to bf16, or to f16 via the exponent rebias (|x| < 2, normal range).
        x = dtype == DType::bf16 ? static_cast<uint16_t>(bits >> 16)
                                 : static_cast<uint16_t>(((bits >> 16) & 0x8000) |
                                                         (std::fabs(value) < 6.2e-5f ? 0 : (((bits & 0x7fffffff) - 0x38000000) >> 13)));
      }
      check_cuda(d.cuMemcpyHtoD(*p, host.data(), count * 2), "cuMemcpyHtoD");
    }
  }
  ~Buffers() {
    for (CUdeviceptr p : {q, k, v, o}) driver().cuMemFree(p);
  }
};

template <typename Launch>
double time_ms(Launch&& launch, int iters) {
  const auto& d = driver();
  CUevent start, stop;
  check_cuda(d.cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate");
  check_cuda(d.cuEventCreate(&stop, CU_EVENT_DEFAULT), "cuEventCreate");
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> times;
  for (int i = 0; i < iters; ++i) {
    check_cuda(d.cuEventRecord(start, nullptr), "cuEventRecord");
    launch();
    check_cuda(d.cuEventRecord(stop, nullptr), "cuEventRecord");
    check_cuda(d.cuEventSynchronize(stop), "cuEventSynchronize");
    float ms = 0;
    check_cuda(d.cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
    times.push_back(ms);
  }
  d.cuEventDestroy(start);
  d.cuEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int run(const Options& opt) {
  const auto& d = driver();
  current_or_primary_context();
  CUdevice device;
  check_cuda(d.cuCtxGetDevice(&device), "cuCtxGetDevice");
  int major = 0, minor = 0;
  d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  const Arch arch = Arch::for_device(major, minor);
  int max_smem = 0, sm_count = 0;
  d.cuDeviceGetAttribute(&max_smem, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device);
  d.cuDeviceGetAttribute(&sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
  Runtime runtime;
  const std::vector<TileConfig> tiles = tile_list(opt.tiles);

  nlohmann::json results = nlohmann::json::array();
  fmt::print("{:<5} {:>4} {:>6} {:>6} {:>5} {:>7} {:<36} {:>9} {:>8}\n", "dtype", "d", "causal", "N", "batch", "heads",
             "spec", "ms", "TFLOP/s");
  for (DType dtype : opt.dtypes) {
    Buffers buffers(dtype);
    // The grid's calls: (head_dim, causal, N, tiles) with their tensors.
    struct Call {
      int head_dim;
      bool causal;
      int64_t n, batch, heads;
      TensorView q, k, v, o;
      ForwardOptions options;
      std::vector<int> lengths;  // --varlen: the sequences' lengths
      CUdeviceptr cu_seqlens = 0;
      VarlenArgs varlen() const {
        VarlenArgs args;
        args.cu_seqlens_q = args.cu_seqlens_k = TensorView::contiguous(reinterpret_cast<void*>(cu_seqlens), DType::i32,
                                                                       {static_cast<int64_t>(lengths.size()) + 1});
        args.max_seqlen_q = args.max_seqlen_k = *std::max_element(lengths.begin(), lengths.end());
        return args;
      }
      std::string spec(Runtime& runtime, const Arch& arch, int max_smem, int sm_count) const {
        if (lengths.empty()) return runtime.spec_for(q, k, v, o, nullptr, options);
        return plan_forward_varlen(q, k, v, o, nullptr, varlen(), options, arch, max_smem, sm_count).spec.text();
      }
      void launch(Runtime& runtime) const {
        if (lengths.empty()) {
          runtime.forward(q, k, v, o, nullptr, options, nullptr);
        } else {
          runtime.forward_varlen(q, k, v, o, nullptr, varlen(), options, nullptr);
        }
      }
    };
    std::vector<Call> calls;
    for (int head_dim : {64, 128}) {
      for (bool causal : {false, true}) {
        for (int64_t n : {512, 1024, 2048, 4096, 8192, 16384}) {
          const int64_t batch = kTokens / n, heads = kModelDim / head_dim;
          std::vector<int> lengths;
          if (opt.varlen) lengths = varlen_lengths(batch, n);
          const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
          auto view = [&](CUdeviceptr p) {
            return opt.varlen ? TensorView::contiguous(reinterpret_cast<void*>(p), dtype, {total, heads, head_dim})
                              : TensorView::contiguous(reinterpret_cast<void*>(p), dtype, {batch, n, heads, head_dim});
          };
          for (const TileConfig& t : tiles) {
            ForwardOptions options;
            options.causal = causal;
            options.tiles = t;
            calls.push_back({head_dim, causal, n, batch, heads, view(buffers.q), view(buffers.k), view(buffers.v),
                             view(buffers.o), options, lengths});
          }
        }
      }
    }
    // Compile every planned kernel first, in parallel, so timing never waits
    // on NVRTC (the planner's specs, whatever family and stages it picks).
    for (Call& c : calls) {
      if (c.lengths.empty()) continue;
      std::vector<int> offsets{0};
      for (int length : c.lengths) offsets.push_back(offsets.back() + length);
      check_cuda(d.cuMemAlloc(&c.cu_seqlens, offsets.size() * 4), "cuMemAlloc");
      check_cuda(d.cuMemcpyHtoD(c.cu_seqlens, offsets.data(), offsets.size() * 4), "cuMemcpyHtoD");
    }
    std::vector<std::string> specs;
    for (const Call& c : calls) specs.push_back(c.spec(runtime, arch, max_smem, sm_count));
    std::sort(specs.begin(), specs.end());
    specs.erase(std::unique(specs.begin(), specs.end()), specs.end());
    std::atomic<size_t> next{0};
    std::vector<std::thread> workers;
    for (int w = 0; w < 16; ++w) {
      workers.emplace_back([&] {
        for (size_t i; (i = next++) < specs.size();) runtime.warm(specs[i], arch.text());
      });
    }
    for (auto& w : workers) w.join();

    for (size_t i = 0; i < calls.size(); ++i) {
      const Call& c = calls[i];
      const double ms = time_ms([&] { c.launch(runtime); }, opt.iters);
      double squares = 0;  // Σ N² over the sequences
      for (int64_t b = 0; b < c.batch; ++b) squares += c.lengths.empty() ? double(c.n) * c.n : double(c.lengths[b]) * c.lengths[b];
      const double flops = 4.0 * c.heads * squares * c.head_dim / (c.causal ? 2 : 1);
      const double tflops = flops / ms * 1e-9;
      const std::string spec = c.spec(runtime, arch, max_smem, sm_count);
      fmt::print("{:<5} {:>4} {:>6} {:>6} {:>5} {:>7} {:<36} {:>9.3f} {:>8.1f}\n", dtype_name(dtype), c.head_dim,
                 c.causal ? "yes" : "no", c.n, c.batch, c.heads, spec, ms, tflops);
      results.push_back({{"dtype", dtype_name(dtype)}, {"head_dim", c.head_dim}, {"causal", c.causal},
                         {"seqlen", c.n}, {"batch", c.batch}, {"heads", c.heads}, {"spec", spec}, {"ms", ms},
                         {"tflops", tflops}, {"varlen", !c.lengths.empty()}});
    }
    for (const Call& c : calls) {
      if (c.cu_seqlens != 0) d.cuMemFree(c.cu_seqlens);
    }
  }
  if (!opt.json_path.empty()) std::ofstream(opt.json_path) << results.dump(1) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const std::string value = i + 1 < argc ? argv[i + 1] : "";
    if (flag == "--dtype") {
      opt.dtypes = value == "both" ? std::vector<DType>{DType::bf16, DType::f16}
                                   : std::vector<DType>{value == "f16" ? DType::f16 : DType::bf16};
    } else if (flag == "--tiles") {
      opt.tiles = value;
    } else if (flag == "--varlen") {
      opt.varlen = true;
      continue;
    } else if (flag == "--iters") {
      opt.iters = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--json") {
      opt.json_path = value;
    } else {
      fmt::print(stderr, "usage: jitattn_bench_prefill [--dtype bf16|f16|both] [--tiles default|all|BQxBKVxW,...] [--varlen] [--iters N] [--json FILE]\n");
      return 2;
    }
    ++i;
  }
  try {
    return run(opt);
  } catch (const std::exception& e) {
    fmt::print(stderr, "jitattn_bench_prefill: {}\n", e.what());
    return 1;
  }
}
