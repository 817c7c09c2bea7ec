"""Fixtures of the CUDA-model sequences."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def quiet() -> Iterator[None]:
    """No log output while the test runs: a sequence's failing request is expected."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)
