// Host-side references for the kernel tests: 16-bit conversions and attention
// computed in float64 (the truth) and with the rounding a plain 16-bit
// implementation does (the yardstick of FlashAttention's tolerance rule).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <utility>
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

// One attention problem, FlashAttention's semantics. The fields after `scale`
// are the optional features; their defaults mean "off". With
// off = seqlen_k - seqlen_q, query row i sees key j iff
//   j >= i + off - window_left   (when window_left >= 0),
//   j <= i + off + window_right  (when the effective window_right >= 0),
//   0 <= j < seqlen_k;
// causal is window_right = 0 (whatever window_right says), combined with any
// window_left; with attention_chunk = c > 0 also
//   floor((i + off) / c) · c <= j < floor((i + off) / c) · c + c
// (floor division: a row of negative i + off sees no key).
// A row that sees no key outputs 0 and has lse = -inf.
// Logits: scale·q·k, or softcap·tanh(scale·q·k / softcap) when softcap > 0,
// then − slope · |i + off − j| when ALiBi slopes are given.
// With learnable sinks (FlashAttention's learnable_sink), each row of head h
// has one more logit, learnable_sink[h], whose value is 0: it joins the
// softmax's max and sum, hence lse, but adds nothing to out; a row that sees
// no key then outputs 0 with lse = learnable_sink[h].
// q and k rows have head_dim elements, v and out rows value_dim() (FlashAttention
// 3's hdim_v, e.g. DeepSeek's q/k 192 with v 128): head_dim sets the scores,
// value_dim only how many columns of v the weights mix into out.
struct AttentionShape {
  int batch = 1;
  int seqlen_q = 1;
  int seqlen_k = 1;
  int heads_q = 1;
  int heads_kv = 1;
  int head_dim = 64;  // any positive size; the kernels want multiples of 8
  bool causal = false;
  float scale = 0.f;  // 0: 1/sqrt(head_dim), q's head dim whatever head_dim_v is
  int window_left = -1;   // -1: unbounded
  int window_right = -1;  // -1: unbounded (0 when causal)
  int attention_chunk = 0;  // 0: off
  float softcap = 0.f;    // 0: off
  // Empty: off. heads_q slopes (one per head) or batch·heads_q slopes (per
  // batch and head, index b·heads_q + h). With batch == 1 both are the same.
  std::vector<float> alibi_slopes;
  // Empty: off. heads_q sink logits, one per query head.
  std::vector<float> learnable_sink;
  // Last rather than beside head_dim: tests build shapes positionally,
  // {batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, scale}.
  int head_dim_v = 0;  // v's and out's head dim; 0: head_dim (FlashAttention 3's hdim_v)

  // The plain problem of these sizes (every feature off but causal).
  static AttentionShape dense(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv, int head_dim,
                              bool causal = false);

  float effective_scale() const;
  int value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  int effective_window_right() const { return causal ? 0 : window_right; }
  // Keys row i sees: [first, second); empty (first == second) when none.
  std::pair<int, int> visible_keys(int i) const;
  // The slope of (batch b, query head h); 0 without ALiBi.
  float alibi_slope(int b, int h) const;
  bool alibi_per_batch() const { return !alibi_slopes.empty() && static_cast<int>(alibi_slopes.size()) != heads_q; }
  // The sink logit of query head h; -inf (no sink) without learnable_sink.
  double sink(int h) const;
  // Throws std::invalid_argument when the shape breaks a rule above (a test bug).
  void check() const;
};

// Inputs as floats (already rounded to the 16-bit dtype), contiguous: q
// [batch, seqlen_q, heads_q, head_dim], k [batch, seqlen_k, heads_kv,
// head_dim], v [batch, seqlen_k, heads_kv, value_dim]. Outputs: out [batch,
// seqlen_q, heads_q, value_dim] and lse [batch, heads_q, seqlen_q] (natural
// log, -inf for rows that see no key; such rows output 0).
struct ReferenceOutput {
  std::vector<double> out;
  std::vector<double> lse;
  // Set on the 16-bit reference where the kernel itself rounds a transform
  // of its inputs (RoPE rotates q and k to 16 bits): logit_rounding() of that
  // rounding, the yardstick for LSE errors (see judge()). 0 otherwise.
  double logit_rounding = 0;
};

// Both honour every field of AttentionShape (head_dim_v included).
// Exact: float64 throughout.
ReferenceOutput attention_exact(const AttentionShape& shape, const std::vector<float>& q,
                                const std::vector<float>& k, const std::vector<float>& v);
// The same attention as a straightforward 16-bit implementation computes it,
// with fp32 accumulation (FlashAttention's attention_ref with upcast=False,
// reorder_ops=True). Rounded to `dtype`, in order:
//   without softcap: k·scale, then the score q·(k·scale);
//   with softcap:    the raw product q·k; then softcap·tanh(raw·scale/softcap)
//                    is computed in fp32 and rounded;
//   ALiBi's −slope·|i + off − j| is added in fp32 to the rounded score and not
//   rounded again (as in attention_ref, where the fp32 bias promotes the sum);
//   the probabilities exp(s − max)/sum, and the output.
ReferenceOutput attention_16bit(const AttentionShape& shape, const std::vector<float>& q,
                                const std::vector<float>& k, const std::vector<float>& v, DType dtype);

// The largest change rounding the inputs makes to a logit a row sees: the
// maximum over rows and their visible keys of scale·|q·k − q'·k'| in float64,
// with q, k the inputs before rounding (exact) and q', k' after (same layouts
// as attention_exact). A softcap and ALiBi move no logit further (the softcap
// is 1-Lipschitz, the bias the same for both), and an LSE moves by at most
// the largest change of its logits, so this bounds the LSE error that the
// rounding alone makes. Unlike the 16-bit reference's own LSE errors, a
// maximum over every visible (row, key) pair is stable where a call has few
// rows (one query row of six heads: six LSE errors).
double logit_rounding(const AttentionShape& shape, const std::vector<float>& q, const std::vector<float>& k,
                      const std::vector<float>& q_rounded, const std::vector<float>& k_rounded);

// --- Packed variable-length batches (FlashAttention's flash_attn_varlen_func) --

// Sequence b owns query rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) of the
// packed q/out and the keys starting at row cu_seqlens_k[b] of the packed k/v:
// all cu_seqlens_k[b+1] - cu_seqlens_k[b] of them, or the first seqused_k[b]
// when seqused_k is given (the rest are ignored). Each sequence is the dense
// batch-1 problem sequence(b): its own seqlen_q and seqlen_k (the keys it
// uses), so causal masks and windows are aligned per sequence
// (off = seqlen_k(b) - seqlen_q(b)). Rows past cu_seqlens_q[batch] are padding
// that no sequence owns.
struct VarlenShape {
  // Heads, head dims and the features of every sequence. batch must be the
  // number of sequences (ALiBi slopes: heads_q values, or batch·heads_q with
  // row b for sequence b); seqlen_q and seqlen_k are not used.
  AttentionShape common;
  std::vector<int> cu_seqlens_q{0};  // batch + 1 non-decreasing offsets
  std::vector<int> cu_seqlens_k{0};
  std::vector<int> seqused_k;  // empty, or batch values in [0, cu_seqlens_k[b+1] - cu_seqlens_k[b]]
  int total_q = 0;             // rows of the packed q/out, >= cu_seqlens_q[batch]
  int total_k = 0;             // rows of the packed k/v, >= cu_seqlens_k[batch]

  // Sequences of the given lengths packed back to back, followed by spare_q
  // (spare_k) padding rows; `common.batch` is set to their number.
  static VarlenShape packed(const AttentionShape& common, const std::vector<int>& seqlens_q,
                            const std::vector<int>& seqlens_k, int spare_q = 0, int spare_k = 0);

  int batch() const { return static_cast<int>(cu_seqlens_q.size()) - 1; }
  int seqlen_q(int b) const { return cu_seqlens_q[b + 1] - cu_seqlens_q[b]; }
  // The keys sequence b uses (seqused_k[b] when given).
  int seqlen_k(int b) const;
  // Query rows owned by a sequence: cu_seqlens_q[batch]; the rest are padding.
  int used_q() const { return cu_seqlens_q.back(); }
  // The longest sequences (key lengths as stored in cu_seqlens_k).
  int max_seqlen_q() const;
  int max_seqlen_k() const;
  // Sequence b as a dense problem: batch 1, its lengths, its ALiBi slopes
  // (head dims and every other field as common).
  AttentionShape sequence(int b) const;
  // Throws std::invalid_argument when the shape breaks a rule above (a test bug).
  void check() const;
};

// A dense reference: (shape, q, k, v) with the layouts of attention_exact
// (v and out rows of shape.value_dim()).
using DenseReference = std::function<ReferenceOutput(const AttentionShape&, const std::vector<float>&,
                                                     const std::vector<float>&, const std::vector<float>&)>;

// Varlen attention computed by running `dense` on each sequence (its rows of
// q, its used keys of k/v) and scattering the results. Inputs as floats,
// contiguous: q [total_q, heads_q, head_dim], k [total_k, heads_kv, head_dim],
// v [total_k, heads_kv, value_dim]. Outputs: out [total_q, heads_q,
// value_dim] and lse [heads_q, total_q]; padding rows (past
// cu_seqlens_q[batch]) are NaN in both, as no kernel writes them. Sequences
// with no queries are skipped; a sequence with no keys gives 0 and -inf, as
// in the dense case.
ReferenceOutput attention_varlen(const VarlenShape& shape, const std::vector<float>& q, const std::vector<float>& k,
                                 const std::vector<float>& v, const DenseReference& dense);
// attention_varlen over attention_exact / attention_16bit.
ReferenceOutput attention_varlen_exact(const VarlenShape& shape, const std::vector<float>& q,
                                       const std::vector<float>& k, const std::vector<float>& v);
ReferenceOutput attention_varlen_16bit(const VarlenShape& shape, const std::vector<float>& q,
                                       const std::vector<float>& k, const std::vector<float>& v, DType dtype);
// logit_rounding over each sequence's rows and the keys it uses (packed
// layouts as attention_varlen).
double logit_rounding_varlen(const VarlenShape& shape, const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& q_rounded, const std::vector<float>& k_rounded);

// --- RoPE (rotate-then-attend references) -----------------------------------

// How a reference rotates: the same options the kernel gets (RopeOptions),
// restated so the reference computes them its own way.
struct RopeReference {
  RopeStyle style = RopeStyle::rotate_half;
  int rotary_dim = 0;  // 0: head_dim
  double theta = 10000.0;
  double linear_scaling = 1.0;
  double llama3_factor = 0.0;  // 0: off
  double llama3_low_freq_factor = 1.0;
  double llama3_high_freq_factor = 4.0;
  double llama3_original_max_position = 8192.0;
  double yarn_factor = 0.0;  // 0: off
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;
  double yarn_original_max_position = 4096.0;
  bool yarn_truncate = true;
  double yarn_attention_factor = 0.0;  // 0: Hugging Face's default for the factor
  // LongRoPE: the per-pair factors (empty: off), and Hugging Face's factor and
  // original context for its default attention factor, or an explicit one.
  std::vector<double> longrope_pair_factors;
  double longrope_factor = 0.0;
  double longrope_original_max_position = 4096.0;
  double longrope_attention_factor = 0.0;  // 0: the default from the two above

  // Frequency of pair p (of rotary_dim / 2), Hugging Face's formulas, float64.
  std::vector<double> inverse_frequencies(int head_dim) const;
  // What cos and sin are multiplied by: YaRN's or LongRoPE's attention
  // factor, else 1.
  double attention_factor() const;
  // The kernel's options for these angles (style, rotary_dim, theta and each
  // scaling; not tables or offsets). LongRoPE's pair factors are copied to
  // `pair_factors`, which must outlive the call.
  void set_options(RopeOptions& options, std::vector<float>& pair_factors) const;
};

// Angles as the kernel will use them: from frequencies (`tables` empty), or
// f32 tables cos/sin [positions, rotary_dim / 2] that the test also hands the
// kernel. table() fills those tables from the float64 angles (times the
// attention factor).
struct RopeTables {
  std::vector<float> cos, sin;
  int positions = 0;
  int pairs = 0;
  DType dtype = DType::f32;  // the entries' dtype as handed to the kernel (round_tables)
};
RopeTables rope_tables(const RopeReference& rope, int head_dim, int positions);
// Tables handed over in a 16-bit dtype (FlashAttention's rotary_cos /
// rotary_sin): every entry rounded to dtype in place, so that references
// rotate with what the kernel reads; tables.dtype becomes dtype.
void round_tables(RopeTables& tables, DType dtype);
// Table entries as stored: f32 bytes (dtype f32), else dtype's 16-bit bits.
std::vector<unsigned char> table_bytes(const std::vector<float>& entries, DType dtype);

// Rotates x (contiguous [batch, seqlen, heads, head_dim] floats) in place;
// row s of batch b is at position(b, s). Exact: float64 angles and
// arithmetic (the result kept in float). Otherwise as a framework does it
// before attention: the fp32 angle position · inv_freq (or the table
// entries), fp32 arithmetic, the result rounded to dtype. With `packed16`
// (not exact), as frameworks' 16-bit rotary code and forward()'s kernels
// rotate keys (RopeOptions): cos and sin rounded to dtype, y·sin rounded,
// then x·cos + that rounded (one fused multiply-add).
void rotate_reference(std::vector<float>& x, int batch, int seqlen, int heads, int head_dim, const RopeReference& rope,
                      const RopeTables* tables, const std::function<int(int, int)>& position, bool exact, DType dtype,
                      bool packed16 = false);

// Normally distributed values already rounded to dtype (never zeros).
std::vector<float> random_values(size_t count, DType dtype, std::mt19937_64& rng);

}  // namespace jitattn::test
