// GPU-side helpers for the kernel tests: device buffers, strided uploads and
// downloads, and a simple reference attention kernel (one CTA per query row,
// fp32) that is itself checked against the float64 CPU reference.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <thread>
#include <cstdint>
#include <string>
#include <vector>

#include "driver.hpp"
#include "reference.hpp"

namespace jitattn::test {

// Makes device 0's primary context current on this thread (as the CUDA
// runtime would). Returns false with a reason when there is no usable GPU.
bool use_gpu(std::string* why);

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return reinterpret_cast<void*>(pointer_); }
  size_t bytes() const { return bytes_; }
  void fill_bytes(unsigned char value);  // e.g. 0xff: NaN poison in every float format
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  // The same at a byte offset into the buffer.
  void upload_at(size_t offset, const void* host, size_t bytes);
  void download_at(size_t offset, void* host, size_t bytes) const;

 private:
  CUdeviceptr pointer_ = 0;
  size_t bytes_ = 0;
};

// A [batch, seqlen, heads, head_dim] 16-bit tensor in device memory with
// arbitrary strides (elements). `values` is the logical contiguous content.
struct DeviceTensor {
  DeviceTensor(const std::vector<float>& values, DType dtype, const int64_t (&shape)[4], const int64_t (&strides)[4]);
  // Uninitialized-then-poisoned tensor (every byte 0xff).
  DeviceTensor(DType dtype, const int64_t (&shape)[4], const int64_t (&strides)[4]);
  TensorView view() const;
  std::vector<float> read() const;  // logical contiguous content as floats
  std::vector<uint16_t> raw() const;  // the whole allocation, bits as stored
  // Elements of the allocation outside rows [0, rows) of dimension 1 (later
  // rows of every batch, and the gaps strides leave) that are no longer
  // poison (0xffff): what a kernel wrote where it must not.
  size_t count_written_outside(int64_t rows) const;

  DType dtype;
  int64_t shape[4];
  int64_t strides[4];
  DeviceBuffer buffer;
};

// Strides that are not the contiguous default: padded rows, heads and batches.
void padded_strides(const int64_t (&shape)[4], int64_t (&strides)[4]);
// [batch, heads, seqlen, head_dim] storage viewed as [batch, seqlen, heads, head_dim].
void heads_major_strides(const int64_t (&shape)[4], int64_t (&strides)[4]);
void contiguous_strides(const int64_t (&shape)[4], int64_t (&strides)[4]);

// The reference kernel: `exact` computes in fp32 with no rounding of
// intermediates; otherwise it rounds like attention_16bit. Honours every
// field of `shape` (window, softcap, head_dim_v; ALiBi slopes are uploaded
// from shape.alibi_slopes for the call). q/k/v may have any strides; q and k
// must be head_dim wide, v shape.value_dim() (else std::invalid_argument).
// Outputs in attention_exact's layouts (out rows value_dim wide).
ReferenceOutput gpu_reference(const AttentionShape& shape, const DeviceTensor& q, const DeviceTensor& k,
                              const DeviceTensor& v, bool exact);

// --- Varlen (packed) tensors -----------------------------------------------

// The packed [total, heads, head_dim] view of a batch-1 tensor (shape[0] must
// be 1): its rows as varlen's total dimension. `first_head`/`heads` select a
// run of its heads (e.g. q, k or v inside a packed qkv buffer); heads -1: all.
TensorView packed_view(const DeviceTensor& t, int first_head = 0, int heads = -1);

// attention_varlen with gpu_reference as the dense reference: each sequence
// is uploaded on its own (contiguous, from the packed host values) and run by
// the reference kernel. Layouts as attention_varlen.
ReferenceOutput gpu_reference_varlen(const VarlenShape& shape, const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v, DType dtype, bool exact);

// --- Shared helpers of the GPU test files --------------------------------

// Different on every run; print it with every failure. JITATTN_TEST_SEED=N
// replays a failure's seed instead.
uint64_t clock_seed();
// The runtime GPU tests use: its disk cache is $JITATTN_CACHE_DIR, else
// <tmp>/jitattn-gpu-tests.
Runtime& gpu_tests_runtime();
// A context of the caller's own on device 0 (cuCtxCreate), current on this
// thread until destroy_context: for tests of contexts that come and go.
CUcontext create_context();
void destroy_context(CUcontext context);
// The compile target of the current context's device, e.g. "sm_90a".
std::string current_arch();
// The current context's device: its SMs, and the shared memory a block may
// opt into (bytes).
int current_sm_count();
int current_max_smem_per_block();
// Whether the device is sm_90a; if not, the test case reports why it skips
// ("skipped: <feature> needs sm_90a, this GPU is ...").
bool sm90a_or_skip(const char* feature);
// A dense call's record (any struct with `out` and `lse`): out's logical
// contiguous values and the first lse_count floats of lse, as the call left them.
template <typename Run>
Run read_outputs(const DeviceTensor& out, const DeviceBuffer& lse, size_t lse_count) {
  Run run;
  run.out = out.read();
  run.lse.resize(lse_count);
  lse.download(run.lse.data(), lse_count * 4);
  return run;
}

// JITATTN_TEST_REPEAT=N (default 0): how many more times launch_repeated
// launches each call. A race between warps or CTAs shows up as repeats that
// differ long before it shows up as an error past the tolerance.
int repeat_launches();
// "" when the two reads are the same bit for bit, else the first element
// that differs, with both values.
std::string first_difference(const char* what, const std::vector<float>& first, const std::vector<float>& again);
// Runs launch() 1 + repeat_launches() times. launch() poisons the call's
// outputs (and workspace), launches, and returns what it read back (a struct
// with `out` and `lse`). Every repeat must reproduce the first read bit for
// bit; `mismatch` gets the first that does not. Returns the first read.
template <typename Launch>
auto launch_repeated(Launch&& launch, std::string& mismatch) -> decltype(launch()) {
  auto first = launch();
  for (int repeat = 1; repeat <= repeat_launches() && mismatch.empty(); ++repeat) {
    const auto again = launch();
    std::string difference = first_difference("out", first.out, again.out);
    if (difference.empty()) difference = first_difference("lse", first.lse, again.lse);
    if (!difference.empty()) mismatch = "launch " + std::to_string(repeat + 1) + " of the same call: " + difference;
  }
  return first;
}

// Compiles (or finds in the cache) every spec, in parallel, so tests are not
// serialized behind NVRTC. Returns one message per failure.
std::vector<std::string> warm_all(Runtime& runtime, const std::vector<std::string>& specs, const std::string& arch);
// warm_all on the GPU tests' runtime for the current device, failing the test
// case once per kernel that does not build.
void warm_or_fail(const std::vector<std::string>& specs);
// warm_or_fail for the distinct kernels a list of cases plans: spec_of(case)
// is the spec text, or "" for a case whose call is meant to be rejected.
template <class Cases, class SpecOf>
void warm_cases(const Cases& cases, SpecOf&& spec_of) {
  std::set<std::string> unique;
  for (const auto& c : cases) {
    std::string spec = spec_of(c);
    if (!spec.empty()) unique.insert(std::move(spec));
  }
  warm_or_fail(std::vector<std::string>(unique.begin(), unique.end()));
}

// max |values − reference|; a NaN counts as infinity.
double max_deviation(const std::vector<double>& reference, const std::vector<float>& values);
double max_deviation(const std::vector<double>& reference, const std::vector<double>& values);

// A kernel's output judged against the references, FlashAttention's way:
// max |out − exact| ≤ 2 · max |out16 − exact| + 1e-5; lse within fp32
// rounding (1e-3 · max(1, |lse|)), or within 2 × the 16-bit reference's
// largest LSE error + 1e-4, or, where the kernel rounds its inputs itself
// (RoPE rotates q and k to 16 bits, so a row with one key has an LSE off by
// that rounding), within 2 × rounded.logit_rounding + 1e-4: an LSE moves by
// at most the largest change of its logits, and the kernel's rounding to the
// same 16 bits makes changes of the reference's size, but not the same ones
// (run 278: a row seeing one key was off by exactly the bound; FlashAttention's
// factor 2 covers that), while a position off by one moves the LSE 5-50 times
// the bound (test_reference.cpp); every output finite, and rows that see no
// key (exact lse = -inf) exactly 0 with lse -inf.
struct Verdict {
  size_t non_finite = 0;         // outputs NaN/inf (unwritten or overflowed)
  double error = 0;              // max |out − exact|
  double yardstick = 0;          // max |out16 − exact|
  size_t lse_off = 0;            // lse values outside tolerance
  size_t empty_rows_nonzero = 0; // rows with no visible key whose output is not 0
  bool ok() const;
  std::string summary() const;
};
// out: [batch, seqlen_q, heads_q, value_dim] contiguous; lse: [batch, heads_q,
// seqlen_q] or empty (not checked).
Verdict judge(const AttentionShape& shape, const std::vector<float>& out, const std::vector<float>& lse,
              const ReferenceOutput& exact, const ReferenceOutput& rounded);
// judge() for a varlen call over the rows the sequences own (padding rows past
// cu_seqlens_q[batch] excluded: check their poison separately). out: [total_q,
// heads_q, value_dim] contiguous; lse: [heads_q, total_q] contiguous or empty;
// references from attention_varlen*.
Verdict judge_varlen(const VarlenShape& shape, const std::vector<float>& out, const std::vector<float>& lse,
                     const ReferenceOutput& exact, const ReferenceOutput& rounded);


// The two references a case is judged against, or why they failed.
struct References {
  ReferenceOutput exact;
  ReferenceOutput rounded;
  std::string error;
};

// (row, head) pairs that see no key, by the exact reference's lse; rows the
// reference leaves NaN (varlen padding) do not count.
size_t count_empty_rows(const ReferenceOutput& exact);

// Learnable sink logits for `heads` query heads: uniform in [-2, 4], except
// that head 0's is 6, above nearly every row's scores (the sink then takes
// most of the softmax, so a kernel that dropped it is far off), and with
// four heads or more head 1's is -inf (the same as no sink).
std::vector<float> random_sinks(int heads, std::mt19937_64& rng);

// The start every case check shares: a reference that failed, or a kernel
// run that threw, is reported with the case's description (describe() is
// called only then) and leaves nothing to judge.
template <typename Describe, typename Run>
auto run_case(const References& references, Describe&& describe, Run&& run) -> std::optional<decltype(run())> {
  if (!references.error.empty()) {
    FAIL_CHECK(std::string(describe() + ": reference: " + references.error));
    return std::nullopt;
  }
  try {
    return run();
  } catch (const std::exception& e) {
    FAIL_CHECK(std::string(describe() + ": " + e.what()));
    return std::nullopt;
  }
}

// Checks cases in groups of up to 16: fresh inputs for each
// (make_inputs(case)), both references (references(case, inputs); CPU ones on
// worker threads, GPU ones, case.gpu_reference, here where the context is
// current), then check(case, inputs, references) in order on this thread,
// since doctest's assertions are not thread-safe. Returns, per case, how many
// (row, head) pairs see no key.
template <typename Case, typename MakeInputs, typename MakeReferences, typename Check>
std::vector<size_t> check_in_groups(const std::vector<Case>& cases, MakeInputs&& make_inputs,
                                    MakeReferences&& references, Check&& check) {
  using Inputs = decltype(make_inputs(cases.front()));
  std::vector<size_t> empty_rows;
  const size_t group = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (size_t start = 0; start < cases.size(); start += group) {
    const size_t count = std::min(group, cases.size() - start);
    std::vector<Inputs> inputs;
    for (size_t i = 0; i < count; ++i) inputs.push_back(make_inputs(cases[start + i]));
    std::vector<References> refs(count);
    std::vector<std::thread> workers;
    for (size_t i = 0; i < count; ++i) {
      auto compute = [&, i] {
        try {
          refs[i] = references(cases[start + i], inputs[i]);
        } catch (const std::exception& e) {
          refs[i].error = e.what();
        }
      };
      if (cases[start + i].gpu_reference) {
        compute();
      } else {
        workers.emplace_back(compute);
      }
    }
    for (auto& worker : workers) worker.join();
    for (size_t i = 0; i < count; ++i) {
      empty_rows.push_back(count_empty_rows(refs[i].exact));
      check(cases[start + i], inputs[i], refs[i]);
    }
  }
  return empty_rows;
}

}  // namespace jitattn::test
