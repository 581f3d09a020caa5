// The C API without a GPU: status codes, messages, and that validation runs
// before anything needs a device.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

#include <fmt/format.h>
#include <jitattn/jitattn.h>
#include <jitattn/jitattn.hpp>

#include "driver.hpp"
#include "grown_struct.hpp"

namespace {

jitattn_tensor bshd(void* data, int32_t dtype, int64_t b, int64_t s, int64_t h, int64_t d) {
  jitattn_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = 4;
  const int64_t shape[4] = {b, s, h, d};
  const int64_t strides[4] = {s * h * d, h * d, d, 1};
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = shape[i];
    t.strides[i] = strides[i];
  }
  return t;
}

void* fake(uintptr_t address) { return reinterpret_cast<void*>(address); }

// A contiguous [rows] (columns 0) or [rows, columns] tensor: lengths, pads, block tables.
jitattn_tensor index_tensor(uintptr_t address, int32_t dtype, int64_t rows, int64_t columns) {
  jitattn_tensor t{};
  t.data = fake(address);
  t.dtype = dtype;
  t.ndim = columns > 0 ? 2 : 1;
  t.shape[0] = rows;
  t.strides[0] = columns > 0 ? columns : 1;
  if (columns > 0) t.shape[1] = columns, t.strides[1] = 1;
  return t;
}

// The process-wide runtime must be configured before its first use.
void configure_once() {
  static const bool done = [] {
    const auto dir = std::filesystem::temp_directory_path() / ("jitattn-capi-" + std::to_string(::getpid()));
    REQUIRE(jitattn_configure(dir.c_str(), nullptr, 1) == JITATTN_OK);
    return true;
  }();
  (void)done;
}

}  // namespace

TEST_SUITE("capi") {

TEST_CASE("Config::from_env: programmatic launches are on unless JITATTN_PROGRAMMATIC_LAUNCH=0") {
  const char* saved = std::getenv("JITATTN_PROGRAMMATIC_LAUNCH");
  const std::string saved_value = saved != nullptr ? saved : "";
  ::unsetenv("JITATTN_PROGRAMMATIC_LAUNCH");
  CHECK(jitattn::Config::from_env().programmatic_launch);
  ::setenv("JITATTN_PROGRAMMATIC_LAUNCH", "0", 1);
  CHECK_FALSE(jitattn::Config::from_env().programmatic_launch);
  ::setenv("JITATTN_PROGRAMMATIC_LAUNCH", "1", 1);
  CHECK(jitattn::Config::from_env().programmatic_launch);
  if (saved != nullptr) {
    ::setenv("JITATTN_PROGRAMMATIC_LAUNCH", saved_value.c_str(), 1);
  } else {
    ::unsetenv("JITATTN_PROGRAMMATIC_LAUNCH");
  }
}

TEST_CASE("options_init gives the documented defaults") {
  jitattn_fwd_options options;
  options.causal = 7;
  options.softmax_scale = 3.f;
  jitattn_fwd_options_init(&options);
  CHECK(options.struct_size == sizeof(jitattn_fwd_options));
  CHECK(options.causal == 0);
  CHECK(options.softmax_scale == 0.f);
  CHECK(options.block_q == 0);
  CHECK(options.window_left == -1);
  CHECK(options.window_right == -1);
  CHECK(options.softcap == 0.f);
  CHECK(options.alibi_slopes == nullptr);
  CHECK(options.num_splits == 0);
  CHECK(options.attention_chunk == 0);
  CHECK(options.learnable_sink == nullptr);
  // YaRN: off, with Hugging Face's defaults for the rest (RopeOptions's).
  options.rope_yarn_factor = 32.f;
  options.rope_yarn_attention_factor = 2.f;
  options.rope_yarn_truncate = 0;
  jitattn_fwd_options_init(&options);
  const jitattn::RopeOptions rope;
  CHECK(options.rope_yarn_factor == 0.f);
  CHECK(options.rope_yarn_beta_fast == 32.f);
  CHECK(options.rope_yarn_beta_slow == 1.f);
  CHECK(options.rope_yarn_original_max_position == 4096);
  CHECK(options.rope_yarn_truncate == 1);
  CHECK(options.rope_yarn_attention_factor == 0.f);
  CHECK(options.rope_yarn_factor == rope.yarn_factor);
  CHECK(options.rope_yarn_beta_fast == rope.yarn_beta_fast);
  CHECK(options.rope_yarn_beta_slow == rope.yarn_beta_slow);
  CHECK(options.rope_yarn_original_max_position == rope.yarn_original_max_position);
  CHECK((options.rope_yarn_truncate != 0) == rope.yarn_truncate);
  CHECK(options.rope_yarn_attention_factor == rope.yarn_attention_factor);
  // LongRoPE: off, with RopeOptions's defaults.
  const float factors[1] = {2.f};
  options.rope_longrope_pair_factors = factors;
  options.rope_longrope_factor = 32.f;
  options.rope_longrope_original_max_position = 7;
  options.rope_longrope_attention_factor = 2.f;
  jitattn_fwd_options_init(&options);
  CHECK(options.rope_longrope_pair_factors == nullptr);
  CHECK(options.rope_longrope_factor == 0.f);
  CHECK(options.rope_longrope_original_max_position == 4096);
  CHECK(options.rope_longrope_attention_factor == 0.f);
  CHECK(options.rope_longrope_pair_factors == rope.longrope_pair_factors);
  CHECK(options.rope_longrope_factor == rope.longrope_factor);
  CHECK(options.rope_longrope_original_max_position == rope.longrope_original_max_position);
  CHECK(options.rope_longrope_attention_factor == rope.longrope_attention_factor);
  CHECK(std::string(jitattn_version()) == jitattn::version());
}

namespace grown_v1 {
// A growing struct as one header had it, and as the next header has it (two fields more, the first of them
// non-zero by default in the library, as an older caller must then get it).
struct Options {
  uint32_t struct_size;
  int32_t a;
  int64_t b;
};
}  // namespace grown_v1
namespace grown_v2 {
struct Options {
  uint32_t struct_size;
  int32_t a;
  int64_t b;
  int32_t c;
  int32_t d;
};
const jitattn::capi::GrownLayout layout{"toy_options", "toy_options_init", sizeof(grown_v1::Options),
                                        offsetof(Options, d) + sizeof(int32_t), alignof(Options)};
constexpr Options defaults{sizeof(Options), -1, -2, 7, 0};
}  // namespace grown_v2

TEST_CASE("growing structs: older callers get the defaults, newer ones are accepted while their new fields are 0") {
  using jitattn::capi::read_grown;
  using jitattn::capi::write_grown;
  using grown_v2::defaults;
  using grown_v2::layout;
  // A caller built against the older header: its fields are read, the newer ones take the defaults, and
  // nothing past its struct_size is read (the bytes after it are poison).
  struct {
    grown_v1::Options options;
    unsigned char poison[16];
  } older{};
  std::fill(std::begin(older.poison), std::end(older.poison), 0xAB);
  older.options = {sizeof(grown_v1::Options), 5, 6};
  const grown_v2::Options read = read_grown(*reinterpret_cast<const grown_v2::Options*>(&older.options), defaults,
                                            layout, "toy");
  CHECK(read.struct_size == sizeof(grown_v2::Options));
  CHECK(read.a == 5);
  CHECK(read.b == 6);
  CHECK(read.c == 7);
  CHECK(read.d == 0);
  // The library's own size: every field is the caller's.
  const grown_v2::Options same{sizeof(grown_v2::Options), 1, 2, 3, 4};
  CHECK(read_grown(same, defaults, layout, "toy").d == 4);
  // A caller built against a newer header (8 bytes more): accepted while the bytes the library does not know
  // are 0, else rejected as unsupported, naming the first byte set.
  struct Newer {
    grown_v2::Options options;
    int64_t e;
  } newer{{sizeof(Newer), 1, 2, 3, 4}, 0};
  CHECK(read_grown(newer.options, defaults, layout, "toy").c == 3);
  newer.e = 1;
  try {
    (void)read_grown(newer.options, defaults, layout, "toy");
    FAIL("an unknown field set was accepted");
  } catch (const jitattn::Error& error) {
    CHECK(error.code() == jitattn::ErrorCode::unsupported);
    CHECK(std::string(error.what()).find(fmt::format("toy: byte {} of the caller's toy_options ({} bytes", offsetof(Newer, e),
                                                     sizeof(Newer))) != std::string::npos);
  }
  // Sizes no header had: 0 (never initialized), below the first header's, not a multiple of the alignment.
  const auto rejected = [&](uint32_t size, const char* message) {
    CAPTURE(size);
    grown_v2::Options options = same;
    options.struct_size = size;
    try {
      (void)read_grown(options, defaults, layout, "toy");
      FAIL("accepted");
    } catch (const jitattn::Error& error) {
      CHECK(error.code() == jitattn::ErrorCode::invalid_argument);
      CHECK_MESSAGE(std::string(error.what()).find(message) != std::string::npos, error.what());
    }
  };
  rejected(0, "toy.struct_size is 0: initialize the toy_options with toy_options_init()");
  rejected(8, "toy.struct_size=8 is not the size of any toy_options: it must be a multiple of 8 and at least 16");
  rejected(20, "toy.struct_size=20 is not the size");
  // write_grown fills exactly the caller's size: the defaults it knows, 0 past them, struct_size its size.
  struct {
    grown_v1::Options options;
    unsigned char poison[16];
  } older_init;
  std::memset(&older_init, 0xAB, sizeof older_init);
  write_grown(reinterpret_cast<grown_v2::Options*>(&older_init.options), sizeof(grown_v1::Options), defaults);
  CHECK(older_init.options.struct_size == sizeof(grown_v1::Options));
  CHECK(older_init.options.a == -1);
  CHECK(older_init.options.b == -2);
  CHECK(std::all_of(std::begin(older_init.poison), std::end(older_init.poison), [](unsigned char x) { return x == 0xAB; }));
  Newer newer_init;
  std::memset(&newer_init, 0xAB, sizeof newer_init);
  write_grown(&newer_init.options, sizeof(Newer), defaults);
  CHECK(newer_init.options.struct_size == sizeof(Newer));
  CHECK(newer_init.options.c == 7);
  CHECK(newer_init.e == 0);
  CHECK(read_grown(newer_init.options, defaults, layout, "toy").a == -1);
}

TEST_CASE("growing structs through the C API: struct_size checked in options and in varlen and KV-cache args") {
  configure_once();
  jitattn_tensor q = bshd(fake(0x1000), JITATTN_BF16, 2, 1, 32, 128);
  jitattn_tensor o = bshd(fake(0x3000), JITATTN_BF16, 2, 1, 32, 128);
  jitattn_tensor cache = bshd(fake(0x100000), JITATTN_BF16, 2, 4096, 8, 128);
  jitattn_tensor seqlens = index_tensor(0x5000, JITATTN_I32, 2, 0);
  jitattn_kvcache_args args;
  jitattn_kvcache_args_init(&args);
  CHECK(args.struct_size == sizeof(jitattn_kvcache_args));
  args.k_cache = args.v_cache = &cache;
  args.cache_seqlens = &seqlens;
  // Options as a caller built against a newer jitattn.h holds them: 16 bytes more, zeroed by its init.
  struct {
    jitattn_fwd_options options;
    unsigned char unknown[16];
    unsigned char poison[16];
  } newer;
  std::memset(&newer, 0xAB, sizeof newer);
  jitattn_fwd_options_init_sized(&newer.options, sizeof newer.options + sizeof newer.unknown);
  CHECK(newer.options.struct_size == sizeof newer.options + sizeof newer.unknown);
  CHECK(newer.options.window_left == -1);
  CHECK(std::all_of(std::begin(newer.unknown), std::end(newer.unknown), [](unsigned char x) { return x == 0; }));
  CHECK(std::all_of(std::begin(newer.poison), std::end(newer.poison), [](unsigned char x) { return x == 0xAB; }));
  size_t bytes = 0, reference_bytes = 0;
  jitattn_fwd_options options;
  jitattn_fwd_options_init(&options);
  REQUIRE(jitattn_kvcache_workspace_bytes(&q, &args, &o, nullptr, &options, &reference_bytes) == JITATTN_OK);
  REQUIRE(jitattn_kvcache_workspace_bytes(&q, &args, &o, nullptr, &newer.options, &bytes) == JITATTN_OK);
  CHECK(bytes == reference_bytes);
  // A field this library does not know, set: refused as unsupported, the output left alone.
  newer.unknown[5] = 1;
  bytes = 12345;
  CHECK(jitattn_kvcache_workspace_bytes(&q, &args, &o, nullptr, &newer.options, &bytes) == JITATTN_ERROR_UNSUPPORTED);
  CHECK(bytes == 12345);
  CHECK(std::string(jitattn_last_error())
            .find(fmt::format("options: byte {} of the caller's jitattn_fwd_options", sizeof newer.options + 5)) !=
        std::string::npos);
  // This header's own tail padding (past the last field, before its sizeof) is not a field: a caller of the
  // same header may leave it set (a designated initializer on a dirty stack), and is not refused for it.
  const size_t padding = offsetof(jitattn_fwd_options, rope_longrope_attention_factor) +
                         sizeof options.rope_longrope_attention_factor;
  REQUIRE(padding < sizeof options);
  std::memset(reinterpret_cast<unsigned char*>(&options) + padding, 0xAB, sizeof options - padding);
  CHECK(jitattn_kvcache_workspace_bytes(&q, &args, &o, nullptr, &options, &bytes) == JITATTN_OK);
  CHECK(bytes == reference_bytes);
  // A struct_size no header has (garbage in a struct never initialized) is refused before any of the bytes it
  // claims are read.
  options.struct_size = 0x7ffffff8u;
  CHECK(jitattn_kvcache_workspace_bytes(&q, &args, &o, nullptr, &options, &bytes) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("options.struct_size=2147483640 is larger than any "
                                               "jitattn_fwd_options") != std::string::npos);
  // A missing cache tensor is named as the argument it is.
  jitattn_fwd_options_init(&options);
  args.k_cache = nullptr;
  CHECK(jitattn_kvcache_workspace_bytes(&q, &args, &o, nullptr, &options, &bytes) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()) == "k_cache: is NULL");
  args.k_cache = &cache;
  // Structs never initialized.
  options.struct_size = 0;
  CHECK(jitattn_kvcache_workspace_bytes(&q, &args, &o, nullptr, &options, &bytes) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()) ==
        "options.struct_size is 0: initialize the jitattn_fwd_options with jitattn_fwd_options_init(), which sets "
        "struct_size to its sizeof");
  jitattn_fwd_options_init(&options);
  args.struct_size = 0;
  CHECK(jitattn_kvcache_workspace_bytes(&q, &args, &o, nullptr, &options, &bytes) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("args.struct_size is 0: initialize the jitattn_kvcache_args with "
                                               "jitattn_kvcache_args_init()") != std::string::npos);
  // Smaller than any jitattn.h with struct_size had it (a binding whose mirror lacks fields).
  args.struct_size = offsetof(jitattn_kvcache_args, cache_leftpad);
  CHECK(jitattn_kvcache_workspace_bytes(&q, &args, &o, nullptr, &options, &bytes) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("is not the size of any jitattn_kvcache_args") != std::string::npos);
  jitattn_varlen_args varlen;
  jitattn_varlen_args_init(&varlen);
  CHECK(varlen.struct_size == sizeof(jitattn_varlen_args));
  varlen.struct_size = 0;
  jitattn_tensor rows = bshd(fake(0x1000), JITATTN_BF16, 1, 2, 32, 128);
  rows.ndim = 3;
  for (int i = 0; i < 3; ++i) rows.shape[i] = rows.shape[i + 1], rows.strides[i] = rows.strides[i + 1];
  CHECK(jitattn_fwd_varlen_workspace_bytes(&rows, &rows, &rows, &rows, nullptr, &varlen, &options, &bytes) ==
        JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("args.struct_size is 0: initialize the jitattn_varlen_args with "
                                               "jitattn_varlen_args_init()") != std::string::npos);
}

// `base` spoiled by `spoil` is rejected before anything needs a GPU, by
// jitattn_fwd_workspace_bytes and jitattn_fwd alike, the message naming the
// field (`message`).
void expect_rejected(const jitattn_tensor& q, const jitattn_tensor& kv, const jitattn_tensor& o,
                     const jitattn_fwd_options& base, const std::function<void(jitattn_fwd_options&)>& spoil,
                     const char* message) {
  CAPTURE(message);
  jitattn_fwd_options options = base;
  spoil(options);
  size_t bytes = 0;
  CHECK(jitattn_fwd_workspace_bytes(&q, &kv, &kv, &o, nullptr, &options, &bytes) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find(message) != std::string::npos);
  CHECK(jitattn_fwd(&q, &kv, &kv, &o, nullptr, &options, nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find(message) != std::string::npos);
}

TEST_CASE("LongRoPE options reach the planner through the C API, each field checked under its own name") {
  configure_once();
  // Phi-3.5-mini's shape: 32 heads, head dim 96, rotate-half RoPE with
  // LongRoPE over 131072 / 4096 positions (48 pair factors).
  jitattn_tensor q = bshd(fake(0x1000), JITATTN_BF16, 1, 256, 32, 96);
  jitattn_tensor o = bshd(fake(0x3000), JITATTN_BF16, 1, 256, 32, 96);
  float factors[48];
  for (int p = 0; p < 48; ++p) factors[p] = 1.f + p;
  jitattn_fwd_options phi;
  jitattn_fwd_options_init(&phi);
  phi.causal = 1;
  phi.rope_style = 1;
  phi.rope_longrope_pair_factors = factors;
  phi.rope_longrope_factor = 32.f;
  size_t bytes = 0;
  REQUIRE(jitattn_fwd_workspace_bytes(&q, &q, &q, &o, nullptr, &phi, &bytes) == JITATTN_OK);
  float spoiled[48];
  std::copy(factors, factors + 48, spoiled);
  spoiled[5] = -1.f;
  struct Bad {
    std::function<void(jitattn_fwd_options&)> spoil;
    const char* message;
  };
  const Bad cases[] = {
      {[&](jitattn_fwd_options& o) { o.rope_longrope_pair_factors = spoiled; },
       "options.rope.longrope_pair_factors[5]=-1 must be positive"},
      {[](jitattn_fwd_options& o) { o.rope_longrope_factor = -3.f; }, "options.rope.longrope_factor=-3 must be positive"},
      {[](jitattn_fwd_options& o) { o.rope_longrope_original_max_position = 0; },
       "options.rope.longrope_original_max_position=0 must be above 1"},
      {[](jitattn_fwd_options& o) { o.rope_longrope_attention_factor = -1.f; },
       "options.rope.longrope_attention_factor=-1 must be positive"},
      {[](jitattn_fwd_options& o) { o.rope_yarn_factor = 4.f; }, "longrope_pair_factors comes alone"},
      {[](jitattn_fwd_options& o) { o.rope_longrope_pair_factors = nullptr; }, "need longrope_pair_factors"},
  };
  for (const Bad& bad : cases) expect_rejected(q, q, o, phi, bad.spoil, bad.message);
}

TEST_CASE("YaRN options reach the planner through the C API, each field checked under its own name") {
  configure_once();
  // gpt-oss's shape: 64 query heads over 8, head dim 64, rotate-half RoPE
  // with YaRN as its config gives it.
  jitattn_tensor q = bshd(fake(0x1000), JITATTN_BF16, 1, 256, 64, 64);
  jitattn_tensor k = bshd(fake(0x2000), JITATTN_BF16, 1, 256, 8, 64);
  jitattn_tensor o = bshd(fake(0x3000), JITATTN_BF16, 1, 256, 64, 64);
  jitattn_fwd_options gpt_oss;
  jitattn_fwd_options_init(&gpt_oss);
  gpt_oss.causal = 1;
  gpt_oss.rope_style = 1;
  gpt_oss.rope_theta = 150000.f;
  gpt_oss.rope_yarn_factor = 32.f;
  gpt_oss.rope_yarn_truncate = 0;
  size_t bytes = 0;
  REQUIRE(jitattn_fwd_workspace_bytes(&q, &k, &k, &o, nullptr, &gpt_oss, &bytes) == JITATTN_OK);
  // Each field bad on its own: rejected before anything needs a GPU, the
  // message naming that field.
  struct Bad {
    std::function<void(jitattn_fwd_options&)> spoil;
    const char* message;
  };
  const Bad cases[] = {
      {[](jitattn_fwd_options& o) { o.rope_yarn_factor = -2.f; }, "options.rope.yarn_factor=-2 must be positive"},
      {[](jitattn_fwd_options& o) { o.rope_yarn_beta_slow = 40.f; }, "yarn_beta_fast=32 and yarn_beta_slow=40"},
      {[](jitattn_fwd_options& o) { o.rope_yarn_beta_fast = 0.5f; }, "yarn_beta_fast=0.5 and yarn_beta_slow=1"},
      {[](jitattn_fwd_options& o) { o.rope_yarn_original_max_position = 0; },
       "options.rope.yarn_original_max_position=0 must be positive"},
      {[](jitattn_fwd_options& o) { o.rope_yarn_attention_factor = -1.f; },
       "options.rope.yarn_attention_factor=-1 must be"},
      {[](jitattn_fwd_options& o) { o.rope_llama3_factor = 8.f; }, "yarn_factor=32 comes alone"},
  };
  for (const Bad& bad : cases) expect_rejected(q, k, o, gpt_oss, bad.spoil, bad.message);
  // Tables are used as given: YaRN with them is refused.
  jitattn_tensor cos{};
  cos.data = fake(0x4000);
  cos.dtype = JITATTN_F32;
  cos.ndim = 2;
  cos.shape[0] = 256;
  cos.shape[1] = 32;
  cos.strides[0] = 32;
  cos.strides[1] = 1;
  jitattn_fwd_options tables = gpt_oss;
  tables.rope_cos = tables.rope_sin = &cos;
  CHECK(jitattn_fwd_workspace_bytes(&q, &k, &k, &o, nullptr, &tables, &bytes) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("yarn_factor=32 scales angles from theta") != std::string::npos);
}

TEST_CASE("forward with a workspace through the C API: sized, validated, num_splits passed on") {
  configure_once();
  // One token of 32 query heads over 32768 keys of 8 KV heads splits (sized
  // for the GPU present, or an H200 without one); 4096 queries do not.
  jitattn_tensor q = bshd(fake(0x1000), JITATTN_BF16, 1, 1, 32, 128);
  jitattn_tensor k = bshd(fake(0x2000), JITATTN_BF16, 1, 32768, 8, 128);
  jitattn_tensor o = bshd(fake(0x3000), JITATTN_BF16, 1, 1, 32, 128);
  jitattn_fwd_options options;
  jitattn_fwd_options_init(&options);
  size_t bytes = 0;
  REQUIRE(jitattn_fwd_workspace_bytes(&q, &k, &k, &o, nullptr, &options, &bytes) == JITATTN_OK);
  CHECK(bytes > 0);
  options.num_splits = 1;
  REQUIRE(jitattn_fwd_workspace_bytes(&q, &k, &k, &o, nullptr, &options, &bytes) == JITATTN_OK);
  CHECK(bytes == 0);
  options.num_splits = 4;
  REQUIRE(jitattn_fwd_workspace_bytes(&q, &k, &k, &o, nullptr, &options, &bytes) == JITATTN_OK);
  CHECK(bytes == (4 * 32 * 128 * 4 + 255) / 256 * 256 + 4 * 32 * 4);
  CHECK(jitattn_fwd_workspace_bytes(&q, &k, &k, &o, nullptr, &options, nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()) == "bytes: is NULL");
  // Rejected before any launch: a short workspace, and forced splits without one.
  CHECK(jitattn_fwd_split(&q, &k, &k, &o, nullptr, &options, fake(0x100000), bytes - 1, nullptr) ==
        JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("ask forward_workspace_bytes") != std::string::npos);
  CHECK(jitattn_fwd(&q, &k, &k, &o, nullptr, &options, nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("options.num_splits=4: splitting needs a workspace") != std::string::npos);
  // attention_chunk reaches the planner (which checks it before sizing).
  options.num_splits = 0;
  options.attention_chunk = -3;
  CHECK(jitattn_fwd_workspace_bytes(&q, &k, &k, &o, nullptr, &options, &bytes) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("options.attention_chunk=-3 must be >= 0") != std::string::npos);
  options.attention_chunk = 4096;
  REQUIRE(jitattn_fwd_workspace_bytes(&q, &k, &k, &o, nullptr, &options, &bytes) == JITATTN_OK);
  // So does learnable_sink: one f32 logit per query head.
  jitattn_tensor sinks{};
  sinks.data = fake(0x4000);
  sinks.dtype = JITATTN_F32;
  sinks.ndim = 1;
  sinks.shape[0] = 16;
  sinks.strides[0] = 1;
  options.learnable_sink = &sinks;
  CHECK(jitattn_fwd_workspace_bytes(&q, &k, &k, &o, nullptr, &options, &bytes) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("learnable_sink: shape [16] must be [heads_q] = [32]") !=
        std::string::npos);
  sinks.shape[0] = 32;
  CHECK(jitattn_fwd_workspace_bytes(&q, &k, &k, &o, nullptr, &options, &bytes) == JITATTN_OK);
}

TEST_CASE("invalid arguments return a status and a message naming the rule") {
  configure_once();
  jitattn_tensor q = bshd(fake(0x1000), JITATTN_BF16, 1, 16, 32, 128);
  jitattn_tensor k = bshd(fake(0x2000), JITATTN_BF16, 1, 16, 6, 128);
  jitattn_tensor o = bshd(fake(0x3000), JITATTN_BF16, 1, 16, 32, 128);
  CHECK(jitattn_fwd(&q, &k, &k, &o, nullptr, nullptr, nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("k: heads_kv=6 must divide heads_q=32") != std::string::npos);
  CHECK(jitattn_fwd(nullptr, &k, &k, &o, nullptr, nullptr, nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()) == "q: is NULL");
  q.dtype = 9;
  CHECK(jitattn_fwd(&q, &k, &k, &o, nullptr, nullptr, nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("q: dtype=9") != std::string::npos);
  // softmax_scale <= 0 is the default; NaN and inf are refused, as in C++.
  q.dtype = JITATTN_BF16;
  k = bshd(fake(0x2000), JITATTN_BF16, 1, 16, 8, 128);
  jitattn_fwd_options options;
  jitattn_fwd_options_init(&options);
  for (float scale : {std::nanf(""), INFINITY}) {
    options.softmax_scale = scale;
    CHECK(jitattn_fwd(&q, &k, &k, &o, nullptr, &options, nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(jitattn_last_error()).find("options.softmax_scale") != std::string::npos);
  }
}

TEST_CASE("a valid call without a GPU fails with a CUDA status, not a crash") {
  configure_once();
  if (jitattn::detail::driver().available) {
    MESSAGE("a GPU is present: the no-GPU path is not reachable here");
    return;
  }
  jitattn_tensor q = bshd(fake(0x1000), JITATTN_F16, 1, 16, 8, 64);
  jitattn_tensor k = bshd(fake(0x2000), JITATTN_F16, 1, 16, 8, 64);
  jitattn_tensor o = bshd(fake(0x3000), JITATTN_F16, 1, 16, 8, 64);
  CHECK(jitattn_fwd(&q, &k, &k, &o, nullptr, nullptr, nullptr) == JITATTN_ERROR_CUDA);
  CHECK(std::string(jitattn_last_error()).find("no usable GPU") != std::string::npos);
}

TEST_CASE("warm compiles through the C API; errors are reported; success clears the message") {
  configure_once();
  CHECK(jitattn_warm("fwd.bf16.d80.br128.bc64.w4", "sm_80") == JITATTN_ERROR_UNSUPPORTED);
  CHECK(std::string(jitattn_last_error()).find("head_dim=80") != std::string::npos);
  CHECK(jitattn_warm("fwd.bf16.d64.br128.bc64.w4", "sm_7") == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(jitattn_warm(nullptr, "sm_80") == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()) == "spec: is NULL");
  CHECK(jitattn_warm("fwd.bf16.d64.br128.bc64.w4", nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()) == "arch: is NULL");
  CHECK(jitattn_warm("fwd.bf16.d64.br128.bc64.w4", "sm_80") == JITATTN_OK);
  CHECK(std::string(jitattn_last_error()).empty());
}

TEST_CASE("varlen calls are validated through the C API") {
  configure_once();
  jitattn_tensor q{};
  q.data = fake(0x1000);
  q.dtype = JITATTN_BF16;
  q.ndim = 3;
  const int64_t shape[3] = {100, 8, 64}, strides[3] = {8 * 64, 64, 1};
  for (int i = 0; i < 3; ++i) {
    q.shape[i] = shape[i];
    q.strides[i] = strides[i];
  }
  jitattn_tensor cu{};
  cu.data = fake(0x5000);
  cu.dtype = JITATTN_F32;  // must be i32
  cu.ndim = 1;
  cu.shape[0] = 3;
  cu.strides[0] = 1;
  CHECK(jitattn_fwd_varlen(&q, &q, &q, &q, nullptr, &cu, &cu, nullptr, 60, 60, nullptr, nullptr) ==
        JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("cu_seqlens_q: dtype f32 must be i32") != std::string::npos);
  cu.dtype = JITATTN_I32;
  CHECK(jitattn_fwd_varlen(&q, &q, &q, &q, nullptr, &cu, &cu, nullptr, -1, 60, nullptr, nullptr) ==
        JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("max_seqlen_q=-1") != std::string::npos);
}

TEST_CASE("varlen with a workspace and a paged cache through the C API: sized, validated, passed on") {
  configure_once();
  // Two sequences of one query (32 heads, 8 KV heads, d128) over a paged
  // cache of 512 pages of 64 rows (max_seqlen_k 16384): few tiles, so they
  // split; the same over packed K/V too.
  auto rows3 = [](uintptr_t address, int64_t total, int64_t heads) {
    jitattn_tensor t{};
    t.data = fake(address);
    t.dtype = JITATTN_BF16;
    t.ndim = 3;
    const int64_t shape[3] = {total, heads, 128}, strides[3] = {heads * 128, 128, 1};
    for (int i = 0; i < 3; ++i) {
      t.shape[i] = shape[i];
      t.strides[i] = strides[i];
    }
    return t;
  };
  auto vector = [](uintptr_t address, int64_t rows, int64_t columns) {
    return index_tensor(address, JITATTN_I32, rows, columns);
  };
  jitattn_tensor q = rows3(0x1000, 2, 32);
  jitattn_tensor o = rows3(0x3000, 2, 32);
  jitattn_tensor pages = bshd(fake(0x100000), JITATTN_BF16, 512, 64, 8, 128);
  jitattn_tensor cu = vector(0x5000, 3, 0);
  jitattn_tensor used = vector(0x6000, 2, 0);
  jitattn_tensor table = vector(0x7000, 2, 256);
  jitattn_varlen_args args;
  jitattn_varlen_args_init(&args);
  args.cu_seqlens_q = args.cu_seqlens_k = &cu;
  args.seqused_k = &used;
  args.block_table = &table;
  args.max_seqlen_q = 1;
  args.max_seqlen_k = 16384;
  jitattn_fwd_options options;
  jitattn_fwd_options_init(&options);
  size_t bytes = 0;
  REQUIRE(jitattn_fwd_varlen_workspace_bytes(&q, &pages, &pages, &o, nullptr, &args, &options, &bytes) == JITATTN_OK);
  CHECK(bytes > 0);
  options.num_splits = 3;
  REQUIRE(jitattn_fwd_varlen_workspace_bytes(&q, &pages, &pages, &o, nullptr, &args, &options, &bytes) == JITATTN_OK);
  // Partial rows are the packed queries: 3 splits × 2 rows × 32 heads.
  CHECK(bytes == (3 * 2 * 32 * 128 * 4 + 255) / 256 * 256 + 3 * 2 * 32 * 4);
  // dynamic_splits reaches the plan: the launch holds room for one
  // sequence's 8 tiles to fill half the SMs (8 splits; an even batch of two
  // would take 8 as well).
  args.dynamic_splits = 1;
  options.num_splits = 0;
  size_t dynamic_bytes = 0;
  REQUIRE(jitattn_fwd_varlen_workspace_bytes(&q, &pages, &pages, &o, nullptr, &args, &options, &dynamic_bytes) ==
          JITATTN_OK);
  CHECK(dynamic_bytes == (8 * 2 * 32 * 128 * 4 + 255) / 256 * 256 + 8 * 2 * 32 * 4);
  args.dynamic_splits = 0;
  options.num_splits = 3;
  CHECK(jitattn_fwd_varlen_split(&q, &pages, &pages, &o, nullptr, &args, &options, fake(0x100000), bytes - 1,
                                 nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("ask forward_varlen_workspace_bytes") != std::string::npos);
  // With the table and seqused_k, cu_seqlens_k may be NULL (vLLM's call).
  args.cu_seqlens_k = nullptr;
  size_t without_cu_k = 0;
  CHECK(jitattn_fwd_varlen_workspace_bytes(&q, &pages, &pages, &o, nullptr, &args, &options, &without_cu_k) ==
        JITATTN_OK);
  CHECK(without_cu_k == bytes);
  args.seqused_k = nullptr;
  CHECK(jitattn_fwd_varlen_workspace_bytes(&q, &pages, &pages, &o, nullptr, &args, &options, &without_cu_k) ==
        JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("cu_seqlens_k: required unless") != std::string::npos);
  args.cu_seqlens_k = &cu;
  args.seqused_k = &used;
  // The packed-K/V overload without a block table: k 3-D.
  jitattn_tensor k = rows3(0x200000, 16384, 8);
  args.block_table = nullptr;
  REQUIRE(jitattn_fwd_varlen_workspace_bytes(&q, &k, &k, &o, nullptr, &args, &options, &bytes) == JITATTN_OK);
  CHECK(bytes == (3 * 2 * 32 * 128 * 4 + 255) / 256 * 256 + 3 * 2 * 32 * 4);
  // A paged cache's k is 4-D, and its rows need a table.
  CHECK(jitattn_fwd_varlen_workspace_bytes(&q, &pages, &pages, &o, nullptr, &args, &options, &bytes) ==
        JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("k: must have 3 dimensions") != std::string::npos);
  CHECK(jitattn_fwd_varlen_split(&q, &k, &k, &o, nullptr, nullptr, &options, nullptr, 0, nullptr) ==
        JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()) == "args: is NULL");
}

TEST_CASE("KV-cache calls through the C API: cache_batch_idx and cache_leftpad passed on and validated") {
  configure_once();
  // Two sequences of one token (32 heads, 8 KV heads, d128) over a
  // contiguous cache of 4096 rows: split by the heuristic.
  auto vector = [](uintptr_t address, int32_t dtype, int64_t rows) { return index_tensor(address, dtype, rows, 0); };
  jitattn_tensor q = bshd(fake(0x1000), JITATTN_BF16, 2, 1, 32, 128);
  jitattn_tensor o = bshd(fake(0x3000), JITATTN_BF16, 2, 1, 32, 128);
  jitattn_tensor cache = bshd(fake(0x100000), JITATTN_BF16, 2, 4096, 8, 128);
  jitattn_tensor seqlens = vector(0x5000, JITATTN_I32, 2);
  jitattn_tensor leftpad = vector(0x6000, JITATTN_I32, 2);
  jitattn_kvcache_args args;
  jitattn_kvcache_args_init(&args);
  args.k_cache = args.v_cache = &cache;
  args.cache_seqlens = &seqlens;
  args.cache_leftpad = &leftpad;
  jitattn_fwd_options options;
  jitattn_fwd_options_init(&options);
  size_t bytes = 0;
  REQUIRE(jitattn_kvcache_workspace_bytes(&q, &args, &o, nullptr, &options, &bytes) == JITATTN_OK);
  CHECK(bytes > 0);
  // A valid call gets as far as needing a device (where there is none).
  if (!jitattn::detail::driver().available) {
    CHECK(jitattn_fwd_kvcache(&q, &args, &o, nullptr, &options, fake(0x200000), bytes, nullptr) ==
          JITATTN_ERROR_CUDA);
    CHECK(std::string(jitattn_last_error()).find("no usable GPU") != std::string::npos);
  }
  // The pads are checked as the C++ API checks them.
  jitattn_tensor floats = vector(0x6000, JITATTN_F32, 2);
  args.cache_leftpad = &floats;
  CHECK(jitattn_fwd_kvcache(&q, &args, &o, nullptr, &options, fake(0x200000), bytes, nullptr) ==
        JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("cache_leftpad: dtype f32 must be i32") != std::string::npos);
  // Not over a paged cache (FlashAttention's rule too).
  jitattn_tensor pages = bshd(fake(0x100000), JITATTN_BF16, 128, 64, 8, 128);
  jitattn_tensor table = index_tensor(0x7000, JITATTN_I32, 2, 64);
  args.k_cache = args.v_cache = &pages;
  args.block_table = &table;
  args.cache_leftpad = &leftpad;
  CHECK(jitattn_kvcache_workspace_bytes(&q, &args, &o, nullptr, &options, &bytes) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("cache_leftpad: not supported with a paged cache") != std::string::npos);
  args.cache_leftpad = nullptr;
  CHECK(jitattn_kvcache_workspace_bytes(&q, &args, &o, nullptr, &options, &bytes) == JITATTN_OK);
}

TEST_CASE("merges are validated through the C API, naming the argument") {
  configure_once();
  jitattn_tensor states{};
  states.data = fake(0x10000);
  states.dtype = JITATTN_F32;
  states.ndim = 4;
  const int64_t shape[4] = {3, 5, 2, 64}, strides[4] = {5 * 2 * 64, 2 * 64, 64, 1};
  for (int i = 0; i < 4; ++i) {
    states.shape[i] = shape[i];
    states.strides[i] = strides[i];
  }
  jitattn_tensor lse{};
  lse.data = fake(0x20000);
  lse.dtype = JITATTN_F32;
  lse.ndim = 3;
  const int64_t lse_shape[3] = {3, 5, 2}, lse_strides[3] = {10, 2, 1};
  for (int i = 0; i < 3; ++i) {
    lse.shape[i] = lse_shape[i];
    lse.strides[i] = lse_strides[i];
  }
  jitattn_tensor out{};
  out.data = fake(0x30000);
  out.dtype = JITATTN_BF16;
  out.ndim = 3;
  for (int i = 0; i < 3; ++i) {
    out.shape[i] = shape[i + 1];
    out.strides[i] = strides[i + 1];
  }
  CHECK(jitattn_merge_states(nullptr, &lse, &out, nullptr, nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()) == "states: is NULL");
  out.strides[2] = 2;
  CHECK(jitattn_merge_states(&states, &lse, &out, nullptr, nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("out: head_dim stride is 2") != std::string::npos);
  out.strides[2] = 1;
  lse.dtype = JITATTN_F16;
  CHECK(jitattn_merge_states(&states, &lse, &out, nullptr, nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("lse: dtype f16 must be f32") != std::string::npos);
  lse.dtype = JITATTN_F32;

  // merge_state: a and b are [rows, heads, head_dim]; lse_a / lse_b [rows, heads].
  jitattn_tensor a = out, b = out;
  a.data = fake(0x40000);
  b.data = fake(0x50000);
  b.shape[2] = 32;
  jitattn_tensor lse_a{};
  lse_a.data = fake(0x60000);
  lse_a.dtype = JITATTN_F32;
  lse_a.ndim = 2;
  lse_a.shape[0] = 5, lse_a.shape[1] = 2;
  lse_a.strides[0] = 2, lse_a.strides[1] = 1;
  CHECK(jitattn_merge_state(&a, &lse_a, &b, &lse_a, &out, nullptr, nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("b: shape [5, 2, 32] must equal a's shape [5, 2, 64]") != std::string::npos);
  CHECK(jitattn_merge_state(&a, &lse_a, &a, nullptr, &out, nullptr, nullptr) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()) == "lse_b: is NULL");
  if (!jitattn::detail::driver().available) {
    CHECK(jitattn_merge_state(&a, &lse_a, &a, &lse_a, &out, &lse_a, nullptr) == JITATTN_ERROR_CUDA);
    CHECK(std::string(jitattn_last_error()).find("no usable GPU") != std::string::npos);
  }
  CHECK(jitattn_warm("combine.f32.bf16", "sm_80") == JITATTN_OK);
  CHECK(jitattn_warm("combine.f64.bf16", "sm_80") == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("state dtype 'f64'") != std::string::npos);
}

TEST_CASE("configure after first use is refused") {
  configure_once();
  CHECK(jitattn_warm("fwd.bf16.d64.br128.bc64.w4", "sm_80") == JITATTN_OK);
  CHECK(jitattn_configure("/tmp/elsewhere", nullptr, -1) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("already in use") != std::string::npos);
  // Arguments are checked first, each by name.
  CHECK(jitattn_configure("/tmp/elsewhere", nullptr, -7) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()) == "log_level=-7: must be -1 (keep) or 0..4");
  CHECK(jitattn_configure("/tmp/elsewhere", nullptr, 5) == JITATTN_ERROR_INVALID_ARGUMENT);
  // The environment is read only for settings not given: an invalid
  // JITATTN_LOG fails a call that keeps the level, not one that names it.
  const char* saved = std::getenv("JITATTN_LOG");
  const std::string saved_value = saved != nullptr ? saved : "";
  ::setenv("JITATTN_LOG", "bogus", 1);
  CHECK(jitattn_configure("/tmp/elsewhere", nullptr, -1) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("JITATTN_LOG") != std::string::npos);
  CHECK(jitattn_configure("/tmp/elsewhere", nullptr, 2) == JITATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(jitattn_last_error()).find("already in use") != std::string::npos);
  if (saved != nullptr) {
    ::setenv("JITATTN_LOG", saved_value.c_str(), 1);
  } else {
    ::unsetenv("JITATTN_LOG");
  }
}

}  // TEST_SUITE
