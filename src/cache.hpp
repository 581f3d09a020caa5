// The on-disk kernel cache: one file per entry (cubin + metadata + checksum),
// published atomically (write a temporary file in the same directory, fsync,
// rename), so no process ever sees a partial entry. Corrupt entries are
// detected, discarded and rebuilt. A directory this process cannot write
// (a cache warmed by another user and deployed read-only) still serves the
// entries it holds: only new ones stay in memory, with one warning. A put
// that fails (disk full, the directory removed meanwhile) fails that entry
// alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jitattn::detail {

// What identifies a compiled kernel: everything that changes the cubin.
// No absolute paths go in, so a cache shared between hosts still hits.
struct CacheKeyInputs {
  std::string source;           // the fully rendered source
  std::vector<std::string> options;  // NVRTC options
  std::string arch;             // "sm_90a"
  std::string nvrtc_version;    // "13.0"
  std::string library_version;  // "0.1.0"
};
// 32 lowercase hex characters (XXH3-128 of the inputs, each length-prefixed).
std::string make_cache_key(const CacheKeyInputs& inputs);
// The key of a kernel whatever NVRTC compiled it: the inputs without
// nvrtc_version. Cache::link maps it to the key of a stored entry of that
// kernel, so a host without NVRTC serves what a host with it warmed.
std::string make_any_compiler_key(CacheKeyInputs inputs);
// The NVRTC version that last stored a kernel in the cache directory
// (<cache_dir>/v1/compiler, written by FileCache::put); "none" if unknown.
std::string warmed_nvrtc(const std::string& cache_dir);

struct EntryMeta {
  std::string key;
  std::string spec;  // KernelSpec text
  std::string arch;
  std::string nvrtc_version;
  std::string library_version;
  double compile_seconds = 0;
  int64_t created_unix = 0;
  uint64_t cubin_bytes = 0;
  std::string any_key;  // make_any_compiler_key of its inputs ("" in entries stored before it was kept)
};

struct Entry {
  EntryMeta meta;
  std::vector<char> cubin;
};

struct EntryInfo {
  EntryMeta meta;
  std::string path;
  uint64_t file_bytes = 0;
  bool valid = true;  // false: the file failed its checks (listed so `clear` can remove it)
  uint64_t device = 0, inode = 0;  // of the file read, so a removal can tell it was not replaced since
};

// A small interface so a shared or remote cache can stand beside the file one.
class Cache {
 public:
  virtual ~Cache() = default;
  // The entry for key, or nullopt. A corrupt entry is discarded (and reported
  // at warn level) and nullopt returned, so the caller rebuilds it.
  virtual std::optional<Entry> get(const std::string& key) = 0;
  // Stores an entry. Returns "" once it is stored, else why it was not (the
  // cache is disabled or read-only, or the write failed). I/O failures never
  // throw.
  virtual std::string put(const Entry& entry) = 0;
  // get(), else build() and put(), holding a per-key inter-process lock where
  // the backend has one so that concurrent processes build a key once.
  // Correctness never depends on the lock. `built` (if given) is set to true
  // when build() ran in this call; `store_error` (if given) to put()'s answer
  // then, and to "" otherwise.
  virtual Entry get_or_build(const std::string& key, const std::function<Entry()>& build,
                             bool* built = nullptr, std::string* store_error = nullptr);
  virtual std::vector<EntryInfo> list() = 0;
  // Removes every entry (and stray temporary/lock files); returns how many entries.
  virtual size_t clear() = 0;
  // Removes the entries `unwanted` picks from list() (each unless its file
  // was replaced since it was read), and temporary files that writers left
  // (their process died) at least `temporary_age` ago. Links (link()) to
  // entries no longer there are pointed at another entry of the kernel that
  // remains, or removed. Returns the entries removed (or that would be, with
  // dry_run).
  virtual std::vector<EntryInfo> remove_if(const std::function<bool(const EntryInfo&)>& unwanted,
                                           std::chrono::seconds temporary_age, bool dry_run) = 0;
  // Records that the kernel of any_key (make_any_compiler_key) is stored
  // under key, unless a link to an entry still stored is there (so hosts of
  // two NVRTC versions do not rewrite it in turn), and names nvrtc_version
  // as the cache's compiler where none is named yet (see put); linked()
  // reads the link back (nullopt if none, or unreadable). Failures are
  // ignored: links only serve hosts without NVRTC.
  virtual void link(const std::string& any_key, const std::string& key, const std::string& nvrtc_version) = 0;
  virtual std::optional<std::string> linked(const std::string& any_key) = 0;
  virtual std::string location() const = 0;
  virtual bool writable() const = 0;
};

// Entries live in <dir>/v1/kernels/<key>.entry.
class FileCache final : public Cache {
 public:
  // How long a miss waits for another process building the same kernel
  // (its per-key lock) before building it too: longer than any compile, so
  // processes warming the same kernels compile each once, yet bounded, so a
  // stopped or hung holder delays the others by this much, not forever.
  static constexpr std::chrono::milliseconds kLockWait{120'000};

  explicit FileCache(std::string dir, std::chrono::milliseconds lock_wait = kLockWait);
  std::optional<Entry> get(const std::string& key) override;
  std::string put(const Entry& entry) override;
  Entry get_or_build(const std::string& key, const std::function<Entry()>& build,
                     bool* built = nullptr, std::string* store_error = nullptr) override;
  std::vector<EntryInfo> list() override;
  size_t clear() override;
  std::vector<EntryInfo> remove_if(const std::function<bool(const EntryInfo&)>& unwanted,
                                   std::chrono::seconds temporary_age, bool dry_run) override;
  // <dir>/v1/kernels/<any_key>.link holds the key.
  void link(const std::string& any_key, const std::string& key, const std::string& nvrtc_version) override;
  std::optional<std::string> linked(const std::string& any_key) override;
  std::string location() const override { return dir_; }
  // Whether puts are tried: false where the directory could not be created
  // or written when the cache was opened (gets still read it).
  bool writable() const override;

  std::string entry_path(const std::string& key) const;

 private:
  // Logs `why` at warn level the first time this cache reports a problem, at
  // info level after.
  void report(const std::string& why) const;
  std::string dir_;
  std::string kernels_dir_;
  bool writable_ = true;
  std::string unwritable_why_;  // put()'s answer when !writable_
  // <dir>/v1/compiler: the NVRTC version that last stored an entry (put),
  // for hosts without NVRTC (TuningTable::load). Written where it differs, or
  // with only_if_missing where there is none.
  void record_compiler(const std::string& nvrtc_version, bool only_if_missing);
  std::chrono::milliseconds lock_wait_;
  mutable std::mutex mutex_;
  mutable bool warned_ = false;
};

// Stores nothing: the disk cache is disabled (cache_dir "").
class NoCache final : public Cache {
 public:
  std::optional<Entry> get(const std::string&) override { return std::nullopt; }
  std::string put(const Entry&) override { return "the disk cache is disabled (no cache directory)"; }
  std::vector<EntryInfo> list() override { return {}; }
  size_t clear() override { return 0; }
  std::vector<EntryInfo> remove_if(const std::function<bool(const EntryInfo&)>&, std::chrono::seconds,
                                   bool) override {
    return {};
  }
  void link(const std::string&, const std::string&, const std::string&) override {}
  std::optional<std::string> linked(const std::string&) override { return std::nullopt; }
  std::string location() const override { return "(disabled)"; }
  bool writable() const override { return false; }
};

// Holds flock(LOCK_EX) on a lock file (created if need be) while alive,
// between processes (and between two FileLocks of one process). When the
// file cannot be opened or locked it holds nothing. Lock files are left in
// place: a process locking a fresh file under the same name would not
// exclude one holding the old one.
class FileLock {
 public:
  // Waits as long as the lock is held elsewhere.
  explicit FileLock(const std::string& path);
  // Waits at most `timeout`, then holds nothing (timed_out()): for locks that
  // only save duplicate work, which a stopped holder must not stall forever.
  FileLock(const std::string& path, std::chrono::milliseconds timeout);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  bool held() const { return held_; }
  bool timed_out() const { return timed_out_; }

 private:
  int fd_;
  bool held_ = false;
  bool timed_out_ = false;
};

// Writes `bytes` to `path` atomically (a temporary file in the same directory,
// fsync, rename): readers see the old file or the whole new one. Returns "" on
// success, else what failed; the temporary file never outlives a failure.
std::string publish_file(std::string_view bytes, const std::string& path);

// Serialization of one entry file; exposed for tests and the CLI.
std::vector<char> encode_entry(const Entry& entry);
// Throws std::runtime_error describing the first failed check.
Entry decode_entry(const std::vector<char>& bytes);

}  // namespace jitattn::detail
