// The CPU references the kernel tests rely on: if these are wrong, every
// kernel check is meaningless.
#include <doctest/doctest.h>

#include <cmath>

#include "reference.hpp"

using namespace jitattn;
using namespace jitattn::test;

TEST_SUITE("reference") {

TEST_CASE("16-bit conversions round-trip every finite value and round to nearest even") {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto b = static_cast<uint16_t>(bits);
    const float h = half_to_float(b);
    if (std::isfinite(h)) REQUIRE(float_to_half(h) == b);
    const float f = bf16_to_float(b);
    if (std::isfinite(f)) REQUIRE(float_to_bf16(f) == b);
  }
  CHECK(float_to_half(1.0f) == 0x3c00);
  CHECK(float_to_half(65504.f) == 0x7bff);
  CHECK(float_to_half(70000.f) == 0x7c00);
  CHECK(float_to_half(1.0f + 1.0f / 2048) == 0x3c00);   // tie → even
  CHECK(float_to_half(1.0f + 3.0f / 2048) == 0x3c02);   // tie → even (up)
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(1.0f + 1.0f / 256) == 0x3f80);    // tie → even
  CHECK(float_to_bf16(1.0f + 3.0f / 256) == 0x3f82);
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));
}

TEST_CASE("exact attention over one key returns that key's value") {
  AttentionShape s;
  s.seqlen_q = 3;
  s.seqlen_k = 1;
  s.head_dim = 8;
  std::vector<float> q(3 * 8, 0.5f), k(8, 0.25f), v(8);
  for (int d = 0; d < 8; ++d) v[d] = float(d) - 3.5f;
  const ReferenceOutput r = attention_exact(s, q, k, v);
  for (int i = 0; i < 3; ++i)
    for (int d = 0; d < 8; ++d) CHECK(r.out[i * 8 + d] == doctest::Approx(v[d]));
  CHECK(r.lse[0] == doctest::Approx(8 * 0.5 * 0.25 / std::sqrt(8.0)));
}

TEST_CASE("equal scores average the values; causal rows see only their prefix") {
  AttentionShape s;
  s.seqlen_q = 4;
  s.seqlen_k = 4;
  s.head_dim = 8;
  s.causal = true;
  std::vector<float> q(4 * 8, 1.f), k(4 * 8, 1.f), v(4 * 8);
  for (int j = 0; j < 4; ++j)
    for (int d = 0; d < 8; ++d) v[j * 8 + d] = float(j);
  const ReferenceOutput r = attention_exact(s, q, k, v);
  for (int i = 0; i < 4; ++i) CHECK(r.out[i * 8] == doctest::Approx(i / 2.0));  // mean of 0..i
}

TEST_CASE("causal is bottom-right aligned and empty rows give 0 and -inf") {
  AttentionShape s;
  s.seqlen_q = 5;
  s.seqlen_k = 2;
  s.head_dim = 8;
  s.causal = true;
  std::vector<float> q(5 * 8, 1.f), k(2 * 8, 1.f), v(2 * 8, 2.f);
  const ReferenceOutput r = attention_exact(s, q, k, v);
  for (int i = 0; i < 3; ++i) {  // rows 0..2 see keys j <= i - 3: none
    CHECK(r.out[i * 8] == 0.0);
    CHECK(std::isinf(r.lse[i]));
  }
  CHECK(r.out[3 * 8] == doctest::Approx(2.0));
  CHECK(r.lse[3] == doctest::Approx(8 / std::sqrt(8.0)));
  CHECK(r.lse[4] == doctest::Approx(8 / std::sqrt(8.0) + std::log(2.0)));
}

TEST_CASE("GQA maps query head h to kv head h / group") {
  AttentionShape s;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim = 8;
  std::vector<float> q(4 * 8, 1.f), k(2 * 8, 1.f), v(2 * 8);
  for (int d = 0; d < 8; ++d) {
    v[d] = 10.f;
    v[8 + d] = 20.f;
  }
  const ReferenceOutput r = attention_exact(s, q, k, v);
  CHECK(r.out[0 * 8] == 10.0);
  CHECK(r.out[1 * 8] == 10.0);
  CHECK(r.out[2 * 8] == 20.0);
  CHECK(r.out[3 * 8] == 20.0);
}

TEST_CASE("the 16-bit reference is close to, but not identical with, the exact one") {
  std::mt19937_64 rng(1234);
  AttentionShape s;
  s.seqlen_q = 40;
  s.seqlen_k = 70;
  s.head_dim = 64;
  for (DType dtype : {DType::f16, DType::bf16}) {
    const auto q = random_values(40 * 64, dtype, rng), k = random_values(70 * 64, dtype, rng), v = random_values(70 * 64, dtype, rng);
    const ReferenceOutput exact = attention_exact(s, q, k, v);
    const ReferenceOutput rounded = attention_16bit(s, q, k, v, dtype);
    double worst = 0;
    for (size_t i = 0; i < exact.out.size(); ++i) worst = std::max(worst, std::fabs(exact.out[i] - rounded.out[i]));
    CHECK(worst > 0);
    CHECK(worst < (dtype == DType::bf16 ? 3e-2 : 4e-3));
  }
}

}  // TEST_SUITE
