"""Every built-in kind that reaches an engine is one module of ``dynlogits.processors`` named after
it, holding its processor, its template and its resident group; the host and resident apply paths
know kinds only through what those modules declare (they import none of them)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import dynlogits
from dynlogits.processors import registry
from dynlogits.processors.base import RealizeContext
from dynlogits.processors.slots import Group, Template
from dynlogits.specs.entries import WIRE_KINDS

#: ``python`` runs the operator's code, not a kind of ours; ``reasoning`` builds no processor
ENGINE_KINDS = sorted(WIRE_KINDS - {"python", "reasoning"})
PACKAGE = Path(dynlogits.__file__).parent
APPLY_PATHS = ["sdk/plans.py", "sdk/apply.py", "sdk/resident/slot_batch.py", "sdk/resident/flags.py",
               "sdk/resident/listed.py", "sdk/resident/gathered.py", "sdk/resident/deciding.py",
               "sdk/resident/failures.py", "sdk/resident/engine_step.py"]


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_a_built_in_kind_is_one_module_with_its_processor_and_any_template_and_group(kind: str) -> None:
    module = importlib.import_module(f"dynlogits.processors.{kind}")
    assert module.KIND == kind
    templates = [c for _, c in inspect.getmembers(module, inspect.isclass)
                 if issubclass(c, Template) and c is not Template and c.__module__ == module.__name__]
    assert len(templates) <= 1, templates
    for template in templates:  # a kind that runs on the resident path: its group lives beside it
        assert issubclass(template.group, Group) and template.group.__module__ == module.__name__
    processor = module.factory(_entry(kind), RealizeContext(64, prompt_ids=(3, 4, 5), stop_token_ids=(1,)))
    assert callable(processor)
    if templates:
        assert type(processor).__module__ == module.__name__ and isinstance(processor.template, templates[0])


def test_the_registry_lists_every_kind_module_once() -> None:
    assert sorted(m.KIND for m in registry.BUILTIN_KINDS) == ENGINE_KINDS
    assert sorted(registry.BUILTIN_FACTORIES) == ENGINE_KINDS


@pytest.mark.parametrize("path", APPLY_PATHS)
def test_the_apply_paths_import_no_kind_by_name(path: str) -> None:
    tree = ast.parse((PACKAGE / path).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    kind_modules = {f"dynlogits.processors.{k}" for k in ENGINE_KINDS}
    assert not imported & kind_modules and not names & set(ENGINE_KINDS), (path, imported & kind_modules)


def _entry(kind: str) -> object:
    from dynlogits.specs import entries

    samples = {
        "forced_sequence": {"token_ids": [5, 6], "eos_token_id": 1},
        "banned_tokens": {"token_ids": [5]},
        "allowed_tokens": {"token_ids": [5], "eos_token_id": 1},
        "logit_bias": {"bias": {"5": 1.0}},
        "min_tokens": {"min_tokens": 2, "stop_token_ids": [1]},
        "thinking_budget": {"start_token_ids": [7], "end_token_ids": [8], "budget": 2},
        "banned_phrases": {"phrases": [[5, 6], [7]]},
        "multiple_choice": {"choices": [[5, 6], [7]], "eos_token_id": 1},
        "trigger": {"trigger_token_ids": [5], "phrase_token_ids": [6, 7]},
        "deadline": {"seconds": 1.0},
        "prompt_tokens": {"mode": "boost"},
        "watermark": {"key": 7, "context_width": 4},
        "dry": {"multiplier": 0.8, "sequence_breakers": []},
        "no_repeat_ngram": {"size": 2},
    }
    model = next(m for m in entries.ENTRY_MODELS if m.model_fields["kind"].default == kind)
    return model.model_validate({"kind": kind, **samples[kind]})
