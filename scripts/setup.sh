#!/usr/bin/env bash
# Installs what is missing (Debian packages), then configures and builds into
# build/. Sourced or run by scripts/main.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# header or tool → the Debian package that provides it
declare -A needs=(
  [/usr/include/fmt/format.h]=libfmt-dev
  [/usr/include/doctest/doctest.h]=doctest-dev
  [/usr/include/CLI/CLI.hpp]=libcli11-dev
  [/usr/include/nlohmann/json.hpp]=nlohmann-json3-dev
  [/usr/include/xxhash.h]=libxxhash-dev
)
missing=()
for path in "${!needs[@]}"; do [[ -e $path ]] || missing+=("${needs[$path]}"); done
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v g++ >/dev/null || missing+=(g++)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [[ $(id -u) -eq 0 ]] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [[ ! -e $cuda_home/include/cuda.h || ! -e $cuda_home/include/nvrtc.h ]]; then
  echo "setup: the CUDA toolkit headers (cuda.h, nvrtc.h) were not found under $cuda_home;" >&2
  echo "       set CUDA_HOME to the toolkit (only headers are needed to build; libnvrtc at run time)" >&2
  exit 1
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
