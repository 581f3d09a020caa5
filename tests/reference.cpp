#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>

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

std::pair<int, int> AttentionShape::visible_keys(int i) const {
  const long long diagonal = static_cast<long long>(i) + seqlen_k - seqlen_q;
  long long first = 0, last = seqlen_k;
  if (window_left >= 0) first = std::max(first, diagonal - window_left);
  const int right = effective_window_right();
  if (right >= 0) last = std::min(last, diagonal + right + 1);
  if (attention_chunk > 0) {
    const long long chunk = attention_chunk;
    const long long chunk_start = (diagonal >= 0 ? diagonal / chunk : -((chunk - 1 - diagonal) / chunk)) * chunk;
    first = std::max(first, chunk_start);
    last = std::min(last, chunk_start + chunk);
  }
  first = std::min<long long>(first, seqlen_k);
  if (last < first) last = first;
  return {static_cast<int>(first), static_cast<int>(last)};
}

float AttentionShape::alibi_slope(int b, int h) const {
  if (alibi_slopes.empty()) return 0.f;
  return alibi_per_batch() ? alibi_slopes[static_cast<size_t>(b) * heads_q + h] : alibi_slopes[h];
}

double AttentionShape::sink(int h) const {
  return learnable_sink.empty() ? -std::numeric_limits<double>::infinity() : double(learnable_sink[h]);
}

void AttentionShape::check() const {
  auto fail = [](const std::string& what) { throw std::invalid_argument("AttentionShape: " + what); };
  if (batch < 0 || seqlen_q < 0 || seqlen_k < 0) fail("negative batch or seqlen");
  if (heads_q < 1 || heads_kv < 1 || heads_q % heads_kv != 0) fail("heads_kv must divide heads_q");
  if (head_dim < 1) fail("head_dim must be positive");
  if (head_dim_v < 0) fail("head_dim_v must be 0 (head_dim) or positive");
  if (window_left < -1 || window_right < -1) fail("window bounds must be -1 or >= 0");
  if (attention_chunk < 0) fail("attention_chunk must be >= 0");
  if (!(softcap >= 0.f) || !std::isfinite(softcap)) fail("softcap must be finite and >= 0");
  const size_t slopes = alibi_slopes.size();
  if (slopes != 0 && slopes != static_cast<size_t>(heads_q) && slopes != static_cast<size_t>(batch) * heads_q) {
    fail("alibi_slopes must hold heads_q or batch*heads_q values");
  }
  if (!learnable_sink.empty() && learnable_sink.size() != static_cast<size_t>(heads_q)) {
    fail("learnable_sink must hold heads_q values");
  }
}

namespace {

// One (batch, query head, query row) and where its data lives. q/k rows are
// head_dim wide, v/out rows value_dim: the same element index, different widths.
struct Row {
  int b, h, i;
  size_t q_row;      // first element of q for this row
  size_t out_row;    // first element of out for this row
  size_t k_base;     // first element of k for key 0 of this row's kv head
  size_t v_base;     // first element of v for key 0 of this row's kv head
  size_t k_stride;   // elements of k between consecutive keys
  size_t v_stride;   // elements of v between consecutive keys
  size_t lse_index;
  long long diagonal;  // i + seqlen_k - seqlen_q: the key aligned with this row
  int first, last;     // visible keys [first, last)
  float slope;         // ALiBi slope (0 without ALiBi)
};

// Visits every row with its visible key range.
template <typename Body>
void for_each_row(const AttentionShape& s, Body&& body) {
  s.check();
  const int group = s.heads_q / s.heads_kv;
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads_q; ++h) {
      for (int i = 0; i < s.seqlen_q; ++i) {
        Row row;
        row.b = b, row.h = h, row.i = i;
        const size_t q_index = (static_cast<size_t>(b) * s.seqlen_q + i) * s.heads_q + h;
        const size_t kv_index = static_cast<size_t>(b) * s.seqlen_k * s.heads_kv + h / group;
        row.q_row = q_index * s.head_dim;
        row.out_row = q_index * s.value_dim();
        row.k_base = kv_index * s.head_dim;
        row.v_base = kv_index * s.value_dim();
        row.k_stride = static_cast<size_t>(s.heads_kv) * s.head_dim;
        row.v_stride = static_cast<size_t>(s.heads_kv) * s.value_dim();
        row.lse_index = (static_cast<size_t>(b) * s.heads_q + h) * s.seqlen_q + i;
        row.diagonal = static_cast<long long>(i) + s.seqlen_k - s.seqlen_q;
        std::tie(row.first, row.last) = s.visible_keys(i);
        row.slope = s.alibi_slope(b, h);
        body(row);
      }
    }
  }
}

ReferenceOutput allocate(const AttentionShape& s) {
  ReferenceOutput r;
  r.out.assign(static_cast<size_t>(s.batch) * s.seqlen_q * s.heads_q * s.value_dim(), 0.0);
  r.lse.assign(static_cast<size_t>(s.batch) * s.heads_q * s.seqlen_q, -std::numeric_limits<double>::infinity());
  return r;
}

}  // namespace

ReferenceOutput attention_exact(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                const std::vector<float>& v) {
  ReferenceOutput r = allocate(s);
  const double scale = s.effective_scale();
  const double softcap = s.softcap;
  std::vector<double> scores(s.seqlen_k);
  for_each_row(s, [&](const Row& row) {
    // The sink: one more logit, of value 0 (-inf without it).
    const double sink = s.sink(row.h);
    if (row.first == row.last) {  // no visible key: out 0, lse -inf (or the sink)
      r.lse[row.lse_index] = sink;
      return;
    }
    const int keys = row.last - row.first;
    double max_score = sink;
    for (int t = 0; t < keys; ++t) {
      const int j = row.first + t;
      double dot = 0;
      for (int d = 0; d < s.head_dim; ++d) dot += double(q[row.q_row + d]) * double(k[row.k_base + j * row.k_stride + d]);
      double logit = dot * scale;
      if (softcap > 0) logit = softcap * std::tanh(logit / softcap);
      logit -= double(row.slope) * std::fabs(double(row.diagonal - j));
      scores[t] = logit;
      max_score = std::max(max_score, logit);
    }
    double sum = std::exp(sink - max_score);
    for (int t = 0; t < keys; ++t) sum += (scores[t] = std::exp(scores[t] - max_score));
    for (int d = 0; d < s.value_dim(); ++d) {
      double acc = 0;
      for (int t = 0; t < keys; ++t) acc += scores[t] * double(v[row.v_base + (row.first + t) * row.v_stride + d]);
      r.out[row.out_row + d] = acc / sum;
    }
    r.lse[row.lse_index] = max_score + std::log(sum);
  });
  return r;
}

double logit_rounding(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                      const std::vector<float>& q_rounded, const std::vector<float>& k_rounded) {
  if (q_rounded.size() != q.size() || k_rounded.size() != k.size()) {
    throw std::invalid_argument("logit_rounding: the rounded inputs must have the exact ones' sizes");
  }
  const double scale = s.effective_scale();
  double largest = 0;
  for_each_row(s, [&](const Row& row) {
    for (int j = row.first; j < row.last; ++j) {
      const size_t key = row.k_base + j * row.k_stride;
      double dot = 0, dot_rounded = 0;
      for (int d = 0; d < s.head_dim; ++d) {
        dot += double(q[row.q_row + d]) * double(k[key + d]);
        dot_rounded += double(q_rounded[row.q_row + d]) * double(k_rounded[key + d]);
      }
      largest = std::max(largest, scale * std::fabs(dot - dot_rounded));
    }
  });
  return largest;
}

ReferenceOutput attention_16bit(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                const std::vector<float>& v, DType dtype) {
  ReferenceOutput r = allocate(s);
  const float scale = s.effective_scale();
  const float softcap = s.softcap;
  // The k operand of the score product: k·scale rounded (no softcap), or k as
  // is (softcap: the raw product is rounded, scale applied after).
  std::vector<float> k_operand(k.size());
  for (size_t e = 0; e < k.size(); ++e) k_operand[e] = softcap > 0.f ? k[e] : round_to(k[e] * scale, dtype);
  std::vector<float> scores(s.seqlen_k);
  for_each_row(s, [&](const Row& row) {
    const float sink = static_cast<float>(s.sink(row.h));
    if (row.first == row.last) {  // no visible key: out 0, lse -inf (or the sink)
      r.lse[row.lse_index] = sink;
      return;
    }
    const int keys = row.last - row.first;
    float max_score = sink;
    for (int t = 0; t < keys; ++t) {
      const int j = row.first + t;
      float dot = 0;
      for (int d = 0; d < s.head_dim; ++d) dot += q[row.q_row + d] * k_operand[row.k_base + j * row.k_stride + d];
      float logit = round_to(dot, dtype);
      if (softcap > 0.f) logit = round_to(softcap * std::tanh(logit * scale / softcap), dtype);
      logit -= row.slope * static_cast<float>(std::llabs(row.diagonal - j));
      scores[t] = logit;
      max_score = std::max(max_score, logit);
    }
    float sum = std::exp(sink - max_score);
    for (int t = 0; t < keys; ++t) sum += (scores[t] = std::exp(scores[t] - max_score));
    for (int t = 0; t < keys; ++t) scores[t] = round_to(scores[t] / sum, dtype);
    for (int d = 0; d < s.value_dim(); ++d) {
      float acc = 0;
      for (int t = 0; t < keys; ++t) acc += scores[t] * v[row.v_base + (row.first + t) * row.v_stride + d];
      r.out[row.out_row + d] = round_to(acc, dtype);
    }
    r.lse[row.lse_index] = double(max_score) + std::log(double(sum));
  });
  return r;
}

VarlenShape VarlenShape::packed(const AttentionShape& common, const std::vector<int>& seqlens_q,
                                const std::vector<int>& seqlens_k, int spare_q, int spare_k) {
  if (seqlens_q.size() != seqlens_k.size()) throw std::invalid_argument("VarlenShape::packed: one key length per sequence");
  VarlenShape s;
  s.common = common;
  s.common.batch = static_cast<int>(seqlens_q.size());
  for (size_t b = 0; b < seqlens_q.size(); ++b) {
    s.cu_seqlens_q.push_back(s.cu_seqlens_q.back() + seqlens_q[b]);
    s.cu_seqlens_k.push_back(s.cu_seqlens_k.back() + seqlens_k[b]);
  }
  s.total_q = s.cu_seqlens_q.back() + spare_q;
  s.total_k = s.cu_seqlens_k.back() + spare_k;
  s.check();
  return s;
}

int VarlenShape::seqlen_k(int b) const {
  return seqused_k.empty() ? cu_seqlens_k[b + 1] - cu_seqlens_k[b] : seqused_k[b];
}

int VarlenShape::max_seqlen_q() const {
  int longest = 0;
  for (int b = 0; b < batch(); ++b) longest = std::max(longest, seqlen_q(b));
  return longest;
}

int VarlenShape::max_seqlen_k() const {
  int longest = 0;
  for (int b = 0; b < batch(); ++b) longest = std::max(longest, cu_seqlens_k[b + 1] - cu_seqlens_k[b]);
  return longest;
}

AttentionShape VarlenShape::sequence(int b) const {
  AttentionShape s = common;
  s.batch = 1;
  s.seqlen_q = seqlen_q(b);
  s.seqlen_k = seqlen_k(b);
  if (common.alibi_per_batch()) {
    const auto first = common.alibi_slopes.begin() + static_cast<ptrdiff_t>(b) * common.heads_q;
    s.alibi_slopes.assign(first, first + common.heads_q);
  }
  return s;
}

void VarlenShape::check() const {
  auto fail = [](const std::string& what) { throw std::invalid_argument("VarlenShape: " + what); };
  if (cu_seqlens_q.empty()) fail("cu_seqlens_q must hold batch + 1 offsets");
  if (cu_seqlens_k.size() != cu_seqlens_q.size()) fail("cu_seqlens_k must hold as many offsets as cu_seqlens_q");
  if (common.batch != batch()) fail("common.batch must be the number of sequences");
  common.check();
  if (!seqused_k.empty() && static_cast<int>(seqused_k.size()) != batch()) fail("seqused_k must be empty or hold batch values");
  auto check_offsets = [&](const std::vector<int>& cu, int total, const char* name) {
    if (cu.front() < 0) fail(std::string(name) + " must start at >= 0");
    for (size_t b = 1; b < cu.size(); ++b) {
      if (cu[b] < cu[b - 1]) fail(std::string(name) + " must be non-decreasing");
    }
    if (cu.back() > total) fail(std::string(name) + " must end within the packed tensor");
  };
  check_offsets(cu_seqlens_q, total_q, "cu_seqlens_q");
  check_offsets(cu_seqlens_k, total_k, "cu_seqlens_k");
  for (size_t b = 0; b < seqused_k.size(); ++b) {
    if (seqused_k[b] < 0 || seqused_k[b] > cu_seqlens_k[b + 1] - cu_seqlens_k[b]) {
      fail("seqused_k[b] must be within 0..the sequence's stored keys");
    }
  }
}

namespace {

// `count` elements of a packed tensor from element `first`: one sequence's rows.
std::vector<float> packed_rows(const std::vector<float>& packed, size_t first, size_t count) {
  return std::vector<float>(packed.begin() + first, packed.begin() + first + count);
}

}  // namespace

ReferenceOutput attention_varlen(const VarlenShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                 const std::vector<float>& v, const DenseReference& dense) {
  s.check();
  // Elements per packed row: q and k head_dim wide per head, v and out value_dim.
  const size_t q_row = static_cast<size_t>(s.common.heads_q) * s.common.head_dim;
  const size_t k_row = static_cast<size_t>(s.common.heads_kv) * s.common.head_dim;
  const size_t v_row = static_cast<size_t>(s.common.heads_kv) * s.common.value_dim();
  const size_t out_row = static_cast<size_t>(s.common.heads_q) * s.common.value_dim();
  if (q.size() != s.total_q * q_row || k.size() != s.total_k * k_row || v.size() != s.total_k * v_row) {
    throw std::invalid_argument("attention_varlen: q, k, v must hold total_q and total_k packed rows");
  }
  ReferenceOutput r;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  r.out.assign(s.total_q * out_row, nan);
  r.lse.assign(static_cast<size_t>(s.common.heads_q) * s.total_q, nan);
  for (int b = 0; b < s.batch(); ++b) {
    const AttentionShape sequence = s.sequence(b);
    if (sequence.seqlen_q == 0) continue;  // owns no rows
    const size_t q_first = static_cast<size_t>(s.cu_seqlens_q[b]) * q_row;
    const size_t k_first = static_cast<size_t>(s.cu_seqlens_k[b]) * k_row;
    const size_t v_first = static_cast<size_t>(s.cu_seqlens_k[b]) * v_row;
    const size_t keys = static_cast<size_t>(sequence.seqlen_k);
    const std::vector<float> q_b = packed_rows(q, q_first, sequence.seqlen_q * q_row);
    const std::vector<float> k_b = packed_rows(k, k_first, keys * k_row);
    const std::vector<float> v_b = packed_rows(v, v_first, keys * v_row);
    const ReferenceOutput dense_b = dense(sequence, q_b, k_b, v_b);
    if (dense_b.out.size() != sequence.seqlen_q * out_row) {
      throw std::invalid_argument("attention_varlen: the dense reference's out must hold seqlen_q rows of value_dim");
    }
    // out [1, seqlen_q, heads_q, value_dim] is the packed layout of these rows;
    // lse [1, heads_q, seqlen_q] goes to columns cu_seqlens_q[b].. of each head.
    std::copy(dense_b.out.begin(), dense_b.out.end(), r.out.begin() + static_cast<size_t>(s.cu_seqlens_q[b]) * out_row);
    for (int h = 0; h < s.common.heads_q; ++h) {
      std::copy(dense_b.lse.begin() + static_cast<size_t>(h) * sequence.seqlen_q,
                dense_b.lse.begin() + static_cast<size_t>(h + 1) * sequence.seqlen_q,
                r.lse.begin() + static_cast<size_t>(h) * s.total_q + s.cu_seqlens_q[b]);
    }
  }
  return r;
}

ReferenceOutput attention_varlen_exact(const VarlenShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v) {
  return attention_varlen(s, q, k, v, attention_exact);
}

ReferenceOutput attention_varlen_16bit(const VarlenShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v, DType dtype) {
  return attention_varlen(s, q, k, v,
                          [dtype](const AttentionShape& shape, const std::vector<float>& q_b,
                                  const std::vector<float>& k_b, const std::vector<float>& v_b) {
                            return attention_16bit(shape, q_b, k_b, v_b, dtype);
                          });
}

double logit_rounding_varlen(const VarlenShape& s, const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& q_rounded, const std::vector<float>& k_rounded) {
  s.check();
  const size_t q_row = static_cast<size_t>(s.common.heads_q) * s.common.head_dim;
  const size_t k_row = static_cast<size_t>(s.common.heads_kv) * s.common.head_dim;
  if (q.size() != s.total_q * q_row || k.size() != s.total_k * k_row) {
    throw std::invalid_argument("logit_rounding_varlen: q and k must hold total_q and total_k packed rows");
  }
  double largest = 0;
  for (int b = 0; b < s.batch(); ++b) {
    const AttentionShape sequence = s.sequence(b);
    if (sequence.seqlen_q == 0) continue;
    const size_t q_first = static_cast<size_t>(s.cu_seqlens_q[b]) * q_row, q_count = sequence.seqlen_q * q_row;
    const size_t k_first = static_cast<size_t>(s.cu_seqlens_k[b]) * k_row, k_count = sequence.seqlen_k * k_row;
    largest = std::max(largest, logit_rounding(sequence, packed_rows(q, q_first, q_count), packed_rows(k, k_first, k_count),
                                               packed_rows(q_rounded, q_first, q_count),
                                               packed_rows(k_rounded, k_first, k_count)));
  }
  return largest;
}

AttentionShape AttentionShape::dense(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv, int head_dim,
                                     bool causal) {
  AttentionShape s;
  s.batch = batch;
  s.seqlen_q = seqlen_q;
  s.seqlen_k = seqlen_k;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.head_dim = head_dim;
  s.causal = causal;
  return s;
}

std::vector<double> RopeReference::inverse_frequencies(int head_dim) const {
  const int dim = rotary_dim == 0 ? head_dim : rotary_dim;
  std::vector<double> frequencies;
  for (int i = 0; i < dim; i += 2) {
    double frequency = 1.0 / std::pow(theta, static_cast<double>(i) / dim) / linear_scaling;
    if (llama3_factor > 0) {
      const double wavelength = 2 * M_PI / frequency;
      const double low_wavelength = llama3_original_max_position / llama3_low_freq_factor;
      const double high_wavelength = llama3_original_max_position / llama3_high_freq_factor;
      if (wavelength > low_wavelength) {
        frequency = frequency / llama3_factor;
      } else if (!(wavelength < high_wavelength)) {
        const double smooth = (llama3_original_max_position / wavelength - llama3_low_freq_factor) /
                              (llama3_high_freq_factor - llama3_low_freq_factor);
        frequency = (1 - smooth) * frequency / llama3_factor + smooth * frequency;
      }
    }
    frequencies.push_back(frequency);
  }
  if (yarn_factor > 0) {
    // Hugging Face's _compute_yarn_parameters, restated: extrapolated
    // (theta's) frequencies for the pairs that turn more than beta_fast times
    // in the original context, interpolated (divided by the factor) for those
    // that turn fewer than beta_slow times, a linear ramp between.
    auto correction_dim = [&](double rotations) {
      return dim * std::log(yarn_original_max_position / (rotations * 2 * M_PI)) / (2 * std::log(theta));
    };
    double low = correction_dim(yarn_beta_fast), high = correction_dim(yarn_beta_slow);
    if (yarn_truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1.0);
    if (low == high) high += 0.001;
    for (size_t p = 0; p < frequencies.size(); ++p) {
      const double extrapolated = frequencies[p], interpolated = frequencies[p] / yarn_factor;
      const double extrapolation_share = 1.0 - std::min(std::max((p - low) / (high - low), 0.0), 1.0);
      frequencies[p] = interpolated * (1.0 - extrapolation_share) + extrapolated * extrapolation_share;
    }
  }
  if (!longrope_pair_factors.empty()) {
    // Hugging Face's _compute_longrope_parameters: 1 / (factor · theta^(i / dim)).
    for (size_t p = 0; p < frequencies.size(); ++p) {
      frequencies[p] = 1.0 / (longrope_pair_factors.at(p) * std::pow(theta, 2.0 * p / dim));
    }
  }
  return frequencies;
}

double RopeReference::attention_factor() const {
  if (!longrope_pair_factors.empty()) {
    if (longrope_attention_factor > 0) return longrope_attention_factor;
    return longrope_factor <= 1 ? 1.0
                                : std::sqrt(1.0 + std::log(longrope_factor) / std::log(longrope_original_max_position));
  }
  if (yarn_factor <= 0) return 1.0;
  if (yarn_attention_factor > 0) return yarn_attention_factor;
  return yarn_factor <= 1 ? 1.0 : 0.1 * std::log(yarn_factor) + 1.0;
}

void RopeReference::set_options(RopeOptions& options, std::vector<float>& pair_factors) const {
  options.style = style;
  options.rotary_dim = rotary_dim;
  options.theta = static_cast<float>(theta);
  options.linear_scaling = static_cast<float>(linear_scaling);
  options.llama3_factor = static_cast<float>(llama3_factor);
  options.llama3_low_freq_factor = static_cast<float>(llama3_low_freq_factor);
  options.llama3_high_freq_factor = static_cast<float>(llama3_high_freq_factor);
  options.llama3_original_max_position = static_cast<int>(llama3_original_max_position);
  options.yarn_factor = static_cast<float>(yarn_factor);
  options.yarn_beta_fast = static_cast<float>(yarn_beta_fast);
  options.yarn_beta_slow = static_cast<float>(yarn_beta_slow);
  options.yarn_original_max_position = static_cast<int>(yarn_original_max_position);
  options.yarn_truncate = yarn_truncate;
  options.yarn_attention_factor = static_cast<float>(yarn_attention_factor);
  pair_factors.assign(longrope_pair_factors.begin(), longrope_pair_factors.end());
  options.longrope_pair_factors = pair_factors.empty() ? nullptr : pair_factors.data();
  options.longrope_factor = static_cast<float>(longrope_factor);
  options.longrope_original_max_position = static_cast<int>(longrope_original_max_position);
  options.longrope_attention_factor = static_cast<float>(longrope_attention_factor);
}

RopeTables rope_tables(const RopeReference& rope, int head_dim, int positions) {
  const std::vector<double> frequencies = rope.inverse_frequencies(head_dim);
  RopeTables tables;
  tables.positions = positions;
  tables.pairs = static_cast<int>(frequencies.size());
  for (int x = 0; x < positions; ++x) {
    for (double frequency : frequencies) {
      tables.cos.push_back(static_cast<float>(rope.attention_factor() * std::cos(x * frequency)));
      tables.sin.push_back(static_cast<float>(rope.attention_factor() * std::sin(x * frequency)));
    }
  }
  return tables;
}

void round_tables(RopeTables& tables, DType dtype) {
  for (std::vector<float>* table : {&tables.cos, &tables.sin}) {
    for (float& entry : *table) entry = round_to(entry, dtype);
  }
  tables.dtype = dtype;
}

std::vector<unsigned char> table_bytes(const std::vector<float>& entries, DType dtype) {
  std::vector<unsigned char> bytes(entries.size() * (dtype == DType::f32 ? 4 : 2));
  if (dtype == DType::f32) {
    std::memcpy(bytes.data(), entries.data(), bytes.size());
  } else {
    for (size_t i = 0; i < entries.size(); ++i) {
      const uint16_t bits = from_float(entries[i], dtype);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
  }
  return bytes;
}

void rotate_reference(std::vector<float>& x, int batch, int seqlen, int heads, int head_dim, const RopeReference& rope,
                      const RopeTables* tables, const std::function<int(int, int)>& position, bool exact, DType dtype,
                      bool packed16) {
  const std::vector<double> frequencies = rope.inverse_frequencies(head_dim);
  const int pairs = static_cast<int>(frequencies.size());
  const double scale = rope.attention_factor();  // tables already hold it
  for (int b = 0; b < batch; ++b) {
    for (int s = 0; s < seqlen; ++s) {
      const int at = position(b, s);
      for (int h = 0; h < heads; ++h) {
        float* row = x.data() + ((static_cast<size_t>(b) * seqlen + s) * heads + h) * head_dim;
        for (int p = 0; p < pairs; ++p) {
          const int first = rope.style == RopeStyle::rotate_half ? p : 2 * p;
          const int second = rope.style == RopeStyle::rotate_half ? p + pairs : 2 * p + 1;
          double cosine, sine;
          if (tables != nullptr) {
            const int clamped = std::min(std::max(at, 0), tables->positions - 1);
            cosine = tables->cos[static_cast<size_t>(clamped) * tables->pairs + p];
            sine = tables->sin[static_cast<size_t>(clamped) * tables->pairs + p];
          } else if (exact) {
            cosine = scale * std::cos(at * frequencies[p]);
            sine = scale * std::sin(at * frequencies[p]);
          } else {
            // fp32 angle, cos and sin, then scaled in fp32 (as frameworks
            // scale their fp32 caches).
            const float angle = static_cast<float>(at) * static_cast<float>(frequencies[p]);
            cosine = static_cast<float>(scale) * static_cast<float>(std::cos(static_cast<double>(angle)));
            sine = static_cast<float>(scale) * static_cast<float>(std::sin(static_cast<double>(angle)));
          }
          const double a = row[first], c = row[second];
          if (exact) {
            row[first] = static_cast<float>(a * cosine - c * sine);
            row[second] = static_cast<float>(c * cosine + a * sine);
          } else if (packed16) {
            // 16-bit products are exact in double; each step rounds to dtype.
            const double cos16 = round_to(static_cast<float>(cosine), dtype);
            const double sin16 = round_to(static_cast<float>(sine), dtype);
            const double minus_c_sin = round_to(static_cast<float>(-c * sin16), dtype);
            const double a_sin = round_to(static_cast<float>(a * sin16), dtype);
            row[first] = round_to(static_cast<float>(a * cos16 + minus_c_sin), dtype);
            row[second] = round_to(static_cast<float>(c * cos16 + a_sin), dtype);
          } else {
            const float fa = static_cast<float>(a), fc = static_cast<float>(c);
            const float fcos = static_cast<float>(cosine), fsin = static_cast<float>(sine);
            row[first] = round_to(fa * fcos - fc * fsin, dtype);
            row[second] = round_to(fc * fcos + fa * fsin, dtype);
          }
        }
      }
    }
  }
}

std::vector<float> random_values(size_t count, DType dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> values(count);
  for (auto& value : values) value = round_to(normal(rng), dtype);
  return values;
}

}  // namespace jitattn::test
