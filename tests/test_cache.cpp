// The on-disk kernel cache: keys, the entry format, atomic publication,
// corruption handling, degraded (memory-only) mode and concurrent use.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cache.hpp"

namespace {
using namespace jitattn::detail;
namespace fs = std::filesystem;

// Entry header layout (see cache.cpp): magic 0..8, version 8..12, metadata
// length 12..16, cubin length 16..24, checksum 24..32.
constexpr size_t kHeaderBytes = 32;

// Random inputs are fresh per run; failures print the seed.
uint64_t run_seed() {
  static const uint64_t seed = (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
  return seed;
}

// A fresh directory under the system temp dir, removed with its contents.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string name = (fs::temp_directory_path() / "jitattn-cache-test-XXXXXX").string();
    if (::mkdtemp(name.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = name;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string cache_dir() const { return (path / "cache").string(); }
  std::string kernels_dir() const { return (path / "cache" / "v1" / "kernels").string(); }
};

std::vector<char> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<char> out(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t word = rng();
    for (size_t j = i; j < std::min(n, i + 8); ++j) out[j] = static_cast<char>(word >> (8 * (j - i)));
  }
  return out;
}

std::string key_for(const std::string& source) {
  return make_cache_key({source, {"-std=c++17"}, "sm_90a", "13.0", "0.1.0"});
}

Entry make_entry(const std::string& key, std::vector<char> cubin,
                 const std::string& spec = "fwd.bf16.d128.br128.bc64.w4", const std::string& arch = "sm_90a") {
  Entry entry;
  entry.meta.key = key;
  entry.meta.spec = spec;
  entry.meta.arch = arch;
  entry.meta.nvrtc_version = "13.0";
  entry.meta.library_version = "0.1.0";
  entry.meta.compile_seconds = 1.25;
  entry.meta.created_unix = 1700000000;
  entry.meta.cubin_bytes = cubin.size();
  entry.cubin = std::move(cubin);
  return entry;
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

size_t count_files(const std::string& dir, const std::string& extension) {
  size_t n = 0;
  for (const auto& file : fs::directory_iterator(dir)) n += file.path().extension() == extension;
  return n;
}

size_t count_lines_containing(const std::string& text, const std::string& needle) {
  size_t n = 0, start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    n += text.substr(start, end - start).find(needle) != std::string::npos;
    start = end + 1;
  }
  return n;
}

std::string decode_error(const std::vector<char>& bytes) {
  try {
    decode_entry(bytes);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

uint64_t get_header(const std::vector<char>& bytes, size_t offset, int width) {
  uint64_t value = 0;
  for (int i = 0; i < width; ++i) value |= uint64_t(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  return value;
}

void set_header(std::vector<char>& bytes, size_t offset, int width, uint64_t value) {
  for (int i = 0; i < width; ++i) bytes[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

// Recomputes the checksum, so a test can reach the checks that follow it.
void reseal(std::vector<char>& bytes) {
  set_header(bytes, 24, 8, XXH3_64bits(bytes.data() + kHeaderBytes, bytes.size() - kHeaderBytes));
}

size_t meta_length(const std::vector<char>& bytes) { return get_header(bytes, 12, 4); }

// Redirects fd 2 into a file while alive; finish() returns what was written.
class StderrCapture {
 public:
  explicit StderrCapture(fs::path file) : file_(std::move(file)) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~StderrCapture() { finish(); }
  std::string finish() {
    if (saved_ < 0) return text_;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
    const std::vector<char> bytes = read_bytes(file_.string());
    text_.assign(bytes.begin(), bytes.end());
    return text_;
  }

 private:
  fs::path file_;
  int saved_ = -1;
  std::string text_;
};

// Runs body in a forked child that exits with its result (never returns).
template <typename Body>
pid_t fork_child(Body body) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  int code = 100;
  try {
    code = body();
  } catch (...) {
    code = 101;
  }
  ::_exit(code);
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// Children block on a pipe until the parent closes it, so they start together.
struct StartGate {
  int fds[2] = {-1, -1};
  StartGate() {
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  }
  void wait_in_child() {
    ::close(fds[1]);
    char c;
    while (::read(fds[0], &c, 1) < 0 && errno == EINTR) {
    }
  }
  void open_in_parent() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
};

// After a corruption: the entry is gone, get_or_build rebuilds it and the
// rebuilt file is valid.
void check_discarded_and_rebuilt(FileCache& cache, const Entry& good) {
  const std::string path = cache.entry_path(good.meta.key);
  CHECK_FALSE(cache.get(good.meta.key).has_value());
  CHECK_FALSE(fs::exists(path));
  bool built = false;
  Entry got = cache.get_or_build(good.meta.key, [&] { return good; }, &built);
  CHECK(built);
  CHECK(got.cubin == good.cubin);
  CHECK(decode_entry(read_bytes(path)).cubin == good.cubin);
  std::optional<Entry> hit = cache.get(good.meta.key);
  REQUIRE(hit.has_value());
  CHECK(hit->cubin == good.cubin);
}

}  // namespace

TEST_SUITE("cache") {
  TEST_CASE("cache key is 32 lowercase hex digits and deterministic") {
    const CacheKeyInputs inputs{"__global__ void k() {}", {"-std=c++17", "-default-device"}, "sm_90a", "13.0",
                                "0.1.0"};
    const std::string key = make_cache_key(inputs);
    CHECK(key.size() == 32);
    CHECK(key.find_first_not_of("0123456789abcdef") == std::string::npos);
    CHECK(make_cache_key(inputs) == key);
    CHECK(make_cache_key(CacheKeyInputs(inputs)) == key);
  }

  TEST_CASE("cache key changes when any single input changes") {
    const CacheKeyInputs base{"__global__ void k() {}", {"-std=c++17", "-default-device"}, "sm_90a", "13.0",
                              "0.1.0"};
    std::vector<CacheKeyInputs> variants(9, base);
    variants[0].source += " ";
    variants[1].options[0] = "-std=c++20";
    variants[2].options.push_back("-lineinfo");
    variants[3].options = {"-default-device", "-std=c++17"};  // order matters
    variants[4].options.pop_back();
    variants[5].arch = "sm_80";
    variants[6].nvrtc_version = "12.8";
    variants[7].library_version = "0.1.1";
    variants[8].options.clear();
    std::set<std::string> keys{make_cache_key(base)};
    for (const CacheKeyInputs& variant : variants) keys.insert(make_cache_key(variant));
    CHECK(keys.size() == variants.size() + 1);
  }

  TEST_CASE("the any-compiler key ignores the NVRTC version alone, and links lead to the entry stored last") {
    const CacheKeyInputs base{"__global__ void k() {}", {"-std=c++17"}, "sm_90a", "13.0", "0.1.0"};
    CacheKeyInputs other_nvrtc = base, other_arch = base, other_library = base;
    other_nvrtc.nvrtc_version = "12.8";
    other_arch.arch = "sm_80";
    other_library.library_version = "0.1.1";
    const std::string any_key = make_any_compiler_key(base);
    CHECK(any_key == make_any_compiler_key(other_nvrtc));
    CHECK(any_key != make_cache_key(base));
    CHECK(any_key != make_any_compiler_key(other_arch));
    CHECK(any_key != make_any_compiler_key(other_library));

    TempDir tmp;
    FileCache cache(tmp.cache_dir());
    CHECK_FALSE(cache.linked(any_key).has_value());
    // One kernel compiled by two NVRTC versions.
    Entry first = make_entry(make_cache_key(base), random_bytes(100, run_seed()));
    Entry second = make_entry(make_cache_key(other_nvrtc), random_bytes(100, run_seed() + 1));
    first.meta.any_key = second.meta.any_key = any_key;
    second.meta.nvrtc_version = "12.8";
    REQUIRE(cache.put(first).empty());
    cache.link(any_key, first.meta.key, "13.0");
    CHECK(cache.linked(any_key) == first.meta.key);
    // The link stays on an entry still stored: hosts of two versions do not rewrite it in turn.
    REQUIRE(cache.put(second).empty());
    cache.link(any_key, second.meta.key, "13.0");
    CHECK(FileCache(tmp.cache_dir()).linked(any_key) == first.meta.key);
    CHECK(FileCache(tmp.cache_dir()).get(first.meta.key)->meta.any_key == any_key);  // kept in the metadata
    // The last put's NVRTC version is the cache's (TuningTable::load without NVRTC).
    CHECK(warmed_nvrtc(tmp.cache_dir()) == "12.8");
    // A link file that does not hold a key reads as none.
    std::ofstream(tmp.kernels_dir() + "/" + any_key + ".link") << "../../etc/passwd\n";
    CHECK_FALSE(cache.linked(any_key).has_value());
    cache.link(any_key, first.meta.key, "13.0");
    // prune's remove_if: the kernel's link moves to the entry that remains; a
    // link to no entry goes; clear drops all.
    const std::string other_any = make_any_compiler_key(other_arch);
    cache.link(other_any, std::string(32, 'f'), "13.0");
    const auto removed = cache.remove_if([&](const EntryInfo& info) { return info.meta.key == first.meta.key; },
                                         std::chrono::hours(1), false);
    REQUIRE(removed.size() == 1);
    CHECK(cache.linked(any_key) == second.meta.key);
    CHECK_FALSE(cache.linked(other_any).has_value());
    // v1/compiler names a version whose entries remain after a prune ...
    Entry third = make_entry(make_cache_key(other_arch), random_bytes(100, run_seed() + 2));
    REQUIRE(cache.put(third).empty());
    CHECK(warmed_nvrtc(tmp.cache_dir()) == "13.0");
    cache.remove_if([&](const EntryInfo& info) { return info.meta.key == third.meta.key; }, std::chrono::hours(1),
                    false);
    CHECK(warmed_nvrtc(tmp.cache_dir()) == "12.8");
    // ... and a cache without one (stored before it was kept) gets it from a hit's link.
    fs::remove(fs::path(tmp.cache_dir()) / "v1" / "compiler");
    CHECK(warmed_nvrtc(tmp.cache_dir()) == "none");
    cache.link(any_key, second.meta.key, "12.8");
    CHECK(warmed_nvrtc(tmp.cache_dir()) == "12.8");
    CHECK(cache.clear() == 1);
    CHECK(count_files(tmp.kernels_dir(), ".link") == 0);
  }

  TEST_CASE("prune races: an entry rebuilt after the listing stays, and a kernel stored meanwhile keeps a link") {
    // remove_if calls `unwanted` between its listing and each removal, so the
    // predicate stands in for another process acting in that window.
    INFO("seed " << run_seed());
    TempDir tmp;
    FileCache cache(tmp.cache_dir());
    // A: invalid when listed (truncated), rebuilt by "another process" before its removal.
    const Entry a = make_entry(key_for("rebuilt"), random_bytes(500, run_seed()));
    REQUIRE(cache.put(a).empty());
    fs::resize_file(cache.entry_path(a.meta.key), 40);
    // B: a kernel of an unwanted version, linked; C, the same kernel of another
    // NVRTC version, is stored while the prune runs (its link stays on B, which
    // still exists then).
    const CacheKeyInputs b_inputs{"__global__ void b() {}", {"-std=c++17"}, "sm_90a", "12.8", "0.1.0"};
    CacheKeyInputs c_inputs = b_inputs;
    c_inputs.nvrtc_version = "13.0";
    const std::string any_key = make_any_compiler_key(b_inputs);
    Entry b = make_entry(make_cache_key(b_inputs), random_bytes(300, run_seed() + 1));
    Entry c = make_entry(make_cache_key(c_inputs), random_bytes(300, run_seed() + 2));
    b.meta.any_key = c.meta.any_key = any_key;
    b.meta.nvrtc_version = "12.8";
    REQUIRE(cache.put(b).empty());
    cache.link(any_key, b.meta.key, "12.8");
    FileCache other(tmp.cache_dir());  // the other process
    const std::string a_path = cache.entry_path(a.meta.key);
    int asked = 0;
    const auto removed = cache.remove_if(
        [&](const EntryInfo& info) {
          ++asked;
          if (info.path == a_path) {
            CHECK_FALSE(info.valid);
            REQUIRE(other.put(a).empty());  // a new file under the same name
            return true;
          }
          if (info.meta.key == b.meta.key) {
            REQUIRE(other.put(c).empty());
            other.link(any_key, c.meta.key, "13.0");
            CHECK(other.linked(any_key) == b.meta.key);
            return true;
          }
          return false;
        },
        std::chrono::hours(1), false);
    CHECK(asked == 2);  // C came after the listing
    REQUIRE(removed.size() == 1);
    CHECK(removed[0].meta.key == b.meta.key);
    // A's rebuilt entry was not removed, and it reads back.
    const std::optional<Entry> rebuilt = cache.get(a.meta.key);
    REQUIRE(rebuilt.has_value());
    CHECK(rebuilt->cubin == a.cubin);
    // The kernel's link moved to C, the entry that remains.
    CHECK_FALSE(fs::exists(cache.entry_path(b.meta.key)));
    CHECK(cache.linked(any_key) == c.meta.key);
  }

  TEST_CASE("cache key fields are length-prefixed") {
    CHECK(make_cache_key({"src", {}, "ab", "c", "v"}) != make_cache_key({"src", {}, "a", "bc", "v"}));
    CHECK(make_cache_key({"src", {"ab", "c"}, "x", "y", "z"}) != make_cache_key({"src", {"a", "bc"}, "x", "y", "z"}));
    CHECK(make_cache_key({"src", {"-a", "-b"}, "x", "y", "z"}) != make_cache_key({"src", {"-a-b"}, "x", "y", "z"}));
    CHECK(make_cache_key({"ab", {"c"}, "x", "y", "z"}) != make_cache_key({"a", {"bc"}, "x", "y", "z"}));
    // An option must not be confusable with the arch that follows it.
    CHECK(make_cache_key({"s", {"o"}, "a", "n", "l"}) != make_cache_key({"s", {"o", "a"}, "n", "l", ""}));
  }

  TEST_CASE("encode/decode round trip preserves every field") {
    INFO("seed " << run_seed());
    Entry entry = make_entry(key_for("round trip"), random_bytes(4099, run_seed()), "fwd.f16.d64.br64.bc64.w4.causal",
                             "sm_80");
    entry.meta.nvrtc_version = "12.8";
    entry.meta.library_version = "9.8.7";
    entry.meta.compile_seconds = 0.123456789012345;
    entry.meta.created_unix = 1234567890123;
    const Entry back = decode_entry(encode_entry(entry));
    CHECK(back.meta.key == entry.meta.key);
    CHECK(back.meta.spec == entry.meta.spec);
    CHECK(back.meta.arch == entry.meta.arch);
    CHECK(back.meta.nvrtc_version == entry.meta.nvrtc_version);
    CHECK(back.meta.library_version == entry.meta.library_version);
    CHECK(back.meta.compile_seconds == entry.meta.compile_seconds);
    CHECK(back.meta.created_unix == entry.meta.created_unix);
    CHECK(back.meta.cubin_bytes == 4099);
    CHECK(back.cubin == entry.cubin);
  }

  TEST_CASE("decode names the first failed check") {
    INFO("seed " << run_seed());
    const std::vector<char> good = encode_entry(make_entry(key_for("decode"), random_bytes(100, run_seed())));
    REQUIRE(decode_error(good).empty());
    const size_t meta_end = kHeaderBytes + meta_length(good);

    std::vector<char> bytes = good;
    bytes[0] = 'X';
    CHECK(decode_error(bytes).find("bad magic") != std::string::npos);

    bytes = good;
    bytes[8] = 2;
    CHECK(decode_error(bytes).find("unsupported format version 2") != std::string::npos);

    bytes.assign(good.begin(), good.end() - 1);
    CHECK(decode_error(bytes) ==
          "truncated: file has " + std::to_string(good.size() - 1) + " bytes but header says " +
              std::to_string(good.size()));

    bytes.assign(good.begin(), good.begin() + 10);
    CHECK(decode_error(bytes).find("truncated: file has 10 bytes") != std::string::npos);

    bytes = good;
    bytes.push_back('x');
    CHECK(decode_error(bytes).find("trailing data") != std::string::npos);

    bytes = good;
    bytes.back() ^= 1;
    CHECK(decode_error(bytes).find("checksum mismatch") != std::string::npos);

    bytes = good;
    bytes[kHeaderBytes] = '[';  // '{' -> '[': the JSON no longer parses
    reseal(bytes);
    CHECK(decode_error(bytes).find("bad metadata JSON") != std::string::npos);

    // Move one byte from the cubin into the metadata: sizes still add up, the
    // metadata's cubin_bytes no longer matches the header.
    bytes = good;
    bytes.insert(bytes.begin() + meta_end - 1, ' ');  // whitespace before the final '}'
    bytes.pop_back();
    set_header(bytes, 12, 4, meta_length(good) + 1);
    set_header(bytes, 16, 8, 99);
    reseal(bytes);
    CHECK(decode_error(bytes) == "metadata says cubin_bytes 100 but header says 99");
  }

  TEST_CASE("put then get hits, a missing key misses, a second cache sees the entry") {
    INFO("seed " << run_seed());
    TempDir tmp;
    const Entry entry = make_entry(key_for("persist"), random_bytes(1000, run_seed()));
    {
      FileCache cache(tmp.cache_dir());
      REQUIRE(cache.writable());
      CHECK(cache.location() == tmp.cache_dir());
      CHECK_FALSE(cache.get(entry.meta.key).has_value());
      cache.put(entry);
      CHECK(cache.entry_path(entry.meta.key) == tmp.kernels_dir() + "/" + entry.meta.key + ".entry");
      CHECK(fs::exists(cache.entry_path(entry.meta.key)));
      std::optional<Entry> hit = cache.get(entry.meta.key);
      REQUIRE(hit.has_value());
      CHECK(hit->cubin == entry.cubin);
      CHECK(hit->meta.spec == entry.meta.spec);
      CHECK_FALSE(cache.get(key_for("never stored")).has_value());
    }
    FileCache again(tmp.cache_dir());
    bool built = true;
    Entry got = again.get_or_build(entry.meta.key, []() -> Entry { throw std::logic_error("must not build"); }, &built);
    CHECK_FALSE(built);
    CHECK(got.cubin == entry.cubin);
    CHECK(count_files(tmp.kernels_dir(), ".tmp") == 0);
  }

  TEST_CASE("truncated entries are discarded and rebuilt") {
    INFO("seed " << run_seed());
    TempDir tmp;
    FileCache cache(tmp.cache_dir());
    const Entry entry = make_entry(key_for("truncate"), random_bytes(5000, run_seed()));
    const std::string path = cache.entry_path(entry.meta.key);
    const size_t full = encode_entry(entry).size();
    for (size_t size : {size_t(0), size_t(7), kHeaderBytes, kHeaderBytes + 10, full / 2, full - 1}) {
      CAPTURE(size);
      cache.put(entry);
      fs::resize_file(path, size);
      StderrCapture capture(tmp.path / "stderr.txt");
      CHECK_FALSE(cache.get(entry.meta.key).has_value());
      const std::string text = capture.finish();
      CHECK(count_lines_containing(text, "warn") == 1);
      CHECK(count_lines_containing(text, path) == 1);
      CHECK(count_lines_containing(text, "truncated") == 1);
      CHECK_FALSE(fs::exists(path));
      cache.put(entry);
      fs::resize_file(path, size);
      check_discarded_and_rebuilt(cache, entry);
    }
    CHECK(cache.writable());
  }

  TEST_CASE("a flipped bit in the cubin or the metadata is detected and rebuilt") {
    INFO("seed " << run_seed());
    TempDir tmp;
    FileCache cache(tmp.cache_dir());
    const Entry entry = make_entry(key_for("bitflip"), random_bytes(3000, run_seed()));
    const std::string path = cache.entry_path(entry.meta.key);
    const std::vector<char> good = encode_entry(entry);
    const size_t meta_begin = kHeaderBytes, cubin_begin = kHeaderBytes + meta_length(good);
    std::mt19937_64 rng(run_seed());
    SUBCASE("cubin") {
      size_t offset = cubin_begin + rng() % (good.size() - cubin_begin);
      CAPTURE(offset);
      std::vector<char> bad = good;
      bad[offset] ^= static_cast<char>(1u << (rng() % 8));
      write_bytes(path, bad);
      check_discarded_and_rebuilt(cache, entry);
    }
    SUBCASE("metadata") {
      size_t offset = meta_begin + rng() % (cubin_begin - meta_begin);
      CAPTURE(offset);
      std::vector<char> bad = good;
      bad[offset] ^= static_cast<char>(1u << (rng() % 8));
      write_bytes(path, bad);
      check_discarded_and_rebuilt(cache, entry);
    }
  }

  TEST_CASE("an entry whose metadata key differs from its file name is discarded") {
    TempDir tmp;
    FileCache cache(tmp.cache_dir());
    const Entry entry = make_entry(key_for("right"), random_bytes(200, run_seed()));
    const Entry other = make_entry(key_for("wrong"), random_bytes(200, run_seed() + 1));
    write_bytes(cache.entry_path(entry.meta.key), encode_entry(other));
    check_discarded_and_rebuilt(cache, entry);
  }

  TEST_CASE("an unusable directory degrades to memory-only with one warning") {
    // Tests run as root in CI, where permissions do not stop writes: a path
    // beneath a regular file cannot be created by anyone.
    TempDir tmp;
    write_bytes((tmp.path / "afile").string(), {'x'});
    const std::string dir = (tmp.path / "afile" / "cache").string();
    const Entry entry = make_entry(key_for("memory only"), random_bytes(100, run_seed()));
    StderrCapture capture(tmp.path / "stderr.txt");
    FileCache cache(dir);
    const bool writable = cache.writable();
    bool put_threw = false;
    try {
      cache.put(entry);
    } catch (...) {
      put_threw = true;
    }
    const bool got = cache.get(entry.meta.key).has_value();
    bool built1 = false, built2 = false;
    Entry first = cache.get_or_build(entry.meta.key, [&] { return entry; }, &built1);
    cache.get_or_build(entry.meta.key, [&] { return entry; }, &built2);
    const size_t listed = cache.list().size();
    const std::string text = capture.finish();
    CHECK_FALSE(writable);
    CHECK_FALSE(put_threw);
    CHECK_FALSE(got);
    CHECK(built1);
    CHECK(built2);
    CHECK(first.cubin == entry.cubin);
    CHECK(listed == 0);
    CHECK(count_lines_containing(text, "warn") == 1);
    CHECK(text.find(dir) != std::string::npos);
    CHECK(text.find(std::generic_category().message(ENOTDIR)) != std::string::npos);
    CHECK_FALSE(fs::exists(dir));
  }

  TEST_CASE("a failed publish fails that entry alone: no temporary file, one warning, reads and other puts go on") {
    TempDir tmp;
    FileCache cache(tmp.cache_dir());
    const Entry entry = make_entry(key_for("rename fails"), random_bytes(100, run_seed()));
    const Entry other = make_entry(key_for("stored"), random_bytes(100, run_seed() + 1));
    // rename() cannot replace a non-empty directory, so the publish step fails
    // after the temporary file was written.
    fs::create_directories(fs::path(cache.entry_path(entry.meta.key)) / "blocker");
    // Several threads fail at once: still one warning for this cache.
    StderrCapture capture(tmp.path / "stderr.txt");
    std::atomic<int> threw{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&] {
        try {
          cache.put(entry);
        } catch (...) {
          ++threw;
        }
      });
    }
    for (std::thread& t : threads) t.join();
    std::string error;
    CHECK_NOTHROW(error = cache.put(entry));
    const std::string stored = cache.put(other);
    const std::string text = capture.finish();
    CHECK(threw == 0);
    CHECK(error.find("cannot rename onto " + cache.entry_path(entry.meta.key)) != std::string::npos);
    // The next entry is stored and read back: one failure turns nothing off.
    CHECK(cache.writable());
    CHECK(stored.empty());
    CHECK(cache.get(other.meta.key).has_value());
    CHECK_FALSE(cache.get(entry.meta.key).has_value());
    CHECK(count_lines_containing(text, "warn") == 1);
    CHECK(text.find("rename") != std::string::npos);
    CHECK(count_files(tmp.kernels_dir(), ".tmp") == 0);
  }

  TEST_CASE("a directory this process cannot write still serves its entries") {
    // A cache warmed by one user (root, in an image build) and served by
    // another, or mounted read-only. Tests run as root in CI, where
    // permissions do not stop writes: the reader then drops to nobody.
    INFO("seed " << run_seed());
    TempDir tmp;
    const Entry entry = make_entry(key_for("warmed"), random_bytes(300, run_seed()));
    const Entry fresh = make_entry(key_for("compiled later"), random_bytes(300, run_seed() + 1));
    REQUIRE(FileCache(tmp.cache_dir()).put(entry).empty());
    fs::permissions(tmp.path, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                  fs::perms::others_read | fs::perms::others_exec);
    for (const fs::path& dir : {fs::path(tmp.cache_dir()), fs::path(tmp.cache_dir()) / "v1", fs::path(tmp.kernels_dir())}) {
      fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                               fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
    }
    StderrCapture capture(tmp.path / "stderr.txt");
    // Bits of the child's answer: 1 the directory was taken as writable, 2 the
    // warmed entry missed, 4 it was built, 8 a new entry's put claimed to
    // store it, 16 the new entry was built other than once; 77: could not
    // drop root.
    const pid_t pid = fork_child([&] {
      if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) return 77;
      FileCache cache(tmp.cache_dir());
      int failures = cache.writable() ? 1 : 0;
      failures |= cache.get(entry.meta.key).has_value() ? 0 : 2;
      bool built = false;
      cache.get_or_build(entry.meta.key, [&] { return entry; }, &built);
      failures |= built ? 4 : 0;
      std::string store_error;
      cache.get_or_build(fresh.meta.key, [&] { return fresh; }, &built, &store_error);
      failures |= store_error.empty() ? 8 : 0;
      failures |= built ? 0 : 16;
      return failures;
    });
    REQUIRE(pid > 0);
    const int code = wait_exit_code(pid);
    const std::string text = capture.finish();
    for (const fs::path& dir : {fs::path(tmp.cache_dir()), fs::path(tmp.cache_dir()) / "v1", fs::path(tmp.kernels_dir())}) {
      fs::permissions(dir, fs::perms::owner_all);
    }
    REQUIRE_MESSAGE(code != 77, "could not drop root to check a read-only cache");
    CHECK(code == 0);
    CHECK(count_lines_containing(text, "warn") == 1);
    CHECK(text.find("serving the entries it holds") != std::string::npos);
    CHECK_FALSE(fs::exists(FileCache(tmp.cache_dir()).entry_path(fresh.meta.key)));
  }

  TEST_CASE("a cache directory removed while in use is made again by the next put") {
    // `jitattn clear`, or rm -rf of the cache, beside a running process.
    TempDir tmp;
    FileCache cache(tmp.cache_dir());
    const Entry entry = make_entry(key_for("after removal"), random_bytes(100, run_seed()));
    fs::remove_all(tmp.cache_dir());
    CHECK(cache.put(entry).empty());
    CHECK(cache.get(entry.meta.key).has_value());
    CHECK(count_files(tmp.kernels_dir(), ".tmp") == 0);
  }

  TEST_CASE("a throwing build propagates and releases the key lock") {
    TempDir tmp;
    FileCache cache(tmp.cache_dir());
    const std::string key = key_for("throws");
    CHECK_THROWS_AS(cache.get_or_build(key, []() -> Entry { throw std::domain_error("boom"); }), std::domain_error);
    int fd = ::open((tmp.kernels_dir() + "/" + key + ".lock").c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    CHECK(::flock(fd, LOCK_EX | LOCK_NB) == 0);
    ::close(fd);
    CHECK_FALSE(fs::exists(cache.entry_path(key)));
  }

  TEST_CASE("a timed key lock waits for its holder, and builds anyway once the wait is over") {
    TempDir tmp;
    FileCache probe(tmp.cache_dir());  // makes the kernels directory
    const std::string key = key_for("held lock");
    const std::string lock_path = tmp.kernels_dir() + "/" + key + ".lock";
    using std::chrono::milliseconds;
    {
      // Released 100 ms in: the waiter takes it then.
      auto holder = std::make_unique<FileLock>(lock_path);
      REQUIRE(holder->held());
      const auto start = std::chrono::steady_clock::now();
      std::thread release([&] {
        std::this_thread::sleep_for(milliseconds(100));
        holder.reset();
      });
      FileLock waiter(lock_path, milliseconds(10'000));
      const auto waited = std::chrono::steady_clock::now() - start;
      release.join();
      CHECK(waiter.held());
      CHECK_FALSE(waiter.timed_out());
      CHECK(waited >= milliseconds(100));
      CHECK(waited < milliseconds(5'000));
    }
    // A holder that never lets go (a stopped process): get_or_build waits
    // lock_wait, then builds and publishes the entry itself.
    FileLock stuck(lock_path);
    REQUIRE(stuck.held());
    FileLock loser(lock_path, milliseconds(50));
    CHECK_FALSE(loser.held());
    CHECK(loser.timed_out());
    FileCache cache(tmp.cache_dir(), milliseconds(200));
    const Entry entry = make_entry(key, random_bytes(100, run_seed()));
    bool built = false;
    const auto start = std::chrono::steady_clock::now();
    const Entry got = cache.get_or_build(key, [&] { return entry; }, &built);
    const auto waited = std::chrono::steady_clock::now() - start;
    CHECK(built);
    CHECK(got.cubin == entry.cubin);
    CHECK(waited >= milliseconds(190));
    CHECK(waited < milliseconds(10'000));
    CHECK(FileCache(tmp.cache_dir()).get(key).has_value());
  }

  TEST_CASE("threads sharing one cache build a key once") {
    TempDir tmp;
    FileCache cache(tmp.cache_dir());
    const Entry entry = make_entry(key_for("threads"), random_bytes(10000, run_seed()));
    std::atomic<int> builds{0}, wrong{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&] {
        Entry got = cache.get_or_build(entry.meta.key, [&] {
          ++builds;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          return entry;
        });
        if (got.cubin != entry.cubin) ++wrong;
      });
    }
    for (std::thread& t : threads) t.join();
    CHECK(wrong == 0);
    CHECK(builds == 1);
    CHECK(count_files(tmp.kernels_dir(), ".entry") == 1);
  }

  TEST_CASE("concurrent processes build a key once and publish one valid entry") {
    INFO("seed " << run_seed());
    TempDir tmp;
    const Entry entry = make_entry(key_for("processes"), random_bytes(64 * 1024, run_seed()));
    StartGate gate;
    std::vector<pid_t> children;
    for (int i = 0; i < 8; ++i) {
      // Exit code: 0 found the entry, 1 built it, anything else failed.
      pid_t pid = fork_child([&] {
        gate.wait_in_child();
        FileCache cache(tmp.cache_dir());
        bool built = false;
        Entry got = cache.get_or_build(
            entry.meta.key,
            [&] {
              std::this_thread::sleep_for(std::chrono::milliseconds(50));
              return entry;
            },
            &built);
        if (got.cubin != entry.cubin || got.meta.key != entry.meta.key) return 2;
        return built ? 1 : 0;
      });
      REQUIRE(pid > 0);
      children.push_back(pid);
    }
    gate.open_in_parent();
    int builds = 0, failures = 0;
    for (pid_t pid : children) {
      int code = wait_exit_code(pid);
      builds += code == 1;
      failures += code != 0 && code != 1;
    }
    CHECK(failures == 0);
    CHECK(builds >= 1);
    CHECK(builds == 1);  // the lock is on a local filesystem here
    CHECK(count_files(tmp.kernels_dir(), ".entry") == 1);
    CHECK(count_files(tmp.kernels_dir(), ".tmp") == 0);
    CHECK(decode_entry(read_bytes(FileCache(tmp.cache_dir()).entry_path(entry.meta.key))).cubin == entry.cubin);
  }

  TEST_CASE("concurrent writers never expose a partial entry") {
    // The seed is drawn before the fork (INFO evaluates lazily), so that the
    // writers and the reader derive the same cubins when this case runs alone.
    const uint64_t seed = run_seed();
    INFO("seed " << seed);
    TempDir tmp;
    const std::string key = key_for("writers");
    constexpr int kWriters = 8, kPuts = 50;
    constexpr size_t kCubinBytes = 1 << 20;
    // Each put's cubin is derived from (writer, iteration), named in its spec,
    // so a reader can tell a complete entry from a mix of two.
    auto cubin_for = [&](int writer, int iteration) {
      return random_bytes(kCubinBytes, seed ^ (uint64_t(writer) << 32 | uint64_t(iteration)));
    };
    FileCache reader(tmp.cache_dir());  // creates the directories before the writers start
    StartGate gate;
    std::vector<pid_t> children;
    for (int w = 0; w < kWriters; ++w) {
      pid_t pid = fork_child([&, w] {
        gate.wait_in_child();
        FileCache cache(tmp.cache_dir());
        int failed = 0;
        for (int i = 0; i < kPuts; ++i) {
          failed += !cache.put(make_entry(key, cubin_for(w, i), "writer." + std::to_string(w) + "." + std::to_string(i)))
                         .empty();
        }
        return failed == 0 ? 0 : 1;
      });
      REQUIRE(pid > 0);
      children.push_back(pid);
    }
    StderrCapture capture(tmp.path / "stderr.txt");
    gate.open_in_parent();
    int valid = 0, partial = 0, vanished = 0;
    auto read_once = [&] {
      std::optional<Entry> got = reader.get(key);
      if (!got) {
        vanished += valid > 0;  // once published, an entry is only ever replaced
        return;
      }
      int w = -1, i = -1;
      bool named = std::sscanf(got->meta.spec.c_str(), "writer.%d.%d", &w, &i) == 2;
      if (named && got->cubin == cubin_for(w, i)) {
        ++valid;
      } else {
        ++partial;
      }
    };
    size_t running = children.size();
    std::vector<int> codes;
    while (running > 0) {
      read_once();
      for (pid_t& pid : children) {
        int status = 0;
        if (pid > 0 && ::waitpid(pid, &status, WNOHANG) == pid) {
          codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
          pid = 0;
          --running;
        }
      }
    }
    read_once();
    const std::string text = capture.finish();
    CAPTURE(valid);
    CHECK(codes == std::vector<int>(kWriters, 0));
    CHECK(partial == 0);
    CHECK(vanished == 0);
    CHECK(valid >= 1);
    CHECK(count_lines_containing(text, "warn") == 0);
    CHECK(count_files(tmp.kernels_dir(), ".entry") == 1);
    CHECK(count_files(tmp.kernels_dir(), ".tmp") == 0);
  }

  TEST_CASE("list reports valid entries and flags invalid ones; clear removes them") {
    TempDir tmp;
    FileCache cache(tmp.cache_dir());
    const Entry b90 = make_entry(key_for("b90"), random_bytes(300, run_seed()), "fwd.f16.d64.br64.bc64.w4", "sm_90a");
    const Entry a90 = make_entry(key_for("a90"), random_bytes(100, run_seed()), "fwd.bf16.d64.br64.bc64.w4", "sm_90a");
    const Entry a80 = make_entry(key_for("a80"), random_bytes(200, run_seed()), "fwd.bf16.d64.br64.bc64.w4", "sm_80");
    for (const Entry* e : {&b90, &a90, &a80}) cache.put(*e);
    const std::string bad_key = key_for("garbage");
    write_bytes(cache.entry_path(bad_key), {'g', 'a', 'r', 'b', 'a', 'g', 'e'});
    write_bytes(tmp.kernels_dir() + "/" + bad_key + ".123.00ff.tmp", {'t'});
    write_bytes(tmp.kernels_dir() + "/" + bad_key + ".lock", {});
    write_bytes(tmp.kernels_dir() + "/README", {'r'});

    const std::vector<EntryInfo> infos = cache.list();
    REQUIRE(infos.size() == 4);
    std::vector<std::string> valid_keys;
    for (const EntryInfo& info : infos) {
      if (info.valid) {
        valid_keys.push_back(info.meta.key);
        CHECK(info.path == cache.entry_path(info.meta.key));
        CHECK(info.file_bytes == fs::file_size(info.path));
        CHECK(info.meta.cubin_bytes + kHeaderBytes < info.file_bytes);
      } else {
        CHECK(info.meta.key == bad_key);
        CHECK(info.path == cache.entry_path(bad_key));
        CHECK(info.file_bytes == 7);
      }
    }
    // Sorted by spec, then arch.
    CHECK(valid_keys == std::vector<std::string>{a80.meta.key, a90.meta.key, b90.meta.key});

    CHECK(cache.clear() == 4);
    std::vector<std::string> left;
    for (const auto& file : fs::directory_iterator(tmp.kernels_dir())) left.push_back(file.path().filename());
    CHECK(left == std::vector<std::string>{"README"});
    CHECK(cache.list().empty());
    CHECK(cache.clear() == 0);
  }
}
