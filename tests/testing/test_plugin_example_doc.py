"""docs/specs.md's worked plug-in example (the zoo's CiteFromPrompt with a time limit, ``zoo.cite_prompt``),
built from the doc's own snippets: its entry point loads, the worker resolves the doc's request (text by
the embedded model's tokenizer) into ids, and the doc's test passes on every shipped adapter's drivers
(which carry the request's prompt, stop token and arrival as each engine does)."""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import tomllib
import yaml

from dynlogits.policy.config import parse_config
from dynlogits.policy.request import build_policy
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.specs import encode_entries
from dynlogits.specs.kinds import ENTRY_POINT_GROUP, ProcessorKind, kinds_registered

DOC = Path(__file__).resolve().parents[2] / "docs" / "specs.md"
SECTION = "### A worked example: the zoo's CiteFromPrompt with a time limit"


def _blocks() -> dict[str, tuple[str, str]]:
    """The section's code blocks by the file their first line names (``# zoo_cite/kinds.py: ...``):
    ``(language, source)``; the JSON request under ``request.json``."""
    text = DOC.read_text()
    assert f"\n{SECTION}\n" in text, f"docs/specs.md lost its section {SECTION!r}"
    section = text.split(f"\n{SECTION}\n", 1)[1].split("\n### ", 1)[0]
    found: dict[str, tuple[str, str]] = {}
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S):
        first = body.splitlines()[0]
        name = "request.json" if lang == "json" else re.match(r"# ([\w./-]+)", first).group(1)  # type: ignore[union-attr]
        found[name] = (lang, body)
    return found


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The package and the test the doc shows, written out and importable."""
    blocks = _blocks()
    assert set(blocks) == {"pyproject.toml", "zoo_cite/kinds.py", "zoo_cite/processors.py", "logits.yaml",
                           "request.json", "test_cite_prompt.py"}, sorted(blocks)
    root = tmp_path_factory.mktemp("zoo-cite")
    (root / "zoo_cite").mkdir()
    (root / "zoo_cite" / "__init__.py").write_text("")
    for name in ("zoo_cite/kinds.py", "zoo_cite/processors.py", "test_cite_prompt.py"):
        (root / name).write_text(blocks[name][1])
    sys.path.insert(0, str(root))
    try:
        yield {"blocks": blocks, "test": importlib.import_module("test_cite_prompt")}
    finally:
        sys.path.remove(str(root))
        for module in ("test_cite_prompt", "zoo_cite.processors", "zoo_cite.kinds", "zoo_cite"):
            sys.modules.pop(module, None)


def test_the_docs_entry_point_loads_a_kind_named_after_it(example: dict[str, Any]) -> None:
    pyproject = tomllib.loads(example["blocks"]["pyproject.toml"][1])
    [(name, value)] = pyproject["project"]["entry-points"][ENTRY_POINT_GROUP].items()
    kind = EntryPoint(name, value, ENTRY_POINT_GROUP).load()
    assert isinstance(kind, ProcessorKind) and kind.kind == name == "zoo.cite_prompt"
    assert "torch" not in (sys.modules["zoo_cite.kinds"].__dict__)


def test_the_worker_resolves_the_docs_request_into_ids(example: dict[str, Any], embedded_tokenizer: Any) -> None:
    from zoo_cite.kinds import CITE_PROMPT

    request = json.loads(example["blocks"]["request.json"][1])
    with kinds_registered(CITE_PROMPT):  # installed, its entry point does this
        config = parse_config(yaml.safe_load(example["blocks"]["logits.yaml"][1]))
        policy = build_policy(DisaggregationMode.AGGREGATED, config, lambda: embedded_tokenizer, 1024)
        payload = encode_entries(policy.entries_for(request["logits_processors"]))
    closing = embedded_tokenizer.encode(" In short:", add_special_tokens=False)
    assert payload == [{"kind": "zoo.cite_prompt", "boost": 2.0, "max_seconds": 20.0, "closing_token_ids": closing}]


def test_the_docs_plugin_passes_its_test_on_every_shipped_adapter(example: dict[str, Any], embedded_tokenizer: Any) -> None:
    pytest.importorskip("dynlogits.adapters.sglang.conformance")
    pytest.importorskip("vllm")
    test: ModuleType = example["test"]
    test.check_every_adapter(embedded_tokenizer)
