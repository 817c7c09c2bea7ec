"""Shared fixtures: the embedded default model (built once, no download); the session-wide clean-up."""

from pathlib import Path

import pytest

# Every process a test starts is ended with the session, even when pytest is killed (see session_reaper).
from session_reaper import pytest_configure, pytest_unconfigure  # noqa: F401


@pytest.fixture(scope="session")
def embedded_model() -> Path:
    """The project's own small model folder (built on first use, cached)."""
    from dynlogits.model_builder import default_model_dir

    return default_model_dir()


@pytest.fixture(scope="session")
def embedded_tokenizer(embedded_model):
    """The embedded model's real Hugging Face tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(embedded_model))
