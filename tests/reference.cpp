#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace jitattn::test {

float half_to_float(uint16_t bits) {
  const uint32_t sign = (bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1f;
  uint32_t mantissa = bits & 0x3ff;
  uint32_t out;
  if (exponent == 0x1f) {
    out = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    out = sign;
  } else {  // subnormal: normalize
    exponent = 113;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    out = sign | (exponent << 23) | ((mantissa & 0x3ff) << 13);
  }
  float value;
  std::memcpy(&value, &out, 4);
  return value;
}

uint16_t float_to_half(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) return sign | (magnitude > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (magnitude >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: overflow to inf
  if (magnitude < 0x38800000u) {                       // below 2^-14: subnormal half
    float abs_value;
    std::memcpy(&abs_value, &magnitude, 4);
    const float scaled = abs_value * 16777216.f;  // in units of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);  // nearest even
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

float bf16_to_float(uint16_t bits) {
  const uint32_t out = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &out, 4);
  return value;
}

uint16_t float_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float to_float(uint16_t bits, DType dtype) { return dtype == DType::bf16 ? bf16_to_float(bits) : half_to_float(bits); }
uint16_t from_float(float value, DType dtype) { return dtype == DType::bf16 ? float_to_bf16(value) : float_to_half(value); }
float round_to(float value, DType dtype) { return to_float(from_float(value, dtype), dtype); }

float AttentionShape::effective_scale() const { return scale > 0.f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim)); }

namespace {

// Visits every (batch, query head, query row) with the row's visible key range.
template <typename Body>
void for_each_row(const AttentionShape& s, Body&& body) {
  const int group = s.heads_q / s.heads_kv;
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads_q; ++h) {
      for (int i = 0; i < s.seqlen_q; ++i) {
        int keys = s.seqlen_k;
        if (s.causal) keys = std::clamp(i + s.seqlen_k - s.seqlen_q + 1, 0, s.seqlen_k);
        const size_t q_row = ((static_cast<size_t>(b) * s.seqlen_q + i) * s.heads_q + h) * s.head_dim;
        const size_t kv_base = (static_cast<size_t>(b) * s.seqlen_k * s.heads_kv + h / group) * s.head_dim;
        const size_t kv_row_stride = static_cast<size_t>(s.heads_kv) * s.head_dim;
        const size_t lse_index = (static_cast<size_t>(b) * s.heads_q + h) * s.seqlen_q + i;
        body(q_row, kv_base, kv_row_stride, keys, lse_index);
      }
    }
  }
}

ReferenceOutput allocate(const AttentionShape& s) {
  ReferenceOutput r;
  r.out.assign(static_cast<size_t>(s.batch) * s.seqlen_q * s.heads_q * s.head_dim, 0.0);
  r.lse.assign(static_cast<size_t>(s.batch) * s.heads_q * s.seqlen_q, -std::numeric_limits<double>::infinity());
  return r;
}

}  // namespace

ReferenceOutput attention_exact(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                const std::vector<float>& v) {
  ReferenceOutput r = allocate(s);
  const double scale = s.effective_scale();
  std::vector<double> scores(s.seqlen_k);
  for_each_row(s, [&](size_t q_row, size_t kv_base, size_t kv_stride, int keys, size_t lse_index) {
    if (keys == 0) return;
    double max_score = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < keys; ++j) {
      double dot = 0;
      for (int d = 0; d < s.head_dim; ++d) dot += double(q[q_row + d]) * double(k[kv_base + j * kv_stride + d]);
      scores[j] = dot * scale;
      max_score = std::max(max_score, scores[j]);
    }
    double sum = 0;
    for (int j = 0; j < keys; ++j) sum += (scores[j] = std::exp(scores[j] - max_score));
    for (int d = 0; d < s.head_dim; ++d) {
      double acc = 0;
      for (int j = 0; j < keys; ++j) acc += scores[j] * double(v[kv_base + j * kv_stride + d]);
      r.out[q_row + d] = acc / sum;
    }
    r.lse[lse_index] = max_score + std::log(sum);
  });
  return r;
}

ReferenceOutput attention_16bit(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                const std::vector<float>& v, DType dtype) {
  ReferenceOutput r = allocate(s);
  const float scale = s.effective_scale();
  std::vector<float> scores(s.seqlen_k);
  for_each_row(s, [&](size_t q_row, size_t kv_base, size_t kv_stride, int keys, size_t lse_index) {
    if (keys == 0) return;
    float max_score = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < keys; ++j) {
      float dot = 0;
      for (int d = 0; d < s.head_dim; ++d) dot += q[q_row + d] * round_to(k[kv_base + j * kv_stride + d] * scale, dtype);
      scores[j] = round_to(dot, dtype);
      max_score = std::max(max_score, scores[j]);
    }
    float sum = 0;
    for (int j = 0; j < keys; ++j) sum += (scores[j] = std::exp(scores[j] - max_score));
    for (int j = 0; j < keys; ++j) scores[j] = round_to(scores[j] / sum, dtype);
    for (int d = 0; d < s.head_dim; ++d) {
      float acc = 0;
      for (int j = 0; j < keys; ++j) acc += scores[j] * v[kv_base + j * kv_stride + d];
      r.out[q_row + d] = round_to(acc, dtype);
    }
    r.lse[lse_index] = double(max_score) + std::log(double(sum));
  });
  return r;
}

std::vector<float> random_values(size_t count, DType dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> values(count);
  for (auto& value : values) value = round_to(normal(rng), dtype);
  return values;
}

}  // namespace jitattn::test
