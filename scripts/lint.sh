#!/usr/bin/env bash
# Lint and type-check the library (specs/, dynlogits/, adapters/): ruff, then mypy (pyproject.toml
# holds both configurations). Run by scripts/test.sh before the tests, so by make test and test-fast.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "lint: ruff check specs dynlogits adapters" >&2
.venv/bin/ruff check specs dynlogits adapters
echo "lint: mypy specs dynlogits adapters (cached in .mypy_cache)" >&2
.venv/bin/mypy
