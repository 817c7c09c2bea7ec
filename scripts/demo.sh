#!/usr/bin/env bash
# The main job: the aggregated deployment (launch/agg.sh) on the embedded model with the test
# hook on, one plain chat request through the openai client, its answer printed, then every
# process stopped. Expected answer: Hello world!
# Extra arguments go to launch/agg.sh (e.g. --port 8100, --model /path/to/hf/model).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh
echo "[demo] starting launch/agg.sh with DYN_ENABLE_TEST_LOGITS_PROCESSOR=1 (engine start takes about a minute on CPU)" >&2
DYN_ENABLE_TEST_LOGITS_PROCESSOR=1 exec launch/agg.sh "$@" \
  --run 'set -o pipefail; .venv/bin/python examples/openai_client.py --hello --base-url "$OPENAI_BASE_URL" | sed "s/^/[demo] answer: /"'
