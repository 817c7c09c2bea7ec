# shellcheck shell=bash
# The NVIDIA Dynamo runtime of launch/agg.sh and launch/disagg.sh (`--runtime dynamo`; sourced
# after common.sh, not run): `python -m dynamo.frontend` plus `python -m dynamo.vllm` workers that
# load the dynlogits vLLM adapter, with the engine as the spec source (DYN_LOGITS_SPEC_SOURCE=engine,
# see docs/dynamo.md). No etcd, no NATS: file discovery in a private temporary folder (removed on
# exit), TCP request plane, ZMQ event plane, every address on --host.
#
# Ports: the frontend's HTTP on --port P; worker i's Dynamo system server (/health, /metrics) on
# P+i when that is at most 32767.

DYNAMO_ADAPTER="dynlogits.adapters.vllm:DynamoVllmLogitsProcessor"
DYNAMO_SHIMS="$ROOT/launch/dynamo_cpu_shims"   # CPU-only import shims; no-ops on CUDA installs

dynamo_require_installed() {
  if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("dynamo.frontend") and u.find_spec("dynamo.vllm")))' 2>/dev/null; then
    log "--runtime dynamo needs ai-dynamo 1.6.1 in $PY; run scripts/setup-env.sh (it installs it with --no-deps)"
    exit 1
  fi
}

# dynamo_prepare : checks, environment, the model; sets DYN_MODEL DYN_SERVED_NAME DYN_KV_DIR.
dynamo_prepare() {
  if [[ -n "$ALLOW_KINDS" ]]; then
    log "--allow-request-kinds: with --runtime dynamo put allow_request_kinds in the --logits-spec file (the engine reads only that)"
    exit 2
  fi
  if ! [[ "$WORKERS" =~ ^[1-9][0-9]*$ ]]; then log "--workers must be a positive integer, got '$WORKERS'"; exit 2; fi
  dynamo_require_installed
  if [[ -n "$LOGITS_SPEC" ]]; then
    [[ -r "$LOGITS_SPEC" ]] || { log "--logits-spec $LOGITS_SPEC: cannot read it"; exit 2; }
    export DYN_LOGITS_SPEC; DYN_LOGITS_SPEC="$(cd "$(dirname "$LOGITS_SPEC")" && pwd)/$(basename "$LOGITS_SPEC")"
  fi
  if [[ -n "$MODEL" ]]; then DYN_MODEL="$MODEL" DYN_SERVED_NAME="$MODEL"
  else
    log "building the embedded model (first use only)"
    DYN_MODEL="$("$PY" -c 'from dynlogits.model_builder import default_model_dir; print(default_model_dir())')"
    DYN_SERVED_NAME="dynlogits-tiny"
  fi
  DYN_KV_DIR="$(mktemp -d "${TMPDIR:-/tmp}/dynlogits-dynamo.XXXXXX")"
  export DYN_DISCOVERY_BACKEND=file DYN_FILE_KV="$DYN_KV_DIR" DYN_REQUEST_PLANE=tcp DYN_EVENT_PLANE=zmq
  export DYN_TCP_RPC_HOST="$HOST" DYN_TCP_RESPONSE_STREAM_HOST="$HOST" DYN_EVENT_PLANE_HOST="$HOST" VLLM_HOST_IP="$HOST"
  export DYN_NAMESPACE="${DYN_NAMESPACE:-dynlogits}"
  export DYN_LOGITS_SPEC_SOURCE=engine
  export PYTHONPATH="$DYNAMO_SHIMS${PYTHONPATH:+:$PYTHONPATH}"
  trap dynamo_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

dynamo_cleanup() {
  stop_children
  rm -rf "$DYN_KV_DIR"
}

# dynamo_start_frontend : the HTTP frontend; its token-level route /inference/v1/generate is on.
dynamo_start_frontend() {
  start_child frontend env DYN_VLLM_ENABLE_INFERENCE_V1_GENERATE=1 "$PY" -m dynamo.frontend \
    --http-host "$HOST" --http-port "$PORT" --namespace "$DYN_NAMESPACE" --discovery-backend file
}

# dynamo_start_worker NAME SYSTEM_PORT [dynamo.vllm flags...] : one vLLM worker with the adapter.
# Dynamo 1.6.1 parses DYN_SYSTEM_PORT as a signed 16-bit integer (it refuses to start above 32767),
# so above that the worker runs without its system server.
dynamo_start_worker() {
  local name="$1" system_port="$2"; shift 2
  if ((system_port > 32767)); then
    log "$name: no Dynamo system server (/health, /metrics): port $system_port is above 32767, which Dynamo 1.6.1 cannot parse"
    system_port=-1
  fi
  start_child "$name" env DYN_SYSTEM_PORT="$system_port" DYN_SYSTEM_HOST="$HOST" "$PY" -m dynamo.vllm \
    --model "$DYN_MODEL" --served-model-name "$DYN_SERVED_NAME" --namespace "$DYN_NAMESPACE" \
    --discovery-backend file "$@" --logits-processors "$DYNAMO_ADAPTER" "${ENGINE_DEFAULTS[@]}" "${ENGINE_ARGS[@]}"
}

# dynamo_wait_instances N : until the frontend routes to N workers (its /health lists their
# instances); fails as soon as any child exits. Progress every 10 s.
dynamo_wait_instances() {
  local want="$1" start=$SECONDS next=10 have i
  while :; do
    have=$(curl -sf --max-time 2 "http://$HOST:$PORT/health" | "$PY" -c '
import json, sys
doc = json.load(sys.stdin)
print(len({i.get("instance_id") for i in doc.get("instances", []) if i.get("endpoint") == "generate"}))' 2>/dev/null || echo 0)
    if ((have >= want)); then log "frontend routes to $have worker(s) ($((SECONDS - start))s)"; return 0; fi
    for ((i = 0; i < ${#CHILD_PIDS[@]}; i++)); do
      if ! child_alive "$i"; then log "${CHILD_NAMES[i]} exited before it was ready"; return 1; fi
    done
    if ((SECONDS - start >= READY_TIMEOUT)); then log "frontend sees $have of $want worker(s) after ${READY_TIMEOUT}s"; return 1; fi
    if ((SECONDS - start >= next)); then log "waiting for $want worker(s) to serve, $have so far ($((SECONDS - start))s)..."; next=$((next + 10)); fi
    sleep 1 & wait $!
  done
}

# dynamo_serve : readiness, the URL, then --run CMD or wait (as serve_until_done).
dynamo_serve() {
  local workers=$((${#CHILD_PIDS[@]} - 1))
  dynamo_wait_instances "$workers"
  URL="http://$HOST:$PORT/v1"
  log "ready: OpenAI-compatible API at $URL (NVIDIA Dynamo frontend, $workers vLLM worker(s), spec source: engine)"
  echo "$URL"
  serve_until_done "$URL" "$RUN_CMD"
}

# dynamo_agg : launch/agg.sh --runtime dynamo [--workers N]
dynamo_agg() {
  local i ports=("$PORT")
  dynamo_prepare
  for ((i = 1; i <= WORKERS; i++)); do ports+=("$((PORT + i))"); done
  require_free_ports "$HOST" "${ports[@]}"
  dynamo_start_frontend
  for ((i = 1; i <= WORKERS; i++)); do dynamo_start_worker "worker$i" "$((PORT + i))"; done
  dynamo_serve
}

# dynamo_disagg : launch/disagg.sh --runtime dynamo. Dynamo's vLLM prefill worker moves the KV to
# the decode worker with NIXL (NixlConnector), which this CPU build does not have; where 'nixl' is
# installed (GPU machines) it starts a prefill and a decode worker: not tested by this project.
dynamo_disagg() {
  if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("nixl") is None)' 2>/dev/null; then
    log "launch/disagg.sh --runtime dynamo cannot run here: Dynamo's disaggregated vLLM workers move the KV cache from prefill to decode with NIXL (NixlConnector), which needs CUDA and the 'nixl' package (not installed: this machine runs the CPU build of vLLM)."
    log "Use instead: launch/agg.sh --runtime dynamo [--workers N] (Dynamo, aggregated workers), or launch/disagg.sh (embedded runtime: prefill + decode workers, the decode worker recomputes the prompt)."
    exit 3
  fi
  if [[ "$WORKERS" != 1 ]]; then log "--workers: launch/disagg.sh --runtime dynamo starts one prefill and one decode worker"; exit 2; fi
  dynamo_prepare
  require_free_ports "$HOST" "$PORT" "$((PORT + 1))" "$((PORT + 2))"
  dynamo_start_frontend
  dynamo_start_worker prefill "$((PORT + 1))" --disaggregation-mode prefill \
    --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'
  dynamo_start_worker decode "$((PORT + 2))" --disaggregation-mode decode \
    --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'
  dynamo_serve
}
