// kernels: turns a KernelSpec into a launchable function.
//   KernelBuilder  — render → cache key → disk cache or NVRTC. Needs no GPU.
//   KernelRegistry — per (arch, spec) one library loaded from its cubin,
//                    per (CUDA context, spec) its function; thread-safe. A
//                    hit is one shared-lock map lookup: no rendering, no
//                    hashing of source, no file I/O.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "cache.hpp"
#include "driver.hpp"
#include "render.hpp"
#include "spec.hpp"

namespace jitattn::detail {

struct BuiltKernel {
  Entry entry;
  bool cache_hit = false;
  std::string store_error;  // compiled but not stored in the disk cache: why ("" otherwise)
};

class KernelBuilder {
 public:
  KernelBuilder(TemplateSet templates, std::unique_ptr<Cache> cache);
  // With allow_compile false a cache miss throws Error(graph_capture) instead
  // of compiling (used while the caller's stream is being captured).
  BuiltKernel build(const KernelSpec& spec, const Arch& arch, bool allow_compile = true);
  Cache& cache() { return *cache_; }
  const TemplateSet& templates() const { return templates_; }

 private:
  TemplateSet templates_;
  std::unique_ptr<Cache> cache_;
};

struct DeviceInfo {
  CUdevice device = 0;
  Arch arch;
  int sm_count = 0;
  int max_smem_per_block = 0;  // opt-in limit for dynamic shared memory
};

struct LoadedKernel {
  CUfunction function = nullptr;  // in the context it was looked up for
  unsigned threads = 0;
  unsigned smem_bytes = 0;
  std::string spec;  // its KernelSpec text, for errors
};

// The context a call runs in (KernelRegistry::context_for).
struct ContextRef {
  CUcontext context = nullptr;
  uint64_t id = 0;
  bool current = true;  // the calling thread's current context
};

// Makes a call's context current on this thread for the scope's life where
// it is not already (cuCtxPushCurrent, then cuCtxPopCurrent).
class ContextScope {
 public:
  explicit ContextScope(const ContextRef& context);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  bool pushed_ = false;
};

class KernelRegistry {
 public:
  explicit KernelRegistry(KernelBuilder& builder) : builder_(builder) {}
  ~KernelRegistry();

  // Throws Error(cuda_error) when no GPU is usable.
  // The calling thread's current context; if it has none, device 0's
  // primary context, made current (as the CUDA runtime would).
  ContextRef current_context();
  // The context a call on `stream` runs in: the stream's own (the context
  // current where it was created, whatever is current now); for the NULL,
  // legacy and per-thread streams current_context().
  ContextRef context_for(CUstream stream);
  // (Made current: ContextScope.)
  const DeviceInfo& device_info(const ContextRef& context);
  // The loaded function for spec in this context; builds or loads it on first
  // use. `stream` is checked for graph capture before anything is compiled.
  const LoadedKernel& get(const KernelSpec& spec, const ContextRef& context, const DeviceInfo& device,
                          CUstream stream);

 private:
  struct Key {
    uint64_t context_id;
    uint64_t spec;
    bool operator==(const Key& o) const { return context_id == o.context_id && spec == o.spec; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return std::hash<uint64_t>()(k.context_id * 0x9e3779b97f4a7c15ull ^ k.spec); }
  };
  struct Slot {
    std::mutex loading;
    std::atomic<bool> ready{false};
    LoadedKernel kernel;
  };
  // A kernel's cubin loaded once per process for every context
  // (cuLibraryLoadData): it belongs to no context, so it is unloaded at the
  // end without one, whichever contexts the caller has destroyed meanwhile,
  // and a second context (another GPU) takes its function from it without
  // reading the cache again. Keyed by (arch number and 'a', spec).
  struct Library {
    std::mutex loading;
    bool loaded = false;  // under `loading`
    // NVRTC's rejection of this kernel's source (SourceRejected), the same
    // on every try: threads waiting for the kernel, and later calls, get it
    // at once instead of compiling it again each. Other failures (NVRTC out
    // of memory, a capture) are tried again.
    std::exception_ptr compile_failure;
    CUlibrary library = nullptr;
    CUkernel kernel = nullptr;
    std::string where;  // "on sm_90a (cache key ...)", for errors
  };
  Library& library(const KernelSpec& spec, const Arch& arch, bool allow_compile);
  LoadedKernel load(const KernelSpec& spec, const DeviceInfo& device, CUstream stream);

  KernelBuilder& builder_;
  std::shared_mutex mutex_;
  std::unordered_map<uint64_t, std::unique_ptr<DeviceInfo>> devices_;
  std::unordered_map<Key, std::unique_ptr<Slot>, KeyHash> kernels_;
  std::unordered_map<Key, std::unique_ptr<Library>, KeyHash> libraries_;  // Key::context_id is the arch
};

}  // namespace jitattn::detail
