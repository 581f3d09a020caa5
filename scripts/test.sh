#!/usr/bin/env bash
# The whole test suite: CPU suites everywhere; the GPU suite runs where a GPU
# is usable and is reported as skipped, with the reason, elsewhere.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
status=0
ctest --test-dir build --output-on-failure || status=$?
# ctest shows nothing of a skipped test: say why the GPU suite did not run.
reason=$(./build/tests/jitattn_gpu_tests --list-test-cases 2>&1 | grep "GPU tests skipped" || true)
[[ -z $reason ]] || echo "$reason"
exit $status
