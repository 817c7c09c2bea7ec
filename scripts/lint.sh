#!/usr/bin/env bash
# Lint the library and its tests (ruff: specs/, dynlogits/, adapters/, tests/), then type-check the
# library (mypy); pyproject.toml holds both configurations. Run by scripts/test.sh before the tests,
# so by make test and test-fast.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "lint: ruff check specs dynlogits adapters tests" >&2
.venv/bin/ruff check specs dynlogits adapters tests
echo "lint: mypy specs dynlogits adapters (cached in .mypy_cache)" >&2
.venv/bin/mypy
