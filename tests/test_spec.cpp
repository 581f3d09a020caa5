#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "spec.hpp"

using namespace jitattn;
using namespace jitattn::detail;

TEST_SUITE("spec") {

TEST_CASE("spec text round-trips for every supported field combination") {
  int valid = 0, refused = 0;
  for (DType dtype : {DType::f16, DType::bf16})
    for (int head_dim : {32, 64, 96, 128, 192, 256})
      for (int block_q : {64, 128})
        for (int block_kv : {32, 64, 128})
          for (int warps : {4, 8})
            for (int mask = 0; mask < 3; ++mask)
              for (int features = 0; features < 8; ++features) {
                KernelSpec spec{Family::fwd, dtype, head_dim, block_q, block_kv, warps, mask == 1, mask == 2,
                                (features & 1) != 0, (features & 2) != 0, (features & 4) != 0};
                if (block_q % (16 * warps) != 0 || spec.accumulator_registers() > 192) {
                  CHECK_THROWS_AS(spec.validate(), Error);
                  ++refused;
                  continue;
                }
                const KernelSpec parsed = KernelSpec::parse(spec.text());
                CHECK(parsed == spec);
                CHECK(parsed.text() == spec.text());
                ++valid;
              }
  CHECK(valid > 0);
  CHECK(refused > 0);
}

TEST_CASE("spec text is the documented canonical form") {
  KernelSpec spec{Family::fwd, DType::bf16, 128, 128, 64, 4, true};
  CHECK(spec.text() == "fwd.bf16.d128.br128.bc64.w4.causal");
  KernelSpec all{Family::fwd, DType::f16, 96, 64, 32, 4, false, true, true, true, true};
  CHECK(all.text() == "fwd.f16.d96.br64.bc32.w4.local.softcap.alibi.padded");
  spec.causal = false;
  spec.dtype = DType::f16;
  CHECK(spec.text() == "fwd.f16.d128.br128.bc64.w4");
}

TEST_CASE("RoPE and packed-GQA fields round-trip, pack distinctly and are validated") {
  std::vector<uint64_t> keys;
  for (RopeKind rope : {RopeKind::none, RopeKind::half, RopeKind::interleaved})
    for (int rotary_dim : {16, 64, 128})
      for (int tables : {0, 1, 2, 3})  // none, f32, dtype, none with angles scaled (YaRN)
        for (bool pack : {false, true}) {
          KernelSpec spec{Family::fwd, DType::bf16, 128, 128, 64, 4};
          spec.rope = rope;
          spec.rotary_dim = rope == RopeKind::none ? 0 : rotary_dim;
          spec.rope_tables = rope != RopeKind::none && (tables == 1 || tables == 2);
          spec.rope_tables16 = rope != RopeKind::none && tables == 2;
          spec.rope_scaled = rope != RopeKind::none && tables == 3;
          spec.pack_gqa = pack;
          const KernelSpec parsed = KernelSpec::parse(spec.text());
          CHECK(parsed == spec);
          CHECK(parsed.text() == spec.text());
          keys.push_back(spec.packed());
        }
  std::sort(keys.begin(), keys.end());
  CHECK(std::unique(keys.begin(), keys.end()) - keys.begin() == 1 * 2 + 2 * 3 * 4 * 2);
  // Scaled angles share rope_tables16's bit (they exclude tables), and come
  // from the frequencies only.
  const KernelSpec scaled = KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.rope_half_r64.rope_scaled.packgqa");
  CHECK((scaled.rope_scaled && !scaled.rope_tables && !scaled.rope_tables16));
  CHECK(scaled.text() == "fwd.bf16.d128.br128.bc64.w4.rope_half_r64.rope_scaled.packgqa");
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.rope_half_r64.rope_scaled.rope_tables"),
                       doctest::Contains("rope_scaled scales angles from the frequencies"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.rope_scaled"),
                       doctest::Contains("it needs a rope style and no tables"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s2.rope_scaled"),
                       doctest::Contains("it needs a rope style and no tables"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("append.bf16.rope_half_r64.rope_scaled.rope_tables16"),
                       doctest::Contains("rope_scaled scales angles from the frequencies"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("append.bf16.rope_scaled"), doctest::Contains("needs a rope style"), Error);
  CHECK(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.causal.rope_half_r64.rope_tables.packgqa").text() ==
        "fwd.bf16.d128.br128.bc64.w4.causal.rope_half_r64.rope_tables.packgqa");
  const KernelSpec tables16 = KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.rope_half_r64.rope_tables16");
  CHECK((tables16.rope_tables && tables16.rope_tables16 && tables16.rope_table_bytes() == 2));
  CHECK(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.rope_half_r64.rope_tables").rope_table_bytes() == 4);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.rope_half_r64.rope_tables16.rope_tables"),
                       doctest::Contains("repeated flag 'rope_tables'"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.rope_half_r64.rope_tables.rope_tables16"),
                       doctest::Contains("'rope_tables16'"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br128.bc64.w4.rope_half_r128"),
                       doctest::Contains("rotary_dim=128 must be a multiple of 16 between 16 and head_dim=64"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br128.bc64.w4.rope_half_r24"), doctest::Contains("rotary_dim=24"),
                       Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br128.bc64.w4.rope_tables"),
                       doctest::Contains("need a rope style"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br128.bc64.w4.rope_half_r32.rope_interleaved_r32"),
                       doctest::Contains("more than one rope field"), Error);
}

TEST_CASE("KV-cache, paged and split fields, and the append family, round-trip and pack distinctly") {
  const char* texts[] = {"fwd.bf16.d128.br64.bc64.w4.packgqa.kvcache",
                         "fwd.bf16.d128.br64.bc64.w4.packgqa.kvcache.split",
                         "fwd.bf16.d128.br64.bc64.w4.causal.rope_half_r64.packgqa.kvcache.paged.split",
                         "decode.bf16.d128.br16.bc16.w4.s4",
                         "decode.bf16.d128.br16.bc16.w4.s3",
                         "decode.bf16.d128.br16.bc32.w4.s4",
                         "decode.f16.d64.br32.bc16.w2.s8.causal.softcap.alibi.rope_interleaved_r64.rope_tables.paged.split",
                         "decode.bf16.d256.br16.bc16.w8.s2.local.padded",
                         "decode.bf16.d128.br16.bc16.w4.s4.dense",
                         "decode.f16.d64.br32.bc64.w4.s2.causal.softcap.alibi.dense.split",
                         "decode.bf16.d128.br16.bc32.w4.s2.dense.split.varlen",
                         "decode.bf16.d128.br16.bc32.w4.s2.paged.varlen",
                         "decode.bf16.d128.br16.bc32.w4.s2.paged16",
                         "decode.bf16.d128.br16.bc32.w4.s2.paged8",
                         "decode.bf16.d128.br16.bc32.w4.s2.paged1",
                         "decode.bf16.d64.br16.bc64.w4.s2.paged2.split",
                         "decode.bf16.d64.br16.bc64.w4.s2.paged32.split.dynsplit",
                         "decode.bf16.d64.br16.bc64.w4.s2.paged16.varlen",
                         "decode.bf16.d64.br16.bc64.w4.s2.paged",
                         "fwd.bf16.d64.br64.bc64.w4.split.varlen",
                         "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.kvcache.paged.split.varlen",
                         "append.bf16",
                         "append.f16.rope_interleaved_r64.rope_tables.paged",
                         "append.f16.rope_interleaved_r64.rope_tables16.paged",
                         "decode.bf16.d128.br16.bc16.w4.s2.rope_half_r128.rope_tables16",
                         "append.bf16.rope_half_r128",
                         "append.bf16.rope_half_r128.rope_scaled",
                         "append.bf16.rope_half_r128.rope_scaled.paged",
                         "decode.bf16.d128.br16.bc16.w4.s2.rope_half_r128.rope_scaled",
                         "fwd.bf16.d128.br64.bc64.w4.causal.rope_half_r64.rope_scaled.packgqa.kvcache.paged.split",
                         "combine.f32.bf16"};
  std::vector<uint64_t> keys;
  for (const char* text : texts) {
    const KernelSpec spec = KernelSpec::parse(text);
    CHECK(spec.text() == text);
    keys.push_back(spec.packed());
  }
  std::sort(keys.begin(), keys.end());
  CHECK(std::adjacent_find(keys.begin(), keys.end()) == keys.end());
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br64.bc64.w4.paged"), doctest::Contains("paged needs kvcache"), Error);
  // Pages shorter than a decode chunk (.pagedN): a power of two below the
  // chunk's keys, of whole copy passes (at least 8 rows) unless the head
  // dim's rows divide a pass; decode specs only, in place of .paged.
  const KernelSpec short_pages = KernelSpec::parse("decode.bf16.d128.br16.bc32.w4.s2.paged16");
  CHECK(short_pages.paged);
  CHECK(short_pages.page_rows == 16);
  CHECK(short_pages.smem_bytes() == KernelSpec::parse("decode.bf16.d128.br16.bc32.w4.s2.paged").smem_bytes());
  for (const auto& [text, why] :
       {std::pair{"decode.bf16.d128.br16.bc32.w4.s2.paged32", "paged32: pages of N rows split a chunk of bc=32"},
        std::pair{"decode.bf16.d96.br16.bc32.w4.s2.paged4", "pages of at least 8 rows"},
        std::pair{"decode.bf16.d128.br16.bc32.w4.s2.paged12", "a power of two"},
        std::pair{"decode.bf16.d128.br16.bc32.w4.s2.paged.paged16", "applies to a decode spec, once"},
        std::pair{"decode.bf16.d128.br16.bc32.w4.s2.paged16.paged", "unknown or repeated flag 'paged'"},
        std::pair{"fwd.bf16.d128.br128.bc128.w8.s2.wgmma.kvcache.paged16", "applies to a decode spec"}}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text), doctest::Contains(why), Error);
  }
  KernelSpec fwd_short_pages = KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.kvcache.paged");
  fwd_short_pages.page_rows = 16;
  CHECK_THROWS_WITH_AS(fwd_short_pages.validate(), doctest::Contains("pagedN applies to decode specs only"), Error);
  // Varlen over a KV cache: packed queries over a paged one's pages, whose
  // keys are stored as they are (no RoPE).
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br64.bc64.w4.kvcache.varlen"),
                       doctest::Contains("varlen over a KV cache needs paged"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br64.bc64.w4.rope_half_r128.kvcache.paged.varlen"),
                       doctest::Contains("varlen over a paged cache takes no rope"), Error);
  const KernelSpec decode = KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4");
  CHECK(decode.family == Family::decode);
  CHECK(decode.pack_gqa);
  CHECK(decode.kvcache);
  CHECK(decode.smem_bytes() == (16 + 4 * 4 * 2 * 16) * 128 * 2);
  CHECK(decode.threads() == 128);
  CHECK(decode.packed() != KernelSpec::parse("fwd.bf16.d128.br64.bc64.w4.packgqa.kvcache").packed());
  // dynsplit: split counts chosen on the device, only beside split.
  const KernelSpec dynamic = KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.paged.split.dynsplit");
  CHECK(dynamic.dynamic_splits);
  CHECK(dynamic.text() == "decode.bf16.d128.br16.bc16.w4.s4.paged.split.dynsplit");
  CHECK(dynamic.packed() != KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.paged.split").packed());
  CHECK(dynamic.hash() != KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.paged.split").hash());
  // leftpad: a contiguous cache's rows from cache_leftpad, after kvcache in the text.
  const KernelSpec padded_rows = KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.leftpad.split");
  CHECK(padded_rows.leftpad);
  CHECK(padded_rows.text() == "decode.bf16.d128.br16.bc16.w4.s4.leftpad.split");
  CHECK(padded_rows.packed() != KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.split").packed());
  CHECK(KernelSpec::parse("fwd.bf16.d128.br64.bc64.w4.packgqa.kvcache.leftpad").text() ==
        "fwd.bf16.d128.br64.bc64.w4.packgqa.kvcache.leftpad");
  for (const char* text : {"decode.bf16.d128.br16.bc16.w4.s4.leftpad.paged", "decode.bf16.d128.br16.bc16.w4.s4.dense.leftpad",
                           "fwd.bf16.d128.br64.bc64.w4.leftpad", "decode.bf16.d128.br16.bc16.w4.s4.leftpad.paged.varlen"}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text), doctest::Contains("leftpad needs kvcache, without paged or varlen"),
                         Error);
  }
  // chunk: a window cut to the row's chunk (attention_chunk), after local in
  // the text. It needs local, and packs apart from local and causal.
  const KernelSpec chunked = KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.local.chunk.varlen");
  CHECK(chunked.chunk);
  CHECK(chunked.local);
  CHECK(chunked.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.local.chunk.varlen");
  CHECK(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.local.chunk.paged.split").text() ==
        "decode.bf16.d128.br16.bc16.w4.s4.local.chunk.paged.split");
  {
    std::vector<uint64_t> mask_keys;
    for (const char* mask : {"", ".causal", ".local", ".local.chunk"}) {
      mask_keys.push_back(KernelSpec::parse(fmt::format("fwd.bf16.d128.br128.bc64.w4{}", mask)).packed());
      mask_keys.push_back(KernelSpec::parse(fmt::format("decode.bf16.d128.br16.bc16.w4.s4{}.split", mask)).packed());
    }
    std::sort(mask_keys.begin(), mask_keys.end());
    CHECK(std::unique(mask_keys.begin(), mask_keys.end()) == mask_keys.end());
  }
  for (const char* text : {"fwd.bf16.d128.br128.bc64.w4.chunk", "fwd.bf16.d128.br128.bc64.w4.causal.chunk",
                           "decode.bf16.d128.br16.bc16.w4.s4.chunk"}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text), doctest::Contains("chunk needs local"), Error);
  }
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.local.chunk.chunk"),
                       doctest::Contains("unknown or repeated flag 'chunk'"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.dynsplit"),
                       doctest::Contains("dynsplit chooses split counts: it needs split"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br64.bc64.w4.packgqa.kvcache.split.dynsplit"),
                       doctest::Contains("dynsplit"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4"), doctest::Contains("seventh field must be sN"),
                       Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.kvcache"),
                       doctest::Contains("flag 'kvcache' does not apply to a decode spec"), Error);
  // dense: a dense call's K/V instead of a cache, read as they are.
  const KernelSpec dense = KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.dense");
  CHECK_FALSE(dense.kvcache);
  CHECK(dense.pack_gqa);
  CHECK(dense.packed() != decode.packed());
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.rope_half_r128.dense"),
                       doctest::Contains("dense (K/V tensors, not a cache) takes no paged and no rope"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.dense.paged"),
                       doctest::Contains("takes no paged"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.dense.dense"),
                       doctest::Contains("flag 'dense' applies to a decode spec, once"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br64.bc64.w4.dense"),
                       doctest::Contains("flag 'dense' applies to a decode spec"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.varlen"),
                       doctest::Contains("varlen over a KV cache needs paged"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.rope_half_r128.paged.varlen"),
                       doctest::Contains("varlen over a paged cache takes no rope"), Error);
  CHECK(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s4.dense.varlen").packed() != dense.packed());
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br64.bc16.w4.s4"), doctest::Contains("br=64 is not one of 16, 32"),
                       Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc128.w4.s4"), doctest::Contains("bc=128"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w3.s4"), doctest::Contains("w=3"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s9"), doctest::Contains("s=9"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br32.bc16.w4.s1"), doctest::Contains("s=1"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d256.br32.bc16.w4.s2"), doctest::Contains("272 fp32 accumulators"),
                       Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("append.f32"), doctest::Contains("dtype 'f32' is not f16 or bf16"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("append.bf16.paged.paged"), doctest::Contains("unknown or repeated field 'paged'"),
                       Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("append.bf16.rope_half_r24"), doctest::Contains("rotary_dim=24"), Error);
}

TEST_CASE("producer-layout fwd specs (sN): text, threads, shared memory, packing and rules") {
  const KernelSpec spec = KernelSpec::parse("fwd.bf16.d64.br256.bc64.w8.s3.causal.rope_half_r64");
  CHECK(spec.stages == 3);
  CHECK(spec.block_q == 256);
  CHECK(spec.text() == "fwd.bf16.d64.br256.bc64.w8.s3.causal.rope_half_r64");
  CHECK(spec.threads() == 8 * 32 + 128);  // MMA warps plus the producer warpgroup
  // Q, three stages of K and V, and 5 · 3 + 1 mbarriers (Ring).
  CHECK(spec.smem_bytes() == (256 + 3 * 2 * 64) * 64 * 2 + 16 * 8);
  KernelSpec two = spec;
  two.stages = 2;
  CHECK(two.packed() != spec.packed());
  KernelSpec plain = spec;
  plain.stages = 0;
  plain.block_q = 128;
  plain.warps = 4;
  CHECK(plain.threads() == 128);
  CHECK(plain.smem_bytes() == (128 + 2 * 64) * 64 * 2);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br256.bc64.w4.s3"), doctest::Contains("needs w=8"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br256.bc64.w8.s5"), doctest::Contains("between 2 and 4"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br256.bc64.w8"), doctest::Contains("br=256"), Error);
  CHECK(KernelSpec::parse("fwd.bf16.d64.br256.bc64.w8.s3.varlen").varlen);  // the producer reads varlen sequences too
  // A KV cache (chunked prefill), contiguous or paged, split only on wgmma
  // tiles (the mma.sync consumer stores no partial results); and not
  // persistent.
  CHECK(KernelSpec::parse("fwd.bf16.d64.br128.bc64.w8.s2.packgqa.kvcache").kvcache);
  CHECK(KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.kvcache.paged").paged);
  CHECK(KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.packgqa.kvcache.paged.split").split);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br128.bc64.w8.s2.kvcache.split"),
                       doctest::Contains("combines with split only with wgmma"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.kvcache"),
                       doctest::Contains("persistent does not combine with kvcache or split"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.split"),
                       doctest::Contains("persistent does not combine with kvcache or split"), Error);
}

TEST_CASE("wgmma fwd specs: text, packing and rules") {
  const KernelSpec spec = KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128");
  CHECK(spec.wgmma);
  CHECK(spec.stages == 2);
  CHECK(spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128");
  CHECK(spec.threads() == 8 * 32 + 128);
  // Q, two stages of K and V (the panel layout takes the same bytes), 11 mbarriers.
  CHECK(spec.smem_bytes() == (128 + 2 * 2 * 128) * 128 * 2 + 11 * 8);
  KernelSpec mma_sync = spec;
  mma_sync.wgmma = false;
  CHECK(mma_sync.packed() != spec.packed());
  CHECK(mma_sync.text() == "fwd.bf16.d128.br128.bc128.w8.s2.causal.rope_half_r128");
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.wgmma"),
                       doctest::Contains("wgmma needs the producer layout"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br256.bc64.w8.s2.wgmma"), doctest::Contains("br = 16 × w"),
                       Error);
  // Above head dim 128: two MMA warpgroups, no persistent grid.
  // 64 KB of Q and two 64 KB stages at 256. K and V arrive by tensor copies,
  // with RoPE too (the producer rotates K once it has landed).
  const KernelSpec wide = KernelSpec::parse("fwd.bf16.d256.br128.bc64.w8.s2.wgmma.causal.packgqa.varlen");
  CHECK(wide.smem_bytes() == (128 + 2 * 2 * 64) * 256 * 2 + 11 * 8);
  CHECK(wide.tensor_copies());
  CHECK(KernelSpec::parse("fwd.bf16.d256.br128.bc64.w8.s2.wgmma.rope_half_r64").tensor_copies());
  CHECK(KernelSpec::parse("fwd.bf16.d192.br128.bc96.w8.s2.wgmma.causal.rope_interleaved_r192.rope_tables")
            .tensor_copies());
  CHECK_FALSE(KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.rope_half_r128").tensor_copies());
  for (const char* text : {"fwd.bf16.d256.br128.bc64.w8.s2.wgmma.persistent",
                           "fwd.bf16.d256.br128.bc64.w8.s2.wgmma.persistent.rope_half_r64",
                           "fwd.bf16.d192.br192.bc32.w12.s2.wgmma"}) {
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text), doctest::Contains("(above 128) takes w=8 and no persistent"), Error);
  }
  // KV caches too (chunked prefill), by tensor copies; a paged cache's key
  // blocks tile its pages, so 80 and 96 keys are refused there.
  CHECK(KernelSpec::parse("fwd.bf16.d192.br128.bc64.w8.s3.wgmma.kvcache.paged").tensor_copies());
  CHECK(KernelSpec::parse("fwd.bf16.d256.br128.bc80.w8.s2.wgmma.causal.rope_half_r256.kvcache").tensor_copies());
  for (const char* text : {"fwd.bf16.d256.br128.bc80.w8.s2.wgmma.kvcache.paged",
                           "fwd.bf16.d192.br128.bc96.w8.s2.wgmma.causal.packgqa.kvcache.paged"}) {
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text), doctest::Contains("key blocks of a paged cache tile its pages"),
                         Error);
  }
  // 176-key blocks: dense keys by tensor copies beside a producer that does
  // nothing else, in an ordinary grid of two warpgroups at head dims up to 128.
  CHECK(KernelSpec::parse("fwd.bf16.d128.br128.bc176.w8.s2.wgmma.softcap.packgqa.split").tensor_copies());
  CHECK(KernelSpec::parse("fwd.f16.d64.br128.bc176.w8.s2.wgmma.causal.padded").block_kv == 176);
  for (const char* text : {"fwd.bf16.d128.br128.bc176.w8.s2.wgmma.persistent",
                           "fwd.bf16.d128.br128.bc176.w8.s2.wgmma.rope_half_r128",
                           "fwd.bf16.d128.br128.bc176.w8.s2.wgmma.varlen",
                           "fwd.bf16.d128.br128.bc176.w8.s2.wgmma.kvcache",
                           "fwd.bf16.d192.br128.bc176.w8.s2.wgmma"}) {
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text), doctest::Contains("bc=176 takes dense keys by tensor copies only"),
                         Error);
  }
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc176.w8.s2"), doctest::Contains("bc=176 is not one of"),
                       Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.wgmma"),
                       doctest::Contains("repeated flag 'wgmma'"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s3.wgmma"),
                       doctest::Contains("does not apply to a decode spec"), Error);
}

TEST_CASE("RoPE tables staged beside K: as many slots as fit, up to the stages, at head dims 65-128") {
  // Two stages at 128: Q, the ring, and two 32 KB slots (cos and sin of 128
  // rows of 64 16-bit entries), one barrier each: 225 KB.
  const KernelSpec two = KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128.rope_tables16");
  CHECK(two.rope_table_slot_bytes() == 2 * 128 * 64 * 2);
  CHECK(two.rope_table_slots() == 2);
  CHECK(two.smem_bytes() == (128 + 2 * 2 * 128) * 128 * 2 + 2 * 32768 + (11 + 2) * 8);
  CHECK(two.smem_bytes() <= 227 * 1024);
  // Persistent: the second Q tile leaves room for one slot.
  KernelSpec persistent = two;
  persistent.persistent = true;
  CHECK(persistent.rope_table_slots() == 1);
  CHECK(persistent.smem_bytes() == (2 * 128 + 2 * 2 * 128) * 128 * 2 + 32768 + (14 + 1) * 8);
  // f32 entries take twice the bytes: one slot beside two stages, none
  // beside a second Q tile (partial rotation: one).
  KernelSpec f32 = two;
  f32.rope_tables16 = false;
  CHECK(f32.rope_table_slot_bytes() == 2 * 128 * 64 * 4);
  CHECK(f32.rope_table_slots() == 1);
  CHECK(f32.smem_bytes() == (128 + 2 * 2 * 128) * 128 * 2 + 65536 + (11 + 1) * 8);
  f32.persistent = true;
  CHECK(f32.rope_table_slots() == 0);
  CHECK(f32.smem_bytes() == (2 * 128 + 2 * 2 * 128) * 128 * 2 + 14 * 8);
  f32.rotary_dim = 64;
  CHECK(f32.rope_table_slots() == 1);
  // Three stages at 128 leave none; partial rotation halves the slot.
  CHECK(KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s3.wgmma.rope_half_r128.rope_tables16").rope_table_slots() == 0);
  const KernelSpec partial = KernelSpec::parse("fwd.f16.d96.br128.bc64.w8.s3.wgmma.rope_interleaved_r64.rope_tables16");
  CHECK(partial.rope_table_slot_bytes() == 2 * 64 * 32 * 2);
  CHECK(partial.rope_table_slots() == 3);
  // Not staged: angles from theta, head dims up to 64, mma.sync tiles, KV
  // caches (K is not rotated).
  for (const char* text : {"fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128",
                           "fwd.bf16.d64.br128.bc128.w8.s2.wgmma.causal.rope_half_r64.rope_tables16",
                           "fwd.bf16.d128.br128.bc64.w4.causal.rope_half_r128.rope_tables16",
                           "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.causal.rope_half_r128.rope_tables16.kvcache"}) {
    CAPTURE(text);
    CHECK(KernelSpec::parse(text).rope_table_slots() == 0);
  }
}

TEST_CASE("persistent wgmma specs: text, packing, two Q tiles in shared memory, and rules") {
  const KernelSpec spec = KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.causal.rope_half_r128.varlen");
  CHECK(spec.persistent);
  CHECK(spec.wgmma);
  CHECK(spec.varlen);
  CHECK(spec.text() == "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.causal.rope_half_r128.varlen");
  CHECK(spec.threads() == 8 * 32 + 128);
  // Two Q tiles, two stages of K and V, 10 stage mbarriers and 4 for the Q
  // tiles (landed and free, each), then (varlen) the order of up to 128
  // sequences: four ints each and four more.
  CHECK(spec.sequence_order_bytes() == 2064);
  CHECK(spec.smem_bytes() == (2 * 128 + 2 * 2 * 128) * 128 * 2 + 14 * 8 + 2064);
  CHECK_FALSE(spec.producer_stores_output());  // its producer rotates K
  // Without RoPE the producer stores the outputs: a 32-byte record for
  // each Q tile follows the barriers.
  KernelSpec plain = spec;
  plain.rope = RopeKind::none;
  plain.rotary_dim = 0;
  CHECK(plain.producer_stores_output());
  CHECK(plain.smem_bytes() == (2 * 128 + 2 * 2 * 128) * 128 * 2 + 14 * 8 + 2 * 32 + 2064);
  plain.varlen = false;
  CHECK(plain.sequence_order_bytes() == 0);
  CHECK(plain.smem_bytes() == (2 * 128 + 2 * 2 * 128) * 128 * 2 + 14 * 8 + 2 * 32);
  plain.varlen = true;
  plain.persistent = false;
  CHECK(plain.sequence_order_bytes() == 0);
  CHECK_FALSE(plain.producer_stores_output());
  CHECK(plain.smem_bytes() == (128 + 2 * 2 * 128) * 128 * 2 + 11 * 8);
  KernelSpec ordinary = spec;
  ordinary.persistent = false;
  CHECK(ordinary.packed() != spec.packed());
  CHECK(ordinary.smem_bytes() == (128 + 2 * 2 * 128) * 128 * 2 + 11 * 8);
  CHECK(KernelSpec::parse(ordinary.text()) == ordinary);
  CHECK(ordinary.rope_table_slots() == 0);  // angles from theta: no tables to stage
  // 192-row tiles of three warpgroups at head dim 64: 2 × 24 KB of Q and four
  // 32 KB stages still fit in 227 KB.
  CHECK(KernelSpec::parse("fwd.bf16.d64.br192.bc128.w12.s4.wgmma.persistent").smem_bytes() <= 227 * 1024);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.persistent"),
                       doctest::Contains("persistent needs wgmma"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.persistent"),
                       doctest::Contains("persistent needs wgmma"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc128.w8.s2.wgmma.persistent.persistent"),
                       doctest::Contains("repeated flag 'persistent'"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("decode.bf16.d128.br16.bc16.w4.s3.persistent"),
                       doctest::Contains("does not apply to a decode spec"), Error);
}

TEST_CASE("wgmma fwd specs with three MMA warpgroups: 192-row tiles, 512 threads, at most 96 accumulators") {
  const KernelSpec spec = KernelSpec::parse("fwd.bf16.d64.br192.bc128.w12.s4.wgmma.causal");
  CHECK(spec.threads() == 12 * 32 + 128);
  CHECK(spec.accumulator_registers() == 96);
  // Q, four stages of K and V, 21 mbarriers.
  CHECK(spec.smem_bytes() == (192 + 4 * 2 * 128) * 64 * 2 + 21 * 8);
  CHECK(KernelSpec::parse("fwd.bf16.d128.br192.bc64.w12.s3.wgmma").accumulator_registers() == 96);
  // 128 accumulators (S and O at head_dim 128 with 128 keys) do not fit.
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br192.bc128.w12.s2.wgmma"),
                       doctest::Contains("w=12 (three wgmma warpgroups) holds at most 96 accumulators"), Error);
  // Twelve warps and 192 rows are the wgmma layout's only.
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br192.bc128.w12.s4"), doctest::Contains("needs w=8 (or w=12 with wgmma)"),
                       Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br192.bc128.w12"), doctest::Contains("192 with wgmma"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br128.bc128.w12"), doctest::Contains("w=12 is not one of 4, 8"),
                       Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br192.bc128.w8.s4"), doctest::Contains("br=192 is not one of"),
                       Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br192.bc128.w8.s4.wgmma"), doctest::Contains("br = 16 × w"),
                       Error);
}

TEST_CASE("learnable sinks: a fwd and decode flag after alibi, packed apart, and left to the combine where partials split") {
  const KernelSpec fwd = KernelSpec::parse("fwd.bf16.d64.br128.bc128.w8.s2.wgmma.persistent.causal.softcap.sink");
  CHECK(fwd.sink);
  CHECK(fwd.text() == "fwd.bf16.d64.br128.bc128.w8.s2.wgmma.persistent.causal.softcap.sink");
  CHECK(KernelSpec::parse("fwd.f16.d128.br64.bc64.w4.alibi.sink.packgqa.kvcache.paged").text() ==
        "fwd.f16.d128.br64.bc64.w4.alibi.sink.packgqa.kvcache.paged");
  // A dynamic decode's tiles of one piece write final rows, so the flag
  // stays there.
  CHECK(KernelSpec::parse("decode.bf16.d64.br32.bc64.w4.s4.local.sink.split.dynsplit").sink);
  // Every other field the same, the flag alone gives a new key and hash.
  for (const char* text : {"fwd.bf16.d64.br128.bc64.w4.causal", "fwd.bf16.d128.br128.bc128.w8.s2.wgmma.local.chunk",
                           "decode.bf16.d128.br16.bc16.w4.s4", "decode.f16.d64.br32.bc32.w4.s4.split.dynsplit"}) {
    CAPTURE(text);
    KernelSpec with = KernelSpec::parse(text);
    with.sink = true;
    const KernelSpec reparsed = KernelSpec::parse(with.text());
    CHECK(reparsed.sink);
    CHECK(reparsed == with);
    CHECK(with.packed() != KernelSpec::parse(text).packed());
    CHECK(with.hash() != KernelSpec::parse(text).hash());
  }
  // Split partials are merged by the combine, which takes the sink instead.
  for (const char* text : {"fwd.bf16.d128.br128.bc128.w8.s2.wgmma.sink.packgqa.kvcache.split",
                           "fwd.bf16.d128.br64.bc128.w4.sink.split", "decode.bf16.d128.br16.bc16.w4.s4.sink.split"}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text), doctest::Contains("split partials leave the sink to their combine"),
                         Error);
  }
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d64.br128.bc64.w4.sink.sink"),
                       doctest::Contains("unknown or repeated flag 'sink'"), Error);
}

TEST_CASE("a value head dim of its own (dvN): last in the text, packed apart, narrower V tiles, and its rules") {
  const KernelSpec deepseek = KernelSpec::parse("fwd.bf16.d192.br128.bc96.w8.s2.wgmma.causal.dv128");
  CHECK(deepseek.head_dim == 192);
  CHECK(deepseek.head_dim_v == 128);
  CHECK(deepseek.value_dim() == 128);
  CHECK(deepseek.text() == "fwd.bf16.d192.br128.bc96.w8.s2.wgmma.causal.dv128");
  KernelSpec same_dims = deepseek;
  same_dims.head_dim_v = 0;
  CHECK(same_dims.value_dim() == 192);
  CHECK(same_dims.packed() != deepseek.packed());
  CHECK(same_dims.hash() != deepseek.hash());
  // V's stages take 128-wide rows: 2 stages x 96 keys x 64 columns x 2 bytes less.
  CHECK(same_dims.smem_bytes() - deepseek.smem_bytes() == 2 * 96 * 64 * 2);
  // O's accumulators are V's: (128 / 8 + 96 / 8) x 4 per thread.
  CHECK(deepseek.accumulator_registers() == (128 / 8 + 96 / 8) * 4);
  // The 4-warp kernels: Q, one K and one V tile.
  const KernelSpec narrow = KernelSpec::parse("fwd.f16.d128.br128.bc64.w4.padded.varlen.dv64");
  CHECK(narrow.smem_bytes() == (128 * 128 + 64 * 128 + 64 * 64) * 2);
  CHECK(KernelSpec::parse(narrow.text()) == narrow);
  // Every value dim packs apart.
  std::vector<uint64_t> keys;
  for (int dv : {0, 32, 64, 96, 128, 192}) {
    KernelSpec spec = KernelSpec::parse("fwd.bf16.d256.br128.bc64.w8");
    spec.head_dim_v = dv;
    spec.validate();
    keys.push_back(spec.packed());
  }
  std::sort(keys.begin(), keys.end());
  CHECK(std::adjacent_find(keys.begin(), keys.end()) == keys.end());
  for (const auto& [text, why] :
       {std::pair{"fwd.bf16.d128.br128.bc64.w4.dv128", "below head_dim=128"},
        std::pair{"fwd.bf16.d128.br128.bc64.w4.dv160", "must be one of 32, 64, 96, 128, 192"},
        std::pair{"fwd.bf16.d64.br128.bc64.w4.dv48", "must be one of 32, 64, 96, 128, 192"},
        std::pair{"fwd.bf16.d128.br64.bc128.w4.packgqa.kvcache.dv64", "does not combine with kvcache, split"},
        std::pair{"fwd.bf16.d128.br64.bc128.w4.split.dv64", "does not combine with kvcache, split"},
        std::pair{"fwd.bf16.d128.br128.bc64.w4.unaligned_d111.dv64", "does not combine with kvcache, split"},
        std::pair{"fwd.bf16.d128.br128.bc64.w4.dv0", "leave the flag out"},
        std::pair{"fwd.bf16.d128.br128.bc64.w4.dv64.dv32", "unknown or repeated flag 'dv32'"},
        std::pair{"decode.bf16.d128.br16.bc16.w4.s4.dv64", "does not apply to a decode spec"}}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(KernelSpec::parse(text), doctest::Contains(why), Error);
  }
}

TEST_CASE("spec hash is stable across runs and builds") {
  // Pinned value: XXH3-64 of the canonical text (checked with the Python xxhash package). A change here invalidates
  // every tuned table and cache listing keyed by spec hash, so it must be deliberate.
  CHECK(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.causal").hash() ==
        KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.causal").hash());
  CHECK(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4").hash() != KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.causal").hash());
  CHECK(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4").hash() == 0x09b43fa24b339db4ull);
}

TEST_CASE("distinct specs pack to distinct hot-path keys") {
  std::vector<uint64_t> keys;
  for (DType dtype : {DType::f16, DType::bf16})
    for (int head_dim : {64, 128})
      for (int block_kv : {32, 64, 128})
        for (int flags = 0; flags < 32; ++flags) {
          keys.push_back(KernelSpec{Family::fwd, dtype, head_dim, 128, block_kv, 8, (flags & 1) != 0, (flags & 2) != 0,
                                    (flags & 4) != 0, (flags & 8) != 0, (flags & 16) != 0}.packed());
        }
  std::sort(keys.begin(), keys.end());
  CHECK(std::adjacent_find(keys.begin(), keys.end()) == keys.end());
}

TEST_CASE("bad spec text is rejected naming the field") {
  CHECK_THROWS_WITH_AS(KernelSpec::parse("bwd.bf16.d128.br128.bc64.w4"), doctest::Contains("unknown family 'bwd'"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.f32.d128.br128.bc64.w4"), doctest::Contains("dtype 'f32'"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.x128.br128.bc64.w4"), doctest::Contains("dN (head dim)"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d80.br128.bc64.w4"), doctest::Contains("head_dim=80"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc128.w4"), doctest::Contains("256 fp32 accumulators"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.causal.local"), doctest::Contains("exclusive"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.window"), doctest::Contains("unknown or repeated flag 'window'"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc48.w4"), doctest::Contains("bc=48"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br64.bc64.w8"), doctest::Contains("8 query rows per warp"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128.br128.bc64.w4.causal.causal"), doctest::Contains("repeated flag"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("fwd.bf16.d128"), doctest::Contains("expected family.dtype"), Error);
}

TEST_CASE("combine specs: text is combine.<state>.<out>[.elementwise][.dynsplit][.sink], round-trips, and packs apart from every other spec") {
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  std::vector<uint64_t> keys;
  for (bool sink : {false, true})
  for (bool dynamic_splits : {false, true})
  for (bool elementwise : {false, true})
    for (DType state : dtypes)
      for (DType out : dtypes) {
        const KernelSpec spec = KernelSpec::combine(state, out, elementwise, dynamic_splits, sink);
        CHECK(spec.family == Family::combine);
        CHECK(spec.elementwise == elementwise);
        CHECK(spec.dynamic_splits == dynamic_splits);
        CHECK(spec.sink == sink);
        CHECK(spec.text() == std::string("combine.") + dtype_name(state) + "." + dtype_name(out) +
                                 (elementwise ? ".elementwise" : "") + (dynamic_splits ? ".dynsplit" : "") +
                                 (sink ? ".sink" : ""));
        const KernelSpec parsed = KernelSpec::parse(spec.text());
        CHECK(parsed == spec);
        CHECK(parsed.text() == spec.text());
        CHECK(parsed.hash() == spec.hash());
        CHECK(spec.threads() == 128);
        CHECK(spec.smem_bytes() == 0);
        keys.push_back(spec.packed());
      }
  CHECK(KernelSpec::combine(DType::f32, DType::bf16).text() == "combine.f32.bf16");
  // Fields the combine family does not use do not split its keys.
  KernelSpec noisy = KernelSpec::combine(DType::f32, DType::f16);
  noisy.head_dim = 64;
  noisy.causal = true;
  CHECK(noisy == KernelSpec::combine(DType::f32, DType::f16));
  CHECK(noisy.text() == "combine.f32.f16");
  // ... and no combine key equals a forward key.
  for (DType dtype : {DType::f16, DType::bf16})
    for (int flags = 0; flags < 32; ++flags) {
      keys.push_back(KernelSpec{Family::fwd, dtype, 128, 128, 64, 4, (flags & 1) != 0, false, (flags & 2) != 0,
                                (flags & 4) != 0, (flags & 8) != 0, (flags & 16) != 0}
                         .packed());
    }
  // The largest fwd key (every field at its widest) stays below the combine keys' family bits.
  KernelSpec widest{Family::fwd, DType::bf16, 256, 128, 128, 8, true, true, true, true, true, true, true};
  widest.rope = RopeKind::interleaved;
  widest.rotary_dim = 256;
  widest.rope_tables = widest.rope_tables16 = true;
  widest.kvcache = widest.paged = widest.split = true;
  widest.sink = widest.chunk = true;
  widest.head_dim_v = 192;
  // Fields in bits 0-59, the family in bits 60-61, for every family.
  CHECK((widest.packed() >> 60) == 0);
  widest.family = Family::decode;
  CHECK((widest.packed() >> 60) == 3);
  CHECK((KernelSpec::combine(DType::f32, DType::f32, true, true, true).packed() >> 60) == 1);
  CHECK((KernelSpec::append(DType::bf16, RopeKind::half, 256, true, true, true, false).packed() >> 60) == 2);
  std::sort(keys.begin(), keys.end());
  CHECK(std::adjacent_find(keys.begin(), keys.end()) == keys.end());
  CHECK(KernelSpec::combine(DType::bf16, DType::f32).hash() != KernelSpec::combine(DType::f32, DType::bf16).hash());
}

TEST_CASE("bad combine spec text is rejected naming the field") {
  CHECK_THROWS_WITH_AS(KernelSpec::parse("combine.f64.bf16"), doctest::Contains("state dtype 'f64' is not f32, f16 or bf16"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("combine.f32.i32"), doctest::Contains("out dtype 'i32'"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("combine.f32"), doctest::Contains("expected combine.<state dtype>.<out dtype>"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("combine.f32.bf16.d128"), doctest::Contains("expected combine.<state dtype>.<out dtype>"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("combine.f32.bf16.elementwise.elementwise"),
                       doctest::Contains("[.elementwise]"), Error);
  // The flags go in one order, each once.
  CHECK_THROWS_WITH_AS(KernelSpec::parse("combine.f32.bf16.dynsplit.elementwise"),
                       doctest::Contains("[.elementwise][.dynsplit]"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("combine.f32.bf16.dynsplit.dynsplit"), doctest::Contains("[.dynsplit]"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("combine.f32.bf16.sink.dynsplit"), doctest::Contains("[.dynsplit][.sink]"),
                       Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("combine"), doctest::Contains("expected combine."), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("combiner.f32.bf16.d1.br1.bc1"), doctest::Contains("unknown family 'combiner' (known: fwd, decode, combine, append)"), Error);
  CHECK_THROWS_WITH_AS(KernelSpec::combine(DType::i32, DType::f32).validate(), doctest::Contains("combine.i32.f32"), Error);
}

TEST_CASE("arch text round-trips and device mapping picks sm_90a on Hopper") {
  for (const char* text : {"sm_80", "sm_86", "sm_89", "sm_90a", "sm_90", "sm_100", "sm_120"}) {
    CHECK(Arch::parse(text).text() == text);
  }
  CHECK(Arch::for_device(9, 0).text() == "sm_90a");
  CHECK(Arch::for_device(8, 6).text() == "sm_86");
  CHECK_THROWS_AS(Arch::parse("sm_75"), Error);
  CHECK_THROWS_AS(Arch::parse("compute_80"), Error);
  CHECK_THROWS_AS(Arch::parse("sm_8x"), Error);
}

}  // TEST_SUITE
