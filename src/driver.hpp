// driver: the CUDA driver API, loaded at run time (dlopen libcuda.so.1) with
// every entry point resolved through cuGetProcAddress for the API version this
// code was written against — never dlsym on plain names, which returns legacy
// ABI variants (cuMemAlloc vs cuMemAlloc_v2).
#pragma once

#include <cuda.h>

#include <string>

namespace jitattn::detail {

struct Driver {
  bool available = false;
  std::string error;  // why it is unavailable
  int version = 0;    // cuDriverGetVersion, e.g. 13000

  // Each pointer is resolved by the name written here. Where cuda.h renames a
  // function to another name (not a _vN suffix), list that name itself:
  // "cuGraphInstantiate" at API 12000 resolves to the legacy 5-argument
  // cuGraphInstantiate_v2, while the header's cuGraphInstantiate means
  // cuGraphInstantiateWithFlags (seen crashing on the H200 host).
#define JITATTN_DRIVER_FUNCTIONS(X)                                                     \
  X(cuGetErrorName) X(cuGetErrorString) X(cuInit) X(cuDriverGetVersion)                 \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute) X(cuDeviceGetName)         \
  X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuCtxGetCurrent) X(cuCtxSetCurrent) \
  X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuStreamGetCtx) X(cuCtxGetDevice)            \
  X(cuCtxSynchronize) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)      \
  X(cuModuleGetLoadingMode) X(cuLibraryLoadData) X(cuLibraryUnload)                     \
  X(cuLibraryGetKernel) X(cuKernelGetFunction) X(cuFuncSetAttribute)                    \
  X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuLaunchKernelEx) X(cuMemGetInfo)           \
  X(cuStreamIsCapturing) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)    \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiateWithFlags)          \
  X(cuGraphLaunch) X(cuGraphDestroy) X(cuGraphExecDestroy) X(cuMemAlloc) X(cuMemFree)   \
  X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemsetD8) X(cuMemsetD32) X(cuEventCreate)         \
  X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy)        \
  X(cuTensorMapEncodeTiled)

#define JITATTN_DECLARE_POINTER(name) decltype(&::name) name = nullptr;
  JITATTN_DRIVER_FUNCTIONS(JITATTN_DECLARE_POINTER)
#undef JITATTN_DECLARE_POINTER
  // cuCtxGetId (CUDA 12.0+): a context id that is never reused, unlike the
  // CUcontext pointer. Null on older drivers.
  CUresult (*cuCtxGetId)(CUcontext, unsigned long long*) = nullptr;
};

// Loads the driver once and calls cuInit. Thread-safe. Never throws: check
// `available` (there is no GPU on a build or CI machine).
const Driver& driver();

// The calling thread's current context; if it has none, device 0's primary
// context, retained once for the life of the process and made current (what
// the CUDA runtime does). Throws Error(cuda_error) when no GPU is usable.
CUcontext current_or_primary_context();

// Throws Error(cuda_error) naming `what` and the driver's error if status != CUDA_SUCCESS.
void check_cuda(CUresult status, const char* what);
// The same for a step of one kernel's life (load, launch): the error carries
// `spec` (Error::spec) and names it, with `context` (arch, cache key, grid).
void check_cuda(CUresult status, const char* what, const std::string& spec, const std::string& context);

}  // namespace jitattn::detail
