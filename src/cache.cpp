#include "cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include "log.hpp"

namespace jitattn::detail {
namespace fs = std::filesystem;

namespace {

// Entry file layout. Integers are little-endian, written byte by byte so the
// format does not depend on the host's byte order.
//    0  magic "JITATTN\x01"                               8 bytes
//    8  format version                                    u32
//   12  metadata length                                   u32
//   16  cubin length                                      u64
//   24  XXH3-64 of the metadata bytes then the cubin bytes u64
//   32  metadata (JSON), then the cubin
constexpr char kMagic[8] = {'J', 'I', 'T', 'A', 'T', 'T', 'N', '\x01'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 32;

void put_le(char* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

uint64_t get_le(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t(static_cast<unsigned char>(in[i])) << (8 * i);
  return value;
}

[[noreturn]] void bad_entry(const std::string& why) { throw std::runtime_error(why); }

std::string os_error(int err) { return std::generic_category().message(err); }

nlohmann::json meta_to_json(const EntryMeta& meta, uint64_t cubin_bytes) {
  return {{"key", meta.key},
          {"spec", meta.spec},
          {"arch", meta.arch},
          {"nvrtc_version", meta.nvrtc_version},
          {"library_version", meta.library_version},
          {"compile_seconds", meta.compile_seconds},
          {"created_unix", meta.created_unix},
          {"cubin_bytes", cubin_bytes},
          {"any_key", meta.any_key}};
}

EntryMeta meta_from_json(const char* begin, const char* end) {
  try {
    const nlohmann::json json = nlohmann::json::parse(begin, end);
    EntryMeta meta;
    json.at("key").get_to(meta.key);
    json.at("spec").get_to(meta.spec);
    json.at("arch").get_to(meta.arch);
    json.at("nvrtc_version").get_to(meta.nvrtc_version);
    json.at("library_version").get_to(meta.library_version);
    json.at("compile_seconds").get_to(meta.compile_seconds);
    json.at("created_unix").get_to(meta.created_unix);
    json.at("cubin_bytes").get_to(meta.cubin_bytes);
    meta.any_key = json.value("any_key", std::string());
    return meta;
  } catch (const nlohmann::json::exception& e) {
    bad_entry(fmt::format("bad metadata JSON: {}", e.what()));
  }
}

// Keys become file names, so they must not be able to name another path.
bool is_safe_key(const std::string& key) {
  return !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '-';
  });
}

void check_key(const std::string& key) {
  if (!is_safe_key(key)) {
    throw Error(ErrorCode::invalid_argument,
                fmt::format("cache key '{}' must be non-empty [A-Za-z0-9_-]", key));
  }
}

// Closes its descriptor on every path out.
struct Fd {
  int fd;
  explicit Fd(int value) : fd(value) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// Reads a whole regular file. Returns 0, or an errno value.
int read_whole_file(const std::string& path, std::vector<char>& out, struct stat& st) {
  Fd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.fd < 0) return errno;
  if (::fstat(file.fd, &st) != 0) return errno;
  if (!S_ISREG(st.st_mode)) return EISDIR;
  // Reads to EOF rather than to st_size, so a file that changed size is still read whole.
  out.resize(static_cast<size_t>(st.st_size) + 1);
  size_t done = 0;
  while (true) {
    if (done == out.size()) out.resize(out.size() * 2);
    ssize_t n = ::read(file.fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return 0;
}

int write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

// A name beside `path` that no other writer (process, thread or host sharing
// the directory) picks; it ends in .tmp so clear() recognizes strays.
std::string temp_path_for(const std::string& path) {
  std::random_device random;
  const uint64_t suffix = (uint64_t(random()) << 32) | random();
  return fmt::format("{}.{}.{:016x}.tmp", path, ::getpid(), suffix);
}

Entry run_build(const std::string& key, const std::function<Entry()>& build, bool* built) {
  Entry entry = build();
  if (entry.meta.key != key) {
    throw Error(ErrorCode::internal,
                fmt::format("cache: build for key {} returned an entry for key '{}'", key, entry.meta.key));
  }
  if (built) *built = true;
  return entry;
}

// The regular files in dir; none if it cannot be read.
std::vector<fs::path> files_in(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_regular_file(type_ec)) files.push_back(it->path());
  }
  return files;
}

}  // namespace

// Writes bytes to a new temporary file in the same directory as `path`,
// flushes it to disk, then renames it over `path`: a reader opens either the
// old file or the complete new one, never a partial one. (The directory itself
// is not fsynced: a crash may lose the file, which only costs a rebuild.)
namespace {

// One attempt of publish_file; *vanished is set when the directory or the
// temporary file disappeared under it (ENOENT), which a retry can mend.
std::string publish_once(std::string_view bytes, const std::string& path, bool* vanished) {
  const std::string tmp = temp_path_for(path);
  Fd file(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (file.fd < 0) {
    *vanished = errno == ENOENT;
    return fmt::format("cannot create {}: {}", tmp, os_error(errno));
  }
  auto fail = [&](const char* step, const std::string& target, int err) {
    ::unlink(tmp.c_str());
    *vanished = err == ENOENT;
    return fmt::format("cannot {} {}: {}", step, target, os_error(err));
  };
  if (int err = write_all(file.fd, bytes.data(), bytes.size())) return fail("write", tmp, err);
  if (::fsync(file.fd) != 0) return fail("fsync", tmp, errno);
  const int fd = std::exchange(file.fd, -1);
  if (::close(fd) != 0) return fail("close", tmp, errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename onto", path, errno);
  return "";
}

}  // namespace

std::string publish_file(std::string_view bytes, const std::string& path) {
  bool vanished = false;
  std::string error = publish_once(bytes, path, &vanished);
  if (error.empty() || !vanished) return error;
  // The directory was removed (`jitattn clear`, rm -rf of the cache) or
  // another process's clear() took the temporary file: recreate the
  // directory and try once more.
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  return publish_once(bytes, path, &vanished);
}

FileLock::FileLock(const std::string& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
  if (fd_ < 0) return;
  int status = 0;
  while ((status = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
  }
  held_ = status == 0;
}

FileLock::FileLock(const std::string& path, std::chrono::milliseconds timeout)
    : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
  if (fd_ < 0) return;
  // flock has no timed form: poll, from 1 ms up to 50 ms apart (a holder's
  // release is seen within 50 ms, small beside the compile it waited for).
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      held_ = true;
      return;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      timed_out_ = true;
      return;
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

std::string make_cache_key(const CacheKeyInputs& inputs) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  if (!state) throw std::bad_alloc();
  XXH3_128bits_reset(state.get());
  // Each field is preceded by its length, so no two input sets hash the same bytes.
  auto add = [&](std::string_view field) {
    char length[8];
    put_le(length, field.size(), 8);
    XXH3_128bits_update(state.get(), length, sizeof length);
    XXH3_128bits_update(state.get(), field.data(), field.size());
  };
  add("jitattn-cache-key-v1");
  add(inputs.source);
  add(std::to_string(inputs.options.size()));
  for (const std::string& option : inputs.options) add(option);
  add(inputs.arch);
  add(inputs.nvrtc_version);
  add(inputs.library_version);
  const XXH128_hash_t hash = XXH3_128bits_digest(state.get());
  return fmt::format("{:016x}{:016x}", hash.high64, hash.low64);
}

namespace {

std::string compiler_path(const std::string& cache_dir) { return (fs::path(cache_dir) / "v1" / "compiler").string(); }

}  // namespace

std::string warmed_nvrtc(const std::string& cache_dir) {
  std::vector<char> bytes;
  struct stat st {};
  if (read_whole_file(compiler_path(cache_dir), bytes, st) != 0) return "none";
  return std::string(bytes.begin(), bytes.end());
}

std::string make_any_compiler_key(CacheKeyInputs inputs) {
  inputs.nvrtc_version = "(any)";  // no NVRTC version is this text
  return make_cache_key(inputs);
}

std::vector<char> encode_entry(const Entry& entry) {
  // cubin_bytes is taken from the cubin itself, so metadata and header agree.
  // Invalid UTF-8 in a text field is replaced rather than failing the write.
  const std::string meta = meta_to_json(entry.meta, entry.cubin.size())
                               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (meta.size() > std::numeric_limits<uint32_t>::max()) throw std::length_error("cache metadata too long");
  std::vector<char> out(kHeaderBytes + meta.size() + entry.cubin.size());
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  put_le(out.data() + 8, kFormatVersion, 4);
  put_le(out.data() + 12, meta.size(), 4);
  put_le(out.data() + 16, entry.cubin.size(), 8);
  std::copy(meta.begin(), meta.end(), out.begin() + kHeaderBytes);
  std::copy(entry.cubin.begin(), entry.cubin.end(), out.begin() + kHeaderBytes + meta.size());
  put_le(out.data() + 24, XXH3_64bits(out.data() + kHeaderBytes, out.size() - kHeaderBytes), 8);
  return out;
}

Entry decode_entry(const std::vector<char>& bytes) {
  const uint64_t size = bytes.size();
  if (size < kHeaderBytes) {
    bad_entry(fmt::format("truncated: file has {} bytes but the header alone needs {}", size, kHeaderBytes));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) bad_entry("bad magic: not a jitattn cache entry");
  const uint64_t version = get_le(bytes.data() + 8, 4);
  if (version != kFormatVersion) {
    bad_entry(fmt::format("unsupported format version {} (this build reads {})", version, kFormatVersion));
  }
  const uint64_t meta_bytes = get_le(bytes.data() + 12, 4);
  const uint64_t cubin_bytes = get_le(bytes.data() + 16, 8);
  const uint64_t stored_checksum = get_le(bytes.data() + 24, 8);
  // Saturating sum: a corrupt cubin length must not wrap around to a small size.
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  const uint64_t declared =
      cubin_bytes > max - kHeaderBytes - meta_bytes ? max : kHeaderBytes + meta_bytes + cubin_bytes;
  if (declared != size) {
    bad_entry(fmt::format("{}: file has {} bytes but header says {}",
                          size < declared ? "truncated" : "trailing data", size, declared));
  }
  const uint64_t checksum = XXH3_64bits(bytes.data() + kHeaderBytes, size - kHeaderBytes);
  if (checksum != stored_checksum) {
    bad_entry(fmt::format("checksum mismatch: header says {:016x}, content hashes to {:016x}",
                          stored_checksum, checksum));
  }
  const char* meta_begin = bytes.data() + kHeaderBytes;
  Entry entry;
  entry.meta = meta_from_json(meta_begin, meta_begin + meta_bytes);
  if (entry.meta.cubin_bytes != cubin_bytes) {
    bad_entry(fmt::format("metadata says cubin_bytes {} but header says {}", entry.meta.cubin_bytes,
                          cubin_bytes));
  }
  entry.cubin.assign(meta_begin + meta_bytes, bytes.data() + size);
  return entry;
}

Entry Cache::get_or_build(const std::string& key, const std::function<Entry()>& build, bool* built,
                          std::string* store_error) {
  if (built) *built = false;
  if (store_error) store_error->clear();
  if (std::optional<Entry> hit = get(key)) return std::move(*hit);
  Entry entry = run_build(key, build, built);
  std::string error = put(entry);
  if (store_error) *store_error = std::move(error);
  return entry;
}

FileCache::FileCache(std::string dir, std::chrono::milliseconds lock_wait)
    : dir_(std::move(dir)), kernels_dir_((fs::path(dir_) / "v1" / "kernels").string()), lock_wait_(lock_wait) {
  if (dir_.empty()) {
    writable_ = false;
    unwritable_why_ = "no cache directory given";
    report(unwritable_why_ + "; continuing without the disk cache");
    return;
  }
  std::error_code ec;
  fs::create_directories(kernels_dir_, ec);
  if (ec) {
    writable_ = false;
    unwritable_why_ = fmt::format("cannot create {}: {}", kernels_dir_, ec.message());
    report(unwritable_why_ + "; continuing without the disk cache");
    return;
  }
  // Catches a read-only directory now rather than at the first put (root passes
  // this check everywhere; a failed put then fails that entry alone). Its
  // entries are still read: a cache warmed ahead of deployment may be
  // mounted read-only, or owned by the user who warmed it.
  if (::access(kernels_dir_.c_str(), W_OK | X_OK) != 0) {
    writable_ = false;
    unwritable_why_ = fmt::format("cannot write to {}: {}", kernels_dir_, os_error(errno));
    report(unwritable_why_ + "; serving the entries it holds, keeping new kernels in memory only");
  }
}

bool FileCache::writable() const { return writable_; }

std::string FileCache::entry_path(const std::string& key) const { return kernels_dir_ + "/" + key + ".entry"; }

void FileCache::report(const std::string& why) const {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    first = !warned_;
    warned_ = true;
  }
  log(first ? LogLevel::warn : LogLevel::info, "cache directory {}: {}", dir_, why);
}

std::optional<Entry> FileCache::get(const std::string& key) {
  check_key(key);
  if (dir_.empty()) return std::nullopt;
  const std::string path = entry_path(key);
  std::vector<char> bytes;
  struct stat read_stat {};
  if (int err = read_whole_file(path, bytes, read_stat)) {
    if (err != ENOENT) log(LogLevel::info, "cannot read cache entry {}: {}", path, os_error(err));
    return std::nullopt;
  }
  try {
    Entry entry = decode_entry(bytes);
    if (entry.meta.key != key) bad_entry(fmt::format("metadata names key {}", entry.meta.key));
    return entry;
  } catch (const std::runtime_error& e) {
    log(LogLevel::warn, "discarding cache entry {}: {}", path, e.what());
    // Unlink only the file that was read: another process may have published a
    // good entry under this name since.
    struct stat now {};
    if (::stat(path.c_str(), &now) == 0 && now.st_dev == read_stat.st_dev && now.st_ino == read_stat.st_ino) {
      ::unlink(path.c_str());
    }
    return std::nullopt;
  }
}

std::string FileCache::put(const Entry& entry) {
  check_key(entry.meta.key);
  if (!writable_) return unwritable_why_;
  const std::vector<char> bytes = encode_entry(entry);
  const std::string error = publish_file({bytes.data(), bytes.size()}, entry_path(entry.meta.key));
  if (!error.empty()) {
    report(fmt::format("{}; {} ({}) kept in memory only", error, entry.meta.spec, entry.meta.arch));
    return error;
  }
  // The NVRTC version this cache was last warmed with: a host without NVRTC
  // plans with the tuning table only where it is that version's
  // (TuningTable::load), as the warming host did.
  record_compiler(entry.meta.nvrtc_version, false);
  return error;
}

void FileCache::record_compiler(const std::string& nvrtc_version, bool only_if_missing) {
  if (!writable_ || nvrtc_version.empty()) return;
  const std::string current = warmed_nvrtc(dir_);
  if (current != "none" && (only_if_missing || current == nvrtc_version)) return;
  publish_file(nvrtc_version, compiler_path(dir_));
}

Entry FileCache::get_or_build(const std::string& key, const std::function<Entry()>& build, bool* built,
                              std::string* store_error) {
  check_key(key);
  if (built) *built = false;
  if (store_error) store_error->clear();
  if (std::optional<Entry> hit = get(key)) return std::move(*hit);
  // Lock only on a miss, so a hit never touches the lock file. The lock only
  // saves duplicate compiles (entries are published atomically), so a holder
  // that keeps it past lock_wait_ is not waited for any longer.
  std::optional<FileLock> lock;
  if (writable_) {
    const std::string lock_path = kernels_dir_ + "/" + key + ".lock";
    lock.emplace(lock_path, lock_wait_);
    if (lock->timed_out()) {
      log(LogLevel::warn, "{} is still held after {:.3g} s (another process is building that kernel, or was stopped "
          "while doing so); building it here as well", lock_path, std::chrono::duration<double>(lock_wait_).count());
    }
  }
  // Looks again first: another process may have built the entry while this one waited.
  return Cache::get_or_build(key, build, built, store_error);
}

std::vector<EntryInfo> FileCache::list() {
  std::vector<EntryInfo> infos;
  for (const fs::path& file : files_in(kernels_dir_)) {
    if (file.extension() != ".entry") continue;
    EntryInfo info;
    info.path = file.string();
    std::vector<char> bytes;
    struct stat st {};
    if (read_whole_file(info.path, bytes, st) == ENOENT) continue;  // removed meanwhile
    info.file_bytes = bytes.size();
    info.device = static_cast<uint64_t>(st.st_dev);
    info.inode = static_cast<uint64_t>(st.st_ino);
    try {
      info.meta = decode_entry(bytes).meta;
      info.valid = info.meta.key == file.stem().string();
    } catch (const std::runtime_error&) {
      info.valid = false;
    }
    if (!info.valid) info.meta.key = file.stem().string();
    infos.push_back(std::move(info));
  }
  std::sort(infos.begin(), infos.end(), [](const EntryInfo& a, const EntryInfo& b) {
    return std::tie(a.meta.spec, a.meta.arch, a.meta.key) < std::tie(b.meta.spec, b.meta.arch, b.meta.key);
  });
  return infos;
}

std::vector<EntryInfo> FileCache::remove_if(const std::function<bool(const EntryInfo&)>& unwanted,
                                            std::chrono::seconds temporary_age, bool dry_run) {
  std::vector<EntryInfo> removed;
  for (EntryInfo& info : list()) {
    if (!unwanted(info)) continue;
    if (dry_run) {
      removed.push_back(std::move(info));
      continue;
    }
    // Not if another process replaced the file since it was read (a rebuilt
    // entry where an invalid one was).
    struct stat st {};
    if (::stat(info.path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_dev) != info.device ||
        static_cast<uint64_t>(st.st_ino) != info.inode) {
      continue;
    }
    if (::unlink(info.path.c_str()) == 0) removed.push_back(std::move(info));
  }
  if (dry_run) return removed;
  // A writer's temporary file lives for one write; one older than
  // temporary_age belongs to a process that died mid-write.
  const auto cutoff = fs::file_time_type::clock::now() - temporary_age;
  for (const fs::path& file : files_in(kernels_dir_)) {
    if (file.extension() != ".tmp") continue;
    std::error_code ec;
    const auto written = fs::last_write_time(file, ec);
    if (!ec && written <= cutoff) fs::remove(file, ec);
  }
  // Every remaining entry's kernel keeps a link to a stored entry. (Listed
  // again: an entry another process stored meanwhile counts too.)
  std::map<std::string, std::string> remaining;  // any_key → key of an entry that stays
  std::set<std::string> remaining_compilers;
  for (const EntryInfo& info : list()) {
    if (!info.valid) continue;
    remaining_compilers.insert(info.meta.nvrtc_version);
    if (!info.meta.any_key.empty()) remaining.emplace(info.meta.any_key, info.meta.key);
  }
  for (const auto& [any_key, key] : remaining) link(any_key, key, "");
  // The cache's compiler (v1/compiler) names a version whose entries remain.
  const std::string recorded = warmed_nvrtc(dir_);
  if (remaining_compilers.size() == 1 && recorded != "none" && remaining_compilers.count(recorded) == 0) {
    record_compiler(*remaining_compilers.begin(), false);
  }
  // Links of kernels with no entry left.
  for (const fs::path& file : files_in(kernels_dir_)) {
    if (file.extension() != ".link") continue;
    std::optional<std::string> key;
    try {
      key = linked(file.stem().string());
    } catch (const Error&) {  // not a name jitattn writes: leave it
      continue;
    }
    std::error_code ec;
    if (!key || !fs::exists(entry_path(*key), ec)) fs::remove(file, ec);
  }
  return removed;
}

void FileCache::link(const std::string& any_key, const std::string& key, const std::string& nvrtc_version) {
  check_key(any_key);
  check_key(key);
  if (!writable_) return;
  // (A cache stored before v1/compiler was kept gets it from its hits.)
  record_compiler(nvrtc_version, true);
  if (const std::optional<std::string> current = linked(any_key)) {
    std::error_code ec;
    if (*current == key || fs::exists(entry_path(*current), ec)) return;
  }
  const std::string error = publish_file(key + "\n", kernels_dir_ + "/" + any_key + ".link");
  if (!error.empty()) log(LogLevel::debug, "cache link {}: {}", any_key, error);
}

std::optional<std::string> FileCache::linked(const std::string& any_key) {
  check_key(any_key);
  std::vector<char> bytes;
  struct stat st {};
  if (read_whole_file(kernels_dir_ + "/" + any_key + ".link", bytes, st) != 0 || bytes.size() > 256) {
    return std::nullopt;
  }
  std::string key(bytes.begin(), bytes.end());
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  if (!is_safe_key(key)) return std::nullopt;
  return key;
}

size_t FileCache::clear() {
  size_t entries = 0;
  for (const fs::path& file : files_in(kernels_dir_)) {
    const fs::path ext = file.extension();
    if (ext != ".entry" && ext != ".tmp" && ext != ".lock" && ext != ".link") continue;
    std::error_code ec;
    if (fs::remove(file, ec) && ext == ".entry") ++entries;
  }
  return entries;
}

}  // namespace jitattn::detail
