#!/usr/bin/env bash
# The checks only a CUDA GPU can run, in one call (docs/vllm.md, "On a real GPU").
#
#   scripts/gpu-check.sh --fetch-wheels   # here, with PyPI: the pure-Python needs a bare CUDA image
#                                         # lacks (pydantic, msgspec, ...) as Python 3.12 x86-64 wheels in .whl/
#   scripts/gpu-check.sh [OUTDIR [STEP...]]  # on the GPU machine, from the repository root: installs .whl/
#                                         # (if present) into a private folder, then runs, each bounded
#                                         # (all four: up to 870 s; name STEPs to split them over calls):
#     kernels   python -m dynlogits.testing.cuda.check --kernels-only   every kind's fused kernels against eager
#     compiles  python -m dynlogits.testing.cuda.compile_check          no step compiles a kernel
#     apply     python -m dynlogits.testing.cuda.check                  the apply path: syncs, copies, failures, cost
#     micro     python -m dynlogits.tools.bench micro --device cuda     batch 1/64/256, vocab 151936
#   Each step's output goes to OUTDIR (default ./gpu-check-out) as <step>.log (+ .json); the exit
#   status is the number of steps that failed. A step's failure does not stop the next.
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 msgspec==0.22.0)

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}" || exit 1
    echo "[gpu-check] wheels in .whl/ ($(ls .whl | wc -l) files): carry .whl to the GPU machine"
    exit 0
fi

OUT_DIR="${1:-gpu-check-out}"
shift $(( $# > 0 ? 1 : 0 ))
ONLY=" $* "  # the steps named after OUTDIR; none: every step
mkdir -p "$OUT_DIR"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dynlogits-site .whl/*.whl \
        || { echo "[gpu-check] installing .whl/ failed"; exit 1; }
    export PYTHONPATH="/tmp/dynlogits-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("[gpu-check] torch", torch.__version__, "triton", triton.__version__,
      "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))' | tee "$OUT_DIR/versions.log"

failed=0
step() {  # step NAME SECONDS COMMAND...
    local name=$1 seconds=$2
    shift 2
    [[ "$ONLY" == "  " || "$ONLY" == *" $name "* ]] || return 0
    echo "[gpu-check] $name: $* (at most ${seconds}s)"
    local start=$SECONDS
    timeout "$seconds" "$@" > "$OUT_DIR/$name.log" 2>&1
    local rc=$?
    echo "[gpu-check] $name: exit $rc in $((SECONDS - start))s; last lines:"
    tail -n 15 "$OUT_DIR/$name.log"
    [[ $rc -eq 0 ]] || failed=$((failed + 1))
}
step kernels 180 python3 -m dynlogits.testing.cuda.check --kernels-only --json "$OUT_DIR/kernels.json"
step compiles 150 python3 -m dynlogits.testing.cuda.compile_check --json "$OUT_DIR/compiles.json"
step apply 240 python3 -m dynlogits.testing.cuda.check --json "$OUT_DIR/apply.json"
step micro 300 python3 -m dynlogits.tools.bench micro --device cuda --batches 1,64,256 --vocabs 151936 --repeats 5 \
    --json "$OUT_DIR/micro_cuda.json"
echo "[gpu-check] $failed step(s) failed; outputs in $OUT_DIR"
exit "$failed"
