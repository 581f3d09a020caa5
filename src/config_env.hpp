// Config::from_env()'s reading of the environment, one setting at a time, so
// that a caller who gives a setting (jitattn_configure) has its variable left
// unread: an invalid JITATTN_LOG cannot fail a call that names its level, and
// a given cache directory is not warned about when none is set.
#pragma once

#include <optional>
#include <string>

#include <jitattn/jitattn.hpp>

namespace jitattn::detail {

// JITATTN_CACHE_DIR, else $XDG_CACHE_HOME/jitattn (absolute only), else
// $HOME/.cache/jitattn; else "" (no disk cache), with a warning.
std::string env_cache_dir();
// JITATTN_TEMPLATE_DIR, else "" (the embedded templates).
std::string env_template_dir();
// JITATTN_LOG's level, nullopt when unset; throws invalid_argument when it
// names none.
std::optional<LogLevel> env_log_level();
// JITATTN_PROGRAMMATIC_LAUNCH ("0": off), else `fallback`.
bool env_programmatic_launch(bool fallback);

}  // namespace jitattn::detail
