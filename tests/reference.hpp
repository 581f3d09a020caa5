// Host-side references for the kernel tests: 16-bit conversions and attention
// computed in float64 (the truth) and with the rounding a plain 16-bit
// implementation does (the yardstick of FlashAttention's tolerance rule).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include <jitattn/jitattn.hpp>

namespace jitattn::test {

float half_to_float(uint16_t bits);
uint16_t float_to_half(float value);  // round to nearest even
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);  // round to nearest even
float to_float(uint16_t bits, DType dtype);
uint16_t from_float(float value, DType dtype);
float round_to(float value, DType dtype);  // value rounded through the 16-bit type

struct AttentionShape {
  int batch = 1;
  int seqlen_q = 1;
  int seqlen_k = 1;
  int heads_q = 1;
  int heads_kv = 1;
  int head_dim = 64;
  bool causal = false;
  float scale = 0.f;  // 0: 1/sqrt(head_dim)
  float effective_scale() const;
};

// Inputs as floats (already rounded to the 16-bit dtype), contiguous
// [batch, seqlen, heads, head_dim]. Outputs: out [batch, seqlen_q, heads_q,
// head_dim] and lse [batch, heads_q, seqlen_q] (natural log, -inf for rows
// that see no key; such rows output 0).
struct ReferenceOutput {
  std::vector<double> out;
  std::vector<double> lse;
};

// Exact: float64 throughout.
ReferenceOutput attention_exact(const AttentionShape& shape, const std::vector<float>& q,
                                const std::vector<float>& k, const std::vector<float>& v);
// The same attention as a straightforward 16-bit implementation computes it:
// k·scale, the scores, the probabilities and the output each rounded to
// `dtype`, with fp32 accumulation (FlashAttention's attention_ref with
// upcast=False, reorder_ops=True).
ReferenceOutput attention_16bit(const AttentionShape& shape, const std::vector<float>& q,
                                const std::vector<float>& k, const std::vector<float>& v, DType dtype);

// Normally distributed values already rounded to dtype (never zeros).
std::vector<float> random_values(size_t count, DType dtype, std::mt19937_64& rng);

}  // namespace jitattn::test
