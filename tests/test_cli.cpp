// The jitattn command-line tool, run as a separate process (JITATTN_CLI_PATH)
// with its cache in a fresh temporary directory per test. NVRTC compiles cost
// about a second each, so only a handful of tests compile anything.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>

#include "cache.hpp"
#include "plan.hpp"
#include "render.hpp"
#include "cli/presets.hpp"
#include "spec.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using jitattn::detail::Arch;
using jitattn::detail::KernelSpec;

std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string read_text(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

struct CliRun {
  int status = -1;
  std::string out;
  std::string err;
};

// A fresh temporary directory holding the cache and any files a test writes;
// removed afterwards.
class CliSandbox {
 public:
  CliSandbox() {
    char pattern[] = "/tmp/jitattn-cli-test-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    root_ = pattern;
    cache_dir_ = root_ + "/cache";
  }
  ~CliSandbox() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  CliSandbox(const CliSandbox&) = delete;
  CliSandbox& operator=(const CliSandbox&) = delete;

  const std::string& root() const { return root_; }
  const std::string& cache_dir() const { return cache_dir_; }

  // Runs `jitattn <args>` with only this sandbox's cache directory in its
  // environment (extra_env: more VAR=value words); stdout and stderr apart.
  CliRun run(const std::string& args, const std::string& extra_env = "") const {
    const std::string err_path = root_ + "/stderr.txt";
    const std::string command =
        fmt::format("env -u JITATTN_LOG -u JITATTN_TEMPLATE_DIR JITATTN_CACHE_DIR={} {} {} {} 2>{}",
                    shell_quoted(cache_dir_), extra_env, shell_quoted(JITATTN_CLI_PATH), args, shell_quoted(err_path));
    CliRun result;
    FILE* pipe = ::popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) result.out.append(buffer, n);
    const int status = ::pclose(pipe);
    result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.err = read_text(err_path);
    return result;
  }

  json run_json(const std::string& args) const {
    const CliRun result = run(args);
    INFO("stderr: " << result.err);
    REQUIRE(result.status == 0);
    return json::parse(result.out);
  }

  std::string write_file(const std::string& name, const std::string& text) const {
    const std::string path = root_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

 private:
  std::string root_;
  std::string cache_dir_;
};

// The table row of `spec` in warm's or list's output ("" if none).
std::string row_of(const std::string& table, const std::string& spec) {
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(spec + " ", 0) == 0) return line;
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const char* const kSmallSpec = "fwd.f16.d64.br64.bc64.w4";

// ---- plan: what the planner itself says for a call ----------------------------

// Fake, 256-byte aligned device addresses: planning never dereferences them.
void* plan_address(uintptr_t slot) { return reinterpret_cast<void*>(slot << 32); }

// V's rows right after K's: jitattn::cli::values_after (presets.hpp).
using jitattn::cli::values_after;

struct ExpectedLaunch {
  std::string role;
  KernelSpec spec;
  unsigned grid = 0;
  int splits = 1;              // attention only
  size_t workspace_bytes = 0;  // attention only
};

ExpectedLaunch attention_expected(const jitattn::detail::ForwardPlan& plan) {
  return {"attention", plan.spec, plan.grid, plan.num_splits, plan.workspace_bytes};
}

// The launches of a call given a workspace, as the runtime makes them:
// sized by a sizing-only plan, then planned with exactly that many bytes
// (`plan_with(workspace, bytes, sizing_only)`; only that plan holds the
// combine).
template <typename PlanWith>
std::vector<ExpectedLaunch> expected_with_workspace(const PlanWith& plan_with) {
  const size_t bytes = plan_with(nullptr, 0, true).attention.workspace_bytes;
  const auto plan = plan_with(bytes > 0 ? plan_address(7) : nullptr, bytes, false);
  std::vector<ExpectedLaunch> launches;
  if constexpr (std::is_same_v<std::decay_t<decltype(plan)>, jitattn::detail::KVCachePlan>) {
    if (plan.append.grid > 0) launches.push_back({"append", plan.append.spec, plan.append.grid});
  }
  launches.push_back(attention_expected(plan.attention));
  if (plan.combine.grid > 0) launches.push_back({"combine", plan.combine.spec, plan.combine.grid});
  return launches;
}

// forward() with a workspace of forward_workspace_bytes(), planned directly.
std::vector<ExpectedLaunch> planned_forward(jitattn::DType dtype, int64_t batch, int64_t seqlen, int64_t heads,
                                            int64_t heads_kv, int head_dim, const jitattn::ForwardOptions& options,
                                            const char* arch, int smem, int sm_count,
                                            const jitattn::detail::TuningTable* tuning = nullptr) {
  using jitattn::TensorView;
  const TensorView q = TensorView::contiguous(plan_address(1), dtype, {batch, seqlen, heads, head_dim});
  const TensorView k = TensorView::contiguous(plan_address(2), dtype, {batch, seqlen, heads_kv, head_dim});
  const TensorView v = TensorView::contiguous(plan_address(3), dtype, {batch, seqlen, heads_kv, head_dim});
  const TensorView out = TensorView::contiguous(plan_address(4), dtype, {batch, seqlen, heads, head_dim});
  const Arch target = Arch::parse(arch);
  return expected_with_workspace([&](void* workspace, size_t bytes, bool sizing_only) {
    return jitattn::detail::plan_forward_split(q, k, v, out, nullptr, options, workspace, bytes, sizing_only, target,
                                               smem, sm_count, tuning);
  });
}

// forward_kvcache() with a workspace of kvcache_workspace_bytes(), planned
// directly: batch sequences of seqlen_q queries over a cache of cache_len
// rows (pages of `page` rows, or contiguous), appending new_tokens keys.
std::vector<ExpectedLaunch> planned_kvcache(int64_t batch, int64_t seqlen_q, int64_t cache_len, int page,
                                            int64_t new_tokens, int64_t heads, int64_t heads_kv, int splits,
                                            int max_seqlen_k, const jitattn::ForwardOptions& options) {
  using jitattn::DType;
  using jitattn::TensorView;
  const TensorView q = TensorView::contiguous(plan_address(1), DType::bf16, {batch, seqlen_q, heads, 128});
  const TensorView cache =
      page == 0 ? TensorView::contiguous(plan_address(2), DType::bf16, {batch, cache_len, heads_kv, 128})
                : TensorView::contiguous(plan_address(2), DType::bf16, {batch * cache_len / page, page, heads_kv, 128});
  const TensorView table = TensorView::contiguous(plan_address(3), DType::i32, {batch, cache_len / std::max(page, 1)});
  const TensorView k_new = TensorView::contiguous(plan_address(4), DType::bf16, {batch, new_tokens, heads_kv, 128});
  jitattn::KVCacheArgs args;
  args.k_cache = cache;
  args.v_cache = values_after(cache);
  args.cache_seqlens = TensorView::contiguous(plan_address(5), DType::i32, {batch});
  if (page > 0) args.block_table = &table;
  if (new_tokens > 0) args.k_new = args.v_new = &k_new;
  args.num_splits = splits;
  args.max_seqlen_k = max_seqlen_k;
  const Arch hopper = Arch::parse("sm_90a");
  return expected_with_workspace([&](void* workspace, size_t bytes, bool sizing_only) {
    return jitattn::detail::plan_kvcache(q, args, q, nullptr, options, workspace, bytes, sizing_only, hopper, 232448,
                                         132);
  });
}

// forward_varlen() for a step of `batch` packed sequences (total_q query rows,
// the longest max_q queries over max_k keys; 32 query heads over 8 KV heads,
// d128, bf16, H200), planned directly: with a workspace of
// forward_varlen_workspace_bytes() or without one; over packed k/v of batch ×
// max_k rows, or pages of `page` rows read through a block table and
// seqused_k.
std::vector<ExpectedLaunch> planned_varlen(int64_t batch, int64_t total_q, int max_q, int max_k, int page,
                                           bool workspace, bool dynamic_splits, const jitattn::ForwardOptions& options) {
  using jitattn::DType;
  using jitattn::TensorView;
  const TensorView q = TensorView::contiguous(plan_address(1), DType::bf16, {total_q, 32, 128});
  const int64_t pages = (max_k + std::max(page, 1) - 1) / std::max(page, 1);
  const TensorView kv = page == 0 ? TensorView::contiguous(plan_address(2), DType::bf16, {batch * max_k, 8, 128})
                                  : TensorView::contiguous(plan_address(2), DType::bf16, {batch * pages, page, 8, 128});
  const TensorView values = page == 0 ? kv : values_after(kv);
  const TensorView table = TensorView::contiguous(plan_address(3), DType::i32, {batch, pages});
  const TensorView used = TensorView::contiguous(plan_address(4), DType::i32, {batch});
  jitattn::VarlenArgs varlen;
  varlen.cu_seqlens_q = TensorView::contiguous(plan_address(5), DType::i32, {batch + 1});
  if (page == 0) {
    varlen.cu_seqlens_k = TensorView::contiguous(plan_address(6), DType::i32, {batch + 1});
  } else {
    varlen.block_table = &table;
    varlen.seqused_k = &used;
  }
  varlen.max_seqlen_q = max_q;
  varlen.max_seqlen_k = max_k;
  varlen.dynamic_splits = dynamic_splits;
  const Arch hopper = Arch::parse("sm_90a");
  if (!workspace) {
    return {attention_expected(
        jitattn::detail::plan_forward_varlen(q, kv, values, q, nullptr, varlen, options, hopper, 232448, 132))};
  }
  return expected_with_workspace([&](void* workspace, size_t bytes, bool sizing_only) {
    return jitattn::detail::plan_forward_varlen_split(q, kv, values, q, nullptr, varlen, options, workspace, bytes,
                                                      sizing_only, hopper, 232448, 132);
  });
}

// The launches of `plan --json` are the expected ones, in order, and the
// text table shows the same rows.
void check_launches(const CliSandbox& sandbox, const std::string& args, const std::vector<ExpectedLaunch>& expected) {
  const json planned = sandbox.run_json("plan " + args + " --json");
  INFO("plan " << args << "\n" << planned.dump(2));
  REQUIRE(planned["launches"].size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const json& launch = planned["launches"][i];
    const ExpectedLaunch& want = expected[i];
    CHECK(launch["launch"] == want.role);
    CHECK(launch["spec"] == want.spec.text());
    CHECK(launch["grid"] == want.grid);
    CHECK(launch["threads"] == want.spec.threads());
    CHECK(launch["smem_bytes"] == want.spec.smem_bytes());
    if (want.role == "attention") {
      CHECK(launch["splits"] == want.splits);
      CHECK(launch["workspace_bytes"] == want.workspace_bytes);
    }
  }
  const CliRun text = sandbox.run("plan " + args);
  REQUIRE(text.status == 0);
  for (const ExpectedLaunch& want : expected) {
    const std::string row = row_of(text.out, want.role);
    CHECK_MESSAGE(contains(row, " " + want.spec.text() + " "), row);
    CHECK_MESSAGE(contains(row, fmt::format(" {} ", want.grid)), row);
  }
}

// Calls a model preset must have warmed, planned as a caller makes them
// (other head counts, batches and lengths than the preset's own sweeps, so
// that the check is of what the preset covers, not a copy of it), each
// kernel handed to expect_warmed(spec, call):
//   - prefill: forward() and a varlen step over packed k/v, for each
//     (batch, seqlen, heads, heads_kv);
//   - decoding and speculative tokens over a KV cache of 16384 rows with new
//     keys appended, for each (batch, query tokens) and page size (0:
//     contiguous), split by the heuristic, unsplit, and dynamically, with a
//     workspace, so split calls' combines are planned too.
// options_for(positions) gives the call's options (RoPE tables of
// `positions` rows where the caller uses tables).
struct PresetCalls {
  int head_dim = 128;
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> prefill;
  int64_t decode_heads = 32, decode_heads_kv = 8;
  std::vector<std::tuple<int64_t, int64_t, int64_t>> decode;  // batch, tokens, cache rows
  std::vector<int> pages;
};

template <class OptionsFor, class ExpectWarmed>
void expect_calls_warmed(const PresetCalls& calls, const Arch& arch, OptionsFor&& options_for,
                         ExpectWarmed&& expect_warmed) {
  using jitattn::DType;
  using jitattn::TensorView;
  auto address = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  const int max_smem = jitattn::cli::max_smem_of(arch);
  const int64_t d = calls.head_dim;
  for (const auto& [batch, seqlen, heads, heads_kv] : calls.prefill) {
    const std::string call = fmt::format("prefill batch={} seqlen={} heads={}/{}", batch, seqlen, heads, heads_kv);
    const jitattn::ForwardOptions options = options_for(seqlen);
    const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, seqlen, heads, d});
    const TensorView kv = TensorView::contiguous(address(0x20000), DType::bf16, {batch, seqlen, heads_kv, d});
    expect_warmed(jitattn::detail::plan_forward(q, kv, values_after(kv), q, nullptr, options, arch, max_smem, 132).spec, call);
    // With a workspace: split where the tiles are few.
    const auto split = jitattn::detail::plan_forward_split(q, kv, values_after(kv), q, nullptr, options, nullptr, 0,
                                                           /*sizing_only=*/true, arch, max_smem, 132);
    expect_warmed(split.attention.spec, call + " (workspace)");
    if (split.attention.spec.split) {
      expect_warmed(jitattn::detail::KernelSpec::combine(DType::f32, DType::bf16, false, false, split.attention.spec.sink),
                    call + " (combine)");
    }
    const TensorView packed_q = TensorView::contiguous(address(0x10000), DType::bf16, {batch * seqlen, heads, d});
    const TensorView packed_kv = TensorView::contiguous(address(0x20000), DType::bf16, {batch * seqlen, heads_kv, d});
    jitattn::VarlenArgs varlen;
    varlen.cu_seqlens_q = varlen.cu_seqlens_k = TensorView::contiguous(address(0x40000), DType::i32, {batch + 1});
    varlen.max_seqlen_q = varlen.max_seqlen_k = static_cast<int>(seqlen);
    expect_warmed(jitattn::detail::plan_forward_varlen(packed_q, packed_kv, packed_kv, packed_q, nullptr, varlen,
                                                       options, arch, max_smem, 132)
                      .spec,
                  "varlen " + call);
  }
  // Caches of 16384 rows, and of 2048 (where head dims up to 64 take chunks of their own).
  for (const auto& [batch, tokens, capacity] : calls.decode) {
    for (int page : calls.pages) {
      for (const auto& [splits, dynamic] : {std::pair<int, bool>{0, false}, {1, false}, {0, true}}) {
        const int64_t heads_kv = calls.decode_heads_kv;
        const std::string call = fmt::format("kvcache batch={} tokens={} capacity={} page={} splits={} dynamic={}", batch,
                                             tokens, capacity, page, splits, dynamic);
        const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, tokens, calls.decode_heads, d});
        const TensorView k_new = TensorView::contiguous(address(0x20000), DType::bf16, {batch, tokens, heads_kv, d});
        const TensorView table =
            TensorView::contiguous(address(0x30000), DType::i32, {batch, capacity / std::max(page, 1)});
        jitattn::KVCacheArgs args;
        args.k_cache = page == 0 ? TensorView::contiguous(address(0x40000), DType::bf16, {batch, capacity, heads_kv, d})
                                 : TensorView::contiguous(address(0x40000), DType::bf16,
                                                          {batch * capacity / page, page, heads_kv, d});
        args.v_cache = values_after(args.k_cache);
        args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
        args.block_table = page == 0 ? nullptr : &table;
        args.k_new = args.v_new = &k_new;
        args.num_splits = splits;
        args.dynamic_splits = dynamic;
        const auto plan = jitattn::detail::plan_kvcache(q, args, q, nullptr, options_for(capacity), address(0x100000),
                                                        size_t{1} << 32, false, arch, max_smem, 132);
        expect_warmed(plan.attention.spec, call);
        expect_warmed(plan.append.spec, call + " (append)");
        if (plan.combine.grid > 0) expect_warmed(plan.combine.spec, call + " (combine)");
      }
    }
  }
}

}  // namespace

TEST_SUITE("cli") {

TEST_CASE("--version prints the library version") {
  CliSandbox sandbox;
  const CliRun result = sandbox.run("--version");
  CHECK(result.status == 0);
  CHECK(result.out == "jitattn " + jitattn::version() + "\n");
}

TEST_CASE("source prints the rendered kernel, byte-identical across runs") {
  CliSandbox sandbox;
  const std::string spec = "fwd.bf16.d64.br128.bc64.w4";
  const CliRun first = sandbox.run("source " + spec);
  REQUIRE(first.status == 0);
  CHECK(contains(first.out, "jitattn_fwd"));
  CHECK(contains(first.out, spec));
  for (const char* constant : {"/*HEAD_DIM=*/64", "/*BLOCK_Q=*/128", "/*BLOCK_KV=*/64", "/*WARPS=*/4", "/*MASK=*/jitattn::kMaskNone"}) {
    CHECK_MESSAGE(contains(first.out, constant), constant);
  }
  CHECK(sandbox.run("source " + spec).out == first.out);
  // Exactly what the library compiles, so reading it shows what NVRTC sees.
  CHECK(first.out == jitattn::detail::render(KernelSpec::parse(spec), jitattn::detail::TemplateSet()));
}

TEST_CASE("source with a bad spec fails naming the bad field") {
  CliSandbox sandbox;
  const CliRun result = sandbox.run("source fwd.bf16.x64.br128.bc64.w4");
  CHECK(result.status == 1);
  CHECK(result.out.empty());
  CHECK(contains(result.err, "jitattn: "));
  CHECK(contains(result.err, "dN (head dim)"));
}

TEST_CASE("warm compiles on a miss, hits the cache the second time, and list shows the entry") {
  CliSandbox sandbox;
  const std::string args = fmt::format("warm {} --arch sm_80", kSmallSpec);

  const CliRun first = sandbox.run(args);
  INFO("stdout: " << first.out << "\nstderr: " << first.err);
  REQUIRE(first.status == 0);
  const std::string first_row = row_of(first.out, kSmallSpec);
  CHECK(contains(first_row, "sm_80"));
  CHECK(contains(first_row, " miss "));
  CHECK(contains(first.out, "total: 1 kernel, 1 miss"));
  CHECK(first.err.empty());  // no progress bar off a terminal

  const CliRun second = sandbox.run(args);
  REQUIRE(second.status == 0);
  CHECK(contains(row_of(second.out, kSmallSpec), " hit "));
  const json hit = sandbox.run_json(args + " --json");
  REQUIRE(hit.size() == 1);
  CHECK(hit[0]["result"] == "hit");
  CHECK(hit[0]["cubin_bytes"].get<size_t>() > 0);

  const CliRun listed = sandbox.run("list");
  REQUIRE(listed.status == 0);
  CHECK(contains(row_of(listed.out, kSmallSpec), "sm_80"));
  const json entries = sandbox.run_json("list --json");
  REQUIRE(entries.size() == 1);
  CHECK(entries[0]["spec"] == kSmallSpec);
  CHECK(entries[0]["arch"] == "sm_80");
  CHECK(entries[0]["valid"] == true);
}

TEST_CASE("warm fails, naming the cache directory, where the kernels it compiles cannot be stored") {
  // A deployment step that warms a cache must not pass with nothing in it.
  CliSandbox sandbox;
  sandbox.write_file("afile", "x");
  const std::string blocked = sandbox.root() + "/afile/cache";  // beneath a regular file: no one can create it
  const CliRun unwritable = sandbox.run(fmt::format("--cache-dir {} warm {} --arch sm_80", blocked, kSmallSpec));
  INFO("stdout: " << unwritable.out << "\nstderr: " << unwritable.err);
  CHECK(unwritable.status == 1);
  CHECK(contains(unwritable.err, fmt::format("{} for sm_80 compiled but not stored in the disk cache {}", kSmallSpec,
                                             blocked)));
  CHECK(contains(unwritable.out, "1 failed"));
  // --page-size only widens presets' sweeps: with specs alone it would be ignored.
  const CliRun pages = sandbox.run(fmt::format("warm {} --arch sm_80 --page-size 8", kSmallSpec));
  CHECK(pages.status != 0);
  CHECK(contains(pages.err, "--page-size: adds page sizes to the presets' paged sweeps, and no preset is warmed"));
  const CliRun disabled = sandbox.run(fmt::format("--cache-dir '' warm {} --arch sm_80", kSmallSpec));
  INFO("stdout: " << disabled.out << "\nstderr: " << disabled.err);
  CHECK(disabled.status == 1);
  CHECK(contains(disabled.err, "the disk cache is disabled (no cache directory)"));
}

TEST_CASE("warm --manifest skips comments and blank lines, honours @ARCH, and runs -j 2") {
  CliSandbox sandbox;
  const std::string manifest = sandbox.write_file("kernels.txt",
                                                  "# kernels for the test\n"
                                                  "\n"
                                                  "fwd.f16.d64.br64.bc64.w4\n"
                                                  "   fwd.bf16.d64.br64.bc64.w4.causal @sm_90a   # pinned\n");
  const json results = sandbox.run_json(fmt::format("warm --manifest {} --arch sm_80 -j 2 --json", shell_quoted(manifest)));
  REQUIRE(results.size() == 2);
  std::set<std::pair<std::string, std::string>> warmed;
  for (const json& result : results) {
    CHECK(result["result"] == "miss");
    warmed.emplace(result["spec"].get<std::string>(), result["arch"].get<std::string>());
  }
  CHECK(warmed == std::set<std::pair<std::string, std::string>>{{"fwd.f16.d64.br64.bc64.w4", "sm_80"},
                                                                {"fwd.bf16.d64.br64.bc64.w4.causal", "sm_90a"}});
}

TEST_CASE("list --manifest prints a cache's kernels for warm --manifest on another host") {
  CliSandbox staging;
  const std::string manifest = staging.write_file("kernels.txt", "fwd.f16.d64.br64.bc64.w4 @sm_80 @sm_90a\n"
                                                                 "fwd.bf16.d64.br64.bc64.w4.causal @sm_90a\n");
  REQUIRE(staging.run(fmt::format("warm --manifest {}", shell_quoted(manifest))).status == 0);
  const CliRun listed = staging.run("list --manifest");
  REQUIRE(listed.status == 0);
  // A comment naming the count and the cache, then each kernel once, sorted.
  const std::string kernels = "fwd.bf16.d64.br64.bc64.w4.causal @sm_90a\n"
                              "fwd.f16.d64.br64.bc64.w4 @sm_80\n"
                              "fwd.f16.d64.br64.bc64.w4 @sm_90a\n";
  CHECK(contains(listed.out, "# 3 kernels in "));
  CHECK(listed.out.substr(listed.out.find('\n') + 1) == kernels);
  // Another cache warmed from that list holds the same kernels.
  CliSandbox deploy;
  const std::string copied = deploy.write_file("from-staging.txt", listed.out);
  const json results = deploy.run_json(fmt::format("warm --manifest {} --json", shell_quoted(copied)));
  CHECK(results.size() == 3);
  const CliRun relisted = deploy.run("list --manifest");
  CHECK(relisted.out.substr(relisted.out.find('\n') + 1) == kernels);
  CHECK(deploy.run("list --manifest --json").status != 0);
}

TEST_CASE("a bad manifest line fails before compiling, naming the file and line") {
  CliSandbox sandbox;
  const std::string manifest = sandbox.write_file("bad.txt", "# ok\nfwd.f16.d64.br64.bc64.w4\nfwd.f16.d64.br64.bc64.w3\n");
  const CliRun result = sandbox.run(fmt::format("warm --manifest {} --arch sm_80", shell_quoted(manifest)));
  CHECK(result.status == 1);
  CHECK(contains(result.err, manifest + ":3:"));
  CHECK(contains(result.err, "w=3"));
  CHECK(sandbox.run_json("list --json").empty());
}

TEST_CASE("warm --preset with an unknown name fails listing the known presets") {
  CliSandbox sandbox;
  const CliRun result = sandbox.run("warm --preset llama9-1t --arch sm_80");
  CHECK(result.status == 1);
  CHECK(contains(result.err, "unknown preset 'llama9-1t'"));
  for (const char* known : {"default", "llama3-8b", "llama3-70b", "mistral-7b", "qwen2.5-7b", "gpt2", "bert-base", "gpt-oss"}) {
    CHECK_MESSAGE(contains(result.err, known), known);
  }
}

// Engines whose block size the presets do not sweep (SGLang's single rows,
// pages of 8) warm their kernels with --page-size: the decode kernel's
// .pagedN specs and the prefill tiles those pages take. Random decoding,
// speculative and chunked-prefill calls over such pages then find theirs.
TEST_CASE("warm --page-size adds an engine's page sizes to the presets' paged sweeps") {
  using jitattn::DType;
  using jitattn::TensorView;
  auto address = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  auto texts_of = [](const std::vector<KernelSpec>& specs) {
    std::set<std::string> texts;
    for (const KernelSpec& spec : specs) texts.insert(spec.text());
    return texts;
  };
  const Arch hopper = Arch::parse("sm_90a");
  const std::set<std::string> plain = texts_of(jitattn::cli::preset_specs("llama3-8b", hopper));
  const std::set<std::string> paged = texts_of(jitattn::cli::preset_specs("llama3-8b", hopper, nullptr, {1, 8}));
  for (const std::string& text : plain) CHECK_MESSAGE(paged.count(text) == 1, text);  // only additions
  // Specs with this whole field (".paged1", not ".paged16").
  auto count_with = [](const std::set<std::string>& texts, const std::string& field) {
    return std::count_if(texts.begin(), texts.end(),
                         [&](const std::string& t) { return (t + ".").find(field + ".") != std::string::npos; });
  };
  CHECK(count_with(plain, ".paged1") == 0);
  CHECK(count_with(paged, ".paged1") > 0);
  CHECK(count_with(paged, ".paged8") > 0);
  CHECK_THROWS_WITH_AS(jitattn::cli::preset_specs("llama3-8b", hopper, nullptr, {12}),
                       doctest::Contains("page size 12: a paged cache's pages are a power of two rows"),
                       jitattn::Error);

  std::mt19937 rng(20261126);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t hq = 32, hk = 8, d = 128;
  size_t planned = 0;
  for (const char* arch_text : {"sm_90a", "sm_80"}) {
    const Arch arch = Arch::parse(arch_text);
    const int max_smem = jitattn::cli::max_smem_of(arch);
    const std::set<std::string> warmed = texts_of(jitattn::cli::preset_specs("llama3-8b", arch, nullptr, {1, 2, 8}));
    for (int i = 0; i < 60; ++i) {
      const int64_t page = int64_t{1} << (3 * uniform(0, 1) + uniform(0, 1));  // 1, 2, 8 or 16
      const int64_t batch = int64_t{1} << uniform(0, 7);
      const int64_t tokens = i % 3 == 0 ? 1 : i % 3 == 1 ? uniform(2, 16) : 1024;
      const int64_t chunk_batch = tokens == 1024 ? 1 : batch;
      const int64_t capacity = std::max<int64_t>(tokens, int64_t{256} << uniform(0, 8));
      const int64_t pages_per_seq = capacity / page;
      const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {chunk_batch, tokens, hq, d});
      const TensorView k_new = TensorView::contiguous(address(0x20000), DType::bf16, {chunk_batch, tokens, hk, d});
      const TensorView table = TensorView::contiguous(address(0x30000), DType::i32, {chunk_batch, pages_per_seq});
      jitattn::KVCacheArgs args;
      args.k_cache = TensorView::contiguous(address(0x40000), DType::bf16, {chunk_batch * pages_per_seq, page, hk, d});
      args.v_cache = values_after(args.k_cache);
      args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {chunk_batch});
      args.block_table = &table;
      if (i % 2 == 0) args.k_new = args.v_new = &k_new;
      jitattn::ForwardOptions options;
      options.causal = true;
      const std::string call = fmt::format("{} page={} batch={} tokens={} capacity={}", arch_text, page, chunk_batch,
                                           tokens, capacity);
      const auto plan = jitattn::detail::plan_kvcache(q, args, q, nullptr, options, address(0x100000), size_t{1} << 36,
                                                      false, arch, max_smem, 132);
      for (const KernelSpec* spec : {&plan.attention.spec, plan.append.grid > 0 ? &plan.append.spec : nullptr,
                                     plan.combine.grid > 0 ? &plan.combine.spec : nullptr}) {
        if (spec == nullptr) continue;
        ++planned;
        CHECK_MESSAGE(warmed.count(spec->text()) == 1, fmt::format("{} not warmed ({})", spec->text(), call));
      }
    }
  }
  CHECK(planned >= 120);
}

TEST_CASE("presets expand to every tile configuration the planner picks for a class") {
  const Arch hopper = Arch::parse("sm_90a");
  const std::vector<KernelSpec> specs = jitattn::cli::preset_specs("default", hopper);
  std::set<std::string> texts, all_texts;  // prefill specs; every spec
  for (const KernelSpec& spec : specs) {
    // Split and packed-GQA specs are forward() with few query rows (checked
    // below for llama3-8b), varlen ones forward_varlen's, RoPE ones are
    // checked in "model presets warm their RoPE kernels".
    if (spec.family == jitattn::detail::Family::fwd && !spec.kvcache && !spec.split && !spec.pack_gqa && !spec.varlen &&
        spec.rope == jitattn::detail::RopeKind::none) {
      texts.insert(spec.text());
    }
    all_texts.insert(spec.text());
    CHECK(KernelSpec::parse(spec.text()) == spec);
  }
  CHECK(all_texts.size() == specs.size());  // no spec twice
  // Exactly the planner's choices over every seqlen bucket of the 8 classes:
  // warming the preset leaves nothing for a first call to compile.
  std::set<std::string> planned;
  for (jitattn::DType dtype : {jitattn::DType::bf16, jitattn::DType::f16}) {
    for (int head_dim : {64, 128}) {
      for (bool causal : {false, true}) {
        for (int bucket = 512; bucket <= 16384; bucket *= 2) {
          const jitattn::TileConfig tiles = jitattn::detail::default_tiles(dtype, head_dim, causal, hopper, bucket);
          planned.insert(KernelSpec{jitattn::detail::Family::fwd, dtype, head_dim, tiles.block_q, tiles.block_kv,
                                    tiles.warps, causal}
                             .text());
        }
        // And the wgmma tiles the planner takes once they fill the GPU, in
        // ordinary and persistent grids, and at 128 its 176-key blocks of
        // long calls.
        if (const auto wgmma = jitattn::detail::wgmma_tiles(head_dim, /*rope=*/false, hopper)) {
          KernelSpec spec{jitattn::detail::Family::fwd, dtype, head_dim};
          spec.causal = causal;
          jitattn::detail::apply_tiles(spec, *wgmma);
          planned.insert(spec.text());
          spec.persistent = true;
          planned.insert(spec.text());
          if (head_dim == 128) {
            spec.persistent = false;
            spec.block_kv = 176;
            planned.insert(spec.text());
          }
          // At 64, without a mask, 128-row tiles where a sequence's rows
          // would leave 192-row ones mostly empty (a few hundred tokens),
          // ordinary and persistent.
          if (head_dim == 64 && !causal) {
            KernelSpec short_rows{jitattn::detail::Family::fwd, dtype, head_dim};
            jitattn::detail::apply_tiles(short_rows, jitattn::TileConfig{128, 128, 8, 4, true});
            planned.insert(short_rows.text());
            short_rows.persistent = true;
            planned.insert(short_rows.text());
          }
        }
      }
    }
  }
  // And, for the causal (decoder) classes, the tiles forward() with a workspace
  // takes for a short prompt, unsplit (the engine sweep's prefill).
  auto short_prompt_tiles = [&](jitattn::DType dtype, int head_dim) {
    auto address = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
    const auto q = jitattn::TensorView::contiguous(address(0x10000), dtype, {1, 60, 32, head_dim});
    const auto kv = jitattn::TensorView::contiguous(address(0x20000), dtype, {1, 60, 8, head_dim});
    jitattn::ForwardOptions options;
    options.causal = true;
    return jitattn::detail::plan_forward_split(q, kv, values_after(kv), q, nullptr, options, nullptr, 0, true, hopper,
                                               jitattn::cli::max_smem_of(hopper), 132)
        .attention.spec;
  };
  for (jitattn::DType dtype : {jitattn::DType::bf16, jitattn::DType::f16}) {
    for (int head_dim : {64, 128}) {
      const KernelSpec spec = short_prompt_tiles(dtype, head_dim);
      CHECK_FALSE(spec.split);
      planned.insert(spec.text());
    }
  }
  for (const std::string& text : planned) CHECK_MESSAGE(texts.count(text) == 1, "not warmed: " << text);
  for (const std::string& text : texts) CHECK_MESSAGE(planned.count(text) == 1, "not planned: " << text);
  CHECK(specs.size() >= 8);

  // A model preset warms only its own class (in every tiling the planner may
  // pick for it), and a decoder's forward_kvcache kernels.
  const std::vector<KernelSpec> llama = jitattn::cli::preset_specs("llama3-8b", hopper);
  REQUIRE_FALSE(llama.empty());
  size_t llama_prefill = 0;
  for (const KernelSpec& spec : llama) {
    if (spec.family == jitattn::detail::Family::fwd && !spec.kvcache && !spec.split && !spec.pack_gqa && !spec.varlen &&
        spec.rope == jitattn::detail::RopeKind::none) {
      ++llama_prefill;
      CHECK(spec.dtype == jitattn::DType::bf16);
      CHECK(spec.head_dim == 128);
      CHECK(spec.causal);
    }
  }
  // The planner's tiles of the class over the buckets, and the short prompt's.
  std::set<std::string> llama_tiles{short_prompt_tiles(jitattn::DType::bf16, 128).text()};
  for (const jitattn::TileConfig& tiles : jitattn::detail::default_tile_set(jitattn::DType::bf16, 128, true, hopper)) {
    KernelSpec spec{jitattn::detail::Family::fwd, jitattn::DType::bf16, 128};
    spec.causal = true;
    jitattn::detail::apply_tiles(spec, tiles);
    llama_tiles.insert(spec.text());
  }
  CHECK(llama_prefill == llama_tiles.size());
  // Decoding calls of Llama 3 8B's shape (32 q / 8 kv heads) find every kernel
  // they plan warmed: one sequence, 16 and 64, contiguous and paged (16 and
  // 256 rows), with and without new keys, the heuristic's split or none, and
  // with dynamic splits (graphs replayed with other lengths); 20, 28, 40 and
  // 48 sequences over 4096-key caches (resident decode tiles of each pipeline
  // size); and so do 4, 8
  // and 16 tokens of speculative decoding and chunked prefill calls (1 × 2048
  // and 2 × 1024 new tokens).
  auto address = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  for (const auto& [batch, seqlen_q, capacity] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 1, 32768}, {16, 1, 32768}, {64, 1, 32768}, {20, 1, 4096},
        {28, 1, 4096}, {40, 1, 4096}, {48, 1, 4096}, {16, 4, 32768}, {1, 8, 32768}, {64, 8, 32768}, {1, 16, 32768}, {64, 16, 32768},
        {1, 2048, 32768}, {2, 1024, 32768}}) {
    for (int page : {0, 16, 256}) {
      for (bool append : {false, true}) {
        for (const auto& [splits, dynamic] : {std::pair<int, bool>{0, false}, {1, false}, {0, true}}) {
          using jitattn::TensorView;
          const TensorView q = TensorView::contiguous(address(0x10000), jitattn::DType::bf16, {batch, seqlen_q, 32, 128});
          const TensorView k_new =
              TensorView::contiguous(address(0x20000), jitattn::DType::bf16, {batch, seqlen_q, 8, 128});
          const TensorView table =
              TensorView::contiguous(address(0x30000), jitattn::DType::i32, {batch, capacity / std::max(page, 1)});
          jitattn::KVCacheArgs args;
          args.k_cache = page == 0 ? TensorView::contiguous(address(0x40000), jitattn::DType::bf16, {batch, capacity, 8, 128})
                                   : TensorView::contiguous(address(0x40000), jitattn::DType::bf16,
                                                            {batch * capacity / page, page, 8, 128});
          args.v_cache = values_after(args.k_cache);
          args.cache_seqlens = TensorView::contiguous(address(0x50000), jitattn::DType::i32, {batch});
          args.block_table = page == 0 ? nullptr : &table;
          if (append) args.k_new = args.v_new = &k_new;
          args.num_splits = splits;
          args.dynamic_splits = dynamic;
          jitattn::ForwardOptions options;
          options.causal = true;
          const auto plan = jitattn::detail::plan_kvcache(q, args, q, nullptr, options, nullptr, 0, true, hopper,
                                                           227 * 1024, 132);
          const std::string context = fmt::format("batch={} seqlen_q={} capacity={} page={} append={} splits={} "
                                                  "dynamic={}", batch, seqlen_q, capacity, page, append, splits, dynamic);
          auto warmed = [&](const KernelSpec& spec) {
            return std::find(llama.begin(), llama.end(), spec) != llama.end();
          };
          CHECK_MESSAGE(warmed(plan.attention.spec), std::string(context + ": " + plan.attention.spec.text()));
          if (append) CHECK_MESSAGE(warmed(plan.append.spec), std::string(context + ": " + plan.append.spec.text()));
          if (plan.attention.spec.split) {
            const bool dynamic_combine = plan.attention.spec.dynamic_splits;
            CHECK_MESSAGE(warmed(KernelSpec::combine(jitattn::DType::f32, jitattn::DType::bf16, false, dynamic_combine)),
                          context);
          }
          // Dynamic splits apply where the decode kernel runs (up to 8
          // tokens here: two 16-row tiles of a KV head's 4 query heads).
          CHECK_MESSAGE(plan.attention.spec.dynamic_splits == (dynamic && seqlen_q <= 8), context);
        }
      }
    }
  }
  // Dense forward() calls with few query rows (one sequence of 1, 16 and 128
  // queries, 4096 to 32768 keys), split with a workspace or not, find their
  // kernels warmed too.
  for (int64_t seqlen_q : {1, 16, 128}) {
    for (int64_t seqlen_k : {4096, 32768}) {
      using jitattn::TensorView;
      const TensorView q = TensorView::contiguous(address(0x10000), jitattn::DType::bf16, {1, seqlen_q, 32, 128});
      const TensorView kv = TensorView::contiguous(address(0x20000), jitattn::DType::bf16, {1, seqlen_k, 8, 128});
      jitattn::ForwardOptions options;
      options.causal = true;
      const auto plan = jitattn::detail::plan_forward_split(q, kv, values_after(kv), q, nullptr, options, nullptr, 0, true, hopper,
                                                            227 * 1024, 132);
      CHECK(plan.attention.spec.split);
      CHECK_MESSAGE(std::find(llama.begin(), llama.end(), plan.attention.spec) != llama.end(),
                    fmt::format("dense seqlen_q={} seqlen_k={}: {}", seqlen_q, seqlen_k, plan.attention.spec.text()));
      // And without a workspace.
      const KernelSpec unsplit =
          jitattn::detail::plan_forward(q, kv, values_after(kv), q, nullptr, options, hopper, 227 * 1024, 132).spec;
      CHECK_MESSAGE(std::find(llama.begin(), llama.end(), unsplit) != llama.end(),
                    fmt::format("dense seqlen_q={} seqlen_k={} unsplit: {}", seqlen_q, seqlen_k, unsplit.text()));
    }
  }
  // Varlen steps of an engine (decoding steps, speculative tokens, steps
  // beside a prefill chunk), over packed K/V or pages, with a workspace or
  // not, and with dynamic splits, find their kernels warmed too.
  for (const auto& [batch, total_q, max_seqlen_q] :
       {std::tuple<int64_t, int64_t, int>{8, 8, 1}, {20, 20, 1}, {28, 28, 1}, {40, 40, 1}, {64, 64, 1}, {2, 16, 8},
        {31, 542, 512}}) {
    for (int page : {0, 16, 64}) {
      for (const auto& [workspace, dynamic] : {std::pair<bool, bool>{false, false}, {true, false}, {true, true}}) {
        using jitattn::TensorView;
        const TensorView q = TensorView::contiguous(address(0x10000), jitattn::DType::bf16, {total_q, 32, 128});
        const TensorView kv = page == 0 ? TensorView::contiguous(address(0x20000), jitattn::DType::bf16, {batch * 4096, 8, 128})
                                        : TensorView::contiguous(address(0x20000), jitattn::DType::bf16,
                                                                 {batch * 4096 / page, page, 8, 128});
        const TensorView table =
            TensorView::contiguous(address(0x30000), jitattn::DType::i32, {batch, 4096 / std::max(page, 1)});
        jitattn::VarlenArgs varlen;
        varlen.cu_seqlens_q = varlen.cu_seqlens_k =
            TensorView::contiguous(address(0x40000), jitattn::DType::i32, {batch + 1});
        varlen.max_seqlen_q = max_seqlen_q;
        varlen.max_seqlen_k = 4096;
        varlen.block_table = page == 0 ? nullptr : &table;
        varlen.dynamic_splits = dynamic;
        jitattn::ForwardOptions options;
        options.causal = true;
        const KernelSpec spec =
            workspace ? jitattn::detail::plan_forward_varlen_split(q, kv, values_after(kv), q, nullptr, varlen, options, nullptr, 0,
                                                                   true, hopper, 227 * 1024, 132)
                            .attention.spec
                      : jitattn::detail::plan_forward_varlen(q, kv, values_after(kv), q, nullptr, varlen, options, hopper, 227 * 1024,
                                                             132)
                            .spec;
        CHECK_MESSAGE(std::find(llama.begin(), llama.end(), spec) != llama.end(),
                      fmt::format("varlen batch={} max_seqlen_q={} page={} workspace={} dynamic={}: {}", batch,
                                  max_seqlen_q, page, workspace, dynamic, spec.text()));
        if (spec.dynamic_splits) {
          CHECK(std::find(llama.begin(), llama.end(),
                          KernelSpec::combine(jitattn::DType::f32, jitattn::DType::bf16, false, true)) != llama.end());
        }
        // Decoding steps and speculative tokens take the decode kernel.
        CHECK(spec.dynamic_splits == (dynamic && max_seqlen_q <= 8));
      }
    }
  }
  const std::vector<KernelSpec> bert = jitattn::cli::preset_specs("bert-base", hopper);
  REQUIRE_FALSE(bert.empty());
  for (const KernelSpec& spec : bert) {
    CHECK(spec.dtype == jitattn::DType::f16);
    CHECK(spec.head_dim == 64);
    CHECK_FALSE(spec.causal);
  }
  // Its tile set by seqlen bucket, and what forward() plans besides for BERT's calls of a few hundred tokens
  // (128-row wgmma tiles) and of a few dozen (the decode kernel over dense keys).
  std::set<std::string> bert_texts;
  for (const KernelSpec& spec : bert) bert_texts.insert(spec.text());
  for (const jitattn::TileConfig& tiles : jitattn::detail::default_tile_set(jitattn::DType::f16, 64, false, hopper)) {
    KernelSpec spec{jitattn::detail::Family::fwd, jitattn::DType::f16, 64};
    jitattn::detail::apply_tiles(spec, tiles);
    CHECK_MESSAGE(bert_texts.count(spec.text()) == 1, spec.text());
  }
  for (const auto& [batch, seqlen] : {std::pair<int64_t, int64_t>{8, 256}, {64, 384}, {32, 24}, {512, 16}}) {
    auto address = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
    const auto q = jitattn::TensorView::contiguous(address(0x10000), jitattn::DType::f16, {batch, seqlen, 12, 64});
    const auto kv = jitattn::TensorView::contiguous(address(0x20000), jitattn::DType::f16, {batch, seqlen, 12, 64});
    const std::string spec = jitattn::detail::plan_forward(q, kv, values_after(kv), q, nullptr, jitattn::ForwardOptions{},
                                                           hopper, jitattn::cli::max_smem_of(hopper), 132)
                                 .spec.text();
    CHECK_MESSAGE(bert_texts.count(spec) == 1, batch << " x " << seqlen << ": " << spec);
  }

  CHECK_THROWS_WITH_AS(jitattn::cli::preset_specs("nope", hopper), doctest::Contains("llama3-70b"), jitattn::Error);

  // Tiles a tuning table chose for the class are warmed too (the planner prefers
  // them); choices for another arch or class are not.
  jitattn::detail::TuningTable tuning;
  tuning.set({{hopper, jitattn::DType::bf16, 128, true, 4096}, {64, 32, 4}, 1.0, 0.5});
  tuning.set({{jitattn::detail::Arch::parse("sm_80"), jitattn::DType::bf16, 128, true, 4096}, {128, 128, 8}, 1.0, 0.5});
  tuning.set({{hopper, jitattn::DType::f16, 64, false, 1024}, {128, 32, 8}, 1.0, 0.5});
  const std::vector<KernelSpec> tuned = jitattn::cli::preset_specs("llama3-8b", hopper, &tuning);
  CHECK(tuned.size() == llama.size() + 1);
  CHECK(std::find(tuned.begin(), tuned.end(), KernelSpec::parse("fwd.bf16.d128.br64.bc32.w4.causal")) != tuned.end());
}

TEST_CASE("the gpt-oss preset warms every kernel of its calls: sinks, causal and 128-key sliding layers") {
  // gpt-oss's own shape (64 query heads over 8, head dim 64, a sink per
  // query head), in calls other than the preset's sweeps: decoding and 3-16
  // speculative tokens over contiguous and paged caches, with new keys,
  // split by the heuristic and dynamically; prefill. Every kernel they
  // plan, combines included, is in the preset.
  using jitattn::TensorView;
  using jitattn::DType;
  const Arch hopper = Arch::parse("sm_90a");
  std::set<std::string> warmed;
  for (const KernelSpec& spec : jitattn::cli::preset_specs("gpt-oss", hopper)) warmed.insert(spec.text());
  auto address = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  const TensorView sinks = TensorView::contiguous(address(0x90000), DType::f32, {64});
  size_t checked = 0;
  auto expect_warmed = [&](const KernelSpec& spec, const std::string& context) {
    if (spec.family == jitattn::detail::Family::append) return;  // appends: no sinks, checked with llama3-8b
    // Split partials leave the sink to their combine.
    const bool final_rows = spec.family == jitattn::detail::Family::combine || !spec.split || spec.dynamic_splits;
    CHECK_MESSAGE(spec.sink == final_rows, context);
    CHECK_MESSAGE(warmed.count(spec.text()) == 1, fmt::format("{}: {}", context, spec.text()));
    ++checked;
  };
  for (int window : {-1, 127}) {
    jitattn::ForwardOptions options;
    options.causal = true;
    options.window_left = window;
    options.learnable_sink = &sinks;
    for (int64_t batch : {1, 12, 64}) {
      for (int64_t tokens : {1, 3, 4, 8, 16}) {  // decoding and speculative tokens
        for (int page : {0, 16, 64}) {
          for (bool append : {false, true}) {
            for (bool dynamic : {false, true}) {
              const int64_t capacity = 20000 / 64 * 64;
              const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, tokens, 64, 64});
              const TensorView k_new = TensorView::contiguous(address(0x20000), DType::bf16, {batch, tokens, 8, 64});
              const TensorView table =
                  TensorView::contiguous(address(0x30000), DType::i32, {batch, capacity / std::max(page, 1)});
              jitattn::KVCacheArgs args;
              args.k_cache = page == 0 ? TensorView::contiguous(address(0x40000), DType::bf16, {batch, capacity, 8, 64})
                                       : TensorView::contiguous(address(0x40000), DType::bf16,
                                                                {batch * capacity / page, page, 8, 64});
              args.v_cache = values_after(args.k_cache);
              args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
              args.block_table = page == 0 ? nullptr : &table;
              if (append) args.k_new = args.v_new = &k_new;
              args.dynamic_splits = dynamic;
              const auto plan = jitattn::detail::plan_kvcache(q, args, q, nullptr, options, address(0x100000),
                                                               size_t{1} << 32, false, hopper, 227 * 1024, 132);
              const std::string context = fmt::format("decode window={} batch={} tokens={} page={} append={} dynamic={}",
                                                      window, batch, tokens, page, append, dynamic);
              expect_warmed(plan.attention.spec, context);
              if (plan.combine.grid > 0) expect_warmed(plan.combine.spec, context);
            }
          }
        }
      }
    }
    for (int64_t seqlen : {1000, 4096, 12000}) {
      const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {seqlen, 64, 64});
      const TensorView kv = TensorView::contiguous(address(0x20000), DType::bf16, {seqlen, 8, 64});
      jitattn::VarlenArgs varlen;
      varlen.cu_seqlens_q = varlen.cu_seqlens_k = TensorView::contiguous(address(0x40000), DType::i32, {2});
      varlen.max_seqlen_q = varlen.max_seqlen_k = static_cast<int>(seqlen);
      expect_warmed(jitattn::detail::plan_forward_varlen(q, kv, values_after(kv), q, nullptr, varlen, options, hopper, 227 * 1024, 132)
                        .spec,
                    fmt::format("prefill window={} seqlen={}", window, seqlen));
    }
  }
  CHECK(checked > 50);
}

TEST_CASE("the deepseek-v3 preset warms DeepSeek's MLA prefill: q/k 192 with v 128, forward and varlen") {
  using jitattn::DType;
  using jitattn::TensorView;
  auto address = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  for (const char* arch_text : {"sm_90a", "sm_80"}) {
    const Arch arch = Arch::parse(arch_text);
    const int max_smem = jitattn::cli::max_smem_of(arch);
    const std::vector<KernelSpec> preset = jitattn::cli::preset_specs("deepseek-v3", arch);
    REQUIRE_FALSE(preset.empty());
    for (const KernelSpec& spec : preset) {
      CHECK_MESSAGE(spec.head_dim == 192, spec.text());
      CHECK_MESSAGE(spec.head_dim_v == 128, spec.text());  // no kernel of the generic d192 tiles
    }
    auto expect_warmed = [&](const KernelSpec& spec, const std::string& call) {
      CHECK_MESSAGE(std::find(preset.begin(), preset.end(), spec) != preset.end(),
                    fmt::format("{} {}: {} not warmed", arch_text, call, spec.text()));
    };
    jitattn::ForwardOptions causal;
    causal.causal = true;
    // Calls of other batches and lengths than the preset's sweep, with and without a workspace.
    for (const auto& [batch, seqlen] : {std::pair<int64_t, int64_t>{1, 100}, {1, 700}, {3, 1500}, {2, 5000}, {8, 3000},
                                        {1, 20000}}) {
      const std::string call = fmt::format("batch={} seqlen={}", batch, seqlen);
      const TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {batch, seqlen, 128, 192});
      const TensorView v = TensorView::contiguous(address(0x30000), DType::bf16, {batch, seqlen, 128, 128});
      const TensorView out = TensorView::contiguous(address(0x40000), DType::bf16, {batch, seqlen, 128, 128});
      expect_warmed(jitattn::detail::plan_forward(q, q, v, out, nullptr, causal, arch, max_smem, 132).spec, call);
      expect_warmed(jitattn::detail::plan_forward_split(q, q, v, out, nullptr, causal, nullptr, 0, true, arch, max_smem,
                                                        132)
                        .attention.spec,
                    call + " (workspace)");
      const TensorView packed_q = TensorView::contiguous(address(0x10000), DType::bf16, {batch * seqlen, 128, 192});
      const TensorView packed_v = TensorView::contiguous(address(0x30000), DType::bf16, {batch * seqlen, 128, 128});
      const TensorView packed_out = TensorView::contiguous(address(0x40000), DType::bf16, {batch * seqlen, 128, 128});
      jitattn::VarlenArgs varlen;
      varlen.cu_seqlens_q = varlen.cu_seqlens_k = TensorView::contiguous(address(0x50000), DType::i32, {batch + 1});
      varlen.max_seqlen_q = varlen.max_seqlen_k = static_cast<int>(seqlen);
      expect_warmed(jitattn::detail::plan_forward_varlen(packed_q, packed_q, packed_v, packed_out, nullptr, varlen, causal,
                                                         arch, max_smem, 132)
                        .spec,
                    "varlen " + call);
    }
  }
}

TEST_CASE("the gpt-oss preset warms its YaRN RoPE kernels: .rope_scaled prefill, decoding and appends") {
  // gpt-oss rotates the whole head (64) rotate-half with YaRN (factor 32):
  // angles from theta come with an attention factor of 0.1 ln 32 + 1, so
  // those kernels scale cos and sin (.rope_scaled); tables in q's dtype are
  // used as given, unscaled. Calls as gpt-oss's config makes them (other
  // batches and lengths than the preset's sweeps) find their kernels warmed.
  using jitattn::DType;
  using jitattn::TensorView;
  auto address = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  for (const char* arch_text : {"sm_90a", "sm_80"}) {
    CAPTURE(arch_text);
    const Arch arch = Arch::parse(arch_text);
    const std::vector<KernelSpec> preset = jitattn::cli::preset_specs("gpt-oss", arch);
    std::set<std::string> warmed;
    size_t scaled = 0, tables = 0, plain_sinks = 0;
    bool scaled_prefill = false, scaled_varlen = false, scaled_decode = false;
    for (const KernelSpec& spec : preset) {
      CHECK(KernelSpec::parse(spec.text()) == spec);
      warmed.insert(spec.text());
      if (spec.rope == jitattn::detail::RopeKind::none) {
        CHECK_FALSE(spec.rope_scaled);
        if (spec.sink) ++plain_sinks;
        continue;
      }
      CHECK(spec.rope == jitattn::detail::RopeKind::half);
      CHECK(spec.rotary_dim == 64);
      // Angles from theta are YaRN's, scaled; tables in q's dtype are not.
      CHECK_MESSAGE(spec.rope_scaled == !spec.rope_tables, spec.text());
      CHECK_MESSAGE((!spec.rope_tables || spec.rope_tables16), spec.text());
      (spec.rope_scaled ? scaled : tables) += 1;
      if (!spec.rope_scaled || spec.family == jitattn::detail::Family::append) continue;
      const bool prefill = spec.family == jitattn::detail::Family::fwd && !spec.kvcache && !spec.split && !spec.pack_gqa;
      if (prefill && spec.sink && !spec.varlen) scaled_prefill = true;
      if (prefill && spec.sink && spec.varlen) scaled_varlen = true;
      if (spec.family == jitattn::detail::Family::decode && spec.sink) scaled_decode = true;
    }
    CHECK(scaled > 0);
    CHECK(scaled == tables);  // each call's kernel once from theta, once from tables
    CHECK(plain_sinks > 0);   // and without fused RoPE, as before
    CHECK(scaled_prefill);
    CHECK(scaled_varlen);
    CHECK(scaled_decode);
    for (const char* append : {"append.bf16.rope_half_r64.rope_scaled", "append.bf16.rope_half_r64.rope_scaled.paged",
                               "append.bf16.rope_half_r64.rope_tables16",
                               "append.bf16.rope_half_r64.rope_tables16.paged"}) {
      CHECK_MESSAGE(warmed.count(append) == 1, append);
    }

    const TensorView sinks = TensorView::contiguous(address(0x90000), DType::f32, {64});
    for (const bool from_tables : {false, true}) {
      for (const int window : {-1, 127}) {
        const std::string form = fmt::format("{} window={}", from_tables ? "tables" : "theta", window);
        auto expect_warmed = [&](const KernelSpec& spec, const std::string& call) {
          const std::string context = fmt::format("{} {}: {}", form, call, spec.text());
          CHECK_MESSAGE(warmed.count(spec.text()) == 1, context);
          if (spec.family == jitattn::detail::Family::combine) return;
          CHECK_MESSAGE(spec.rope == jitattn::detail::RopeKind::half, context);
          CHECK_MESSAGE(spec.rope_scaled == !from_tables, context);
        };
        TensorView cos, sin;
        auto options_for = [&](int64_t positions) {
          jitattn::ForwardOptions options;
          options.causal = true;
          options.window_left = window;
          options.learnable_sink = &sinks;
          options.rope.style = jitattn::RopeStyle::rotate_half;
          options.rope.rotary_dim = 64;
          if (from_tables) {
            cos = TensorView::contiguous(address(0x60000), DType::bf16, {positions, 32});
            sin = TensorView::contiguous(address(0x70000), DType::bf16, {positions, 32});
            options.rope.cos = &cos;
            options.rope.sin = &sin;
          } else {  // gpt-oss's config.json
            options.rope.theta = 150000.f;
            options.rope.yarn_factor = 32.f;
            options.rope.yarn_beta_fast = 32.f;
            options.rope.yarn_beta_slow = 1.f;
            options.rope.yarn_original_max_position = 4096;
            options.rope.yarn_truncate = false;
          }
          return options;
        };
        PresetCalls calls;
        calls.head_dim = 64;
        calls.prefill = {{1, 300, 64, 8}, {3, 1000, 64, 8}, {2, 5000, 64, 8}, {8, 2048, 64, 8}, {1, 12000, 64, 8}};
        calls.decode_heads = 64;
        // Decoding and speculative tokens, new keys rotated (and scaled) as
        // they are appended.
        calls.decode = {{1, 1, 16384}, {12, 1, 16384}, {64, 1, 16384}, {3, 4, 16384}, {64, 1, 2048}, {40, 1, 1500}};
        calls.pages = {0, 16, 32, 64, 256};
        expect_calls_warmed(calls, arch, options_for, expect_warmed);
      }
    }
  }
  // No other preset's kernels scale RoPE but LongRoPE's (Phi-3.5, Phi-4-mini).
  for (const jitattn::cli::Preset& other : jitattn::cli::presets()) {
    if (other.name == "gpt-oss" || other.name == "phi3.5-mini" || other.name == "phi4-mini") continue;
    for (const KernelSpec& spec : jitattn::cli::preset_specs(other.name, Arch::parse("sm_90a"))) {
      CHECK_MESSAGE(!spec.rope_scaled, fmt::format("{}: {}", other.name, spec.text()));
    }
  }
}

TEST_CASE("model presets warm their RoPE kernels: prefill, varlen steps and decoding, angles from theta or tables") {
  using jitattn::DType;
  using jitattn::TensorView;
  auto address = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  struct Model {
    const char* preset;
    int head_dim, rotary_dim;
    bool local, softcap;
    // LongRoPE (0: none); the model's own heads, which its calls always
    // have (0: calls of several head counts).
    float longrope_factor = 0.f;
    int64_t heads_q = 0, heads_kv = 0;
  };
  // Call shapes other than the preset's own lists (other head counts, odd
  // lengths, other batches), so that the check is of what the preset covers,
  // not a copy of it.
  for (const Model& model :
       {Model{"llama3-8b", 128, 128, false, false}, Model{"phi3-mini", 96, 96, false, false, 0.f, 32, 32},
        Model{"gemma2-9b", 256, 256, true, true, 0.f, 16, 8}, Model{"phi3.5-mini", 96, 96, false, false, 32.f, 32, 32},
        Model{"phi4-mini", 128, 96, false, false, 32.f, 24, 8}}) {
    for (const char* arch_text : {"sm_90a", "sm_80"}) {
      const Arch arch = Arch::parse(arch_text);
      const int max_smem = jitattn::cli::max_smem_of(arch);
      const std::vector<KernelSpec> preset = jitattn::cli::preset_specs(model.preset, arch);
      size_t rope_specs = 0;
      for (const KernelSpec& spec : preset) {
        if (spec.rope == jitattn::detail::RopeKind::none) continue;
        ++rope_specs;
        CHECK(spec.rope == jitattn::detail::RopeKind::half);
        CHECK(spec.rotary_dim == model.rotary_dim);
        CHECK((!spec.rope_tables || spec.rope_tables16));  // theta, or tables in q's dtype
        // LongRoPE's angles from theta are scaled; tables (built scaled by the engine) are not.
        CHECK_MESSAGE(spec.rope_scaled == (model.longrope_factor != 0.f && !spec.rope_tables), spec.text());
      }
      CHECK(rope_specs > 0);
      // Without RoPE (the checks above cover fewer calls), angles from theta, tables.
      for (const std::string rope_form : {"none", "theta", "tables"}) {
        const bool rope = rope_form != "none", tables = rope_form == "tables";
        const std::string form = fmt::format("{} {} {}", model.preset, arch_text, rope_form);
        auto expect_warmed = [&](const KernelSpec& spec, const std::string& call) {
          CHECK_MESSAGE(std::find(preset.begin(), preset.end(), spec) != preset.end(),
                        fmt::format("{}, {}: {} not warmed", form, call, spec.text()));
          if (spec.family == jitattn::detail::Family::append) CHECK((spec.rope == jitattn::detail::RopeKind::half) == rope);
        };
        // RoPE as a caller passes it; tables of `positions` rows.
        TensorView cos, sin;
        std::vector<float> longrope_pair_factors;
        auto options_for = [&](int64_t positions) {
          jitattn::ForwardOptions options;
          options.causal = !model.local;
          if (model.local) options.window_left = 4096;
          if (model.softcap) options.softcap = 30.f;
          if (!rope) return options;
          options.rope.style = jitattn::RopeStyle::rotate_half;
          options.rope.rotary_dim = model.rotary_dim;
          options.rope.theta = 500000.f;
          if (model.longrope_factor != 0.f) {
            // Phi's config: long or short pair factors, 131072 / 4096 positions.
            longrope_pair_factors.assign(model.rotary_dim / 2, 1.5f);
            options.rope.longrope_pair_factors = longrope_pair_factors.data();
            options.rope.longrope_factor = model.longrope_factor;
          } else {
            options.rope.llama3_factor = 8.f;
          }
          if (tables) {
            options.rope.longrope_pair_factors = nullptr;
            options.rope.longrope_factor = 0.f;
            cos = TensorView::contiguous(address(0x60000), DType::bf16, {positions, model.rotary_dim / 2});
            sin = TensorView::contiguous(address(0x70000), DType::bf16, {positions, model.rotary_dim / 2});
            options.rope.cos = &cos;
            options.rope.sin = &sin;
          }
          return options;
        };
        PresetCalls calls;
        calls.head_dim = model.head_dim;
        calls.prefill = {{1, 300, 32, 8}, {3, 1000, 32, 8}, {5, 3000, 64, 8}, {24, 700, 28, 4}, {2, 12000, 32, 8},
                         {40, 2048, 32, 8}};
        if (model.heads_q != 0) {
          const int64_t hq = model.heads_q, hk = model.heads_kv;
          calls.prefill = {{1, 300, hq, hk}, {3, 1000, hq, hk}, {5, 3000, hq, hk}, {24, 700, hq, hk},
                           {2, 12000, hq, hk}, {40, 2048, hq, hk}};
          calls.decode_heads = hq;
          calls.decode_heads_kv = hk;
        }
        calls.decode = {{1, 1, 16384}, {12, 1, 16384}, {64, 1, 16384}, {3, 5, 16384}, {64, 1, 2048}};
        calls.pages = {0, 32, 256};
        expect_calls_warmed(calls, arch, options_for, expect_warmed);
        // An engine's varlen step of decoding sequences and a prefill chunk over packed k/v.
        for (const auto& [batch, total_q, max_seqlen_q] :
             {std::tuple<int64_t, int64_t, int>{12, 12, 1}, {9, 300, 292}}) {
          for (bool workspace : {false, true}) {
            const std::string call = fmt::format("varlen step batch={} total_q={} workspace={}", batch, total_q, workspace);
            const TensorView q =
                TensorView::contiguous(address(0x10000), DType::bf16, {total_q, calls.decode_heads, model.head_dim});
            const TensorView kv = TensorView::contiguous(address(0x20000), DType::bf16,
                                                         {batch * 6000, calls.decode_heads_kv, model.head_dim});
            jitattn::VarlenArgs varlen;
            varlen.cu_seqlens_q = varlen.cu_seqlens_k = TensorView::contiguous(address(0x40000), DType::i32, {batch + 1});
            varlen.max_seqlen_q = max_seqlen_q;
            varlen.max_seqlen_k = 6000;
            const jitattn::ForwardOptions options = options_for(6000);
            expect_warmed(workspace ? jitattn::detail::plan_forward_varlen_split(q, kv, values_after(kv), q, nullptr, varlen, options,
                                                                                 nullptr, 0, true, arch, max_smem, 132)
                                          .attention.spec
                                    : jitattn::detail::plan_forward_varlen(q, kv, values_after(kv), q, nullptr, varlen, options, arch,
                                                                           max_smem, 132)
                                          .spec,
                          call);
          }
        }
      }
    }
  }
  // Models with learned positions warm no RoPE kernel.
  for (const char* name : {"gpt2", "bert-base", "default"}) {
    for (const KernelSpec& spec : jitattn::cli::preset_specs(name, Arch::parse("sm_90a"))) {
      CHECK_MESSAGE(spec.rope == jitattn::detail::RopeKind::none, fmt::format("{}: {}", name, spec.text()));
    }
  }
}

TEST_CASE("clear removes every entry and list --json is then empty") {
  CliSandbox sandbox;
  REQUIRE(sandbox.run(fmt::format("warm {} --arch sm_80", kSmallSpec)).status == 0);
  REQUIRE(sandbox.run_json("list --json").size() == 1);
  const CliRun cleared = sandbox.run("clear");
  CHECK(cleared.status == 0);
  CHECK(contains(cleared.out, "removed 1 entry"));
  CHECK(sandbox.run_json("list --json") == json::array());
}

TEST_CASE("prune removes invalid entries and those of other versions, and with --older-than old entries") {
  CliSandbox sandbox;
  REQUIRE(sandbox.run(fmt::format("warm {} --arch sm_80", kSmallSpec)).status == 0);
  const json warmed = sandbox.run_json("list --json");
  REQUIRE(warmed.size() == 1);
  const std::string kernels = sandbox.cache_dir() + "/v1/kernels";
  // Entries beside it: another library version, another NVRTC version, this
  // library's but 40 days old, and a file that fails its checks.
  auto write_entry = [&](const std::string& key, const std::string& library, const std::string& nvrtc, int64_t age) {
    jitattn::detail::Entry entry;
    entry.meta.key = key;
    entry.meta.spec = kSmallSpec;
    entry.meta.arch = "sm_80";
    entry.meta.library_version = library;
    entry.meta.nvrtc_version = nvrtc;
    entry.meta.created_unix = static_cast<int64_t>(std::time(nullptr)) - age;
    entry.cubin.assign(64, 'x');
    entry.meta.cubin_bytes = entry.cubin.size();
    const std::vector<char> bytes = jitattn::detail::encode_entry(entry);
    std::ofstream(kernels + "/" + key + ".entry", std::ios::binary).write(bytes.data(), bytes.size());
  };
  const std::string library = warmed[0]["library_version"], nvrtc = warmed[0]["nvrtc_version"];
  write_entry(std::string(32, 'a'), "0.0.0-old", nvrtc, 60);
  write_entry(std::string(32, 'b'), library, "1.0", 60);
  write_entry(std::string(32, 'c'), library, nvrtc, 40 * 86400);
  std::ofstream(kernels + "/" + std::string(32, 'd') + ".entry") << "not an entry";
  // A writer's temporary file from two hours ago (its process died), and one being written now.
  std::ofstream(kernels + "/stale.tmp") << "x";
  std::ofstream(kernels + "/fresh.tmp") << "x";
  fs::last_write_time(kernels + "/stale.tmp", fs::file_time_type::clock::now() - std::chrono::hours(2));

  const json would = sandbox.run_json("prune --dry-run --json");
  std::map<std::string, std::string> reasons;
  for (const json& entry : would) reasons[entry["key"]] = entry["reason"];
  CHECK(reasons.size() == 3);
  CHECK(reasons[std::string(32, 'a')] == "library 0.0.0-old");
  CHECK(reasons[std::string(32, 'b')] == "NVRTC 1.0");
  CHECK(reasons[std::string(32, 'd')] == "invalid");
  CHECK(sandbox.run_json("list --json").size() == 5);  // a dry run removes nothing
  CHECK(fs::exists(kernels + "/stale.tmp"));

  const CliRun pruned = sandbox.run("prune");
  INFO("stdout: " << pruned.out << "\nstderr: " << pruned.err);
  CHECK(pruned.status == 0);
  CHECK(contains(pruned.out, "removed 3 entries of 5"));
  json left = sandbox.run_json("list --json");
  REQUIRE(left.size() == 2);
  CHECK(!fs::exists(kernels + "/stale.tmp"));
  CHECK(fs::exists(kernels + "/fresh.tmp"));

  CHECK(contains(sandbox.run("prune --older-than 30").out, "removed 1 entry of 2"));
  left = sandbox.run_json("list --json");
  REQUIRE(left.size() == 1);
  CHECK(left[0]["key"] == warmed[0]["key"]);  // the warmed kernel stays
  const CliRun negative = sandbox.run("prune --older-than -1");
  CHECK(negative.status == 1);
  CHECK(contains(negative.err, "--older-than -1"));
}

TEST_CASE("without NVRTC (JITATTN_NVRTC_LIBRARY=none) kernels come from the cache a host with NVRTC warmed") {
  CliSandbox sandbox;
  REQUIRE(sandbox.run(fmt::format("warm {} --arch sm_80", kSmallSpec)).status == 0);
  // The serving host: every warmed kernel is a hit; warm then checks coverage.
  const CliRun served = sandbox.run(fmt::format("warm {} --arch sm_80", kSmallSpec), "JITATTN_NVRTC_LIBRARY=none");
  INFO("stdout: " << served.out << "\nstderr: " << served.err);
  CHECK(served.status == 0);
  CHECK(contains(row_of(served.out, kSmallSpec), " hit "));
  CHECK(contains(served.err, "warm checks that the cache holds each kernel"));
  // A kernel never warmed fails, naming the cache and why nothing compiles.
  const std::string cold_spec = "fwd.f16.d128.br64.bc64.w4";
  const CliRun missing = sandbox.run(fmt::format("warm {} {} --arch sm_80", kSmallSpec, cold_spec),
                                     "JITATTN_NVRTC_LIBRARY=none");
  CHECK(missing.status == 1);
  const std::string all = missing.out + missing.err;
  CHECK(contains(all, "is not in the cache"));
  CHECK(contains(all, "JITATTN_NVRTC_LIBRARY=none"));
  CHECK(contains(row_of(missing.out, kSmallSpec), " hit "));
}

TEST_CASE("info --json reports the cache directory and the NVRTC version") {
  CliSandbox sandbox;
  const json info = sandbox.run_json("info --json");
  CHECK(info["version"] == jitattn::version());
  CHECK(info["cache"]["directory"] == sandbox.cache_dir());
  CHECK(info["cache"]["writable"] == true);
  CHECK(info["cache"]["entries"] == 0);
  CHECK(info["nvrtc"]["available"] == true);
  CHECK_FALSE(info["nvrtc"]["version"].get<std::string>().empty());
  CHECK(info["devices"].is_array());
  CHECK(info["templates"]["source"] == "embedded");

  // --cache-dir overrides JITATTN_CACHE_DIR, before or after the subcommand.
  const std::string other = sandbox.root() + "/other";
  CHECK(sandbox.run_json("--cache-dir " + shell_quoted(other) + " info --json")["cache"]["directory"] == other);
  CHECK(sandbox.run_json("info --json --cache-dir " + shell_quoted(other))["cache"]["directory"] == other);
}

TEST_CASE("warm with an invalid arch fails before compiling anything") {
  CliSandbox sandbox;
  for (const char* arch : {"sm_75", "banana"}) {
    const CliRun result = sandbox.run(fmt::format("warm {} --arch {}", kSmallSpec, arch));
    CHECK(result.status == 1);
    CHECK(contains(result.err, fmt::format("jitattn: arch '{}'", arch)));
    CHECK(contains(result.err, "sm_90a"));  // the message shows valid examples
  }
  CHECK(sandbox.run_json("list --json").empty());
}

TEST_CASE("a failed compile is reported, the other kernels still finish, and warm exits 1") {
  CliSandbox sandbox;
  // A template copy that NVRTC rejects for head_dim 128 only.
  const std::string templates = sandbox.root() + "/templates";
  fs::copy(fs::path(JITATTN_SOURCE_DIR) / "templates", templates);
  std::ofstream(templates + "/entry_fwd.cu", std::ios::app)
      << "static_assert({head_dim} != 128, \"broken on purpose by test_cli\");\n";
  const CliRun result = sandbox.run(fmt::format("warm {} fwd.f16.d128.br128.bc64.w8 --arch sm_80 -j 2", kSmallSpec),
                                    "JITATTN_TEMPLATE_DIR=" + shell_quoted(templates));
  INFO("stdout: " << result.out << "\nstderr: " << result.err);
  CHECK(result.status == 1);
  CHECK(contains(result.err, "jitattn: fwd.f16.d128.br128.bc64.w8 for sm_80"));
  CHECK(contains(result.err, "broken on purpose by test_cli"));  // the NVRTC log
  CHECK(contains(row_of(result.out, kSmallSpec), " miss "));
  CHECK(contains(row_of(result.out, "fwd.f16.d128.br128.bc64.w8"), "FAILED"));
  CHECK(contains(result.out, "1 failed"));
}

TEST_CASE("tune --dry-run lists the classes and candidates it would time, without a GPU") {
  CliSandbox sandbox;
  const std::string args = "tune --dry-run --dtype bf16 --head-dim 128 --causal yes --seqlen 1024,4096";
  const CliRun text = sandbox.run(args);
  INFO("stdout: " << text.out << "\nstderr: " << text.err);
  REQUIRE(text.status == 0);
  // head_dim 128 has 8 candidates: br128.bc128.w4 would need 256 accumulators.
  CHECK(contains(text.out, "2 classes × 8 candidates"));
  CHECK(contains(text.out, "bf16.d128.causal.n1024"));
  CHECK(contains(text.out, "bf16.d128.causal.n4096"));

  const json plan = sandbox.run_json(args + " --json");
  REQUIRE(plan["classes"].size() == 2);
  CHECK(plan["classes"][0]["seqlen_bucket"] == 1024);
  CHECK(plan["classes"][1]["seqlen_bucket"] == 4096);
  CHECK(plan["classes"][1]["batch"] == 4);   // 16384 tokens / 4096
  CHECK(plan["classes"][1]["heads"] == 16);  // 2048 / 128
  for (const json& shape : plan["classes"]) {
    CHECK(shape["dtype"] == "bf16");
    CHECK(shape["causal"] == true);
    CHECK(shape["candidates"].size() == 8);
  }
  CHECK(plan["iterations"] == 10);

  // Repeated options and a candidate list work too; nothing is written.
  const json two = sandbox.run_json("tune --dry-run --json --dtype bf16 --dtype f16 --head-dim 64 --causal no "
                                    "--seqlen 512 --candidates 128x64x4,64x32x4");
  REQUIRE(two["classes"].size() == 2);
  CHECK(two["classes"][0]["candidates"] == json({"128x64x4", "64x32x4"}));
  CHECK_FALSE(fs::exists(sandbox.cache_dir() + "/v1/tuning.json"));
}

TEST_CASE("tune rejects bad lists before doing anything") {
  CliSandbox sandbox;
  const CliRun bad_tiles = sandbox.run("tune --dry-run --candidates 64x64x8");
  CHECK(bad_tiles.status == 1);
  CHECK(contains(bad_tiles.err, "--candidates: 64x64x8"));
  CHECK(contains(bad_tiles.err, "8 query rows per warp"));
  const CliRun bad_dtype = sandbox.run("tune --dry-run --dtype f32");
  CHECK(bad_dtype.status == 1);
  CHECK(contains(bad_dtype.err, "--dtype: 'f32' is not bf16 or f16"));
  const CliRun same_bucket = sandbox.run("tune --dry-run --seqlen 1000,1024");
  CHECK(same_bucket.status == 1);
  CHECK(contains(same_bucket.err, "same bucket (n1024)"));
  CHECK(sandbox.run("tune --dry-run --causal maybe").status == 2);  // a usage error
}

TEST_CASE("tune without a GPU fails saying it needs one") {
  CliSandbox sandbox;
  if (sandbox.run_json("info --json")["driver"]["available"] == true) return;  // a GPU host: nothing to check
  const CliRun result = sandbox.run("tune --dtype bf16 --head-dim 64 --causal no --seqlen 512");
  CHECK(result.status == 1);
  CHECK(result.out.empty());
  CHECK(contains(result.err, "jitattn: tune needs a GPU: "));
  CHECK_FALSE(fs::exists(sandbox.cache_dir() + "/v1/tuning.json"));
}

TEST_CASE("info reports the tuning table and clear removes it") {
  CliSandbox sandbox;
  CHECK(sandbox.run_json("info --json")["tuning"]["status"] == "none");

  // A table for this very library and NVRTC version, as `tune` writes it.
  const json nvrtc = sandbox.run_json("info --json")["nvrtc"];
  const std::string nvrtc_version = nvrtc["available"] == true ? nvrtc["version"].get<std::string>() : "none";
  auto row = [](int bucket) {
    return json{{"arch", "sm_90a"}, {"dtype", "bf16"}, {"head_dim", 128}, {"causal", true},
                {"seqlen_bucket", bucket}, {"block_q", 128}, {"block_kv", 128}, {"warps", 8},
                {"tflops", 500.0}, {"default_tflops", 450.0}};
  };
  const json table = {{"format", 1}, {"library_version", jitattn::version()}, {"nvrtc_version", nvrtc_version},
                      {"choices", {row(1024), row(4096)}}};
  fs::create_directories(sandbox.cache_dir() + "/v1");
  const std::string path = sandbox.cache_dir() + "/v1/tuning.json";
  std::ofstream(path) << table.dump();

  const json tuning = sandbox.run_json("info --json")["tuning"];
  CHECK(tuning["status"] == "loaded");
  CHECK(tuning["entries"] == 2);
  CHECK(tuning["path"] == path);
  CHECK(contains(sandbox.run("info").out, "2 shape classes"));

  // From another library version: reported as ignored, with the reason.
  json stale = table;
  stale["library_version"] = "0.0.0-other";
  std::ofstream(path) << stale.dump();
  const json ignored = sandbox.run_json("info --json")["tuning"];
  CHECK(ignored["status"] == "ignored");
  CHECK(ignored["entries"] == 0);
  CHECK(contains(ignored["reason"].get<std::string>(), "tuned with jitattn 0.0.0-other"));

  const CliRun cleared = sandbox.run("clear");
  CHECK(cleared.status == 0);
  CHECK(contains(cleared.out, "removed 0 entries"));
  CHECK(contains(cleared.out, "removed the tuning table " + path));
  CHECK_FALSE(fs::exists(path));
  CHECK(sandbox.run_json("info --json")["tuning"]["status"] == "none");
}

TEST_CASE("plan prints the launches the planner makes for a forward call") {
  CliSandbox sandbox;
  using jitattn::DType;
  jitattn::ForwardOptions causal;
  causal.causal = true;
  // A Llama-style prefill on an H200.
  check_launches(sandbox,
                 "--dtype bf16 --head-dim 128 --batch 16 --seqlen-q 1024 --heads 32 --heads-kv 8 --causal "
                 "--arch sm_90a --sms 132 --smem 232448",
                 planned_forward(DType::bf16, 16, 1024, 32, 8, 128, causal, "sm_90a", 232448, 132));
  // One short sequence on an A100: few tiles, so the keys are split and combined.
  const std::vector<ExpectedLaunch> split = planned_forward(DType::f16, 1, 256, 8, 8, 64, {}, "sm_80", 166912, 108);
  REQUIRE(split.size() == 2);
  CHECK(split[0].splits > 1);
  check_launches(sandbox, "--dtype f16 --head-dim 64 --seqlen-q 256 --heads 8 --arch sm_80 --sms 108 --smem 166912",
                 split);
  // Forced tiles, and a split count.
  jitattn::ForwardOptions forced;
  forced.tiles = {64, 32, 4};
  forced.num_splits = 3;
  check_launches(sandbox, "--dtype f16 --head-dim 64 --seqlen-q 256 --heads 8 --arch sm_80 --sms 108 --smem 166912 "
                          "--tiles 64x32x4 --splits 3",
                 planned_forward(DType::f16, 1, 256, 8, 8, 64, forced, "sm_80", 166912, 108));
  // V's own head dim (DeepSeek's 192/128 prefill): out and v 128 wide, never split.
  {
    using jitattn::TensorView;
    const TensorView q = TensorView::contiguous(plan_address(1), DType::bf16, {4, 4096, 16, 192});
    const TensorView k = TensorView::contiguous(plan_address(2), DType::bf16, {4, 4096, 16, 192});
    const TensorView v = TensorView::contiguous(plan_address(3), DType::bf16, {4, 4096, 16, 128});
    const TensorView out = TensorView::contiguous(plan_address(4), DType::bf16, {4, 4096, 16, 128});
    const std::vector<ExpectedLaunch> expected = expected_with_workspace([&](void* workspace, size_t bytes, bool sizing) {
      return jitattn::detail::plan_forward_split(q, k, v, out, nullptr, causal, workspace, bytes, sizing,
                                                 Arch::parse("sm_90a"), 232448, 132);
    });
    REQUIRE(expected.size() == 1);
    CHECK(expected[0].spec.head_dim_v == 128);
    check_launches(sandbox, "--head-dim 192 --head-dim-v 128 --batch 4 --seqlen-q 4096 --heads 16 --causal "
                            "--arch sm_90a --sms 132 --smem 232448",
                   expected);
  }
  // Without a workspace: plan_forward, which never splits.
  using jitattn::TensorView;
  const TensorView q = TensorView::contiguous(plan_address(1), DType::f16, {1, 256, 8, 64});
  const auto unsplit = jitattn::detail::plan_forward(q, q, q, q, nullptr, {}, Arch::parse("sm_80"), 166912, 108);
  check_launches(sandbox, "--dtype f16 --head-dim 64 --seqlen-q 256 --heads 8 --arch sm_80 --sms 108 --smem 166912 "
                          "--no-workspace",
                 {attention_expected(unsplit)});
}

TEST_CASE("plan --call kvcache prints append, attention and combine as plan_kvcache plans them") {
  CliSandbox sandbox;
  jitattn::ForwardOptions causal;
  causal.causal = true;
  const std::string target = " --arch sm_90a --sms 132 --smem 232448";
  // Decoding one token per sequence over a paged cache, with a forced split
  // count: the keys are the 3000 cached and the one appended.
  const std::vector<ExpectedLaunch> paged = planned_kvcache(4, 1, 4096, 16, 1, 32, 8, 4, 3001, causal);
  REQUIRE(paged.size() == 3);
  CHECK(paged[1].splits == 4);
  check_launches(sandbox,
                 "--call kvcache --dtype bf16 --head-dim 128 --batch 4 --seqlen-q 1 --seqlen-k 3000 --cache-len 4096 "
                 "--page-size 16 --new-tokens 1 --heads 32 --heads-kv 8 --causal --splits 4" + target,
                 paged);
  // The planner's own split count follows the keys the call says it holds
  // (KVCacheArgs::max_seqlen_k), or the capacity with --max-seqlen-k 0.
  const std::string short_cache =
      "--call kvcache --head-dim 128 --seqlen-q 1 --seqlen-k 100 --cache-len 8192 --heads 32 --heads-kv 8" + target;
  const std::vector<ExpectedLaunch> hinted = planned_kvcache(1, 1, 8192, 0, 0, 32, 8, 0, 100, {});
  const std::vector<ExpectedLaunch> capacity = planned_kvcache(1, 1, 8192, 0, 0, 32, 8, 0, 0, {});
  CHECK(hinted[0].splits != capacity[0].splits);
  check_launches(sandbox, short_cache, hinted);
  check_launches(sandbox, short_cache + " --max-seqlen-k 0", capacity);
  // --dynamic-splits: the most splits, marked as such (room for one
  // sequence's 8 tiles to fill half of 132 SMs: 8); each sequence's count is
  // the device's.
  const std::string batch16 = "--call kvcache --head-dim 128 --batch 16 --seqlen-q 1 --seqlen-k 4096 --heads 32 "
                              "--heads-kv 8" + target;
  const json unsplit = sandbox.run_json("plan " + batch16 + " --json")["launches"][0];
  CHECK(unsplit["splits"] == 1);
  CHECK(unsplit["dynamic_splits"] == false);
  const json dynamic = sandbox.run_json("plan " + batch16 + " --dynamic-splits --json")["launches"];
  REQUIRE(dynamic.size() == 2);
  CHECK(dynamic[0]["splits"] == 8);
  CHECK(dynamic[0]["dynamic_splits"] == true);
  CHECK(dynamic[1]["launch"] == "combine");
  CHECK(contains(sandbox.run("plan " + batch16 + " --dynamic-splits").out, "<= 8"));
  CHECK(contains(sandbox.run("plan --heads 8 --head-dim 64 --seqlen-q 1 --dynamic-splits").err,
                 "--dynamic-splits: applies to --call kvcache or varlen only"));
  // --cache-leftpad: the same launches, the attention kernel compiled with
  // .leftpad (so a manifest can warm it); not over pages, not outside kvcache.
  const json padded = sandbox.run_json("plan " + batch16 + " --cache-leftpad --json")["launches"];
  REQUIRE(padded.size() == 1);
  CHECK(padded[0]["spec"] == unsplit["spec"].get<std::string>() + ".leftpad");
  CHECK(padded[0]["grid"] == unsplit["grid"]);
  CHECK(contains(sandbox.run("plan " + batch16 + " --cache-leftpad --page-size 64").err,
                 "cache_leftpad: not supported with a paged cache"));
  CHECK(contains(sandbox.run("plan --heads 8 --head-dim 64 --seqlen-q 1 --cache-leftpad").err,
                 "--cache-leftpad: applies to --call kvcache only"));
  // --attention-chunk: the kernel of the causal call as a window cut to
  // chunks (.local.chunk in place of .causal), for every call kind.
  for (const std::string& call : {batch16, std::string("--head-dim 128 --heads 32 --heads-kv 8 --seqlen-q 4096 --causal "
                                                       "--arch sm_90a --sms 132"),
                                   std::string("--call varlen --batch 4 --head-dim 128 --heads 32 --heads-kv 8 --seqlen-q 2048 "
                                               "--causal --arch sm_90a --sms 132")}) {
    CAPTURE(call);
    const json plain = sandbox.run_json("plan " + call + " --json")["launches"];
    const json chunked = sandbox.run_json("plan " + call + " --attention-chunk 1024 --json")["launches"];
    REQUIRE(chunked.size() == plain.size());
    const std::string spec = chunked[chunked.size() == 1 ? 0 : 1]["spec"];
    CHECK(contains(spec, ".local.chunk"));
    CHECK_FALSE(contains(spec, ".causal"));
  }
  CHECK(contains(sandbox.run("plan " + batch16 + " --attention-chunk -5").err,
                 "options.attention_chunk=-5 must be >= 0 (0 = off)"));
  // --learnable-sink: .sink on the kernel that writes the output; a split
  // call's partials leave it to the combine.
  const json sunk = sandbox.run_json("plan --head-dim 64 --heads 64 --heads-kv 8 --seqlen-q 2048 --causal "
                                     "--window 127,0 --learnable-sink --arch sm_90a --sms 132 --json")["launches"];
  REQUIRE(sunk.size() == 1);
  CHECK(contains(sunk[0]["spec"], ".sink"));
  const json split = sandbox.run_json("plan --call kvcache --head-dim 64 --heads 64 --heads-kv 8 --seqlen-q 1 "
                                      "--seqlen-k 32768 --splits 4 --learnable-sink --arch sm_90a --sms 132 --json")["launches"];
  REQUIRE(split.size() == 2);
  CHECK_FALSE(contains(split[0]["spec"], ".sink"));
  CHECK(split[1]["spec"] == "combine.f32.bf16.sink");
}

TEST_CASE("plan --yarn-factor prints .rope_scaled kernels, and none for an attention factor of 1") {
  CliSandbox sandbox;
  const std::string target = " --arch sm_90a --sms 132 --smem 232448";
  // YaRN as a caller passes it: Hugging Face's default attention factor
  // (0.1 ln 32 + 1), or its own.
  auto yarn = [](float attention_factor) {
    jitattn::ForwardOptions options;
    options.causal = true;
    options.rope.style = jitattn::RopeStyle::rotate_half;
    options.rope.rotary_dim = 128;
    options.rope.yarn_factor = 32.f;
    options.rope.yarn_attention_factor = attention_factor;
    return options;
  };
  // Prefill.
  const std::string prefill = "--head-dim 128 --batch 2 --seqlen-q 2048 --heads 32 --heads-kv 8 --causal --rope half" +
                              target;
  const std::vector<ExpectedLaunch> scaled_prefill =
      planned_forward(jitattn::DType::bf16, 2, 2048, 32, 8, 128, yarn(0.f), "sm_90a", 232448, 132);
  REQUIRE(scaled_prefill.size() == 1);
  CHECK(scaled_prefill[0].spec.rope_scaled);
  CHECK(contains(scaled_prefill[0].spec.text(), ".rope_half_r128.rope_scaled"));
  check_launches(sandbox, prefill + " --yarn-factor 32", scaled_prefill);
  check_launches(sandbox, prefill + " --yarn-factor 32 --yarn-attention-factor 1.5",
                 planned_forward(jitattn::DType::bf16, 2, 2048, 32, 8, 128, yarn(1.5f), "sm_90a", 232448, 132));
  // An attention factor of 1 (DeepSeek V3's, or the default's for factors
  // up to 1) scales nothing: the kernels of RoPE without YaRN.
  const json plain = sandbox.run_json("plan " + prefill + " --json")["launches"];
  for (const std::string& unscaled : {std::string(" --yarn-factor 32 --yarn-attention-factor 1"),
                                      std::string(" --yarn-factor 1")}) {
    CAPTURE(unscaled);
    const json launches = sandbox.run_json("plan " + prefill + unscaled + " --json")["launches"];
    CHECK(launches == plain);
    CHECK(contains(launches[0]["spec"], ".rope_half_r128"));
    CHECK_FALSE(contains(launches[0]["spec"], ".rope_scaled"));
  }
  // Decoding with new keys appended: the append rotates them scaled too,
  // and the split partials' combine has no RoPE.
  const std::string decode = "--call kvcache --head-dim 128 --batch 4 --seqlen-q 1 --seqlen-k 3000 --cache-len 4096 "
                             "--page-size 16 --new-tokens 1 --heads 32 --heads-kv 8 --causal --splits 4 --rope half" +
                             target;
  const std::vector<ExpectedLaunch> scaled_decode = planned_kvcache(4, 1, 4096, 16, 1, 32, 8, 4, 3001, yarn(0.f));
  REQUIRE(scaled_decode.size() == 3);
  CHECK(scaled_decode[0].spec.text() == "append.bf16.rope_half_r128.rope_scaled.paged");
  CHECK(contains(scaled_decode[1].spec.text(), ".rope_half_r128.rope_scaled"));
  CHECK(scaled_decode[2].spec.text() == "combine.f32.bf16");
  check_launches(sandbox, decode + " --yarn-factor 32", scaled_decode);
  const CliRun manifest = sandbox.run("plan " + decode + " --yarn-factor 32 --manifest");
  REQUIRE(manifest.status == 0);
  CHECK(contains(manifest.out, "append.bf16.rope_half_r128.rope_scaled.paged @sm_90a\n"));
  const json unscaled_decode =
      sandbox.run_json("plan " + decode + " --yarn-factor 32 --yarn-attention-factor 1 --json")["launches"];
  CHECK(unscaled_decode == sandbox.run_json("plan " + decode + " --json")["launches"]);
  for (const json& launch : unscaled_decode) CHECK_FALSE(contains(launch["spec"], ".rope_scaled"));
  // An engine's varlen step.
  const json step = sandbox.run_json("plan --call varlen --batch 16 --seqlen-q 1 --seqlen-k 8192 --head-dim 128 "
                                     "--heads 32 --heads-kv 8 --causal --rope half --yarn-factor 32" + target +
                                     " --json")["launches"];
  REQUIRE(step.size() >= 1);
  CHECK(contains(step[0]["spec"], ".rope_half_r128.rope_scaled"));
}

TEST_CASE("plan --longrope-factor prints .rope_scaled kernels (Phi-4-mini), and none for an attention factor of 1") {
  CliSandbox sandbox;
  const std::string target = " --arch sm_90a --sms 132 --smem 232448";
  // LongRoPE as a caller passes it: pair factors (their values change no
  // kernel), Hugging Face's default attention factor sqrt(1 + ln 32 / ln
  // 4096), or its own. Phi-4-mini rotates 96 of its 128 channels.
  const std::vector<float> pair_factors(48, 1.f);
  auto longrope = [&](float attention_factor) {
    jitattn::ForwardOptions options;
    options.causal = true;
    options.rope.style = jitattn::RopeStyle::rotate_half;
    options.rope.rotary_dim = 96;
    options.rope.longrope_pair_factors = pair_factors.data();
    options.rope.longrope_factor = 32.f;
    options.rope.longrope_attention_factor = attention_factor;
    return options;
  };
  const std::string prefill = "--head-dim 128 --batch 2 --seqlen-q 2048 --heads 24 --heads-kv 8 --causal --rope half "
                              "--rotary-dim 96" + target;
  const std::vector<ExpectedLaunch> scaled_prefill =
      planned_forward(jitattn::DType::bf16, 2, 2048, 24, 8, 128, longrope(0.f), "sm_90a", 232448, 132);
  REQUIRE(scaled_prefill.size() == 1);
  CHECK(contains(scaled_prefill[0].spec.text(), ".rope_half_r96.rope_scaled"));
  check_launches(sandbox, prefill + " --longrope-factor 32", scaled_prefill);
  check_launches(sandbox, prefill + " --longrope-factor 32 --longrope-attention-factor 1.5",
                 planned_forward(jitattn::DType::bf16, 2, 2048, 24, 8, 128, longrope(1.5f), "sm_90a", 232448, 132));
  // A factor up to 1 (a 4k model's) or an attention factor of 1: the kernels of RoPE without scaling.
  const json plain = sandbox.run_json("plan " + prefill + " --json")["launches"];
  for (const std::string& unscaled : {std::string(" --longrope-factor 32 --longrope-attention-factor 1"),
                                      std::string(" --longrope-factor 1")}) {
    CAPTURE(unscaled);
    CHECK(sandbox.run_json("plan " + prefill + unscaled + " --json")["launches"] == plain);
  }
  // Decoding with new keys appended: the append rotates them scaled too.
  const std::string decode = "--call kvcache --head-dim 128 --batch 4 --seqlen-q 1 --seqlen-k 3000 --cache-len 4096 "
                             "--page-size 16 --new-tokens 1 --heads 24 --heads-kv 8 --causal --splits 4 --rope half "
                             "--rotary-dim 96" + target;
  const std::vector<ExpectedLaunch> scaled_decode = planned_kvcache(4, 1, 4096, 16, 1, 24, 8, 4, 3001, longrope(0.f));
  REQUIRE(scaled_decode.size() == 3);
  CHECK(scaled_decode[0].spec.text() == "append.bf16.rope_half_r96.rope_scaled.paged");
  check_launches(sandbox, decode + " --longrope-factor 32", scaled_decode);
  // Misuse: LongRoPE's rules are the planner's, its flags need RoPE, and it comes alone.
  const CliRun tables = sandbox.run("plan " + prefill + " --longrope-factor 32 --rope-tables bf16");
  CHECK(tables.status == 1);
  CHECK(contains(tables.err, "longrope_pair_factors scale angles from theta; cos/sin tables are used as given"));
  const CliRun negative = sandbox.run("plan " + prefill + " --longrope-factor -2");
  CHECK(negative.status == 1);
  CHECK(contains(negative.err, "options.rope.longrope_factor=-2 must be positive and finite"));
  const CliRun off = sandbox.run("plan " + prefill + " --longrope-factor 0 --longrope-attention-factor 2");
  CHECK(off.status == 1);
  CHECK(contains(off.err, "--longrope-attention-factor: 2 needs a --longrope-factor other than 0"));
  const CliRun unrotated = sandbox.run("plan --head-dim 64 --seqlen-q 64 --heads 8 --longrope-factor 32");
  CHECK(unrotated.status == 2);
  CHECK(contains(unrotated.err, "--longrope-factor requires --rope"));
  const CliRun with_yarn = sandbox.run("plan " + prefill + " --longrope-factor 32 --yarn-factor 4");
  CHECK(with_yarn.status == 2);
  CHECK(contains(with_yarn.err, "excludes"));
}

TEST_CASE("plan --call varlen prints the launches forward_varlen plans for an engine's step") {
  CliSandbox sandbox;
  jitattn::ForwardOptions causal;
  causal.causal = true;
  const std::string shape = "--call varlen --head-dim 128 --heads 32 --heads-kv 8 --causal --arch sm_90a --sms 132 "
                            "--smem 232448 ";
  // 64 sequences decoding one token each over packed keys: the decode kernel.
  const std::vector<ExpectedLaunch> decode = planned_varlen(64, 64, 1, 8192, 0, true, false, causal);
  CHECK(decode[0].spec.text().rfind("decode.", 0) == 0);
  check_launches(sandbox, shape + "--batch 64 --seqlen-q 1 --seqlen-k 8192", decode);
  // A mixed step: 15 decoding sequences beside a 512-token prefill chunk
  // (527 query rows), over pages of 64 rows.
  const std::vector<ExpectedLaunch> mixed = planned_varlen(16, 527, 512, 8192, 64, true, false, causal);
  CHECK(mixed[0].spec.paged);
  check_launches(sandbox, shape + "--batch 16 --seqlen-q 512 --total-q 527 --seqlen-k 8192 --page-size 64", mixed);
  // The same without a workspace (never split), and one prefill sequence.
  check_launches(sandbox,
                 shape + "--batch 16 --seqlen-q 512 --total-q 527 --seqlen-k 8192 --page-size 64 --no-workspace",
                 planned_varlen(16, 527, 512, 8192, 64, false, false, causal));
  const std::vector<ExpectedLaunch> prefill = planned_varlen(1, 2048, 2048, 2048, 0, true, false, causal);
  check_launches(sandbox, shape + "--seqlen-q 2048", prefill);
  // Dynamic splits for replayed graphs: the most splits, each sequence's
  // count chosen on the device, and the combine that skips unsplit rows.
  const std::vector<ExpectedLaunch> dynamic = planned_varlen(16, 16, 1, 8192, 16, true, true, causal);
  REQUIRE(dynamic.size() == 2);
  CHECK(dynamic[0].spec.dynamic_splits);
  const std::string dynamic_args = shape + "--batch 16 --seqlen-q 1 --seqlen-k 8192 --page-size 16 --dynamic-splits";
  check_launches(sandbox, dynamic_args, dynamic);
  CHECK(sandbox.run_json("plan " + dynamic_args + " --json")["launches"][0]["dynamic_splits"] == true);
  CHECK(sandbox.run_json("plan " + dynamic_args + " --json")["call"] == "varlen");
  // The manifest warm reads: one line per launch.
  const CliRun manifest = sandbox.run("plan " + dynamic_args + " --manifest");
  REQUIRE(manifest.status == 0);
  CHECK(manifest.out == fmt::format("{} @sm_90a\n{} @sm_90a\n", dynamic[0].spec.text(), dynamic[1].spec.text()));
}

TEST_CASE("plan --json reports the target, where the tiles came from and each launch") {
  CliSandbox sandbox;
  const json planned = sandbox.run_json("plan --head-dim 128 --seqlen-q 1024 --heads 16 --causal --arch sm_80 --sms 108 "
                                        "--json");
  CHECK(planned["call"] == "forward");
  CHECK(planned["target"]["arch"] == "sm_80");
  CHECK(planned["target"]["arch_from"] == "--arch");
  CHECK(planned["target"]["sm_count"] == 108);
  CHECK(planned["target"]["sm_count_from"] == "--sms");
  CHECK(planned["target"]["max_smem_bytes"] == jitattn::cli::max_smem_of(Arch::parse("sm_80")));
  CHECK(planned["tiles_from"] == "built-in");
  CHECK(planned["tuning_table"].is_null());
  REQUIRE(planned["launches"].size() >= 1);
  for (const json& launch : planned["launches"]) {
    for (const char* field : {"launch", "spec", "arch", "grid", "threads", "smem_bytes"}) {
      CHECK_MESSAGE(launch.contains(field), field);
    }
    CHECK(launch["arch"] == "sm_80");
  }
  const json& attention = planned["launches"][0];
  CHECK(attention["launch"] == "attention");
  CHECK(attention["splits"].get<int>() >= 1);
  CHECK(attention["workspace_bytes"].is_number());
  CHECK(sandbox.run_json("plan --head-dim 128 --seqlen-q 1024 --heads 16 --tiles 64x64x4 --arch sm_80 --json")["tiles_from"] ==
        "--tiles");
}

TEST_CASE("plan takes the tuning table's tiles, as a real call would, and says so") {
  CliSandbox sandbox;
  const json nvrtc = sandbox.run_json("info --json")["nvrtc"];
  const std::string nvrtc_version = nvrtc["available"] == true ? nvrtc["version"].get<std::string>() : "none";
  const json choice = {{"arch", "sm_80"}, {"dtype", "bf16"}, {"head_dim", 128}, {"causal", true},
                       {"seqlen_bucket", 1024}, {"block_q", 64}, {"block_kv", 32}, {"warps", 4},
                       {"tflops", 1.0}, {"default_tflops", 0.5}};
  fs::create_directories(sandbox.cache_dir() + "/v1");
  std::ofstream(sandbox.cache_dir() + "/v1/tuning.json")
      << json{{"format", 1}, {"library_version", jitattn::version()}, {"nvrtc_version", nvrtc_version},
              {"choices", {choice}}}
             .dump();
  jitattn::detail::TuningTable tuning;
  tuning.set({{Arch::parse("sm_80"), jitattn::DType::bf16, 128, true, 1024}, {64, 32, 4}, 1.0, 0.5});
  jitattn::ForwardOptions causal;
  causal.causal = true;
  const std::vector<ExpectedLaunch> tuned =
      planned_forward(jitattn::DType::bf16, 8, 1024, 32, 32, 128, causal, "sm_80", 166912, 108, &tuning);
  REQUIRE(tuned[0].spec.text() == "fwd.bf16.d128.br64.bc32.w4.causal");
  const std::string args = "--head-dim 128 --batch 8 --seqlen-q 1024 --heads 32 --causal --arch sm_80 --sms 108";
  check_launches(sandbox, args, tuned);
  const json planned = sandbox.run_json("plan " + args + " --json");
  CHECK(planned["tiles_from"] == "tuning table");
  CHECK(planned["tuning_table"] == sandbox.cache_dir() + "/v1/tuning.json");
  CHECK(contains(sandbox.run("plan " + args).out, "from the tuning table"));
  // Another seqlen bucket: the table has no choice for it.
  CHECK(sandbox.run_json("plan --head-dim 128 --batch 8 --seqlen-q 4096 --heads 32 --causal --arch sm_80 --json")
            ["tiles_from"] == "built-in");
  // `presets` lists the tuned tiles with the specs warm --preset compiles for the class.
  const CliRun listed = sandbox.run("presets --arch sm_80");
  REQUIRE(listed.status == 0);
  CHECK(contains(listed.out, "fwd.bf16.d128.br64.bc32.w4.causal"));
}

TEST_CASE("plan --manifest prints SPEC @ARCH lines that warm --manifest reads") {
  CliSandbox sandbox;
  // A decoding step: three launches, each a line pinned to the target arch.
  const CliRun decode = sandbox.run("plan --call kvcache --head-dim 128 --seqlen-q 1 --seqlen-k 3000 --cache-len 4096 "
                                    "--page-size 16 --new-tokens 1 --heads 32 --heads-kv 8 --splits 4 --arch sm_90a "
                                    "--manifest");
  REQUIRE(decode.status == 0);
  std::istringstream lines(decode.out);
  size_t count = 0;
  for (std::string line; std::getline(lines, line); ++count) {
    std::istringstream words(line);
    std::string spec, pin, extra;
    words >> spec >> pin;
    REQUIRE_FALSE(pin.empty());
    CHECK_FALSE(static_cast<bool>(words >> extra));
    CHECK(KernelSpec::parse(spec).text() == spec);
    CHECK(pin == "@sm_90a");
  }
  CHECK(count == 3);

  // A kernel that compiles in about a second, warmed from the manifest.
  const CliRun small = sandbox.run("plan --dtype f16 --head-dim 64 --seqlen-q 256 --heads 8 --tiles 64x64x4 "
                                   "--no-workspace --arch sm_80 --manifest");
  REQUIRE(small.status == 0);
  CHECK(small.out == std::string(kSmallSpec) + " @sm_80\n");
  const std::string manifest = sandbox.write_file("specs.txt", small.out);
  const json warmed = sandbox.run_json(fmt::format("warm --manifest {} --arch sm_90a --json", shell_quoted(manifest)));
  REQUIRE(warmed.size() == 1);
  CHECK(warmed[0]["spec"] == kSmallSpec);
  CHECK(warmed[0]["arch"] == "sm_80");  // the pin, not --arch
  CHECK(warmed[0]["result"] == "miss");
}

TEST_CASE("plan rejects bad options before planning, naming the option and the rule") {
  CliSandbox sandbox;
  const std::string shape = "plan --head-dim 128 --seqlen-q 64 ";
  struct Bad {
    std::string args;
    std::string message;
  };
  const Bad cases[] = {
      {"--heads 32 --heads-kv 6", "--heads: 32 must be a multiple of --heads-kv 6"},
      {"--heads 32 --tiles 128x64", "--tiles: '128x64' has 2 numbers"},
      {"--heads 32 --tiles 128xx64x4", "--tiles: '128xx64x4' is not numbers joined by x"},
      {"--heads 32 --tiles 128x64x4q", "--tiles: '128x64x4q'"},
      {"--heads 32 --call kvcache --seqlen-k 5000 --cache-len 4096", "--seqlen-k: 5000 cached keys must fit in --cache-len 4096"},
      {"--heads 32 --call kvcache --seqlen-k 4000 --new-tokens 200 --cache-len 4096", "--seqlen-k: 4000 cached keys + 200 new ones (--new-tokens) must fit in --cache-len 4096"},
      {"--heads 32 --dtype f32", "--dtype: 'f32' is not bf16 or f16"},
      {"--heads 32 --window 128", "--window: '128' is not L,R"},
      {"--heads 32 --page-size 16", "--page-size: applies to --call kvcache or varlen only"},
      {"--heads 32 --call kvcache --no-workspace", "--no-workspace: applies to --call forward or varlen only"},
      {"--heads 32 --call kvcache --head-dim-v 64", "--head-dim-v: applies to --call forward or varlen only"},
      {"--heads 32 --call varlen --page-size 16 --head-dim-v 64", "--head-dim-v: not with --page-size"},
      {"--heads 32 --total-q 64", "--total-q: applies to --call varlen only"},
      {"--heads 32 --call kvcache --total-q 64", "--total-q: applies to --call varlen only"},
      {"--heads 32 --call varlen --new-tokens 1", "--new-tokens: applies to --call kvcache only"},
      {"--heads 32 --call varlen --cache-len 4096", "--cache-len: applies to --call kvcache only"},
      {"--heads 32 --call varlen --batch 2 --total-q 200",
       "--total-q: 200 must be from --seqlen-q 64 (the longest sequence) to --batch x --seqlen-q 128"},
      {"--heads 32 --call varlen --batch 2 --total-q 63", "--total-q: 63 must be from --seqlen-q 64"},
      {"--heads 32 --call varlen --batch 2 --seqlen-k 100 --total-seqlen-k 250",
       "--total-seqlen-k: 250 must be from --seqlen-k 100 (the longest sequence) to --batch x --seqlen-k 200"},
      {"--heads 32 --call varlen --batch 2 --seqlen-k 100 --page-size 16 --total-seqlen-k 250",
       "--total-seqlen-k: 250 must be from --seqlen-k 100"},
      {"--heads 32 --call varlen --page-size 48", "k: page_size=48"},
      {"--heads 0", "--heads: 0 must be >= 1"},
      {"--heads 32 --sms 0", "--sms: 0 must be >= 1"},
      // The planner's own rules come through as it words them.
      {"--heads 32 --head-dim 300", "q: head_dim=300 is above the largest supported, 256"},
      {"--heads 32 --call kvcache --page-size 48", "k_cache: page_size=48 (dimension 1 of a paged cache) must be a power of two"},
      {"--heads 32 --tiles 128x128x8x2w --arch sm_80", "options.tiles.wgmma needs sm_90a, not sm_80"},
      {"--heads 32 --rope half --yarn-factor -1", "options.rope.yarn_factor=-1 must be positive and finite (0 = off)"},
      {"--heads 32 --rope half --yarn-factor 32 --rope-tables bf16",
       "options.rope: yarn_factor=32 scales angles from theta; cos/sin tables are used as given"},
      {"--heads 32 --rope half --yarn-factor 32 --yarn-attention-factor -1",
       "options.rope.yarn_attention_factor=-1 must be"},
      {"--heads 32 --rope half --yarn-factor 0 --yarn-attention-factor 2",
       "--yarn-attention-factor: 2 needs a --yarn-factor other than 0"},
  };
  for (const Bad& bad : cases) {
    // --head-dim given twice is a usage error: the shape's is replaced.
    std::string args = shape + bad.args;
    if (contains(bad.args, "--head-dim ")) args = "plan --seqlen-q 64 " + bad.args;
    const CliRun result = sandbox.run(args);
    INFO(args << "\nstderr: " << result.err);
    CHECK(result.status == 1);
    CHECK(result.out.empty());
    CHECK(contains(result.err, "jitattn: " + bad.message));
  }
  // Usage errors exit 2: a missing required option, a word outside its set,
  // options that need or exclude another.
  for (const char* usage : {"plan --seqlen-q 64 --heads 8", "plan --head-dim 64 --seqlen-q 64 --heads 8 --pack-gqa maybe",
                            "plan --head-dim 64 --seqlen-q 64 --heads 8 --rotary-dim 32",
                            "plan --head-dim 64 --seqlen-q 64 --heads 8 --json --manifest"}) {
    INFO(usage);
    CHECK(sandbox.run(usage).status == 2);
  }
  // YaRN scales RoPE's angles, and its attention factor is YaRN's.
  const CliRun unrotated = sandbox.run("plan --head-dim 64 --seqlen-q 64 --heads 8 --yarn-factor 32");
  CHECK(unrotated.status == 2);
  CHECK(contains(unrotated.err, "--yarn-factor requires --rope"));
  const CliRun no_yarn = sandbox.run("plan --head-dim 64 --seqlen-q 64 --heads 8 --rope half --yarn-attention-factor 2");
  CHECK(no_yarn.status == 2);
  CHECK(contains(no_yarn.err, "--yarn-attention-factor requires --yarn-factor"));
}

TEST_CASE("plan --help lists its options") {
  CliSandbox sandbox;
  const CliRun help = sandbox.run("plan --help");
  CHECK(help.status == 0);
  for (const char* option : {"--call", "--dtype", "--head-dim", "--batch", "--seqlen-q", "--seqlen-k", "--heads",
                             "--heads-kv", "--causal", "--window", "--attention-chunk", "--softcap", "--alibi", "--learnable-sink", "--rope", "--rotary-dim",
                             "--rope-tables", "--yarn-factor", "--yarn-attention-factor", "--longrope-factor",
                             "--longrope-attention-factor", "--tiles", "--splits",
                             "--pack-gqa", "--no-workspace", "--cache-len",
                             "--page-size", "--new-tokens", "--max-seqlen-k", "--total-seqlen-k", "--dynamic-splits",
                             "--total-q", "--arch", "--sms", "--smem", "--json", "--manifest"}) {
    CHECK_MESSAGE(contains(help.out, option), option);
  }
  CHECK(contains(help.out, "jitattn warm --manifest"));
  CHECK(contains(help.out, "--call varlen plans forward_varlen()"));
}

TEST_CASE("planning without a GPU assumes each arch's opt-in shared memory per block") {
  using jitattn::cli::max_smem_of;
  CHECK(max_smem_of(Arch::parse("sm_90a")) == 232448);
  CHECK(max_smem_of(Arch::parse("sm_100")) == 232448);
  CHECK(max_smem_of(Arch::parse("sm_80")) == 166912);
  CHECK(max_smem_of(Arch::parse("sm_87")) == 166912);
  CHECK(max_smem_of(Arch::parse("sm_86")) == 101376);
  CHECK(max_smem_of(Arch::parse("sm_89")) == 101376);
  CHECK(max_smem_of(Arch::parse("sm_120")) == 101376);
}


// Random calls of each model preset's decoder shapes, as an inference engine
// makes them: prefill with and without a workspace, varlen steps over packed
// keys and over pages, and KV-cache calls of 1–16 tokens over caches of any
// length, paged or not, split by the heuristic, unsplit or dynamically. Each
// call's kernels must have been warmed by the preset. The calls are drawn
// from a fixed seed, over ranges the presets' own sweeps do not enumerate.
TEST_CASE("model presets warm the kernels of random calls of their shapes") {
  using jitattn::DType;
  using jitattn::TensorView;
  using jitattn::cli::AttentionShape;
  auto address = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  std::mt19937 rng(20261125);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  auto log_uniform = [&](int64_t lo, int64_t hi) {
    return static_cast<int64_t>(std::exp(std::uniform_real_distribution<double>(std::log(lo), std::log(hi + 1.0))(rng)));
  };
  const int calls_per_kind = 40;
  size_t planned = 0;
  std::map<std::string, std::string> cold;  // spec → the first call that planned it
  for (const jitattn::cli::Preset& preset : jitattn::cli::presets()) {
    for (const char* arch_text : {"sm_90a", "sm_80"}) {
      const Arch arch = Arch::parse(arch_text);
      const int max_smem = jitattn::cli::max_smem_of(arch);
      const std::vector<KernelSpec> warmed = jitattn::cli::preset_specs(preset.name, arch);
      std::set<std::string> warmed_text;
      for (const KernelSpec& spec : warmed) warmed_text.insert(spec.text());
      for (const AttentionShape& shape : preset.shapes) {
        // The default preset's and encoders' shapes are warmed for forward() prefill calls; decoders' for
        // every call below.
        const bool prefill_only = !shape.decoder || preset.name == "default";
        const int64_t d = shape.head_dim, hq = shape.heads_q, hk = shape.heads_kv;
        const int rotary_dim = shape.rotary_dim != 0 ? shape.rotary_dim : shape.head_dim;
        for (const std::string form : {"none", "theta", "tables"}) {
          if (form != "none" && shape.rope == jitattn::RopeStyle::none) continue;
          TensorView cos, sin, sinks = TensorView::contiguous(address(0x90000), DType::f32, {hq});
          std::vector<float> pair_factors(rotary_dim / 2, 1.25f);
          auto options_for = [&](int64_t positions) {
            jitattn::ForwardOptions options;
            options.causal = shape.causal;
            if (shape.local) options.window_left = shape.window > 0 ? shape.window : 4096;
            if (shape.softcap) options.softcap = 30.f;
            if (shape.sink) options.learnable_sink = &sinks;
            if (form == "none") return options;
            options.rope.style = shape.rope;
            options.rope.rotary_dim = rotary_dim;
            options.rope.theta = 500000.f;
            if (form == "tables") {
              cos = TensorView::contiguous(address(0x60000), shape.dtype, {positions, rotary_dim / 2});
              sin = TensorView::contiguous(address(0x70000), shape.dtype, {positions, rotary_dim / 2});
              options.rope.cos = &cos;
              options.rope.sin = &sin;
            } else if (shape.yarn_factor != 0.f) {
              options.rope.yarn_factor = shape.yarn_factor;
            } else if (shape.longrope_factor != 0.f) {
              options.rope.longrope_pair_factors = pair_factors.data();
              options.rope.longrope_factor = shape.longrope_factor;
            }
            return options;
          };
          auto expect_warmed = [&](const KernelSpec& spec, const std::string& call) {
            ++planned;
            if (warmed_text.count(spec.text()) == 0) {
              cold.emplace(spec.text(), fmt::format("{} {} {}: {}", preset.name, arch_text, form, call));
            }
          };
          auto expect_split_warmed = [&](const jitattn::detail::SplitForwardPlan& plan, const std::string& call) {
            expect_warmed(plan.attention.spec, call);
            if (plan.combine.grid > 0) expect_warmed(plan.combine.spec, call + " (combine)");
          };
          void* const workspace = address(0x100000);
          const size_t workspace_bytes = size_t{1} << 36;
          for (int i = 0; i < calls_per_kind; ++i) {
            // Prefill: forward() with and without a workspace, and a varlen step over packed keys.
            const int64_t seqlen = log_uniform(16, 32768), batch = std::max<int64_t>(1, log_uniform(1, 65536) / seqlen);
            const std::string call = fmt::format("prefill batch={} seqlen={}", batch, seqlen);
            const jitattn::ForwardOptions options = options_for(seqlen);
            const TensorView q = TensorView::contiguous(address(0x10000), shape.dtype, {batch, seqlen, hq, d});
            const TensorView kv = TensorView::contiguous(address(0x20000), shape.dtype, {batch, seqlen, hk, d});
            if (shape.head_dim_v != 0) {
              // V (and the output) of its own head dim.
              const int64_t dv = shape.head_dim_v;
              const TensorView v = TensorView::contiguous(address(0x30000), shape.dtype, {batch, seqlen, hk, dv});
              const TensorView out = TensorView::contiguous(address(0x40000), shape.dtype, {batch, seqlen, hq, dv});
              expect_warmed(jitattn::detail::plan_forward(q, kv, v, out, nullptr, options, arch, max_smem, 132).spec, call);
              continue;
            }
            expect_warmed(jitattn::detail::plan_forward(q, kv, values_after(kv), q, nullptr, options, arch, max_smem, 132).spec, call);
            if (prefill_only) continue;
            expect_split_warmed(jitattn::detail::plan_forward_split(q, kv, values_after(kv), q, nullptr, options, workspace,
                                                                    workspace_bytes, false, arch, max_smem, 132),
                                call + " (workspace)");
          }
          if (prefill_only) continue;
          for (int i = 0; i < calls_per_kind; ++i) {
            // An engine's varlen step: decoding sequences, speculative tokens, or a prefill chunk beside them.
            const int64_t batch = log_uniform(1, 256);
            const int kind = static_cast<int>(uniform(0, 2));
            const int64_t tokens = kind == 0 ? 1 : kind == 1 ? uniform(2, 16) : 0;
            const int64_t chunk = kind == 2 ? log_uniform(32, 2048) : 0;
            const int64_t total_q = kind == 2 ? batch - 1 + chunk : batch * tokens;
            const int64_t max_seqlen_q = kind == 2 ? chunk : tokens;
            const int64_t max_seqlen_k = std::max<int64_t>(max_seqlen_q, log_uniform(64, 32768));
            // Keys in a paged cache were rotated as they were written: RoPE steps read packed keys.
            const int64_t page = form == "none" && uniform(0, 1) == 1 ? int64_t{16} << uniform(0, 4) : 0;
            const int mode = static_cast<int>(uniform(0, 2));  // no workspace, a workspace, dynamic splits
            const std::string call = fmt::format("varlen step batch={} total_q={} max_q={} max_k={} page={} mode={}",
                                                 batch, total_q, max_seqlen_q, max_seqlen_k, page, mode);
            const int64_t pages_per_seq = page == 0 ? 0 : (max_seqlen_k + page - 1) / page;
            const TensorView q = TensorView::contiguous(address(0x10000), shape.dtype, {total_q, hq, d});
            const TensorView kv =
                page == 0 ? TensorView::contiguous(address(0x20000), shape.dtype, {batch * max_seqlen_k, hk, d})
                          : TensorView::contiguous(address(0x20000), shape.dtype, {batch * pages_per_seq, page, hk, d});
            const TensorView table = TensorView::contiguous(address(0x30000), DType::i32, {batch, std::max<int64_t>(1, pages_per_seq)});
            jitattn::VarlenArgs varlen;
            varlen.cu_seqlens_q = varlen.cu_seqlens_k = TensorView::contiguous(address(0x40000), DType::i32, {batch + 1});
            varlen.max_seqlen_q = static_cast<int>(max_seqlen_q);
            varlen.max_seqlen_k = static_cast<int>(max_seqlen_k);
            varlen.block_table = page == 0 ? nullptr : &table;
            varlen.dynamic_splits = mode == 2;
            const jitattn::ForwardOptions options = options_for(max_seqlen_k);
            if (mode == 0) {
              expect_warmed(jitattn::detail::plan_forward_varlen(q, kv, values_after(kv), q, nullptr, varlen, options, arch, max_smem,
                                                                 132)
                                .spec,
                            call);
            } else {
              expect_split_warmed(jitattn::detail::plan_forward_varlen_split(q, kv, values_after(kv), q, nullptr, varlen, options,
                                                                             workspace, workspace_bytes, false, arch,
                                                                             max_smem, 132),
                                  call);
            }
          }
          for (int i = 0; i < calls_per_kind; ++i) {
            // forward_kvcache: decoding or speculative tokens, new keys appended or not.
            const int64_t batch = log_uniform(1, 256), tokens = uniform(0, 2) == 0 ? uniform(2, 16) : 1;
            const int64_t page = uniform(0, 2) == 0 ? 0 : int64_t{16} << uniform(0, 4);
            const int64_t capacity = std::max<int64_t>(page, log_uniform(128, 131072) / 16 * 16);
            const int mode = static_cast<int>(uniform(0, 2));  // the heuristic's splits, none, dynamic
            const bool append = uniform(0, 1) == 1;
            const std::string call = fmt::format("kvcache batch={} tokens={} capacity={} page={} mode={} append={}",
                                                 batch, tokens, capacity, page, mode, append);
            const int64_t pages_per_seq = page == 0 ? 0 : (capacity + page - 1) / page;
            const TensorView q = TensorView::contiguous(address(0x10000), shape.dtype, {batch, tokens, hq, d});
            const TensorView k_new = TensorView::contiguous(address(0x20000), shape.dtype, {batch, tokens, hk, d});
            const TensorView table = TensorView::contiguous(address(0x30000), DType::i32, {batch, std::max<int64_t>(1, pages_per_seq)});
            jitattn::KVCacheArgs args;
            args.k_cache = page == 0 ? TensorView::contiguous(address(0x40000), shape.dtype, {batch, capacity, hk, d})
                                     : TensorView::contiguous(address(0x40000), shape.dtype, {batch * pages_per_seq, page, hk, d});
            args.v_cache = values_after(args.k_cache);
            args.cache_seqlens = TensorView::contiguous(address(0x50000), DType::i32, {batch});
            args.block_table = page == 0 ? nullptr : &table;
            if (append) args.k_new = args.v_new = &k_new;
            args.num_splits = mode == 1 ? 1 : 0;
            args.dynamic_splits = mode == 2;
            const auto plan = jitattn::detail::plan_kvcache(q, args, q, nullptr, options_for((page == 0 ? capacity : pages_per_seq * page) + tokens), workspace,
                                                            workspace_bytes, false, arch, max_smem, 132);
            expect_warmed(plan.attention.spec, call);
            if (plan.append.grid > 0) expect_warmed(plan.append.spec, call + " (append)");
            if (plan.combine.grid > 0) expect_warmed(plan.combine.spec, call + " (combine)");
          }
        }
      }
    }
  }
  MESSAGE(fmt::format("{} kernels planned, {} specs cold", planned, cold.size()));
  for (const auto& [spec, call] : cold) CHECK_MESSAGE(false, fmt::format("{} not warmed ({})", spec, call));
}

}  // TEST_SUITE("cli")
