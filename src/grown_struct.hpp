// grown_struct: reading a C API struct that grows at its end (jitattn.h's "Structs that grow").
//
// The caller's struct starts with uint32_t struct_size, the sizeof it was compiled with. The library copies
// the bytes both sides know over its defaults, so an older caller's missing fields take their defaults, and
// accepts the bytes only a newer caller knows while they are 0 (off). Nothing past struct_size is read.
// A new field starts at or past the previous header's sizeof, never in its tail padding: the bytes between
// this library's last field and its sizeof are padding a caller of the same header may leave unset.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include <jitattn/jitattn.hpp>

namespace jitattn::capi {

// What the library knows of one growing struct.
struct GrownLayout {
  const char* type;          // "jitattn_fwd_options"
  const char* init;          // "jitattn_fwd_options_init"
  std::size_t first_size;    // the sizeof the first header with struct_size had: the smallest size accepted
  std::size_t known_end;     // where this library's last field ends; bytes past it are fields it does not know
  std::size_t alignment;     // alignof the struct: every sizeof is a multiple of it
};

// No header's struct is near this size: a struct_size above it is garbage (a struct never initialized), and
// reading that many of the caller's bytes could fault.
constexpr std::size_t kMaxGrownStructBytes = 4096;

// `given` copied over `defaults` as described above; `name` names the argument in errors.
template <typename Struct>
Struct read_grown(const Struct& given, const Struct& defaults, const GrownLayout& layout, const char* name) {
  static_assert(offsetof(Struct, struct_size) == 0, "a growing struct starts with its struct_size");
  const std::size_t size = given.struct_size;
  if (size == 0) {
    throw Error(ErrorCode::invalid_argument,
                fmt::format("{}.struct_size is 0: initialize the {} with {}(), which sets struct_size to its sizeof",
                            name, layout.type, layout.init));
  }
  if (size > kMaxGrownStructBytes) {
    throw Error(ErrorCode::invalid_argument,
                fmt::format("{}.struct_size={} is larger than any {} (at most {} bytes): the struct was not "
                            "initialized; initialize it with {}()",
                            name, size, layout.type, kMaxGrownStructBytes, layout.init));
  }
  if (size < layout.first_size || size % layout.alignment != 0) {
    throw Error(ErrorCode::invalid_argument,
                fmt::format("{}.struct_size={} is not the size of any {}: it must be a multiple of {} and at least "
                            "{} (this library's is {}); initialize it with {}()",
                            name, size, layout.type, layout.alignment, layout.first_size, sizeof(Struct),
                            layout.init));
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(&given);
  // From this library's sizeof: the bytes before it and past its last field are its own tail padding, which
  // a caller of this header need not have zeroed (a designated initializer on a dirty stack leaves it set).
  for (std::size_t offset = std::max(layout.known_end, sizeof(Struct)); offset < size; ++offset) {
    if (bytes[offset] != 0) {
      throw Error(ErrorCode::unsupported,
                  fmt::format("{}: byte {} of the caller's {} ({} bytes, from a newer jitattn.h) is set, in a field "
                              "this library (jitattn {}, which knows {} bytes) does not have; leave that field at 0 or "
                              "link a newer library",
                              name, offset, layout.type, size, version(), layout.known_end));
    }
  }
  Struct known = defaults;
  std::memcpy(&known, &given, size < sizeof(Struct) ? size : sizeof(Struct));
  known.struct_size = static_cast<std::uint32_t>(sizeof(Struct));
  return known;
}

// Writes `defaults` into the first `size` bytes of `out` (0 past the library's struct) and sets its struct_size;
// sizes too small to hold struct_size are left alone (read_grown rejects them).
template <typename Struct>
void write_grown(Struct* out, std::size_t size, const Struct& defaults) {
  if (out == nullptr || size < sizeof(std::uint32_t)) return;
  auto* bytes = reinterpret_cast<unsigned char*>(out);
  const std::size_t known = size < sizeof(Struct) ? size : sizeof(Struct);
  std::memcpy(bytes, &defaults, known);
  if (size > known) std::memset(bytes + known, 0, size - known);
  const auto struct_size = static_cast<std::uint32_t>(size);
  std::memcpy(bytes, &struct_size, sizeof struct_size);
}

}  // namespace jitattn::capi
