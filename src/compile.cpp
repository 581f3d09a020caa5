#include "compile.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include "log.hpp"

namespace jitattn::detail {
namespace {

struct NvrtcApi {
  NvrtcInfo info;
  decltype(&::nvrtcVersion) version = nullptr;
  decltype(&::nvrtcGetErrorString) get_error_string = nullptr;
  decltype(&::nvrtcCreateProgram) create_program = nullptr;
  decltype(&::nvrtcDestroyProgram) destroy_program = nullptr;
  decltype(&::nvrtcCompileProgram) compile_program = nullptr;
  decltype(&::nvrtcGetProgramLogSize) get_log_size = nullptr;
  decltype(&::nvrtcGetProgramLog) get_log = nullptr;
  decltype(&::nvrtcGetCUBINSize) get_cubin_size = nullptr;
  decltype(&::nvrtcGetCUBIN) get_cubin = nullptr;
  decltype(&::nvrtcGetNumSupportedArchs) num_supported_archs = nullptr;
  decltype(&::nvrtcGetSupportedArchs) supported_archs = nullptr;
};

std::vector<std::string> candidate_libraries() {
  std::vector<std::string> names;
  if (const char* explicit_path = std::getenv("JITATTN_NVRTC_LIBRARY")) names.emplace_back(explicit_path);
  for (const char* soname : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) names.emplace_back(soname);
  for (const char* variable : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* home = std::getenv(variable)) {
      names.push_back(fmt::format("{}/lib64/libnvrtc.so.13", home));
      names.push_back(fmt::format("{}/lib64/libnvrtc.so.12", home));
    }
  }
  names.emplace_back("/usr/local/cuda/lib64/libnvrtc.so.13");
  names.emplace_back("/usr/local/cuda/lib64/libnvrtc.so.12");
  return names;
}

template <typename Fn>
bool resolve(void* handle, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  return fn != nullptr;
}

std::unique_ptr<NvrtcApi> load_nvrtc() {
  auto api = std::make_unique<NvrtcApi>();
  if (const char* setting = std::getenv("JITATTN_NVRTC_LIBRARY"); setting != nullptr && std::string(setting) == "none") {
    api->info.error = "compiling is off (JITATTN_NVRTC_LIBRARY=none): kernels come from the cache only";
    return api;
  }
  void* handle = nullptr;
  std::string tried;
  for (const auto& name : candidate_libraries()) {
    handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      api->info.library = name;
      break;
    }
    tried += (tried.empty() ? "" : ", ") + name;
  }
  if (handle == nullptr) {
    api->info.error = fmt::format(
        "libnvrtc not found (tried {}); set JITATTN_NVRTC_LIBRARY to its path to compile kernels (without it, "
        "kernels come from the cache only, as a host with NVRTC and this library version warmed them)", tried);
    return api;
  }
  const bool ok = resolve(handle, "nvrtcVersion", api->version) &&
                  resolve(handle, "nvrtcGetErrorString", api->get_error_string) &&
                  resolve(handle, "nvrtcCreateProgram", api->create_program) &&
                  resolve(handle, "nvrtcDestroyProgram", api->destroy_program) &&
                  resolve(handle, "nvrtcCompileProgram", api->compile_program) &&
                  resolve(handle, "nvrtcGetProgramLogSize", api->get_log_size) &&
                  resolve(handle, "nvrtcGetProgramLog", api->get_log) &&
                  resolve(handle, "nvrtcGetCUBINSize", api->get_cubin_size) &&
                  resolve(handle, "nvrtcGetCUBIN", api->get_cubin) &&
                  resolve(handle, "nvrtcGetNumSupportedArchs", api->num_supported_archs) &&
                  resolve(handle, "nvrtcGetSupportedArchs", api->supported_archs);
  if (!ok) {
    api->info.error = fmt::format("{} lacks a required NVRTC entry point (NVRTC >= 11.2 is needed)",
                                  api->info.library);
    return api;
  }
  api->version(&api->info.major, &api->info.minor);
  int count = 0;
  api->num_supported_archs(&count);
  api->info.supported_archs.resize(count);
  if (count > 0) api->supported_archs(api->info.supported_archs.data());
  api->info.available = true;
  return api;
}

const NvrtcApi& api() {
  // Loaded once, on first use, by whichever thread gets here first; never
  // destroyed, as driver() (calls may still compile during static destruction).
  static const NvrtcApi* const instance = load_nvrtc().release();
  return *instance;
}

}  // namespace

std::string NvrtcInfo::version() const { return available ? fmt::format("{}.{}", major, minor) : "none"; }

const NvrtcInfo& nvrtc_info() { return api().info; }

std::vector<std::string> compile_options(const Arch& arch) {
  return {
      fmt::format("--gpu-architecture={}", arch.text()),
      "--std=c++17",
      "-DNDEBUG",
      "--ptxas-options=--verbose",  // the log then carries registers, shared memory and spills
      "-lineinfo",
  };
}

CompileOutput compile_cubin(const std::string& source, const std::string& program_name,
                            const Arch& arch, const std::string& spec_text) {
  const NvrtcApi& nvrtc = api();
  if (!nvrtc.info.available) throw Error(ErrorCode::unsupported, nvrtc.info.error, spec_text);
  const auto& archs = nvrtc.info.supported_archs;
  if (std::find(archs.begin(), archs.end(), arch.number()) == archs.end()) {
    throw Error(ErrorCode::unsupported,
                fmt::format("arch {}: NVRTC {} cannot compile for it", arch.text(), nvrtc.info.version()),
                spec_text);
  }
  const auto start = std::chrono::steady_clock::now();
  nvrtcProgram program = nullptr;
  nvrtcResult status = nvrtc.create_program(&program, source.c_str(), program_name.c_str(), 0, nullptr, nullptr);
  if (status != NVRTC_SUCCESS) {
    throw Error(ErrorCode::compile_failed,
                fmt::format("{}: nvrtcCreateProgram failed: {}", spec_text, nvrtc.get_error_string(status)),
                spec_text);
  }
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(&program, [](nvrtcProgram* p) {
    api().destroy_program(p);
  });

  const std::vector<std::string> options = compile_options(arch);
  std::vector<const char*> option_pointers;
  for (const auto& option : options) option_pointers.push_back(option.c_str());
  status = nvrtc.compile_program(program, static_cast<int>(option_pointers.size()), option_pointers.data());

  CompileOutput output;
  size_t log_size = 0;
  nvrtc.get_log_size(program, &log_size);
  if (log_size > 1) {
    output.log.resize(log_size);
    nvrtc.get_log(program, output.log.data());
    output.log.resize(log_size - 1);  // drop the terminating NUL
  }
  if (status != NVRTC_SUCCESS) {
    std::string message = fmt::format("{} for {}: NVRTC failed ({}):\n{}", spec_text, arch.text(),
                                      nvrtc.get_error_string(status), output.log);
    if (status == NVRTC_ERROR_COMPILATION) {
      throw SourceRejected(ErrorCode::compile_failed, std::move(message), spec_text, output.log);
    }
    throw Error(ErrorCode::compile_failed, std::move(message), spec_text, output.log);
  }
  size_t cubin_size = 0;
  nvrtc.get_cubin_size(program, &cubin_size);
  output.cubin.resize(cubin_size);
  nvrtc.get_cubin(program, output.cubin.data());
  output.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log(LogLevel::debug, "compiled {} for {} in {:.2f} s ({} bytes)", spec_text, arch.text(),
      output.seconds, cubin_size);
  return output;
}

}  // namespace jitattn::detail
