#include "gpu_support.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "compile.hpp"
#include "spec.hpp"

namespace jitattn::test {

using detail::check_cuda;
using detail::driver;

bool use_gpu(std::string* why) {
  if (!driver().available) {
    *why = driver().error;
    return false;
  }
  detail::current_or_primary_context();
  return true;
}

// Allocations are whole 16-byte blocks, as the hardware reads them: a
// cp.async of a row's last bytes (src-size under 16) reads only those bytes,
// but compute-sanitizer's memcheck counts all 16 of its aligned block, and
// reports a row that ends within 16 bytes of a tight allocation's end.
DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  check_cuda(driver().cuMemAlloc(&pointer_, std::max<size_t>(16, (bytes + 15) / 16 * 16)), "cuMemAlloc");
}
DeviceBuffer::~DeviceBuffer() { driver().cuMemFree(pointer_); }
// Zero-byte transfers (empty sequences) are skipped rather than handed to the driver.
// Fills and uploads wait until they are done: cuMemsetD8 on device memory,
// and cuMemcpyHtoD from pageable memory, return before they land, on the
// legacy stream, which a call on a non-blocking stream (the graph replays)
// does not wait for. Replays beside other processes' kernels then read the
// poison of the fill meant to come before them.
void DeviceBuffer::fill_bytes(unsigned char value) {
  if (bytes_ == 0) return;
  check_cuda(driver().cuMemsetD8(pointer_, value, bytes_), "cuMemsetD8");
  check_cuda(driver().cuCtxSynchronize(), "cuCtxSynchronize");
}
void DeviceBuffer::upload(const void* host, size_t bytes) { upload_at(0, host, bytes); }
void DeviceBuffer::download(void* host, size_t bytes) const { download_at(0, host, bytes); }
void DeviceBuffer::upload_at(size_t offset, const void* host, size_t bytes) {
  if (bytes == 0) return;
  REQUIRE_MESSAGE(offset + bytes <= bytes_, "upload past the buffer's end");
  check_cuda(driver().cuMemcpyHtoD(pointer_ + offset, host, bytes), "cuMemcpyHtoD");
  check_cuda(driver().cuCtxSynchronize(), "cuCtxSynchronize");
}
void DeviceBuffer::download_at(size_t offset, void* host, size_t bytes) const {
  check_cuda(driver().cuCtxSynchronize(), "cuCtxSynchronize");
  if (bytes == 0) return;
  REQUIRE_MESSAGE(offset + bytes <= bytes_, "download past the buffer's end");
  check_cuda(driver().cuMemcpyDtoH(host, pointer_ + offset, bytes), "cuMemcpyDtoH");
}

namespace {

size_t span_elements(const int64_t (&shape)[4], const int64_t (&strides)[4]) {
  size_t last = 0;
  for (int axis = 0; axis < 4; ++axis) {
    if (shape[axis] == 0) return 0;
    last += static_cast<size_t>(shape[axis] - 1) * strides[axis];
  }
  return last + 1;
}

template <typename Body>
void for_each_element(const int64_t (&shape)[4], const int64_t (&strides)[4], Body&& body) {
  size_t logical = 0;
  for (int64_t b = 0; b < shape[0]; ++b)
    for (int64_t s = 0; s < shape[1]; ++s)
      for (int64_t h = 0; h < shape[2]; ++h)
        for (int64_t d = 0; d < shape[3]; ++d)
          body(logical++, static_cast<size_t>(b * strides[0] + s * strides[1] + h * strides[2] + d));
}

}  // namespace

DeviceTensor::DeviceTensor(DType dtype_, const int64_t (&shape_)[4], const int64_t (&strides_)[4])
    : dtype(dtype_), shape{shape_[0], shape_[1], shape_[2], shape_[3]},
      strides{strides_[0], strides_[1], strides_[2], strides_[3]},
      buffer(span_elements(shape_, strides_) * 2) {
  buffer.fill_bytes(0xff);
}

DeviceTensor::DeviceTensor(const std::vector<float>& values, DType dtype_, const int64_t (&shape_)[4],
                           const int64_t (&strides_)[4])
    : DeviceTensor(dtype_, shape_, strides_) {
  std::vector<uint16_t> host(buffer.bytes() / 2, 0xffff);  // gaps stay NaN: a stray read shows
  for_each_element(shape, strides, [&](size_t logical, size_t offset) { host[offset] = from_float(values[logical], dtype); });
  buffer.upload(host.data(), host.size() * 2);
}

TensorView DeviceTensor::view() const {
  TensorView t;
  t.data = buffer.get();
  t.dtype = dtype;
  t.ndim = 4;
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = shape[i];
    t.strides[i] = strides[i];
  }
  return t;
}

std::vector<uint16_t> DeviceTensor::raw() const {
  std::vector<uint16_t> host(buffer.bytes() / 2);
  buffer.download(host.data(), host.size() * 2);
  return host;
}

std::vector<float> DeviceTensor::read() const {
  const std::vector<uint16_t> host = raw();
  std::vector<float> values(static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3]));
  for_each_element(shape, strides, [&](size_t logical, size_t offset) { values[logical] = to_float(host[offset], dtype); });
  return values;
}

size_t DeviceTensor::count_written_outside(int64_t rows) const {
  const std::vector<uint16_t> host = raw();
  std::vector<bool> inside(host.size(), false);
  int64_t below[4] = {shape[0], std::min(rows, shape[1]), shape[2], shape[3]};
  for_each_element(below, strides, [&](size_t, size_t offset) { inside[offset] = true; });
  size_t written = 0;
  for (size_t i = 0; i < host.size(); ++i) written += !inside[i] && host[i] != 0xffff;
  return written;
}

TensorView packed_view(const DeviceTensor& t, int first_head, int heads) {
  if (t.shape[0] != 1) throw std::invalid_argument("packed_view: the tensor must have batch 1");
  if (heads < 0) heads = static_cast<int>(t.shape[2]) - first_head;
  if (first_head < 0 || first_head + heads > t.shape[2]) throw std::invalid_argument("packed_view: heads out of range");
  TensorView view;
  view.data = static_cast<char*>(t.buffer.get()) + static_cast<size_t>(first_head) * t.strides[2] * 2;
  view.dtype = t.dtype;
  view.ndim = 3;
  view.shape[0] = t.shape[1], view.shape[1] = heads, view.shape[2] = t.shape[3];
  view.strides[0] = t.strides[1], view.strides[1] = t.strides[2], view.strides[2] = t.strides[3];
  return view;
}

ReferenceOutput gpu_reference_varlen(const VarlenShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v, DType dtype, bool exact) {
  return attention_varlen(s, q, k, v,
                          [&](const AttentionShape& sequence, const std::vector<float>& q_b,
                              const std::vector<float>& k_b, const std::vector<float>& v_b) {
                            const int64_t q_shape[4] = {1, sequence.seqlen_q, sequence.heads_q, sequence.head_dim};
                            const int64_t k_shape[4] = {1, sequence.seqlen_k, sequence.heads_kv, sequence.head_dim};
                            const int64_t v_shape[4] = {1, sequence.seqlen_k, sequence.heads_kv, sequence.value_dim()};
                            int64_t q_strides[4], k_strides[4], v_strides[4];
                            contiguous_strides(q_shape, q_strides);
                            contiguous_strides(k_shape, k_strides);
                            contiguous_strides(v_shape, v_strides);
                            const DeviceTensor dq(q_b, dtype, q_shape, q_strides);
                            const DeviceTensor dk(k_b, dtype, k_shape, k_strides);
                            const DeviceTensor dv(v_b, dtype, v_shape, v_strides);
                            return gpu_reference(sequence, dq, dk, dv, exact);
                          });
}

void contiguous_strides(const int64_t (&shape)[4], int64_t (&strides)[4]) {
  strides[3] = 1;
  strides[2] = shape[3];
  strides[1] = shape[2] * shape[3];
  strides[0] = shape[1] * shape[2] * shape[3];
}

void padded_strides(const int64_t (&shape)[4], int64_t (&strides)[4]) {
  strides[3] = 1;
  strides[2] = shape[3] + 8;
  strides[1] = shape[2] * strides[2] + 24;
  strides[0] = shape[1] * strides[1] + 64;
}

void heads_major_strides(const int64_t (&shape)[4], int64_t (&strides)[4]) {
  strides[3] = 1;
  strides[1] = shape[3];
  strides[2] = shape[1] * shape[3];
  strides[0] = shape[2] * shape[1] * shape[3];
}

namespace {

// One CTA per (query row, head, batch). Scores of the row's visible keys live
// in shared memory; fp32 accumulation, expf. No toolkit headers (NVRTC
// builtins only). Features (window, softcap, ALiBi) follow AttentionShape;
// with them off this is plain attention. Rounded mode rounds like
// attention_16bit (see reference.hpp).
const char* kReferenceSource = R"CUDA(
struct RefParams {
  const unsigned short* q; const unsigned short* k; const unsigned short* v;
  float* out; float* lse;
  const float* alibi_slopes;  // nullptr: no ALiBi
  const float* sinks;         // nullptr: no learnable sinks; else one logit per query head
  long long q_stride[3], k_stride[3], v_stride[3];
  int seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  int head_dim_v;                 // v's and out's head dim (q and k: head_dim)
  int window_left, window_right;  // -1: unbounded; causal is window_right = 0
  int attention_chunk;            // 0: off; else keys of the row's chunk only
  int alibi_per_batch;            // slopes indexed b * heads_q + h (else h)
  float scale, softcap;           // softcap 0: off
};

template <bool BF16> __device__ float to_f32(unsigned short bits) {
  if (BF16) return __uint_as_float(((unsigned)bits) << 16);
  float f; asm("{ .reg .b16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "h"(bits)); return f;
}
template <bool BF16> __device__ float round16(float x) {
  unsigned short bits;
  if (BF16) asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(x));
  else asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(x));
  return to_f32<BF16>(bits);
}

__device__ float block_reduce(float x, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < blockDim.x / 32; ++w) x = is_max ? fmaxf(x, scratch[w]) : x + scratch[w];
  return x;
}

template <bool BF16, bool EXACT>
__device__ void reference_row(const RefParams& p) {
  extern __shared__ float scores[];
  __shared__ float scratch[32];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (p.heads_q / p.heads_kv);
  // Visible keys [first, last): the window around the aligned key `diagonal`.
  const long long diagonal = (long long)i + p.seqlen_k - p.seqlen_q;
  long long first = 0, last = p.seqlen_k;
  if (p.window_left >= 0 && diagonal - p.window_left > first) first = diagonal - p.window_left;
  if (p.window_right >= 0 && diagonal + p.window_right + 1 < last) last = diagonal + p.window_right + 1;
  if (p.attention_chunk > 0) {
    const long long c = p.attention_chunk;
    const long long start = (diagonal >= 0 ? diagonal / c : -((c - 1 - diagonal) / c)) * c;
    if (start > first) first = start;
    if (start + c < last) last = start + c;
  }
  const int keys = last > first ? (int)(last - first) : 0;
  const float slope = p.alibi_slopes == 0 ? 0.f : p.alibi_slopes[p.alibi_per_batch ? b * p.heads_q + h : h];
  const unsigned short* q = p.q + b * p.q_stride[0] + i * p.q_stride[1] + h * p.q_stride[2];
  const unsigned short* k = p.k + b * p.k_stride[0] + kvh * p.k_stride[2] + first * p.k_stride[1];
  const unsigned short* v = p.v + b * p.v_stride[0] + kvh * p.v_stride[2] + first * p.v_stride[1];
  float* out = p.out + (((long long)b * p.seqlen_q + i) * p.heads_q + h) * p.head_dim_v;
  const bool capped = p.softcap > 0.f;
  float local_max = -__int_as_float(0x7f800000);
  for (int t = threadIdx.x; t < keys; t += blockDim.x) {
    float dot = 0.f;
    for (int d = 0; d < p.head_dim; ++d) {
      const float kd = to_f32<BF16>(k[t * p.k_stride[1] + d]);
      dot += to_f32<BF16>(q[d]) * (EXACT || capped ? kd : round16<BF16>(kd * p.scale));
    }
    float s;
    if (EXACT) {
      s = dot * p.scale;
      if (capped) s = p.softcap * tanhf(s / p.softcap);
    } else {
      s = round16<BF16>(dot);
      if (capped) s = round16<BF16>(p.softcap * tanhf(s * p.scale / p.softcap));
    }
    s -= slope * fabsf((float)(diagonal - (first + t)));
    scores[t] = s;
    local_max = fmaxf(local_max, s);
  }
  // A sink is one more logit whose value is 0: in the max and the sum only.
  const float sink = p.sinks == 0 ? -__int_as_float(0x7f800000) : p.sinks[h];
  const float row_max = fmaxf(block_reduce(local_max, true, scratch), sink);
  float local_sum = 0.f;
  for (int t = threadIdx.x; t < keys; t += blockDim.x) local_sum += (scores[t] = expf(scores[t] - row_max));
  const float sum = block_reduce(local_sum, false, scratch) + (p.sinks == 0 ? 0.f : expf(sink - row_max));
  if (!EXACT) {
    for (int t = threadIdx.x; t < keys; t += blockDim.x) scores[t] = round16<BF16>(scores[t] / sum);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < p.head_dim_v; d += blockDim.x) {
    float acc = 0.f;
    for (int t = 0; t < keys; ++t) acc += scores[t] * to_f32<BF16>(v[t * p.v_stride[1] + d]);
    out[d] = keys == 0 ? 0.f : (EXACT ? acc / sum : round16<BF16>(acc));
  }
  if (threadIdx.x == 0) {
    p.lse[((long long)b * p.heads_q + h) * p.seqlen_q + i] = keys == 0 ? sink : row_max + logf(sum);
  }
}

extern "C" __global__ void reference_f16_exact(const __grid_constant__ RefParams p) { reference_row<false, true>(p); }
extern "C" __global__ void reference_f16_rounded(const __grid_constant__ RefParams p) { reference_row<false, false>(p); }
extern "C" __global__ void reference_bf16_exact(const __grid_constant__ RefParams p) { reference_row<true, true>(p); }
extern "C" __global__ void reference_bf16_rounded(const __grid_constant__ RefParams p) { reference_row<true, false>(p); }
)CUDA";

// Mirrors RefParams in kReferenceSource field for field.
struct RefParams {
  const void* q;
  const void* k;
  const void* v;
  float* out;
  float* lse;
  const float* alibi_slopes;
  const float* sinks;
  long long q_stride[3], k_stride[3], v_stride[3];
  int seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  int head_dim_v;
  int window_left, window_right;
  int attention_chunk;
  int alibi_per_batch;
  float scale, softcap;
};
// Ten ints and two floats: a multiple of the pointers' 8, no tail padding.
static_assert(sizeof(RefParams) == 7 * 8 + 9 * 8 + 10 * 4 + 2 * 4, "RefParams must match the kernel's layout");

CUmodule reference_module() {
  static CUmodule module = [] {
    const auto& d = driver();
    CUdevice device = 0;
    int major = 0, minor = 0;
    check_cuda(d.cuCtxGetDevice(&device), "cuCtxGetDevice");
    d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
    d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
    const auto arch = detail::Arch::for_device(major, minor);
    const auto compiled = detail::compile_cubin(kReferenceSource, "reference.cu", arch, "reference");
    CUmodule loaded = nullptr;
    check_cuda(d.cuModuleLoadData(&loaded, compiled.cubin.data()), "cuModuleLoadData(reference)");
    return loaded;
  }();
  return module;
}

}  // namespace

ReferenceOutput gpu_reference(const AttentionShape& s, const DeviceTensor& q, const DeviceTensor& k,
                              const DeviceTensor& v, bool exact) {
  const auto& d = driver();
  const std::string name = fmt::format("reference_{}_{}", q.dtype == DType::bf16 ? "bf16" : "f16", exact ? "exact" : "rounded");
  CUfunction function = nullptr;
  check_cuda(d.cuModuleGetFunction(&function, reference_module(), name.c_str()), "cuModuleGetFunction(reference)");
  s.check();
  // The kernel reads head_dim columns of q and k and value_dim of v, whatever
  // the tensors hold: a tensor of another width is a test bug, not a result.
  if (q.shape[3] != s.head_dim || k.shape[3] != s.head_dim || v.shape[3] != s.value_dim()) {
    throw std::invalid_argument(fmt::format("gpu_reference: q, k must be head_dim ({}) wide and v value_dim ({}); "
                                            "they are {}, {}, {}",
                                            s.head_dim, s.value_dim(), q.shape[3], k.shape[3], v.shape[3]));
  }
  const size_t out_count = static_cast<size_t>(s.batch) * s.seqlen_q * s.heads_q * s.value_dim();
  const size_t lse_count = static_cast<size_t>(s.batch) * s.heads_q * s.seqlen_q;
  DeviceBuffer out(out_count * 4), lse(lse_count * 4);
  out.fill_bytes(0xff);
  lse.fill_bytes(0xff);
  // The slopes travel with the shape, so the reference and the kernel under
  // test are fed from the same host vector.
  DeviceBuffer slopes(s.alibi_slopes.size() * 4);
  if (!s.alibi_slopes.empty()) slopes.upload(s.alibi_slopes.data(), s.alibi_slopes.size() * 4);
  DeviceBuffer sinks(s.learnable_sink.size() * 4);
  if (!s.learnable_sink.empty()) sinks.upload(s.learnable_sink.data(), s.learnable_sink.size() * 4);
  RefParams p{};
  p.q = q.buffer.get();
  p.k = k.buffer.get();
  p.v = v.buffer.get();
  p.out = reinterpret_cast<float*>(out.get());
  p.lse = reinterpret_cast<float*>(lse.get());
  p.alibi_slopes = s.alibi_slopes.empty() ? nullptr : reinterpret_cast<const float*>(slopes.get());
  p.alibi_per_batch = s.alibi_per_batch();
  p.sinks = s.learnable_sink.empty() ? nullptr : reinterpret_cast<const float*>(sinks.get());
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = q.strides[i];
    p.k_stride[i] = k.strides[i];
    p.v_stride[i] = v.strides[i];
  }
  p.seqlen_q = s.seqlen_q, p.seqlen_k = s.seqlen_k, p.heads_q = s.heads_q, p.heads_kv = s.heads_kv;
  p.head_dim = s.head_dim, p.head_dim_v = s.value_dim(), p.scale = s.effective_scale(), p.softcap = s.softcap;
  p.window_left = s.window_left, p.window_right = s.effective_window_right();
  p.attention_chunk = s.attention_chunk;
  // Three scores of slack: ptxas may load the last three of the P V loop's
  // remainder as one wide shared load, which memcheck reports past the end.
  const unsigned smem = static_cast<unsigned>((std::max(1, s.seqlen_k) + 3) * 4);
  check_cuda(d.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(smem)),
             "cuFuncSetAttribute(reference)");
  void* args[] = {&p};
  if (s.seqlen_q > 0 && s.batch > 0) {
    check_cuda(d.cuLaunchKernel(function, s.seqlen_q, s.heads_q, s.batch, 128, 1, 1, smem, nullptr, args, nullptr),
               "cuLaunchKernel(reference)");
  }
  std::vector<float> out_host(out_count), lse_host(lse_count);
  out.download(out_host.data(), out_count * 4);
  lse.download(lse_host.data(), lse_count * 4);
  ReferenceOutput result;
  result.out.assign(out_host.begin(), out_host.end());
  result.lse.assign(lse_host.begin(), lse_host.end());
  return result;
}

uint64_t clock_seed() {
  if (const char* text = std::getenv("JITATTN_TEST_SEED"); text != nullptr && *text != '\0') {
    return std::strtoull(text, nullptr, 10);
  }
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull;
}

int repeat_launches() {
  static const int count = [] {
    const char* text = std::getenv("JITATTN_TEST_REPEAT");
    return text == nullptr ? 0 : std::max(0, std::atoi(text));
  }();
  return count;
}

std::string first_difference(const char* what, const std::vector<float>& first, const std::vector<float>& again) {
  if (first.size() != again.size()) return fmt::format("{}: {} values, then {}", what, first.size(), again.size());
  for (size_t i = 0; i < first.size(); ++i) {
    if (std::memcmp(&first[i], &again[i], sizeof(float)) != 0) {
      return fmt::format("{}[{}] was {}, now {}", what, i, first[i], again[i]);
    }
  }
  return {};
}

Runtime& gpu_tests_runtime() {
  static Runtime runtime([] {
    Config config = Config::from_env();
    if (std::getenv("JITATTN_CACHE_DIR") == nullptr) {
      config.cache_dir = (std::filesystem::temp_directory_path() / "jitattn-gpu-tests").string();
    }
    return config;
  }());
  return runtime;
}

namespace {

// cuCtxCreate/cuCtxDestroy by their versioned names: CUDA 13's header
// declares cuCtxCreate with other parameters (cuCtxCreate_v4), and the
// library's driver table has no use for either.
void* driver_symbol(const char* name) {
  static void* const handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  void* symbol = handle != nullptr ? dlsym(handle, name) : nullptr;
  if (symbol == nullptr) throw std::runtime_error(fmt::format("libcuda.so.1 has no {}", name));
  return symbol;
}

}  // namespace

CUcontext create_context() {
  using Create = CUresult (*)(CUcontext*, unsigned, CUdevice);
  static const auto create = reinterpret_cast<Create>(driver_symbol("cuCtxCreate_v2"));
  CUdevice device = 0;
  check_cuda(driver().cuDeviceGet(&device, 0), "cuDeviceGet");
  CUcontext context = nullptr;
  check_cuda(create(&context, 0, device), "cuCtxCreate_v2");
  return context;
}

void destroy_context(CUcontext context) {
  using Destroy = CUresult (*)(CUcontext);
  static const auto destroy = reinterpret_cast<Destroy>(driver_symbol("cuCtxDestroy_v2"));
  check_cuda(destroy(context), "cuCtxDestroy_v2");
}

std::string current_arch() {
  const auto& d = driver();
  CUdevice device = 0;
  int major = 0, minor = 0;
  check_cuda(d.cuCtxGetDevice(&device), "cuCtxGetDevice");
  d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  return detail::Arch::for_device(major, minor).text();
}

namespace {
int current_device_attribute(CUdevice_attribute attribute, const char* what) {
  const auto& d = driver();
  CUdevice device = 0;
  check_cuda(d.cuCtxGetDevice(&device), "cuCtxGetDevice");
  int value = 0;
  check_cuda(d.cuDeviceGetAttribute(&value, attribute, device), what);
  return value;
}
}  // namespace

int current_sm_count() {
  return current_device_attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "cuDeviceGetAttribute(SM count)");
}

int current_max_smem_per_block() {
  return current_device_attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                  "cuDeviceGetAttribute(shared memory per block, opt-in)");
}

bool sm90a_or_skip(const char* feature) {
  const std::string arch = current_arch();
  if (arch == "sm_90a") return true;
  MESSAGE("skipped: " << feature << " needs sm_90a, this GPU is " << arch);
  return false;
}

std::vector<std::string> warm_all(Runtime& runtime, const std::vector<std::string>& specs, const std::string& arch) {
  std::atomic<size_t> next{0};
  std::vector<std::string> failures(specs.size());
  std::vector<std::thread> workers;
  const unsigned count = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (unsigned w = 0; w < count; ++w) {
    workers.emplace_back([&] {
      for (size_t i; (i = next++) < specs.size();) {
        try {
          runtime.warm(specs[i], arch);
        } catch (const std::exception& e) {
          failures[i] = fmt::format("warm({}): {}", specs[i], e.what());
        }
      }
    });
  }
  for (auto& worker : workers) worker.join();
  failures.erase(std::remove(failures.begin(), failures.end(), std::string()), failures.end());
  return failures;
}

void warm_or_fail(const std::vector<std::string>& specs) {
  for (const auto& failure : warm_all(gpu_tests_runtime(), specs, current_arch())) FAIL_CHECK(failure);
}

double max_deviation(const std::vector<double>& reference, const std::vector<float>& values) {
  double worst = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double error = std::fabs(double(values[i]) - reference[i]);
    if (!(error <= worst)) worst = std::isnan(error) ? INFINITY : error;
  }
  return worst;
}

double max_deviation(const std::vector<double>& reference, const std::vector<double>& values) {
  double worst = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double error = std::fabs(values[i] - reference[i]);
    if (!(error <= worst)) worst = std::isnan(error) ? INFINITY : error;
  }
  return worst;
}

bool Verdict::ok() const {
  return non_finite == 0 && error <= 2 * yardstick + 1e-5 && lse_off == 0 && empty_rows_nonzero == 0;
}

std::string Verdict::summary() const {
  return fmt::format("max error {:.3g} (allowed 2 × 16-bit reference error {:.3g} + 1e-5); {} outputs NaN/inf; "
                     "{} lse values off; {} rows without keys not 0",
                     error, yardstick, non_finite, lse_off, empty_rows_nonzero);
}

Verdict judge(const AttentionShape& s, const std::vector<float>& out, const std::vector<float>& lse,
              const ReferenceOutput& exact, const ReferenceOutput& rounded) {
  Verdict verdict;
  for (float x : out) verdict.non_finite += !std::isfinite(x);
  verdict.error = max_deviation(exact.out, out);
  verdict.yardstick = max_deviation(exact.out, rounded.out);
  // JITATTN_TEST_ERRORS=1 prints every check's error against its yardstick,
  // and its LSE's, to compare the accuracy of template variants (not only
  // pass / fail) and to size tolerances.
  if (std::getenv("JITATTN_TEST_ERRORS") != nullptr) {
    fmt::print("error/yardstick {:.3f} (error {:.3g}, yardstick {:.3g})\n",
               verdict.yardstick > 0 ? verdict.error / verdict.yardstick : 0.0, verdict.error, verdict.yardstick);
  }
  // The 16-bit reference's largest LSE error: the yardstick for LSEs, as its
  // largest output error is for outputs.
  double lse_yardstick = 0;
  for (size_t i = 0; i < std::min(exact.lse.size(), rounded.lse.size()); ++i) {
    if (std::isfinite(exact.lse[i]) && std::isfinite(rounded.lse[i])) {
      lse_yardstick = std::max(lse_yardstick, std::fabs(rounded.lse[i] - exact.lse[i]));
    }
  }
  double lse_error = 0, lse_relative = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    const double want = exact.lse[i];
    const double got = lse[i];
    const bool ok = std::isinf(want) ? (std::isinf(got) && got < 0)
                                     : std::fabs(got - want) <= std::max({1e-3 * std::max(1.0, std::fabs(want)),
                                                                          2 * lse_yardstick + 1e-4,
                                                                          2 * rounded.logit_rounding + 1e-4});
    verdict.lse_off += !ok;
    if (std::isfinite(want) && std::isfinite(got)) {
      lse_error = std::max(lse_error, std::fabs(got - want));
      lse_relative = std::max(lse_relative, std::fabs(got - want) / std::max(1.0, std::fabs(want)));
    }
  }
  if (std::getenv("JITATTN_TEST_ERRORS") != nullptr && !lse.empty()) {
    fmt::print("lse error {:.3g} (relative {:.3g}, 16-bit reference {:.3g}, logit rounding {:.3g}, softcap {})\n",
               lse_error, lse_relative, lse_yardstick, rounded.logit_rounding, s.softcap);
  }
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads_q; ++h) {
      for (int i = 0; i < s.seqlen_q; ++i) {
        // A row that sees no key has lse -inf, or exactly its head's sink
        // (a row with keys lies above it, unless the sink outweighs them by
        // e^36, which the tests' sinks never do).
        const double row_lse = exact.lse[(static_cast<size_t>(b) * s.heads_q + h) * s.seqlen_q + i];
        if (!std::isinf(row_lse) && !(!s.learnable_sink.empty() && row_lse == s.sink(h))) continue;
        const size_t row = ((static_cast<size_t>(b) * s.seqlen_q + i) * s.heads_q + h) * s.value_dim();
        bool zero = true;
        for (int d = 0; d < s.value_dim(); ++d) zero = zero && out[row + d] == 0.f;
        verdict.empty_rows_nonzero += !zero;
      }
    }
  }
  return verdict;
}

Verdict judge_varlen(const VarlenShape& s, const std::vector<float>& out, const std::vector<float>& lse,
                     const ReferenceOutput& exact, const ReferenceOutput& rounded) {
  s.check();
  const int used = s.used_q();
  const size_t row = static_cast<size_t>(s.common.heads_q) * s.common.value_dim();  // out's packed row
  // The owned rows are a prefix of out and, per head, of lse: as one dense
  // batch-1 problem of `used` rows, judge() reads them in its own layouts.
  auto owned_rows = [&](const auto& packed) {
    using Vector = std::decay_t<decltype(packed)>;
    if (packed.size() != s.total_q * row) throw std::invalid_argument("judge_varlen: out must hold total_q rows");
    return Vector(packed.begin(), packed.begin() + used * row);
  };
  auto owned_lse = [&](const auto& packed) {
    using Vector = std::decay_t<decltype(packed)>;
    if (packed.size() != static_cast<size_t>(s.common.heads_q) * s.total_q) {
      throw std::invalid_argument("judge_varlen: lse must be [heads_q, total_q]");
    }
    Vector owned;
    for (int h = 0; h < s.common.heads_q; ++h) {
      const auto first = packed.begin() + static_cast<size_t>(h) * s.total_q;
      owned.insert(owned.end(), first, first + used);
    }
    return owned;
  };
  AttentionShape flat = s.common;
  flat.batch = 1;
  flat.seqlen_q = used;
  flat.alibi_slopes.clear();
  ReferenceOutput exact_owned{owned_rows(exact.out), owned_lse(exact.lse)};
  ReferenceOutput rounded_owned{owned_rows(rounded.out), owned_lse(rounded.lse), rounded.logit_rounding};
  return judge(flat, owned_rows(out), lse.empty() ? std::vector<float>() : owned_lse(lse), exact_owned, rounded_owned);
}

std::vector<float> random_sinks(int heads, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(-2.f, 4.f);
  std::vector<float> sinks(heads);
  for (auto& sink : sinks) sink = uniform(rng);
  sinks[0] = 6.f;
  if (heads >= 4) sinks[1] = -std::numeric_limits<float>::infinity();
  return sinks;
}

size_t count_empty_rows(const ReferenceOutput& exact) {
  return static_cast<size_t>(std::count_if(exact.lse.begin(), exact.lse.end(), [](double x) { return std::isinf(x); }));
}

}  // namespace jitattn::test
