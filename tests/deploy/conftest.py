"""Session-scoped deployments launched with the real scripts (see ``launcher.py``).

Engines are few on purpose (2-core machine): one aggregated deployment with the test
hook (``test_agg_hook.py``, module-scoped), one aggregated deployment with
``examples/deployment.yaml`` used by most tests (session-scoped), one disaggregated
deployment (``test_disagg.py``, module-scoped), one whose processes are killed on purpose
(``test_faults.py``, module-scoped), and one the load tool starts and stops itself
(``test_load.py``). No process outlives the session, even a killed one (``tests/session_reaper.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .launcher import ROOT, Deployment, free_port_block

SPEC_FILE = ROOT / "examples" / "deployment.yaml"
#: The ``open_agg`` deployment's operator config (default limits, every kind but ``python``).
OPEN_SPEC_FILE = Path(__file__).with_name("open_deployment.yaml")
#: A processor factory the spec_agg worker may load from operator config (never from a request).
PYTHON_FACTORY = "custom_processor:TokenCycle"


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The embedded model's tokenizer (the workers use the same one)."""
    from transformers import AutoTokenizer

    from dynlogits.model_builder import default_model_dir

    return AutoTokenizer.from_pretrained(str(default_model_dir()))


@pytest.fixture(scope="session")
def spec_agg() -> Iterator[Deployment]:
    """``launch/agg.sh --logits-spec examples/deployment.yaml``: every request kind allowed.

    A 2048-token context (the model's limit) leaves the cancellation test seconds, not a fraction
    of one, between the client hanging up and the request finishing on its own.

    The worker allow-lists one ``python`` factory (``PYTHON_FACTORY``, importable from ``examples/``)
    that no request may activate: ``test_trust_boundary.py`` tries every route, and a route that
    leaked the entry to the engine would run it."""
    d = Deployment("spec-agg", "agg.sh", free_port_block(2),
                   args=["--logits-spec", str(SPEC_FILE), "--max-model-len", "2048"],
                   env={"DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0", "DYN_LOGITS_PYTHON_FACTORIES": PYTHON_FACTORY,
                        # the worker's own bound: above the frontend's 128, low enough for test_surface to reach
                        "DYN_WORKER_MAX_INFLIGHT_SEQUENCES": "144",
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "examples"),
                                                                    os.environ.get("PYTHONPATH")]))})
    d.start()
    yield d
    d.stop()


@pytest.fixture(scope="session")
def open_agg() -> Iterator[Deployment]:
    """``launch/agg.sh --logits-spec tests/deploy/open_deployment.yaml``: the default limits, every
    request kind but ``python`` allowed (``reasoning`` too), and operator entries (a ban on ids 735
    and 450, a ban on id 300 scoped to the answer, reasoning delimiters) that no client may switch
    off or escape. Shared by the tests of what one client may cost and change for the others."""
    d = Deployment("open-agg", "agg.sh", free_port_block(2),
                   args=["--logits-spec", str(OPEN_SPEC_FILE), "--max-model-len", "2048"],
                   env={"DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0"})
    d.start()
    yield d
    d.stop()


def openai_client(d: Deployment, **kwargs: Any) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=d.base_url, api_key="unused", max_retries=0, timeout=120, **kwargs)


def model_name(d: Deployment) -> str:
    return openai_client(d).models.list().data[0].id


def spec_file() -> Path:
    return SPEC_FILE
