// compile: CUDA source → CUBIN with NVRTC. libnvrtc is opened at run time, so
// the library loads (and serves from a warm cache) where NVRTC is absent.
#pragma once

#include <string>
#include <vector>

#include "spec.hpp"

namespace jitattn::detail {

struct NvrtcInfo {
  bool available = false;
  std::string library;  // path or soname that was opened
  std::string error;    // why it is unavailable
  int major = 0, minor = 0;
  std::vector<int> supported_archs;  // e.g. 75, 80, 86, ...
  std::string version() const;       // "13.0"
};

// Loads libnvrtc once (JITATTN_NVRTC_LIBRARY, then the sonames, then
// $CUDA_HOME/lib64 and /usr/local/cuda/lib64). Thread-safe.
const NvrtcInfo& nvrtc_info();

struct CompileOutput {
  std::vector<char> cubin;
  std::string log;  // NVRTC log, including ptxas' resource report
  double seconds = 0;
};

// Options passed to NVRTC for `arch`; part of the cache key.
std::vector<std::string> compile_options(const Arch& arch);

// NVRTC's rejection of the source itself (NVRTC_ERROR_COMPILATION): the
// same on every try, unlike its other failures (out of memory, ...).
class SourceRejected : public Error {
 public:
  using Error::Error;
};

// Throws Error(compile_failed) carrying `spec_text` and the NVRTC log (a
// SourceRejected where the source does not compile), or Error(unsupported)
// when NVRTC is missing or does not know `arch`.
CompileOutput compile_cubin(const std::string& source, const std::string& program_name,
                            const Arch& arch, const std::string& spec_text);

}  // namespace jitattn::detail
