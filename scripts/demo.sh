#!/usr/bin/env bash
# The main job: the aggregated deployment (launch/agg.sh) on the embedded model with the test
# hook on, one plain chat request through the openai client, its answer printed, then every
# process stopped. Expected answer: Hello world!
# Extra arguments go to launch/agg.sh (e.g. --port 8100, --model /path/to/hf/model).
#
# The terminal shows short progress lines ("[setup] ...", the launch script's "dynlogits: ..." lines,
# "[demo] ...") and the answer. pip's output goes to .venv/setup.log; the frontend's, worker's and
# engine's to a temporary log, removed on success. When something fails, the demo prints that log's
# path and last 40 lines and exits non-zero. Ctrl-C or SIGTERM stops every process it started.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh

LOG=$(mktemp "${TMPDIR:-/tmp}/dynlogits-demo.XXXXXX")
export DYN_DEMO_LOG="$LOG"
# Run once the deployment is ready (by launch/agg.sh, with $OPENAI_BASE_URL set). Its stdout and
# stderr are the log; fd 3 is the demo's stdout, fd 4 its stderr.
# shellcheck disable=SC2016  # expanded by launch/agg.sh's bash -c
RUN='echo "[demo] ready; sending one chat request with the openai client" >&4
answer=$(.venv/bin/python examples/openai_client.py --hello --base-url "$OPENAI_BASE_URL" 2>>"$DYN_DEMO_LOG") || exit
printf "%s\n" "$answer" | sed "s/^/[demo] answer: /" >&3
if [ "$answer" != "Hello world!" ]; then echo "[demo] expected the answer \"Hello world!\"" >&4; exit 1; fi'

echo "[demo] starting launch/agg.sh (a frontend and one vLLM worker, test hook on);" \
     "the engine takes about a minute to start on CPU" >&2
exec 3>&1 4>&2
# The launch script's own lines (its stderr) go to the terminal and the log, the rest to the log.
exec 5> >(trap '' INT TERM HUP; exec tee -a "$LOG" >&2)
tee_pid=$!
# In a process group of its own (set -m), so that Ctrl-C reaches it only through the trap below
# (and the client's request is interrupted like the launch script), while SIGTERM reaches the
# launch script only, which stops its children gracefully.
set -m
DYN_ENABLE_TEST_LOGITS_PROCESSOR=1 launch/agg.sh "$@" --run "$RUN" </dev/null >>"$LOG" 2>&5 5>&- &
agg=$!
set +m
trap 'kill -INT -- "-$agg" 2>/dev/null || true' INT
trap 'kill -TERM "$agg" 2>/dev/null || true' TERM
trap 'kill -HUP "$agg" 2>/dev/null || true' HUP
status=0
while :; do
  wait "$agg" && status=0 || status=$?
  kill -0 "$agg" 2>/dev/null || break   # a trapped signal ended the wait, not the launch script
done
wait "$agg" && status=0 || status=$?     # its own status, had a signal ended the last wait
trap - INT TERM HUP
exec 5>&-
wait "$tee_pid" 2>/dev/null || true   # every "dynlogits:" line is out before what follows

if ((status == 0)); then
  rm -f "$LOG"
  exit 0
fi
case $status in
  129|130|143) echo "[demo] interrupted (exit $status); log: $LOG" >&2 ;;
  *) {
       echo "[demo] FAILED (exit $status); last 40 lines of $LOG:"
       tail -n 40 "$LOG" | sed 's/^/    /'
       echo "[demo] full log: $LOG"
     } >&2 ;;
esac
exit "$status"
