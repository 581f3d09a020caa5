#include "log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace jitattn::detail {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::warn)};
std::mutex g_write_mutex;
const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
    default: return "";
  }
}
}  // namespace

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

void log_write(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(g_write_mutex);
  std::fprintf(stderr, "[jitattn %s] %s\n", level_name(level), message.c_str());
}

LogLevel parse_log_level(const std::string& text) {
  if (text == "off" || text == "0") return LogLevel::off;
  if (text == "error" || text == "1") return LogLevel::error;
  if (text == "warn" || text == "warning" || text == "2") return LogLevel::warn;
  if (text == "info" || text == "3") return LogLevel::info;
  if (text == "debug" || text == "4") return LogLevel::debug;
  throw Error(ErrorCode::invalid_argument,
              fmt::format("JITATTN_LOG: '{}' is not one of off, error, warn, info, debug", text));
}

}  // namespace jitattn::detail
