"""Shared fixtures: the embedded default model (built once, no download)."""

from pathlib import Path

import pytest


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
