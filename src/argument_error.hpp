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

// `t` with the strides of its dimensions of extent 0 or 1 replaced by the
// packed value (the next dimension's extent × stride; 1 for the last). Such a
// dimension is never stepped, and frameworks leave any stride there: PyTorch
// keeps a sliced or unsqueezed dimension's old stride, or 1. The rules on
// strides (16-byte rows) and the tensor maps then see only strides that
// address memory. Where the product would overflow, the stride is kept (and
// refused by those rules if it breaks them).
TensorView settled_strides(const TensorView& t);

}  // namespace jitattn::detail
