# shellcheck shell=bash
# Shared helpers of launch/agg.sh and launch/disagg.sh (sourced, not run).
#
# Every child runs in its own process group (setsid); on exit, Ctrl-C or SIGTERM the
# script sends SIGTERM to each child (graceful: in-flight requests finish or are
# aborted), waits, then SIGKILLs whatever is left in each group (e.g. an engine core
# whose worker died), so no process outlives the script. A watchdog in a session of its own
# does the same if the script dies without running its traps (SIGKILL, e.g. a supervisor
# killing the script's process group).
#
# The worker ports are for the frontend only: workers bind --worker-host (default 127.0.0.1, whatever
# --host says), and every worker route but /health needs the deployment's secret, DYN_WORKER_SECRET,
# which the script generates (unless set) and passes to the frontend and the workers through the
# environment (never a command line, which other local users can read).
#
# Supervision: while serving, a worker that exits (its engine died: the worker exits with status 3,
# or it was killed) is started again with the same command after a backoff of 1, 2, 4, ... s (at
# most 30 s); after DYN_WORKER_RESTARTS restarts in a row (default 5; a worker that stayed up for
# DYN_WORKER_STABLE_S seconds, default 300, starts a new row) the script gives up and stops the
# deployment with a clear message. --no-restart (or DYN_WORKER_RESTARTS=0) turns this off.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY="${PYTHON:-python3}"; fi
READY_TIMEOUT="${DYN_READY_TIMEOUT:-300}"   # seconds to wait for every child to be ready
STOP_TIMEOUT="${DYN_STOP_TIMEOUT:-20}"      # seconds a child gets to exit after SIGTERM
WORKER_RESTARTS="${DYN_WORKER_RESTARTS:-5}" # restarts of a worker in a row before giving up; 0: none
WORKER_STABLE_S="${DYN_WORKER_STABLE_S:-300}" # a worker up this long starts a new row of restarts

# CPU-friendly engine settings unless a GPU is present; DYN_ENGINE_DEFAULTS="" disables them.
# Flags given on the command line come later and win.
if [[ -z "${DYN_ENGINE_DEFAULTS+x}" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1; then DYN_ENGINE_DEFAULTS=""
  else
    DYN_ENGINE_DEFAULTS="--dtype float32 --enforce-eager --gpu-memory-utilization 0.2 --max-model-len 512"
    export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
    # vLLM's CPU build pins its model runner to a core it then keeps busy (it polls its message
    # queue); on a small machine the frontend, worker and engine core then share what is left, and
    # a streaming response's headers waited for the CPU until the engine finished the request.
    export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}"
  fi
fi
read -r -a ENGINE_DEFAULTS <<<"$DYN_ENGINE_DEFAULTS"

CHILD_PIDS=()
CHILD_NAMES=()
CHILD_CMDS=()   # each child's command, shell-quoted, to start it again
WATCHDOG_PID=""
WATCHDOG_FILE=""

log() { printf 'dynlogits: %s\n' "$*" >&2; }

# start_child NAME CMD... : run CMD in a new process group, output prefixed with [NAME]. Environment
# a child needs must be part of CMD (`env VAR=value cmd ...`), so that a restart has it too.
start_child() {
  local name="$1"; shift
  CHILD_NAMES+=("$name")
  CHILD_CMDS+=("$(printf '%q ' "$@")")
  CHILD_PIDS+=("")
  spawn_child $((${#CHILD_PIDS[@]} - 1))
}

# spawn_child INDEX : (re)start child INDEX from its recorded command.
spawn_child() {
  local i="$1" name="${CHILD_NAMES[$1]}" pid
  local -a cmd
  eval "cmd=(${CHILD_CMDS[i]})"
  # setsid itself in the background (not a subshell around it), so that $! is the child's own pid,
  # which is also its process group (what the watchdog, the supervision and stop_children signal).
  setsid "${cmd[@]}" > >(exec sed -u "s/^/[$name] /") 2>&1 &
  pid=$!
  CHILD_PIDS[i]="$pid"
  log "started $name (pid $pid)"
  watch_group "$pid"
}

# watch_group PGID : have the watchdog end this process group if the script dies without running
# its traps. The watchdog is started once, in a session of its own, and reads the groups from
# WATCHDOG_FILE; stop_children removes the file, so after a normal stop it ends nothing.
watch_group() {
  if [[ -z "$WATCHDOG_FILE" ]]; then
    WATCHDOG_FILE=$(mktemp "${TMPDIR:-/tmp}/dynlogits-launch.XXXXXX")
    (
      trap - EXIT INT TERM HUP   # not this script's traps, even before the exec
      exec setsid bash -c '
        script=$1 stop=$2 file=$3
        while kill -0 "$script" 2>/dev/null; do sleep 1; done
        [[ -f "$file" ]] || exit 0
        mapfile -t groups < "$file"
        rm -f "$file"
        for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null; done
        deadline=$((SECONDS + stop))
        for g in "${groups[@]}"; do
          while kill -0 -- "-$g" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        done
        for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
      ' watchdog "$$" "$STOP_TIMEOUT" "$WATCHDOG_FILE" </dev/null >/dev/null 2>&1
    ) &
    WATCHDOG_PID=$!
  fi
  echo "$1" >> "$WATCHDOG_FILE"
}

stop_children() {
  local i pid deadline
  trap - EXIT INT TERM HUP
  [[ -n "$WATCHDOG_FILE" ]] && rm -f "$WATCHDOG_FILE"   # the watchdog then exits, ending nothing
  [[ -n "$WATCHDOG_PID" ]] && { kill -- "-$WATCHDOG_PID" 2>/dev/null || true; }   # with its sleep
  for ((i = ${#CHILD_PIDS[@]} - 1; i >= 0; i--)); do
    kill -TERM "${CHILD_PIDS[i]}" 2>/dev/null || true
  done
  deadline=$((SECONDS + STOP_TIMEOUT))
  for pid in "${CHILD_PIDS[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  done
  for ((i = 0; i < ${#CHILD_PIDS[@]}; i++)); do
    pid="${CHILD_PIDS[i]}"
    if kill -0 "$pid" 2>/dev/null; then log "${CHILD_NAMES[i]} did not stop in ${STOP_TIMEOUT}s; killing it"; fi
    kill -KILL -- "-$pid" 2>/dev/null || true   # the whole group, leftovers included
  done
  wait 2>/dev/null || true
  log "stopped"
}

install_traps() {
  trap stop_children EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP   # the terminal went away
}

# require_free_ports HOST PORT... : fail before starting anything when a port is already taken.
require_free_ports() {
  local host="$1" p
  shift
  [[ "$host" == 0.0.0.0 || "$host" == "::" ]] && host=127.0.0.1
  for p in "$@"; do
    if (exec 3<>"/dev/tcp/$host/$p") 2>/dev/null; then
      log "port $p on $host is already in use; pick another base with --port"
      exit 1
    fi
  done
}

# worker_secret : DYN_WORKER_SECRET, generated (32 random bytes) unless the operator set one, exported
# so that the frontend and every worker (restarts included) inherit it.
worker_secret() {
  if [[ -z "${DYN_WORKER_SECRET:-}" ]]; then
    DYN_WORKER_SECRET=$("$PY" -c 'import secrets; print(secrets.token_urlsafe(32))')
  fi
  export DYN_WORKER_SECRET
}

# child_alive INDEX
child_alive() { kill -0 "${CHILD_PIDS[$1]}" 2>/dev/null; }

# wait_ready URL NAME INDEX : poll URL until HTTP 200; fail if the child dies or time runs out. The worker
# secret goes in curl's config on stdin, not on its command line.
wait_ready() {
  local url="$1" name="$2" idx="$3" start=$SECONDS next=10
  until curl -sf -o /dev/null --max-time 2 -K - "$url" <<<"header = \"Authorization: Bearer ${DYN_WORKER_SECRET:-}\""; do
    if ! child_alive "$idx"; then log "$name exited before it was ready"; return 1; fi
    if ((SECONDS - start >= READY_TIMEOUT)); then log "$name not ready after ${READY_TIMEOUT}s ($url)"; return 1; fi
    if ((SECONDS - start >= next)); then log "waiting for $name ($((SECONDS - start))s)..."; next=$((next + 10)); fi
    sleep 1 & wait $!
  done
  log "$name ready ($((SECONDS - start))s)"
}

# serve_until_done FRONTEND_URL RUN_CMD : run RUN_CMD and return its status, or serve until the
# frontend exits, supervising the workers (see the top of this file); the frontend answers 503 with
# Retry-After while no worker is ready and picks a restarted worker up by itself.
serve_until_done() {
  local url="$1" run="$2" i status backoff
  local -A due=() tries=() up_since=() reported=()
  if [[ -n "$run" ]]; then
    DYN_FRONTEND_URL="$url" OPENAI_BASE_URL="$url" bash -c "$run"
    return $?
  fi
  log "press Ctrl-C to stop"
  while child_alive 0; do
    for ((i = 1; i < ${#CHILD_PIDS[@]}; i++)); do
      if [[ -n "${due[$i]:-}" ]]; then
        if ((SECONDS >= due[$i])); then
          unset "due[$i]"
          tries[$i]=$((${tries[$i]:-0} + 1))
          spawn_child "$i"
          up_since[$i]=$SECONDS
        fi
      elif child_alive "$i"; then
        if ((${tries[$i]:-0} > 0 && SECONDS - ${up_since[$i]:-0} >= WORKER_STABLE_S)); then tries[$i]=0; fi
      elif [[ -z "${reported[$i]:-}" ]]; then
        status=0; wait "${CHILD_PIDS[i]}" 2>/dev/null || status=$?
        # A worker gone alone leaves its engine processes running (vLLM's engine core does not
        # watch its parent): end the rest of its process group so they do not hold the memory.
        kill -KILL -- "-${CHILD_PIDS[i]}" 2>/dev/null || true
        if ((WORKER_RESTARTS <= 0)); then
          reported[$i]=1
          log "${CHILD_NAMES[i]} exited (status $status; its leftover engine processes were stopped); restarts are" \
              "off, so the frontend answers 503 until a worker is back on its port"
        elif ((${tries[$i]:-0} >= WORKER_RESTARTS)); then
          log "${CHILD_NAMES[i]} exited (status $status) after $WORKER_RESTARTS restarts in a row; giving up:" \
              "it fails again each time it starts (see its log lines above). Stopping the deployment."
          return 1
        else
          backoff=$((1 << ${tries[$i]:-0})); ((backoff > 30)) && backoff=30
          due[$i]=$((SECONDS + backoff))
          log "${CHILD_NAMES[i]} exited (status $status; its leftover engine processes were stopped); restarting it" \
              "in ${backoff}s (restart $((${tries[$i]:-0} + 1)) of at most $WORKER_RESTARTS in a row)"
        fi
      fi
    done
    sleep 1 & wait $!
  done
  log "frontend exited"
  return 1
}

usage_common() {
  cat <<USAGE
  --model PATH_OR_NAME      model (default: the embedded tiny model, built on first use)
  --host HOST               the frontend's bind address (default 127.0.0.1)
  --port PORT               frontend port (default 8000); workers use the next ports
  --worker-host HOST        the workers' bind address (default \$DYN_WORKER_HOST, else 127.0.0.1: their ports
                            are for the frontend only; each answers 401 without the deployment's DYN_WORKER_SECRET)
  --api-key-file FILE       API keys (one per line) clients must send as 'Authorization: Bearer KEY'
                            (the openai client's api_key); each key gets its own share of the engine
  --logits-spec FILE        operator logits config (YAML/JSON), given to frontend and workers
  --allow-request-kinds K   comma-separated kinds clients may send in 'logits_processors'
  --run CMD                 once ready, run CMD (with \$DYN_FRONTEND_URL / \$OPENAI_BASE_URL set), then stop
  --runtime embedded|dynamo embedded (default): dynlogits' own frontend and worker; dynamo: NVIDIA Dynamo's
                            dynamo.frontend + dynamo.vllm workers with the adapter (docs/dynamo.md)
  --workers N               with --runtime dynamo (agg): start N vLLM workers (default 1)
  --no-restart              do not restart a worker that exits (default: restart with backoff)
  anything else             passed to the engine of every worker (e.g. --max-model-len 1024)
Environment: DYN_ENABLE_TEST_LOGITS_PROCESSOR=1 forces "Hello world!"; DYN_LOGITS_SPEC=FILE;
DYN_WORKER_SECRET (the frontend-to-worker secret; generated per deployment when unset);
DYN_API_KEY / DYN_API_KEY_FILE, DYN_TRUSTED_PROXIES and every DYN_ limit (docs/reliability.md);
DYN_READY_TIMEOUT (s, default 300); DYN_ENGINE_DEFAULTS (engine flags used before yours;
CPU-friendly settings when no GPU is found); DYN_WORKER_RESTARTS (restarts in a row before giving
up, default 5; 0 = --no-restart); DYN_WORKER_STABLE_S (s up that start a new row, default 300).
USAGE
}

# parse_common_args "$@" : sets MODEL HOST WORKER_HOST WORKER_URL_HOST PORT LOGITS_SPEC ALLOW_KINDS
# RUN_CMD RUNTIME WORKERS ENGINE_ARGS FRONTEND_ARGS
parse_common_args() {
  MODEL="" HOST="127.0.0.1" WORKER_HOST="${DYN_WORKER_HOST:-127.0.0.1}" PORT=8000 LOGITS_SPEC="" ALLOW_KINDS=""
  RUN_CMD="" RUNTIME="embedded" WORKERS=1 API_KEY_FILE=""
  ENGINE_ARGS=()
  while (($#)); do
    case "$1" in
      --model) MODEL="$2"; shift 2 ;;
      --host) HOST="$2"; shift 2 ;;
      --worker-host) WORKER_HOST="$2"; shift 2 ;;
      --api-key-file) API_KEY_FILE="$2"; shift 2 ;;
      --port) PORT="$2"; shift 2 ;;
      --logits-spec) LOGITS_SPEC="$2"; shift 2 ;;
      --allow-request-kinds) ALLOW_KINDS="$2"; shift 2 ;;
      --run) RUN_CMD="$2"; shift 2 ;;
      --runtime) RUNTIME="$2"; shift 2 ;;
      --workers) WORKERS="$2"; shift 2 ;;
      --no-restart) WORKER_RESTARTS=0; shift ;;
      -h|--help) usage; exit 0 ;;
      --) shift; ENGINE_ARGS+=("$@"); break ;;
      *) ENGINE_ARGS+=("$1"); shift ;;
    esac
  done
  case "$RUNTIME" in
    embedded) [[ "$WORKERS" == 1 ]] || { log "--workers needs --runtime dynamo"; exit 2; } ;;
    dynamo) source "$ROOT/launch/dynamo.sh" ;;
    *) log "--runtime must be 'embedded' or 'dynamo', got '$RUNTIME'"; exit 2 ;;
  esac
  SHARED_ARGS=()
  [[ -n "$LOGITS_SPEC" ]] && SHARED_ARGS+=(--logits-spec "$LOGITS_SPEC")
  [[ -n "$ALLOW_KINDS" ]] && SHARED_ARGS+=(--allow-request-kinds "$ALLOW_KINDS")
  MODEL_ARGS=()
  [[ -n "$MODEL" ]] && MODEL_ARGS+=(--model "$MODEL")
  FRONTEND_ARGS=()
  [[ -n "$API_KEY_FILE" ]] && FRONTEND_ARGS+=(--api-key-file "$API_KEY_FILE")
  # where the frontend reaches a worker bound to every address: this machine's loopback
  case "$WORKER_HOST" in 0.0.0.0|::|"") WORKER_URL_HOST=127.0.0.1 ;; *) WORKER_URL_HOST="$WORKER_HOST" ;; esac
  [[ "$WORKER_URL_HOST" == *:* ]] && WORKER_URL_HOST="[$WORKER_URL_HOST]"
  return 0
}
