#!/usr/bin/env bash
# The whole test suite, from a fresh machine: sets up .venv, lints and type-checks the library
# (scripts/lint.sh: ruff, mypy), then runs pytest. Extra arguments go to pytest (e.g.
# scripts/test.sh -k specs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh
scripts/lint.sh
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
# As launch/common.sh sets for CPU deployments, also for the workers tests start themselves.
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}
exec .venv/bin/pytest "$@"
