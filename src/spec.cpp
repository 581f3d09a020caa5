#include "spec.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <charconv>
#include <numeric>
#include <vector>

#include "combine_params.h"

namespace jitattn::detail {
namespace {

std::vector<std::string_view> split_fields(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t end = text.find(sep, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

// Parses the integer after `prefix` in a field such as "d128".
bool parse_field(std::string_view field, std::string_view prefix, int& value) {
  if (field.substr(0, prefix.size()) != prefix || field.size() == prefix.size()) return false;
  const char* begin = field.data() + prefix.size();
  const char* end = field.data() + field.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  return ec == std::errc() && ptr == end;
}

[[noreturn]] void bad_spec(std::string_view text, const std::string& why) {
  throw Error(ErrorCode::invalid_argument, fmt::format("spec '{}': {}", text, why), std::string(text));
}

// --- the combine family: combine.<state dtype>.<out dtype>[.elementwise][.dynsplit][.sink] ---

bool combine_dtype(DType dtype) { return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16; }

std::string combine_text(const KernelSpec& spec);

KernelSpec parse_combine(std::string_view text) {
  auto fields = split_fields(text, '.');
  // The optional flags, each at most once and in this order.
  const bool sink = fields.size() > 3 && fields.back() == "sink";
  if (sink) fields.pop_back();
  const bool dynamic_splits = fields.size() > 3 && fields.back() == "dynsplit";
  if (dynamic_splits) fields.pop_back();
  const bool elementwise = fields.size() > 3 && fields.back() == "elementwise";
  if (elementwise) fields.pop_back();
  if (fields.size() != 3) {
    bad_spec(text, "expected combine.<state dtype>.<out dtype>[.elementwise][.dynsplit][.sink], e.g. combine.f32.bf16");
  }
  auto dtype_of = [&](std::string_view field, const char* role) {
    if (field == "f32") return DType::f32;
    if (field == "f16") return DType::f16;
    if (field == "bf16") return DType::bf16;
    bad_spec(text, fmt::format("{} dtype '{}' is not f32, f16 or bf16", role, field));
  };
  KernelSpec spec = KernelSpec::combine(dtype_of(fields[1], "state"), dtype_of(fields[2], "out"), elementwise,
                                        dynamic_splits, sink);
  spec.validate();
  return spec;
}

void validate_combine(const KernelSpec& spec) {
  if (!combine_dtype(spec.dtype) || !combine_dtype(spec.out_dtype)) {
    const std::string name = combine_text(spec);
    throw Error(ErrorCode::unsupported, fmt::format("spec '{}': state and out dtypes must be f32, f16 or bf16", name), name);
  }
}

std::string combine_text(const KernelSpec& spec) {
  return fmt::format("combine.{}.{}{}{}{}", dtype_name(spec.dtype), dtype_name(spec.out_dtype),
                     spec.elementwise ? ".elementwise" : "", spec.dynamic_splits ? ".dynsplit" : "",
                     spec.sink ? ".sink" : "");
}

uint64_t combine_packed(const KernelSpec& spec) {
  // The family at bit 60, as fwd and decode keys have theirs (KernelSpec::
  // packed): no fwd or decode key equals a combine key.
  return static_cast<uint64_t>(spec.family) << 60 | static_cast<uint64_t>(spec.sink) << 10 |
         static_cast<uint64_t>(spec.dynamic_splits) << 9 |
         static_cast<uint64_t>(spec.elementwise) << 8 |
         static_cast<uint64_t>(spec.dtype) << 4 | static_cast<uint64_t>(spec.out_dtype);
}

// --- the append family: append.<dtype>[.rope_*][.rope_tables][.paged] -------

std::string append_text(const KernelSpec& spec) {
  std::string out = fmt::format("append.{}", dtype_name(spec.dtype));
  if (spec.rope != RopeKind::none) {
    out += fmt::format(".rope_{}_r{}", spec.rope == RopeKind::half ? "half" : "interleaved", spec.rotary_dim);
  }
  if (spec.rope_scaled) out += ".rope_scaled";
  if (spec.rope_tables) out += spec.rope_tables16 ? ".rope_tables16" : ".rope_tables";
  if (spec.paged) out += ".paged";
  return out;
}

void validate_append(const KernelSpec& spec) {
  const std::string name = append_text(spec);
  auto fail = [&](const std::string& why) { throw Error(ErrorCode::unsupported, fmt::format("spec '{}': {}", name, why), name); };
  if (spec.dtype != DType::f16 && spec.dtype != DType::bf16) fail("dtype must be f16 or bf16");
  if (spec.rope == RopeKind::none && (spec.rotary_dim != 0 || spec.rope_tables)) fail("rotary_dim and rope_tables need a rope style");
  if (spec.rope_tables16 && !spec.rope_tables) fail("rope_tables16 is a kind of rope_tables");
  if (spec.rope_scaled && (spec.rope == RopeKind::none || spec.rope_tables)) {
    fail("rope_scaled scales angles from the frequencies: it needs a rope style and no tables");
  }
  if (spec.rope != RopeKind::none && (spec.rotary_dim < 16 || spec.rotary_dim > 256 || spec.rotary_dim % 16 != 0)) {
    fail(fmt::format("rotary_dim={} must be a multiple of 16 between 16 and 256", spec.rotary_dim));
  }
}

KernelSpec parse_append(std::string_view text) {
  auto fields = split_fields(text, '.');
  if (fields.size() < 2) {
    bad_spec(text, "expected append.<dtype>[.rope_half_rN][.rope_scaled|.rope_tables|.rope_tables16][.paged]");
  }
  KernelSpec spec;
  spec.family = Family::append;
  if (fields[1] == "f16") {
    spec.dtype = DType::f16;
  } else if (fields[1] == "bf16") {
    spec.dtype = DType::bf16;
  } else {
    bad_spec(text, fmt::format("dtype '{}' is not f16 or bf16", fields[1]));
  }
  for (size_t i = 2; i < fields.size(); ++i) {
    const bool half = parse_field(fields[i], "rope_half_r", spec.rotary_dim);
    if ((half || parse_field(fields[i], "rope_interleaved_r", spec.rotary_dim)) && spec.rope == RopeKind::none) {
      spec.rope = half ? RopeKind::half : RopeKind::interleaved;
    } else if ((fields[i] == "rope_tables" || fields[i] == "rope_tables16") && !spec.rope_tables) {
      spec.rope_tables = true;
      spec.rope_tables16 = fields[i] == "rope_tables16";
    } else if (fields[i] == "rope_scaled" && !spec.rope_scaled) {
      spec.rope_scaled = true;
    } else if (fields[i] == "paged" && !spec.paged) {
      spec.paged = true;
    } else {
      bad_spec(text, fmt::format("unknown or repeated field '{}' (known: rope_half_rN, rope_interleaved_rN, "
                                 "rope_scaled, rope_tables, rope_tables16, paged)", fields[i]));
    }
  }
  validate_append(spec);
  return spec;
}

uint64_t append_packed(const KernelSpec& spec) {
  return static_cast<uint64_t>(spec.family) << 60 | static_cast<uint64_t>(spec.rope_scaled) << 17 |
         static_cast<uint64_t>(spec.rope_tables16) << 16 |
         static_cast<uint64_t>(spec.dtype) << 12 | static_cast<uint64_t>(spec.rope) << 10 |
         static_cast<uint64_t>(spec.rotary_dim / 16) << 2 | static_cast<uint64_t>(spec.rope_tables) << 1 |
         static_cast<uint64_t>(spec.paged);
}

}  // namespace

KernelSpec KernelSpec::append(DType dtype, RopeKind rope, int rotary_dim, bool rope_tables, bool rope_tables16,
                              bool paged, bool rope_scaled) {
  KernelSpec spec;
  spec.family = Family::append;
  spec.dtype = dtype;
  spec.rope = rope;
  spec.rotary_dim = rope == RopeKind::none ? 0 : rotary_dim;
  spec.rope_tables = rope != RopeKind::none && rope_tables;
  spec.rope_tables16 = spec.rope_tables && rope_tables16;
  spec.rope_scaled = rope != RopeKind::none && !spec.rope_tables && rope_scaled;
  spec.paged = paged;
  return spec;
}

KernelSpec KernelSpec::combine(DType state_dtype, DType out_dtype, bool elementwise, bool dynamic_splits, bool sink) {
  KernelSpec spec;
  spec.family = Family::combine;
  spec.dtype = state_dtype;
  spec.out_dtype = out_dtype;
  spec.elementwise = elementwise;
  spec.dynamic_splits = dynamic_splits;
  spec.sink = sink;
  return spec;
}

int KernelSpec::threads() const {
  if (family == Family::combine) return kCombineThreads;
  if (family == Family::append) return 128;  // AppendConfig::kThreads
  // fwd with stages: the MMA warps plus a producer warpgroup (FwdConfig).
  return warps * 32 + (family == Family::fwd && stages > 0 ? 128 : 0);
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::i32: return "i32";
  }
  return "?";
}

size_t dtype_size(DType dtype) { return dtype == DType::f32 || dtype == DType::i32 ? 4 : 2; }

std::string KernelSpec::text() const {
  if (family == Family::combine) return combine_text(*this);
  if (family == Family::append) return append_text(*this);
  const bool decode = family == Family::decode;
  std::string out = fmt::format("{}.{}.d{}.br{}.bc{}.w{}", decode ? "decode" : "fwd", dtype_name(dtype), head_dim,
                                block_q, block_kv, warps);
  if (stages > 0) out += fmt::format(".s{}", stages);
  if (wgmma) out += ".wgmma";
  if (persistent) out += ".persistent";
  if (causal) out += ".causal";
  if (local) out += ".local";
  if (chunk) out += ".chunk";
  if (softcap) out += ".softcap";
  if (alibi) out += ".alibi";
  if (sink) out += ".sink";
  if (rope != RopeKind::none) {
    out += fmt::format(".rope_{}_r{}", rope == RopeKind::half ? "half" : "interleaved", rotary_dim);
  }
  if (rope_scaled) out += ".rope_scaled";
  if (rope_tables) out += rope_tables16 ? ".rope_tables16" : ".rope_tables";
  if (pack_gqa && !decode) out += ".packgqa";
  if (kvcache && !decode) out += ".kvcache";
  if (decode && !kvcache) out += ".dense";
  if (leftpad) out += ".leftpad";
  if (paged) out += page_rows != 0 ? fmt::format(".paged{}", page_rows) : std::string(".paged");
  if (split) out += ".split";
  if (dynamic_splits) out += ".dynsplit";
  if (padded) out += ".padded";
  if (varlen) out += ".varlen";
  if (unaligned_dim != 0) out += fmt::format(".unaligned_d{}", unaligned_dim);
  if (head_dim_v != 0) out += fmt::format(".dv{}", head_dim_v);
  return out;
}

KernelSpec KernelSpec::parse(std::string_view text) {
  if (text.substr(0, text.find('.')) == "combine") return parse_combine(text);
  if (text.substr(0, text.find('.')) == "append") return parse_append(text);
  auto fields = split_fields(text, '.');
  if (fields.size() < 6) {
    bad_spec(text, "expected family.dtype.dN.brN.bcN.wN[.causal], e.g. fwd.bf16.d128.br128.bc64.w4");
  }
  KernelSpec spec;
  if (fields[0] == "decode") {
    spec.family = Family::decode;
  } else if (fields[0] != "fwd") {
    bad_spec(text, fmt::format("unknown family '{}' (known: fwd, decode, combine, append)", fields[0]));
  }
  const bool decode = spec.family == Family::decode;
  if (fields[1] == "f16" || fields[1] == "fp16") {
    spec.dtype = DType::f16;
  } else if (fields[1] == "bf16") {
    spec.dtype = DType::bf16;
  } else {
    bad_spec(text, fmt::format("dtype '{}' is not f16 or bf16", fields[1]));
  }
  if (!parse_field(fields[2], "d", spec.head_dim)) bad_spec(text, "third field must be dN (head dim)");
  if (!parse_field(fields[3], "br", spec.block_q)) bad_spec(text, "fourth field must be brN (query block)");
  if (!parse_field(fields[4], "bc", spec.block_kv)) bad_spec(text, "fifth field must be bcN (key block)");
  if (!parse_field(fields[5], "w", spec.warps)) bad_spec(text, "sixth field must be wN (warps)");
  size_t first_flag = 6;
  if (decode) {
    if (fields.size() < 7 || !parse_field(fields[6], "s", spec.stages)) {
      bad_spec(text, "a decode spec's seventh field must be sN (pipeline stages)");
    }
    spec.pack_gqa = spec.kvcache = true;
    first_flag = 7;
  } else if (fields.size() > 6 && parse_field(fields[6], "s", spec.stages)) {
    first_flag = 7;  // a fwd spec with a producer warpgroup and its ring's stages
  }
  for (size_t i = first_flag; i < fields.size(); ++i) {
    if (parse_field(fields[i], "unaligned_d", spec.unaligned_dim)) {
      if (decode) bad_spec(text, "flag 'unaligned_dN' does not apply to a decode spec");
      continue;
    }
    if (spec.head_dim_v == 0 && parse_field(fields[i], "dv", spec.head_dim_v)) {
      if (decode) bad_spec(text, "flag 'dvN' does not apply to a decode spec");
      if (spec.head_dim_v == 0) bad_spec(text, "dv0: leave the flag out when V has head_dim");
      continue;
    }
    const bool half = parse_field(fields[i], "rope_half_r", spec.rotary_dim);
    if (half || parse_field(fields[i], "rope_interleaved_r", spec.rotary_dim)) {
      if (spec.rope != RopeKind::none) bad_spec(text, "more than one rope field");
      spec.rope = half ? RopeKind::half : RopeKind::interleaved;
      continue;
    }
    if (fields[i] == "dense") {
      // A decode spec over a dense call's K/V rather than a KV cache.
      if (!decode || !spec.kvcache) bad_spec(text, "flag 'dense' applies to a decode spec, once");
      spec.kvcache = false;
      continue;
    }
    if (parse_field(fields[i], "paged", spec.page_rows)) {
      // Pages of exactly N rows, shorter than a decode chunk.
      if (!decode || spec.paged) bad_spec(text, "flag 'pagedN' applies to a decode spec, once, in place of 'paged'");
      spec.paged = true;
      continue;
    }
    if (fields[i] == "rope_tables16" && !spec.rope_tables) {
      spec.rope_tables = spec.rope_tables16 = true;
      continue;
    }
    bool* flag = fields[i] == "wgmma"     ? &spec.wgmma
                 : fields[i] == "persistent" ? &spec.persistent
                 : fields[i] == "causal"  ? &spec.causal
                 : fields[i] == "local"   ? &spec.local
                 : fields[i] == "chunk"   ? &spec.chunk
                 : fields[i] == "softcap" ? &spec.softcap
                 : fields[i] == "alibi"   ? &spec.alibi
                 : fields[i] == "sink"    ? &spec.sink
                 : fields[i] == "padded"  ? &spec.padded
                 : fields[i] == "varlen"  ? &spec.varlen
                 : fields[i] == "packgqa" ? &spec.pack_gqa
                 : fields[i] == "rope_tables" ? &spec.rope_tables
                 : fields[i] == "rope_scaled" ? &spec.rope_scaled
                 : fields[i] == "kvcache" ? &spec.kvcache
                 : fields[i] == "leftpad" ? &spec.leftpad
                 : fields[i] == "paged"   ? &spec.paged
                 : fields[i] == "split"   ? &spec.split
                 : fields[i] == "dynsplit" ? &spec.dynamic_splits
                                          : nullptr;
    if (decode && (flag == &spec.pack_gqa || flag == &spec.kvcache || flag == &spec.wgmma || flag == &spec.persistent)) {
      bad_spec(text, fmt::format("flag '{}' does not apply to a decode spec (packgqa and kvcache are implied, "
                                 "dense replaces the cache by K/V tensors)", fields[i]));
    }
    if (flag == nullptr || *flag) {
      bad_spec(text, fmt::format("unknown or repeated flag '{}' (known: wgmma, persistent, causal, local, chunk, softcap, alibi, sink, rope_half_rN, "
                                 "rope_interleaved_rN, rope_scaled, rope_tables, rope_tables16, packgqa, kvcache, dense, leftpad, paged, pagedN, split, "
                                 "dynsplit, padded, varlen, unaligned_dN, dvN)",
                                 fields[i]));
    }
    *flag = true;
  }
  spec.validate();
  return spec;
}

void KernelSpec::validate() const {
  if (family == Family::combine) return validate_combine(*this);
  if (family == Family::append) return validate_append(*this);
  // The spec's text only on failure: every planned call validates its spec.
  auto fail = [this](ErrorCode code, const std::string& why) {
    const std::string name = text();
    throw Error(code, fmt::format("spec '{}': {}", name, why), name);
  };
  if (dtype != DType::f16 && dtype != DType::bf16) fail(ErrorCode::unsupported, "dtype must be f16 or bf16");
  if (head_dim != 32 && head_dim != 64 && head_dim != 96 && head_dim != 128 && head_dim != 192 && head_dim != 256) {
    fail(ErrorCode::unsupported, fmt::format("head_dim={} is not one of 32, 64, 96, 128, 192, 256", head_dim));
  }
  if (causal && local) fail(ErrorCode::invalid_argument, "causal and local are exclusive (a causal window is local)");
  if (chunk && !local) fail(ErrorCode::invalid_argument, "chunk needs local (chunks are a window cut per row)");
  if (rope == RopeKind::none) {
    if (rotary_dim != 0 || rope_tables) fail(ErrorCode::invalid_argument, "rotary_dim and rope_tables need a rope style");
  } else if (rotary_dim < 16 || rotary_dim > head_dim || rotary_dim % 16 != 0) {
    fail(ErrorCode::unsupported,
         fmt::format("rotary_dim={} must be a multiple of 16 between 16 and head_dim={}", rotary_dim, head_dim));
  }
  if (rope_tables16 && !rope_tables) fail(ErrorCode::invalid_argument, "rope_tables16 is a kind of rope_tables");
  if (rope_scaled && (rope == RopeKind::none || rope_tables)) {
    fail(ErrorCode::invalid_argument, "rope_scaled scales angles from the frequencies: it needs a rope style and no tables");
  }
  if (family == Family::decode) {
    if (unaligned_dim != 0) fail(ErrorCode::unsupported, "unaligned_dN does not apply to a decode spec");
    if (head_dim_v != 0) fail(ErrorCode::unsupported, "dvN does not apply to a decode spec");
    return validate_decode(fail);
  }
  if (dynamic_splits) fail(ErrorCode::unsupported, "dynsplit applies to decode specs only");
  if (page_rows != 0) fail(ErrorCode::unsupported, "pagedN applies to decode specs only");
  if (head_dim_v != 0) {
    // FwdConfig::kSplitDims: V's tiles and O narrower than Q's and K's.
    if ((head_dim_v != 32 && head_dim_v != 64 && head_dim_v != 96 && head_dim_v != 128 && head_dim_v != 192) ||
        head_dim_v >= head_dim) {
      fail(ErrorCode::unsupported,
           fmt::format("dv{} must be one of 32, 64, 96, 128, 192 and below head_dim={} (dv equal to head_dim is "
                       "written without the flag)", head_dim_v, head_dim));
    }
    if (kvcache || split || unaligned_dim != 0) {
      fail(ErrorCode::unsupported, "dvN (a value head dim of its own) does not combine with kvcache, split or "
                                   "unaligned_dN: dense or varlen K/V, unsplit");
    }
  }
  if (sink && split) {
    fail(ErrorCode::invalid_argument, "sink with split: split partials leave the sink to their combine (combine...sink)");
  }
  if (unaligned_dim != 0) {
    // FwdConfig::kUnaligned: element-wise copies in the 4-warp kernels.
    if (unaligned_dim < 1 || unaligned_dim % 8 == 0 || unaligned_dim >= head_dim) {
      fail(ErrorCode::invalid_argument,
           fmt::format("unaligned_d{} must be below head_dim={} and not a multiple of 8", unaligned_dim, head_dim));
    }
    if (kvcache || split || padded || persistent) {
      fail(ErrorCode::unsupported, "unaligned_dN does not combine with kvcache, split, padded or persistent");
    }
    // With a producer (sN) the rows go through its staging slots
    // (FwdConfig::kStagedRows): wgmma tiles of two warpgroups, 128 rows.
    if (stages != 0 && (!wgmma || warps != 8)) {
      fail(ErrorCode::unsupported, fmt::format("unaligned_d{} with s{} needs wgmma tiles of w=8 (not w={}{})",
                                               unaligned_dim, stages, warps, wgmma ? "" : ", mma.sync"));
    }
    if (rotary_dim > unaligned_dim) {
      fail(ErrorCode::unsupported,
           fmt::format("rotary_dim={} is above the caller's head dim {}", rotary_dim, unaligned_dim));
    }
  }
  if (stages != 0) {
    // The producer layout (templates/fwd_config.cuh, FwdConfig::kProducer):
    // two warpgroups of MMA warps (or three with wgmma), a producer
    // warpgroup, registers moved to the MMA warps (sm_90a); keys dense,
    // varlen or from a KV cache (contiguous or paged); split only with wgmma
    // (its consumer stores the partial results; the mma.sync one does not).
    if (stages < 2 || stages > 4) fail(ErrorCode::unsupported, fmt::format("s={} is not between 2 and 4", stages));
    if (warps != 8 && !(wgmma && warps == 12)) {
      fail(ErrorCode::unsupported,
           fmt::format("s={} (a producer warpgroup) needs w=8 (or w=12 with wgmma), not w={}", stages, warps));
    }
    if (split && !wgmma) fail(ErrorCode::unsupported, "s (a producer warpgroup) combines with split only with wgmma");
  }
  if (wgmma) {
    // FwdConfig::kWgmma: one 64-row wgmma tile per warpgroup of MMA warps,
    // with N = bc for S and N = head_dim for O (wgmma.cuh: N up to 128, so
    // wider heads take one instruction per 128 columns).
    if (stages == 0) fail(ErrorCode::unsupported, "wgmma needs the producer layout (sN)");
    if (block_q != 16 * warps) {
      fail(ErrorCode::unsupported, fmt::format("wgmma needs br = 16 × w (64 rows per warpgroup), not br={} w={}",
                                               block_q, warps));
    }
    // Above head_dim 128 the MMA warps hold 96-128 output accumulators, and
    // the producer is left 24-56 registers (FwdConfig::kProducerRegisters:
    // 40-56 where it rotates K or walks a paged cache's block table): the
    // persistent tile walk spills there (728-2136 bytes at head_dim 256 with
    // 24; ptxas, NVRTC 13.0; with more for the producer the MMA warps spill
    // instead), and a third MMA warpgroup's registers would not hold O.
    if (head_dim > 128 && (warps != 8 || persistent)) {
      fail(ErrorCode::unsupported,
           fmt::format("wgmma at head_dim {} (above 128) takes w=8 and no persistent", head_dim));
    }
    // A paged cache's tensor copies read whole pages or whole key blocks
    // (one box per page when pages are shorter than a block), so blocks
    // must tile pages (power-of-two sizes): 80- and 96-key blocks would
    // straddle them.
    if (paged && (block_kv & (block_kv - 1)) != 0) {
      fail(ErrorCode::unsupported,
           fmt::format("bc={} with paged: key blocks of a paged cache tile its pages (a power of two: bc=64 or 128)",
                       block_kv));
    }
    // Three MMA warpgroups (w=12) share the registers of 512 threads: 160
    // each beside a 32-register producer, which holds 96 accumulators (S and
    // O) and P without spills; 128 (head_dim 128 with bc=128) spill 316 bytes
    // (ptxas, NVRTC 13.0).
    if (warps == 12 && accumulator_registers() > 96) {
      fail(ErrorCode::unsupported,
           fmt::format("w=12 (three wgmma warpgroups) holds at most 96 accumulators per thread; bc={} at head_dim {} "
                       "needs {} (use bc=64)", block_kv, head_dim, accumulator_registers()));
    }
  }
  // FwdConfig::kPersistent: the wgmma consumer is the one that walks a
  // CTA's tiles through the ring (dense or varlen keys, no split).
  if (persistent && !wgmma) fail(ErrorCode::unsupported, "persistent needs wgmma");
  if (persistent && (kvcache || split)) fail(ErrorCode::unsupported, "persistent does not combine with kvcache or split");
  if (block_q != 64 && block_q != 128 && !(stages > 0 && block_q == 256) && !(wgmma && block_q == 192)) {
    fail(ErrorCode::unsupported,
         fmt::format("br={} is not one of 64, 128 (256 with a producer, sN; 192 with wgmma)", block_q));
  }
  // wgmma's S = Q Kᵀ is one instruction of N = bc (wgmma.cuh), so its
  // tiles also take 80 and 96 (the key blocks that fill shared memory above
  // head_dim 128) and 176 (long calls at 128, causal or without a mask).
  if (block_kv != 32 && block_kv != 64 && block_kv != 128 &&
      !(wgmma && (block_kv == 80 || block_kv == 96 || block_kv == 176))) {
    fail(ErrorCode::unsupported, fmt::format("bc={} is not one of 32, 64, 128 (80, 96, 176 with wgmma)", block_kv));
  }
  // 176 keys a block leave the MMA warps' 240 registers only beside a
  // 24-register producer that issues tensor copies and nothing else
  // (FwdConfig::kProducerRegisters): dense keys, not rotated, of a head dim
  // up to 128, in an ordinary grid of two warpgroups (two such stages and
  // a persistent kernel's second Q tile would not fit in shared memory).
  if (block_kv == 176 && (head_dim > 128 || warps != 8 || persistent || rope != RopeKind::none || varlen ||
                          kvcache || unaligned_dim != 0)) {
    fail(ErrorCode::unsupported, "bc=176 takes dense keys by tensor copies only: head_dim up to 128, w=8, no "
                                 "persistent, rope, varlen, kvcache or unaligned head dim");
  }
  if (warps != 4 && warps != 8 && !(wgmma && warps == 12)) {
    fail(ErrorCode::unsupported, fmt::format("w={} is not one of 4, 8 (12 with wgmma)", warps));
  }
  if (paged && !kvcache) fail(ErrorCode::invalid_argument, "paged needs kvcache");
  check_leftpad(fail);
  // Varlen over a KV cache: packed queries over a paged cache's sequences
  // (forward_varlen with a block table); its keys are stored rotated, and
  // varlen positions have no cache lengths to start from, so no RoPE.
  if (varlen) check_varlen_cache(fail);
  // Each warp owns whole 16-row MMA tiles of the query block.
  if (block_q % (16 * warps) != 0) {
    fail(ErrorCode::unsupported,
         fmt::format("br={} with w={} gives {} query rows per warp; each warp needs a multiple of 16",
                     block_q, warps, block_q / warps));
  }
  // 128 fp32 output + 64 score accumulators is the most that fits beside the
  // fragments and addresses in 255 registers (the H200 measurements of
  // docs/PERFORMANCE.md; beyond it ptxas spills hundreds of bytes).
  if (accumulator_registers() > 192) {
    fail(ErrorCode::unsupported,
         fmt::format("br={} w={} bc={} at head_dim {} needs {} fp32 accumulators per thread; at most 192 fit "
                     "(use fewer query rows per warp or a smaller bc)",
                     block_q, warps, block_kv, head_dim, accumulator_registers()));
  }
}

template <class Fail>
void KernelSpec::check_varlen_cache(const Fail& fail) const {
  if (kvcache && !paged) fail(ErrorCode::unsupported, "varlen over a KV cache needs paged (a block table)");
  if (kvcache && rope != RopeKind::none) {
    fail(ErrorCode::unsupported, "varlen over a paged cache takes no rope (the cache holds rotated keys)");
  }
}

template <class Fail>
void KernelSpec::check_leftpad(const Fail& fail) const {
  if (leftpad && (!kvcache || paged || varlen)) {
    fail(ErrorCode::invalid_argument, "leftpad needs kvcache, without paged or varlen (a contiguous cache's rows)");
  }
}

template <class Fail>
void KernelSpec::validate_decode(const Fail& fail) const {
  if (!pack_gqa) fail(ErrorCode::invalid_argument, "a decode spec packs GQA heads");
  if (dynamic_splits && !split) fail(ErrorCode::invalid_argument, "dynsplit chooses split counts: it needs split");
  // Only a dynamic split's tiles of one piece write final rows.
  if (sink && split && !dynamic_splits) {
    fail(ErrorCode::invalid_argument,
         "sink with split (not dynsplit): split partials leave the sink to their combine (combine...sink)");
  }
  // templates/fwd_decode.cuh: dense keys are read as they are.
  if (!kvcache && (paged || rope != RopeKind::none)) {
    fail(ErrorCode::unsupported, "dense (K/V tensors, not a cache) takes no paged and no rope: the decode kernel "
                                 "does not rotate keys");
  }
  if (varlen) check_varlen_cache(fail);
  check_leftpad(fail);
  if (block_q != 16 && block_q != 32) fail(ErrorCode::unsupported, fmt::format("br={} is not one of 16, 32", block_q));
  if (block_kv != 16 && block_kv != 32 && block_kv != 64) {
    fail(ErrorCode::unsupported, fmt::format("bc={} is not one of 16, 32, 64", block_kv));
  }
  if (warps != 1 && warps != 2 && warps != 4 && warps != 8) {
    fail(ErrorCode::unsupported, fmt::format("w={} is not one of 1, 2, 4, 8", warps));
  }
  if (stages < 2 || stages > 8) fail(ErrorCode::unsupported, fmt::format("s={} is not between 2 and 8", stages));
  if (page_rows != 0) {
    // DecodeConfig::kPageRows: a chunk spans whole pages; each 32-lane copy
    // pass (16 bytes a lane) stays in one page, or takes whole rows (row
    // bytes dividing 512: head dims 32, 64, 128, 256) from pages shorter
    // than a pass.
    if (!paged) fail(ErrorCode::invalid_argument, "pagedN needs a paged cache");
    if ((page_rows & (page_rows - 1)) != 0 || page_rows >= block_kv) {
      fail(ErrorCode::unsupported, fmt::format("paged{}: pages of N rows split a chunk of bc={} keys when N is a power "
                                               "of two below bc (pages of bc rows or more: paged)",
                                               page_rows, block_kv));
    }
    if (!decode_reads_pages(head_dim, page_rows)) {
      fail(ErrorCode::unsupported, fmt::format("paged{} at head_dim {}: a page's rows must be whole 512-byte copy "
                                               "passes (pages of at least {} rows)",
                                               page_rows, head_dim, 32 / std::gcd(32, head_dim / 8)));
    }
  }
  // The warps' states are merged in the pipeline's shared memory
  // (DecodeConfig): stages × keys per chunk must cover the rows.
  if (stages * block_kv < block_q) {
    fail(ErrorCode::unsupported, fmt::format("s={} × bc={} must be at least br={} (the merge reuses the pipeline)",
                                             stages, block_kv, block_q));
  }
  if (accumulator_registers() > 192) {
    fail(ErrorCode::unsupported, fmt::format("br={} bc={} at head_dim {} needs {} fp32 accumulators per thread; at "
                                             "most 192 fit", block_q, block_kv, head_dim, accumulator_registers()));
  }
}

bool KernelSpec::decode_reads_pages(int head_dim, int64_t page_rows) {
  const int row_copies = head_dim / 8;  // 16-byte copies a row
  return page_rows * row_copies % 32 == 0 || 32 % row_copies == 0;
}

int KernelSpec::accumulator_registers() const {
  // A decode warp holds every row of the tile.
  const int rows_per_warp_tiles = family == Family::decode ? block_q / 16 : block_q / warps / 16;
  return rows_per_warp_tiles * (value_dim() / 8 + block_kv / 8) * 4;
}

uint64_t KernelSpec::hash() const {
  const std::string t = text();
  return XXH3_64bits(t.data(), t.size());
}

size_t KernelSpec::rope_table_slot_bytes() const {
  // A block's cos rows then its sin rows, rotary_dim / 2 entries each, in
  // whole kilobytes (FwdConfig::kTableSlotBytes).
  return (static_cast<size_t>(2) * block_kv * (rotary_dim / 2) * rope_table_bytes() + 1023) / 1024 * 1024;
}

size_t KernelSpec::producer_ring_bytes() const {
  // The Q tile (two, persistent), the producer's ring of K and V stages, and
  // its mbarriers (five per stage; "Q landed" per Q tile, and "Q free" per Q
  // tile when persistent; FwdConfig::kBarrierOffset, Ring), then, where the
  // producer stores outputs, a 32-byte record per Q tile of the tile whose
  // output it stages (FwdConfig::kOutputRecords), and the order of a varlen
  // persistent kernel's sequences (sequence_order_bytes).
  const int row_elems = (head_dim + 63) / 64 * 64;
  const int value_row_elems = (value_dim() + 63) / 64 * 64;
  const int q_tiles = persistent ? 2 : 1;
  const size_t tiles =
      (static_cast<size_t>(q_tiles * block_q + stages * block_kv) * row_elems +
       static_cast<size_t>(stages) * block_kv * value_row_elems) * dtype_size(dtype);
  return tiles + static_cast<size_t>(5 * stages + (persistent ? 4 : 1)) * 8 + (producer_stores_output() ? 2 * 32 : 0) +
         sequence_order_bytes();
}

size_t KernelSpec::sequence_order_bytes() const {
  // FwdConfig::kSequenceOrderBytes: four ints per ordered sequence (128 of
  // them) and four more.
  return family == Family::fwd && persistent && varlen && block_q <= 128 && causal ? (4 * kOrderedSequences + 4) * 4
                                                                                   : 0;
}

int KernelSpec::rope_table_slots() const {
  if (family != Family::fwd || !wgmma || rope == RopeKind::none || kvcache || !rope_tables || head_dim <= 64 ||
      head_dim > 128 || unaligned_dim != 0) {
    return 0;
  }
  // FwdConfig::table_slots_that_fit: the ring, then the slots with a
  // barrier each, within sm_90's 227 KB.
  constexpr size_t kMaxSmemBytes = 232448;
  for (int slots = stages; slots > 0; --slots) {
    if (producer_ring_bytes() + slots * (rope_table_slot_bytes() + 8) <= kMaxSmemBytes) return slots;
  }
  return 0;
}

size_t KernelSpec::smem_bytes() const {
  if (family == Family::combine) return 0;  // static shared memory only (combine.cuh)
  if (family == Family::append) return 0;
  // Q tile plus one K tile and one V tile, 16-bit elements, rows rounded up
  // to whole 64-element swizzle groups (FwdConfig::kRowElems).
  const int row_elems = (head_dim + 63) / 64 * 64;
  if (family == Family::decode) {
    // The Q tile and each warp's stages of a K and a V chunk (DecodeConfig).
    return static_cast<size_t>(block_q + warps * stages * 2 * block_kv) * row_elems * dtype_size(dtype);
  }
  if (stages > 0) {
    // The producer's ring (producer_ring_bytes; FwdConfig::kSmemBytes). The
    // rendered entry asserts that the kernel's layout has this size.
    if (unaligned_dim != 0) {
      // Unaligned rows: two more barriers per staging slot and "Q staged",
      // then (at a 16-byte boundary) three slots of a K and a V block's
      // staging rows, a 16-byte block more than the row's chunks each
      // (FwdConfig::kStagedRows).
      constexpr int kStagingSlots = 3;
      const size_t barriers = static_cast<size_t>(2 * kStagingSlots + 1) * 8;
      const size_t staging_row = static_cast<size_t>((unaligned_dim + 7) / 8 + 1) * 16;
      return (producer_ring_bytes() + barriers + 15) / 16 * 16 +
             kStagingSlots * 2 * static_cast<size_t>(block_kv) * staging_row;
    }
    // Staged RoPE tables: the slots after the tiles, a barrier each.
    return producer_ring_bytes() + rope_table_slots() * (rope_table_slot_bytes() + 8);
  }
  const int value_row_elems = (value_dim() + 63) / 64 * 64;
  return (static_cast<size_t>(block_q + block_kv) * row_elems + static_cast<size_t>(block_kv) * value_row_elems) *
         dtype_size(dtype);
}

uint64_t KernelSpec::packed() const {
  if (family == Family::combine) return combine_packed(*this);
  if (family == Family::append) return append_packed(*this);
  uint64_t key = static_cast<uint64_t>(family);
  key = key << 2 | static_cast<uint64_t>(dtype);  // four DTypes
  // fwd and decode fields take bits 0-59 and the family bits 60-61, where
  // combine and append keys put theirs (01, 10): every family's keys differ
  // in those bits.
  key = key << 6 | static_cast<uint64_t>(head_dim / 8);    // multiples of 8 up to 256
  key = key << 5 | static_cast<uint64_t>(block_q / 16);     // multiples of 16 up to 256
  key = key << 4 | static_cast<uint64_t>(block_kv / 16);    // 16 up to 176
  // unaligned_dim (fwd, below 256) or page_rows (decode, below 64): the
  // family bits tell them apart.
  key = key << 8 | static_cast<uint64_t>(family == Family::decode ? page_rows : unaligned_dim);
  key = key << 4 | static_cast<uint64_t>(warps);
  key = key << 4 | static_cast<uint64_t>(stages);
  key = key << 1 | static_cast<uint64_t>(wgmma);
  key = key << 1 | static_cast<uint64_t>(persistent);
  // causal and local are exclusive, and chunk needs local: the pair
  // (causal, local) = (1, 1) marks a chunked window, so chunk takes no bit.
  key = key << 1 | static_cast<uint64_t>(causal || chunk);
  key = key << 1 | static_cast<uint64_t>(local);
  key = key << 1 | static_cast<uint64_t>(softcap);
  key = key << 1 | static_cast<uint64_t>(alibi);
  key = key << 1 | static_cast<uint64_t>(sink);
  key = key << 1 | static_cast<uint64_t>(padded);
  key = key << 1 | static_cast<uint64_t>(varlen);
  key = key << 1 | static_cast<uint64_t>(pack_gqa);
  key = key << 2 | static_cast<uint64_t>(rope);
  key = key << 5 | static_cast<uint64_t>(rotary_dim / 16);
  // rope_scaled excludes tables, so (rope_tables, rope_tables16) = (0, 1),
  // which tables never set, marks it: no bit of its own.
  key = key << 1 | static_cast<uint64_t>(rope_tables);
  key = key << 1 | static_cast<uint64_t>(rope_tables16 || rope_scaled);
  key = key << 1 | static_cast<uint64_t>(kvcache);
  key = key << 1 | static_cast<uint64_t>(leftpad);
  key = key << 1 | static_cast<uint64_t>(paged);
  key = key << 1 | static_cast<uint64_t>(split);
  key = key << 1 | static_cast<uint64_t>(dynamic_splits);
  key = key << 3 | static_cast<uint64_t>(head_dim_v / 32);  // 0 (head_dim), 32 .. 192
  return key;
}

std::string Arch::text() const { return fmt::format("sm_{}{}{}", major, minor, arch_specific ? "a" : ""); }

Arch Arch::parse(std::string_view text) {
  auto fail = [&] {
    throw Error(ErrorCode::invalid_argument,
                fmt::format("arch '{}': expected sm_XY or sm_XYa with compute capability >= 8.0 "
                            "(e.g. sm_80, sm_86, sm_89, sm_90a)", text));
  };
  if (text.substr(0, 3) != "sm_" || text.size() < 5) fail();
  std::string_view digits = text.substr(3);
  Arch arch;
  if (digits.back() == 'a') {
    arch.arch_specific = true;
    digits.remove_suffix(1);
  }
  int number = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), number);
  if (ec != std::errc() || ptr != digits.data() + digits.size() || number < 80) fail();
  arch.major = number / 10;
  arch.minor = number % 10;
  return arch;
}

Arch Arch::for_device(int major, int minor) {
  // 9.0 gets the arch-specific target so Hopper-only instructions are usable.
  return Arch{major, minor, major == 9 && minor == 0};
}

}  // namespace jitattn::detail
