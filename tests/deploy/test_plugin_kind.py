"""A third-party kind, published through the entry-point group by a real installed package, works
everywhere a built-in one does: ``dynlogits validate``/``schema``, the operator config, per-request
``logits_processors`` through the frontend (validated by the kind's own model, torch-free) and the
worker and engine (realized through its import-string factory) of a real ``launch/agg.sh``.

The package (``acme_logits``, not shipped with dynlogits) is written and installed here with pip
into a folder that only the launched processes see on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from plugin_dist import install_plugin

from .conftest import model_name, openai_client
from .launcher import PYTHON, ROOT, WORKER_AUTH, Deployment, free_port_block

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "acme-logits"
version = "0.1.0"
dependencies = ["dynlogits"]

[project.entry-points."dynlogits.processors"]
repeat_token = "acme_logits.kinds:REPEAT_TOKEN"
ban_range = "acme_logits.kinds:BAN_RANGE"
recite = "acme_logits.kinds:RECITE"

[tool.setuptools]
packages = ["acme_logits"]
"""

KINDS = '''\
"""acme's kinds: declarations only (pydantic, never torch); every dynlogits process loads them."""
from collections.abc import Mapping
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from dynlogits.specs.entries import Text, TokenIds
from dynlogits.specs.kinds import ProcessorKind

TokenId = Annotated[StrictInt, Field(ge=0)]


class RepeatTokenSpec(BaseModel):
    """Force ``token_id`` ``count`` times, then ``eos_token_id``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["repeat_token"] = "repeat_token"
    token_id: TokenId
    count: Annotated[StrictInt, Field(ge=1, le=64)]
    eos_token_id: TokenId


class BanRangeSpec(BaseModel):
    """Ban every id in ``[start, stop)``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["ban_range"] = "ban_range"
    start: TokenId
    stop: TokenId


class ReciteSpec(BaseModel):
    """Force the ``count`` prompt tokens that follow the first ``after_text`` in the prompt, then stop."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["recite"] = "recite"
    after_text: Text | None = None
    after_token_ids: TokenIds | None = None
    count: Annotated[StrictInt, Field(ge=1, le=64)]

    text_fields: ClassVar[Mapping[str, str]] = {"after_text": "after_token_ids"}


REPEAT_TOKEN = ProcessorKind("repeat_token", RepeatTokenSpec, "acme_logits.processors:make_repeat_token")
RECITE = ProcessorKind("recite", ReciteSpec, "acme_logits.processors:make_recite")
BAN_RANGE = ProcessorKind("ban_range", BanRangeSpec, "acme_logits.processors:make_ban_range")
'''

PROCESSORS = '''\
"""acme's processors: imported by the engine only, through the kinds' factory strings."""
import torch


class RepeatToken:
    def __init__(self, token_id: int, count: int, eos_token_id: int) -> None:
        self.token_id, self.count, self.eos_token_id = token_id, count, eos_token_id

    def __call__(self, generated_ids, logits: torch.Tensor) -> None:
        target = self.token_id if len(generated_ids) < self.count else self.eos_token_id
        logits.fill_(float("-inf"))
        logits[target] = 0.0


class BanRange:
    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop

    def __call__(self, generated_ids, logits: torch.Tensor) -> None:
        logits[self.start:self.stop] = float("-inf")


def make_repeat_token(entry, ctx) -> RepeatToken:
    return RepeatToken(entry.token_id, entry.count, entry.eos_token_id)


def make_ban_range(entry, ctx) -> BanRange:
    return BanRange(entry.start, min(entry.stop, ctx.vocab_size))


class Force:
    def __init__(self, tokens, stop: int) -> None:
        self.tokens, self.stop = list(tokens), stop

    def __call__(self, generated_ids, logits: torch.Tensor) -> None:
        n = len(generated_ids)
        logits.fill_(float("-inf"))
        logits[self.tokens[n] if n < len(self.tokens) else self.stop] = 0.0


def make_recite(entry, ctx) -> Force:
    after, prompt = list(entry.after_token_ids), list(ctx.prompt_ids)
    starts = [i for i in range(len(prompt)) if prompt[i:i + len(after)] == after]
    if not starts:
        raise ValueError(f"{after} is not in the prompt {prompt}")
    begin = starts[0] + len(after)
    return Force(prompt[begin:begin + entry.count], ctx.stop_token_ids[0])
'''

MESSAGES = [{"role": "user", "content": "Tell me something."}]


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``acme_logits`` installed (dist-info with ``entry_points.txt``) into a folder of its own."""
    return install_plugin(tmp_path_factory.mktemp("acme-src"), tmp_path_factory.mktemp("acme-site"), "acme_logits",
                          PYPROJECT, {"kinds.py": KINDS, "processors.py": PROCESSORS}, python=PYTHON)


def with_plugin(path: Path | None) -> dict[str, str]:
    """The environment of a process that sees the plug-in (``path``) or not (``None``)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def run_cli(path: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "dynlogits", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=with_plugin(path))


# --- no engine ---------------------------------------------------------------------------------


def test_validation_with_the_plugin_imports_no_torch(plugin_path: Path) -> None:
    """The frontend's modules, the config loader and request validation load the kind's model
    through its entry point, and neither torch nor the kind's processor module."""
    code = (
        "import sys, dynlogits.serve.frontend.__main__, dynlogits.serve.frontend.app\n"
        "from dynlogits.policy.config import parse_config\n"
        "from dynlogits.specs import parse_entries, encode_entries\n"
        "from dynlogits.specs.kinds import installed_kinds\n"
        "assert sorted(installed_kinds()) == ['ban_range', 'recite', 'repeat_token'], dict(installed_kinds())\n"
        "config = parse_config({'entries': [{'kind': 'ban_range', 'start': 3, 'stop': 5}],"
        " 'allow_request_kinds': ['repeat_token']})\n"
        "entries = parse_entries([{'kind': 'repeat_token', 'token_id': 4, 'count': 2, 'eos_token_id': 1}],"
        " allowed_kinds=sorted(config.allow_request_kinds))\n"
        "assert encode_entries(config.spec.entries + entries)[1]['kind'] == 'repeat_token'\n"
        "bad = [m for m in ('torch', 'vllm', 'acme_logits.processors') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([PYTHON, "-c", code], check=True, cwd=ROOT, env=with_plugin(plugin_path), timeout=120)


def test_schema_includes_installed_kinds(plugin_path: Path) -> None:
    payload = json.loads(run_cli(plugin_path, "schema").stdout)
    assert {"RepeatTokenSpec", "BanRangeSpec"} <= set(payload["$defs"])
    assert set(payload["items"]["discriminator"]["mapping"]) >= {"repeat_token", "ban_range", "forced_sequence"}
    spec = json.loads(run_cli(plugin_path, "schema", "--spec").stdout)
    assert "RepeatTokenSpec" in spec["$defs"]
    assert "RepeatTokenSpec" not in json.loads(run_cli(None, "schema").stdout)["$defs"]


def test_validate_reads_configs_and_payloads_with_plugin_kinds(plugin_path: Path, tmp_path: Path) -> None:
    config = tmp_path / "deploy.yaml"
    config.write_text("entries: [{kind: ban_range, start: 3, stop: 5}]\nallow_request_kinds: [repeat_token]\n")
    result = run_cli(plugin_path, "validate", str(config))
    assert (result.returncode, result.stdout.strip()) == (0, "ok: 1 entry (ban_range)"), result.stderr
    result = run_cli(None, "validate", str(config))
    assert result.returncode == 1 and "deploy.yaml: entries[0]: unknown kind 'ban_range'" in result.stdout
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps([{"kind": "repeat_token", "token_id": 4, "count": 0, "eos_token_id": 1}]))
    result = run_cli(plugin_path, "validate", str(payload))
    assert (result.returncode, result.stdout.strip()) == (1, "dynamo_logits[0].count: must be >= 1")


# --- a real deployment ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def banned(tokenizer: Any) -> int:
    """The id the operator's ``ban_range`` entry bans (one token: " the")."""
    [tid] = tokenizer.encode(" the", add_special_tokens=False)
    return tid


@pytest.fixture(scope="module")
def plugin_agg(plugin_path: Path, banned: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """``launch/agg.sh`` whose operator config uses ``ban_range``; ``repeat_token``, ``recite`` and
    ``allowed_tokens`` may be requested."""
    config = tmp_path_factory.mktemp("acme-config") / "deploy.yaml"
    config.write_text(f"entries: [{{kind: ban_range, start: {banned}, stop: {banned + 1}}}]\n"
                      "allow_request_kinds: [repeat_token, allowed_tokens, recite]\n")
    d = Deployment("plugin-agg", "agg.sh", free_port_block(2), args=["--logits-spec", str(config)],
                   env={**with_plugin(plugin_path), "DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0"})
    d.start()
    yield d
    d.stop()


def chat(d: Deployment, entries: list[dict[str, Any]], **kwargs: Any) -> Any:
    return openai_client(d).chat.completions.create(model=model_name(d), messages=MESSAGES,
                                                    extra_body={"logits_processors": entries}, **kwargs)


def repeat(token_id: int, count: int, eos: int) -> dict[str, Any]:
    return {"kind": "repeat_token", "token_id": token_id, "count": count, "eos_token_id": eos}


@pytest.mark.engine
@pytest.mark.parametrize("count", [1, 4])
def test_a_requested_plugin_kind_shapes_the_output(plugin_agg: Deployment, tokenizer: Any, count: int) -> None:
    [token] = tokenizer.encode(" and", add_special_tokens=False)
    reply = chat(plugin_agg, [repeat(token, count, tokenizer.eos_token_id)], max_tokens=20)
    assert reply.choices[0].message.content == tokenizer.decode([token] * count, skip_special_tokens=True)
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.engine
def test_a_plugin_factory_reads_the_chat_templated_prompt_and_the_text_the_worker_resolved(
        plugin_agg: Deployment, tokenizer: Any) -> None:
    """``recite``: the worker tokenizes ``after_text``; the engine's factory finds those ids in the
    prompt vLLM's chat template produced and forces the tokens after them, then the stop token."""
    reply = chat(plugin_agg, [{"kind": "recite", "after_text": "Tell", "count": 7}], max_tokens=20)
    assert tokenizer.encode(" me something", add_special_tokens=False) == tokenizer.encode(
        "Tell me something", add_special_tokens=False)[-7:]  # the prompt's next seven tokens
    assert reply.choices[0].message.content == " me something"
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.engine
def test_a_plugin_kind_streams_on_the_completions_endpoint(plugin_agg: Deployment, tokenizer: Any) -> None:
    [token] = tokenizer.encode(" and", add_special_tokens=False)
    stream = openai_client(plugin_agg).completions.create(
        model=model_name(plugin_agg), prompt="Q:", max_tokens=20, stream=True,
        extra_body={"logits_processors": [repeat(token, 3, tokenizer.eos_token_id)]})
    assert "".join(c.choices[0].text for c in stream if c.choices) == tokenizer.decode([token] * 3)


@pytest.mark.engine
def test_the_operators_plugin_entry_applies_to_every_request(plugin_agg: Deployment, tokenizer: Any,
                                                             banned: int) -> None:
    """Only " the" and " and" are allowed; the operator's ``ban_range`` removes " the"."""
    [other] = tokenizer.encode(" and", add_special_tokens=False)
    reply = chat(plugin_agg, [{"kind": "allowed_tokens", "token_ids": [banned, other]}], max_tokens=6,
                 temperature=1.0, seed=3)
    assert reply.choices[0].message.content == " and" * 6
    info = httpx.get(f"{plugin_agg.worker_url(1)}/ready", headers=WORKER_AUTH).json()
    assert info["deployment_kinds"] == ["ban_range"]
    assert info["allow_request_kinds"] == ["allowed_tokens", "recite", "repeat_token"]


@pytest.mark.engine
@pytest.mark.parametrize(("entry", "param", "words"), [
    ({"kind": "repeat_token", "token_id": "x", "count": 2, "eos_token_id": 1}, "logits_processors[0].token_id", "integer"),
    ({"kind": "repeat_token", "token_id": 5, "count": 0, "eos_token_id": 1}, "logits_processors[0].count", ">= 1"),
    ({"kind": "repeat_token", "token_id": 5, "count": 2, "eos_token_id": 1, "every": 2}, "logits_processors[0].every",
     "unknown field"),
    ({"kind": "repeat_token", "token_id": 5, "count": 2}, "logits_processors[0].eos_token_id", "required"),
    ({"kind": "ban_range", "start": 0, "stop": 1}, "logits_processors[0].kind", "not allowed by this deployment"),
    # Only the worker knows the logits width: checked there by field name, relayed as a 400.
    ({"kind": "repeat_token", "token_id": 5000, "count": 2, "eos_token_id": 1}, "logits_processors[0].token_id",
     "vocab size"),
])
def test_bad_plugin_entries_get_400_naming_the_field(plugin_agg: Deployment, entry: dict[str, Any], param: str,
                                                     words: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        chat(plugin_agg, [entry])
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == param and words in body["message"], body


@pytest.mark.engine
def test_the_running_frontend_never_loaded_torch(plugin_agg: Deployment) -> None:
    [frontend] = plugin_agg.named("-m dynlogits.serve.frontend")  # the Python process, not its log's sed
    mapped = {m.path for m in frontend.memory_maps()}
    assert not [p for p in mapped if "torch" in Path(p).name], "the frontend mapped a torch library"
    assert any("pydantic_core" in p for p in mapped)  # it did load the kind's (pydantic) model



def test_a_broken_entry_point_stops_the_frontend_at_start(tmp_path: Path) -> None:
    """A published kind whose module cannot be imported: refused at start-up, naming the entry point
    (a hand-written dist-info is enough to publish an entry point)."""
    dist = tmp_path / "broken_kind-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-kind\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[dynlogits.processors]\nwarp = broken_kind_missing:WARP\n")
    r = subprocess.run([PYTHON, "-m", "dynlogits.serve.frontend", "--agg-worker", "http://127.0.0.1:1"], cwd=ROOT,
                       env=with_plugin(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert ("invalid logits config: entry point warp = 'broken_kind_missing:WARP' (group dynlogits.processors, "
            "distribution broken-kind): cannot be loaded: ModuleNotFoundError") in r.stderr
