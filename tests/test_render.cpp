#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "render.hpp"

using namespace jitattn;
using namespace jitattn::detail;

TEST_SUITE("render") {

TEST_CASE("the same spec renders byte-identical source") {
  const TemplateSet embedded;
  const KernelSpec spec = KernelSpec::parse("fwd.bf16.d128.br128.bc64.w8.causal");
  const std::string first = render(spec, embedded);
  CHECK(first == render(spec, embedded));
  CHECK(first == render(spec, TemplateSet()));
}

TEST_CASE("rendered source is self-contained and carries the spec's constants") {
  const std::string source = render(KernelSpec::parse("fwd.f16.d64.br64.bc32.w4"), TemplateSet());
  CHECK(source.find("jitattn::f16, /*HEAD_DIM=*/64, /*BLOCK_Q=*/64") != std::string::npos);
  CHECK(source.find("/*BLOCK_KV=*/32, /*WARPS=*/4, /*MASK=*/jitattn::kMaskNone") != std::string::npos);
  CHECK(source.find("/*SOFTCAP=*/false, /*ALIBI=*/false, /*PADDED=*/false") != std::string::npos);
  CHECK(source.find("jitattn_fwd(") != std::string::npos);
  // Every template include is expanded in place: NVRTC gets one text.
  CHECK(source.find("#include") == std::string::npos);
  CHECK(source.find("struct FwdParams") != std::string::npos);
  CHECK(source.find("#line 1 \"fwd_prefill.cuh\"") != std::string::npos);
  // No toolkit header is needed to compile it.
  CHECK(source.find("cuda_fp16") == std::string::npos);
  CHECK(source.find("cuda_bf16") == std::string::npos);
  // The mask kind: a window cut to chunks (attention_chunk) is its own kind,
  // so plain windows compile without the chunk's bounds.
  for (const auto& [text, mask] : {std::pair{"fwd.f16.d64.br64.bc32.w4.causal", "kMaskCausal"},
                                   std::pair{"fwd.f16.d64.br64.bc32.w4.local", "kMaskLocal"},
                                   std::pair{"fwd.f16.d64.br64.bc32.w4.local.chunk", "kMaskChunk"},
                                   std::pair{"decode.bf16.d128.br16.bc32.w4.s2.local.chunk.split", "kMaskChunk"}}) {
    CAPTURE(text);
    CHECK(render(KernelSpec::parse(text), TemplateSet()).find(std::string("/*MASK=*/jitattn::") + mask) !=
          std::string::npos);
  }
  // Learnable sinks: a template constant of each family, false without them.
  for (const auto& [text, sink] : {std::pair{"fwd.f16.d64.br64.bc32.w4.causal", "false"},
                                   std::pair{"fwd.f16.d64.br64.bc32.w4.causal.sink", "true"},
                                   std::pair{"decode.bf16.d128.br16.bc32.w4.s2.sink", "true"},
                                   std::pair{"decode.bf16.d128.br16.bc32.w4.s2.split", "false"},
                                   std::pair{"combine.f32.bf16.sink", "true"},
                                   std::pair{"combine.f32.bf16.dynsplit", "false"}}) {
    CAPTURE(text);
    const std::string source = render(KernelSpec::parse(text), TemplateSet());
    CHECK((source.find(std::string("/*SINK=*/") + sink + ">") != std::string::npos ||
           source.find(std::string("/*SINK=*/") + sink + ",") != std::string::npos));
  }
  // V's head dim: the head dim unless the spec gives V its own (dvN).
  for (const auto& [text, value_dim] : {std::pair{"fwd.f16.d64.br64.bc32.w4.causal", "64"},
                                        std::pair{"fwd.bf16.d192.br128.bc96.w8.s2.wgmma.causal.dv128", "128"},
                                        std::pair{"fwd.f16.d128.br128.bc64.w4.padded.dv64", "64"}}) {
    CAPTURE(text);
    CHECK(render(KernelSpec::parse(text), TemplateSet()).find(std::string("/*HEAD_DIM_V=*/") + value_dim + ",") !=
          std::string::npos);
  }
  // Pages shorter than a decode chunk: their rows a constant of the kernel.
  for (const auto& [text, page_rows] : {std::pair{"decode.bf16.d64.br16.bc64.w4.s2.paged16", "16"},
                                        std::pair{"decode.bf16.d64.br16.bc64.w4.s2.paged", "0"}}) {
    CAPTURE(text);
    CHECK(render(KernelSpec::parse(text), TemplateSet()).find(std::string("/*PAGE_ROWS=*/") + page_rows + ">") !=
          std::string::npos);
  }
  // Angles scaled by YaRN's attention factor: a constant of the families
  // that rotate (prefill, decode, append), false without the flag.
  for (const auto& [text, scaled] : {std::pair{"fwd.bf16.d64.br128.bc64.w4.causal.rope_half_r64", "false"},
                                     std::pair{"fwd.bf16.d64.br128.bc64.w4.causal.rope_half_r64.rope_scaled", "true"},
                                     std::pair{"decode.bf16.d128.br16.bc32.w4.s2.rope_half_r128.rope_scaled", "true"},
                                     std::pair{"decode.bf16.d128.br16.bc32.w4.s2", "false"},
                                     std::pair{"append.bf16.rope_interleaved_r64.rope_scaled.paged", "true"},
                                     std::pair{"append.bf16.rope_interleaved_r64.paged", "false"}}) {
    CAPTURE(text);
    const std::string source = render(KernelSpec::parse(text), TemplateSet());
    CHECK((source.find(std::string("/*ROPE_SCALED=*/") + scaled + ">") != std::string::npos ||
           source.find(std::string("/*ROPE_SCALED=*/") + scaled + ", /*PAGE_ROWS=*/") != std::string::npos));
  }
}

TEST_CASE("a combine spec renders entry_combine.cu over combine.cuh, deterministically") {
  const TemplateSet templates;
  const KernelSpec spec = KernelSpec::parse("combine.f32.bf16");
  const std::string source = render(spec, templates);
  CHECK(source == render(spec, templates));
  CHECK(std::string(entry_name(spec)) == "jitattn_combine");
  CHECK(std::string(entry_name(KernelSpec::parse("fwd.bf16.d64.br128.bc64.w4"))) == "jitattn_fwd");
  CHECK(source.find("// jitattn kernel for spec combine.f32.bf16") != std::string::npos);
  CHECK(source.find("jitattn_combine(const __grid_constant__ jitattn::CombineParams params)") != std::string::npos);
  CHECK(source.find("combine_states</*State=*/float, /*Out=*/jitattn::bf16, /*ELEMENTWISE=*/false,") != std::string::npos);
  CHECK(source.find("/*DYNAMIC_SPLITS=*/false, /*SINK=*/false>") != std::string::npos);
  CHECK(source.find("struct CombineParams") != std::string::npos);
  CHECK(source.find("#line 1 \"combine.cuh\"") != std::string::npos);
  CHECK(source.find("FwdParams") == std::string::npos);  // nothing of the forward family
  CHECK(source.find("#include") == std::string::npos);
  CHECK(source.find("cuda_fp16") == std::string::npos);
  CHECK(source.find("cuda_bf16") == std::string::npos);
  CHECK(render(KernelSpec::parse("combine.f16.f16"), templates).find("combine_states</*State=*/jitattn::f16, /*Out=*/jitattn::f16, /*ELEMENTWISE=*/false,") !=
        std::string::npos);
  CHECK(render(KernelSpec::parse("combine.f16.bf16.elementwise"), templates)
            .find("combine_states</*State=*/jitattn::f16, /*Out=*/jitattn::bf16, /*ELEMENTWISE=*/true,") != std::string::npos);
  const std::string dynamic = render(KernelSpec::parse("combine.f32.bf16.elementwise.dynsplit"), templates);
  CHECK(dynamic.find("// jitattn kernel for spec combine.f32.bf16.elementwise.dynsplit") != std::string::npos);
  CHECK(dynamic.find("/*ELEMENTWISE=*/true,") != std::string::npos);
  CHECK(dynamic.find("/*DYNAMIC_SPLITS=*/true, /*SINK=*/false>") != std::string::npos);
  std::set<std::string> sources;
  for (const char* text : {"combine.f32.f32", "combine.f32.f16", "combine.f32.bf16", "combine.f16.f32", "combine.f16.f16",
                           "combine.f16.bf16", "combine.bf16.f32", "combine.bf16.f16", "combine.bf16.bf16"}) {
    sources.insert(render(KernelSpec::parse(text), templates));
    sources.insert(render(KernelSpec::parse(std::string(text) + ".elementwise"), templates));
    sources.insert(render(KernelSpec::parse(std::string(text) + ".dynsplit"), templates));
  }
  CHECK(sources.size() == 27);
}

TEST_CASE("different specs render different source") {
  const TemplateSet templates;
  CHECK(render(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w8"), templates) !=
        render(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w8.causal"), templates));
  CHECK(render(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w8"), templates) !=
        render(KernelSpec::parse("fwd.f16.d128.br128.bc64.w8"), templates));
}

TEST_CASE("a template directory overrides the embedded templates") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "jitattn-render-test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& entry : embedded_templates()) {
    std::ofstream(dir / entry.name, std::ios::binary) << entry.text;
  }
  const KernelSpec spec = KernelSpec::parse("fwd.bf16.d64.br128.bc64.w4");
  CHECK(render(spec, TemplateSet(dir.string())) == render(spec, TemplateSet()));
  std::ofstream(dir / "ptx.cuh", std::ios::app) << "// local edit\n";
  const std::string edited = render(spec, TemplateSet(dir.string()));
  CHECK(edited.find("// local edit") != std::string::npos);
  fs::remove(dir / "fwd_prefill.cuh");
  CHECK_THROWS_WITH_AS(render(spec, TemplateSet(dir.string())), doctest::Contains("fwd_prefill.cuh"), Error);
  fs::remove_all(dir);
}

TEST_CASE("embedded templates match the templates/ folder of this source tree") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(JITATTN_SOURCE_DIR) / "templates";
  if (!fs::exists(dir)) {
    MESSAGE("source tree not present (binary moved to another host): nothing to compare");
    return;
  }
  for (const auto& entry : embedded_templates()) {
    std::ifstream file(dir / entry.name, std::ios::binary);
    const std::string on_disk((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    CHECK_MESSAGE(on_disk == entry.text, entry.name);
  }
}

}  // TEST_SUITE
