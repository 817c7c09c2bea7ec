"""The operator's watermark key (issue 50): given inline, or read at start-up from an environment
variable (``key_env``) or a file (``key_file``) the logits config names; refused naming the field when
missing or malformed, never quoting it; never in a repr or an error; a client may not read the
servers' environment with it, nor put its own watermark beside the operator's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynlogits.policy.config import load_config, parse_config
from dynlogits.policy.request import build_policy
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.policy.watermark_key import MAX_KEY, OperatorWatermark, operator_watermark, resolve_key_sources
from dynlogits.specs import SpecError, parse_entries

KEY = 15713294082266031957  # distinctive digits: grep-able wherever they must not appear
DIGITS = str(KEY)
VOCAB = 1024


def _watermark(**key: Any) -> dict[str, Any]:
    return {"kind": "watermark", "scheme": "gumbel", "context_width": 4, **key}


def _refusal(data: Any, **kwargs: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_config(data, **kwargs)
    assert DIGITS not in str(info.value) and DIGITS not in repr(info.value)
    return info.value


def test_the_key_is_read_from_the_named_environment_variable() -> None:
    config = parse_config({"entries": [_watermark(key_env="WM_KEY")]}, environ={"WM_KEY": f" {DIGITS}\n"})
    assert config.spec is not None
    watermark = operator_watermark(config.spec.entries)
    assert watermark == OperatorWatermark(key=KEY, context_width=4, path="entries[0]")


def test_the_key_is_read_from_the_named_file_relative_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "wm.key").write_text(f"# the deployment's watermark key\n\n{DIGITS}\n")
    (tmp_path / "logits.yaml").write_text("entries:\n  - {kind: watermark, scheme: gumbel, context_width: 3, "
                                          "key_file: keys/wm.key}\n")
    config = load_config(tmp_path / "logits.yaml")
    assert config.spec is not None
    assert operator_watermark(config.spec.entries) == OperatorWatermark(key=KEY, context_width=3, path="entries[0]")


def test_an_inline_key_is_taken_as_it_is() -> None:
    config = parse_config({"entries": [_watermark(key=KEY)]}, environ={})
    assert config.spec is not None and operator_watermark(config.spec.entries) is not None


@pytest.mark.parametrize(("environ", "rule"), [
    ({}, "WM_KEY is not set"),
    ({"WM_KEY": "  "}, "WM_KEY is not set"),
    ({"WM_KEY": f"0x{KEY:x}"}, "decimal integer"),
    ({"WM_KEY": f"{DIGITS}0"}, "decimal integer"),  # beyond 2**64 - 1
    ({"WM_KEY": f"-{DIGITS}"}, "decimal integer"),
], ids=["unset", "blank", "hex", "too large", "negative"])
def test_a_missing_or_malformed_variable_is_refused_naming_the_field(environ: dict[str, str], rule: str) -> None:
    err = _refusal({"entries": [{"kind": "banned_tokens", "token_ids": [1]}, _watermark(key_env="WM_KEY")]},
                   environ=environ)
    (problem,) = err.problems
    assert problem.path == "entries[1].key_env" and rule in problem.rule


def test_a_missing_or_malformed_file_is_refused_naming_the_field(tmp_path: Path) -> None:
    err = _refusal({"entries": [_watermark(key_file=str(tmp_path / "absent.key"))]})
    assert err.problems[0].path == "entries[0].key_file" and "cannot be read" in err.problems[0].rule
    bad = tmp_path / "bad.key"
    bad.write_text(f"key={DIGITS}\n")
    err = _refusal({"entries": [_watermark(key_file=str(bad))]})
    assert err.problems[0].path == "entries[0].key_file" and "decimal integer" in err.problems[0].rule


def test_the_config_files_own_errors_never_quote_the_key(tmp_path: Path) -> None:
    """YAML's own message shows the line around a syntax error: the loader names line and column only."""
    path = tmp_path / "logits.yaml"
    path.write_text(f"entries:\n  - {{kind: watermark, scheme: gumbel, key: {DIGITS}, x: [}}\n")
    with pytest.raises(SpecError) as info:
        load_config(path)
    assert "line 2" in str(info.value) and DIGITS not in str(info.value)
    path.write_text(f"entries:\n  - {{kind: watermark, scheme: gumbel, key: {KEY * 2}}}\n")  # out of range
    with pytest.raises(SpecError) as info:
        load_config(path)
    assert "entries[0].key" in str(info.value) and str(KEY * 2) not in str(info.value)


@pytest.mark.parametrize(("given", "path"), [
    ({"key": KEY, "key_env": "WM_KEY"}, "entries[0].key_env"),
    ({"key_env": "WM_KEY", "key_file": "wm.key"}, "entries[0].key_file"),
    ({}, "entries[0].key"),
    ({"key_env": "1BAD NAME"}, "entries[0].key_env"),
], ids=["key and key_env", "key_env and key_file", "none", "bad name"])
def test_the_key_is_given_exactly_one_way(given: dict[str, Any], path: str) -> None:
    err = _refusal({"entries": [_watermark(**given)]}, environ={"WM_KEY": DIGITS})
    assert err.problems[0].path == path


def test_the_key_is_in_no_repr() -> None:
    config = parse_config({"entries": [_watermark(key_env="WM_KEY")]}, environ={"WM_KEY": DIGITS})
    assert config.spec is not None
    watermark = operator_watermark(config.spec.entries)
    assert watermark is not None and watermark.key == KEY
    assert DIGITS not in repr(watermark) and DIGITS not in str(watermark)
    assert DIGITS not in repr(config) and DIGITS not in str(config) and "watermark" in repr(config)


def test_only_the_operators_config_resolves_key_sources() -> None:
    """A client's entry is the spec model alone: ``key_env`` is an unknown field, so a request can
    never have a server read its environment (or a file) for it."""
    with pytest.raises(SpecError) as info:
        parse_entries([_watermark(key_env="HOME")], root="logits_processors", allowed_kinds=["watermark"])
    assert info.value.problems[0].path.startswith("logits_processors[0]")
    assert resolve_key_sources("not a list") == ("not a list", [])


def test_the_largest_key_is_accepted_and_one_more_is_not() -> None:
    assert parse_config({"entries": [_watermark(key_env="K")]}, environ={"K": str(MAX_KEY)}).spec is not None
    _refusal({"entries": [_watermark(key_env="K")]}, environ={"K": str(MAX_KEY + 1)})


# -- a client's watermark ----------------------------------------------------------------------------
def _policy(tokenizer: Any, entries: list[dict[str, Any]], allow: list[str]) -> Any:
    return build_policy(DisaggregationMode.AGGREGATED, parse_config({"entries": entries, "allow_request_kinds": allow},
                                                                    environ={"WM_KEY": DIGITS}),
                        lambda: tokenizer, VOCAB, environ={})


def test_a_clients_watermark_beside_the_operators_is_refused_naming_both(embedded_tokenizer) -> None:
    policy = _policy(embedded_tokenizer, [{"kind": "banned_tokens", "token_ids": [7]}, _watermark(key_env="WM_KEY")],
                     ["watermark", "banned_tokens"])
    with pytest.raises(SpecError) as info:
        policy.entries_for([{"kind": "banned_tokens", "token_ids": [3]}, _watermark(key=1)])
    (problem,) = info.value.problems
    assert problem.path == "logits_processors[1]" and "deployment entries[1]" in problem.rule
    assert "neither removed nor replaced" in problem.rule and DIGITS not in str(info.value)
    # the request's other entries are welcome: the operator's watermark draws after them (the payload's last)
    kinds = [e.kind for e in policy.entries_for([{"kind": "banned_tokens", "token_ids": [3]}])]
    assert kinds == ["banned_tokens", "banned_tokens", "watermark"]
    assert [e.kind for e in policy.entries_for(None)] == ["banned_tokens", "watermark"]


def test_a_client_may_send_a_watermark_only_where_the_operator_allows_the_kind(embedded_tokenizer) -> None:
    closed = _policy(embedded_tokenizer, [], ["banned_tokens"])
    with pytest.raises(SpecError) as info:
        closed.entries_for([_watermark(key=1)])
    assert info.value.problems[0].path.startswith("logits_processors[0]") and "watermark" in str(info.value)
    opened = _policy(embedded_tokenizer, [], ["watermark"])
    assert [e.kind for e in opened.entries_for([_watermark(key=1)])] == ["watermark"]


def test_the_moved_watermark_keeps_its_deployment_path_in_the_workers_names() -> None:
    """The worker names a failing entry as the client knows it: the operator's watermark, last in the
    payload after the client's entries, is still ``deployment entries[i]``."""
    from types import SimpleNamespace

    from dynlogits.serve.worker.generate import GenerateCall

    moved = SimpleNamespace(watermark_last=True)
    assert GenerateCall.payload_paths(moved, 4, ["logits_processors[0]", "bad_words"]) == [  # type: ignore[arg-type]  # a stand-in: it reads only watermark_last
        "deployment entries[0]", "logits_processors[0]", "bad_words", "deployment entries[1]"]
    kept = SimpleNamespace(watermark_last=False)
    assert GenerateCall.payload_paths(kept, 3, ["logits_processors[0]"]) == [  # type: ignore[arg-type]  # a stand-in: it reads only watermark_last
        "deployment entries[0]", "deployment entries[1]", "logits_processors[0]"]


def test_the_config_dump_names_the_kind_not_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``dynlogits validate FILE`` reads the key as the deployment does, and prints kinds only."""
    from dynlogits.tools.cli import main

    path = tmp_path / "logits.yaml"
    path.write_text("entries:\n  - {kind: watermark, scheme: gumbel, context_width: 4, key_env: WM_KEY}\n")
    monkeypatch.setenv("WM_KEY", DIGITS)
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr()
    assert "watermark" in out.out and DIGITS not in out.out + out.err
    monkeypatch.delenv("WM_KEY")
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr()
    assert "entries[0].key_env" in out.out + out.err
