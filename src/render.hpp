// render: KernelSpec → complete CUDA source. Deterministic: the same spec and
// templates always give byte-identical text. The family's entry template
// (entry_fwd.cu, entry_combine.cu) is filled with
// the spec's constants, then every #include "..." of a template is expanded in
// place (once each, with #line markers), so the result is the exact text NVRTC
// compiles and the cache key covers every template the kernel uses.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "spec.hpp"

namespace jitattn::detail {

struct EmbeddedTemplate {
  const char* name;
  std::string_view text;
};
// Generated at build time from templates/ (cmake/embed_templates.cmake).
const std::vector<EmbeddedTemplate>& embedded_templates();

// Where templates come from: the copy embedded in the library, or a directory
// (JITATTN_TEMPLATE_DIR) for kernel development.
class TemplateSet {
 public:
  explicit TemplateSet(std::string directory = {});
  // Throws Error(invalid_argument) naming the template and where it looked.
  std::string read(const std::string& name) const;
  const std::string& directory() const { return directory_; }

 private:
  std::string directory_;
};

// The entry function's name in the rendered source.
const char* entry_name(const KernelSpec& spec);

std::string render(const KernelSpec& spec, const TemplateSet& templates);

}  // namespace jitattn::detail
