#include "kernels.hpp"

#include <fmt/format.h>

#include <chrono>
#include <ctime>

#include "compile.hpp"
#include "log.hpp"

namespace jitattn::detail {

KernelBuilder::KernelBuilder(TemplateSet templates, std::unique_ptr<Cache> cache)
    : templates_(std::move(templates)), cache_(std::move(cache)) {}

BuiltKernel KernelBuilder::build(const KernelSpec& spec, const Arch& arch, bool allow_compile) {
  const std::string spec_text = spec.text();
  const std::string source = render(spec, templates_);
  const NvrtcInfo& nvrtc = nvrtc_info();
  CacheKeyInputs inputs{source, compile_options(arch), arch.text(), nvrtc.version(), JITATTN_VERSION_STRING};
  const std::string any_key = make_any_compiler_key(inputs);
  if (!nvrtc.available) {
    // No compiler here: the kernel some host with NVRTC stored for this
    // library version, or nothing.
    if (std::optional<std::string> key = cache_->linked(any_key)) {
      std::optional<Entry> hit = cache_->get(*key);
      // (The entry must be what was asked for: a link is only a file.)
      if (hit && hit->meta.spec == spec_text && hit->meta.arch == arch.text() &&
          hit->meta.library_version == JITATTN_VERSION_STRING) {
        return {std::move(*hit), true, ""};
      }
    }
    throw Error(ErrorCode::unsupported,
                fmt::format("{} for {} is not in the cache ({}) and cannot be compiled here: {}", spec_text,
                            arch.text(), cache_->location(), nvrtc.error),
                spec_text);
  }
  const std::string key = make_cache_key(inputs);
  // While a stream is being captured a miss cannot compile: look once,
  // without waiting for another process's lock on the key.
  if (!allow_compile) {
    if (std::optional<Entry> hit = cache_->get(key)) {
      cache_->link(any_key, key, nvrtc.version());
      return {std::move(*hit), true, ""};
    }
    throw Error(ErrorCode::graph_capture,
                fmt::format("{} for {} is not compiled yet and the stream is being captured into a "
                            "CUDA graph: warm it first (make the same call once before capture, or "
                            "run `jitattn warm {} --arch {}`)",
                            spec_text, arch.text(), spec_text, arch.text()),
                spec_text);
  }
  bool built = false;
  std::string store_error;
  Entry entry = cache_->get_or_build(
      key,
      [&] {
        CompileOutput compiled = compile_cubin(source, spec_text + ".cu", arch, spec_text);
        Entry fresh;
        fresh.meta.key = key;
        fresh.meta.spec = spec_text;
        fresh.meta.arch = arch.text();
        fresh.meta.nvrtc_version = nvrtc.version();
        fresh.meta.library_version = JITATTN_VERSION_STRING;
        fresh.meta.compile_seconds = compiled.seconds;
        fresh.meta.created_unix = static_cast<int64_t>(std::time(nullptr));
        fresh.meta.cubin_bytes = compiled.cubin.size();
        fresh.meta.any_key = any_key;
        fresh.cubin = std::move(compiled.cubin);
        return fresh;
      },
      &built, &store_error);
  if (store_error.empty()) cache_->link(any_key, key, nvrtc.version());
  return {std::move(entry), !built, std::move(store_error)};
}

KernelRegistry::~KernelRegistry() {
  // Libraries belong to no context: unloading them is valid whatever the
  // caller did with its contexts (each context's copy went with it).
  const Driver& d = driver();
  if (!d.available) return;
  for (auto& [key, library] : libraries_) {
    if (library->loaded) d.cuLibraryUnload(library->library);
  }
}

namespace {

uint64_t context_id(CUcontext context) {
  const Driver& d = driver();
  unsigned long long id = 0;
  if (d.cuCtxGetId != nullptr && d.cuCtxGetId(context, &id) == CUDA_SUCCESS) return id;
  return reinterpret_cast<uint64_t>(context);
}

}  // namespace

ContextScope::ContextScope(const ContextRef& context) {
  if (context.current) return;
  check_cuda(driver().cuCtxPushCurrent(context.context), "cuCtxPushCurrent(the stream's context)");
  pushed_ = true;
}

ContextScope::~ContextScope() {
  CUcontext popped = nullptr;
  if (pushed_) driver().cuCtxPopCurrent(&popped);
}

ContextRef KernelRegistry::current_context() {
  ContextRef ref;
  ref.context = current_or_primary_context();
  ref.id = context_id(ref.context);
  return ref;
}

ContextRef KernelRegistry::context_for(CUstream stream) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return current_context();
  // A stream of its own context: no primary context is retained or made
  // current for it (a worker thread of another GPU with none current).
  const Driver& d = driver();
  if (!d.available) throw Error(ErrorCode::cuda_error, fmt::format("no usable GPU: {}", d.error));
  CUcontext current = nullptr, own = nullptr;
  check_cuda(d.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  check_cuda(d.cuStreamGetCtx(stream, &own), "cuStreamGetCtx(stream)");
  return {own, context_id(own), own == current};
}

const DeviceInfo& KernelRegistry::device_info(const ContextRef& context) {
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = devices_.find(context.id);
    if (it != devices_.end()) return *it->second;
  }
  const Driver& d = driver();
  auto info = std::make_unique<DeviceInfo>();
  check_cuda(d.cuCtxGetDevice(&info->device), "cuCtxGetDevice");
  int major = 0, minor = 0;
  check_cuda(d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, info->device), "cuDeviceGetAttribute");
  check_cuda(d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, info->device), "cuDeviceGetAttribute");
  check_cuda(d.cuDeviceGetAttribute(&info->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, info->device), "cuDeviceGetAttribute");
  check_cuda(d.cuDeviceGetAttribute(&info->max_smem_per_block, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, info->device),
             "cuDeviceGetAttribute");
  if (major < 8) {
    throw Error(ErrorCode::unsupported,
                fmt::format("device {} has compute capability {}.{}; jitattn needs 8.0 or newer", info->device, major, minor));
  }
  info->arch = Arch::for_device(major, minor);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  auto& slot = devices_[context.id];
  if (!slot) slot = std::move(info);
  return *slot;
}

const LoadedKernel& KernelRegistry::get(const KernelSpec& spec, const ContextRef& context,
                                        const DeviceInfo& device, CUstream stream) {
  const Key key{context.id, spec.packed()};
  Slot* slot = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = kernels_.find(key);
    if (it != kernels_.end()) {
      slot = it->second.get();
      if (slot->ready.load(std::memory_order_acquire)) return slot->kernel;
    }
  }
  if (slot == nullptr) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto& owned = kernels_[key];
    if (!owned) owned = std::make_unique<Slot>();
    slot = owned.get();
  }
  // One thread loads a given kernel; others wait for it here.
  std::lock_guard<std::mutex> loading(slot->loading);
  if (!slot->ready.load(std::memory_order_acquire)) {
    slot->kernel = load(spec, device, stream);
    slot->ready.store(true, std::memory_order_release);
  }
  return slot->kernel;
}

KernelRegistry::Library& KernelRegistry::library(const KernelSpec& spec, const Arch& arch, bool allow_compile) {
  const Key key{static_cast<uint64_t>(arch.number() * 2 + arch.arch_specific), spec.packed()};
  Library* library = nullptr;
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto& owned = libraries_[key];
    if (!owned) owned = std::make_unique<Library>();
    library = owned.get();
  }
  // One thread builds and loads a given library; others wait for it here.
  std::lock_guard<std::mutex> loading(library->loading);
  if (library->loaded) return *library;
  if (library->compile_failure) std::rethrow_exception(library->compile_failure);
  const auto start = std::chrono::steady_clock::now();
  const BuiltKernel built = [&] {
    try {
      return builder_.build(spec, arch, allow_compile);
    } catch (const SourceRejected&) {
      library->compile_failure = std::current_exception();
      throw;
    }
  }();
  const std::string spec_text = spec.text();
  // Errors name the kernel and its cache key (entries are <cache dir>/v1/kernels/<key>.entry).
  std::string where = fmt::format("on {} (cache key {})", arch.text(), built.entry.meta.key);
  const Driver& d = driver();
  CUlibrary loaded = nullptr;
  const CUresult load_status =
      d.cuLibraryLoadData(&loaded, built.entry.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (load_status != CUDA_SUCCESS) {
    // Eager loading puts a library into every context, those of GPUs of
    // another architecture included, where this cubin cannot load.
    CUmoduleLoadingMode mode = CU_MODULE_LAZY_LOADING;
    if (d.cuModuleGetLoadingMode(&mode) == CUDA_SUCCESS && mode == CU_MODULE_EAGER_LOADING) {
      where += " (CUDA_MODULE_LOADING=EAGER loads each kernel into every context, GPUs of other architectures "
               "included: use LAZY, the default since CUDA 12.2)";
    }
    check_cuda(load_status, "cuLibraryLoadData", spec_text, where);
  }
  CUkernel kernel = nullptr;
  const CUresult found = d.cuLibraryGetKernel(&kernel, loaded, entry_name(spec));
  if (found != CUDA_SUCCESS) {
    d.cuLibraryUnload(loaded);
    check_cuda(found, "cuLibraryGetKernel", spec_text, where);
  }
  library->library = loaded;
  library->kernel = kernel;
  library->where = std::move(where);
  library->loaded = true;
  log(LogLevel::info, "loaded {} for {} ({}, {:.1f} ms)", spec_text, arch.text(),
      built.cache_hit ? "disk cache hit" : fmt::format("compiled in {:.2f} s", built.entry.meta.compile_seconds),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  return *library;
}

LoadedKernel KernelRegistry::load(const KernelSpec& spec, const DeviceInfo& device, CUstream stream) {
  const Driver& d = driver();
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check_cuda(d.cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  // Drivers before CUDA 12.3 invalidate a capture that loads a module (even
  // a disk-cache hit's): such a call must be made once before capture.
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE && d.version < 12030) {
    throw Error(ErrorCode::graph_capture,
                fmt::format("{} for {} is not loaded in this context yet, and this driver (CUDA {}.{}) cannot load "
                            "a module while a stream is being captured (12.3 and newer can): make the same call "
                            "once before capture",
                            spec.text(), device.arch.text(), d.version / 1000, d.version % 1000 / 10),
                spec.text());
  }
  const Library& library = this->library(spec, device.arch, capture == CU_STREAM_CAPTURE_STATUS_NONE);
  LoadedKernel kernel;
  kernel.threads = static_cast<unsigned>(spec.threads());
  kernel.smem_bytes = static_cast<unsigned>(spec.smem_bytes());
  kernel.spec = spec.text();
  check_cuda(d.cuKernelGetFunction(&kernel.function, library.kernel), "cuKernelGetFunction", kernel.spec,
             library.where);
  // Above 48 KB a kernel must opt in to its dynamic shared memory.
  check_cuda(d.cuFuncSetAttribute(kernel.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  static_cast<int>(kernel.smem_bytes)),
             "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", kernel.spec, library.where);
  return kernel;
}

}  // namespace jitattn::detail
