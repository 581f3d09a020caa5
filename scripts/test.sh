#!/usr/bin/env bash
# The whole test suite: CPU suites everywhere; the GPU suite runs where a GPU
# is usable and is reported as skipped, with the reason, elsewhere.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
ctest --test-dir build --output-on-failure
