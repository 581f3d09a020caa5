// What the stages that check a call's arguments (plan, merge) share: a
// rejection is an Error with ErrorCode::invalid_argument whose message names
// the argument and the rule (DESIGN.md, Errors), thrown before any launch.
#pragma once

#include <jitattn/jitattn.hpp>

#include <string>

namespace jitattn::detail {

[[noreturn]] inline void reject(const std::string& message) { throw Error(ErrorCode::invalid_argument, message); }

// A tensor's shape as "[2, 128, 8, 64]", for messages.
std::string shape_text(const TensorView& t);

}  // namespace jitattn::detail
