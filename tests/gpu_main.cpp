// GPU test binary. Without a usable GPU it prints why and exits 77, which
// ctest reports as skipped (never as passed).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "gpu_support.hpp"

int main(int argc, char** argv) {
  std::string why;
  if (!jitattn::test::use_gpu(&why)) {
    std::printf("GPU tests skipped: %s\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
