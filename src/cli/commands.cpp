// The subcommands of the jitattn tool. Results go to stdout (a table, or JSON
// for scripts); progress, warnings and errors go to stderr.
#include "cli/commands.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

#include "cache.hpp"
#include "cli/plan_call.hpp"
#include "cli/presets.hpp"
#include "compile.hpp"
#include "driver.hpp"
#include "plan.hpp"
#include "render.hpp"
#include "spec.hpp"
#include "tune.hpp"

namespace jitattn::cli {
namespace {

using detail::Arch;
using detail::KernelSpec;
using json = nlohmann::json;
namespace fs = std::filesystem;

// ---- output ------------------------------------------------------------------

struct Column {
  std::string title;
  bool right_aligned = false;  // numbers line up on their last digit
};
using Row = std::vector<std::string>;

// The one table printer: a header line, then rows, columns two spaces apart.
void print_table(const std::vector<Column>& columns, const std::vector<Row>& rows) {
  std::vector<size_t> widths;
  for (const Column& column : columns) widths.push_back(column.title.size());
  for (const Row& row : rows) {
    for (size_t i = 0; i < columns.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  auto print_row = [&](const Row& cells) {
    std::string line;
    for (size_t i = 0; i < columns.size(); ++i) {
      if (i > 0) line += "  ";
      line += columns[i].right_aligned ? fmt::format("{:>{}}", cells[i], widths[i])
                                       : fmt::format("{:<{}}", cells[i], widths[i]);
    }
    line.erase(line.find_last_not_of(' ') + 1);
    fmt::print("{}\n", line);
  };
  Row titles;
  for (const Column& column : columns) titles.push_back(column.title);
  print_row(titles);
  for (const Row& row : rows) print_row(row);
}

void print_json(const json& value) { fmt::print("{}\n", value.dump(2)); }

// A "name  value" line of `info`'s text output.
void print_field(const std::string& name, const std::string& value) { fmt::print("{:<10} {}\n", name, value); }

std::string kib(uint64_t bytes) { return fmt::format("{:.1f}", static_cast<double>(bytes) / 1024.0); }

std::string count_of(size_t count, const char* singular, const char* plural) {
  return fmt::format("{} {}", count, count == 1 ? singular : plural);
}

// "45s", "3m", "2h", "5d": the largest whole unit, as `ls`-style tools show ages.
std::string age_text(int64_t seconds) {
  seconds = std::max<int64_t>(seconds, 0);
  if (seconds < 60) return fmt::format("{}s", seconds);
  if (seconds < 3600) return fmt::format("{}m", seconds / 60);
  if (seconds < 86400) return fmt::format("{}h", seconds / 3600);
  return fmt::format("{}d", seconds / 86400);
}

// ---- the host: cache, GPUs, archs --------------------------------------------

// The cache the library uses for this configuration (cache_dir "" disables it).
std::unique_ptr<detail::Cache> open_cache(const Config& config) {
  if (config.cache_dir.empty()) return std::make_unique<detail::NoCache>();
  return std::make_unique<detail::FileCache>(config.cache_dir);
}

struct Device {
  int index = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  int max_smem_per_block = 0;  // opt-in dynamic shared memory, as the runtime plans with
  size_t memory_bytes = 0;
};

// The GPUs the driver sees; none where there is no driver (a build host).
std::vector<Device> local_devices() {
  const detail::Driver& cu = detail::driver();
  if (!cu.available) return {};
  int count = 0;
  detail::check_cuda(cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
  std::vector<Device> devices;
  for (int index = 0; index < count; ++index) {
    CUdevice handle = 0;
    detail::check_cuda(cu.cuDeviceGet(&handle, index), "cuDeviceGet");
    auto attribute = [&](CUdevice_attribute which) {
      int value = 0;
      detail::check_cuda(cu.cuDeviceGetAttribute(&value, which, handle), "cuDeviceGetAttribute");
      return value;
    };
    Device device;
    device.index = index;
    char name[256] = {};
    detail::check_cuda(cu.cuDeviceGetName(name, sizeof(name), handle), "cuDeviceGetName");
    device.name = name;
    device.cc_major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    device.cc_minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    device.sm_count = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    device.max_smem_per_block = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    detail::check_cuda(cu.cuDeviceTotalMem(&device.memory_bytes, handle), "cuDeviceTotalMem");
    devices.push_back(std::move(device));
  }
  return devices;
}

void add_unique(std::vector<Arch>& archs, const Arch& arch) {
  if (std::find(archs.begin(), archs.end(), arch) == archs.end()) archs.push_back(arch);
}

// Without --arch: what this host's GPUs run. A host without a (supported) GPU,
// such as a build machine preparing a cache for deployment, gets the two
// targets most deployments need: Ampere-class and Hopper.
std::vector<Arch> default_archs() {
  std::vector<Arch> archs;
  for (const Device& device : local_devices()) {
    const Arch arch = Arch::for_device(device.cc_major, device.cc_minor);
    if (arch.number() >= 80) add_unique(archs, arch);  // older GPUs are not generated for
  }
  if (archs.empty()) archs = {Arch{8, 0, false}, Arch{9, 0, true}};
  return archs;
}

std::vector<Arch> parse_archs(const std::vector<std::string>& texts) {
  if (texts.empty()) return default_archs();
  std::vector<Arch> archs;
  for (const std::string& text : texts) add_unique(archs, Arch::parse(text));
  return archs;
}

// ---- warm: what to compile ----------------------------------------------------

struct WarmItem {
  std::string spec;  // canonical text
  std::string arch;
  bool operator<(const WarmItem& o) const { return std::tie(spec, arch) < std::tie(o.spec, o.arch); }
};

// A manifest line is "SPEC [@ARCH]...": '#' starts a comment, blank lines are
// skipped, and @ARCH pins the line to that arch instead of the --arch list.
void add_manifest(const std::string& path, const std::vector<Arch>& archs, std::vector<WarmItem>& items) {
  std::ifstream file(path);
  if (!file) {
    throw Error(ErrorCode::invalid_argument, fmt::format("manifest {}: cannot open: {}", path, std::strerror(errno)));
  }
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    std::istringstream words(line.substr(0, line.find('#')));
    std::string spec_text;
    if (!(words >> spec_text)) continue;
    try {
      const KernelSpec spec = KernelSpec::parse(spec_text);
      std::vector<Arch> pinned;
      for (std::string word; words >> word;) {
        if (word.size() < 2 || word[0] != '@') {
          throw Error(ErrorCode::invalid_argument, fmt::format("expected @ARCH after the spec, got '{}'", word));
        }
        add_unique(pinned, Arch::parse(word.substr(1)));
      }
      for (const Arch& arch : pinned.empty() ? archs : pinned) items.push_back({spec.text(), arch.text()});
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("manifest {}:{}: {}", path, number, e.what()), e.spec());
    }
  }
}

// Every (spec, arch) pair the options ask for, once each, in the order asked.
// Everything is parsed before anything compiles, so a typo fails in
// milliseconds rather than after minutes of compiling.
std::vector<WarmItem> warm_items(const WarmOptions& options, const detail::TuningTable& tuning) {
  const std::vector<Arch> archs = parse_archs(options.archs);
  std::vector<WarmItem> items;
  for (const std::string& text : options.specs) {
    const KernelSpec spec = KernelSpec::parse(text);
    for (const Arch& arch : archs) items.push_back({spec.text(), arch.text()});
  }
  if (!options.manifest.empty()) add_manifest(options.manifest, archs, items);
  std::vector<std::string> preset_names = options.presets;
  if (options.specs.empty() && options.manifest.empty() && preset_names.empty()) preset_names = {"default"};
  if (!options.page_sizes.empty() && preset_names.empty()) {
    throw Error(ErrorCode::invalid_argument,
                "--page-size: adds page sizes to the presets' paged sweeps, and no preset is warmed (specs and "
                "manifests name their kernels exactly): give --preset NAME too, or drop it");
  }
  for (const std::string& name : preset_names) {
    for (const Arch& arch : archs) {
      for (const KernelSpec& spec : preset_specs(name, arch, &tuning, options.page_sizes)) {
        items.push_back({spec.text(), arch.text()});
      }
    }
  }
  std::set<WarmItem> seen;
  std::vector<WarmItem> unique;
  for (const WarmItem& item : items) {
    if (seen.insert(item).second) unique.push_back(item);
  }
  return unique;
}

// Fails once, up front, when NVRTC is missing or does not know an arch, rather
// than once per kernel.
void check_compilable(const std::vector<WarmItem>& items) {
  const detail::NvrtcInfo& nvrtc = detail::nvrtc_info();
  if (!nvrtc.available) {
    // Warming then checks that the cache holds every kernel (a serving host's
    // coverage): each is a hit or fails.
    fmt::print(stderr, "jitattn: {}; warm checks that the cache holds each kernel\n", nvrtc.error);
    return;
  }
  std::string known;
  for (int number : nvrtc.supported_archs) {
    if (number >= 80) known += fmt::format("{}sm_{}", known.empty() ? "" : ", ", number);
  }
  for (const WarmItem& item : items) {
    const int number = Arch::parse(item.arch).number();
    const auto& supported = nvrtc.supported_archs;
    if (std::find(supported.begin(), supported.end(), number) == supported.end()) {
      throw Error(ErrorCode::unsupported, fmt::format("arch {}: NVRTC {} cannot compile for it (it supports {})",
                                                      item.arch, nvrtc.version(), known));
    }
  }
}

// ---- warm: compiling ----------------------------------------------------------

size_t terminal_columns() {
  winsize size{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 1) return size.ws_col;
  return 80;
}

// One status line on stderr, redrawn in place. Silent unless stderr is a
// terminal, so logs and CI output get only the summary.
class Progress {
 public:
  explicit Progress(size_t total) : total_(total), enabled_(::isatty(STDERR_FILENO) == 1) {}

  void started(const WarmItem& item) {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = item.spec + " " + item.arch;
    draw();
  }
  void finished() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++done_;
    draw();
  }
  // Erases the line so what follows starts on a clean one.
  void close() {
    if (!enabled_) return;
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }

 private:
  void draw() const {
    if (!enabled_) return;
    constexpr size_t bar_width = 24;
    const size_t filled = total_ == 0 ? bar_width : bar_width * done_ / total_;
    std::string line = fmt::format("[{}{}] {}/{} {}", std::string(filled, '#'), std::string(bar_width - filled, '.'),
                                   done_, total_, current_);
    // A line wider than the terminal wraps, and "\r" would then redraw only its last part.
    line.resize(std::min(line.size(), terminal_columns() - 1));
    fmt::print(stderr, "\r\033[K{}", line);
    std::fflush(stderr);
  }

  std::mutex mutex_;
  size_t total_;
  size_t done_ = 0;
  std::string current_;
  bool enabled_;
};

struct WarmOutcome {
  WarmItem item;
  std::optional<WarmResult> result;  // empty when it failed
  std::string error;
};

// Warms the items on `jobs` threads, each taking the next item in order. NVRTC
// compiles separate programs in parallel and Runtime::warm is thread-safe; a
// failure is recorded and the others still run.
std::vector<WarmOutcome> warm_all(Runtime& runtime, const std::vector<WarmItem>& items, size_t jobs) {
  std::vector<WarmOutcome> outcomes(items.size());
  Progress progress(items.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < items.size(); i = next++) {
      progress.started(items[i]);
      outcomes[i].item = items[i];
      try {
        outcomes[i].result = runtime.warm(items[i].spec, items[i].arch);
      } catch (const std::exception& e) {
        outcomes[i].error = e.what();
      }
      progress.finished();
    }
  };
  std::vector<std::thread> workers;
  for (size_t j = 0; j < std::min(jobs, items.size()); ++j) workers.emplace_back(work);
  for (std::thread& worker : workers) worker.join();
  progress.close();
  return outcomes;
}

// Compile errors start with the spec already; others (a cache or driver error) may not.
std::string failure_text(const WarmOutcome& outcome) {
  if (outcome.error.rfind(outcome.item.spec, 0) == 0) return outcome.error;
  return fmt::format("{} for {}: {}", outcome.item.spec, outcome.item.arch, outcome.error);
}

const char* result_name(const WarmOutcome& outcome) {
  if (!outcome.result) return "FAILED";
  return outcome.result->cache_hit ? "hit" : "miss";
}

json warm_json(const WarmOutcome& outcome) {
  json record = {{"spec", outcome.item.spec}, {"arch", outcome.item.arch}, {"result", result_name(outcome)}};
  if (outcome.result) {
    record["compile_seconds"] = outcome.result->compile_seconds;
    record["cubin_bytes"] = outcome.result->cubin_bytes;
  } else {
    record["error"] = outcome.error;
  }
  return record;
}

Row warm_row(const WarmOutcome& outcome) {
  const std::optional<WarmResult>& result = outcome.result;
  const bool compiled = result && !result->cache_hit;
  return {outcome.item.spec, outcome.item.arch, result_name(outcome),
          compiled ? fmt::format("{:.2f}", result->compile_seconds) : "-",
          result ? kib(result->cubin_bytes) : "-"};
}

// ---- list / info ----------------------------------------------------------------

// Keys are 32 hex digits; 12 tell entries apart in practice.
std::string short_key(const std::string& key) { return key.substr(0, 12); }

json entry_json(const detail::EntryInfo& entry, int64_t now) {
  const detail::EntryMeta& meta = entry.meta;
  return {{"spec", meta.spec},
          {"arch", meta.arch},
          {"key", meta.key},
          {"valid", entry.valid},
          {"cubin_bytes", meta.cubin_bytes},
          {"file_bytes", entry.file_bytes},
          {"created_unix", meta.created_unix},
          {"age_seconds", entry.valid ? json(now - meta.created_unix) : json()},
          {"compile_seconds", meta.compile_seconds},
          {"nvrtc_version", meta.nvrtc_version},
          {"library_version", meta.library_version},
          {"path", entry.path}};
}

Row entry_row(const detail::EntryInfo& entry, int64_t now) {
  const detail::EntryMeta& meta = entry.meta;
  if (!entry.valid) return {"(invalid entry)", "-", kib(entry.file_bytes), "-", short_key(meta.key)};
  return {meta.spec, meta.arch, kib(meta.cubin_bytes), age_text(now - meta.created_unix), short_key(meta.key)};
}

// ---- the tuning table ------------------------------------------------------------

std::string tuning_path(const Config& config) { return (fs::path(config.cache_dir) / "v1" / "tuning.json").string(); }

std::string tiles_text(const TileConfig& t) { return fmt::format("{}x{}x{}", t.block_q, t.block_kv, t.warps); }

detail::TuningTable load_tuning(const Config& config) {
  return detail::TuningTable::load(config.cache_dir, jitattn::version(), detail::nvrtc_info().version());
}

// Why an existing tuning.json loaded no choice ("" when it is simply empty).
// TuningTable::load only logs this; `info` shows it.
std::string tuning_ignored_reason(const Config& config, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  try {
    const json document = json::parse(text.str());
    if (!document.is_object() || document.value("format", 0) != 1) return "not a format-1 tuning table";
    const std::string library = document.at("library_version").get<std::string>();
    const std::string nvrtc = document.at("nvrtc_version").get<std::string>();
    const std::string our_nvrtc = detail::table_nvrtc_for(config.cache_dir, detail::nvrtc_info().version());
    if (library != jitattn::version() || nvrtc != our_nvrtc) {
      return fmt::format("tuned with jitattn {} and NVRTC {}; this is jitattn {} with NVRTC {}", library, nvrtc,
                         jitattn::version(), our_nvrtc);
    }
    const json& choices = document.at("choices");
    if (!choices.is_array()) return "\"choices\" is not an array";
    if (!choices.empty()) return fmt::format("none of its {} choices is valid for this build", choices.size());
    return "";
  } catch (const json::exception& e) {
    return fmt::format("unreadable: {}", e.what());
  }
}

json tuning_record(const Config& config) {
  if (config.cache_dir.empty()) return {{"path", ""}, {"status", "disabled"}, {"entries", 0}, {"reason", ""}};
  const std::string path = tuning_path(config);
  std::error_code ec;
  if (!fs::exists(path, ec)) return {{"path", path}, {"status", "none"}, {"entries", 0}, {"reason", ""}};
  const detail::TuningTable table = load_tuning(config);
  const std::string reason = table.empty() ? tuning_ignored_reason(config, path) : "";
  return {{"path", path},
          {"status", reason.empty() ? "loaded" : "ignored"},
          {"entries", table.choices().size()},
          {"reason", reason}};
}

std::string driver_version_text(int version) { return fmt::format("{}.{}", version / 1000, version % 1000 / 10); }

// Everything `info` reports, gathered once; the text output is rendered from it.
json info_record(const Config& config) {
  const detail::NvrtcInfo& nvrtc = detail::nvrtc_info();
  json nvrtc_record = {{"available", nvrtc.available}, {"version", nvrtc.available ? nvrtc.version() : ""},
                       {"library", nvrtc.library}, {"error", nvrtc.error}};

  const detail::Driver& cu = detail::driver();
  json driver_record = {{"available", cu.available},
                        {"version", cu.available ? driver_version_text(cu.version) : ""},
                        {"error", cu.error}};
  json devices = json::array();
  for (const Device& device : local_devices()) {
    devices.push_back({{"index", device.index},
                       {"name", device.name},
                       {"compute_capability", fmt::format("{}.{}", device.cc_major, device.cc_minor)},
                       {"arch", Arch::for_device(device.cc_major, device.cc_minor).text()},
                       {"sm_count", device.sm_count},
                       {"memory_bytes", device.memory_bytes}});
  }

  std::unique_ptr<detail::Cache> cache = open_cache(config);
  size_t invalid = 0;
  uint64_t bytes = 0;
  const std::vector<detail::EntryInfo> entries = cache->list();
  for (const detail::EntryInfo& entry : entries) {
    invalid += entry.valid ? 0 : 1;
    bytes += entry.file_bytes;
  }
  json cache_record = {{"directory", config.cache_dir}, {"enabled", !config.cache_dir.empty()},
                       {"writable", cache->writable()}, {"entries", entries.size()},
                       {"invalid_entries", invalid}, {"bytes", bytes}};

  const bool embedded = config.template_dir.empty();
  json templates_record = {{"source", embedded ? "embedded" : "directory"}, {"directory", config.template_dir}};
  if (embedded) templates_record["count"] = detail::embedded_templates().size();

  return {{"version", jitattn::version()}, {"nvrtc", nvrtc_record}, {"driver", driver_record},
          {"devices", devices}, {"cache", cache_record}, {"tuning", tuning_record(config)},
          {"templates", templates_record}};
}

void print_info(const json& info) {
  print_field("jitattn", info["version"].get<std::string>());

  const json& nvrtc = info["nvrtc"];
  print_field("nvrtc", nvrtc["available"].get<bool>()
                           ? fmt::format("{} ({})", nvrtc["version"].get<std::string>(), nvrtc["library"].get<std::string>())
                           : "unavailable: " + nvrtc["error"].get<std::string>());

  const json& cu = info["driver"];
  print_field("driver", cu["available"].get<bool>() ? cu["version"].get<std::string>()
                                                     : "unavailable: " + cu["error"].get<std::string>());

  if (info["devices"].empty()) print_field("devices", "none");
  for (const json& device : info["devices"]) {
    print_field(fmt::format("device {}", device["index"].get<int>()),
                fmt::format("{}, compute {} (jitattn arch {}), {} SMs, {:.1f} GiB", device["name"].get<std::string>(),
                            device["compute_capability"].get<std::string>(), device["arch"].get<std::string>(),
                            device["sm_count"].get<int>(),
                            device["memory_bytes"].get<double>() / (1024.0 * 1024.0 * 1024.0)));
  }

  const json& cache = info["cache"];
  if (!cache["enabled"].get<bool>()) {
    print_field("cache", "disabled (the cache directory is set to \"\")");
  } else {
    print_field("cache", fmt::format("{} ({}), {}, {} KiB", cache["directory"].get<std::string>(),
                                     cache["writable"].get<bool>() ? "writable" : "NOT writable: read only, new kernels memory-only",
                                     count_of(cache["entries"].get<size_t>(), "entry", "entries"),
                                     kib(cache["bytes"].get<uint64_t>())));
  }
  if (cache["invalid_entries"].get<size_t>() > 0) {
    print_field("", fmt::format("{} invalid (`jitattn clear` removes them)", cache["invalid_entries"].get<size_t>()));
  }

  const json& tuning = info["tuning"];
  const std::string status = tuning["status"].get<std::string>();
  if (status == "disabled") {
    print_field("tuning", "none (no disk cache)");
  } else if (status == "none") {
    print_field("tuning", "none: the built-in tiles (`jitattn tune` measures this GPU's)");
  } else if (status == "loaded") {
    print_field("tuning", fmt::format("{}, {}", tuning["path"].get<std::string>(),
                                      count_of(tuning["entries"].get<size_t>(), "shape class", "shape classes")));
  } else {
    print_field("tuning", fmt::format("{} IGNORED: {}", tuning["path"].get<std::string>(),
                                      tuning["reason"].get<std::string>()));
    print_field("", "the built-in tiles are used; `jitattn tune` replaces it");
  }

  const json& templates = info["templates"];
  print_field("templates", templates["source"] == "embedded"
                               ? fmt::format("embedded ({} files)", templates["count"].get<size_t>())
                               : templates["directory"].get<std::string>() + " (JITATTN_TEMPLATE_DIR)");
}

// ---- tune ----------------------------------------------------------------------------

[[noreturn]] void bad_option(const std::string& message) { throw Error(ErrorCode::invalid_argument, message); }

std::vector<DType> parse_dtypes(const std::vector<std::string>& texts) {
  if (texts.empty()) return {DType::bf16, DType::f16};
  std::vector<DType> dtypes;
  for (const std::string& text : texts) {
    DType dtype = DType::bf16;
    if (text == "f16" || text == "fp16") {
      dtype = DType::f16;
    } else if (text != "bf16") {
      bad_option(fmt::format("--dtype: '{}' is not bf16 or f16", text));
    }
    if (std::find(dtypes.begin(), dtypes.end(), dtype) == dtypes.end()) dtypes.push_back(dtype);
  }
  return dtypes;
}

std::vector<int> parse_head_dims(const std::vector<int>& values) {
  if (values.empty()) return {64, 128};
  std::vector<int> head_dims;
  for (int head_dim : values) {
    const std::vector<int> generated = {32, 64, 96, 128, 192, 256};
    if (std::find(generated.begin(), generated.end(), head_dim) == generated.end()) {
      bad_option(fmt::format("--head-dim: {} is not one of 32, 64, 96, 128, 192, 256", head_dim));
    }
    if (std::find(head_dims.begin(), head_dims.end(), head_dim) == head_dims.end()) head_dims.push_back(head_dim);
  }
  return head_dims;
}

std::vector<bool> parse_causal(const std::string& text) {
  if (text == "yes") return {true};
  if (text == "no") return {false};
  if (text == "both") return {false, true};
  bad_option(fmt::format("--causal: '{}' is not yes, no or both", text));
}

// One seqlen per bucket: the bucket is what the planner looks up.
std::vector<int> parse_seqlens(const std::vector<int>& values) {
  if (values.empty()) return {512, 1024, 2048, 4096, 8192, 16384};
  std::vector<int> seqlens;
  for (int n : values) {
    if (n < 1) bad_option(fmt::format("--seqlen: {} must be >= 1", n));
    for (int earlier : seqlens) {
      if (detail::seqlen_bucket(n, n) == detail::seqlen_bucket(earlier, earlier)) {
        bad_option(fmt::format("--seqlen: {} and {} fall in the same bucket (n{}); give one", earlier, n,
                               detail::seqlen_bucket(n, n)));
      }
    }
    seqlens.push_back(n);
  }
  return seqlens;
}

// Empty: every candidate (tile_candidates per head dim).
std::vector<TileConfig> parse_candidates(const std::vector<std::string>& texts) {
  std::vector<TileConfig> candidates;
  for (const std::string& text : texts) {
    if (text == "all") {
      if (texts.size() > 1) bad_option("--candidates: 'all' cannot be combined with tile configurations");
      return {};
    }
    TileConfig tiles;
    char tail = 0;
    if (std::sscanf(text.c_str(), "%dx%dx%d%c", &tiles.block_q, &tiles.block_kv, &tiles.warps, &tail) != 3) {
      bad_option(fmt::format("--candidates: '{}' is not all or BQxBKVxW (e.g. 128x64x4)", text));
    }
    KernelSpec spec;
    spec.block_q = tiles.block_q;
    spec.block_kv = tiles.block_kv;
    spec.warps = tiles.warps;
    try {
      spec.validate();
    } catch (const Error& e) {
      bad_option(fmt::format("--candidates: {}: {}", text, e.what()));
    }
    const bool seen = std::any_of(candidates.begin(), candidates.end(), [&](const TileConfig& c) {
      return tiles_text(c) == tiles_text(tiles);
    });
    if (!seen) candidates.push_back(tiles);
  }
  return candidates;
}

detail::TuneRequest tune_request(const TuneOptions& options) {
  detail::TuneRequest request;
  request.dtypes = parse_dtypes(options.dtypes);
  request.head_dims = parse_head_dims(options.head_dims);
  request.causal = parse_causal(options.causal);
  request.seqlens = parse_seqlens(options.seqlens);
  request.candidates = parse_candidates(options.candidates);
  if (options.iterations < 1) bad_option(fmt::format("--iters: {} must be >= 1", options.iterations));
  request.iterations = options.iterations;
  return request;
}

// "sm_90a.bf16.d128.causal.n4096", or without the arch where it is not known.
std::string class_text(const detail::ShapeClass& shape, bool arch_known) {
  const std::string text = shape.text();
  return arch_known ? text : text.substr(text.find('.') + 1);
}

// What tune would time, without a GPU: the classes of the request, each with
// its problem size and candidates. The arch is device 0's where there is one.
int tune_dry_run(const detail::TuneRequest& request, bool json_output) {
  const std::vector<Device> devices = local_devices();
  const bool arch_known = !devices.empty();
  const Arch arch = arch_known ? Arch::for_device(devices[0].cc_major, devices[0].cc_minor) : Arch{9, 0, true};
  json classes = json::array();
  std::vector<Row> rows;
  size_t timings = 0;
  std::set<size_t> per_class;
  for (DType dtype : request.dtypes) {
    for (int head_dim : request.head_dims) {
      for (bool causal : request.causal) {
        const std::vector<TileConfig> candidates =
            request.candidates.empty() ? detail::tile_candidates(head_dim) : request.candidates;
        for (int n : request.seqlens) {
          const detail::ShapeClass shape{arch, dtype, head_dim, causal, detail::seqlen_bucket(n, n)};
          const int64_t batch = std::max<int64_t>(request.tokens / n, 1);
          const int64_t heads = request.model_dim / head_dim;
          const TileConfig builtin = detail::default_tiles(dtype, head_dim, causal, arch, shape.seqlen_bucket);
          json names = json::array();
          std::string list;
          for (const TileConfig& tiles : candidates) {
            names.push_back(tiles_text(tiles));
            list += (list.empty() ? "" : ",") + tiles_text(tiles);
          }
          classes.push_back({{"class", class_text(shape, arch_known)}, {"dtype", detail::dtype_name(dtype)},
                             {"head_dim", head_dim}, {"causal", causal}, {"seqlen", n},
                             {"seqlen_bucket", shape.seqlen_bucket}, {"batch", batch}, {"heads", heads},
                             {"builtin", tiles_text(builtin)}, {"candidates", names}});
          rows.push_back({class_text(shape, arch_known), std::to_string(batch), std::to_string(heads),
                          tiles_text(builtin), list});
          timings += candidates.size();
          per_class.insert(candidates.size());
        }
      }
    }
  }
  if (json_output) {
    print_json({{"arch", arch_known ? json(arch.text()) : json()}, {"iterations", request.iterations},
                {"tokens", request.tokens}, {"model_dim", request.model_dim}, {"classes", classes}});
    return 0;
  }
  const std::string shape_count = count_of(rows.size(), "class", "classes");
  fmt::print("would time {} on {}, {} timed calls each (after 3 warm-up calls):\n",
             per_class.size() == 1 ? fmt::format("{} × {} = {}", shape_count,
                                                 count_of(*per_class.begin(), "candidate", "candidates"),
                                                 count_of(timings, "configuration", "configurations"))
                                   : fmt::format("{}, {}", shape_count, count_of(timings, "configuration", "configurations")),
             arch_known ? arch.text() : "the GPU (none here)", request.iterations);
  print_table({{"class"}, {"batch", true}, {"heads", true}, {"built-in"}, {"candidates"}}, rows);
  return 0;
}

json choice_json(const detail::TunedChoice& choice, const TileConfig& builtin) {
  const detail::ShapeClass& s = choice.shape;
  return {{"class", s.text()},
          {"arch", s.arch.text()},
          {"dtype", detail::dtype_name(s.dtype)},
          {"head_dim", s.head_dim},
          {"causal", s.causal},
          {"seqlen_bucket", s.seqlen_bucket},
          {"tiles", tiles_text(choice.tiles)},
          {"tflops", choice.tflops},
          {"builtin_tiles", tiles_text(builtin)},
          {"builtin_tflops", choice.default_tflops > 0 ? json(choice.default_tflops) : json()},
          {"gain_percent", choice.default_tflops > 0 ? json((choice.tflops / choice.default_tflops - 1) * 100) : json()}};
}

// ---- plan ----------------------------------------------------------------------------

// The GPU a call is planned for, and where each value came from: its
// option, this host's GPU, or the default.
struct ChosenTarget {
  PlanTarget target;
  std::string arch_from, sm_count_from, smem_from;
};

// --arch, --sms and --smem; else this host's GPU 0 where it has one (its SMs
// and shared memory only when it is of the target arch: another GPU's say
// nothing about it); else sm_90a, 132 SMs (an H100 or H200) and the arch's
// opt-in shared memory. The driver is asked only for what the options leave open.
ChosenTarget plan_target(const PlanOptions& options) {
  std::optional<Device> gpu;
  if (!options.arch || !options.sms || !options.smem) {
    const std::vector<Device> devices = local_devices();
    if (!devices.empty() && Arch::for_device(devices[0].cc_major, devices[0].cc_minor).number() >= 80) gpu = devices[0];
  }
  const std::string gpu_text = gpu ? fmt::format("GPU {}: {}", gpu->index, gpu->name) : "";
  ChosenTarget chosen;
  PlanTarget& target = chosen.target;
  if (options.arch) {
    target.arch = Arch::parse(*options.arch);
    chosen.arch_from = "--arch";
  } else if (gpu) {
    target.arch = Arch::for_device(gpu->cc_major, gpu->cc_minor);
    chosen.arch_from = gpu_text;
  } else {
    target.arch = Arch{9, 0, true};
    chosen.arch_from = "default";
  }
  const bool gpu_is_target = gpu && Arch::for_device(gpu->cc_major, gpu->cc_minor) == target.arch;
  // One value of the target: the option's, else the local GPU's where it is
  // the target, else the default; `from` says which.
  auto choose = [&](const std::optional<int>& option, const char* name, int gpu_value, int default_value,
                    std::string default_from, int& value, std::string& from) {
    if (option) {
      if (*option < 1) bad_option(fmt::format("{}: {} must be >= 1", name, *option));
      value = *option;
      from = name;
    } else if (gpu_is_target) {
      value = gpu_value;
      from = gpu_text;
    } else {
      value = default_value;
      from = std::move(default_from);
    }
  };
  choose(options.sms, "--sms", gpu_is_target ? gpu->sm_count : 0, 132, "default", target.sm_count,
         chosen.sm_count_from);
  choose(options.smem, "--smem", gpu_is_target ? gpu->max_smem_per_block : 0, max_smem_of(target.arch),
         "default for " + target.arch.text(), target.max_smem_bytes, chosen.smem_from);
  return chosen;
}

// Where the attention kernel's tiles came from.
std::string tiles_from(const PlanOptions& options, const CallPlan& plan) {
  if (!options.tiles.empty()) return "--tiles";
  return plan.tiles_tuned ? "tuning table" : "built-in";
}

json launch_json(const PlannedLaunch& launch, const Arch& arch) {
  json record = {{"launch", launch.role},       {"spec", launch.spec.text()},      {"arch", arch.text()},
                 {"grid", launch.grid},         {"threads", launch.threads},       {"smem_bytes", launch.smem_bytes}};
  if (launch.role == "attention") {
    record["splits"] = launch.splits;
    record["dynamic_splits"] = launch.dynamic_splits;
    record["workspace_bytes"] = launch.workspace_bytes;
  }
  return record;
}

Row launch_row(const PlannedLaunch& launch) {
  const bool attention = launch.role == "attention";
  return {launch.role,
          launch.spec.text(),
          std::to_string(launch.grid),
          std::to_string(launch.threads),
          std::to_string(launch.smem_bytes),
          !attention ? "-" : launch.dynamic_splits ? fmt::format("<= {}", launch.splits) : std::to_string(launch.splits),
          attention ? std::to_string(launch.workspace_bytes) : "-"};
}

}  // namespace

// ---- the commands ---------------------------------------------------------------

int warm(const Config& config, const WarmOptions& options) {
  const std::vector<WarmItem> items = warm_items(options, load_tuning(config));
  check_compilable(items);
  Runtime runtime(config);
  const auto start = std::chrono::steady_clock::now();
  const size_t jobs = options.jobs > 0 ? static_cast<size_t>(options.jobs)
                                       : std::max<size_t>(1, std::thread::hardware_concurrency());
  const std::vector<WarmOutcome> outcomes = warm_all(runtime, items, jobs);
  const double wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  size_t misses = 0, failures = 0;
  for (const WarmOutcome& outcome : outcomes) {
    if (!outcome.result) {
      ++failures;
      fmt::print(stderr, "jitattn: {}\n", failure_text(outcome));
    } else if (!outcome.result->cache_hit) {
      ++misses;
    }
  }
  if (options.json) {
    json records = json::array();
    for (const WarmOutcome& outcome : outcomes) records.push_back(warm_json(outcome));
    print_json(records);
  } else {
    std::vector<Row> rows;
    for (const WarmOutcome& outcome : outcomes) rows.push_back(warm_row(outcome));
    print_table({{"spec"}, {"arch"}, {"result"}, {"compile s", true}, {"cubin KiB", true}}, rows);
    fmt::print("total: {}, {}, {} failed, {:.2f} s wall\n", count_of(outcomes.size(), "kernel", "kernels"),
               count_of(misses, "miss (compiled)", "misses (compiled)"), failures, wall_seconds);
  }
  return failures == 0 ? 0 : 1;
}

int list_presets(const Config& config, const std::vector<std::string>& arch_texts, const std::vector<int>& page_sizes,
                 bool json_output) {
  const std::vector<Arch> archs = parse_archs(arch_texts);
  const detail::TuningTable tuning = load_tuning(config);
  json records = json::array();
  for (const Preset& preset : presets()) {
    json specs = json::array();
    for (const Arch& arch : archs) {
      for (const KernelSpec& spec : preset_specs(preset.name, arch, &tuning, page_sizes)) {
        specs.push_back({{"spec", spec.text()}, {"arch", arch.text()}});
      }
    }
    records.push_back({{"name", preset.name}, {"description", preset.description}, {"specs", specs}});
  }
  if (json_output) {
    print_json(records);
    return 0;
  }
  for (const json& record : records) {
    fmt::print("{:<12} {}\n", record["name"].get<std::string>(), record["description"].get<std::string>());
    for (const json& spec : record["specs"]) {
      fmt::print("    {:<8} {}\n", spec["arch"].get<std::string>(), spec["spec"].get<std::string>());
    }
  }
  return 0;
}

int list(const Config& config, bool json_output, bool manifest) {
  std::unique_ptr<detail::Cache> cache = open_cache(config);
  const std::vector<detail::EntryInfo> entries = cache->list();
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  if (manifest) {
    // Entries of other NVRTC or library versions name the same kernel: one line each.
    std::set<std::pair<std::string, std::string>> kernels;
    for (const detail::EntryInfo& entry : entries) {
      if (entry.valid) kernels.emplace(entry.meta.spec, entry.meta.arch);
    }
    fmt::print("# {} in {}\n", count_of(kernels.size(), "kernel", "kernels"), cache->location());
    for (const auto& [spec, arch] : kernels) fmt::print("{} @{}\n", spec, arch);
    return 0;
  }
  if (json_output) {
    json records = json::array();
    for (const detail::EntryInfo& entry : entries) records.push_back(entry_json(entry, now));
    print_json(records);
    return 0;
  }
  std::vector<Row> rows;
  uint64_t bytes = 0;
  size_t invalid = 0;
  for (const detail::EntryInfo& entry : entries) {
    rows.push_back(entry_row(entry, now));
    bytes += entry.file_bytes;
    invalid += entry.valid ? 0 : 1;
  }
  print_table({{"spec"}, {"arch"}, {"cubin KiB", true}, {"age", true}, {"key"}}, rows);
  fmt::print("{}, {} KiB on disk, in {}\n", count_of(entries.size(), "entry", "entries"), kib(bytes), cache->location());
  if (invalid > 0) {
    fmt::print("{} failed their checks and will be rebuilt on use; `jitattn clear` removes them\n",
               count_of(invalid, "entry", "entries"));
  }
  return 0;
}

int clear(const Config& config) {
  std::unique_ptr<detail::Cache> cache = open_cache(config);
  const size_t removed = cache->clear();
  fmt::print("removed {} from {}\n", count_of(removed, "entry", "entries"), cache->location());
  if (config.cache_dir.empty()) return 0;
  // The cache's clear() leaves v1/ alone apart from v1/kernels: the tuning
  // table (and any temporary file of an interrupted save) goes here.
  const std::string path = tuning_path(config);
  std::error_code ec;
  if (fs::remove(path, ec)) fmt::print("removed the tuning table {}\n", path);
  const std::string stem = fs::path(path).filename().string() + ".";
  for (fs::directory_iterator it(fs::path(path).parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(stem, 0) == 0 && it->path().extension() == ".tmp") fs::remove(it->path(), ec), ec.clear();
  }
  return 0;
}

int prune(const Config& config, const PruneOptions& options) {
  std::unique_ptr<detail::Cache> cache = open_cache(config);
  const std::string library = jitattn::version();
  const detail::NvrtcInfo& nvrtc = detail::nvrtc_info();
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  if (options.older_than_days && !(*options.older_than_days >= 0)) {
    throw Error(ErrorCode::invalid_argument,
                fmt::format("--older-than {}: must be a number of days, 0 or more", *options.older_than_days));
  }
  // Why an entry goes ("" keeps it). The key hashes the library and NVRTC
  // versions, so this library with this NVRTC never reads an entry of
  // other versions (a host without NVRTC reads any NVRTC's, through links).
  auto reason = [&](const detail::EntryInfo& entry) -> std::string {
    const detail::EntryMeta& meta = entry.meta;
    if (!entry.valid) return "invalid";
    if (meta.library_version != library) return fmt::format("library {}", meta.library_version);
    if (nvrtc.available && meta.nvrtc_version != nvrtc.version()) return fmt::format("NVRTC {}", meta.nvrtc_version);
    if (options.older_than_days && static_cast<double>(now - meta.created_unix) > *options.older_than_days * 86400) {
      return fmt::format("created {} ago", age_text(now - meta.created_unix));
    }
    return "";
  };
  const size_t total = cache->list().size();
  // Temporary files an hour old: no write takes that long.
  const std::vector<detail::EntryInfo> removed = cache->remove_if(
      [&](const detail::EntryInfo& entry) { return !reason(entry).empty(); }, std::chrono::hours(1), options.dry_run);
  if (options.json) {
    json records = json::array();
    for (const detail::EntryInfo& entry : removed) {
      json record = entry_json(entry, now);
      record["reason"] = reason(entry);
      records.push_back(std::move(record));
    }
    print_json(records);
    return 0;
  }
  std::vector<Row> rows;
  uint64_t bytes = 0;
  for (const detail::EntryInfo& entry : removed) {
    Row row = entry_row(entry, now);
    row.push_back(reason(entry));
    rows.push_back(std::move(row));
    bytes += entry.file_bytes;
  }
  if (!rows.empty()) print_table({{"spec"}, {"arch"}, {"cubin KiB", true}, {"age", true}, {"key"}, {"why"}}, rows);
  fmt::print("{} {} of {} ({} KiB) from {}{}\n", options.dry_run ? "would remove" : "removed",
             count_of(removed.size(), "entry", "entries"), total, kib(bytes), cache->location(),
             nvrtc.available ? "" : " (no NVRTC here: entries of every NVRTC version kept)");
  return 0;
}

int tune(const Config& config, const TuneOptions& options) {
  const detail::TuneRequest request = tune_request(options);
  if (options.dry_run) return tune_dry_run(request, options.json);
  const detail::Driver& cu = detail::driver();
  if (!cu.available) throw Error(ErrorCode::cuda_error, "tune needs a GPU: " + cu.error);
  // It compiles its candidates, and stamps the table with the NVRTC version.
  if (!detail::nvrtc_info().available) {
    throw Error(ErrorCode::unsupported, "tune needs NVRTC to compile its candidates: " + detail::nvrtc_info().error);
  }
  if (local_devices().empty()) throw Error(ErrorCode::cuda_error, "tune needs a GPU: the driver sees no CUDA device");
  if (config.cache_dir.empty()) {
    throw Error(ErrorCode::cache_error,
                "tune: the disk cache is disabled (the cache directory is \"\"), so there is nowhere to keep the "
                "tuning table; set JITATTN_CACHE_DIR or --cache-dir");
  }
  if (::isatty(STDERR_FILENO) == 1) {
    fmt::print(stderr, "jitattn: compiling the candidates, then timing them (JITATTN_LOG=info shows each class)\n");
  }
  Runtime runtime(config);
  const std::vector<detail::TunedChoice> winners = detail::tune(runtime, request);

  // Load, merge and save under an inter-process lock: two tune runs ending
  // together would otherwise each save the table without the other's choices.
  // (Without a lock file, as on a read-only directory, save reports the error.)
  std::error_code ec;
  fs::create_directories(fs::path(tuning_path(config)).parent_path(), ec);
  detail::TuningTable table;
  {
    const detail::FileLock lock(tuning_path(config) + ".lock");
    table = load_tuning(config);
    table.library_version = jitattn::version();
    table.nvrtc_version = detail::nvrtc_info().version();
    for (const detail::TunedChoice& choice : winners) table.set(choice);
    table.save(config.cache_dir);
  }

  auto builtin_of = [](const detail::TunedChoice& choice) {
    const detail::ShapeClass& s = choice.shape;
    return detail::default_tiles(s.dtype, s.head_dim, s.causal, s.arch, s.seqlen_bucket);
  };
  if (options.json) {
    json choices = json::array();
    for (const detail::TunedChoice& choice : winners) choices.push_back(choice_json(choice, builtin_of(choice)));
    print_json({{"path", tuning_path(config)}, {"entries", table.choices().size()}, {"choices", choices}});
    return 0;
  }
  std::vector<Row> rows;
  for (const detail::TunedChoice& choice : winners) {
    const bool measured = choice.default_tflops > 0;
    rows.push_back({choice.shape.text(), tiles_text(choice.tiles), fmt::format("{:.1f}", choice.tflops),
                    tiles_text(builtin_of(choice)), measured ? fmt::format("{:.1f}", choice.default_tflops) : "-",
                    measured ? fmt::format("{:+.1f}", (choice.tflops / choice.default_tflops - 1) * 100) : "-"});
  }
  print_table({{"class"}, {"tiles"}, {"TFLOP/s", true}, {"built-in"}, {"built-in TFLOP/s", true}, {"gain %", true}},
              rows);
  fmt::print("saved {} to {} ({} in all)\n", count_of(winners.size(), "choice", "choices"), tuning_path(config),
             count_of(table.choices().size(), "shape class", "shape classes"));
  return 0;
}

int info(const Config& config, bool json_output) {
  const json record = info_record(config);
  if (json_output) {
    print_json(record);
  } else {
    print_info(record);
  }
  return 0;
}

int plan(const Config& config, const PlanOptions& options) {
  const ChosenTarget chosen = plan_target(options);
  const Arch& arch = chosen.target.arch;
  // The table a Runtime of this configuration loads and plans with.
  const detail::TuningTable tuning = load_tuning(config);
  const CallPlan plan = plan_call(options, chosen.target, &tuning);
  if (options.manifest) {
    for (const PlannedLaunch& launch : plan.launches) fmt::print("{} @{}\n", launch.spec.text(), arch.text());
    return 0;
  }
  const std::string from = tiles_from(options, plan);
  if (options.json) {
    json launches = json::array();
    for (const PlannedLaunch& launch : plan.launches) launches.push_back(launch_json(launch, arch));
    const json target = {{"arch", arch.text()},
                         {"sm_count", chosen.target.sm_count},
                         {"max_smem_bytes", chosen.target.max_smem_bytes},
                         {"arch_from", chosen.arch_from},
                         {"sm_count_from", chosen.sm_count_from},
                         {"max_smem_from", chosen.smem_from}};
    print_json({{"call", options.call},
                {"target", target},
                {"tiles_from", from},
                {"tuning_table", tuning.empty() ? json() : json(tuning_path(config))},
                {"launches", launches}});
    return 0;
  }
  fmt::print("target  {} ({}), {} SMs ({}), {} bytes of shared memory per block ({})\n", arch.text(),
             chosen.arch_from, chosen.target.sm_count, chosen.sm_count_from, chosen.target.max_smem_bytes,
             chosen.smem_from);
  if (from == "tuning table") {
    fmt::print("tiles   from the tuning table {}\n", tuning_path(config));
  } else if (from == "built-in" && !tuning.empty()) {
    fmt::print("tiles   built-in (the tuning table {} does not change them)\n", tuning_path(config));
  } else {
    fmt::print("tiles   {}\n", from);
  }
  if (plan.launches.empty()) {
    fmt::print("nothing to launch: the call has nothing to compute\n");
    return 0;
  }
  std::vector<Row> rows;
  for (const PlannedLaunch& launch : plan.launches) rows.push_back(launch_row(launch));
  print_table({{"launch"}, {"spec"}, {"grid", true}, {"threads", true}, {"smem bytes", true}, {"splits", true},
               {"workspace bytes", true}},
              rows);
  return 0;
}

int source(const Config& config, const std::string& spec_text) {
  const KernelSpec spec = KernelSpec::parse(spec_text);
  const std::string text = detail::render(spec, detail::TemplateSet(config.template_dir));
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace jitattn::cli
