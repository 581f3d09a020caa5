#include <doctest/doctest.h>
#include <fmt/format.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <unistd.h>

#include "compile.hpp"
#include "kernels.hpp"
#include "plan.hpp"
#include "render.hpp"

using namespace jitattn;
using namespace jitattn::detail;

namespace {

bool is_elf(const std::vector<char>& bytes) {
  return bytes.size() > 4 && bytes[0] == 0x7f && bytes[1] == 'E' && bytes[2] == 'L' && bytes[3] == 'F';
}

// What the planner picks for each dtype × head dim × causal: the kernels a
// default `jitattn warm` produces.
std::vector<KernelSpec> default_set(const Arch& arch) {
  std::vector<KernelSpec> specs;
  for (DType dtype : {DType::f16, DType::bf16})
    for (int head_dim : {64, 128})
      for (bool causal : {false, true}) {
        for (const TileConfig& t : default_tile_set(dtype, head_dim, causal, arch)) {
          KernelSpec spec{Family::fwd, dtype, head_dim};
          spec.causal = causal;
          apply_tiles(spec, t);
          specs.push_back(spec);
        }
      }
  return specs;
}

// What a spec's ptxas log must not say: a failure message, or "" when fine.
using LogCheck = std::function<std::string(const KernelSpec& spec, const std::string& log)>;

// How ptxas reports wgmma it had to serialize (C7511, C7512, C7515, C7520:
// registers short for the pipeline, or accumulators touched by other
// instructions, or on one side of a branch, while a product is in flight).
// Such a kernel stays correct but waits after each product, so no compiled
// kernel may carry the note: a template change that provokes it fails on a
// CPU-only CI run (docs/PERFORMANCE.md, the diagonal-half-block attempt).
constexpr const char* kWgmmaSerialized = "Potential Performance Loss";

// Compiles specs on two threads (NVRTC programs are independent); returns failures.
std::vector<std::string> compile_all(const std::vector<KernelSpec>& specs, const Arch& arch,
                                     const LogCheck& check_log = nullptr) {
  std::vector<std::string> failures(specs.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < specs.size();) {
      try {
        const CompileOutput out = compile_cubin(render(specs[i], TemplateSet()), specs[i].text() + ".cu", arch, specs[i].text());
        if (!is_elf(out.cubin)) failures[i] = specs[i].text() + ": output is not an ELF cubin";
        if (out.log.find("spill stores") == std::string::npos) failures[i] = specs[i].text() + ": no ptxas report in the log";
        if (out.log.find(kWgmmaSerialized) != std::string::npos) {
          failures[i] = specs[i].text() + ": ptxas serialized the wgmma pipeline\n" + out.log;
        }
        if (check_log && failures[i].empty()) {
          const std::string why = check_log(specs[i], out.log);
          if (!why.empty()) failures[i] = specs[i].text() + ": " + why + "\n" + out.log;
        }
      } catch (const std::exception& e) {
        failures[i] = e.what();
      }
    }
  };
  std::thread a(worker), b(worker);
  a.join();
  b.join();
  std::vector<std::string> errors;
  for (auto& f : failures) {
    if (!f.empty()) errors.push_back(f);
  }
  return errors;
}

// The bytes of spill stores a ptxas log reports, or -1 without a report.
int spill_store_bytes(const std::string& log) {
  const size_t at = log.find(" bytes spill stores");
  if (at == std::string::npos) return -1;
  size_t begin = at;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(log[begin - 1]))) --begin;
  return std::stoi(log.substr(begin, at - begin));
}

// Feature variant `variant` of a prefill spec: masks, score modifiers, GQA
// packing and RoPE settings cycle at different periods. False when the
// variant does not exist at the spec's head dim (half rotation at 32).
bool set_feature_variant(KernelSpec& spec, int variant) {
  spec.causal = variant % 3 == 0;
  spec.local = variant % 3 == 1;
  spec.chunk = variant % 6 == 4;  // half the windows cut to chunks (attention_chunk)
  spec.softcap = variant % 4 == 1;
  spec.alibi = variant % 5 == 2;
  spec.pack_gqa = variant % 6 == 5;
  spec.sink = variant % 7 == 2;  // learnable sinks, folded in by the epilogue
  if (variant % 4 != 3) {
    spec.rope = variant % 2 ? RopeKind::interleaved : RopeKind::half;
    spec.rotary_dim = variant % 3 == 2 ? spec.head_dim / 32 * 16 : spec.head_dim;
    spec.rope_tables = variant % 7 == 6;
    spec.rope_tables16 = spec.rope_tables && variant % 2 == 0;  // tables in dtype
  }
  return spec.rope == RopeKind::none || spec.rotary_dim > 0;
}

// Feature variant `variant` for a caller's head dim that is not a multiple
// of 8 (KernelSpec::unaligned_dim): the rotary dim fits within it, and every
// other variant is varlen.
void set_unaligned_variant(KernelSpec& spec, int variant, int caller_dim) {
  set_feature_variant(spec, variant);
  if (spec.rotary_dim > caller_dim) spec.rotary_dim = caller_dim / 16 * 16;
  if (spec.rope != RopeKind::none && spec.rotary_dim == 0) {
    spec.rope = RopeKind::none, spec.rope_tables = spec.rope_tables16 = false;
  }
  spec.varlen = variant % 2 == 1;
}

// Compiles each spec of specs_by_arch beside its twin (twin_of(spec): the
// same kernel without the feature under test), twins first, and fails a spec
// that spills more than its twin plus slack(spec). A twin that would not fit
// (twin_fits false) is not compiled and counts as spilling nothing. Returns
// the number of specs compiled (not twins).
size_t compile_beside_twins(const std::map<std::string, std::vector<KernelSpec>>& specs_by_arch,
                            const std::function<KernelSpec(const KernelSpec&)>& twin_of,
                            const std::function<bool(const KernelSpec&)>& twin_fits,
                            const std::function<int(const KernelSpec&)>& slack, const char* twin_name) {
  std::mutex mutex;
  std::map<std::string, int> twin_spills;
  for (const auto& [arch, specs] : specs_by_arch) {
    std::vector<KernelSpec> twins;
    for (const KernelSpec& spec : specs) {
      const KernelSpec twin = twin_of(spec);
      if (twin_fits(twin)) twins.push_back(twin);
    }
    const auto errors = compile_all(twins, Arch::parse(arch), [&](const KernelSpec& twin, const std::string& log) {
      const std::lock_guard<std::mutex> lock(mutex);
      twin_spills[twin.text()] = spill_store_bytes(log);
      return std::string();
    });
    for (const auto& e : errors) FAIL_CHECK(e);
  }
  size_t compiled = 0;
  for (const auto& [arch, specs] : specs_by_arch) {
    compiled += specs.size();
    const auto errors = compile_all(specs, Arch::parse(arch), [&](const KernelSpec& spec, const std::string& log) {
      const std::lock_guard<std::mutex> lock(mutex);
      const auto found = twin_spills.find(twin_of(spec).text());
      const int bound = (found != twin_spills.end() ? std::max(found->second, 0) : 0) + slack(spec);
      const int spilled = spill_store_bytes(log);
      return spilled > bound ? fmt::format("spills {} bytes; {} {}", spilled, twin_name, bound) : std::string();
    });
    for (const auto& e : errors) FAIL_CHECK(e);
    CHECK(errors.empty());
  }
  return compiled;
}

}  // namespace

TEST_SUITE("compile") {

TEST_CASE("NVRTC is found and reports its version and archs") {
  const NvrtcInfo& info = nvrtc_info();
  REQUIRE_MESSAGE(info.available, info.error);
  CHECK(info.major >= 12);
  CHECK(std::find(info.supported_archs.begin(), info.supported_archs.end(), 80) != info.supported_archs.end());
  CHECK(std::find(info.supported_archs.begin(), info.supported_archs.end(), 90) != info.supported_archs.end());
}

TEST_CASE("every spec of the default warm set compiles for sm_80 and sm_90a") {
  for (const char* arch_text : {"sm_80", "sm_90a"}) {
    const Arch arch = Arch::parse(arch_text);
    const auto errors = compile_all(default_set(arch), arch);
    for (const auto& e : errors) FAIL_CHECK(e);
    CHECK(errors.empty());
  }
}

TEST_CASE("every valid tile configuration of the prefill family compiles (sm_90a)") {
  std::vector<KernelSpec> specs;
  for (DType dtype : {DType::f16, DType::bf16})
    for (int head_dim : {32, 64, 96, 128, 192, 256})
      for (int block_q : {64, 128})
        for (int block_kv : {32, 64, 128})
          for (int warps : {4, 8})
            for (bool causal : {false, true}) {
              const KernelSpec spec{Family::fwd, dtype, head_dim, block_q, block_kv, warps, causal};
              if (block_q % (16 * warps) == 0 && spec.accumulator_registers() <= 192) specs.push_back(spec);
            }
  REQUIRE(specs.size() > 100);
  const auto errors = compile_all(specs, Arch::parse("sm_90a"));
  for (const auto& e : errors) FAIL_CHECK(e);
  CHECK(errors.empty());
}

TEST_CASE("producer-layout specs (sN) compile with their features (sm_90a and sm_80)") {
  std::vector<KernelSpec> specs;
  int variant = 0;
  for (int head_dim : {32, 64, 96, 128})
    for (int stages : {2, 3, 4})
      for (int block_q : {128, 256}) {
        KernelSpec spec{Family::fwd, variant % 2 ? DType::f16 : DType::bf16, head_dim, block_q, 64, 8};
        spec.stages = stages;
        if (set_feature_variant(spec, variant++) && spec.smem_bytes() <= 227 * 1024) specs.push_back(spec);
      }
  REQUIRE(specs.size() >= 20);
  for (const char* arch_text : {"sm_90a", "sm_80"}) {
    const auto errors = compile_all(arch_text == std::string("sm_80") ? std::vector<KernelSpec>(specs.begin(), specs.begin() + 4)
                                                                      : specs,
                                    Arch::parse(arch_text));
    for (const auto& e : errors) FAIL_CHECK(e);
    CHECK(errors.empty());
  }
}

TEST_CASE("wgmma specs compile with their features for sm_90a, without serialized wgmma; other archs refuse them") {
  std::vector<KernelSpec> specs;
  int variant = 0;
  for (int head_dim : {32, 64, 96, 128})
    for (int block_kv : {64, 128})
      for (int stages : {2, 3}) {
        KernelSpec spec{Family::fwd, variant % 2 ? DType::f16 : DType::bf16, head_dim, 128, block_kv, 8};
        spec.stages = stages;
        spec.wgmma = true;
        spec.padded = variant % 7 == 3;
        if (set_feature_variant(spec, variant++) && spec.smem_bytes() <= 227 * 1024) specs.push_back(spec);
      }
  // Chunked prefill and speculative decoding over a KV cache (contiguous or
  // paged; q rotated at the cache's positions; split where the tiles are few).
  for (const char* text : {"fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128.packgqa.kvcache.paged",
                           "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128.packgqa.kvcache.leftpad.split",
                           "fwd.f16.d64.br128.bc64.w8.s4.wgmma.local.softcap.alibi.kvcache.paged",
                           "fwd.bf16.d128.br128.bc64.w8.s4.wgmma.causal.rope_interleaved_r64.rope_tables.kvcache",
                           "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128.packgqa.kvcache.paged.split",
                           "fwd.f16.d64.br128.bc128.w8.s4.wgmma.local.softcap.alibi.packgqa.kvcache.split",
                           // Dense calls with a workspace split the same tiles: keys by tensor copies, or
                           // rotated by the producer.
                           "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.packgqa.split",
                           "fwd.f16.d64.br128.bc128.w8.s4.wgmma.local.softcap.alibi.rope_interleaved_r32.rope_tables16.split",
                           // Varlen calls: packed queries over packed keys or a paged cache, split or not.
                           "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.packgqa.split.varlen",
                           "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.kvcache.paged.varlen",
                           // (packed GQA: batches of mostly short sequences, e.g. decoding steps beside a chunk)
                           "fwd.bf16.d64.br192.bc128.w12.s4.wgmma.causal.packgqa.varlen",
                           "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.packgqa.kvcache.paged.varlen",
                           "fwd.f16.d64.br128.bc64.w8.s4.wgmma.local.softcap.alibi.packgqa.kvcache.paged.split.varlen",
                           // RoPE tables staged beside K (16-bit: two and three slots; f32: one; and the
                           // loads from L2 that the same kernels keep for blocks past the tables).
                           "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128.rope_tables16",
                           "fwd.f16.d96.br128.bc64.w8.s3.wgmma.local.rope_interleaved_r64.rope_tables16.varlen",
                           "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.softcap.rope_interleaved_r128.rope_tables"}) {
    specs.push_back(KernelSpec::parse(text));
  }
  REQUIRE(specs.size() >= 14);
  const auto errors = compile_all(specs, Arch::parse("sm_90a"), [](const KernelSpec&, const std::string& log) -> std::string {
    if (log.find("0 bytes spill stores") == std::string::npos) return "spills";
    return "";
  });
  for (const auto& e : errors) FAIL_CHECK(e);
  CHECK(errors.empty());
  // The kernel refuses to compile for anything but sm_90a (its wgmma would
  // be missing there), and says why.
  try {
    compile_cubin(render(specs.front(), TemplateSet()), "wgmma.cu", Arch::parse("sm_90"), specs.front().text());
    FAIL("a wgmma spec compiled for sm_90");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("wgmma needs sm_90a") != std::string::npos);
  }
}

TEST_CASE("wgmma specs above head dim 128 compile with their features, without serialized wgmma (sm_90a)") {
  // O in 128-column wgmmas (192: then 64), S with N = bc of 64, 80 or 96;
  // features cycled as above (RoPE styles, partial rotation and tables
  // included), varlen on every other. The MMA warps' 240 registers hold
  // 96-128 output accumulators: nothing spills at 192, and at 256 the masked
  // and varlen kernels spill 36-72 bytes (ptxas, NVRTC 13.0; the planner's
  // 128 × 80 tiles measured 0-6% faster than 128 × 64 all the same,
  // docs/PERFORMANCE.md). With RoPE the producer takes 56 registers at 192
  // (nothing spills) and 40 at 256, where the MMA warps' 232 spill up to
  // 236 bytes, with ALiBi (FwdConfig::kProducerRegisters), and KV caches
  // up to 164. More would mean the register split moved. A window cut to
  // chunks holds its chunks' bounds too: 260 bytes with RoPE and ALiBi.
  struct Tiles {
    int head_dim, block_kv, stages;
  };
  const Tiles tiles[] = {{192, 64, 2}, {192, 64, 3}, {192, 80, 2}, {192, 96, 2}, {256, 64, 2}, {256, 80, 2}};
  std::vector<KernelSpec> specs;
  // Chunked prefill over a KV cache: the planner's tiles, contiguous (96 or
  // 80 keys) and paged (64), q rotated at the cache's positions, split
  // where the tiles are few (speculative decoding). A paged
  // cache's producer takes 56 registers at 192 and 40 at 256; a contiguous
  // one keeps 24, where RoPE tables spill 44 bytes at 192.
  for (const char* text : {"fwd.bf16.d192.br128.bc96.w8.s2.wgmma.causal.rope_tables.rope_half_r192.kvcache",
                           "fwd.f16.d192.br128.bc64.w8.s3.wgmma.local.softcap.alibi.rope_interleaved_r96.packgqa.kvcache.paged",
                           "fwd.bf16.d256.br128.bc80.w8.s2.wgmma.causal.packgqa.kvcache",
                           "fwd.bf16.d256.br128.bc80.w8.s2.wgmma.local.alibi.rope_interleaved_r128.rope_tables.kvcache",
                           "fwd.bf16.d256.br128.bc64.w8.s2.wgmma.causal.rope_half_r256.kvcache.paged",
                           "fwd.f16.d256.br128.bc64.w8.s2.wgmma.local.softcap.packgqa.kvcache.paged.padded",
                           "fwd.bf16.d256.br128.bc80.w8.s2.wgmma.causal.packgqa.kvcache.split",
                           "fwd.f16.d192.br128.bc64.w8.s3.wgmma.causal.rope_half_r192.packgqa.kvcache.paged.split",
                           "fwd.bf16.d256.br128.bc80.w8.s2.wgmma.causal.packgqa.split",
                           "fwd.f16.d192.br128.bc96.w8.s2.wgmma.local.rope_half_r192.split"}) {
    specs.push_back(KernelSpec::parse(text));
  }
  int variant = 0;
  for (const Tiles& t : tiles) {
    for (int i = 0; i < 4; ++i, ++variant) {
      KernelSpec spec{Family::fwd, variant % 2 ? DType::f16 : DType::bf16, t.head_dim, 128, t.block_kv, 8};
      spec.stages = t.stages;
      spec.wgmma = true;
      if (!set_feature_variant(spec, variant)) continue;
      spec.varlen = variant % 2 == 1;
      spec.padded = variant % 7 == 3;
      spec.validate();
      CHECK_MESSAGE(spec.smem_bytes() <= 227 * 1024, spec.text());
      specs.push_back(spec);
    }
  }
  const auto errors = compile_all(specs, Arch::parse("sm_90a"), [](const KernelSpec& spec, const std::string& log) -> std::string {
    const int spilled = spill_store_bytes(log);
    const int bound = spec.head_dim == 192 ? (spec.kvcache && spec.rope_tables ? 64 : 0)
                      : spec.rope != RopeKind::none ? (spec.chunk ? 288 : 256)
                                                    : 128;
    if (spilled > bound) return fmt::format("spills {} bytes", spilled);
    return "";
  });
  for (const auto& e : errors) FAIL_CHECK(e);
  CHECK(errors.empty());
}

TEST_CASE("wgmma specs with 176-key blocks compile with their features, without spills or serialized wgmma") {
  // S holds 88 accumulators beside O's 64 and P's 44 words: only the 240
  // registers beside a 24-register producer hold them (with 208 they
  // spilled 212 bytes and serialized the wgmma; FwdConfig::kProducerRegisters).
  // Every feature the spec takes with these blocks (masks, softcap, ALiBi,
  // GQA packing, padding, split), at head dims 64-128.
  std::vector<KernelSpec> specs;
  int variant = 0;
  for (int head_dim : {128, 96, 64}) {
    for (int i = 0; i < 8; ++i, ++variant) {
      KernelSpec spec{Family::fwd, variant % 2 ? DType::f16 : DType::bf16, head_dim, 128, 176, 8};
      spec.stages = 2;
      spec.wgmma = true;
      set_feature_variant(spec, variant);
      spec.rope = RopeKind::none, spec.rotary_dim = 0, spec.rope_tables = spec.rope_tables16 = false;
      spec.padded = variant % 3 == 2;
      spec.split = variant % 4 == 1;
      spec.sink = spec.sink && !spec.split;  // split partials leave sinks to the combine
      spec.validate();
      CHECK_MESSAGE(spec.smem_bytes() <= 227 * 1024, spec.text());
      specs.push_back(spec);
    }
  }
  const auto errors = compile_all(specs, Arch::parse("sm_90a"), [](const KernelSpec&, const std::string& log) -> std::string {
    if (log.find(" 0 bytes spill stores") == std::string::npos) return "spills";
    return "";
  });
  for (const auto& e : errors) FAIL_CHECK(e);
  CHECK(errors.empty());
}

TEST_CASE("wgmma specs with three MMA warpgroups (w12, 192 rows) compile with their features, without serialized wgmma") {
  std::vector<KernelSpec> specs;
  int variant = 0;
  for (int head_dim : {32, 64, 96, 128})
    for (int block_kv : {64, 128})
      for (int stages : {2, 3, 4}) {
        KernelSpec spec{Family::fwd, variant % 2 ? DType::f16 : DType::bf16, head_dim, 192, block_kv, 12};
        spec.stages = stages;
        spec.wgmma = true;
        spec.padded = variant % 7 == 3;
        if (set_feature_variant(spec, variant++) && spec.accumulator_registers() <= 96 &&
            spec.smem_bytes() <= 227 * 1024) {
          specs.push_back(spec);
        }
      }
  // Chunked prefill over a KV cache (the planner's tiles at head dims up to
  // 64 without RoPE), contiguous and paged.
  for (const char* text : {"fwd.bf16.d64.br192.bc128.w12.s4.wgmma.causal.kvcache.paged",
                           "fwd.f16.d32.br192.bc128.w12.s4.wgmma.local.softcap.packgqa.kvcache",
                           "fwd.f16.d64.br192.bc128.w12.s4.wgmma.local.softcap.alibi.kvcache.paged.padded",
                           "fwd.bf16.d64.br192.bc128.w12.s4.wgmma.causal.packgqa.kvcache.split"}) {
    specs.push_back(KernelSpec::parse(text));
  }
  REQUIRE(specs.size() >= 12);
  const auto errors = compile_all(specs, Arch::parse("sm_90a"), [](const KernelSpec& spec, const std::string& log) -> std::string {
    // Without RoPE nothing spills. With RoPE the producer's 32 registers
    // (FwdConfig::kProducerRegisters) spill 4-152 bytes (ptxas of NVRTC
    // 13.0); the planner takes these tiles without RoPE only, so only forced
    // tiles meet those, and they are checked for compiling, not for spills.
    if (spec.rope != RopeKind::none) return "";
    if (log.find(" 0 bytes spill stores") == std::string::npos) return "spills";
    return "";
  });
  for (const auto& e : errors) FAIL_CHECK(e);
  CHECK(errors.empty());
}

TEST_CASE("persistent wgmma specs compile with their features and varlen, spilling only where the ordinary kernel does") {
  // Two and three MMA warpgroups, every stage count that fits beside the two
  // Q buffers; the rendered entry asserts that the kernel's shared-memory
  // layout matches KernelSpec::smem_bytes().
  std::vector<KernelSpec> specs, ordinary;
  int variant = 0;
  for (int head_dim : {32, 64, 96, 128})
    for (int warps : {8, 12})
      for (int stages : {2, 4}) {
        KernelSpec spec{Family::fwd, variant % 2 ? DType::f16 : DType::bf16, head_dim, 16 * warps, 128, warps};
        if (warps == 12) spec.block_kv = head_dim > 64 ? 64 : 128;
        spec.stages = stages;
        spec.wgmma = true;
        spec.padded = variant % 7 == 3;
        spec.varlen = variant % 3 == 2;
        if (!set_feature_variant(spec, variant++) || (warps == 12 && spec.rope != RopeKind::none)) continue;
        ordinary.push_back(spec);
        spec.persistent = true;
        if (spec.smem_bytes() <= 227 * 1024) specs.push_back(spec);
      }
  // Persistent producers that ran short of registers (ptxas, NVRTC 13.0),
  // which the features above do not all reach: packed GQA at head dim 128
  // (the Q copy's addresses), three warpgroups with a window or varlen.
  for (const char* text : {"fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.causal.packgqa",
                           "fwd.f16.d128.br128.bc128.w8.s2.wgmma.persistent.local.softcap.alibi.packgqa.varlen",
                           "fwd.bf16.d64.br192.bc128.w12.s4.wgmma.persistent.causal.varlen",
                           "fwd.bf16.d32.br192.bc128.w12.s4.wgmma.persistent.varlen",
                           "fwd.bf16.d64.br192.bc128.w12.s4.wgmma.persistent.local",
                           // One table slot beside the second Q tile (KernelSpec::rope_table_slots).
                           "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.causal.rope_half_r128.rope_tables16"}) {
    KernelSpec spec = KernelSpec::parse(text);
    specs.push_back(spec);
    spec.persistent = false;
    ordinary.push_back(spec);
  }
  REQUIRE(specs.size() >= 8);
  CHECK(std::any_of(specs.begin(), specs.end(), [](const KernelSpec& s) { return s.varlen; }));
  CHECK(std::any_of(specs.begin(), specs.end(), [](const KernelSpec& s) { return s.rope != RopeKind::none; }));
  auto spills = [](const std::string& log) { return log.find(" 0 bytes spill stores") == std::string::npos; };
  // The ordinary kernels that spill (ptxas of NVRTC 13.0: 16 bytes at head
  // dim 128 with RoPE): their persistent forms may spill too.
  std::mutex mutex;
  std::set<std::string> spilling;
  const auto ordinary_errors = compile_all(ordinary, Arch::parse("sm_90a"), [&](const KernelSpec& spec, const std::string& log) -> std::string {
    const std::lock_guard<std::mutex> lock(mutex);
    if (spills(log)) spilling.insert(spec.text());
    return "";
  });
  CHECK(ordinary_errors.empty());
  const auto errors = compile_all(specs, Arch::parse("sm_90a"), [&](const KernelSpec& spec, const std::string& log) -> std::string {
    KernelSpec plain = spec;
    plain.persistent = false;
    // Three warpgroups with packed GQA spill 16-136 bytes: the loop over
    // tiles keeps the tile's addresses live beside 96 accumulators. The
    // planner never takes that combination persistent.
    if (spec.warps == 12 && spec.pack_gqa) return "";
    const std::lock_guard<std::mutex> lock(mutex);
    if (spills(log) && spilling.count(plain.text()) == 0) return "spills, where the ordinary kernel does not";
    return "";
  });
  for (const auto& e : errors) FAIL_CHECK(e);
  CHECK(errors.empty());
}

TEST_CASE("value head dims of their own (dvN) compile in every prefill family with their features, spilling no more than with V as wide as K") {
  // V's tiles and O narrower than Q's and K's (FwdConfig::kSplitDims): the
  // 4-warp kernels (sm_80), the mma.sync producer layout, wgmma tiles of
  // two and three warpgroups, persistent and not, 176-key blocks, and head
  // dims above 128; features cycled as elsewhere, varlen and padded q/k on
  // some. Each is compiled beside the same spec without its value dim: a
  // narrower V holds fewer accumulators, so it may not spill more.
  struct Shape {
    const char* arch;
    int head_dim, head_dim_v, block_q, block_kv, warps, stages;
    bool wgmma, persistent;
  };
  const Shape shapes[] = {
      {"sm_80", 192, 128, 64, 64, 4, 0, false, false},    {"sm_80", 192, 128, 128, 64, 8, 0, false, false},
      {"sm_80", 128, 64, 128, 64, 4, 0, false, false},    {"sm_80", 96, 64, 128, 64, 4, 0, false, false},
      {"sm_80", 64, 32, 128, 128, 4, 0, false, false},    {"sm_80", 256, 192, 128, 64, 8, 0, false, false},
      {"sm_90a", 64, 32, 256, 64, 8, 3, false, false},    {"sm_90a", 192, 128, 128, 96, 8, 2, true, false},
      {"sm_90a", 192, 128, 128, 128, 8, 2, true, false},  {"sm_90a", 256, 128, 128, 80, 8, 2, true, false},
      {"sm_90a", 256, 192, 128, 64, 8, 2, true, false},   {"sm_90a", 128, 64, 128, 128, 8, 2, true, true},
      {"sm_90a", 128, 64, 128, 176, 8, 2, true, false},   {"sm_90a", 64, 32, 192, 128, 12, 4, true, true},
      {"sm_90a", 128, 96, 128, 128, 8, 2, true, false},   {"sm_90a", 96, 64, 128, 128, 8, 2, true, true}};
  std::map<std::string, std::vector<KernelSpec>> by_arch;
  int variant = 0;
  for (const Shape& shape : shapes) {
    for (int i = 0; i < 2; ++i, ++variant) {
      KernelSpec spec{Family::fwd, variant % 2 ? DType::f16 : DType::bf16, shape.head_dim, shape.block_q,
                      shape.block_kv, shape.warps};
      spec.stages = shape.stages;
      spec.wgmma = shape.wgmma;
      spec.persistent = shape.persistent;
      set_feature_variant(spec, variant);
      // RoPE where the tiles take it: the mma.sync producer is RoPE's, and
      // 176-key blocks and three warpgroups take none.
      const bool rope_ok = !(shape.block_kv == 176 || shape.warps == 12);
      if (shape.stages > 0 && !shape.wgmma) {
        spec.rope = RopeKind::half, spec.rotary_dim = shape.head_dim;
      } else if (!rope_ok || i == 0) {
        spec.rope = RopeKind::none, spec.rotary_dim = 0, spec.rope_tables = spec.rope_tables16 = false;
      }
      if (shape.warps == 12) spec.pack_gqa = false;  // three persistent warpgroups take no packed GQA (planner)
      // (The planner takes 128-key blocks at 192 for dense keys only.)
      spec.varlen = variant % 3 == 1 && shape.block_kv != 176 && !(shape.head_dim == 192 && shape.block_kv == 128);
      spec.padded = variant % 5 == 3;
      spec.head_dim_v = shape.head_dim_v;
      spec.validate();
      CHECK_MESSAGE(spec.smem_bytes() <= 227 * 1024, spec.text());
      by_arch[shape.arch].push_back(spec);
    }
  }
  const size_t compiled = compile_beside_twins(
      by_arch,
      [](const KernelSpec& spec) {
        KernelSpec plain = spec;
        plain.head_dim_v = 0;
        return plain;
      },
      [](const KernelSpec& plain) { return plain.smem_bytes() <= 227 * 1024 && plain.accumulator_registers() <= 192; },
      // The mma.sync producer layout's V copies of 4-chunk rows spilled 8
      // bytes where 8-chunk rows did not (head dim 64 with V 32, RoPE and
      // ALiBi; ptxas, NVRTC 13.0).
      [](const KernelSpec& spec) { return spec.stages > 0 && !spec.wgmma ? 8 : 0; }, "with V as wide as K");
  CHECK(compiled == 2 * std::size(shapes));
}

TEST_CASE("angles scaled by YaRN's attention factor (rope_scaled) compile in every family that rotates, spilling no more than unscaled") {
  // cos and sin multiplied by FwdParams::rope_attention_factor wherever
  // angles come from the frequencies (rope.cuh, scale_angle): Q in shared
  // memory and in registers (wgmma at head dims up to 64), K by the 4-warp
  // kernels, the mma.sync producer and the wgmma producer (stepped angles),
  // head dims above 128, unaligned rows, decode, KV-cache tiles and the
  // append. Each is compiled beside the same spec unscaled: the scaling is
  // two products per evaluated angle and may not cost spills.
  struct Shape {
    const char* arch;
    int head_dim, block_q, block_kv, warps, stages;
    bool wgmma, persistent;
    int unaligned_dim;
  };
  const Shape shapes[] = {
      {"sm_80", 128, 128, 64, 4, 0, false, false, 0},      {"sm_80", 64, 128, 64, 4, 0, false, false, 0},
      {"sm_80", 256, 128, 64, 8, 0, false, false, 0},      {"sm_80", 64, 128, 64, 4, 0, false, false, 59},
      {"sm_90a", 64, 256, 64, 8, 3, false, false, 0},      {"sm_90a", 128, 128, 64, 8, 2, false, false, 0},
      {"sm_90a", 128, 128, 128, 8, 2, true, false, 0},     {"sm_90a", 128, 128, 128, 8, 2, true, true, 0},
      {"sm_90a", 64, 128, 128, 8, 4, true, true, 0},       {"sm_90a", 64, 128, 128, 8, 2, true, false, 0},
      {"sm_90a", 192, 128, 96, 8, 2, true, false, 0},      {"sm_90a", 256, 128, 80, 8, 2, true, false, 0},
      {"sm_90a", 96, 128, 64, 8, 3, true, false, 0},       {"sm_90a", 64, 192, 128, 12, 2, true, false, 0},
      {"sm_90a", 128, 128, 128, 8, 2, true, false, 111}};
  std::map<std::string, std::vector<KernelSpec>> by_arch;
  int variant = 0;
  auto add = [&](const char* arch, KernelSpec spec) {
    spec.rope_tables = spec.rope_tables16 = false;
    spec.rope_scaled = true;
    spec.validate();
    by_arch[arch].push_back(spec);
  };
  for (const Shape& shape : shapes) {
    for (int i = 0; i < 2; ++i, ++variant) {
      KernelSpec spec{Family::fwd, variant % 2 ? DType::f16 : DType::bf16, shape.head_dim, shape.block_q,
                      shape.block_kv, shape.warps};
      spec.stages = shape.stages;
      spec.wgmma = shape.wgmma;
      spec.persistent = shape.persistent;
      if (shape.unaligned_dim != 0) {
        set_unaligned_variant(spec, variant, shape.unaligned_dim);
        spec.unaligned_dim = shape.unaligned_dim;
      } else {
        set_feature_variant(spec, variant);
        spec.varlen = variant % 3 == 1;
      }
      // Every one rotates: both styles, partial rotation on some.
      spec.rope = i == 0 ? RopeKind::half : RopeKind::interleaved;
      const int rotary_limit = shape.unaligned_dim != 0 ? shape.unaligned_dim / 16 * 16 : shape.head_dim;
      spec.rotary_dim = variant % 3 == 2 ? rotary_limit / 32 * 16 : rotary_limit;
      if (shape.warps == 12) spec.pack_gqa = false;
      add(shape.arch, spec);
    }
  }
  // KV caches: the decode kernel and the wgmma and 4-warp tiles rotate q
  // only; the append rotates the new keys it writes.
  for (const char* text : {"decode.bf16.d128.br16.bc32.w4.s2.rope_half_r128.paged.split",
                           "decode.f16.d64.br32.bc64.w4.s2.causal.rope_interleaved_r32.dynsplit.split",
                           "decode.bf16.d256.br16.bc16.w8.s2.local.sink.rope_half_r256",
                           "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128.packgqa.kvcache.split",
                           "fwd.bf16.d64.br64.bc64.w4.causal.rope_interleaved_r64.packgqa.kvcache.paged.split"}) {
    add(std::string(text).find("wgmma") != std::string::npos ? "sm_90a" : "sm_80", KernelSpec::parse(text));
  }
  add("sm_90a", KernelSpec::append(DType::bf16, RopeKind::half, 64, false, false, true, true));
  add("sm_80", KernelSpec::append(DType::f16, RopeKind::interleaved, 128, false, false, false, true));
  const size_t compiled = compile_beside_twins(
      by_arch,
      [](const KernelSpec& spec) {
        KernelSpec unscaled = spec;
        unscaled.rope_scaled = false;
        return unscaled;
      },
      [](const KernelSpec&) { return true; }, [](const KernelSpec&) { return 0; }, "unscaled");
  CHECK(compiled == 2 * std::size(shapes) + 7);
}

TEST_CASE("feature combinations compile at every head dim: all 32 at 128, a spread elsewhere (sm_80, default tiles)") {
  const Arch arch = Arch::parse("sm_80");
  std::vector<KernelSpec> specs;
  for (int head_dim : {32, 64, 96, 128, 192, 256})
    for (int features = 0; features < 32; features += (head_dim == 128 ? 1 : 3)) {
      const bool local = (features & 1) != 0;
      const TileConfig t = default_tiles(DType::bf16, head_dim, local, arch, 4096);
      specs.push_back({Family::fwd, DType::bf16, head_dim, t.block_q, t.block_kv, t.warps, false, local,
                       (features & 2) != 0, (features & 4) != 0, (features & 8) != 0, (features & 16) != 0});
    }
  const auto errors = compile_all(specs, arch);
  for (const auto& e : errors) FAIL_CHECK(e);
  CHECK(errors.empty());
}

TEST_CASE("head dims that are not a multiple of 8 compile with their features, spilling at most 128 bytes more than padded") {
  // Element-wise rows (unaligned_dN) on the 4-warp kernels of every head dim,
  // features cycled as above, varlen on every other; each beside the same
  // spec with 16-byte rows (padded). A chunk's eight 2-byte loads hold a
  // register each until stored, so these kernels spill more than the padded
  // ones where those are at 255 registers already: 0-104 bytes more
  // (NVRTC 13.0; the copies are one chunk at a time, which spilled least).
  // A copy that keeps more in flight would break the bound.
  const std::pair<int, int> dims[] = {{32, 20}, {64, 59}, {96, 90}, {128, 111}, {192, 161}, {256, 250}};
  for (const char* arch_text : {"sm_80", "sm_90a"}) {
    const Arch arch = Arch::parse(arch_text);
    std::vector<KernelSpec> specs;
    int variant = 0;
    for (const auto& [head_dim, caller_dim] : dims) {
      for (int i = 0; i < 3; ++i, ++variant) {
        const TileConfig t = default_tiles(DType::f16, head_dim, true, arch, 4096);
        KernelSpec spec{Family::fwd, DType::f16, head_dim, t.block_q, t.block_kv, t.warps};
        set_unaligned_variant(spec, variant, caller_dim);
        KernelSpec padded = spec;
        padded.padded = true;
        spec.unaligned_dim = caller_dim;
        specs.push_back(padded);
        specs.push_back(spec);
      }
    }
    std::mutex mutex;
    std::map<std::string, std::string> logs;  // by spec text
    const auto errors = compile_all(specs, arch, [&](const KernelSpec& spec, const std::string& log) {
      const std::lock_guard<std::mutex> lock(mutex);
      logs[spec.text()] = log;
      return std::string();
    });
    for (const auto& e : errors) FAIL_CHECK(e);
    CHECK(errors.empty());
    for (size_t i = 0; i + 1 < specs.size(); i += 2) {
      const std::string padded = specs[i].text(), unaligned = specs[i + 1].text();
      INFO(arch_text, " ", unaligned, " beside ", padded);
      CHECK(spill_store_bytes(logs[unaligned]) >= 0);
      CHECK(spill_store_bytes(logs[unaligned]) <= spill_store_bytes(logs[padded]) + 128);
    }
  }
}

TEST_CASE("head dims that are not a multiple of 8 compile on wgmma tiles with staged rows, without spills (sm_90a)") {
  // FwdConfig::kStagedRows: 128-row tiles of two warpgroups whose producer
  // stages and shifts the rows, at every wgmma head dim, features cycled as
  // above, 2-3 stages (2 above 64); the shared-memory layout must match
  // smem_bytes() (entry_fwd.cu asserts it) and fit. None spilled (NVRTC 13.0).
  const Arch arch = Arch::parse("sm_90a");
  const std::pair<int, int> dims[] = {{32, 20}, {64, 59}, {64, 37}, {96, 90}, {128, 111}, {128, 125}};
  std::vector<KernelSpec> specs;
  int variant = 0;
  for (const auto& [head_dim, caller_dim] : dims) {
    for (int i = 0; i < 3; ++i, ++variant) {
      KernelSpec spec{Family::fwd, DType::bf16, head_dim, 128, head_dim > 64 ? 64 : 128, 8};
      spec.stages = head_dim > 64 ? 2 : 2 + variant % 2;  // three 32 KB stages and slots do not fit above 64
      spec.wgmma = true;
      set_unaligned_variant(spec, variant, caller_dim);
      spec.unaligned_dim = caller_dim;
      spec.validate();
      CHECK_MESSAGE(spec.smem_bytes() <= 227 * 1024, spec.text());
      specs.push_back(spec);
    }
  }
  const auto errors = compile_all(specs, arch, [](const KernelSpec&, const std::string& log) -> std::string {
    return log.find(" 0 bytes spill stores") == std::string::npos ? "spills" : "";
  });
  for (const auto& e : errors) FAIL_CHECK(e);
  CHECK(errors.empty());
}

TEST_CASE("RoPE, packed GQA, KV-cache/paged/split decoding and append kernels compile (sm_90a)") {
  const Arch arch = Arch::parse("sm_90a");
  std::vector<KernelSpec> specs;
  int variant = 0;
  for (int head_dim : {32, 64, 128, 256})
    for (RopeKind rope : {RopeKind::half, RopeKind::interleaved})
      for (bool tables : {false, true})
        for (bool partial : {false, true}) {
          const TileConfig t = default_tiles(DType::bf16, head_dim, true, arch, 4096);
          KernelSpec spec{Family::fwd, (variant % 2) ? DType::f16 : DType::bf16, head_dim, t.block_q, t.block_kv, t.warps};
          spec.rope = rope;
          spec.rope_tables = tables;
          spec.rope_tables16 = tables && variant % 3 == 1;  // tables in dtype (FlashAttention's)
          spec.rotary_dim = partial ? head_dim / 2 : head_dim;
          // Spread the other features over the variants.
          spec.causal = variant % 3 == 0;
          spec.local = variant % 3 == 1;
          spec.pack_gqa = variant % 4 < 2;
          spec.alibi = variant % 5 == 0;
          spec.softcap = variant % 7 == 0;
          spec.varlen = variant % 6 == 0;
          ++variant;
          specs.push_back(spec);
        }
  for (int head_dim : {64, 128}) {
    const TileConfig t = default_tiles(DType::bf16, head_dim, false, arch, 512);
    specs.push_back({Family::fwd, DType::bf16, head_dim, t.block_q, t.block_kv, t.warps});
    specs.back().pack_gqa = true;
  }
  // Dense calls with a workspace on the 4-warp tiles: split, K rotated by
  // the MMA warps.
  specs.push_back(KernelSpec::parse("fwd.bf16.d128.br64.bc128.w4.causal.packgqa.split"));
  specs.push_back(KernelSpec::parse("fwd.f16.d64.br64.bc128.w4.softcap.rope_half_r64.split"));
  // And the wgmma tiles whose producer rotates K at head dim 128 (NVRTC 13.0
  // spills 16-24 bytes there, split or not, so it is not in the spill-free
  // wgmma list).
  specs.push_back(KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128.packgqa.split"));
  // Decoding: KV cache, paged, split, with and without RoPE on q; and the
  // append kernels that write new keys.
  for (int variant = 0; variant < 8; ++variant) {
    KernelSpec spec{Family::fwd, variant % 2 ? DType::f16 : DType::bf16, variant % 3 == 0 ? 64 : 128, 64,
                    variant % 2 ? 64 : 128, 4};
    spec.kvcache = true;
    spec.pack_gqa = variant % 4 != 3;
    spec.paged = (variant & 1) != 0;
    spec.split = (variant & 2) != 0;
    spec.causal = (variant & 4) != 0;
    if (variant >= 4) {
      spec.rope = variant % 2 ? RopeKind::interleaved : RopeKind::half;
      spec.rotary_dim = spec.head_dim;
      spec.rope_tables = spec.rope_tables16 = variant == 7;
    }
    specs.push_back(spec);
  }
  // The decode kernel: every head dim, both row tiles, chunk sizes, warp
  // counts and depths, with the features spread over the variants.
  variant = 0;
  for (int head_dim : {32, 64, 96, 128, 192, 256})
    for (int block_q : {16, 32}) {
      if (head_dim > 128 && block_q == 32) continue;
      KernelSpec spec = KernelSpec::parse(fmt::format("decode.{}.d{}.br{}.bc{}.w{}.s{}", variant % 2 ? "f16" : "bf16",
                                                      head_dim, block_q, variant % 3 == 2 ? 32 : 16,
                                                      1 << (variant % 4), 2 + variant % 3));
      spec.causal = variant % 3 == 0;
      spec.local = variant % 3 == 1;
      spec.softcap = variant % 4 == 1;
      spec.alibi = variant % 5 == 2;
      spec.paged = variant % 2 == 0;
      spec.split = variant % 4 < 2;
      spec.padded = head_dim == 96;
      spec.sink = variant % 3 == 2 && !spec.split;
      if (variant % 3 != 1) {
        spec.rope = variant % 2 ? RopeKind::interleaved : RopeKind::half;
        spec.rotary_dim = variant % 4 == 0 ? head_dim / 2 / 16 * 16 : head_dim;
        spec.rope_tables = variant % 5 == 0;
        spec.rope_tables16 = spec.rope_tables && variant % 2 == 1;
      }
      ++variant;
      specs.push_back(spec);
    }
  // The decode kernel over a dense call's K/V (forward with few query rows).
  for (const char* text : {"decode.bf16.d128.br16.bc32.w4.s2.dense.split", "decode.f16.d64.br32.bc64.w4.s2.causal.dense",
                           "decode.bf16.d256.br16.bc16.w4.s2.local.softcap.alibi.dense.split",
                           "decode.bf16.d96.br16.bc32.w2.s3.padded.dense",
                           // Varlen: packed queries over packed keys or a paged cache.
                           "decode.bf16.d128.br16.bc32.w4.s2.dense.split.varlen",
                           "decode.f16.d64.br32.bc64.w4.s2.causal.alibi.dense.varlen",
                           "decode.bf16.d128.br16.bc32.w4.s2.paged.split.varlen",
                           // Split counts chosen on the device (dynamic_splits).
                           "decode.bf16.d128.br16.bc32.w4.s2.split.dynsplit",
                           "decode.f16.d64.br32.bc64.w4.s3.local.rope_half_r64.paged.split.dynsplit",
                           "decode.bf16.d128.br16.bc32.w4.s2.paged.split.dynsplit.varlen",
                           "decode.bf16.d256.br16.bc16.w4.s2.causal.softcap.dense.split.dynsplit.varlen",
                           "decode.bf16.d256.br16.bc16.w4.s2.local.softcap.paged.varlen",
                           // A contiguous cache read from each sequence's cache_leftpad.
                           "decode.bf16.d128.br16.bc32.w4.s2.causal.rope_half_r128.leftpad.split",
                           "decode.f16.d64.br32.bc64.w4.s3.local.leftpad.split.dynsplit",
                           "fwd.bf16.d128.br64.bc128.w4.causal.packgqa.kvcache.leftpad.split",
                           // Windows cut to chunks (attention_chunk) in the decode kernel.
                           "decode.bf16.d128.br16.bc32.w4.s2.local.chunk.split",
                           "decode.bf16.d128.br16.bc32.w4.s2.local.chunk.paged.split.dynsplit",
                           "decode.f16.d64.br32.bc64.w4.s2.local.chunk.rope_half_r64.leftpad",
                           "decode.bf16.d128.br16.bc32.w4.s2.local.chunk.dense.split.varlen",
                           // Learnable sinks where the decode kernel writes final rows.
                           "decode.bf16.d64.br32.bc64.w4.s3.local.sink.split.dynsplit",
                           "decode.bf16.d128.br16.bc32.w4.s2.causal.softcap.sink.paged.varlen",
                           "decode.f16.d256.br16.bc16.w4.s2.alibi.sink.rope_half_r256.paged.split.dynsplit",
                           // Pages shorter than a chunk (.pagedN), at every head dim: 8 rows are
                           // whole copy passes everywhere.
                           "decode.bf16.d32.br16.bc64.w4.s2.paged8.split",
                           "decode.f16.d64.br32.bc64.w4.s3.causal.rope_half_r64.paged16.split.dynsplit",
                           "decode.bf16.d64.br16.bc32.w4.s2.local.sink.paged16",
                           "decode.bf16.d96.br16.bc32.w4.s2.padded.paged8.split",
                           "decode.bf16.d128.br16.bc32.w4.s2.softcap.alibi.rope_interleaved_r64.rope_tables16.paged16",
                           "decode.bf16.d128.br32.bc32.w2.s3.local.chunk.paged8.split.dynsplit.varlen",
                           "decode.f16.d192.br16.bc16.w4.s2.causal.paged8.split",
                           "decode.bf16.d256.br16.bc16.w4.s2.rope_half_r128.rope_scaled.paged8",
                           "decode.bf16.d256.br16.bc16.w4.s2.causal.paged8.split.varlen",
                           // Pages shorter than a copy pass: each copy its row's page.
                           "decode.bf16.d32.br16.bc64.w4.s2.paged1.split.dynsplit",
                           "decode.f16.d64.br32.bc64.w4.s3.causal.rope_half_r64.paged1",
                           "decode.bf16.d64.br16.bc32.w2.s3.paged2.varlen",
                           "decode.bf16.d128.br16.bc32.w4.s2.local.sink.paged1",
                           "decode.bf16.d128.br16.bc16.w4.s3.rope_interleaved_r128.paged4.split.dynsplit",
                           "decode.bf16.d256.br16.bc16.w4.s2.alibi.paged1.split"}) {
    specs.push_back(KernelSpec::parse(text));
  }
  // Varlen on the 4-warp tiles: split, and over a paged cache.
  for (const char* text : {"fwd.bf16.d128.br64.bc128.w4.causal.packgqa.split.varlen",
                           "fwd.f16.d64.br64.bc64.w4.softcap.rope_half_r64.split.varlen",
                           "fwd.bf16.d128.br64.bc64.w4.local.packgqa.kvcache.paged.split.varlen",
                           "fwd.bf16.d128.br128.bc64.w8.s2.causal.kvcache.paged.varlen"}) {
    specs.push_back(KernelSpec::parse(text));
  }
  specs.push_back(KernelSpec::append(DType::bf16, RopeKind::none, 0, false, false, false, false));
  specs.push_back(KernelSpec::append(DType::f16, RopeKind::half, 64, false, false, true, false));
  specs.push_back(KernelSpec::append(DType::bf16, RopeKind::interleaved, 128, true, false, false, false));
  specs.push_back(KernelSpec::append(DType::f16, RopeKind::half, 128, true, true, true, false));
  const auto errors = compile_all(specs, arch);
  for (const auto& e : errors) FAIL_CHECK(e);
  CHECK(errors.empty());
}

TEST_CASE("every combine dtype pair compiles for sm_80 and sm_90a, vectors and elementwise, without spills") {
  std::vector<KernelSpec> specs;
  for (bool elementwise : {false, true}) {
    for (DType state : {DType::f32, DType::f16, DType::bf16})
      for (DType out : {DType::f32, DType::f16, DType::bf16}) specs.push_back(KernelSpec::combine(state, out, elementwise));
    // The combine of dynamic decode splits (fp32 partials only).
    for (DType out : {DType::f32, DType::f16, DType::bf16}) {
      specs.push_back(KernelSpec::combine(DType::f32, out, elementwise, /*dynamic_splits=*/true));
      // Split attention with learnable sinks, both kinds of split.
      specs.push_back(KernelSpec::combine(DType::f32, out, elementwise, /*dynamic_splits=*/false, /*sink=*/true));
      specs.push_back(KernelSpec::combine(DType::f32, out, elementwise, /*dynamic_splits=*/true, /*sink=*/true));
    }
  }
  for (const char* arch_text : {"sm_80", "sm_90a"}) {
    const Arch arch = Arch::parse(arch_text);
    const auto errors = compile_all(specs, arch);
    for (const auto& e : errors) FAIL_CHECK(e);
    CHECK(errors.empty());
  }
  for (const KernelSpec& spec : {KernelSpec::combine(DType::f32, DType::bf16), KernelSpec::combine(DType::bf16, DType::f16, true),
                                  KernelSpec::combine(DType::f32, DType::bf16, false, true),
                                  KernelSpec::combine(DType::f32, DType::bf16, false, true, true)}) {
    const CompileOutput out = compile_cubin(render(spec, TemplateSet()), "combine.cu", Arch::parse("sm_90a"), spec.text());
    CHECK_MESSAGE(out.log.find("0 bytes spill stores") != std::string::npos, out.log);
    CHECK_MESSAGE(out.log.find("jitattn_combine") != std::string::npos, out.log);
  }
}

TEST_CASE("a compile failure carries the spec text and the NVRTC log") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "jitattn-compile-failure";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& entry : embedded_templates()) std::ofstream(dir / entry.name, std::ios::binary) << entry.text;
  std::ofstream(dir / "ptx.cuh", std::ios::app) << "\nthis_is_not_cuda;\n";
  const KernelSpec spec = KernelSpec::parse("fwd.bf16.d64.br64.bc64.w4");
  try {
    compile_cubin(render(spec, TemplateSet(dir.string())), "broken.cu", Arch::parse("sm_80"), spec.text());
    FAIL("a broken template compiled");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::compile_failed);
    CHECK(dynamic_cast<const SourceRejected*>(&e) != nullptr);  // the registry remembers these
    CHECK(e.spec() == spec.text());
    CHECK(e.log().find("this_is_not_cuda") != std::string::npos);
    CHECK(std::string(e.what()).find(spec.text()) != std::string::npos);
    CHECK(e.log().find("ptx.cuh") != std::string::npos);  // #line markers point into the template
  }
  fs::remove_all(dir);
}

TEST_CASE("an arch NVRTC does not know is refused before compiling") {
  const KernelSpec spec = KernelSpec::parse("fwd.bf16.d64.br64.bc64.w4");
  CHECK_THROWS_WITH_AS(compile_cubin(render(spec, TemplateSet()), "x.cu", Arch::parse("sm_99"), spec.text()),
                       doctest::Contains("sm_99"), Error);
}

TEST_CASE("warm compiles on a miss, then hits the disk cache, also from a new runtime") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("jitattn-warm-{}", ::getpid());
  fs::remove_all(dir);
  Config config;
  config.cache_dir = dir.string();
  {
    Runtime runtime(config);
    const WarmResult first = runtime.warm("fwd.f16.d64.br64.bc32.w4", "sm_80");
    CHECK_FALSE(first.cache_hit);
    CHECK(first.compile_seconds > 0);
    CHECK(first.cubin_bytes > 0);
    const WarmResult second = runtime.warm("fwd.f16.d64.br64.bc32.w4", "sm_80");
    CHECK(second.cache_hit);
    CHECK(second.cubin_bytes == first.cubin_bytes);
  }
  Runtime fresh(config);
  CHECK(fresh.warm("fwd.f16.d64.br64.bc32.w4", "sm_80").cache_hit);
  CHECK_FALSE(fresh.warm("fwd.f16.d64.br64.bc32.w4", "sm_90a").cache_hit);  // arch is part of the key
  fs::remove_all(dir);
}

}  // TEST_SUITE
