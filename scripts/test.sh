#!/usr/bin/env bash
# The whole test suite, from a fresh machine: sets up .venv, then runs pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k specs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
exec .venv/bin/pytest "$@"
