"""JSON Schemas generated from the models; the checked-in copies must match (a test checks).

The schemas cover the built-in kinds plus the installed plug-in kinds (entry points,
``dynlogits.specs.kinds``); the checked-in files are the output with none installed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from pydantic import Field, TypeAdapter, create_model

from .kinds import ProcessorKind, installed_kinds
from .spec import LogitsProcessorSpec
from .union import entry_union

__all__ = ["PAYLOAD_SCHEMA_FILE", "SPEC_SCHEMA_FILE", "payload_schema", "spec_schema", "render", "golden_vectors"]

PAYLOAD_SCHEMA_FILE = "payload.schema.json"
SPEC_SCHEMA_FILE = "spec.schema.json"


def payload_schema(plugins: Mapping[str, ProcessorKind] | None = None) -> dict[str, Any]:
    """Schema of ``extra_args["dynamo_logits"]``; ``plugins`` defaults to the installed kinds."""
    kinds = installed_kinds() if plugins is None else plugins
    schema = TypeAdapter(list[entry_union(kinds, wire=True)]).json_schema()  # type: ignore[misc, arg-type]  # a union built at run time is no static type
    schema["title"] = "dynamo_logits payload"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def spec_schema(plugins: Mapping[str, ProcessorKind] | None = None) -> dict[str, Any]:
    """Schema of a ``LogitsProcessorSpec`` (what a config file holds); ``plugins`` as above."""
    kinds = installed_kinds() if plugins is None else plugins
    model: type[LogitsProcessorSpec] = LogitsProcessorSpec
    if kinds:
        model = create_model(
            "LogitsProcessorSpec", __base__=LogitsProcessorSpec, __doc__=LogitsProcessorSpec.__doc__,
            entries=(tuple[entry_union(kinds, wire=False), ...], Field(min_length=1)),  # type: ignore[misc, arg-type]  # as above
        )
    schema = model.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def golden_vectors() -> list[tuple[str, dict[str, Any]]]:
    """``(name, vector)`` for every shipped golden vector, valid ones first.

    A vector is ``{"payload": [...], "valid": true}`` or
    ``{"payload": ..., "valid": false, "error": "dynamo_logits[0].token_ids[0]: must be >= 0"}``.
    """
    out: list[tuple[str, dict[str, Any]]] = []
    base = resources.files(__package__) / "golden"
    for group in ("valid", "invalid"):
        for item in sorted(base.joinpath(group).iterdir(), key=lambda p: p.name):
            if item.name.endswith(".json"):
                out.append((f"{group}/{item.name}", json.loads(item.read_text())))
    return out
