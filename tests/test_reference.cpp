// The CPU references the kernel tests rely on: if these are wrong, every
// kernel check is meaningless.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

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

// Equal scores everywhere (q = k = ones) and v[j] = j in every dimension: a
// row's output is the mean index of the keys it sees, its lse
// scale·q·k + log(count).
namespace {
struct IndexProblem {
  AttentionShape shape;
  std::vector<float> q, k, v;
};
IndexProblem index_problem(int seqlen_q, int seqlen_k, int left, int right, bool causal) {
  IndexProblem p;
  p.shape.seqlen_q = seqlen_q;
  p.shape.seqlen_k = seqlen_k;
  p.shape.head_dim = 8;
  p.shape.window_left = left;
  p.shape.window_right = right;
  p.shape.causal = causal;
  p.q.assign(seqlen_q * 8, 1.f);
  p.k.assign(seqlen_k * 8, 1.f);
  p.v.resize(seqlen_k * 8);
  for (int j = 0; j < seqlen_k; ++j)
    for (int d = 0; d < 8; ++d) p.v[j * 8 + d] = float(j);
  return p;
}
// Checks row i saw exactly keys [first, last] (inclusive), or nothing when first > last.
void check_row_sees(const ReferenceOutput& r, int i, int first, int last) {
  INFO("row ", i, " should see keys ", first, "..", last);
  if (first > last) {
    for (int d = 0; d < 8; ++d) CHECK(r.out[i * 8 + d] == 0.0);
    CHECK(std::isinf(r.lse[i]));
    CHECK(r.lse[i] < 0);
    return;
  }
  CHECK(r.out[i * 8] == doctest::Approx((first + last) / 2.0));
  CHECK(r.out[i * 8 + 7] == doctest::Approx((first + last) / 2.0));
  CHECK(r.lse[i] == doctest::Approx(std::sqrt(8.0) + std::log(double(last - first + 1))));
}
}  // namespace

TEST_CASE("sliding window: row i sees keys i+off-left .. i+off+right, clipped to the sequence") {
  {  // seqlen_q 4, seqlen_k 6: off = 2; left 1, right 2
    const auto p = index_problem(4, 6, 1, 2, false);
    const ReferenceOutput r = attention_exact(p.shape, p.q, p.k, p.v);
    check_row_sees(r, 0, 1, 4);
    check_row_sees(r, 1, 2, 5);
    check_row_sees(r, 2, 3, 5);  // key 6 does not exist
    check_row_sees(r, 3, 4, 5);
    CHECK(p.shape.visible_keys(0) == std::pair<int, int>(1, 5));
  }
  {  // left only: row i sees i+2 .. 5
    const auto p = index_problem(4, 6, 0, -1, false);
    const ReferenceOutput r = attention_exact(p.shape, p.q, p.k, p.v);
    for (int i = 0; i < 4; ++i) check_row_sees(r, i, i + 2, 5);
  }
  {  // right only: row i sees 0 .. i+2+1
    const auto p = index_problem(4, 6, -1, 1, false);
    const ReferenceOutput r = attention_exact(p.shape, p.q, p.k, p.v);
    for (int i = 0; i < 4; ++i) check_row_sees(r, i, 0, std::min(i + 3, 5));
  }
  {  // causal is right = 0 (window_right ignored) and combines with left
    const auto p = index_problem(4, 6, 1, 7, true);
    const ReferenceOutput r = attention_exact(p.shape, p.q, p.k, p.v);
    for (int i = 0; i < 4; ++i) check_row_sees(r, i, i + 1, i + 2);
  }
  {  // (-1, 0) without causal is causal
    const auto a = index_problem(4, 6, -1, 0, false);
    const auto b = index_problem(4, 6, -1, -1, true);
    CHECK(attention_exact(a.shape, a.q, a.k, a.v).out == attention_exact(b.shape, b.q, b.k, b.v).out);
  }
  {  // a window wider than the sequence is no window
    const auto p = index_problem(4, 6, 1000, 1000, false);
    const ReferenceOutput r = attention_exact(p.shape, p.q, p.k, p.v);
    for (int i = 0; i < 4; ++i) check_row_sees(r, i, 0, 5);
  }
}

TEST_CASE("sliding window: rows that see no key give 0 and -inf in both references") {
  // seqlen_q 5, seqlen_k 2: off = -3; right 1 → row i sees j <= i - 2.
  const auto p = index_problem(5, 2, -1, 1, false);
  for (int pass = 0; pass < 2; ++pass) {
    const ReferenceOutput r = pass == 0 ? attention_exact(p.shape, p.q, p.k, p.v)
                                        : attention_16bit(p.shape, p.q, p.k, p.v, DType::bf16);
    const char* which = pass == 0 ? "exact" : "16-bit";
    INFO(which);
    check_row_sees(r, 0, 1, 0);
    check_row_sees(r, 1, 1, 0);
    CHECK(r.out[2 * 8] == doctest::Approx(0.0));
    CHECK(r.out[3 * 8] == doctest::Approx(0.5));
    CHECK(r.out[4 * 8] == doctest::Approx(0.5));
  }
  // left 0, right 0 with off = -2: only row 2 has its diagonal key.
  const auto d = index_problem(3, 1, 0, 0, false);
  const ReferenceOutput r = attention_exact(d.shape, d.q, d.k, d.v);
  check_row_sees(r, 0, 1, 0);
  check_row_sees(r, 1, 1, 0);
  check_row_sees(r, 2, 0, 0);
}

TEST_CASE("softcap: logits are softcap·tanh(scale·q·k / softcap)") {
  // Two keys with scale·q·k = 3 and 0, v = 1 and 0: out = w0 = e^l0 / (e^l0 + 1).
  AttentionShape s;
  s.seqlen_k = 2;
  s.head_dim = 8;
  s.scale = 1.f;
  s.softcap = 2.f;
  std::vector<float> q(8, 0.f), k(16, 0.f), v(16, 0.f);
  q[0] = 1.f;
  k[0] = 3.f;
  for (int d = 0; d < 8; ++d) v[d] = 1.f;
  const double l0 = 2.0 * std::tanh(1.5);
  const ReferenceOutput r = attention_exact(s, q, k, v);
  CHECK(r.out[0] == doctest::Approx(std::exp(l0) / (std::exp(l0) + 1)));
  CHECK(r.lse[0] == doctest::Approx(std::log(std::exp(l0) + 1)));
  for (DType dtype : {DType::f16, DType::bf16}) {
    const ReferenceOutput rounded = attention_16bit(s, q, k, v, dtype);
    CHECK(rounded.out[0] == doctest::Approx(r.out[0]).epsilon(1e-2));
    CHECK(rounded.lse[0] == doctest::Approx(r.lse[0]).epsilon(1e-2));
  }
  s.softcap = 0.f;  // off: plain scale·q·k
  CHECK(attention_exact(s, q, k, v).out[0] == doctest::Approx(std::exp(3.0) / (std::exp(3.0) + 1)));
}

TEST_CASE("softcap: a small cap bounds huge logits, so the weights become nearly uniform") {
  AttentionShape s;
  s.seqlen_k = 4;
  s.head_dim = 8;
  std::vector<float> q(8, 30.f), k(4 * 8), v(4 * 8);
  for (int j = 0; j < 4; ++j)
    for (int d = 0; d < 8; ++d) {
      k[j * 8 + d] = 10.f * (j + 1);  // scale·q·k from ~850 to ~3400
      v[j * 8 + d] = float(j);
    }
  const ReferenceOutput uncapped = attention_exact(s, q, k, v);
  CHECK(uncapped.out[0] == doctest::Approx(3.0));  // all weight on the largest logit
  s.softcap = 0.01f;
  const ReferenceOutput capped = attention_exact(s, q, k, v);
  CHECK(capped.out[0] == doctest::Approx(1.5).epsilon(1e-6));  // mean of 0..3
  CHECK(capped.lse[0] == doctest::Approx(0.01 + std::log(4.0)).epsilon(1e-6));
  for (DType dtype : {DType::f16, DType::bf16}) {
    const ReferenceOutput rounded = attention_16bit(s, q, k, v, dtype);
    CHECK(rounded.out[0] == doctest::Approx(1.5).epsilon(1e-2));
  }
}

TEST_CASE("ALiBi: weights fall off as exp(-slope * distance) from the aligned key") {
  // One query, 5 keys: off = 4, so key j is at distance 4 - j. Equal q·k (0)
  // and v[j] = e_j: out[j] is key j's weight.
  AttentionShape s;
  s.seqlen_q = 1;
  s.seqlen_k = 5;
  s.heads_q = 2;
  s.heads_kv = 1;
  s.head_dim = 8;
  s.alibi_slopes = {0.5f, 1.0f};
  std::vector<float> q(2 * 8, 0.f), k(5 * 8, 0.f), v(5 * 8, 0.f);
  for (int j = 0; j < 5; ++j) v[j * 8 + j] = 1.f;
  const ReferenceOutput r = attention_exact(s, q, k, v);
  for (int h = 0; h < 2; ++h) {
    const double slope = s.alibi_slopes[h];
    double sum = 0;
    for (int j = 0; j < 5; ++j) sum += std::exp(-slope * (4 - j));
    for (int j = 0; j < 4; ++j) CHECK(r.out[h * 8 + j] / r.out[h * 8 + j + 1] == doctest::Approx(std::exp(-slope)));
    CHECK(r.out[h * 8 + 4] == doctest::Approx(1 / sum));
    CHECK(r.lse[h] == doctest::Approx(std::log(sum)));
  }
  // Distances count both ways: seqlen_q 3, seqlen_k 5 → row 0 is aligned with
  // key 2, distances 2 1 0 1 2.
  s.seqlen_q = 3;
  s.heads_q = 1;
  s.alibi_slopes = {0.75f};
  q.assign(3 * 8, 0.f);
  const ReferenceOutput both = attention_exact(s, q, k, v);
  CHECK(both.out[0] == doctest::Approx(both.out[4]));
  CHECK(both.out[1] == doctest::Approx(both.out[3]));
  CHECK(both.out[2] / both.out[1] == doctest::Approx(std::exp(0.75)));
  CHECK(both.out[1] / both.out[0] == doctest::Approx(std::exp(0.75)));
  // The 16-bit reference adds the same bias.
  const ReferenceOutput rounded = attention_16bit(s, q, k, v, DType::f16);
  CHECK(rounded.out[2] / rounded.out[1] == doctest::Approx(std::exp(0.75)).epsilon(2e-3));
}

TEST_CASE("ALiBi: batch*heads_q slopes are selected by batch, heads_q slopes are shared") {
  AttentionShape s;
  s.batch = 2;
  s.seqlen_q = 1;
  s.seqlen_k = 3;
  s.heads_q = 2;
  s.heads_kv = 2;
  s.head_dim = 8;
  s.alibi_slopes = {0.1f, 0.2f, 0.3f, 0.4f};  // [b][h]
  CHECK(s.alibi_per_batch());
  std::vector<float> q(2 * 2 * 8, 0.f), k(2 * 3 * 2 * 8, 0.f), v(2 * 3 * 2 * 8, 0.f);
  for (int b = 0; b < 2; ++b)
    for (int j = 0; j < 3; ++j)
      for (int h = 0; h < 2; ++h) v[((b * 3 + j) * 2 + h) * 8 + j] = 1.f;  // v[b, j, h] = e_j
  auto ratio = [&](const ReferenceOutput& r, int b, int h) {
    const size_t row = (static_cast<size_t>(b) * 2 + h) * 8;  // out [b, 0, h, :]
    return r.out[row + 1] / r.out[row + 2];                  // distances 1 and 0
  };
  const ReferenceOutput r = attention_exact(s, q, k, v);
  CHECK(ratio(r, 0, 0) == doctest::Approx(std::exp(-0.1)));
  CHECK(ratio(r, 0, 1) == doctest::Approx(std::exp(-0.2)));
  CHECK(ratio(r, 1, 0) == doctest::Approx(std::exp(-0.3)));
  CHECK(ratio(r, 1, 1) == doctest::Approx(std::exp(-0.4)));
  s.alibi_slopes = {0.1f, 0.2f};  // per head: both batches alike
  CHECK_FALSE(s.alibi_per_batch());
  const ReferenceOutput shared = attention_exact(s, q, k, v);
  CHECK(ratio(shared, 1, 0) == doctest::Approx(std::exp(-0.1)));
  CHECK(ratio(shared, 1, 1) == doctest::Approx(std::exp(-0.2)));
  s.alibi_slopes = {0.1f, 0.2f, 0.3f};  // neither shape
  CHECK_THROWS_AS(attention_exact(s, q, k, v), std::invalid_argument);
}

TEST_CASE("head_dim 40: the references handle head dims other than 64/128") {
  AttentionShape s;
  s.seqlen_q = 2;
  s.seqlen_k = 2;
  s.head_dim = 40;
  std::vector<float> q(2 * 40, 1.f), k(2 * 40, 1.f), v(2 * 40);
  for (int d = 0; d < 40; ++d) {
    v[d] = float(d);
    v[40 + d] = float(d) + 2;
  }
  const ReferenceOutput r = attention_exact(s, q, k, v);
  for (int d = 0; d < 40; ++d) CHECK(r.out[40 + d] == doctest::Approx(d + 1.0));
  CHECK(r.lse[0] == doctest::Approx(std::sqrt(40.0) + std::log(2.0)));

  // Every feature at once, random inputs: the 16-bit reference stays close.
  std::mt19937_64 rng(99);
  s.batch = 2;
  s.seqlen_q = 37;
  s.seqlen_k = 53;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.causal = true;
  s.window_left = 9;
  s.softcap = 5.f;
  s.alibi_slopes = {0.3f, 0.6f, 0.9f, 0.1f, 0.2f, 0.4f, 0.8f, 1.0f};
  for (DType dtype : {DType::f16, DType::bf16}) {
    const auto q2 = random_values(2 * 37 * 4 * 40, dtype, rng);
    const auto k2 = random_values(2 * 53 * 2 * 40, dtype, rng), v2 = random_values(2 * 53 * 2 * 40, dtype, rng);
    const ReferenceOutput exact = attention_exact(s, q2, k2, v2);
    const ReferenceOutput rounded = attention_16bit(s, q2, k2, v2, dtype);
    double worst = 0;
    for (size_t i = 0; i < exact.out.size(); ++i) worst = std::max(worst, std::fabs(exact.out[i] - rounded.out[i]));
    CHECK(worst > 0);
    CHECK(worst < (dtype == DType::bf16 ? 3e-2 : 4e-3));
    for (size_t i = 0; i < exact.lse.size(); ++i) CHECK(std::isfinite(exact.lse[i]));  // left 9 keeps every row non-empty
  }
}

}  // TEST_SUITE
