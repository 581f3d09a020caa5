// The tuning table and what the planner does with it. Timing itself needs a
// GPU; these tests cover everything around it.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "driver.hpp"
#include "plan.hpp"
#include "cache.hpp"
#include "tune.hpp"

using namespace jitattn;
using namespace jitattn::detail;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kLibrary = "1.2.3";
constexpr const char* kNvrtc = "13.0";

// A fresh temporary directory, removed afterwards.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/jitattn-tune-test-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string table_path() const { return path_ + "/v1/tuning.json"; }
  void write_table(const std::string& text) const {
    fs::create_directories(path_ + "/v1");
    std::ofstream(table_path(), std::ios::binary) << text;
  }

 private:
  std::string path_;
};

ShapeClass hopper_class(int bucket, bool causal = false) {
  return ShapeClass{Arch::parse("sm_90a"), DType::bf16, 128, causal, bucket};
}

TunedChoice choice(const ShapeClass& shape, TileConfig tiles, double tflops = 400, double default_tflops = 380) {
  TunedChoice c;
  c.shape = shape;
  c.tiles = tiles;
  c.tflops = tflops;
  c.default_tflops = default_tflops;
  return c;
}

TuningTable stamped_table() {
  TuningTable table;
  table.library_version = kLibrary;
  table.nvrtc_version = kNvrtc;
  return table;
}

bool same(const TileConfig& a, const TileConfig& b) {
  return a.block_q == b.block_q && a.block_kv == b.block_kv && a.warps == b.warps;
}

json row(int block_q, int block_kv, int warps, int bucket = 1024) {
  return {{"arch", "sm_90a"}, {"dtype", "bf16"}, {"head_dim", 128}, {"causal", false},
          {"seqlen_bucket", bucket}, {"block_q", block_q}, {"block_kv", block_kv}, {"warps", warps},
          {"tflops", 400.0}, {"default_tflops", 380.0}};
}

std::string table_text(const json& choices, const std::string& library = kLibrary, const std::string& nvrtc = kNvrtc) {
  return json{{"format", 1}, {"library_version", library}, {"nvrtc_version", nvrtc}, {"choices", choices}}.dump();
}

// Fake, suitably aligned device addresses: plan never dereferences them.
void* address(uintptr_t base) { return reinterpret_cast<void*>(base); }

// seqlen_q 100, seqlen_k 300: bucket n512.
struct Call {
  TensorView q = TensorView::contiguous(address(0x10000), DType::bf16, {2, 100, 8, 128});
  TensorView k = TensorView::contiguous(address(0x20000), DType::bf16, {2, 300, 2, 128});
  TensorView v = TensorView::contiguous(address(0x30000), DType::bf16, {2, 300, 2, 128});
  TensorView out = TensorView::contiguous(address(0x40000), DType::bf16, {2, 100, 8, 128});
  ForwardOptions options;
  KernelSpec spec(const TuningTable* tuning) const {
    return plan_forward(q, k, v, out, nullptr, options, Arch::parse("sm_90a"), 227 * 1024, 132, tuning).spec;
  }
};

}  // namespace

TEST_SUITE("tune") {

TEST_CASE("seqlen_bucket rounds the longer length up to a power of two in [512, 16384]") {
  CHECK(seqlen_bucket(1, 1) == 512);
  CHECK(seqlen_bucket(0, 0) == 512);
  CHECK(seqlen_bucket(-5, -7) == 512);
  CHECK(seqlen_bucket(512, 512) == 512);
  CHECK(seqlen_bucket(513, 513) == 1024);
  CHECK(seqlen_bucket(1024, 1) == 1024);
  CHECK(seqlen_bucket(4097, 4096) == 8192);
  CHECK(seqlen_bucket(16384, 16384) == 16384);
  CHECK(seqlen_bucket(16385, 1) == 16384);
  CHECK(seqlen_bucket(100000, 100000) == 16384);
  // The longer of the two decides, whichever it is.
  CHECK(seqlen_bucket(100, 3000) == 4096);
  CHECK(seqlen_bucket(3000, 100) == 4096);
}

TEST_CASE("a shape class has a readable text and a packed key that tells every field apart") {
  CHECK(hopper_class(4096, true).text() == "sm_90a.bf16.d128.causal.n4096");
  CHECK(ShapeClass{Arch::parse("sm_80"), DType::f16, 64, false, 512}.text() == "sm_80.f16.d64.n512");

  const ShapeClass base = hopper_class(4096, true);
  std::vector<ShapeClass> variants = {base};
  auto vary = [&](auto change) {
    ShapeClass s = base;
    change(s);
    variants.push_back(s);
  };
  vary([](ShapeClass& s) { s.arch = Arch::parse("sm_90"); });    // arch-specific flag
  vary([](ShapeClass& s) { s.arch = Arch::parse("sm_80"); });    // arch number
  vary([](ShapeClass& s) { s.arch = Arch::parse("sm_89"); });
  vary([](ShapeClass& s) { s.dtype = DType::f16; });
  vary([](ShapeClass& s) { s.head_dim = 64; });
  vary([](ShapeClass& s) { s.causal = false; });
  vary([](ShapeClass& s) { s.seqlen_bucket = 8192; });
  vary([](ShapeClass& s) { s.seqlen_bucket = 512; });
  std::set<uint64_t> keys;
  std::set<std::string> texts;
  for (const ShapeClass& s : variants) {
    keys.insert(s.packed());
    texts.insert(s.text());
  }
  CHECK(keys.size() == variants.size());
  CHECK(texts.size() == variants.size());
  CHECK(hopper_class(4096, true).packed() == base.packed());  // equal classes, equal keys
}

TEST_CASE("a saved table loads back with every field") {
  TempDir dir;
  TuningTable table = stamped_table();
  table.set(choice(hopper_class(1024), {128, 128, 8}, 512.5, 480.25));
  table.set(choice(ShapeClass{Arch::parse("sm_80"), DType::f16, 64, true, 16384}, {64, 32, 4}, 150, 0));
  table.save(dir.path());

  // The documented layout, written atomically (no temporary file left behind).
  std::ifstream file(dir.table_path());
  const json document = json::parse(file);
  CHECK(document["format"] == 1);
  CHECK(document["library_version"] == kLibrary);
  CHECK(document["nvrtc_version"] == kNvrtc);
  REQUIRE(document["choices"].size() == 2);
  CHECK(document["choices"][0] == json({{"arch", "sm_90a"}, {"dtype", "bf16"}, {"head_dim", 128}, {"causal", false},
                                        {"seqlen_bucket", 1024}, {"block_q", 128}, {"block_kv", 128}, {"warps", 8},
                                        {"tflops", 512.5}, {"default_tflops", 480.25}}));
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path() + "/v1")) files += entry.is_regular_file() ? 1 : 0;
  CHECK(files == 1);

  const TuningTable loaded = TuningTable::load(dir.path(), kLibrary, kNvrtc);
  REQUIRE(loaded.choices().size() == 2);
  CHECK(loaded.library_version == kLibrary);
  CHECK(loaded.nvrtc_version == kNvrtc);
  const TunedChoice& first = loaded.choices()[0];
  CHECK(first.shape.text() == "sm_90a.bf16.d128.n1024");
  CHECK(same(first.tiles, {128, 128, 8}));
  CHECK(first.tflops == 512.5);
  CHECK(first.default_tflops == 480.25);
  CHECK(loaded.choices()[1].shape.text() == "sm_80.f16.d64.causal.n16384");
  REQUIRE(loaded.lookup(hopper_class(1024)));
  CHECK(same(*loaded.lookup(hopper_class(1024)), {128, 128, 8}));
  CHECK_FALSE(loaded.lookup(hopper_class(2048)));

  // Saving again replaces the file.
  TuningTable more = loaded;
  more.set(choice(hopper_class(2048), {64, 64, 4}));
  more.save(dir.path());
  CHECK(TuningTable::load(dir.path(), kLibrary, kNvrtc).choices().size() == 3);
}

TEST_CASE("a missing table loads empty, and a disabled cache neither loads nor saves") {
  TempDir dir;
  CHECK(TuningTable::load(dir.path(), kLibrary, kNvrtc).empty());
  CHECK(TuningTable::load("", kLibrary, kNvrtc).empty());
  TuningTable table = stamped_table();
  table.set(choice(hopper_class(1024), {128, 64, 4}));
  try {
    table.save("");
    FAIL("save(\"\") did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::cache_error);
    CHECK(std::string(e.what()).find("disk cache is disabled") != std::string::npos);
  }
}

TEST_CASE("a table from another library or NVRTC version is ignored") {
  TempDir dir;
  TuningTable table = stamped_table();
  table.set(choice(hopper_class(1024), {128, 128, 8}));
  table.save(dir.path());
  CHECK(TuningTable::load(dir.path(), kLibrary, kNvrtc).choices().size() == 1);
  CHECK(TuningTable::load(dir.path(), "1.2.4", kNvrtc).empty());
  CHECK(TuningTable::load(dir.path(), kLibrary, "12.8").empty());
  // The empty table carries the versions asked for, so tuning again and saving replaces the stale one.
  const TuningTable fresh = TuningTable::load(dir.path(), "1.2.4", kNvrtc);
  CHECK(fresh.library_version == "1.2.4");
}

TEST_CASE("without NVRTC a table is taken only where it is the version that warmed the cache") {
  TempDir dir;
  TuningTable table = stamped_table();
  table.set(choice(hopper_class(1024), {128, 128, 8}));
  table.save(dir.path());
  // No record of the warming NVRTC: the built-in tiles.
  CHECK(TuningTable::load(dir.path(), kLibrary, "none").empty());
  CHECK(warmed_nvrtc(dir.path()) == "none");
  // The cache was warmed with the table's NVRTC (FileCache::put writes v1/compiler): its choices.
  std::ofstream(std::filesystem::path(dir.path()) / "v1" / "compiler") << kNvrtc;
  CHECK(TuningTable::load(dir.path(), kLibrary, "none").choices().size() == 1);
  // Warmed with another NVRTC, which ignored this table: the built-in tiles, as that host planned.
  std::ofstream(std::filesystem::path(dir.path()) / "v1" / "compiler") << "12.8";
  CHECK(TuningTable::load(dir.path(), kLibrary, "none").empty());
}

TEST_CASE("a corrupt or foreign file loads as an empty table") {
  TempDir dir;
  for (const std::string text : {std::string("{\"format\": 1, \"choices\": ["), std::string("not json at all"),
                                 std::string(""), std::string("[1, 2, 3]"),
                                 json{{"format", 2}, {"library_version", kLibrary}, {"nvrtc_version", kNvrtc},
                                      {"choices", json::array({row(128, 64, 4)})}}.dump(),
                                 json{{"format", 1}, {"choices", json::array({row(128, 64, 4)})}}.dump(),
                                 table_text(json::object())}) {
    CAPTURE(text);
    dir.write_table(text);
    CHECK(TuningTable::load(dir.path(), kLibrary, kNvrtc).empty());
  }
}

TEST_CASE("rows the generator cannot build are skipped, the others kept") {
  TempDir dir;
  json bad_bucket = row(128, 64, 4, 1000);
  json bad_dtype = row(128, 64, 4, 2048);
  bad_dtype["dtype"] = "f32";
  json bad_arch = row(128, 64, 4, 4096);
  bad_arch["arch"] = "sm_75";
  json missing = row(128, 64, 4, 8192);
  missing.erase("warps");
  dir.write_table(table_text({row(128, 64, 4, 512), row(64, 64, 8, 1024) /* 8 rows per warp */,
                              row(128, 96, 4, 1024), bad_bucket, bad_dtype, bad_arch, missing,
                              row(64, 32, 4, 16384)}));
  const TuningTable loaded = TuningTable::load(dir.path(), kLibrary, kNvrtc);
  REQUIRE(loaded.choices().size() == 2);
  CHECK(loaded.choices()[0].shape.seqlen_bucket == 512);
  CHECK(loaded.choices()[1].shape.seqlen_bucket == 16384);
  CHECK_FALSE(loaded.lookup(hopper_class(1024)));
}

TEST_CASE("set replaces the choice of an existing class and appends a new one") {
  TuningTable table;
  table.set(choice(hopper_class(1024), {128, 64, 4}));
  table.set(choice(hopper_class(2048), {128, 64, 4}));
  table.set(choice(hopper_class(1024), {64, 32, 4}, 999));
  REQUIRE(table.choices().size() == 2);
  CHECK(same(*table.lookup(hopper_class(1024)), {64, 32, 4}));
  CHECK(table.choices()[0].tflops == 999);  // replaced in place
  CHECK(same(*table.lookup(hopper_class(2048)), {128, 64, 4}));
  table.set(choice(hopper_class(1024, true), {128, 128, 8}));
  CHECK(table.choices().size() == 3);
  CHECK(same(*table.lookup(hopper_class(1024, true)), {128, 128, 8}));
  CHECK(same(*table.lookup(hopper_class(1024)), {64, 32, 4}));
}

TEST_CASE("saving under a regular file fails with cache_error naming the path") {
  TempDir dir;
  const std::string file = dir.path() + "/not-a-dir";
  std::ofstream(file) << "x";
  TuningTable table = stamped_table();
  table.set(choice(hopper_class(1024), {128, 64, 4}));
  try {
    table.save(file);
    FAIL("save under a regular file did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::cache_error);
    CHECK(std::string(e.what()).find(file + "/v1/tuning.json") != std::string::npos);
  }
}

TEST_CASE("tile_candidates are the generated configurations of a head dim") {
  // 9 tile shapes, less those over the register budget (accumulator_registers > 192).
  const std::map<int, size_t> expected = {{32, 9}, {64, 9}, {96, 8}, {128, 8}, {192, 6}, {256, 6}};
  for (const auto& [head_dim, count] : expected) {
    CAPTURE(head_dim);
    const std::vector<TileConfig> candidates = tile_candidates(head_dim);
    CHECK(candidates.size() == count);
    std::set<std::tuple<int, int, int>> distinct;
    for (const TileConfig& t : candidates) {
      distinct.emplace(t.block_q, t.block_kv, t.warps);
      KernelSpec spec;
      spec.head_dim = head_dim;
      spec.block_q = t.block_q;
      spec.block_kv = t.block_kv;
      spec.warps = t.warps;
      CHECK_NOTHROW(spec.validate());
    }
    CHECK(distinct.size() == count);
    // The built-in choice is among them, so tuning measures it too.
    const TileConfig builtin = default_tiles(DType::bf16, head_dim, true, Arch::parse("sm_90a"), 4096);
    CHECK(distinct.count({builtin.block_q, builtin.block_kv, builtin.warps}) == 1);
  }
  CHECK(tile_candidates(80).empty());
}

TEST_CASE("the planner takes tiles from the tuning table for the call's class only") {
  Call call;  // bf16, d128, not causal, bucket n512
  const TileConfig builtin = default_tiles(DType::bf16, 128, false, Arch::parse("sm_90a"), 512);
  const TileConfig tuned = same(builtin, {64, 32, 4}) ? TileConfig{128, 128, 8} : TileConfig{64, 32, 4};

  TuningTable table;
  table.set(choice(hopper_class(512), tuned));
  const KernelSpec with_table = call.spec(&table);
  CHECK(same({with_table.block_q, with_table.block_kv, with_table.warps}, tuned));

  const KernelSpec without = call.spec(nullptr);
  CHECK(same({without.block_q, without.block_kv, without.warps}, builtin));

  TuningTable other_bucket;
  other_bucket.set(choice(hopper_class(1024), tuned));
  other_bucket.set(choice(hopper_class(512, true), tuned));  // the causal class
  const KernelSpec other = call.spec(&other_bucket);
  CHECK(same({other.block_q, other.block_kv, other.warps}, builtin));

  // A longer key sequence moves the call into the tuned bucket.
  Call longer;
  longer.k = TensorView::contiguous(longer.k.data, DType::bf16, {2, 1000, 2, 128});
  longer.v = TensorView::contiguous(longer.v.data, DType::bf16, {2, 1000, 2, 128});
  const KernelSpec moved = longer.spec(&other_bucket);
  CHECK(same({moved.block_q, moved.block_kv, moved.warps}, tuned));

  Call forced;
  forced.options.tiles = {128, 64, 8};
  const KernelSpec chosen = forced.spec(&table);
  CHECK(same({chosen.block_q, chosen.block_kv, chosen.warps}, {128, 64, 8}));
}

TEST_CASE("tune without a GPU throws cuda_error") {
  if (driver().available) return;  // covered by the GPU runs
  Runtime runtime(Config{});
  TuneRequest request;
  request.dtypes = {DType::bf16};
  request.head_dims = {64};
  request.seqlens = {512};
  try {
    tune(runtime, request);
    FAIL("tune did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::cuda_error);
  }
}

}  // TEST_SUITE("tune")
