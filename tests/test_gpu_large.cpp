// Calls whose tensors reach past 2^31 elements (4 GiB of 16-bit values), as
// a serving engine's KV-cache pool or a large batch does: every offset a
// kernel forms from a batch, page, row or head index has to be 64-bit.
//
// Each call runs twice on the same values: once on compact tensors, once with
// the batch (or the pages, or the packed sequence) it reads and writes placed
// past 2^31 elements and the bytes it must not read NaN poison. Both calls plan the same kernels, and the
// kernels are deterministic, so the two must agree bit for bit: an offset cut
// to 32 bits reads poison or another batch's rows. (The compact calls are
// judged against references by the other GPU suites.)
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "plan.hpp"

using namespace jitattn;
using namespace jitattn::test;
using jitattn::detail::check_cuda;
using jitattn::detail::driver;

namespace {

// Elements before the far copy: past 2^31, and a multiple of 8 (16-byte rows).
constexpr int64_t kFar = (int64_t{1} << 31) + (int64_t{1} << 20);

// A case's turn at most of the GPU's memory. scripts/gpu_check.sh runs test
// cases as parallel processes, and these cases hold 10-34 GB each: on a GPU
// smaller than their sum, two at once could fail to allocate where either
// alone fits. So each holds an exclusive lock on one file in the temp
// directory while it runs (other test processes wait their turn), and then
// checks the memory left free by everything else on the GPU.
class GpuMemoryTurn {
 public:
  GpuMemoryTurn() {
    const std::filesystem::path path = std::filesystem::temp_directory_path() / "jitattn-gpu-large-tests.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) {
      MESSAGE(fmt::format("no turn lock ({}: {}): running beside other large cases", path.string(),
                          std::strerror(errno)));
      return;
    }
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~GpuMemoryTurn() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  GpuMemoryTurn(const GpuMemoryTurn&) = delete;
  GpuMemoryTurn& operator=(const GpuMemoryTurn&) = delete;

 private:
  int fd_ = -1;
};

// Takes the case's turn (`turn`) and says whether the GPU then has `bytes`
// of test tensors free, beside 2 GiB for the case's smaller buffers and
// workspaces; says why it skips where it does not.
bool gpu_holds(std::optional<GpuMemoryTurn>& turn, size_t bytes, const char* what) {
  turn.emplace();
  size_t free = 0, total = 0;
  check_cuda(driver().cuMemGetInfo(&free, &total), "cuMemGetInfo");
  if (free >= bytes + (size_t{2} << 30)) return true;
  MESSAGE(fmt::format("skipped: {} needs {:.1f} GiB of GPU memory, this GPU has {:.1f} GiB free of {:.1f}", what,
                      static_cast<double>(bytes) / (1 << 30), static_cast<double>(free) / (1 << 30),
                      static_cast<double>(total) / (1 << 30)));
  return false;
}

// The suites' random inputs (random_values), as the bits a tensor stores.
std::vector<uint16_t> random_bits(size_t count, DType dtype, std::mt19937_64& rng) {
  const std::vector<float> values = random_values(count, dtype, rng);
  std::vector<uint16_t> bits(count);
  std::transform(values.begin(), values.end(), bits.begin(), [&](float value) { return from_float(value, dtype); });
  return bits;
}

// The two layouts' results agree bit for bit (else: the first element that differs).
void check_same_bits(const char* what, const std::vector<uint16_t>& compact, const std::vector<uint16_t>& far) {
  REQUIRE(compact.size() == far.size());
  const auto at = std::mismatch(compact.begin(), compact.end(), far.begin());
  CHECK_MESSAGE(at.first == compact.end(),
                fmt::format("{} element {}: compact 0x{:04x}, far 0x{:04x}", what, at.first - compact.begin(),
                            at.first == compact.end() ? 0 : *at.first, at.first == compact.end() ? 0 : *at.second));
}

// `count` 16-bit words of `buffer` from byte `offset` (an f32 value is two
// words): results are compared as stored bits.
std::vector<uint16_t> download_words(const DeviceBuffer& buffer, size_t count, size_t offset = 0) {
  std::vector<uint16_t> words(count);
  buffer.download_at(offset, words.data(), count * 2);
  return words;
}

// Elements that still hold the poison (0xffff, a NaN in both 16-bit formats).
size_t count_poison(const std::vector<uint16_t>& bits) {
  return static_cast<size_t>(std::count(bits.begin(), bits.end(), uint16_t{0xffff}));
}

// A [batch, seqlen, heads, head_dim] tensor, contiguous within each batch,
// whose batch b starts at b · batch_stride elements of `buffer`.
TensorView batch_view(const DeviceBuffer& buffer, DType dtype, int64_t batch, int64_t seqlen, int64_t heads,
                      int64_t head_dim, int64_t batch_stride) {
  TensorView t = TensorView::contiguous(buffer.get(), dtype, {batch, seqlen, heads, head_dim});
  t.strides[0] = batch_stride;
  return t;
}

// ---- dense forward ----------------------------------------------------------

struct DenseCase {
  DType dtype = DType::bf16;
  int seqlen_q = 1024, seqlen_k = 1024, heads_q = 16, heads_kv = 16, head_dim = 128;
  bool causal = true;
  RopeStyle rope = RopeStyle::none;
  bool workspace = false;  // forward() with a workspace (split-KV)
  TileConfig tiles;        // forced tiles; zeros: the planner's
};

std::string describe(const DenseCase& c, const std::string& spec, int batch = 2) {
  return fmt::format("{} {} batch={} seqlen_q={} seqlen_k={} heads={}/{} head_dim={} causal={} rope={} workspace={}",
                     spec, c.dtype == DType::bf16 ? "bf16" : "f16", batch, c.seqlen_q, c.seqlen_k, c.heads_q,
                     c.heads_kv, c.head_dim, c.causal, static_cast<int>(c.rope), c.workspace);
}

// The dense calls of both dense large-offset cases below; the comments name
// the kernels that two batches of these heads plan on an H200.
std::vector<DenseCase> dense_cases() {
  std::vector<DenseCase> cases;
  cases.push_back({});  // d128 causal: persistent wgmma tiles (sm_90a), K/V by tensor copies
  {
    DenseCase c;  // RoPE: K copied and rotated by the producer, packed GQA
    c.rope = RopeStyle::rotate_half;
    c.heads_kv = 4;
    cases.push_back(c);
  }
  {
    DenseCase c;  // d64 without a mask, f16: three-warpgroup tiles on sm_90a
    c.dtype = DType::f16;
    c.head_dim = 64;
    c.seqlen_k = 2048;
    c.causal = false;
    cases.push_back(c);
  }
  {
    DenseCase c;  // d256, ragged lengths
    c.head_dim = 256;
    c.seqlen_q = 300;
    c.seqlen_k = 700;
    c.heads_q = c.heads_kv = 8;
    cases.push_back(c);
  }
  {
    DenseCase c;  // d96 (padded to 128), interleaved RoPE, MQA
    c.head_dim = 96;
    c.seqlen_q = 513;
    c.seqlen_k = 999;
    c.heads_q = 6;
    c.heads_kv = 1;
    c.rope = RopeStyle::interleaved;
    cases.push_back(c);
  }
  {
    DenseCase c;  // one query over 8192 keys with a workspace: the decode kernel over dense K/V, split
    c.seqlen_q = 1;
    c.seqlen_k = 8192;
    c.heads_q = 32;
    c.heads_kv = 8;
    c.workspace = true;
    cases.push_back(c);
  }
  return cases;
}

// q, k, v and out of two batches, batch 1 at kFar elements.
struct FarTensors {
  explicit FarTensors(size_t elements) : q(elements * 2), k(elements * 2), v(elements * 2), out(elements * 2) {}
  DeviceBuffer q, k, v, out;
};

TEST_CASE("offsets past 2^31 elements: dense forward with batch strides past 4 GiB") {
  // One batch of every case fits in 8M elements (8192 keys x 8 heads x 128).
  constexpr int64_t kBatchElements = int64_t{8} << 20;
  const size_t far_elements = static_cast<size_t>(kFar + kBatchElements);
  std::optional<GpuMemoryTurn> turn;  // held to the case's end
  if (!gpu_holds(turn, 4 * far_elements * 2, "dense calls past 2^31 elements")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);

  const std::vector<DenseCase> cases = dense_cases();

  Runtime& runtime = gpu_tests_runtime();
  FarTensors far(far_elements);
  for (const DenseCase& c : cases) {
    const int64_t q_batch = int64_t{c.seqlen_q} * c.heads_q * c.head_dim;
    const int64_t kv_batch = int64_t{c.seqlen_k} * c.heads_kv * c.head_dim;
    REQUIRE(std::max(q_batch, kv_batch) <= kBatchElements);
    const auto q_bits = random_bits(2 * q_batch, c.dtype, rng);
    const auto k_bits = random_bits(2 * kv_batch, c.dtype, rng);
    const auto v_bits = random_bits(2 * kv_batch, c.dtype, rng);

    DeviceBuffer q(q_bits.size() * 2), k(k_bits.size() * 2), v(v_bits.size() * 2), out(q_bits.size() * 2);
    q.upload(q_bits.data(), q_bits.size() * 2);
    k.upload(k_bits.data(), k_bits.size() * 2);
    v.upload(v_bits.data(), v_bits.size() * 2);
    // The far tensors: batch 0 at 0, batch 1 at kFar, poison between.
    for (DeviceBuffer* buffer : {&far.q, &far.k, &far.v, &far.out}) buffer->fill_bytes(0xff);
    for (int b = 0; b < 2; ++b) {
      const size_t at = static_cast<size_t>(b * kFar) * 2;
      far.q.upload_at(at, q_bits.data() + b * q_batch, static_cast<size_t>(q_batch) * 2);
      far.k.upload_at(at, k_bits.data() + b * kv_batch, static_cast<size_t>(kv_batch) * 2);
      far.v.upload_at(at, v_bits.data() + b * kv_batch, static_cast<size_t>(kv_batch) * 2);
    }
    auto views = [&](const DeviceBuffer& qb, const DeviceBuffer& kb, const DeviceBuffer& vb, const DeviceBuffer& ob,
                     bool is_far) {
      struct {
        TensorView q, k, v, out;
      } t;
      t.q = batch_view(qb, c.dtype, 2, c.seqlen_q, c.heads_q, c.head_dim, is_far ? kFar : q_batch);
      t.k = batch_view(kb, c.dtype, 2, c.seqlen_k, c.heads_kv, c.head_dim, is_far ? kFar : kv_batch);
      t.v = batch_view(vb, c.dtype, 2, c.seqlen_k, c.heads_kv, c.head_dim, is_far ? kFar : kv_batch);
      t.out = batch_view(ob, c.dtype, 2, c.seqlen_q, c.heads_q, c.head_dim, is_far ? kFar : q_batch);
      return t;
    };
    const auto compact_views = views(q, k, v, out, false);
    const auto far_views = views(far.q, far.k, far.v, far.out, true);
    ForwardOptions options;
    options.causal = c.causal;
    options.rope.style = c.rope;

    const std::string spec = runtime.spec_for(compact_views.q, compact_views.k, compact_views.v, compact_views.out,
                                              nullptr, options);
    const std::string far_spec =
        runtime.spec_for(far_views.q, far_views.k, far_views.v, far_views.out, nullptr, options);
    INFO(describe(c, spec), " seed=", seed);
    REQUIRE_MESSAGE(far_spec == spec, "the far call plans ", far_spec);

    // Runs one layout; returns out's two batches and the LSE, as bits.
    auto run = [&](const decltype(compact_views)& t, const DeviceBuffer& out_buffer, bool is_far) {
      const size_t lse_count = static_cast<size_t>(2) * c.heads_q * c.seqlen_q;
      DeviceBuffer lse(lse_count * 4);
      lse.fill_bytes(0xff);
      const TensorView lse_view = TensorView::contiguous(lse.get(), DType::f32, {2, c.heads_q, c.seqlen_q});
      if (c.workspace) {
        const size_t bytes = runtime.forward_workspace_bytes(t.q, t.k, t.v, t.out, &lse_view, options);
        CHECK(bytes > 0);
        DeviceBuffer workspace(bytes);
        workspace.fill_bytes(0xff);
        runtime.forward(t.q, t.k, t.v, t.out, &lse_view, options, workspace.get(), bytes, nullptr);
        check_cuda(driver().cuCtxSynchronize(), "cuCtxSynchronize");
      } else {
        runtime.forward(t.q, t.k, t.v, t.out, &lse_view, options, nullptr);
      }
      std::vector<uint16_t> bits(static_cast<size_t>(2 * q_batch));
      for (int b = 0; b < 2; ++b) {
        out_buffer.download_at(static_cast<size_t>(b * (is_far ? kFar : q_batch)) * 2, bits.data() + b * q_batch,
                               static_cast<size_t>(q_batch) * 2);
      }
      return std::make_pair(bits, download_words(lse, lse_count * 2));
    };
    out.fill_bytes(0xff);
    const auto compact_result = run(compact_views, out, false);
    const auto far_result = run(far_views, far.out, true);
    CHECK_MESSAGE(count_poison(compact_result.first) == 0, "the compact call left poison in out");
    check_same_bits("out", compact_result.first, far_result.first);
    check_same_bits("lse (16-bit halves)", compact_result.second, far_result.second);
  }
}

// ---- varlen -----------------------------------------------------------------

TEST_CASE("offsets past 2^31 elements: varlen, a sequence whose packed rows start past 4 GiB") {
  // Two sequences; sequence 1 (300 queries over 700 keys) is checked. Far:
  // sequence 0 holds enough rows that sequence 1's q, out, k and v rows all
  // start past 2^31 elements (its keys used only up to seqused_k = 64, so its
  // million queries see few keys). Compact: sequence 0 is one query over the
  // same 64 keys. The same forced tiles run both.
  constexpr int kHeadsQ = 16, kHeadsKV = 4, kHeadDim = 128, kSeqQ = 300, kSeqK = 700, kUsed0 = 64;
  constexpr int64_t kQRow = int64_t{kHeadsQ} * kHeadDim, kKRow = int64_t{kHeadsKV} * kHeadDim;
  const int far_q0 = static_cast<int>(kFar / kQRow) + 1, far_k0 = static_cast<int>(kFar / kKRow) + 1;
  const size_t q_elements = static_cast<size_t>(far_q0 + kSeqQ) * kQRow;
  const size_t k_elements = static_cast<size_t>(far_k0 + kSeqK) * kKRow;
  std::optional<GpuMemoryTurn> turn;  // held to the case's end
  if (!gpu_holds(turn, 2 * (q_elements + k_elements) * 2, "varlen calls past 2^31 elements")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const DType dtype = DType::bf16;

  // Tiles and GQA packing are fixed: the planner's choices follow the
  // sequences' average length, which the two layouts do not share.
  struct VarlenCase {
    TileConfig tiles;
    RopeStyle rope;
    bool pack_gqa;
  };
  std::vector<VarlenCase> cases = {{{64, 64, 4}, RopeStyle::none, false}};  // the 4-warp mma.sync kernel
  if (sm90a_or_skip("wgmma varlen past 2^31 elements")) {
    cases.push_back({{128, 128, 8, 2, true}, RopeStyle::none, true});          // K/V by tensor copies, packed GQA
    cases.push_back({{128, 128, 8, 2, true}, RopeStyle::rotate_half, false});  // K copied and rotated by the producer
  }

  Runtime& runtime = gpu_tests_runtime();
  DeviceBuffer far_q(q_elements * 2), far_out(q_elements * 2), far_k(k_elements * 2), far_v(k_elements * 2);
  for (const VarlenCase& c : cases) {
    INFO(fmt::format("bf16 heads={}/{} head_dim={} sequence 1: {} x {} keys, causal, tiles {}x{}x{}x{}, rope={} "
                     "pack_gqa={}",
                     kHeadsQ, kHeadsKV, kHeadDim, kSeqQ, kSeqK, c.tiles.block_q, c.tiles.block_kv, c.tiles.warps,
                     c.tiles.stages, static_cast<int>(c.rope), c.pack_gqa),
         " seed=", seed);
    // Sequence 0's first query and used keys, then sequence 1's rows.
    const auto q0_bits = random_bits(kQRow, dtype, rng);
    const auto k0_bits = random_bits(kUsed0 * kKRow, dtype, rng);
    const auto v0_bits = random_bits(kUsed0 * kKRow, dtype, rng);
    const auto q1_bits = random_bits(kSeqQ * kQRow, dtype, rng);
    const auto k1_bits = random_bits(kSeqK * kKRow, dtype, rng);
    const auto v1_bits = random_bits(kSeqK * kKRow, dtype, rng);

    // Runs one layout (sequence 0: q0_rows queries, k0_rows keys); returns
    // sequence 1's out rows and LSE, as bits.
    auto run = [&](DeviceBuffer& q, DeviceBuffer& out, DeviceBuffer& k, DeviceBuffer& v, int q0_rows, int k0_rows) {
      q.fill_bytes(0);  // sequence 0's queries past its first: zeros (few see keys)
      out.fill_bytes(0xff);
      k.fill_bytes(0xff);
      v.fill_bytes(0xff);
      q.upload_at(0, q0_bits.data(), q0_bits.size() * 2);
      k.upload_at(0, k0_bits.data(), k0_bits.size() * 2);
      v.upload_at(0, v0_bits.data(), v0_bits.size() * 2);
      q.upload_at(static_cast<size_t>(q0_rows * kQRow) * 2, q1_bits.data(), q1_bits.size() * 2);
      k.upload_at(static_cast<size_t>(k0_rows * kKRow) * 2, k1_bits.data(), k1_bits.size() * 2);
      v.upload_at(static_cast<size_t>(k0_rows * kKRow) * 2, v1_bits.data(), v1_bits.size() * 2);
      const int total_q = q0_rows + kSeqQ, total_k = k0_rows + kSeqK;
      const std::vector<int> cu_q = {0, q0_rows, total_q}, cu_k = {0, k0_rows, total_k}, used = {kUsed0, kSeqK};
      DeviceBuffer cu_q_buffer(12), cu_k_buffer(12), used_buffer(8);
      cu_q_buffer.upload(cu_q.data(), 12);
      cu_k_buffer.upload(cu_k.data(), 12);
      used_buffer.upload(used.data(), 8);
      const size_t lse_count = static_cast<size_t>(kHeadsQ) * total_q;
      DeviceBuffer lse(lse_count * 4);
      lse.fill_bytes(0xff);
      const TensorView used_view = TensorView::contiguous(used_buffer.get(), DType::i32, {2});
      VarlenArgs args;
      args.cu_seqlens_q = TensorView::contiguous(cu_q_buffer.get(), DType::i32, {3});
      args.cu_seqlens_k = TensorView::contiguous(cu_k_buffer.get(), DType::i32, {3});
      args.seqused_k = &used_view;
      args.max_seqlen_q = std::max(q0_rows, kSeqQ);
      args.max_seqlen_k = kSeqK;
      ForwardOptions options;
      options.causal = true;
      options.rope.style = c.rope;
      options.tiles = c.tiles;
      options.pack_gqa = c.pack_gqa;
      const TensorView lse_view = TensorView::contiguous(lse.get(), DType::f32, {kHeadsQ, total_q});
      runtime.forward_varlen(TensorView::contiguous(q.get(), dtype, {total_q, kHeadsQ, kHeadDim}),
                             TensorView::contiguous(k.get(), dtype, {total_k, kHeadsKV, kHeadDim}),
                             TensorView::contiguous(v.get(), dtype, {total_k, kHeadsKV, kHeadDim}),
                             TensorView::contiguous(out.get(), dtype, {total_q, kHeadsQ, kHeadDim}), &lse_view, args,
                             options);
      std::pair<std::vector<uint16_t>, std::vector<uint16_t>> result;
      result.first = download_words(out, q1_bits.size(), static_cast<size_t>(q0_rows * kQRow) * 2);
      result.second.resize(static_cast<size_t>(kHeadsQ) * kSeqQ * 2);
      for (int h = 0; h < kHeadsQ; ++h) {
        lse.download_at((static_cast<size_t>(h) * total_q + q0_rows) * 4, result.second.data() + h * kSeqQ * 2,
                        kSeqQ * 4);
      }
      return result;
    };
    DeviceBuffer q(static_cast<size_t>(1 + kSeqQ) * kQRow * 2), out(static_cast<size_t>(1 + kSeqQ) * kQRow * 2);
    DeviceBuffer k(static_cast<size_t>(kUsed0 + kSeqK) * kKRow * 2), v(static_cast<size_t>(kUsed0 + kSeqK) * kKRow * 2);
    const auto compact = run(q, out, k, v, 1, kUsed0);
    const auto far = run(far_q, far_out, far_k, far_v, far_q0, far_k0);
    CHECK_MESSAGE(count_poison(compact.first) == 0, "the compact call left poison in out");
    check_same_bits("out", compact.first, far.first);
    check_same_bits("lse (16-bit halves)", compact.second, far.second);
  }
}

TEST_CASE("offsets past 2^31 elements: varlen over a paged cache whose pages lie past 4 GiB") {
  // Three sequences over a shuffled block table, their keys seqused_k's
  // (cu_seqlens_k left out). Compact: the pool is the used pages. Far: the
  // same pages start past 2^31 elements, poison before them. The pool is
  // viewed with each case's page size; its far start is whole pages of 256.
  constexpr int kBatch = 3, kHeadsQ = 32, kHeadsKV = 8, kHeadDim = 128, kCapacity = 3072;
  constexpr int64_t kRow = int64_t{kHeadsKV} * kHeadDim;
  constexpr int64_t kUsedElements = int64_t{kBatch} * kCapacity * kRow;
  constexpr int64_t kFarStart = (kFar / (256 * kRow) + 1) * (256 * kRow);
  const size_t far_elements = static_cast<size_t>(kFarStart + kUsedElements);
  std::optional<GpuMemoryTurn> turn;  // held to the case's end
  if (!gpu_holds(turn, 2 * far_elements * 2, "paged varlen calls past 2^31 elements")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const DType dtype = DType::bf16;

  struct PagedCase {
    int page_size;
    std::vector<int> seqlen_q;
    bool workspace;  // forward_varlen with a workspace (split-KV where the heuristic splits)
  };
  const std::vector<PagedCase> cases = {
      {64, {1, 1, 1}, true},       // a decoding step: the decode kernel, split
      {16, {1, 1, 1}, false},      // small pages, unsplit
      {64, {1, 40, 130}, false},   // a mixed step: wgmma tiles over pages (sm_90a)
      {256, {17, 64, 100}, true},  // large pages, with a workspace
  };

  Runtime& runtime = gpu_tests_runtime();
  DeviceBuffer far_k(far_elements * 2), far_v(far_elements * 2);
  for (const PagedCase& c : cases) {
    const int pages_per_sequence = kCapacity / c.page_size, pages = kBatch * pages_per_sequence;
    const int64_t page_elements = int64_t{c.page_size} * kRow;
    const int first_far_page = static_cast<int>(kFarStart / page_elements);
    std::vector<int> cu_q = {0}, used(kBatch);
    for (int b = 0; b < kBatch; ++b) {
      cu_q.push_back(cu_q.back() + c.seqlen_q[b]);
      used[b] = std::uniform_int_distribution<int>(1000, kCapacity)(rng);
    }
    const int total_q = cu_q.back();
    INFO(fmt::format("bf16 heads={}/{} head_dim={} causal page_size={} seqlen_q={} seqused_k={} workspace={}", kHeadsQ,
                     kHeadsKV, kHeadDim, c.page_size, fmt::join(c.seqlen_q, ","), fmt::join(used, ","), c.workspace),
         " seed=", seed);
    std::vector<int> table(pages);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<int> far_table = table;
    for (int& page : far_table) page += first_far_page;

    const auto k_bits = random_bits(static_cast<size_t>(kUsedElements), dtype, rng);
    const auto v_bits = random_bits(static_cast<size_t>(kUsedElements), dtype, rng);
    const auto q_bits = random_bits(static_cast<size_t>(total_q) * kHeadsQ * kHeadDim, dtype, rng);
    DeviceBuffer k(k_bits.size() * 2), v(v_bits.size() * 2), q(q_bits.size() * 2);
    k.upload(k_bits.data(), k_bits.size() * 2);
    v.upload(v_bits.data(), v_bits.size() * 2);
    q.upload(q_bits.data(), q_bits.size() * 2);
    far_k.fill_bytes(0xff);
    far_v.fill_bytes(0xff);
    far_k.upload_at(static_cast<size_t>(kFarStart) * 2, k_bits.data(), k_bits.size() * 2);
    far_v.upload_at(static_cast<size_t>(kFarStart) * 2, v_bits.data(), v_bits.size() * 2);
    DeviceBuffer cu_q_buffer(cu_q.size() * 4), used_buffer(kBatch * 4), table_buffer(pages * 4),
        far_table_buffer(pages * 4);
    cu_q_buffer.upload(cu_q.data(), cu_q.size() * 4);
    used_buffer.upload(used.data(), kBatch * 4);
    table_buffer.upload(table.data(), pages * 4);
    far_table_buffer.upload(far_table.data(), pages * 4);
    const TensorView q_view = TensorView::contiguous(q.get(), dtype, {total_q, kHeadsQ, kHeadDim});
    const TensorView used_view = TensorView::contiguous(used_buffer.get(), DType::i32, {kBatch});
    const TensorView table_views[2] = {
        TensorView::contiguous(table_buffer.get(), DType::i32, {kBatch, pages_per_sequence}),
        TensorView::contiguous(far_table_buffer.get(), DType::i32, {kBatch, pages_per_sequence})};
    ForwardOptions options;
    options.causal = true;
    // One layout's pools and arguments.
    auto pool_view = [&](const DeviceBuffer& pool, bool is_far) {
      const int64_t num_pages = is_far ? first_far_page + pages : pages;
      return TensorView::contiguous(pool.get(), dtype, {num_pages, c.page_size, kHeadsKV, kHeadDim});
    };
    auto varlen_args = [&](bool is_far) {
      VarlenArgs args;
      args.cu_seqlens_q = TensorView::contiguous(cu_q_buffer.get(), DType::i32, {kBatch + 1});
      args.seqused_k = &used_view;
      args.block_table = &table_views[is_far ? 1 : 0];
      args.max_seqlen_q = *std::max_element(c.seqlen_q.begin(), c.seqlen_q.end());
      args.max_seqlen_k = kCapacity;
      return args;
    };
    {
      // The kernel the compact call plans on this GPU, for the log.
      const detail::Arch arch = detail::Arch::parse(current_arch());
      const TensorView k_view = pool_view(k, false), v_view = pool_view(v, false);
      const TensorView lse_view = TensorView::contiguous(q.get(), DType::f32, {kHeadsQ, total_q});  // not read
      const std::string spec =
          c.workspace ? detail::plan_forward_varlen_split(q_view, k_view, v_view, q_view, &lse_view, varlen_args(false),
                                                          options, nullptr, 0, true, arch,
                                                          current_max_smem_per_block(), current_sm_count())
                            .attention.spec.text()
                      : detail::plan_forward_varlen(q_view, k_view, v_view, q_view, &lse_view, varlen_args(false),
                                                    options, arch, current_max_smem_per_block(), current_sm_count())
                            .spec.text();
      MESSAGE("paged varlen past 2^31 elements, page_size=", c.page_size, ": ", spec);
    }

    // Runs one layout; returns out and the LSE, as bits.
    auto run = [&](bool is_far) {
      const TensorView k_view = pool_view(is_far ? far_k : k, is_far), v_view = pool_view(is_far ? far_v : v, is_far);
      const VarlenArgs args = varlen_args(is_far);
      const size_t out_count = q_bits.size(), lse_count = static_cast<size_t>(kHeadsQ) * total_q;
      DeviceBuffer out(out_count * 2), lse(lse_count * 4);
      out.fill_bytes(0xff);
      lse.fill_bytes(0xff);
      const TensorView out_view = TensorView::contiguous(out.get(), dtype, {total_q, kHeadsQ, kHeadDim});
      const TensorView lse_view = TensorView::contiguous(lse.get(), DType::f32, {kHeadsQ, total_q});
      if (c.workspace) {
        const size_t bytes =
            runtime.forward_varlen_workspace_bytes(q_view, k_view, v_view, out_view, &lse_view, args, options);
        DeviceBuffer workspace(bytes);  // at least 16 bytes are allocated
        workspace.fill_bytes(0xff);
        runtime.forward_varlen(q_view, k_view, v_view, out_view, &lse_view, args, options,
                               bytes ? workspace.get() : nullptr, bytes, nullptr);
        check_cuda(driver().cuCtxSynchronize(), "cuCtxSynchronize");
      } else {
        runtime.forward_varlen(q_view, k_view, v_view, out_view, &lse_view, args, options);
      }
      return std::make_pair(download_words(out, out_count), download_words(lse, lse_count * 2));
    };
    const auto compact = run(false);
    const auto far = run(true);
    CHECK_MESSAGE(count_poison(compact.first) == 0, "the compact call left poison in out");
    check_same_bits("out", compact.first, far.first);
    check_same_bits("lse (16-bit halves)", compact.second, far.second);
  }
}

// ---- KV cache ---------------------------------------------------------------

struct CacheCase {
  int seqlen_q = 1;
  bool append = true;  // seqlen_q new keys and values
  RopeStyle rope = RopeStyle::rotate_half;
  bool paged = true;   // pages of 64; else a contiguous cache
  bool batch_index = true;  // contiguous: read through cache_batch_idx (batches swapped)
  bool dynamic = false;
  int num_splits = 0;
};

std::string describe(const CacheCase& c) {
  return fmt::format("bf16 batch=2 heads=32/8 head_dim=128 seqlen_q={} append={} rope={} paged={} "
                     "cache_batch_idx={} dynamic={} num_splits={}",
                     c.seqlen_q, c.append, static_cast<int>(c.rope), c.paged, !c.paged && c.batch_index, c.dynamic,
                     c.num_splits);
}

TEST_CASE("offsets past 2^31 elements: a KV cache whose pages (or cache batches) lie past 4 GiB") {
  constexpr int kBatch = 2, kHeadsQ = 32, kHeadsKV = 8, kHeadDim = 128, kPageSize = 64;
  constexpr int kCapacity = 3200;  // rows a sequence, whole pages
  constexpr int kPagesPerSequence = kCapacity / kPageSize;
  constexpr int kPages = kBatch * kPagesPerSequence;
  constexpr int64_t kRow = int64_t{kHeadsKV} * kHeadDim;
  constexpr int64_t kPageElements = kPageSize * kRow;
  // The far pool's used pages start past 2^31 elements.
  const int first_far_page = static_cast<int>(kFar / kPageElements) + 1;
  const size_t far_elements = static_cast<size_t>(first_far_page + kPages) * kPageElements;
  // A contiguous far cache holds cache batch 1 at kFar elements.
  REQUIRE(static_cast<int64_t>(far_elements) >= kFar + int64_t{kCapacity} * kRow);
  std::optional<GpuMemoryTurn> turn;  // held to the case's end
  if (!gpu_holds(turn, 2 * far_elements * 2, "a KV cache past 2^31 elements")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const DType dtype = DType::bf16;

  std::vector<CacheCase> cases;
  cases.push_back({});  // decoding one token with an append and RoPE: the decode kernel, split
  {
    CacheCase c;  // 64 queries: the wgmma producer reads the pages by tensor copies (sm_90a)
    c.seqlen_q = 64;
    cases.push_back(c);
  }
  {
    CacheCase c;  // no append, split counts chosen on the device
    c.append = false;
    c.rope = RopeStyle::none;
    c.dynamic = true;
    cases.push_back(c);
  }
  {
    CacheCase c;  // a contiguous cache, cache batch 1 past 2^31 elements, read through cache_batch_idx
    c.paged = false;
    c.seqlen_q = 16;
    c.num_splits = 3;
    cases.push_back(c);
  }
  {
    CacheCase c;
    c.paged = false;
    c.seqlen_q = 100;
    c.rope = RopeStyle::interleaved;
    cases.push_back(c);
  }
  {
    CacheCase c;  // a contiguous cache without cache_batch_idx: batch 1 appends and reads past 2^31 elements
    c.paged = false;
    c.batch_index = false;
    cases.push_back(c);
  }
  {
    CacheCase c;  // the same with 64 queries (wgmma producer)
    c.paged = false;
    c.batch_index = false;
    c.seqlen_q = 64;
    c.rope = RopeStyle::none;
    cases.push_back(c);
  }

  Runtime& runtime = gpu_tests_runtime();
  DeviceBuffer far_k(far_elements * 2), far_v(far_elements * 2);
  for (const CacheCase& c : cases) {
    INFO(describe(c), " seed=", seed);
    const int seqlen_new = c.append ? c.seqlen_q : 0;
    std::vector<int> cache_seqlens = {kCapacity - seqlen_new, 0};
    cache_seqlens[1] = std::uniform_int_distribution<int>(1000, kCapacity - seqlen_new)(rng);
    // Pages: a shuffled block table over the compact pool; the far pool holds
    // page p at first_far_page + p. Contiguous: cache batch 1 at kFar
    // elements in the far layout, read by batch 0 through cache_batch_idx
    // (batches swapped) or by batch 1.
    std::vector<int> pages(kPages);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::vector<int> far_pages = pages;
    for (int& page : far_pages) page += first_far_page;
    const std::vector<int> swapped_batches = {1, 0};

    const auto cache_k = random_bits(static_cast<size_t>(kPages) * kPageElements, dtype, rng);
    const auto cache_v = random_bits(static_cast<size_t>(kPages) * kPageElements, dtype, rng);
    const auto q_bits = random_bits(static_cast<size_t>(kBatch) * c.seqlen_q * kHeadsQ * kHeadDim, dtype, rng);
    const auto k_new_bits = random_bits(static_cast<size_t>(kBatch) * std::max(1, seqlen_new) * kRow, dtype, rng);
    const auto v_new_bits = random_bits(static_cast<size_t>(kBatch) * std::max(1, seqlen_new) * kRow, dtype, rng);

    // The cache's used bytes: compact at 0; far past kFar (paged: page by
    // page; contiguous: cache batch 1).
    const size_t used_bytes = cache_k.size() * 2;
    auto far_offset = [&](int64_t compact_element) -> size_t {
      if (c.paged) return static_cast<size_t>(compact_element + int64_t{first_far_page} * kPageElements) * 2;
      const int64_t cache_batch = compact_element / (int64_t{kCapacity} * kRow);
      return static_cast<size_t>(compact_element + cache_batch * (kFar - int64_t{kCapacity} * kRow)) * 2;
    };
    // Contiguous runs of the compact cache that stay contiguous far away.
    const int64_t run_elements = c.paged ? kPageElements : int64_t{kCapacity} * kRow;

    DeviceBuffer k(used_bytes), v(used_bytes);
    k.upload(cache_k.data(), used_bytes);
    v.upload(cache_v.data(), used_bytes);
    far_k.fill_bytes(0xff);
    far_v.fill_bytes(0xff);
    for (int64_t from = 0; from < static_cast<int64_t>(cache_k.size()); from += run_elements) {
      far_k.upload_at(far_offset(from), cache_k.data() + from, static_cast<size_t>(run_elements) * 2);
      far_v.upload_at(far_offset(from), cache_v.data() + from, static_cast<size_t>(run_elements) * 2);
    }

    DeviceBuffer q(q_bits.size() * 2), k_new(k_new_bits.size() * 2), v_new(v_new_bits.size() * 2);
    q.upload(q_bits.data(), q_bits.size() * 2);
    k_new.upload(k_new_bits.data(), k_new_bits.size() * 2);
    v_new.upload(v_new_bits.data(), v_new_bits.size() * 2);
    DeviceBuffer seqlens(kBatch * 4), table(kPages * 4), far_table(kPages * 4), indices(kBatch * 4);
    seqlens.upload(cache_seqlens.data(), kBatch * 4);
    table.upload(pages.data(), kPages * 4);
    far_table.upload(far_pages.data(), kPages * 4);
    indices.upload(swapped_batches.data(), kBatch * 4);

    const TensorView q_view = TensorView::contiguous(q.get(), dtype, {kBatch, c.seqlen_q, kHeadsQ, kHeadDim});
    const TensorView k_new_view = TensorView::contiguous(k_new.get(), dtype, {kBatch, seqlen_new, kHeadsKV, kHeadDim});
    const TensorView v_new_view = TensorView::contiguous(v_new.get(), dtype, {kBatch, seqlen_new, kHeadsKV, kHeadDim});
    const TensorView table_view = TensorView::contiguous(table.get(), DType::i32, {kBatch, kPagesPerSequence});
    const TensorView far_table_view = TensorView::contiguous(far_table.get(), DType::i32, {kBatch, kPagesPerSequence});
    const TensorView index_view = TensorView::contiguous(indices.get(), DType::i32, {kBatch});
    ForwardOptions options;
    options.causal = true;
    options.rope.style = c.rope;

    // Runs one layout; returns out and the LSE as bits, and the cache's used
    // rows as they are after the call.
    auto run = [&](bool is_far) {
      const DeviceBuffer& kb = is_far ? far_k : k;
      const DeviceBuffer& vb = is_far ? far_v : v;
      KVCacheArgs args;
      if (c.paged) {
        const int64_t num_pages = is_far ? first_far_page + kPages : kPages;
        args.k_cache = TensorView::contiguous(kb.get(), dtype, {num_pages, kPageSize, kHeadsKV, kHeadDim});
        args.v_cache = TensorView::contiguous(vb.get(), dtype, {num_pages, kPageSize, kHeadsKV, kHeadDim});
        args.block_table = is_far ? &far_table_view : &table_view;
      } else {
        const int64_t stride = is_far ? kFar : int64_t{kCapacity} * kRow;
        args.k_cache = batch_view(kb, dtype, kBatch, kCapacity, kHeadsKV, kHeadDim, stride);
        args.v_cache = batch_view(vb, dtype, kBatch, kCapacity, kHeadsKV, kHeadDim, stride);
        if (c.batch_index) args.cache_batch_idx = &index_view;
      }
      args.cache_seqlens = TensorView::contiguous(seqlens.get(), DType::i32, {kBatch});
      if (c.append) {
        args.k_new = &k_new_view;
        args.v_new = &v_new_view;
      }
      args.num_splits = c.num_splits;
      args.dynamic_splits = c.dynamic;
      args.max_seqlen_k = kCapacity;
      const size_t out_count = q_bits.size(), lse_count = static_cast<size_t>(kBatch) * kHeadsQ * c.seqlen_q;
      DeviceBuffer out(out_count * 2), lse(lse_count * 4);
      out.fill_bytes(0xff);
      lse.fill_bytes(0xff);
      const TensorView out_view = TensorView::contiguous(out.get(), dtype, {kBatch, c.seqlen_q, kHeadsQ, kHeadDim});
      const TensorView lse_view = TensorView::contiguous(lse.get(), DType::f32, {kBatch, kHeadsQ, c.seqlen_q});
      const size_t bytes = runtime.kvcache_workspace_bytes(q_view, args, out_view, &lse_view, options);
      DeviceBuffer workspace(bytes);  // at least 16 bytes are allocated
      workspace.fill_bytes(0xff);
      runtime.forward_kvcache(q_view, args, out_view, &lse_view, options, bytes ? workspace.get() : nullptr, bytes,
                              nullptr);
      struct {
        std::vector<uint16_t> out, lse, k, v;
      } result;
      result.out = download_words(out, out_count);
      result.lse = download_words(lse, lse_count * 2);
      result.k.resize(cache_k.size());
      result.v.resize(cache_v.size());
      for (int64_t from = 0; from < static_cast<int64_t>(cache_k.size()); from += run_elements) {
        const size_t at = is_far ? far_offset(from) : static_cast<size_t>(from) * 2;
        kb.download_at(at, result.k.data() + from, static_cast<size_t>(run_elements) * 2);
        vb.download_at(at, result.v.data() + from, static_cast<size_t>(run_elements) * 2);
      }
      return result;
    };
    const auto compact = run(false);
    const auto far = run(true);
    CHECK_MESSAGE(count_poison(compact.out) == 0, "the compact call left poison in out");
    if (c.append) CHECK_MESSAGE(compact.k != cache_k, "the compact call appended nothing to k_cache");
    check_same_bits("out", compact.out, far.out);
    check_same_bits("lse (16-bit halves)", compact.lse, far.lse);
    check_same_bits("k_cache", compact.k, far.k);
    check_same_bits("v_cache", compact.v, far.v);
  }
}

// ---- head strides ------------------------------------------------------------

// A [n0, n1, heads, head_dim] tensor stored head by head (a [heads, n0, n1,
// head_dim] buffer viewed with its heads third, as [B, H, S, D] layouts and
// heads-major page pools are): head h's n0 · n1 rows are contiguous from
// h · head_stride elements. Compact: heads back to back. Far: heads spread so
// that every head from heads / 2 on starts past 2^31 elements.
struct HeadsMajor {
  int64_t n0, n1, heads, head_dim;

  int64_t head_elements() const { return n0 * n1 * head_dim; }
  int64_t head_stride(bool is_far) const {
    if (!is_far || heads < 2) return head_elements();
    const int64_t half = heads / 2, spread = (kFar + half - 1) / half;
    return std::max(head_elements(), (spread + 7) / 8 * 8);
  }
  size_t elements(bool is_far) const {
    return static_cast<size_t>((heads - 1) * head_stride(is_far) + head_elements());
  }
  TensorView view(const DeviceBuffer& buffer, DType dtype, bool is_far) const {
    TensorView t = TensorView::contiguous(buffer.get(), dtype, {n0, n1, heads, head_dim});
    t.strides[0] = n1 * head_dim;
    t.strides[1] = head_dim;
    t.strides[2] = head_stride(is_far);
    return t;
  }
  // `bits` holds the heads one after another.
  void upload(DeviceBuffer& buffer, const std::vector<uint16_t>& bits, bool is_far) const {
    REQUIRE(bits.size() == static_cast<size_t>(heads * head_elements()));
    for (int64_t h = 0; h < heads; ++h) {
      buffer.upload_at(static_cast<size_t>(h * head_stride(is_far)) * 2, bits.data() + h * head_elements(),
                       static_cast<size_t>(head_elements()) * 2);
    }
  }
  std::vector<uint16_t> download(const DeviceBuffer& buffer, bool is_far) const {
    std::vector<uint16_t> bits(static_cast<size_t>(heads * head_elements()));
    for (int64_t h = 0; h < heads; ++h) {
      buffer.download_at(static_cast<size_t>(h * head_stride(is_far)) * 2, bits.data() + h * head_elements(),
                         static_cast<size_t>(head_elements()) * 2);
    }
    return bits;
  }
};

// Four device buffers: q, k, v and out (or k_cache and v_cache), big enough
// for the far layout of every case below (heads reach up to 2 · kFar).
struct HeadBuffers {
  static constexpr size_t kElements = static_cast<size_t>(2 * kFar + (int64_t{1} << 21));
  HeadBuffers() : q(kElements * 2), k(kElements * 2), v(kElements * 2), out(kElements * 2) {}
  DeviceBuffer q, k, v, out;
};

TEST_CASE("offsets past 2^31 elements: head strides past 4 GiB ([B, H, S, D] views)") {
  std::optional<GpuMemoryTurn> turn;  // held to the case's end
  if (!gpu_holds(turn, 4 * HeadBuffers::kElements * 2, "head strides past 2^31 elements")) return;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  Runtime& runtime = gpu_tests_runtime();
  HeadBuffers far;

  SUBCASE("dense forward") {
    // The batch-stride case's calls with at most 2 KV heads (batch 1's small
    // grids then plan the 4-warp mma.sync kernels), one query without a
    // workspace, and wgmma tiles forced.
    std::vector<DenseCase> cases;
    for (DenseCase c : dense_cases()) {
      const int group = c.heads_q / c.heads_kv;
      c.heads_kv = std::min(c.heads_kv, 2);
      c.heads_q = c.heads_kv * group;
      cases.push_back(c);
    }
    DenseCase unsplit = cases.back();  // one query over dense K/V: the decode kernel, here without a workspace
    REQUIRE((unsplit.seqlen_q == 1 && unsplit.workspace));
    unsplit.workspace = false;
    cases.push_back(unsplit);
    if (sm90a_or_skip("wgmma tiles with head strides past 2^31 elements")) {
      DenseCase c;  // d128 causal, wgmma tiles forced: K/V by tensor copies, heads as map coordinates
      c.heads_q = c.heads_kv = 2;
      c.tiles = {128, 128, 8, 2, true};
      cases.push_back(c);
      c.dtype = DType::f16;  // d64 without a mask on persistent three-warpgroup tiles
      c.head_dim = 64;
      c.seqlen_k = 2048;
      c.causal = false;
      c.tiles = {192, 128, 12, 2, true, true};
      cases.push_back(c);
    }
    for (const DenseCase& c : cases) {
      const HeadsMajor q_layout{1, c.seqlen_q, c.heads_q, c.head_dim};
      const HeadsMajor kv_layout{1, c.seqlen_k, c.heads_kv, c.head_dim};
      REQUIRE(std::max(q_layout.elements(true), kv_layout.elements(true)) <= HeadBuffers::kElements);
      const auto q_bits = random_bits(q_layout.elements(false), c.dtype, rng);
      const auto k_bits = random_bits(kv_layout.elements(false), c.dtype, rng);
      const auto v_bits = random_bits(kv_layout.elements(false), c.dtype, rng);
      DeviceBuffer q(q_bits.size() * 2), k(k_bits.size() * 2), v(v_bits.size() * 2), out(q_bits.size() * 2);
      ForwardOptions options;
      options.causal = c.causal;
      options.rope.style = c.rope;
      options.tiles = c.tiles;

      // Runs one layout; returns out and the LSE, as bits.
      auto run = [&](DeviceBuffer& qb, DeviceBuffer& kb, DeviceBuffer& vb, DeviceBuffer& ob, bool is_far) {
        for (DeviceBuffer* buffer : {&qb, &kb, &vb, &ob}) buffer->fill_bytes(0xff);
        q_layout.upload(qb, q_bits, is_far);
        kv_layout.upload(kb, k_bits, is_far);
        kv_layout.upload(vb, v_bits, is_far);
        const TensorView q_view = q_layout.view(qb, c.dtype, is_far), k_view = kv_layout.view(kb, c.dtype, is_far);
        const TensorView v_view = kv_layout.view(vb, c.dtype, is_far), out_view = q_layout.view(ob, c.dtype, is_far);
        const size_t lse_count = static_cast<size_t>(c.heads_q) * c.seqlen_q;
        DeviceBuffer lse(lse_count * 4);
        lse.fill_bytes(0xff);
        const TensorView lse_view = TensorView::contiguous(lse.get(), DType::f32, {1, c.heads_q, c.seqlen_q});
        const std::string spec = runtime.spec_for(q_view, k_view, v_view, out_view, &lse_view, options);
        if (c.workspace) {
          const size_t bytes = runtime.forward_workspace_bytes(q_view, k_view, v_view, out_view, &lse_view, options);
          CHECK(bytes > 0);
          DeviceBuffer workspace(bytes);
          workspace.fill_bytes(0xff);
          runtime.forward(q_view, k_view, v_view, out_view, &lse_view, options, workspace.get(), bytes, nullptr);
          check_cuda(driver().cuCtxSynchronize(), "cuCtxSynchronize");
        } else {
          runtime.forward(q_view, k_view, v_view, out_view, &lse_view, options, nullptr);
        }
        struct {
          std::string spec;
          std::vector<uint16_t> out, lse;
        } result{spec, q_layout.download(ob, is_far), download_words(lse, lse_count * 2)};
        return result;
      };
      const auto compact = run(q, k, v, out, false);
      INFO(describe(c, compact.spec, 1), " heads-major seed=", seed);
      MESSAGE("heads-major dense call past 2^31 elements: ", compact.spec);
      const auto spread = run(far.q, far.k, far.v, far.out, true);
      REQUIRE_MESSAGE(spread.spec == compact.spec, "the far call plans ", spread.spec);
      CHECK_MESSAGE(count_poison(compact.out) == 0, "the compact call left poison in out");
      check_same_bits("out", compact.out, spread.out);
      check_same_bits("lse (16-bit halves)", compact.lse, spread.lse);
    }
  }

  SUBCASE("a KV cache with an append") {
    constexpr int kHeadsQ = 8, kHeadsKV = 2, kHeadDim = 128, kCapacity = 4096, kPageSize = 64;
    constexpr int kPages = kCapacity / kPageSize;
    const DType dtype = DType::bf16;
    struct HeadCacheCase {
      int seqlen_q;
      RopeStyle rope;
      bool paged;
    };
    const std::vector<HeadCacheCase> cases = {
        {1, RopeStyle::rotate_half, false},  // the append and decode kernels, split and combined
        {64, RopeStyle::none, false},        // the wgmma producer by tensor copies (sm_90a)
        {1, RopeStyle::interleaved, true},   // a heads-major page pool, shuffled block table
        {64, RopeStyle::rotate_half, true},  // the same through the wgmma producer, K rotated as it is appended
    };
    for (const HeadCacheCase& c : cases) {
      INFO(fmt::format("bf16 batch=1 heads={}/{} head_dim={} seqlen_q={} (appended) rope={} paged={} seed={}", kHeadsQ,
                       kHeadsKV, kHeadDim, c.seqlen_q, static_cast<int>(c.rope), c.paged, seed));
      const HeadsMajor q_layout{1, c.seqlen_q, kHeadsQ, kHeadDim};
      const HeadsMajor cache_layout = c.paged ? HeadsMajor{kPages, kPageSize, kHeadsKV, kHeadDim}
                                              : HeadsMajor{1, kCapacity, kHeadsKV, kHeadDim};
      const auto q_bits = random_bits(q_layout.elements(false), dtype, rng);
      const auto cache_k = random_bits(cache_layout.elements(false), dtype, rng);
      const auto cache_v = random_bits(cache_layout.elements(false), dtype, rng);
      const auto k_new_bits = random_bits(static_cast<size_t>(c.seqlen_q) * kHeadsKV * kHeadDim, dtype, rng);
      const auto v_new_bits = random_bits(static_cast<size_t>(c.seqlen_q) * kHeadsKV * kHeadDim, dtype, rng);
      const int cache_seqlen = std::uniform_int_distribution<int>(1000, kCapacity - c.seqlen_q)(rng);
      std::vector<int> pages(kPages);
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), rng);

      DeviceBuffer k_new(k_new_bits.size() * 2), v_new(v_new_bits.size() * 2), seqlens(4), table(kPages * 4);
      k_new.upload(k_new_bits.data(), k_new_bits.size() * 2);
      v_new.upload(v_new_bits.data(), v_new_bits.size() * 2);
      seqlens.upload(&cache_seqlen, 4);
      table.upload(pages.data(), kPages * 4);
      const TensorView k_new_view = TensorView::contiguous(k_new.get(), dtype, {1, c.seqlen_q, kHeadsKV, kHeadDim});
      const TensorView v_new_view = TensorView::contiguous(v_new.get(), dtype, {1, c.seqlen_q, kHeadsKV, kHeadDim});
      const TensorView table_view = TensorView::contiguous(table.get(), DType::i32, {1, kPages});
      ForwardOptions options;
      options.causal = true;
      options.rope.style = c.rope;

      // Runs one layout; returns the attention's spec, out and the LSE as
      // bits, and the caches as they are after the call.
      auto run = [&](DeviceBuffer& qb, DeviceBuffer& kb, DeviceBuffer& vb, DeviceBuffer& ob, bool is_far) {
        for (DeviceBuffer* buffer : {&qb, &kb, &vb, &ob}) buffer->fill_bytes(0xff);
        q_layout.upload(qb, q_bits, is_far);
        cache_layout.upload(kb, cache_k, is_far);
        cache_layout.upload(vb, cache_v, is_far);
        KVCacheArgs args;
        args.k_cache = cache_layout.view(kb, dtype, is_far);
        args.v_cache = cache_layout.view(vb, dtype, is_far);
        if (c.paged) args.block_table = &table_view;
        args.cache_seqlens = TensorView::contiguous(seqlens.get(), DType::i32, {1});
        args.k_new = &k_new_view;
        args.v_new = &v_new_view;
        const TensorView q_view = q_layout.view(qb, dtype, is_far), out_view = q_layout.view(ob, dtype, is_far);
        const size_t lse_count = static_cast<size_t>(kHeadsQ) * c.seqlen_q;
        DeviceBuffer lse(lse_count * 4);
        lse.fill_bytes(0xff);
        const TensorView lse_view = TensorView::contiguous(lse.get(), DType::f32, {1, kHeadsQ, c.seqlen_q});
        const size_t bytes = runtime.kvcache_workspace_bytes(q_view, args, out_view, &lse_view, options);
        DeviceBuffer workspace(bytes);  // at least 16 bytes are allocated
        workspace.fill_bytes(0xff);
        void* workspace_pointer = bytes ? workspace.get() : nullptr;
        const std::string spec =
            detail::plan_kvcache(q_view, args, out_view, &lse_view, options, workspace_pointer, bytes, false,
                                 detail::Arch::parse(current_arch()), current_max_smem_per_block(), current_sm_count())
                .attention.spec.text();
        runtime.forward_kvcache(q_view, args, out_view, &lse_view, options, workspace_pointer, bytes, nullptr);
        struct {
          std::string spec;
          std::vector<uint16_t> out, lse, k, v;
        } result{spec, q_layout.download(ob, is_far), download_words(lse, lse_count * 2),
                 cache_layout.download(kb, is_far), cache_layout.download(vb, is_far)};
        return result;
      };
      DeviceBuffer q(q_bits.size() * 2), out(q_bits.size() * 2), k(cache_k.size() * 2), v(cache_v.size() * 2);
      const auto compact = run(q, k, v, out, false);
      MESSAGE("heads-major KV cache past 2^31 elements, seqlen_q=", c.seqlen_q, " paged=", c.paged, ": ",
              compact.spec);
      const auto spread = run(far.q, far.k, far.v, far.out, true);
      REQUIRE_MESSAGE(spread.spec == compact.spec, "the far call plans ", spread.spec);
      CHECK_MESSAGE(count_poison(compact.out) == 0, "the compact call left poison in out");
      CHECK_MESSAGE(compact.k != cache_k, "the compact call appended nothing to k_cache");
      check_same_bits("out", compact.out, spread.out);
      check_same_bits("lse (16-bit halves)", compact.lse, spread.lse);
      check_same_bits("k_cache", compact.k, spread.k);
      check_same_bits("v_cache", compact.v, spread.v);
    }
  }
}

}  // namespace
