#include <jitattn/jitattn.hpp>

namespace jitattn {

Error::Error(ErrorCode code, const std::string& message, std::string spec, std::string log)
    : std::runtime_error(message), code_(code), spec_(std::move(spec)), log_(std::move(log)) {}

}  // namespace jitattn
