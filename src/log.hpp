// Leveled logging to stderr (JITATTN_LOG). One process-wide level.
#pragma once

#include <fmt/format.h>

#include <jitattn/jitattn.hpp>

namespace jitattn::detail {

void set_log_level(LogLevel level);
LogLevel log_level();
void log_write(LogLevel level, const std::string& message);
LogLevel parse_log_level(const std::string& text);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (static_cast<int>(level) <= static_cast<int>(log_level())) {
    log_write(level, fmt::format(format, std::forward<Args>(args)...));
  }
}

}  // namespace jitattn::detail
