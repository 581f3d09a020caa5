#include <fmt/format.h>
#include <jitattn/jitattn.hpp>

#include "argument_error.hpp"

namespace jitattn {

Error::Error(ErrorCode code, const std::string& message, std::string spec, std::string log)
    : std::runtime_error(message), code_(code), spec_(std::move(spec)), log_(std::move(log)) {}

namespace detail {

std::string shape_text(const TensorView& t) {
  std::string text = "[";
  for (int i = 0; i < t.ndim; ++i) text += fmt::format("{}{}", i ? ", " : "", t.shape[i]);
  return text + "]";
}

}  // namespace detail
}  // namespace jitattn
