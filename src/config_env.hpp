// Config::from_env()'s reading of the environment, with settings a caller
// gives itself (jitattn_configure) left unread: an invalid JITATTN_LOG cannot
// fail a call that names its level, and a given cache directory is not
// warned about when none is set.
#pragma once

#include <optional>

#include <jitattn/jitattn.hpp>

namespace jitattn::detail {

// Settings given by the caller; null or nullopt: from the environment.
struct GivenSettings {
  const char* cache_dir = nullptr;
  const char* template_dir = nullptr;
  std::optional<LogLevel> log_level;
};

// Config::from_env() (its variables and defaults: jitattn.hpp) with the
// given settings taken as they are.
Config config_from_env(const GivenSettings& given = {});

}  // namespace jitattn::detail
