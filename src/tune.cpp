#include "tune.hpp"

#include "cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>

#include "driver.hpp"
#include "log.hpp"
#include "plan.hpp"

namespace jitattn::detail {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kFormat = 1;
constexpr int kMinBucket = 512;
constexpr int kMaxBucket = 16384;

std::string table_path(const std::string& cache_dir) { return (fs::path(cache_dir) / "v1" / "tuning.json").string(); }

int log2_floor(uint64_t value) {
  int bits = 0;
  while (value > 1) value >>= 1, ++bits;
  return bits;
}

bool same_tiles(const TileConfig& a, const TileConfig& b) {
  return a.block_q == b.block_q && a.block_kv == b.block_kv && a.warps == b.warps;
}

KernelSpec spec_of(DType dtype, int head_dim, bool causal, const TileConfig& tiles) {
  KernelSpec spec;
  spec.dtype = dtype;
  spec.head_dim = head_dim;
  spec.causal = causal;
  spec.block_q = tiles.block_q;
  spec.block_kv = tiles.block_kv;
  spec.warps = tiles.warps;
  return spec;
}

// ---- tuning.json ---------------------------------------------------------------

json choice_to_json(const TunedChoice& choice) {
  const ShapeClass& s = choice.shape;
  return {{"arch", s.arch.text()},
          {"dtype", dtype_name(s.dtype)},
          {"head_dim", s.head_dim},
          {"causal", s.causal},
          {"seqlen_bucket", s.seqlen_bucket},
          {"block_q", choice.tiles.block_q},
          {"block_kv", choice.tiles.block_kv},
          {"warps", choice.tiles.warps},
          {"tflops", choice.tflops},
          {"default_tflops", choice.default_tflops}};
}

// Throws (nlohmann's or jitattn's exceptions) on a row this build cannot use.
TunedChoice choice_from_json(const json& row) {
  TunedChoice choice;
  ShapeClass& s = choice.shape;
  s.arch = Arch::parse(row.at("arch").get<std::string>());
  const std::string dtype = row.at("dtype").get<std::string>();
  if (dtype == "bf16") {
    s.dtype = DType::bf16;
  } else if (dtype == "f16") {
    s.dtype = DType::f16;
  } else {
    throw Error(ErrorCode::invalid_argument, fmt::format("dtype '{}' is not bf16 or f16", dtype));
  }
  row.at("head_dim").get_to(s.head_dim);
  row.at("causal").get_to(s.causal);
  row.at("seqlen_bucket").get_to(s.seqlen_bucket);
  if (seqlen_bucket(s.seqlen_bucket, s.seqlen_bucket) != s.seqlen_bucket) {
    throw Error(ErrorCode::invalid_argument,
                fmt::format("seqlen_bucket {} is not a power of two in [512, 16384]", s.seqlen_bucket));
  }
  row.at("block_q").get_to(choice.tiles.block_q);
  row.at("block_kv").get_to(choice.tiles.block_kv);
  row.at("warps").get_to(choice.tiles.warps);
  choice.tflops = row.value("tflops", 0.0);
  choice.default_tflops = row.value("default_tflops", 0.0);
  spec_of(s.dtype, s.head_dim, s.causal, choice.tiles).validate();
  return choice;
}

// ---- timing on the GPU ---------------------------------------------------------

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { check_cuda(driver().cuMemAlloc(&ptr_, bytes), "cuMemAlloc"); }
  ~DeviceBuffer() { driver().cuMemFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  CUdeviceptr get() const { return ptr_; }
  void* data() const { return reinterpret_cast<void*>(ptr_); }

 private:
  CUdeviceptr ptr_ = 0;
};

class Event {
 public:
  Event() { check_cuda(driver().cuEventCreate(&event_, CU_EVENT_DEFAULT), "cuEventCreate"); }
  ~Event() { driver().cuEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  CUevent get() const { return event_; }

 private:
  CUevent event_ = nullptr;
};

// Round to nearest even. Inputs are normal in both formats (see random_bits).
uint16_t to_bits(float value, DType dtype) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if (dtype == DType::bf16) return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t magnitude = (bits & 0x7fffffffu) - 0x38000000u;  // exponent bias 127 → 15
  magnitude += 0xfffu + ((magnitude >> 13) & 1u);            // a mantissa carry bumps the exponent
  return static_cast<uint16_t>(sign | (magnitude >> 13));
}

// Uniform in [-2, 2] with |x| >= 2^-8, so no element is zero or subnormal.
std::vector<uint16_t> random_bits(size_t count, DType dtype, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-2.f, 2.f);
  std::vector<uint16_t> out(count);
  for (uint16_t& x : out) {
    float value;
    do value = uniform(rng);
    while (std::fabs(value) < 1.f / 256);
    x = to_bits(value, dtype);
  }
  return out;
}

struct Inputs {
  DeviceBuffer q, k, v, out;
  explicit Inputs(size_t elements) : q(elements * 2), k(elements * 2), v(elements * 2), out(elements * 2) {}
};

void fill(const Inputs& inputs, size_t elements, DType dtype) {
  std::mt19937 rng(0x6a17a77 + static_cast<unsigned>(dtype));
  for (const DeviceBuffer* buffer : {&inputs.q, &inputs.k, &inputs.v, &inputs.out}) {
    const std::vector<uint16_t> host = random_bits(elements, dtype, rng);
    check_cuda(driver().cuMemcpyHtoD(buffer->get(), host.data(), elements * 2), "cuMemcpyHtoD");
  }
}

double median(std::vector<float> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (double(values[n / 2 - 1]) + values[n / 2]);
}

// Median milliseconds of one forward call on the null stream, after 3 warm-up calls.
double time_ms(Runtime& runtime, const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& out, const ForwardOptions& options, int iterations) {
  const Driver& d = driver();
  Event start, stop;
  for (int i = 0; i < 3; ++i) runtime.forward(q, k, v, out, nullptr, options, nullptr);
  std::vector<float> times;
  for (int i = 0; i < iterations; ++i) {
    check_cuda(d.cuEventRecord(start.get(), nullptr), "cuEventRecord");
    runtime.forward(q, k, v, out, nullptr, options, nullptr);
    check_cuda(d.cuEventRecord(stop.get(), nullptr), "cuEventRecord");
    check_cuda(d.cuEventSynchronize(stop.get()), "cuEventSynchronize");
    float ms = 0;
    check_cuda(d.cuEventElapsedTime(&ms, start.get(), stop.get()), "cuEventElapsedTime");
    times.push_back(ms);
  }
  return median(std::move(times));
}

// Compiles (or loads) every spec before anything is timed, so no timed call
// waits on NVRTC. The first failure is rethrown after all workers finish.
void warm_all(Runtime& runtime, const std::vector<std::string>& specs, const std::string& arch) {
  const size_t threads =
      std::min<size_t>({specs.size(), std::max(1u, std::thread::hardware_concurrency()), size_t(16)});
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::exception_ptr failure;
  auto work = [&] {
    for (size_t i; (i = next++) < specs.size();) {
      try {
        runtime.warm(specs[i], arch);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failure) failure = std::current_exception();
        next = specs.size();
      }
    }
  };
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t) workers.emplace_back(work);
  for (std::thread& worker : workers) worker.join();
  if (failure) std::rethrow_exception(failure);
}

std::string tiles_text(const TileConfig& t) { return fmt::format("{}x{}x{}", t.block_q, t.block_kv, t.warps); }

}  // namespace

int seqlen_bucket(int64_t seqlen_q, int64_t seqlen_k) {
  const int64_t n = std::max<int64_t>({seqlen_q, seqlen_k, 1});
  if (n >= kMaxBucket) return kMaxBucket;
  int bucket = kMinBucket;
  while (bucket < n) bucket *= 2;
  return bucket;
}

uint64_t ShapeClass::packed() const {
  uint64_t key = static_cast<uint64_t>(arch.number()) & 0xffff;
  key = key << 1 | static_cast<uint64_t>(arch.arch_specific);
  key = key << 4 | (static_cast<uint64_t>(dtype) & 0xf);
  key = key << 16 | (static_cast<uint64_t>(head_dim) & 0xffff);
  key = key << 1 | static_cast<uint64_t>(causal);
  key = key << 6 | static_cast<uint64_t>(log2_floor(static_cast<uint64_t>(std::max(seqlen_bucket, 1))));
  return key;
}

std::string ShapeClass::text() const {
  return fmt::format("{}.{}.d{}{}.n{}", arch.text(), dtype_name(dtype), head_dim, causal ? ".causal" : "",
                     seqlen_bucket);
}

std::string table_nvrtc_for(const std::string& cache_dir, const std::string& nvrtc_version) {
  return nvrtc_version == "none" ? warmed_nvrtc(cache_dir) : nvrtc_version;
}

TuningTable TuningTable::load(const std::string& cache_dir, const std::string& library_version,
                              const std::string& nvrtc_version) {
  TuningTable table;
  table.library_version = library_version;
  table.nvrtc_version = nvrtc_version;
  if (cache_dir.empty()) return table;
  const std::string path = table_path(cache_dir);
  std::error_code ec;
  if (!fs::exists(path, ec) && !ec) return table;  // never tuned: the built-in tiles, silently
  std::ifstream file(path, std::ios::binary);
  if (!file || !fs::is_regular_file(path, ec)) {
    log(LogLevel::info, "tuning table {}: cannot read it; ignored", path);
    return table;
  }
  std::ostringstream text;
  text << file.rdbuf();
  json document;
  try {
    document = json::parse(text.str());
    if (!document.is_object() || document.value("format", 0) != kFormat) {
      log(LogLevel::info, "tuning table {}: not format {}; ignored (run `jitattn tune` to replace it)", path, kFormat);
      return table;
    }
    const std::string file_library = document.at("library_version").get<std::string>();
    const std::string file_nvrtc = document.at("nvrtc_version").get<std::string>();
    const std::string compared_nvrtc = table_nvrtc_for(cache_dir, nvrtc_version);
    if (file_library != library_version || file_nvrtc != compared_nvrtc) {
      log(LogLevel::info,
          "tuning table {} was tuned with jitattn {} and NVRTC {}, this is jitattn {} with NVRTC {}: "
          "ignored (run `jitattn tune` to retune)",
          path, file_library, file_nvrtc, library_version, nvrtc_version);
      return table;
    }
    document.at("choices").get_ref<const json::array_t&>();
  } catch (const json::exception& e) {
    log(LogLevel::info, "tuning table {}: unreadable ({}); ignored", path, e.what());
    return table;
  }
  size_t row_number = 0;
  for (const json& row : document["choices"]) {
    try {
      table.set(choice_from_json(row));
    } catch (const std::exception& e) {
      log(LogLevel::info, "tuning table {}: skipping choice {}: {}", path, row_number, e.what());
    }
    ++row_number;
  }
  return table;
}

void TuningTable::save(const std::string& cache_dir) const {
  if (cache_dir.empty()) {
    throw Error(ErrorCode::cache_error,
                "cannot save the tuning table: the disk cache is disabled (the cache directory is \"\")");
  }
  const std::string path = table_path(cache_dir);
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) {
    throw Error(ErrorCode::cache_error,
                fmt::format("cannot save the tuning table {}: cannot create {}: {}", path,
                            fs::path(path).parent_path().string(), ec.message()));
  }
  json rows = json::array();
  for (const TunedChoice& choice : choices_) rows.push_back(choice_to_json(choice));
  const json document = {{"format", kFormat},
                         {"library_version", library_version},
                         {"nvrtc_version", nvrtc_version},
                         {"choices", rows}};
  const std::string error =
      publish_file(document.dump(1, ' ', false, json::error_handler_t::replace) + "\n", path);
  if (!error.empty()) {
    throw Error(ErrorCode::cache_error, fmt::format("cannot save the tuning table {}: {}", path, error));
  }
}

std::optional<TileConfig> TuningTable::lookup(const ShapeClass& shape) const {
  auto it = index_.find(shape.packed());
  if (it == index_.end()) return std::nullopt;
  return choices_[it->second].tiles;
}

void TuningTable::set(const TunedChoice& choice) {
  const uint64_t key = choice.shape.packed();
  auto it = index_.find(key);
  if (it != index_.end()) {
    choices_[it->second] = choice;
    return;
  }
  index_.emplace(key, choices_.size());
  choices_.push_back(choice);
}

std::vector<TileConfig> tile_candidates(int head_dim) {
  std::vector<TileConfig> candidates;
  for (int block_q : {64, 128}) {
    for (int block_kv : {32, 64, 128}) {
      for (int warps : {4, 8}) {
        const TileConfig tiles{block_q, block_kv, warps};
        try {
          spec_of(DType::bf16, head_dim, false, tiles).validate();
          candidates.push_back(tiles);
        } catch (const Error&) {
          // Not generated for this head dim (e.g. too few query rows per warp).
        }
      }
    }
  }
  return candidates;
}

std::vector<TunedChoice> tune(Runtime& runtime, const TuneRequest& request) {
  const Driver& d = driver();
  if (!d.available) throw Error(ErrorCode::cuda_error, fmt::format("no usable GPU: {}", d.error));
  if (request.iterations < 1) {
    throw Error(ErrorCode::invalid_argument, fmt::format("tune: iterations={} must be >= 1", request.iterations));
  }
  if (request.tokens < 1 || request.model_dim < 1) {
    throw Error(ErrorCode::invalid_argument,
                fmt::format("tune: tokens={} and model_dim={} must be >= 1", request.tokens, request.model_dim));
  }
  for (DType dtype : request.dtypes) {
    if (dtype != DType::bf16 && dtype != DType::f16) {
      throw Error(ErrorCode::invalid_argument, fmt::format("tune: dtype {} is not bf16 or f16", dtype_name(dtype)));
    }
  }
  for (int n : request.seqlens) {
    if (n < 1) throw Error(ErrorCode::invalid_argument, fmt::format("tune: seqlen {} must be >= 1", n));
  }
  for (int head_dim : request.head_dims) {
    if (head_dim < 1 || request.model_dim / head_dim < 1) {
      throw Error(ErrorCode::invalid_argument,
                  fmt::format("tune: head_dim {} does not fit model_dim {}", head_dim, request.model_dim));
    }
  }

  current_or_primary_context();
  CUdevice device = 0;
  check_cuda(d.cuCtxGetDevice(&device), "cuCtxGetDevice");
  auto attribute = [&](CUdevice_attribute which) {
    int value = 0;
    check_cuda(d.cuDeviceGetAttribute(&value, which, device), "cuDeviceGetAttribute");
    return value;
  };
  const Arch arch = Arch::for_device(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                                     attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
  const size_t max_smem = static_cast<size_t>(attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN));

  // One timing problem per bucket: a second seqlen in the same bucket would
  // only overwrite the first one's winner.
  std::vector<int> seqlens;
  std::set<int> buckets;
  for (int n : request.seqlens) {
    if (buckets.insert(seqlen_bucket(n, n)).second) {
      seqlens.push_back(n);
    } else {
      log(LogLevel::info, "tune: seqlen {} shares bucket n{} with an earlier one; skipped", n, seqlen_bucket(n, n));
    }
  }

  // Every (dtype, head_dim, causal) with the candidates that fit this device.
  struct Group {
    DType dtype;
    int head_dim;
    bool causal;
    std::vector<TileConfig> candidates;
  };
  std::vector<Group> groups;
  std::vector<std::string> specs;
  std::set<std::string> seen;
  for (DType dtype : request.dtypes) {
    for (int head_dim : request.head_dims) {
      for (bool causal : request.causal) {
        Group group{dtype, head_dim, causal, {}};
        for (const TileConfig& tiles : request.candidates.empty() ? tile_candidates(head_dim) : request.candidates) {
          const KernelSpec spec = spec_of(dtype, head_dim, causal, tiles);
          spec.validate();
          if (spec.smem_bytes() > max_smem) {
            log(LogLevel::info, "tune: {} needs {} bytes of shared memory, {} allows {}; skipped", spec.text(),
                spec.smem_bytes(), arch.text(), max_smem);
            continue;
          }
          group.candidates.push_back(tiles);
          if (seen.insert(spec.text()).second) specs.push_back(spec.text());
        }
        if (!group.candidates.empty()) groups.push_back(std::move(group));
      }
    }
  }
  warm_all(runtime, specs, arch.text());

  int max_seqlen = 0;
  for (int n : seqlens) max_seqlen = std::max(max_seqlen, n);
  // batch × seqlen is tokens, or one sequence when the seqlen alone is longer.
  const size_t elements = static_cast<size_t>(std::max<int64_t>(request.tokens, max_seqlen) * request.model_dim);

  std::vector<TunedChoice> winners;
  for (DType dtype : request.dtypes) {
    std::optional<Inputs> inputs;  // allocated and filled once per dtype
    for (const Group& group : groups) {
      if (group.dtype != dtype) continue;
      if (!inputs) {
        inputs.emplace(elements);
        fill(*inputs, elements, dtype);
      }
      const int head_dim = group.head_dim;
      const bool causal = group.causal;
      for (int n : seqlens) {
        const int64_t batch = std::max<int64_t>(request.tokens / n, 1);
        const int64_t heads = request.model_dim / head_dim;
        auto view = [&](const DeviceBuffer& buffer) {
          return TensorView::contiguous(buffer.data(), dtype, {batch, n, heads, head_dim});
        };
        const TensorView q = view(inputs->q), k = view(inputs->k), v = view(inputs->v), out = view(inputs->out);
        const double flops = 4.0 * batch * heads * double(n) * n * head_dim / (causal ? 2 : 1);

        TunedChoice choice;
        choice.shape = ShapeClass{arch, dtype, head_dim, causal, seqlen_bucket(n, n)};
        const TileConfig builtin = default_tiles(dtype, head_dim, causal, arch, choice.shape.seqlen_bucket);
        bool first = true;
        for (const TileConfig& tiles : group.candidates) {
          ForwardOptions options;
          options.causal = causal;
          options.tiles = tiles;
          const double tflops = flops / time_ms(runtime, q, k, v, out, options, request.iterations) * 1e-9;
          log(LogLevel::debug, "tune: {} {}: {:.1f} TFLOP/s", choice.shape.text(), tiles_text(tiles), tflops);
          if (first || tflops > choice.tflops) {
            choice.tflops = tflops;
            choice.tiles = tiles;
            first = false;
          }
          if (same_tiles(tiles, builtin)) choice.default_tflops = tflops;
        }
        log(LogLevel::info, "tune: {}: {} at {:.1f} TFLOP/s (built-in {} at {:.1f})", choice.shape.text(),
            tiles_text(choice.tiles), choice.tflops, tiles_text(builtin), choice.default_tflops);
        winners.push_back(choice);
      }
    }
  }
  return winners;
}

}  // namespace jitattn::detail
