#include "driver.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <memory>

#include <jitattn/jitattn.hpp>

namespace jitattn::detail {
namespace {

// The driver API version the calls below were written against.
constexpr int kDriverApiVersion = 12000;

using GetProcAddressV2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using GetProcAddressV1 = CUresult (*)(const char*, void**, int, cuuint64_t);

std::unique_ptr<Driver> load_driver() {
  auto driver = std::make_unique<Driver>();
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) handle = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    driver->error = "libcuda.so.1 not found: no NVIDIA driver on this host";
    return driver;
  }
  auto get_v2 = reinterpret_cast<GetProcAddressV2>(dlsym(handle, "cuGetProcAddress_v2"));
  auto get_v1 = reinterpret_cast<GetProcAddressV1>(dlsym(handle, "cuGetProcAddress"));
  if (get_v2 == nullptr && get_v1 == nullptr) {
    driver->error = "libcuda has no cuGetProcAddress: the driver is older than CUDA 11.3";
    return driver;
  }
  std::string missing;
  auto resolve = [&](const char* name, void** pointer) {
    CUresult status = get_v2 != nullptr
                          ? get_v2(name, pointer, kDriverApiVersion, CU_GET_PROC_ADDRESS_DEFAULT, nullptr)
                          : get_v1(name, pointer, kDriverApiVersion, CU_GET_PROC_ADDRESS_DEFAULT);
    if (status != CUDA_SUCCESS || *pointer == nullptr) {
      *pointer = nullptr;
      return false;
    }
    return true;
  };
#define JITATTN_RESOLVE(name)                                              \
  if (!resolve(#name, reinterpret_cast<void**>(&driver->name))) {          \
    missing += (missing.empty() ? "" : ", ") + std::string(#name);         \
  }
  JITATTN_DRIVER_FUNCTIONS(JITATTN_RESOLVE)
#undef JITATTN_RESOLVE
  resolve("cuCtxGetId", reinterpret_cast<void**>(&driver->cuCtxGetId));
  if (!missing.empty()) {
    driver->error = fmt::format("the CUDA driver lacks {} (CUDA 12.0 or newer is needed)", missing);
    return driver;
  }
  CUresult status = driver->cuInit(0);
  if (status != CUDA_SUCCESS) {
    const char* name = nullptr;
    driver->cuGetErrorName(status, &name);
    driver->error = fmt::format("cuInit failed: {}", name != nullptr ? name : "unknown error");
    return driver;
  }
  driver->cuDriverGetVersion(&driver->version);
  int devices = 0;
  driver->cuDeviceGetCount(&devices);
  if (devices == 0) {
    driver->error = "the CUDA driver reports no device";
    return driver;
  }
  driver->available = true;
  return driver;
}

}  // namespace

const Driver& driver() {
  // Never destroyed: a Runtime destroyed after it (a function-local static
  // one, or a thread still calling in at exit) unloads and launches through it.
  static const Driver* const instance = load_driver().release();
  return *instance;
}

CUcontext current_or_primary_context() {
  const Driver& d = driver();
  if (!d.available) throw Error(ErrorCode::cuda_error, fmt::format("no usable GPU: {}", d.error));
  CUcontext current = nullptr;
  check_cuda(d.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != nullptr) return current;
  static const CUcontext primary = [&] {
    CUdevice device = 0;
    check_cuda(d.cuDeviceGet(&device, 0), "cuDeviceGet(0)");
    CUcontext context = nullptr;
    check_cuda(d.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
    return context;
  }();
  check_cuda(d.cuCtxSetCurrent(primary), "cuCtxSetCurrent");
  return primary;
}

namespace {

// "CUDA_ERROR_X (its description)"
std::string cuda_error_text(CUresult status) {
  const Driver& d = driver();
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName != nullptr) d.cuGetErrorName(status, &name);
  if (d.cuGetErrorString != nullptr) d.cuGetErrorString(status, &text);
  return fmt::format("{} ({})", name != nullptr ? name : "?", text != nullptr ? text : "no description");
}

}  // namespace

void check_cuda(CUresult status, const char* what) {
  if (status == CUDA_SUCCESS) return;
  throw Error(ErrorCode::cuda_error, fmt::format("{} failed: {}", what, cuda_error_text(status)));
}

void check_cuda(CUresult status, const char* what, const std::string& spec, const std::string& context) {
  if (status == CUDA_SUCCESS) return;
  throw Error(ErrorCode::cuda_error,
              fmt::format("{} failed for {} {}: {}", what, spec, context, cuda_error_text(status)), spec);
}

}  // namespace jitattn::detail
