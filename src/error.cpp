#include <fmt/format.h>
#include <jitattn/jitattn.hpp>

#include "argument_error.hpp"

namespace jitattn {

Error::Error(ErrorCode code, const std::string& message, std::string spec, std::string log)
    : std::runtime_error(message), code_(code), spec_(std::move(spec)), log_(std::move(log)) {}

namespace detail {

std::string shape_text(const TensorView& t) {
  // (A view has at most 4 dimensions: a larger ndim is named, not read past.)
  if (t.ndim < 0 || t.ndim > 4) return fmt::format("of ndim={} (at most 4 dimensions)", t.ndim);
  std::string text = "[";
  for (int i = 0; i < t.ndim; ++i) text += fmt::format("{}{}", i ? ", " : "", t.shape[i]);
  return text + "]";
}

TensorView settled_strides(const TensorView& t) {
  TensorView settled = t;
  if (t.ndim < 1 || t.ndim > 4) return settled;  // refused by the rules that follow
  for (int axis = t.ndim - 1; axis >= 0; --axis) {
    if (t.shape[axis] > 1) continue;
    if (axis == t.ndim - 1) {
      settled.strides[axis] = 1;
    } else if (int64_t packed = 0;
               !__builtin_mul_overflow(settled.shape[axis + 1], settled.strides[axis + 1], &packed)) {
      settled.strides[axis] = packed;
    }
  }
  return settled;
}

}  // namespace detail
}  // namespace jitattn
