#!/usr/bin/env bash
# Aggregated deployment: one OpenAI-compatible frontend + one agg worker (vLLM).
#   DYN_ENABLE_TEST_LOGITS_PROCESSOR=1 ./launch/agg.sh     # every answer is "Hello world!"
#   ./launch/agg.sh --port 8000 --allow-request-kinds forced_text,banned_tokens
#   ./launch/agg.sh --runtime dynamo --workers 2           # NVIDIA Dynamo frontend + 2 dynamo.vllm workers
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  echo "usage: launch/agg.sh [options] [engine args]"
  usage_common
}

parse_common_args "$@"
if [[ "$RUNTIME" == dynamo ]]; then dynamo_agg; exit; fi   # launch/dynamo.sh
WORKER_PORT=$((PORT + 1))
require_free_ports "$HOST" "$PORT"
require_free_ports "$WORKER_HOST" "$WORKER_PORT"
worker_secret
install_traps

start_child frontend "$PY" -m dynlogits.serve.frontend --host "$HOST" --port "$PORT" \
  --agg-worker "http://$WORKER_URL_HOST:$WORKER_PORT" "${SHARED_ARGS[@]}" "${FRONTEND_ARGS[@]}"
start_child worker "$PY" -m dynlogits.serve.worker --disaggregation-mode agg --host "$WORKER_HOST" --port "$WORKER_PORT" \
  "${MODEL_ARGS[@]}" "${SHARED_ARGS[@]}" "${ENGINE_DEFAULTS[@]}" "${ENGINE_ARGS[@]}"

wait_ready "http://$WORKER_URL_HOST:$WORKER_PORT/ready" worker 1
wait_ready "http://$HOST:$PORT/health" frontend 0
URL="http://$HOST:$PORT/v1"
log "ready: OpenAI-compatible API at $URL"
echo "$URL"
serve_until_done "$URL" "$RUN_CMD"
