// api: the C++ entry points. A forward call is plan → registry lookup →
// cuLaunchKernelEx on the caller's stream; nothing is allocated and nothing
// synchronizes, so calls can be captured into CUDA graphs once warm.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <type_traits>

#include <jitattn/jitattn.hpp>

#include "cache.hpp"
#include "kernels.hpp"
#include "log.hpp"
#include "compile.hpp"
#include "config_env.hpp"
#include "merge.hpp"
#include "plan.hpp"
#include "tune.hpp"

namespace jitattn {

using namespace detail;

namespace {

// The driver needs 64-byte alignment (cuda.h's CUtensorMap may declare more).
static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) % 64 == 0,
              "FwdParams' tensor maps must be CUtensorMaps");

// One plan map → its CUtensorMap: 128-byte swizzled boxes (wgmma's panel
// layout), zero-filled outside the tensor.
void encode_tile_map(const TileMapLayout& layout, TensorMap& map, const KernelSpec& spec, const char* name) {
  if (layout.rank == 0) return;  // no keys: the kernel copies nothing
  const uint32_t element_strides[5] = {1, 1, 1, 1, 1};
  const CUresult status = driver().cuTensorMapEncodeTiled(
      reinterpret_cast<CUtensorMap*>(&map),
      layout.dtype == DType::bf16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
      : layout.dtype == DType::f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      static_cast<cuuint32_t>(layout.rank), const_cast<void*>(layout.base), layout.dims, layout.strides_bytes,
      layout.box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      layout.swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    const int rank = layout.rank;
    check_cuda(status, fmt::format("cuTensorMapEncodeTiled({} of {}: dims {}, strides {} bytes, box {})", name,
                                   spec.text(), fmt::join(layout.dims, layout.dims + rank, "x"),
                                   fmt::join(layout.strides_bytes, layout.strides_bytes + rank - 1, "/"),
                                   fmt::join(layout.box, layout.box + rank, "x"))
                           .c_str());
  }
}

// Plans whose kernel reads K/V, or stages RoPE tables, by tensor copies get
// their maps encoded.
void encode_tensor_maps(ForwardPlan& plan) {
  if (plan.params.rope_tables_staged != 0) {
    encode_tile_map(plan.rope_cos_map, plan.params.rope_cos_map, plan.spec, "options.rope.cos");
    encode_tile_map(plan.rope_sin_map, plan.params.rope_sin_map, plan.spec, "options.rope.sin");
  }
  if (!plan.spec.tensor_copies()) return;
  encode_tile_map(plan.k_map, plan.params.k_map, plan.spec, "k");
  encode_tile_map(plan.v_map, plan.params.v_map, plan.spec, "v");
}
template <typename OtherPlan>
void encode_tensor_maps(OtherPlan&) {}

}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, std::vector<int64_t> shape) {
  if (shape.empty() || shape.size() > 4) {
    throw Error(ErrorCode::invalid_argument, fmt::format("TensorView::contiguous: {} dimensions (1 to 4 allowed)", shape.size()));
  }
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.ndim = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int axis = view.ndim - 1; axis >= 0; --axis) {
    view.shape[axis] = shape[axis];
    view.strides[axis] = stride;
    stride *= shape[axis];
  }
  return view;
}

namespace detail {

Config config_from_env(const GivenSettings& given) {
  Config config;
  if (given.cache_dir != nullptr) {
    config.cache_dir = given.cache_dir;
  } else if (const char* dir = std::getenv("JITATTN_CACHE_DIR")) {
    config.cache_dir = dir;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') {
    // (The XDG spec has a relative XDG_CACHE_HOME ignored.)
    config.cache_dir = std::string(xdg) + "/jitattn";
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    config.cache_dir = std::string(home) + "/.cache/jitattn";
  } else {
    // Services started without a home (systemd units, some containers):
    // say so, or every process would compile its kernels without a word.
    log(LogLevel::warn, "no cache directory: none of JITATTN_CACHE_DIR, XDG_CACHE_HOME or HOME is set; kernels are "
                        "compiled in every process (set JITATTN_CACHE_DIR to keep them)");
  }
  if (given.template_dir != nullptr) {
    config.template_dir = given.template_dir;
  } else if (const char* dir = std::getenv("JITATTN_TEMPLATE_DIR")) {
    config.template_dir = dir;
  }
  if (given.log_level) {
    config.log_level = *given.log_level;
  } else if (const char* level = std::getenv("JITATTN_LOG")) {
    config.log_level = parse_log_level(level);
  }
  if (const char* pdl = std::getenv("JITATTN_PROGRAMMATIC_LAUNCH")) config.programmatic_launch = std::string(pdl) != "0";
  return config;
}

}  // namespace detail

Config Config::from_env() { return detail::config_from_env(); }

namespace {

// The device a plan is made for.
struct PlanningTarget {
  Arch arch;
  int max_smem_bytes;
  int sm_count;
};

}  // namespace

struct Runtime::Impl {
  explicit Impl(Config c)
      : config(std::move(c)),
        builder(TemplateSet(config.template_dir),
                config.cache_dir.empty() ? std::unique_ptr<Cache>(new NoCache())
                                         : std::unique_ptr<Cache>(new FileCache(config.cache_dir))),
        registry(builder),
        tuning(TuningTable::load(config.cache_dir, JITATTN_VERSION_STRING, nvrtc_info().version())) {}

  // The context a call on `stream` runs in (the stream's). Without a GPU
  // the call is still planned (for an H200), so that bad input is reported
  // as it would be with one; then the missing GPU is.
  template <typename Plan>
  ContextRef context_for_call(Plan&& plan, CUstream stream) {
    if (!driver().available) {
      // Bad arguments still get their own error first, planned for the
      // target the sizing calls (kvcache_workspace_bytes, ...) assume, so a
      // workspace they sized passes.
      const PlanningTarget t = planning_target();
      plan(t.arch, t.max_smem_bytes, t.sm_count, &tuning);
      throw Error(ErrorCode::cuda_error, fmt::format("no usable GPU: {}", driver().error));
    }
    return registry.context_for(stream);
  }

  // The context's device, with plan(arch, max_smem_bytes, sm_count, tuning)
  // made for it (the context made current: ContextScope).
  template <typename Planned>
  struct DeviceCall {
    const DeviceInfo& device;
    Planned planned;
  };
  template <typename Plan>
  auto plan_on_device(Plan&& plan, const ContextRef& context) {
    const DeviceInfo& device = registry.device_info(context);
    using Planned = decltype(plan(device.arch, device.max_smem_per_block, device.sm_count, &tuning));
    return DeviceCall<Planned>{device, plan(device.arch, device.max_smem_per_block, device.sm_count, &tuning)};
  }

  // A call of one launch: plan (ForwardPlan, CombinePlan: spec, params,
  // grid), then launch it in the stream's context: the one path every such
  // call takes. Blocks are spec.threads() wide.
  template <typename Plan>
  void run(Plan&& plan, Stream stream) {
    auto cu_stream = static_cast<CUstream>(stream);
    const ContextRef context = context_for_call(plan, cu_stream);
    const ContextScope scope(context);
    auto call = plan_on_device(plan, context);
    if (call.planned.grid == 0) return;  // empty batch or no query rows: nothing to write
    const LoadedKernel& kernel = registry.get(call.planned.spec, context, call.device, cu_stream);
    encode_tensor_maps(call.planned);
    launch(kernel, call.planned.grid, &call.planned.params, call.device, cu_stream);
  }

  // Every launch: one CTA per grid index, kernel.threads wide. On sm_90 and
  // newer it is a programmatic dependent of the previous work on the stream
  // (unless the config turns that off): every kernel begins by waiting for
  // that work (griddepcontrol.wait, ptx.cuh), so only the launch itself
  // overlaps it. Stream capture records a programmatic edge.
  void launch(const LoadedKernel& kernel, unsigned grid, void* params, const DeviceInfo& device, CUstream stream) {
    void* arguments[] = {params};
    CUlaunchConfig launch_config{};
    launch_config.gridDimX = grid;
    launch_config.gridDimY = launch_config.gridDimZ = 1;
    launch_config.blockDimX = kernel.threads;
    launch_config.blockDimY = launch_config.blockDimZ = 1;
    launch_config.sharedMemBytes = kernel.smem_bytes;
    launch_config.hStream = stream;
    CUlaunchAttribute attribute{};
    attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    if (config.programmatic_launch && device.arch.major >= 9) {
      launch_config.attrs = &attribute;
      launch_config.numAttrs = 1;
    }
    const CUresult status = driver().cuLaunchKernelEx(&launch_config, kernel.function, arguments, nullptr);
    if (status != CUDA_SUCCESS) {  // (the context is formatted only on failure: launches are the hot path)
      check_cuda(status, "cuLaunchKernelEx", kernel.spec,
                 fmt::format("(grid {} × {} threads, {} bytes of shared memory)", grid, kernel.threads,
                             kernel.smem_bytes));
    }
  }

  // Calls of several launches: forward_kvcache (append, attention, combine)
  // and forward with a workspace (attention, combine). plan(arch,
  // max_smem_bytes, sm_count, tuning) → a KVCachePlan or SplitForwardPlan.
  // Every kernel is loaded (compiled if need be) before the first launch,
  // so a failure launches nothing.
  template <typename Plan>
  void run_sequence(Plan&& plan, Stream stream) {
    auto cu_stream = static_cast<CUstream>(stream);
    const ContextRef context = context_for_call(plan, cu_stream);
    const ContextScope scope(context);
    auto call = plan_on_device(plan, context);
    auto& planned = call.planned;
    AppendPlan* append_plan = nullptr;
    if constexpr (std::is_same_v<std::decay_t<decltype(planned)>, KVCachePlan>) {
      if (planned.append.grid != 0) append_plan = &planned.append;
    }
    // No query rows: nothing to attend, but new keys are still appended.
    const bool attends = planned.attention.grid != 0;
    if (!attends && append_plan == nullptr) return;
    auto load = [&](const KernelSpec& spec) -> const LoadedKernel& {
      return registry.get(spec, context, call.device, cu_stream);
    };
    const LoadedKernel* append = append_plan ? &load(append_plan->spec) : nullptr;
    const LoadedKernel* attention = attends ? &load(planned.attention.spec) : nullptr;
    const LoadedKernel* combine = attends && planned.combine.grid ? &load(planned.combine.spec) : nullptr;
    if (attends) encode_tensor_maps(planned.attention);
    if (append != nullptr) launch(*append, append_plan->grid, &append_plan->params, call.device, cu_stream);
    if (attention != nullptr) launch(*attention, planned.attention.grid, &planned.attention.params, call.device, cu_stream);
    if (combine != nullptr) launch(*combine, planned.combine.grid, &planned.combine.params, call.device, cu_stream);
  }

  // What calls that only plan (no launch) plan for: the current device, or
  // an H200 when there is no GPU.
  PlanningTarget planning_target() {
    if (!driver().available) return {Arch{9, 0, true}, 227 * 1024, 132};
    const DeviceInfo& device = registry.device_info(registry.current_context());
    return {device.arch, device.max_smem_per_block, device.sm_count};
  }

  Config config;
  KernelBuilder builder;
  KernelRegistry registry;
  // Read once: a hot call only looks up its shape class. Re-tuning takes
  // effect in runtimes created afterwards.
  TuningTable tuning;
};

Runtime::Runtime(Config config) {
  set_log_level(config.log_level);
  impl_ = std::make_unique<Impl>(std::move(config));
}

Runtime::~Runtime() = default;

const Config& Runtime::config() const { return impl_->config; }

void Runtime::forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const TensorView* lse, const ForwardOptions& options, Stream stream) {
  impl_->run([&](const Arch& arch, int smem, int sm_count, const TuningTable* tuning) {
    return plan_forward(q, k, v, out, lse, options, arch, smem, sm_count, tuning);
  }, stream);
}

void Runtime::forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const TensorView* lse, const ForwardOptions& options, void* workspace, size_t workspace_bytes,
                      Stream stream) {
  impl_->run_sequence([&](const Arch& arch, int smem, int sm_count, const TuningTable* tuning) {
    return plan_forward_split(q, k, v, out, lse, options, workspace, workspace_bytes, false, arch, smem, sm_count,
                              tuning);
  }, stream);
}

size_t Runtime::forward_workspace_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const TensorView& out, const TensorView* lse, const ForwardOptions& options) {
  const PlanningTarget t = impl_->planning_target();
  return plan_forward_split(q, k, v, out, lse, options, nullptr, 0, true, t.arch, t.max_smem_bytes, t.sm_count,
                            &impl_->tuning)
      .attention.workspace_bytes;
}

void Runtime::forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const TensorView* lse, const VarlenArgs& varlen, const ForwardOptions& options,
                             Stream stream) {
  impl_->run([&](const Arch& arch, int smem, int sm_count, const TuningTable* tuning) {
    return plan_forward_varlen(q, k, v, out, lse, varlen, options, arch, smem, sm_count, tuning);
  }, stream);
}

void Runtime::forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const TensorView* lse, const VarlenArgs& varlen, const ForwardOptions& options,
                             void* workspace, size_t workspace_bytes, Stream stream) {
  impl_->run_sequence([&](const Arch& arch, int smem, int sm_count, const TuningTable* tuning) {
    return plan_forward_varlen_split(q, k, v, out, lse, varlen, options, workspace, workspace_bytes, false, arch, smem,
                                     sm_count, tuning);
  }, stream);
}

size_t Runtime::forward_varlen_workspace_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                                               const TensorView& out, const TensorView* lse, const VarlenArgs& varlen,
                                               const ForwardOptions& options) {
  const PlanningTarget t = impl_->planning_target();
  return plan_forward_varlen_split(q, k, v, out, lse, varlen, options, nullptr, 0, true, t.arch, t.max_smem_bytes,
                                   t.sm_count, &impl_->tuning)
      .attention.workspace_bytes;
}

void Runtime::merge_states(const TensorView& states, const TensorView& lse, const TensorView& out,
                           const TensorView* out_lse, Stream stream) {
  impl_->run([&](const Arch&, int, int, const TuningTable*) { return plan_merge_states(states, lse, out, out_lse); },
             stream);
}

void Runtime::merge_state(const TensorView& a, const TensorView& lse_a, const TensorView& b, const TensorView& lse_b,
                          const TensorView& out, const TensorView* out_lse, Stream stream) {
  impl_->run([&](const Arch&, int, int, const TuningTable*) { return plan_merge_state(a, lse_a, b, lse_b, out, out_lse); },
             stream);
}

void Runtime::forward_kvcache(const TensorView& q, const KVCacheArgs& args, const TensorView& out, const TensorView* lse,
                              const ForwardOptions& options, void* workspace, size_t workspace_bytes, Stream stream) {
  impl_->run_sequence([&](const Arch& arch, int smem, int sm_count, const TuningTable* tuning) {
    return plan_kvcache(q, args, out, lse, options, workspace, workspace_bytes, false, arch, smem, sm_count, tuning);
  }, stream);
}

size_t Runtime::kvcache_workspace_bytes(const TensorView& q, const KVCacheArgs& args, const TensorView& out,
                                        const TensorView* lse, const ForwardOptions& options) {
  const PlanningTarget t = impl_->planning_target();
  return plan_kvcache(q, args, out, lse, options, nullptr, 0, true, t.arch, t.max_smem_bytes, t.sm_count, &impl_->tuning)
      .attention.workspace_bytes;
}

std::string Runtime::spec_for(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const TensorView* lse, const ForwardOptions& options) {
  const PlanningTarget t = impl_->planning_target();
  return plan_forward(q, k, v, out, lse, options, t.arch, t.max_smem_bytes, t.sm_count, &impl_->tuning).spec.text();
}

WarmResult Runtime::warm(const std::string& spec_text, const std::string& arch_text) {
  const KernelSpec spec = KernelSpec::parse(spec_text);
  const Arch arch = Arch::parse(arch_text);
  BuiltKernel built = impl_->builder.build(spec, arch);
  // Warming is for the disk cache: a kernel compiled but not stored there
  // would compile again in the next process.
  if (!built.store_error.empty()) {
    throw Error(ErrorCode::cache_error,
                fmt::format("{} for {} compiled but not stored in the disk cache {}: {}", spec.text(), arch.text(),
                            impl_->builder.cache().location(), built.store_error),
                spec.text());
  }
  WarmResult result;
  result.spec = spec.text();
  result.arch = arch.text();
  result.cache_hit = built.cache_hit;
  result.compile_seconds = built.cache_hit ? 0 : built.entry.meta.compile_seconds;
  result.cubin_bytes = built.entry.cubin.size();
  return result;
}

namespace {
std::mutex g_global_mutex;  // constant-initialized
// Never destroyed: calls may still arrive during static destruction.
std::atomic<Runtime*> g_global{nullptr};
std::optional<Config>& pending_config() {
  static std::optional<Config>* const config = new std::optional<Config>;
  return *config;
}
}  // namespace

Runtime& global_runtime() {
  if (Runtime* runtime = g_global.load(std::memory_order_acquire)) return *runtime;
  std::lock_guard<std::mutex> lock(g_global_mutex);
  if (g_global.load() == nullptr) {
    g_global.store(new Runtime(pending_config() ? *pending_config() : Config::from_env()), std::memory_order_release);
  }
  return *g_global.load();
}

void configure(const Config& config) {
  std::lock_guard<std::mutex> lock(g_global_mutex);
  if (g_global.load() != nullptr) {
    throw Error(ErrorCode::invalid_argument,
                "configure: the global runtime is already in use; call configure before the first call, "
                "or create a jitattn::Runtime with this Config");
  }
  pending_config() = config;
}

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const TensorView* lse, const ForwardOptions& options, Stream stream) {
  global_runtime().forward(q, k, v, out, lse, options, stream);
}

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const TensorView* lse, const ForwardOptions& options, void* workspace, size_t workspace_bytes,
             Stream stream) {
  global_runtime().forward(q, k, v, out, lse, options, workspace, workspace_bytes, stream);
}

size_t forward_workspace_bytes(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                               const TensorView* lse, const ForwardOptions& options) {
  return global_runtime().forward_workspace_bytes(q, k, v, out, lse, options);
}

void forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const TensorView* lse, const VarlenArgs& varlen, const ForwardOptions& options, Stream stream) {
  global_runtime().forward_varlen(q, k, v, out, lse, varlen, options, stream);
}

void forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const TensorView* lse, const VarlenArgs& varlen, const ForwardOptions& options, void* workspace,
                    size_t workspace_bytes, Stream stream) {
  global_runtime().forward_varlen(q, k, v, out, lse, varlen, options, workspace, workspace_bytes, stream);
}

size_t forward_varlen_workspace_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView* lse, const VarlenArgs& varlen,
                                      const ForwardOptions& options) {
  return global_runtime().forward_varlen_workspace_bytes(q, k, v, out, lse, varlen, options);
}

void merge_states(const TensorView& states, const TensorView& lse, const TensorView& out, const TensorView* out_lse,
                  Stream stream) {
  global_runtime().merge_states(states, lse, out, out_lse, stream);
}

void merge_state(const TensorView& a, const TensorView& lse_a, const TensorView& b, const TensorView& lse_b,
                 const TensorView& out, const TensorView* out_lse, Stream stream) {
  global_runtime().merge_state(a, lse_a, b, lse_b, out, out_lse, stream);
}

void forward_kvcache(const TensorView& q, const KVCacheArgs& args, const TensorView& out, const TensorView* lse,
                     const ForwardOptions& options, void* workspace, size_t workspace_bytes, Stream stream) {
  global_runtime().forward_kvcache(q, args, out, lse, options, workspace, workspace_bytes, stream);
}

size_t kvcache_workspace_bytes(const TensorView& q, const KVCacheArgs& args, const TensorView& out,
                               const TensorView* lse, const ForwardOptions& options) {
  return global_runtime().kvcache_workspace_bytes(q, args, out, lse, options);
}

std::string version() { return JITATTN_VERSION_STRING; }

}  // namespace jitattn
