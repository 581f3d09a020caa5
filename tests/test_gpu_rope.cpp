// Fused RoPE, packed GQA and split-KV dense calls on a GPU. RoPE is checked against
// rotate-then-attend: the references rotate q and k on the host (float64 for
// the exact one; fp32 angles and arithmetic, rounded to 16 bits, for the
// yardstick) and then run plain attention. Packed GQA (the query heads of a KV
// head sharing tiles) is checked against the same references as the unpacked
// kernel, with every mask and score modifier. Inputs are fresh random values
// every run (the seed is printed with every failure); outputs are poisoned
// (0xff) first.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "spec.hpp"

using namespace jitattn;
using namespace jitattn::test;

namespace {

enum class Angles { theta, linear, llama3, tables, yarn, longrope };
enum class Offsets { none, keys, both };

struct Case {
  AttentionShape shape;
  DType dtype = DType::bf16;
  bool rope = true;
  RopeReference rotation;
  Angles angles = Angles::theta;
  Offsets offsets = Offsets::none;
  std::optional<bool> pack_gqa;
  bool heads_major = false;  // q/k/v as [batch, heads, seqlen, head_dim] storage
  TileConfig tiles;          // forced tiles (zeros: the planner's)
  int sm_limit = 0;          // ForwardOptions::sm_limit (persistent grids)
  bool gpu_reference = false;  // unused: RoPE references are CPU ones (check_in_groups wants the field)
  // Tables stored with a NaN between rows: a row stride that is not a
  // multiple of 16 bytes (the kernels' pair-by-pair table loads).
  bool table_gap = false;
  // Tables in q's dtype (FlashAttention's rotary_cos / rotary_sin), not f32.
  bool tables16 = false;
  // Table rows (0: every position the call reaches, and 3001 more). Fewer
  // leave the last positions past the tables, which read their last row.
  int table_positions = 0;
  // Set: the forward overload with a workspace (sized by
  // forward_workspace_bytes, poisoned), options.num_splits = the value.
  std::optional<int> num_splits;
};

const char* angles_name(Angles a) {
  switch (a) {
    case Angles::theta: return "theta";
    case Angles::linear: return "theta+linear";
    case Angles::llama3: return "theta+llama3";
    case Angles::tables: return "tables";
    case Angles::yarn: return "theta+yarn";
    case Angles::longrope: return "theta+longrope";
  }
  return "?";
}

std::string describe(const Case& c, const std::string& spec, uint64_t seed) {
  const auto& s = c.shape;
  return fmt::format(
      "{} {} batch={} seqlen_q={} seqlen_k={} heads={}/{} head_dim={} head_dim_v={} causal={} window=({}, {}) "
      "softcap={} alibi={} rope={} rotary_dim={} angles={} offsets={} pack_gqa={} heads_major={} sm_limit={} "
      "num_splits={} seed={}",
      spec.empty() ? "(no spec)" : spec, c.dtype == DType::bf16 ? "bf16" : "f16", s.batch, s.seqlen_q, s.seqlen_k,
      s.heads_q, s.heads_kv, s.head_dim, s.value_dim(), s.causal, s.window_left, s.window_right, s.softcap, !s.alibi_slopes.empty(),
      !c.rope ? "off" : c.rotation.style == RopeStyle::rotate_half ? "rotate_half" : "interleaved",
      c.rotation.rotary_dim,
      fmt::format("{}{}{}{}", angles_name(c.angles), c.tables16 ? "(16-bit)" : "", c.table_gap ? "+gap" : "",
                  c.table_positions > 0 ? fmt::format(" of {} rows", c.table_positions) : ""),
      static_cast<int>(c.offsets),
      c.pack_gqa ? (*c.pack_gqa ? "on" : "off") : "auto", c.heads_major, c.sm_limit,
      c.num_splits ? fmt::format("{}", *c.num_splits) : "(no workspace)", seed);
}

struct Inputs {
  std::vector<float> q, k, v;
  std::unique_ptr<DeviceTensor> dq, dk, dv;
  RopeTables tables;
  std::vector<int> q_offsets, k_offsets;
  std::unique_ptr<DeviceBuffer> cos, sin, dq_offsets, dk_offsets, slopes;
};

std::unique_ptr<DeviceBuffer> upload(const void* data, size_t bytes) {
  auto buffer = std::make_unique<DeviceBuffer>(bytes);
  buffer->upload(data, bytes);
  return buffer;
}

Inputs make_inputs(const Case& c, std::mt19937_64& rng) {
  const auto& s = c.shape;
  const int64_t q_shape[4] = {s.batch, s.seqlen_q, s.heads_q, s.head_dim};
  const int64_t kv_shape[4] = {s.batch, s.seqlen_k, s.heads_kv, s.head_dim};
  const int64_t v_shape[4] = {s.batch, s.seqlen_k, s.heads_kv, s.value_dim()};
  int64_t q_strides[4], kv_strides[4], v_strides[4];
  if (c.heads_major) {
    heads_major_strides(q_shape, q_strides);
    heads_major_strides(kv_shape, kv_strides);
    heads_major_strides(v_shape, v_strides);
  } else {
    padded_strides(q_shape, q_strides);
    padded_strides(kv_shape, kv_strides);
    padded_strides(v_shape, v_strides);
  }
  Inputs in;
  in.q = random_values(static_cast<size_t>(s.batch) * s.seqlen_q * s.heads_q * s.head_dim, c.dtype, rng);
  in.k = random_values(static_cast<size_t>(s.batch) * s.seqlen_k * s.heads_kv * s.head_dim, c.dtype, rng);
  in.v = random_values(static_cast<size_t>(s.batch) * s.seqlen_k * s.heads_kv * s.value_dim(), c.dtype, rng);
  in.dq = std::make_unique<DeviceTensor>(in.q, c.dtype, q_shape, q_strides);
  in.dk = std::make_unique<DeviceTensor>(in.k, c.dtype, kv_shape, kv_strides);
  in.dv = std::make_unique<DeviceTensor>(in.v, c.dtype, v_shape, v_strides);
  std::uniform_int_distribution<int> offset(0, 3000);
  if (c.offsets != Offsets::none) {
    for (int b = 0; b < s.batch; ++b) in.k_offsets.push_back(offset(rng));
    in.dk_offsets = upload(in.k_offsets.data(), in.k_offsets.size() * 4);
  }
  if (c.offsets == Offsets::both) {
    for (int b = 0; b < s.batch; ++b) in.q_offsets.push_back(offset(rng));
    in.dq_offsets = upload(in.q_offsets.data(), in.q_offsets.size() * 4);
  }
  if (c.rope && c.angles == Angles::tables) {
    in.tables = rope_tables(c.rotation, s.head_dim,
                            c.table_positions > 0 ? c.table_positions : s.seqlen_k + s.seqlen_q + 3001);
    if (c.tables16) round_tables(in.tables, c.dtype);
    const int stride = in.tables.pairs + (c.table_gap ? 1 : 0);
    auto stored = [&](const std::vector<float>& table) {
      std::vector<float> rows(static_cast<size_t>(in.tables.positions) * stride, std::nanf(""));
      for (int position = 0; position < in.tables.positions; ++position) {
        std::copy_n(table.begin() + static_cast<size_t>(position) * in.tables.pairs, in.tables.pairs,
                    rows.begin() + static_cast<size_t>(position) * stride);
      }
      return rows;
    };
    const std::vector<unsigned char> cos_bytes = table_bytes(stored(in.tables.cos), in.tables.dtype);
    const std::vector<unsigned char> sin_bytes = table_bytes(stored(in.tables.sin), in.tables.dtype);
    in.cos = upload(cos_bytes.data(), cos_bytes.size());
    in.sin = upload(sin_bytes.data(), sin_bytes.size());
  }
  if (!s.alibi_slopes.empty()) in.slopes = upload(s.alibi_slopes.data(), s.alibi_slopes.size() * 4);
  return in;
}

// Views the options point at; they live as long as the call.
struct CallViews {
  TensorView cos, sin, q_offsets, k_offsets, slopes;
  std::vector<float> longrope_pair_factors;
  ForwardOptions options;
};

void fill_options(const Case& c, const Inputs& in, CallViews& views) {
  const auto& s = c.shape;
  ForwardOptions& o = views.options;
  o.causal = s.causal;
  o.window_left = s.window_left;
  o.window_right = s.window_right;
  o.softcap = s.softcap;
  o.pack_gqa = c.pack_gqa;
  o.tiles = c.tiles;
  o.sm_limit = c.sm_limit;
  if (in.slopes) {
    views.slopes = TensorView::contiguous(in.slopes->get(), DType::f32, {s.heads_q});
    o.alibi_slopes = &views.slopes;
  }
  if (!c.rope) return;
  RopeOptions& r = o.rope;
  c.rotation.set_options(r, views.longrope_pair_factors);
  if (in.cos) {
    views.cos = TensorView::contiguous(in.cos->get(), in.tables.dtype, {in.tables.positions, in.tables.pairs});
    views.sin = TensorView::contiguous(in.sin->get(), in.tables.dtype, {in.tables.positions, in.tables.pairs});
    if (c.table_gap) views.cos.strides[0] = views.sin.strides[0] = in.tables.pairs + 1;
    r.cos = &views.cos;
    r.sin = &views.sin;
  }
  if (in.dk_offsets) {
    views.k_offsets = TensorView::contiguous(in.dk_offsets->get(), DType::i32, {s.batch});
    r.k_offsets = &views.k_offsets;
  }
  if (in.dq_offsets) {
    views.q_offsets = TensorView::contiguous(in.dq_offsets->get(), DType::i32, {s.batch});
    r.q_offsets = &views.q_offsets;
  }
}

References make_references(const Case& c, const Inputs& in) {
  References r;
  const auto& s = c.shape;
  if (!c.rope) {
    r.exact = attention_exact(s, in.q, in.k, in.v);
    r.rounded = attention_16bit(s, in.q, in.k, in.v, c.dtype);
    return r;
  }
  auto key_position = [&](int b, int j) { return j + (in.k_offsets.empty() ? 0 : in.k_offsets[b]); };
  auto query_position = [&](int b, int i) {
    if (!in.q_offsets.empty()) return i + in.q_offsets[b];
    return i + s.seqlen_k - s.seqlen_q + (in.k_offsets.empty() ? 0 : in.k_offsets[b]);
  };
  const RopeTables* tables = c.angles == Angles::tables ? &in.tables : nullptr;
  std::vector<float> q[2] = {in.q, in.q}, k[2] = {in.k, in.k};  // [0] exact, [1] rounded
  for (bool exact : {true, false}) {
    rotate_reference(q[!exact], s.batch, s.seqlen_q, s.heads_q, s.head_dim, c.rotation, tables, query_position, exact,
                     c.dtype);
    // forward() rotates K in packed 16-bit arithmetic (RopeOptions): the
    // 16-bit reference does too.
    rotate_reference(k[!exact], s.batch, s.seqlen_k, s.heads_kv, s.head_dim, c.rotation, tables, key_position, exact,
                     c.dtype, /*packed16=*/true);
  }
  r.exact = attention_exact(s, q[0], k[0], in.v);
  r.rounded = attention_16bit(s, q[1], k[1], in.v, c.dtype);
  r.rounded.logit_rounding = logit_rounding(s, q[0], k[0], q[1], k[1]);
  return r;
}

struct KernelRun {
  std::vector<float> out, lse;
  std::string spec;
  size_t workspace_bytes = 0;  // with a workspace: what forward_workspace_bytes asked for
  std::string repeat_mismatch;  // launch_repeated: a repeat that read back other bits
};

KernelRun run_kernel(const Case& c, const Inputs& in) {
  const auto& s = c.shape;
  const int64_t out_shape[4] = {s.batch, s.seqlen_q, s.heads_q, s.value_dim()};
  int64_t out_strides[4];
  contiguous_strides(out_shape, out_strides);
  DeviceTensor out(c.dtype, out_shape, out_strides);
  const size_t lse_count = static_cast<size_t>(s.batch) * s.heads_q * s.seqlen_q;
  DeviceBuffer lse(lse_count * 4);
  const TensorView lse_view = TensorView::contiguous(lse.get(), DType::f32, {s.batch, s.heads_q, s.seqlen_q});
  CallViews views;
  fill_options(c, in, views);
  const std::string spec = gpu_tests_runtime().spec_for(in.dq->view(), in.dk->view(), in.dv->view(), out.view(),
                                                        &lse_view, views.options);
  size_t workspace_bytes = 0;
  if (c.num_splits) {
    views.options.num_splits = *c.num_splits;
    workspace_bytes = gpu_tests_runtime().forward_workspace_bytes(in.dq->view(), in.dk->view(), in.dv->view(),
                                                                  out.view(), &lse_view, views.options);
  }
  DeviceBuffer workspace(std::max<size_t>(workspace_bytes, 256));
  std::string mismatch;
  KernelRun run = launch_repeated(
      [&] {
        out.buffer.fill_bytes(0xff);
        lse.fill_bytes(0xff);
        workspace.fill_bytes(0xff);
        if (c.num_splits) {
          gpu_tests_runtime().forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), &lse_view,
                                      views.options, workspace_bytes > 0 ? workspace.get() : nullptr, workspace_bytes,
                                      nullptr);
        } else {
          gpu_tests_runtime().forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), &lse_view,
                                      views.options, nullptr);
        }
        return read_outputs<KernelRun>(out, lse, lse_count);
      },
      mismatch);
  // spec_for plans without a workspace: the kernel that ran is that one, split.
  run.spec = workspace_bytes > 0 ? spec + " (with .split)" : spec;
  run.workspace_bytes = workspace_bytes;
  run.repeat_mismatch = std::move(mismatch);
  return run;
}

void check_cases(const std::vector<Case>& cases, std::mt19937_64& rng, uint64_t seed,
                 const std::function<void(const Case&, const KernelRun&)>& extra = {}) {
  check_in_groups(
      cases, [&](const Case& c) { return make_inputs(c, rng); }, make_references,
      [&](const Case& c, const Inputs& in, const References& r) {
        const auto ran = run_case(r, [&] { return describe(c, "", seed); }, [&] { return run_kernel(c, in); });
        if (!ran) return;
        const auto& run = *ran;
        const Verdict verdict = judge(c.shape, run.out, run.lse, r.exact, r.rounded);
        CHECK_MESSAGE(verdict.ok(), fmt::format("{}: {}", describe(c, run.spec, seed), verdict.summary()));
        if (!run.repeat_mismatch.empty()) FAIL_CHECK(std::string(describe(c, run.spec, seed) + ": " + run.repeat_mismatch));
        if (extra) extra(c, run);
      });
}

// FlashAttention's test rule: rotary_dim = floor(fraction · head_dim / 16) · 16.
int rotary_dim_for(double fraction, int head_dim) { return static_cast<int>(fraction * head_dim) / 16 * 16; }

}  // namespace

TEST_SUITE("gpu") {

TEST_CASE("rope: both styles, rotary fractions 0.5 and 1, theta / linear / Llama 3.1 / tables, with offsets") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const std::pair<int, int> seqlens[] = {{113, 203}, {128, 217}, {1, 239}, {3, 799}, {256, 512}, {1024, 1024}};
  // 59: element-wise rows (KernelSpec::unaligned_dim), rotary dims 16 and 48.
  const int head_dims[] = {64, 128, 96, 80, 256, 32, 59};
  const Angles angle_kinds[] = {Angles::theta, Angles::tables, Angles::llama3, Angles::linear};
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (RopeStyle style : {RopeStyle::rotate_half, RopeStyle::interleaved}) {
      for (double fraction : {1.0, 0.5}) {
        for (Offsets offsets : {Offsets::none, Offsets::keys, Offsets::both}) {
          for (int variant = 0; variant < 2; ++variant, ++index) {
            const auto& [seqlen_q, seqlen_k] = seqlens[index % 6];
            const int head_dim = head_dims[index % 7];
            Case c;
            c.dtype = dtype;
            c.shape = AttentionShape::dense(seqlen_q >= 1024 ? 1 : 2, seqlen_q, seqlen_k, 6, index % 3 == 0 ? 6 : 2, head_dim,
                                 index % 2 == 0);
            if (index % 7 == 3) c.shape.window_left = 50;
            c.rotation.style = style;
            c.rotation.rotary_dim = rotary_dim_for(fraction, head_dim);
            c.angles = angle_kinds[index % 4];
            c.table_gap = c.angles == Angles::tables && index / 4 % 2 == 1;
            c.tables16 = c.angles == Angles::tables && index / 8 % 2 == 1;
            if (c.angles == Angles::linear) c.rotation.linear_scaling = 4.0;
            if (c.angles == Angles::llama3) {
              c.rotation.theta = 500000.0;
              c.rotation.llama3_factor = 8.0;
              c.rotation.llama3_original_max_position = 512;  // the smooth band falls inside these positions
            }
            c.offsets = offsets;
            if (index % 5 == 0) c.pack_gqa = true;
            c.heads_major = index % 4 == 1;
            cases.push_back(c);
          }
        }
      }
    }
  }
  // RoPE changes the answer: the same inputs without it differ.
  {
    const Case& c = cases.front();
    const Inputs in = make_inputs(c, rng);
    const References rotated = make_references(c, in);
    const ReferenceOutput plain = attention_exact(c.shape, in.q, in.k, in.v);
    CHECK_MESSAGE(max_deviation(plain.out, rotated.exact.out) > 0.05, describe(c, "rope sanity", seed));
  }
  check_cases(cases, rng, seed, [&](const Case& c, const KernelRun& run) {
    const std::string style = c.rotation.style == RopeStyle::rotate_half ? "rope_half" : "rope_interleaved";
    CHECK_MESSAGE(run.spec.find(fmt::format(".{}_r{}", style, c.rotation.rotary_dim)) != std::string::npos, run.spec);
    CHECK((run.spec.find(".rope_tables") != std::string::npos) == (c.angles == Angles::tables));
    CHECK((run.spec.find(".rope_tables16") != std::string::npos) == c.tables16);
  });
}

// Case `index` of the producer-layout grids at `head_dim`: lengths, masks,
// score modifiers, RoPE settings and layouts cycle with the index at
// different periods. Long causal and windowed cases make the warps of one
// tile see different block ranges, short ones end mid-tile.
Case producer_grid_case(int index, int head_dim, bool rope) {
  const std::pair<int, int> seqlens[] = {{113, 203}, {1024, 1024}, {300, 1500}, {1, 239}, {700, 600}, {256, 512}};
  const auto& [seqlen_q, seqlen_k] = seqlens[index % 6];
  Case c;
  c.dtype = index % 3 == 0 ? DType::f16 : DType::bf16;
  c.shape = AttentionShape::dense(seqlen_q >= 1024 ? 1 : 2, seqlen_q, seqlen_k, 6, index % 3 == 0 ? 6 : 2, head_dim,
                                  index % 4 != 3);
  if (index % 8 == 3) c.shape.window_left = 100, c.shape.window_right = 30;
  if (index % 5 == 2) c.shape.softcap = 50.f;
  if (index % 7 == 2) c.shape.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f};
  c.rotation.style = index % 2 == 0 ? RopeStyle::rotate_half : RopeStyle::interleaved;
  c.rotation.rotary_dim = rotary_dim_for(index % 4 == 1 ? 0.5 : 1.0, head_dim);
  c.rope = rope && c.rotation.rotary_dim > 0;
  c.angles = index % 7 == 4 ? Angles::tables : Angles::theta;
  c.table_gap = c.angles == Angles::tables && index % 2 == 1;
  c.tables16 = c.angles == Angles::tables && index % 3 == 0;
  c.offsets = index % 3 == 1 ? Offsets::both : Offsets::none;
  if (index % 5 == 4) c.pack_gqa = true;
  c.heads_major = index % 4 == 2;
  return c;
}

// A tile family of the scaled-angle cases (YaRN, LongRoPE): forced tiles
// (zeros: the planner's), wgmma ones on sm_90a only; rotary_dim 0 keeps
// producer_grid_case's.
struct ScaledFamily {
  int head_dim, rotary_dim;
  TileConfig tiles;
  bool hopper_only;
};

// Two cases a family (producer_grid_case's shapes and masks, no tables),
// `set(case, index, i)` filling in the angles; case `index` counts over all.
template <class Set>
std::vector<Case> scaled_family_cases(const std::vector<ScaledFamily>& families, Set&& set) {
  const bool hopper = current_arch() == "sm_90a";
  std::vector<Case> cases;
  int index = 0;
  for (const ScaledFamily& family : families) {
    if (family.hopper_only && !hopper) continue;
    for (int i = 0; i < 2; ++i, ++index) {
      Case c = producer_grid_case(index, family.head_dim, true);
      c.tiles = family.tiles;
      c.table_gap = c.tables16 = false;
      if (family.rotary_dim != 0) c.rotation.rotary_dim = family.rotary_dim;
      if (family.tiles.persistent) c.sm_limit = 1 + index % 3;
      set(c, index, i);
      cases.push_back(c);
    }
  }
  return cases;
}

// A scaled-angle run's kernel: .rope_scaled exactly where the attention
// factor is not 1, and the forced tiles where there are some.
void check_scaled_kernel(const Case& c, const KernelRun& run) {
  const bool scaled = c.rotation.attention_factor() != 1.0;
  CHECK_MESSAGE((run.spec.find(".rope_scaled") != std::string::npos) == scaled, run.spec);
  if (c.tiles.block_q != 0) {
    CHECK_MESSAGE(run.spec.find(fmt::format(".br{}.bc{}.w{}", c.tiles.block_q, c.tiles.block_kv, c.tiles.warps)) !=
                      std::string::npos, run.spec);
  }
}

TEST_CASE("producer layout (sN): RoPE and plain, both styles, masks, softcap, ALiBi, GQA packing, head dims 32-128") {
  // The producer warpgroup copies (and rotates) every K/V block; the MMA
  // warps skip the blocks their own rows cannot see, and 2-4 stages wrap the
  // ring at different points.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const int head_dims[] = {64, 128, 32, 96, 64, 128};
  std::vector<Case> cases;
  for (int index = 0; index < 24; ++index) {
    Case c = producer_grid_case(index, head_dims[(index / 6 + index) % 6], index % 6 != 5);
    c.tiles = {index % 4 == 0 ? 128 : 256, 64, 8, 2 + index % 3};
    cases.push_back(c);
  }
  check_cases(cases, rng, seed, [&](const Case& c, const KernelRun& run) {
    CHECK_MESSAGE(run.spec.find(fmt::format(".w8.s{}", c.tiles.stages)) != std::string::npos, run.spec);
  });
}

TEST_CASE("wgmma (sm_90a): RoPE and plain, both styles, masks, softcap, ALiBi, GQA packing, head dims 32-128") {
  // The producer layout with wgmma warpgroups: Q, K and V in wgmma's panel
  // layout (two panels at head dims 96 and 128), S = Q Kᵀ with N = bc, O with
  // N = head_dim (80 runs padded to 96), block skipping per warpgroup.
  if (!sm90a_or_skip("wgmma")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const int head_dims[] = {128, 64, 96, 32, 80, 128};
  std::vector<Case> cases;
  for (int index = 0; index < 30; ++index) {
    const int head_dim = head_dims[(index / 6 + index) % 6];
    Case c = producer_grid_case(index, head_dim, index % 3 != 2);
    const int block_kv = index % 3 == 0 ? 64 : 128;
    // Two 64 KB stages fill shared memory at head dims above 64 with 128 keys.
    const int stages = head_dim > 64 && block_kv == 128 ? 2 : 2 + index % 3;
    c.tiles = {128, block_kv, 8, stages, true};
    cases.push_back(c);
  }
  check_cases(cases, rng, seed, [&](const Case& c, const KernelRun& run) {
    CHECK_MESSAGE(run.spec.find(fmt::format(".w8.s{}.wgmma", c.tiles.stages)) != std::string::npos, run.spec);
  });
}

TEST_CASE("wgmma above head dim 128 (sm_90a): 192 and 256, padded 136-248, RoPE and plain, masks, GQA packing") {
  // O takes one wgmma per 128 columns (192: then 64), over V's 3-4 panels;
  // 160, 200, 224 and 248 run padded on the 192- and 256-wide tiles (the
  // tensor copies zero-fill their last panel). RoPE: K lands by tensor
  // copies and the 24-register producer rotates it in runs that split the
  // block evenly, with threads left idle where the rotary dim does not
  // split 128 (192, 96; ProducerKeyPieces); tables rotate row by row.
  if (!sm90a_or_skip("wgmma")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const int head_dims[] = {256, 192, 160, 224, 248, 136};
  std::vector<Case> cases;
  for (int index = 0; index < 24; ++index) {
    const int head_dim = head_dims[(index / 6 + index) % 6];
    Case c = producer_grid_case(index, head_dim, /*rope=*/index % 3 != 2);
    // Key blocks of 64 (three stages too at 192), 80 and 96 (the planner's
    // at 256 and 192): S = Q Kᵀ with N = 80 and 96.
    const int kernel_dim = head_dim > 192 ? 256 : 192;
    const int block_kv = kernel_dim == 192 ? (index % 3 == 0 ? 96 : index % 3 == 1 ? 64 : 80) : (index % 2 ? 80 : 64);
    c.tiles = {128, block_kv, 8, block_kv == 64 && kernel_dim == 192 ? 2 + index % 2 : 2, true};
    cases.push_back(c);
  }
  check_cases(cases, rng, seed, [&](const Case& c, const KernelRun& run) {
    const int kernel_dim = c.shape.head_dim > 192 ? 256 : 192;
    CHECK_MESSAGE(run.spec.find(fmt::format("d{}.br128.bc{}.w8.s{}.wgmma", kernel_dim, c.tiles.block_kv,
                                            c.tiles.stages)) != std::string::npos, run.spec);
  });
}

TEST_CASE("value head dims of their own (dvN, DeepSeek's 192/128): RoPE and plain on every prefill tile family") {
  // V and O narrower than Q and K (FwdConfig::kSplitDims), on forced tiles
  // of each family: the 4-warp kernels and the mma.sync producer (V by
  // cp.async in V's own row widths), wgmma tiles with and without RoPE (V
  // by cp.async beside the rotating producer, else by tensor copies of V's
  // panels), persistent (outputs copied out by the producer at V's width),
  // three warpgroups, and head dims above 128, padded q/k among them.
  if (!sm90a_or_skip("wgmma")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  struct Family {
    int head_dim, head_dim_v;
    TileConfig tiles;
  };
  const Family families[] = {
      {128, 64, {128, 64, 4}},                     {64, 32, {256, 64, 8, 3}},
      {128, 64, {128, 128, 8, 2, true}},           {128, 96, {128, 128, 8, 2, true, true}},
      {192, 128, {128, 96, 8, 2, true}},           {256, 192, {128, 80, 8, 2, true}},
      {64, 32, {192, 128, 12, 4, true}},           {160, 128, {128, 96, 8, 2, true}},
      {96, 64, {128, 64, 4}},                      {224, 128, {128, 64, 8, 2, true}},
      {64, 32, {128, 128, 8, 4, true, true}},      {192, 128, {64, 64, 4}}};
  std::vector<Case> cases;
  for (int index = 0; index < 24; ++index) {
    const Family& family = families[index % 12];
    // RoPE on two of every three cases; the mma.sync producer layout is RoPE's.
    const bool rope = index % 3 != 2 || (family.tiles.stages > 0 && !family.tiles.wgmma);
    Case c = producer_grid_case(index, family.head_dim, rope);
    c.shape.head_dim_v = family.head_dim_v;
    c.tiles = family.tiles;
    if (family.tiles.persistent) c.sm_limit = 1 + index % 5;
    cases.push_back(c);
  }
  check_cases(cases, rng, seed, [&](const Case& c, const KernelRun& run) {
    CHECK_MESSAGE(run.spec.find(fmt::format(".dv{}", c.shape.head_dim_v)) != std::string::npos, run.spec);
    CHECK_MESSAGE(run.spec.find(fmt::format(".br{}.bc{}.w{}", c.tiles.block_q, c.tiles.block_kv, c.tiles.warps)) !=
                      std::string::npos, run.spec);
  });
}

TEST_CASE("rope: YaRN's frequencies and attention factor on every tile family that rotates (gpt-oss, DeepSeek V3)") {
  // Frequencies blended between theta's and theta's / factor over a ramp of
  // pairs (host-computed), and cos and sin scaled by the attention factor in
  // every kernel that evaluates angles (rope.cuh, scale_angle): Q rotated in
  // shared memory and in registers, K by the 4-warp kernels, the mma.sync
  // producer and the wgmma producers (stepped angles, re-anchored past 8k
  // keys), head dims above 128 and unaligned rows. An original context of
  // 512 positions puts the ramp's blended pairs inside these calls; an
  // attention factor of exactly 1 (DeepSeek V3's mscale ratio) is the
  // unscaled kernel.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases = scaled_family_cases(
      {{64, 0, {}, false},
       {128, 0, {}, false},
       {128, 0, {128, 64, 4}, false},
       {64, 0, {128, 64, 4}, false},
       {64, 0, {256, 64, 8, 3}, false},
       {128, 0, {128, 128, 8, 2, true}, true},
       {64, 0, {128, 128, 8, 4, true, true}, true},
       {128, 0, {128, 128, 8, 2, true, true}, true},
       {192, 0, {128, 96, 8, 2, true}, true},
       {256, 0, {128, 80, 8, 2, true}, true},
       {64, 0, {192, 128, 12, 2, true}, true},
       {59, 0, {}, false}},
      [](Case& c, int index, int) {
        c.angles = Angles::yarn;
        c.rotation.theta = 150000.0;
        c.rotation.yarn_factor = index % 3 == 2 ? 32.0 : 8.0;
        c.rotation.yarn_original_max_position = 512;
        c.rotation.yarn_truncate = index % 2 == 0;
        c.rotation.yarn_attention_factor = index % 5 == 3 ? 1.0 : index % 5 == 1 ? 1.5 : 0.0;
      });
  // Long calls: keys past 8k, where the producers re-anchor their stepped angles.
  for (int head_dim : {64, 128}) {
    Case c;
    c.dtype = DType::bf16;
    c.shape = AttentionShape::dense(1, 300, 8192, 2, 1, head_dim, true);
    c.rotation.style = head_dim == 64 ? RopeStyle::rotate_half : RopeStyle::interleaved;
    c.rotation.rotary_dim = head_dim;
    c.angles = Angles::yarn;
    c.rotation.theta = 150000.0;
    c.rotation.yarn_factor = 32.0;
    c.rotation.yarn_truncate = false;  // gpt-oss
    c.offsets = Offsets::keys;
    cases.push_back(c);
  }
  check_cases(cases, rng, seed, check_scaled_kernel);
  // The attention factor changes the answer: the same inputs rotated without it differ.
  {
    Case c = cases.front();
    const Inputs in = make_inputs(c, rng);
    const References scaled = make_references(c, in);
    c.rotation.yarn_attention_factor = 1.0;
    const References unscaled = make_references(c, in);
    REQUIRE(cases.front().rotation.attention_factor() > 1.1);
    CHECK_MESSAGE(max_deviation(scaled.exact.out, unscaled.exact.out) > 0.05, describe(c, "yarn sanity", seed));
  }
}

TEST_CASE("rope: LongRoPE's pair factors and attention factor on the prefill tile families (Phi-3.5, Phi-4-mini)") {
  // theta's frequencies divided pair by pair by factors the caller passes
  // (host-computed, like YaRN's), and cos and sin scaled by the attention
  // factor in the same kernels as YaRN's. Phi-3.5's head dim 96 rotated
  // whole, Phi-4-mini's 128 over 96 channels, and the other families that
  // rotate; factors of Phi's long_factor shape (1 to tens) or random ones.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> random_factor(1.0, 30.0);
  std::vector<Case> cases = scaled_family_cases(
      {{96, 96, {}, false},
       {128, 96, {}, false},
       {64, 64, {128, 64, 4}, false},
       {128, 96, {256, 64, 8, 3}, false},
       {128, 96, {128, 128, 8, 2, true, true}, true},
       {64, 64, {128, 128, 8, 4, true, true}, true},
       {96, 96, {128, 128, 8, 2, true}, true}},
      [&](Case& c, int index, int i) {
        c.angles = Angles::longrope;
        c.offsets = index % 2 == 0 ? Offsets::keys : Offsets::none;
        c.rotation.style = RopeStyle::rotate_half;
        const int pairs = c.rotation.rotary_dim / 2;
        for (int p = 0; p < pairs; ++p) {
          c.rotation.longrope_pair_factors.push_back(i == 0 ? 1.0 + 40.0 * p * p / (pairs * pairs) : random_factor(rng));
        }
        c.rotation.longrope_factor = index % 4 == 3 ? 1.0 : 32.0;
        c.rotation.longrope_attention_factor = index % 5 == 1 ? 1.5 : 0.0;
      });
  check_cases(cases, rng, seed, [&](const Case& c, const KernelRun& run) {
    check_scaled_kernel(c, run);
    CHECK_MESSAGE(run.spec.find(fmt::format(".rope_half_r{}", c.rotation.rotary_dim)) != std::string::npos, run.spec);
  });
  // The pair factors change the answer: the same inputs rotated by theta alone differ.
  {
    Case c = cases.front();
    REQUIRE(c.rotation.attention_factor() > 1.1);
    const Inputs in = make_inputs(c, rng);
    const References factored = make_references(c, in);
    c.rotation.longrope_pair_factors.assign(c.rotation.longrope_pair_factors.size(), 1.0);
    const References theta_only = make_references(c, in);
    CHECK_MESSAGE(max_deviation(factored.exact.out, theta_only.exact.out) > 0.05, describe(c, "longrope sanity", seed));
  }
}

TEST_CASE("wgmma with 176-key blocks (sm_90a): no mask and masks, softcap, ALiBi, GQA packing, padded, split") {
  // S = Q Kᵀ with N = 176 (the planner's blocks for long calls at head dim
  // 128, causal or without a mask), beside a 24-register producer that only
  // issues tensor copies. No length below is a multiple of 176, so every
  // tile's first block ends past the keys; 120 and 104 run padded on
  // 128-wide tiles, 96 and 64 on their own. Windows too, which the planner
  // does not give these blocks but a caller may force. Every third case
  // splits its keys into a workspace (3 splits, or the heuristic's).
  if (!sm90a_or_skip("wgmma")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const int head_dims[] = {128, 120, 96, 64, 104, 128};
  std::vector<Case> cases;
  for (int index = 0; index < 24; ++index) {
    const int head_dim = head_dims[(index / 6 + index) % 6];
    Case c = producer_grid_case(index, head_dim, /*rope=*/false);
    if (index % 2 == 0) c.shape.causal = false, c.shape.window_left = c.shape.window_right = -1;
    if (index % 6 == 1) c.shape.seqlen_k = 2500;  // 14.2 blocks
    if (index % 3 == 2) c.num_splits = index % 2 == 0 ? 3 : 0;
    c.tiles = {128, 176, 8, 2, true};
    cases.push_back(c);
  }
  check_cases(cases, rng, seed, [&](const Case& c, const KernelRun& run) {
    CHECK_MESSAGE(run.spec.find(".br128.bc176.w8.s2.wgmma") != std::string::npos, run.spec);
  });
}

TEST_CASE("wgmma with head dims that are not a multiple of 8 (sm_90a): staged rows, RoPE and plain, masks, GQA") {
  // The producer copies the 16-byte blocks that cover each row into staging
  // slots and shifts them into the tiles (FwdConfig::kStagedRows). The
  // layouts' odd strides start rows at every 2-byte offset; 111 and 125 leave
  // whole chunks of the 128-wide tiles past the head dim, 20 and 90 fall in
  // 32- and 96-wide ones; keys cross the 3 staging slots and 2-3 stages (2 above head dim 64).
  if (!sm90a_or_skip("wgmma")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const int head_dims[] = {59, 111, 20, 90, 125, 37};
  std::vector<Case> cases;
  for (int index = 0; index < 24; ++index) {
    const int head_dim = head_dims[(index / 6 + index) % 6];
    Case c = producer_grid_case(index, head_dim, index % 3 != 2);
    // Staging slots and 128-key blocks would not fit in shared memory above 64.
    const int block_kv = head_dim > 64 || index % 3 == 0 ? 64 : 128;
    c.tiles = {128, block_kv, 8, head_dim > 64 ? 2 : 2 + index % 2, true};
    cases.push_back(c);
  }
  check_cases(cases, rng, seed, [&](const Case& c, const KernelRun& run) {
    CHECK_MESSAGE(run.spec.find(fmt::format(".w8.s{}.wgmma", c.tiles.stages)) != std::string::npos, run.spec);
    CHECK_MESSAGE(run.spec.find(fmt::format(".unaligned_d{}", c.shape.head_dim)) != std::string::npos, run.spec);
  });
}

TEST_CASE("wgmma with three warpgroups (sm_90a, 192-row tiles): RoPE and plain, masks, softcap, ALiBi, GQA packing") {
  // Three MMA warpgroups and a producer left 32 or 72 registers
  // (FwdConfig::kProducerRegisters); 192 rows per tile end mid-tile at every length below, and block
  // skipping happens per warpgroup, so the third group often sees a
  // different block range from the first two.
  if (!sm90a_or_skip("wgmma")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const int head_dims[] = {64, 128, 32, 96, 80, 64};
  std::vector<Case> cases;
  for (int index = 0; index < 24; ++index) {
    const int head_dim = head_dims[(index / 6 + index) % 6];
    Case c = producer_grid_case(index, head_dim, index % 3 != 2);
    // 96 accumulators at most: 128 keys a block up to head_dim 64, 64 above.
    const int block_kv = head_dim > 64 || index % 4 == 3 ? 64 : 128;
    c.tiles = {192, block_kv, 12, 2 + index % 3, true};
    cases.push_back(c);
  }
  check_cases(cases, rng, seed, [&](const Case& c, const KernelRun& run) {
    CHECK_MESSAGE(run.spec.find(fmt::format(".br192.bc{}.w12.s{}", c.tiles.block_kv, c.tiles.stages)) !=
                      std::string::npos, run.spec);
  });
}

TEST_CASE("persistent wgmma (sm_90a): CTAs walking many tiles, RoPE and plain, masks, softcap, ALiBi, GQA packing") {
  // A persistent CTA walks tiles of different heads, batches and key ranges
  // (empty ones too: windows, a query block past seqlen_q) through one ring:
  // stages wrap across tiles, the two Q buffers alternate, and the producer
  // runs a tile ahead. Limiting the grid to 1-7 CTAs gives each CTA many
  // tiles on small shapes; the last cases have more tiles than the GPU has
  // SMs.
  if (!sm90a_or_skip("persistent wgmma")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const int head_dims[] = {128, 64, 96, 32, 80, 64};
  const int sm_limits[] = {1, 3, 7, 2, 0};
  std::vector<Case> cases;
  for (int index = 0; index < 30; ++index) {
    const int head_dim = head_dims[(index / 6 + index) % 6];
    Case c = producer_grid_case(index, head_dim, index % 3 != 2);
    c.sm_limit = sm_limits[index % 5];
    if (index % 6 == 4 && !c.rope && head_dim <= 64) {
      c.tiles = {192, 128, 12, 4, true, true};  // three MMA warpgroups (the planner's tiles without RoPE)
    } else {
      const int block_kv = index % 3 == 0 ? 64 : 128;
      // Two Q tiles and two 64 KB stages fill shared memory at head dims
      // above 64 with 128 keys.
      const int stages = head_dim > 64 && block_kv == 128 ? 2 : 2 + index % 3;
      c.tiles = {128, block_kv, 8, stages, true, true};
    }
    cases.push_back(c);
  }
  for (int head_dim : {128, 64}) {
    // 2 · 6 · 16 = 192 tiles of 128 rows, causal: more than 132 CTAs.
    Case c;
    c.shape = AttentionShape::dense(2, 2048, 2048, 6, 2, head_dim, true);
    c.rotation.style = RopeStyle::rotate_half;
    c.rotation.rotary_dim = head_dim;
    c.tiles = {128, 128, 8, head_dim > 64 ? 2 : 4, true, true};
    cases.push_back(c);
    c.rope = false;
    cases.push_back(c);
  }
  check_cases(cases, rng, seed, [&](const Case& c, const KernelRun& run) {
    CHECK_MESSAGE(run.spec.find(fmt::format(".w{}.s{}.wgmma.persistent", c.tiles.warps, c.tiles.stages)) !=
                      std::string::npos, run.spec);
  });
}

TEST_CASE("rope: tables staged beside K (sm_90a): 16-bit and f32, table slots, persistent, blocks past the tables, gaps") {
  // wgmma kernels at head dims 65-128 whose producer rotates K copy each
  // block's cos and sin rows into a table slot by tensor copies
  // (KernelSpec::rope_table_slots: 16-bit rows two beside two stages, three
  // beside three 64-key stages, one beside a persistent kernel's second Q
  // tile; f32 rows one beside two stages). Blocks
  // whose positions run past the tables (short tables, offsets) and tables
  // with a gap between rows (no map) take the loads from L2 in the same
  // kernels; persistent CTAs limited to 1-3 SMs walk many tiles through the
  // slots.
  if (!sm90a_or_skip("staged RoPE tables")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const std::pair<int, int> seqlens[] = {{113, 203}, {1024, 1024}, {300, 1500}, {256, 512}, {700, 600}};
  const int head_dims[] = {128, 96, 80, 128};
  std::vector<Case> cases;
  for (int index = 0; index < 18; ++index) {
    const auto& [seqlen_q, seqlen_k] = seqlens[index % 5];
    const int head_dim = head_dims[index % 4];
    Case c;
    c.dtype = index % 3 == 2 ? DType::f16 : DType::bf16;
    c.shape = AttentionShape::dense(seqlen_q >= 1024 ? 1 : 2, seqlen_q, seqlen_k, 6, index % 2 == 0 ? 6 : 2, head_dim,
                                    index % 4 != 1);
    if (index % 7 == 3) c.shape.window_left = 100, c.shape.window_right = 30;
    if (index % 5 == 2) c.shape.softcap = 50.f;
    c.rotation.style = index % 2 == 0 ? RopeStyle::rotate_half : RopeStyle::interleaved;
    c.rotation.rotary_dim = rotary_dim_for(index % 4 == 2 ? 0.5 : 1.0, head_dim);
    c.angles = Angles::tables;
    // f32 tables too (twice the bytes: one slot beside two 128-key stages),
    // not in the persistent cases, where they do not fit.
    c.tables16 = index % 3 == 0 || index % 4 >= 2;
    c.table_gap = index % 6 == 5;
    c.offsets = index % 3 == 0 ? Offsets::none : index % 3 == 1 ? Offsets::keys : Offsets::both;
    // Past the tables: forward() refuses tables shorter than the positions
    // it knows, but not those of offsets (device memory), which here move
    // the last blocks past 17 rows more than the lengths need.
    if (index % 4 == 3) {
      c.table_positions = seqlen_k + seqlen_q + 17;
      if (c.offsets == Offsets::none) c.offsets = Offsets::keys;
    }
    // With tables, queries before the keys' start need their own offsets.
    if (seqlen_q > seqlen_k) c.offsets = Offsets::both;
    c.heads_major = index % 5 == 4;
    if (index % 3 == 0) {
      c.tiles = {128, 128, 8, 2, true, true};
      c.sm_limit = index % 2 == 0 ? 1 : 3;
    } else {
      c.tiles = index % 3 == 1 ? TileConfig{128, 128, 8, 2, true} : TileConfig{128, 64, 8, 3, true};
    }
    cases.push_back(c);
  }
  check_cases(cases, rng, seed, [&](const Case& c, const KernelRun& run) {
    CHECK_MESSAGE(run.spec.find(fmt::format(".bc{}.w8.s{}.wgmma{}", c.tiles.block_kv, c.tiles.stages,
                                            c.tiles.persistent ? ".persistent" : "")) != std::string::npos,
                  run.spec);
    CHECK_MESSAGE((run.spec.find(".rope_tables16") != std::string::npos) == c.tables16, run.spec);
    CHECK_MESSAGE(detail::KernelSpec::parse(run.spec).rope_table_slots() > 0, run.spec);
  });
}

TEST_CASE("split-KV dense forward: FlashAttention's lengths, splits 1, 3 and heuristic, masks, modifiers, RoPE, GQA") {
  // forward() with a workspace splits calls whose tiles leave the GPU
  // underused (these have one or two sequences of 6 heads) over their keys:
  // fp32 partials in the poisoned workspace, then the combine kernel. Rows
  // that see no key (causal with more queries than keys) must come back 0
  // with lse -inf through the combine. The planner's kernels (the decode
  // kernel over dense K/V for at most 32 packed rows without RoPE, wgmma
  // tiles on sm_90a), and forced 4-warp mma.sync and wgmma tiles.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const bool hopper = current_arch() == "sm_90a";
  // (4, 3): causal rows that see no key on the decode kernel.
  const std::pair<int, int> seqlens[] = {{1, 239},   {3, 799},   {1, 1024},  {16, 4000}, {64, 2048}, {127, 513},
                                         {113, 203}, {256, 128}, {1, 20000}, {40, 6000}, {4, 3}};
  const int head_dims[] = {128, 64, 96, 256, 32, 80, 192, 128};
  const int split_choices[] = {0, 3, 1, 0, 5};
  std::vector<Case> cases;
  for (int index = 0; index < 44; ++index) {
    const auto& [seqlen_q, seqlen_k] = seqlens[index % 11];
    const int head_dim = head_dims[index % 8];
    Case c;
    c.dtype = index % 3 == 1 ? DType::f16 : DType::bf16;
    c.shape = AttentionShape::dense(index % 4 == 3 ? 2 : 1, seqlen_q, seqlen_k, 6, index % 3 == 0 ? 6 : index % 3 == 1 ? 2 : 1,
                                    head_dim, index % 2 == 0);
    if (index % 9 == 4) c.shape.window_left = 300, c.shape.window_right = index % 2 == 0 ? 0 : 40;
    if (index % 5 == 2) c.shape.softcap = 50.f;
    if (index % 7 == 5) c.shape.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f};
    c.rope = index % 4 == 1;
    c.rotation.style = index % 8 == 1 ? RopeStyle::rotate_half : RopeStyle::interleaved;
    c.rotation.rotary_dim = rotary_dim_for(index % 3 == 0 ? 0.5 : 1.0, head_dim);
    c.rope = c.rope && c.rotation.rotary_dim > 0;
    c.angles = index % 12 == 5 ? Angles::tables : Angles::theta;
    c.tables16 = c.angles == Angles::tables && index % 24 == 17;
    c.offsets = index % 12 == 9 ? Offsets::keys : Offsets::none;
    // Tables need explicit query positions when queries outnumber keys.
    if (c.rope && c.angles == Angles::tables && seqlen_q > seqlen_k) c.offsets = Offsets::both;
    c.heads_major = index % 6 == 3;
    c.num_splits = split_choices[index % 5];
    const int tile_kind = index / 11;  // 0, 1: the planner's; 2: 4-warp mma.sync; 3: wgmma (sm_90a)
    if (tile_kind == 2) c.tiles = head_dim <= 128 ? TileConfig{64, 128, 4} : TileConfig{64, 64, 4};
    if (tile_kind == 3 && hopper) c.tiles = {128, head_dim <= 128 ? 128 : 64, 8, 2, true};
    cases.push_back(c);
  }
  int split_calls = 0, decode_calls = 0;
  check_cases(cases, rng, seed, [&](const Case& c, const KernelRun& run) {
    // A forced count above one splits calls of more than one key step (at
    // most 256 keys); 1 never splits. The workspace is the partials: fp32
    // outputs and LSEs.
    if (*c.num_splits > 1 && c.shape.seqlen_k > 256) {
      CHECK_MESSAGE(run.workspace_bytes > 0, describe(c, run.spec, seed));
    }
    if (*c.num_splits == 1) CHECK_MESSAGE(run.workspace_bytes == 0, describe(c, run.spec, seed));
    split_calls += run.workspace_bytes > 0;
    decode_calls += run.spec.rfind("decode.", 0) == 0;
  });
  // The heuristic splits most of these small grids too.
  CHECK(split_calls >= 24);
  CHECK(decode_calls >= 6);
}

TEST_CASE("split-KV dense forward: the workspace is checked before launch; graph-capturable; without one nothing splits") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  Case c;
  c.shape = AttentionShape::dense(1, 16, 4000, 8, 2, 128, true);
  c.rope = false;
  const Inputs in = make_inputs(c, rng);
  const int64_t q_shape[4] = {1, 16, 8, 128};
  int64_t out_strides[4];
  contiguous_strides(q_shape, out_strides);
  DeviceTensor out(c.dtype, q_shape, out_strides);
  out.buffer.fill_bytes(0xff);
  ForwardOptions options;
  options.causal = true;
  Runtime& runtime = gpu_tests_runtime();
  const size_t bytes = runtime.forward_workspace_bytes(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr,
                                                       options);
  REQUIRE(bytes > 0);
  DeviceBuffer workspace(bytes);
  auto rejects = [&](void* data, size_t size, const char* message) {
    CHECK_THROWS_WITH_AS(runtime.forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options, data,
                                         size, nullptr),
                         doctest::Contains(message), Error);
  };
  rejects(workspace.get(), bytes - 1, "workspace: ");
  rejects(nullptr, bytes, "workspace: data pointer must be non-null and 256-byte aligned");
  rejects(static_cast<char*>(workspace.get()) + 128, bytes, "256-byte aligned");
  options.num_splits = 129;
  rejects(workspace.get(), bytes, "options.num_splits=129 must be 0 (heuristic) or 1 to 128");
  options.num_splits = 3;
  CHECK_THROWS_WITH_AS(runtime.forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options),
                       doctest::Contains("options.num_splits=3: splitting needs a workspace"), Error);
  // Nothing was written.
  for (float x : out.read()) {
    if (!std::isnan(x)) FAIL_CHECK("a rejected call wrote out");
  }
  // Without a workspace the same call runs unsplit and agrees.
  options.num_splits = 0;
  const References r = make_references(c, in);
  runtime.forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options);
  const std::vector<float> unsplit = out.read();
  out.buffer.fill_bytes(0xff);
  runtime.forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options, workspace.get(), bytes);
  const std::vector<float> split = out.read();
  const std::vector<float> no_lse;
  CHECK_MESSAGE(judge(c.shape, unsplit, no_lse, r.exact, r.rounded).ok(), describe(c, "unsplit", seed));
  CHECK_MESSAGE(judge(c.shape, split, no_lse, r.exact, r.rounded).ok(), describe(c, "split", seed));
  // Once warm, the two launches (attention, combine) capture into a graph.
  const auto& d = detail::driver();
  CUstream stream = nullptr;
  REQUIRE(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  out.buffer.fill_bytes(0xff);
  CUgraph graph = nullptr;
  REQUIRE(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  runtime.forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options, workspace.get(), bytes,
                  stream);
  REQUIRE(d.cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  REQUIRE(d.cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS);
  REQUIRE(d.cuGraphLaunch(exec, stream) == CUDA_SUCCESS);
  REQUIRE(d.cuStreamSynchronize(stream) == CUDA_SUCCESS);
  CHECK(out.read() == split);
  d.cuGraphExecDestroy(exec);
  d.cuGraphDestroy(graph);
  d.cuStreamDestroy(stream);
}

TEST_CASE("rope: 8192 keys at offsets up to 3000, both styles, partial rotation") {
  // K's angles are stepped along runs of rows with the angle-sum identities
  // (rope.cuh); positions past 10k check them where fp32 angles are coarse.
  // 192 and 256 on sm_90a: the wgmma tiles (forced: these grids are small),
  // whose producer steps two pairs a thread down runs of 40-48 rows.
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  int index = 0;
  const bool wide_wgmma = current_arch() == "sm_90a";
  for (RopeStyle style : {RopeStyle::rotate_half, RopeStyle::interleaved}) {
    for (int head_dim : {64, 128, 192, 256}) {
      for (bool causal : {true, false}) {
        Case c;
        c.dtype = index % 2 == 0 ? DType::bf16 : DType::f16;
        c.shape = AttentionShape::dense(1, causal ? 300 : 77, 8192, 2, 1, head_dim, causal);
        c.rotation.style = style;
        c.rotation.rotary_dim = index % 4 == 3 ? head_dim / 2 : head_dim;
        c.angles = Angles::theta;
        c.offsets = index % 2 == 0 ? Offsets::keys : Offsets::both;
        if (head_dim > 128 && wide_wgmma) c.tiles = {128, head_dim == 192 ? 96 : 80, 8, 2, true};
        cases.push_back(c);
        ++index;
      }
    }
  }
  check_cases(cases, rng, seed);
}

TEST_CASE("pack_gqa: GQA/MQA tiles shared by a KV head's query heads, with masks, softcap and ALiBi") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const std::pair<int, int> seqlens[] = {{1, 239}, {3, 799}, {16, 300}, {113, 203}, {127, 513}, {512, 256}};
  std::vector<Case> cases;
  int index = 0;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (int heads_kv : {2, 1}) {
      for (int head_dim : {64, 128, 40, 256}) {
        for (int mask = 0; mask < 3; ++mask, ++index) {
          const auto& [seqlen_q, seqlen_k] = seqlens[index % 6];
          Case c;
          c.dtype = dtype;
          c.rope = false;
          c.shape = AttentionShape::dense(2, seqlen_q, seqlen_k, heads_kv == 1 ? 7 : 6, heads_kv, head_dim, mask == 1);
          if (mask == 2) {
            c.shape.window_left = 20;
            c.shape.window_right = 5;
          }
          if (index % 3 == 0) c.shape.softcap = 30.f;
          if (index % 4 < 2) {
            std::uniform_real_distribution<float> uniform(0.05f, 1.f);
            for (int h = 0; h < c.shape.heads_q; ++h) c.shape.alibi_slopes.push_back(uniform(rng));
          }
          c.pack_gqa = true;
          c.heads_major = index % 2 == 1;
          cases.push_back(c);
        }
      }
    }
  }
  check_cases(cases, rng, seed, [](const Case&, const KernelRun& run) {
    // The decode kernel (at most 32 packed rows) always packs.
    CHECK_MESSAGE((run.spec.find(".packgqa") != std::string::npos || run.spec.rfind("decode.", 0) == 0), run.spec);
  });
}

TEST_CASE("rope and pack_gqa: bad options are rejected before launch, naming the option") {
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  INFO("seed=", seed);
  Case c;
  c.shape = AttentionShape::dense(2, 64, 80, 6, 2, 80, false);
  const Inputs in = make_inputs(c, rng);
  const int64_t q_shape[4] = {2, 64, 6, 80};
  int64_t strides[4];
  contiguous_strides(q_shape, strides);
  DeviceTensor out(DType::bf16, q_shape, strides);
  DeviceBuffer table(4096 * 4);
  const TensorView cos = TensorView::contiguous(table.get(), DType::f32, {100, 40});
  const TensorView short_cos = TensorView::contiguous(table.get(), DType::f32, {10, 40});
  const TensorView narrow_cos = TensorView::contiguous(table.get(), DType::f32, {100, 16});
  const TensorView half_cos = TensorView::contiguous(table.get(), DType::f16, {100, 40});
  const TensorView bf16_cos = TensorView::contiguous(table.get(), DType::bf16, {100, 40});
  const TensorView offsets_f32 = TensorView::contiguous(table.get(), DType::f32, {2});
  const TensorView offsets_short = TensorView::contiguous(table.get(), DType::i32, {1});

  auto expect_rejected = [&](const RopeOptions& rope, const std::string& fragment) {
    INFO("expected an error containing: ", fragment);
    ForwardOptions options;
    options.rope = rope;
    CHECK_THROWS_WITH_AS(
        gpu_tests_runtime().forward(in.dq->view(), in.dk->view(), in.dv->view(), out.view(), nullptr, options, nullptr),
        doctest::Contains(fragment.c_str()), Error);
    size_t written = 0;
    for (uint16_t bits : out.raw()) written += bits != 0xffff;
    CHECK_MESSAGE(written == 0, fmt::format("{} output elements written by a rejected call", written));
  };
  RopeOptions rope;
  rope.style = RopeStyle::rotate_half;
  rope.rotary_dim = 40;
  expect_rejected(rope, "options.rope.rotary_dim=40");
  rope.rotary_dim = 96;
  expect_rejected(rope, "must be a multiple of 16 between 16 and head_dim");
  rope.rotary_dim = 0;  // head_dim 80: a multiple of 16
  rope.theta = -1.f;
  expect_rejected(rope, "options.rope.theta=-1");
  rope.theta = 10000.f;
  rope.cos = &cos;
  expect_rejected(rope, "cos and sin tables come together");
  rope.sin = &short_cos;
  expect_rejected(rope, "options.rope.sin: shape");
  rope.cos = rope.sin = &short_cos;
  expect_rejected(rope, "options.rope.cos: 10 positions; the keys reach position 79");
  rope.cos = rope.sin = &narrow_cos;
  expect_rejected(rope, ">= rotary_dim / 2 = 40");
  rope.cos = rope.sin = &half_cos;
  expect_rejected(rope, "options.rope.cos: dtype f16 must be f32 or q's dtype (bf16)");
  rope.cos = &bf16_cos;
  rope.sin = &cos;
  expect_rejected(rope, "options.rope.sin: dtype f32 must equal cos's (bf16)");
  rope.cos = rope.sin = nullptr;
  rope.k_offsets = &offsets_f32;
  expect_rejected(rope, "options.rope.k_offsets: dtype f32 must be i32");
  rope.k_offsets = nullptr;
  rope.q_offsets = &offsets_short;
  expect_rejected(rope, "options.rope.q_offsets: shape [1] must be [batch] = [2]");
  RopeOptions style;
  style.style = static_cast<RopeStyle>(7);
  expect_rejected(style, "options.rope.style=7");
}

}  // TEST_SUITE
