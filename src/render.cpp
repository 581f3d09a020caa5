#include "render.hpp"

#include <fmt/format.h>

#include <fstream>
#include <set>
#include <sstream>

namespace jitattn::detail {

TemplateSet::TemplateSet(std::string directory) : directory_(std::move(directory)) {}

std::string TemplateSet::read(const std::string& name) const {
  if (directory_.empty()) {
    for (const auto& entry : embedded_templates()) {
      if (name == entry.name) return std::string(entry.text);
    }
    throw Error(ErrorCode::internal, fmt::format("template '{}' is not embedded in this build", name));
  }
  std::ifstream file(directory_ + "/" + name, std::ios::binary);
  if (!file) {
    throw Error(ErrorCode::invalid_argument,
                fmt::format("template '{}' not found in JITATTN_TEMPLATE_DIR={}", name, directory_));
  }
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

const char* entry_name(const KernelSpec& spec) {
  switch (spec.family) {
    case Family::combine: return "jitattn_combine";
    case Family::append: return "jitattn_append";
    case Family::decode: return "jitattn_decode";
    default: return "jitattn_fwd";
  }
}

namespace {

// Expands `#include "name"` lines that name templates; each template appears
// once (templates use #pragma once, which an expanded file no longer has a
// file for). #line markers keep NVRTC's messages pointing at template lines.
void expand_includes(const std::string& name, const std::string& text, const TemplateSet& templates,
                     std::set<std::string>& seen, std::string& out) {
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    std::string_view view(line);
    const auto first = view.find_first_not_of(" \t");
    if (first != std::string_view::npos && view.substr(first, 7) == "#pragma" &&
        view.find("once") != std::string_view::npos) {
      out += '\n';
      continue;
    }
    if (first != std::string_view::npos && view.substr(first, 8) == "#include") {
      const auto open = view.find('"');
      const auto close = open == std::string_view::npos ? open : view.find('"', open + 1);
      if (close != std::string_view::npos) {
        const std::string included(view.substr(open + 1, close - open - 1));
        if (seen.insert(included).second) {
          out += fmt::format("#line 1 \"{}\"\n", included);
          expand_includes(included, templates.read(included), templates, seen, out);
          out += fmt::format("#line {} \"{}\"\n", number + 1, name);
        } else {
          out += '\n';
        }
        continue;
      }
    }
    out += line;
    out += '\n';
  }
}

// The element type a combine kernel names for a dtype.
const char* combine_element(DType dtype) {
  switch (dtype) {
    case DType::f16: return "jitattn::f16";
    case DType::bf16: return "jitattn::bf16";
    default: return "float";
  }
}

const char* rope_constant(RopeKind rope) {
  return rope == RopeKind::half ? "kRopeHalf" : rope == RopeKind::interleaved ? "kRopeInterleaved" : "kRopeNone";
}

// templates/entry_append.cu filled for an append spec.
std::string render_append(const KernelSpec& spec, const TemplateSet& templates) {
  const std::string entry = fmt::format(
      fmt::runtime(templates.read("entry_append.cu")), fmt::arg("spec", spec.text()),
      fmt::arg("element", spec.dtype == DType::bf16 ? "bf16" : "f16"), fmt::arg("rope", rope_constant(spec.rope)),
      fmt::arg("rotary_dim", spec.rotary_dim), fmt::arg("rope_tables", spec.rope_table_bytes()),
      fmt::arg("paged", spec.paged ? "true" : "false"), fmt::arg("rope_scaled", spec.rope_scaled ? "true" : "false"),
      fmt::arg("entry_name", entry_name(spec)));
  std::set<std::string> seen;
  std::string source;
  expand_includes("entry_append.cu", entry, templates, seen, source);
  return source;
}

// templates/entry_combine.cu filled for a combine spec.
std::string render_combine(const KernelSpec& spec, const TemplateSet& templates) {
  const std::string entry = fmt::format(
      fmt::runtime(templates.read("entry_combine.cu")), fmt::arg("spec", spec.text()),
      fmt::arg("state", combine_element(spec.dtype)), fmt::arg("out", combine_element(spec.out_dtype)),
      fmt::arg("elementwise", spec.elementwise ? "true" : "false"),
      fmt::arg("dynamic_splits", spec.dynamic_splits ? "true" : "false"), fmt::arg("sink", spec.sink ? "true" : "false"),
      fmt::arg("entry_name", entry_name(spec)));
  std::set<std::string> seen;
  std::string source;
  expand_includes("entry_combine.cu", entry, templates, seen, source);
  return source;
}

}  // namespace

std::string render(const KernelSpec& spec, const TemplateSet& templates) {
  spec.validate();
  if (spec.family == Family::combine) return render_combine(spec, templates);
  if (spec.family == Family::append) return render_append(spec, templates);
  const bool decode = spec.family == Family::decode;
  const char* entry_file = decode ? "entry_decode.cu" : "entry_fwd.cu";
  const std::string entry = fmt::format(
      fmt::runtime(templates.read(entry_file)), fmt::arg("spec", spec.text()),
      fmt::arg("element", spec.dtype == DType::bf16 ? "bf16" : "f16"),
      fmt::arg("head_dim", spec.head_dim), fmt::arg("block_q", spec.block_q),
      fmt::arg("block_kv", spec.block_kv), fmt::arg("warps", spec.warps),
      fmt::arg("mask", spec.causal  ? "kMaskCausal"
                       : spec.chunk ? "kMaskChunk"
                       : spec.local ? "kMaskLocal"
                                    : "kMaskNone"),
      fmt::arg("softcap", spec.softcap ? "true" : "false"), fmt::arg("alibi", spec.alibi ? "true" : "false"),
      fmt::arg("padded", spec.padded ? "true" : "false"), fmt::arg("varlen", spec.varlen ? "true" : "false"),
      fmt::arg("pack_gqa", spec.pack_gqa ? "true" : "false"),
      fmt::arg("rope", spec.rope == RopeKind::half          ? "kRopeHalf"
                       : spec.rope == RopeKind::interleaved ? "kRopeInterleaved"
                                                            : "kRopeNone"),
      fmt::arg("rotary_dim", spec.rotary_dim), fmt::arg("rope_tables", spec.rope_table_bytes()),
      fmt::arg("kvcache", spec.kvcache ? "true" : "false"), fmt::arg("paged", spec.paged ? "true" : "false"),
      fmt::arg("leftpad", spec.leftpad ? "true" : "false"),
      fmt::arg("split", spec.split ? "true" : "false"),
      fmt::arg("dynamic_splits", spec.dynamic_splits ? "true" : "false"), fmt::arg("stages", spec.stages),
      fmt::arg("wgmma", spec.wgmma ? "true" : "false"), fmt::arg("persistent", spec.persistent ? "true" : "false"),
      fmt::arg("unaligned_dim", spec.unaligned_dim), fmt::arg("smem_bytes", spec.smem_bytes()),
      fmt::arg("sink", spec.sink ? "true" : "false"), fmt::arg("head_dim_v", spec.value_dim()),
      fmt::arg("rope_scaled", spec.rope_scaled ? "true" : "false"), fmt::arg("page_rows", spec.page_rows),
      fmt::arg("entry_name", entry_name(spec)));
  std::set<std::string> seen;
  std::string source;
  expand_includes(entry_file, entry, templates, seen, source);
  return source;
}

}  // namespace jitattn::detail
