"""Sustained load with ``python -m dynlogits.tools.load``: 64 concurrent clients, 512 checked requests.

The main run has the tool start ``launch/agg.sh`` itself (``--launch``), on a fresh engine, and
reads the worker's ``/stats`` before and after: every answer is its own (no cross-talk), none is
lost or duplicated, and afterwards nothing is in flight, the adapter holds no per-request state,
and memory stayed within the bounds stated below.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .launcher import PYTHON, ROOT, Deployment

pytestmark = pytest.mark.engine

#: Memory bounds over the 512 measured requests (after a 64-request warm-up), and why:
#: * the dynlogits worker process (HTTP app, policy, per-request bookkeeping) and the frontend
#:   hold nothing per request once it ends: growth under 32 MiB (measured: 0-2 MiB);
#: * vLLM's own processes grow on this CPU build whether or not the adapter is loaded: the model
#:   runner's heap gained 18-115 MiB per 1,024 requests on a deployment *without* the adapter
#:   (docs/reliability.md). The whole worker tree is bounded at 256 MiB, above that; the adapter's
#:   per-request state, which lives in the model runner, is checked exactly, by count.
OWN_PROCESS_GROWTH_BOUND = 32 * 2**20
WORKER_TREE_GROWTH_BOUND = 256 * 2**20

def _run(args: list[str], json_path: Path, timeout: float) -> dict:
    out = subprocess.run([PYTHON, "-m", "dynlogits.tools.load", *args, "--json", str(json_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    print(out.stdout, out.stderr[-3000:])
    assert json_path.exists(), f"exit {out.returncode}: {out.stderr[-3000:]}"
    return json.loads(json_path.read_text())


def _assert_clean(summary: dict, requests: int) -> None:
    assert summary["requests"] == requests
    assert (summary["cross_talk"], summary["lost"], summary["duplicated"], summary["wrong_output"],
            summary["errors"]) == (0, 0, 0, 0, 0), summary["samples"]
    assert summary["ok"] == requests
    assert set(summary["by_kind"]) == {"forced", "banned", "bias", "none"}
    assert summary["streamed"] == requests // 2
    assert 0 < summary["p50_ms"] <= summary["p99_ms"] and summary["tokens_per_s"] > 0


def test_64_clients_512_requests_through_agg_sh(tmp_path: Path) -> None:
    summary = _run(["--launch", "--concurrency", "64", "--requests", "512"], tmp_path / "load.json", timeout=900)
    _assert_clean(summary, 512)
    (worker,) = summary["workers"]
    assert worker["requests_served"] == 512
    assert worker["in_flight_after"] == 0
    assert worker["adapter_requests_after"] == 0
    own = worker["rss_by_process_after"]["worker"] - worker["rss_by_process_before"]["worker"]
    assert own < OWN_PROCESS_GROWTH_BOUND, f"the worker process grew by {own / 2**20:.0f} MiB"
    tree = worker["rss_bytes_after"] - worker["rss_bytes_before"]
    assert tree < WORKER_TREE_GROWTH_BOUND, f"the worker and its engine grew by {tree / 2**20:.0f} MiB"
    frontend = summary["frontend_rss_bytes_after"] - summary["frontend_rss_bytes_before"]
    assert frontend < OWN_PROCESS_GROWTH_BOUND, f"the frontend grew by {frontend / 2**20:.0f} MiB"


def test_base_url_drives_a_running_deployment(spec_agg: Deployment, tmp_path: Path) -> None:
    summary = _run(["--base-url", spec_agg.base_url, "--concurrency", "16", "--requests", "64", "--warmup", "0"],
                   tmp_path / "load.json", timeout=300)
    _assert_clean(summary, 64)
    assert summary["workers"][0]["adapter_requests_after"] == 0
