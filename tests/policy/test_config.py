"""Operator config files: YAML/JSON, allow-lists, limits, errors naming file and field."""

import json

import pytest

from dynlogits.policy.config import SPEC_FILE_ENV, config_from_sources, load_config
from dynlogits.specs import SpecError


def test_yaml_config_loads_spec_allow_list_and_limits(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "entries:\n  - {kind: banned_tokens, token_ids: [13]}\n  - kind: forced_text\n    text: Hi\n"
        "allow_request_kinds: [logit_bias, forced_text]\nlimits: {max_entries: 4}\n"
    )
    config = load_config(path)
    assert [e.kind for e in config.spec.entries] == ["banned_tokens", "forced_text"]
    assert config.allow_request_kinds == {"logit_bias", "forced_text"}
    assert config.limits.max_entries == 4 and config.active


def test_json_config_without_entries_has_no_spec(tmp_path):
    path = tmp_path / "deploy.json"
    path.write_text(json.dumps({"allow_request_kinds": ["banned_tokens"]}))
    config = load_config(path)
    assert config.spec is None and config.active


def test_config_errors_name_the_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("entries:\n  - {kind: banned_tokens, token_ids: [-3]}\n")
    with pytest.raises(SpecError) as info:
        load_config(path)
    assert str(info.value) == "bad.yaml: entries[0].token_ids[0]: must be >= 0"


def test_python_kind_can_never_be_allowed_in_requests(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("allow_request_kinds: [python, teleport]\n")
    with pytest.raises(SpecError) as info:
        load_config(path)
    problems = [str(p) for p in info.value.problems]
    assert problems[0] == "bad.yaml: allow_request_kinds[0]: kind 'python' runs code on workers and may never be allowed in requests"
    assert problems[1].startswith("bad.yaml: allow_request_kinds[1]: unknown kind 'teleport'")


def test_limits_in_config_apply_to_its_own_entries(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("entries: [{kind: banned_tokens, token_ids: [1, 2, 3]}]\nlimits: {max_token_ids: 2}\n")
    with pytest.raises(SpecError, match=r"entries\[0\]\.token_ids: must have at most 2 items \(limit max_token_ids\)"):
        load_config(path)


def test_unreadable_and_malformed_files_get_clear_errors(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "x.yaml"
    bad.write_text("entries: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_config(bad)


def test_cli_flag_wins_over_environment(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("allow_request_kinds: [logit_bias]\n")
    b.write_text("allow_request_kinds: [banned_tokens]\n")
    assert config_from_sources(str(a), {SPEC_FILE_ENV: str(b)}).allow_request_kinds == {"logit_bias"}
    assert config_from_sources(None, {SPEC_FILE_ENV: str(b)}).allow_request_kinds == {"banned_tokens"}
    assert not config_from_sources(None, {}).active


# --- plug-in kinds ----------------------------------------------------------------------------

from typing import Literal  # noqa: E402

from pydantic import BaseModel, ConfigDict, StrictInt  # noqa: E402

from dynlogits.specs import ProcessorKind, kinds, register_kind  # noqa: E402


class _BanRange(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["ban_range"] = "ban_range"
    start: StrictInt
    stop: StrictInt


@pytest.fixture
def ban_range(monkeypatch):
    monkeypatch.setattr(kinds, "_registered", {})
    register_kind(ProcessorKind("ban_range", _BanRange, "acme.processors:make_ban_range"))


def test_plugin_kinds_work_in_entries_and_the_allow_list(tmp_path, ban_range):
    path = tmp_path / "deploy.yaml"
    path.write_text("entries: [{kind: ban_range, start: 3, stop: 5}, {kind: forced_text, text: Hi}]\n"
                    "allow_request_kinds: [ban_range, logit_bias]\n")
    config = load_config(path)
    assert config.spec.entries[0] == _BanRange(start=3, stop=5)
    assert config.allow_request_kinds == {"ban_range", "logit_bias"}


def test_a_plugin_entrys_bad_field_is_named_with_the_file(tmp_path, ban_range):
    path = tmp_path / "bad.yaml"
    path.write_text("entries: [{kind: ban_range, start: 3, stop: x, step: 1}]\n")
    with pytest.raises(SpecError) as info:
        load_config(path)
    assert str(info.value) == "bad.yaml: entries[0].stop: must be an integer; bad.yaml: entries[0].step: unknown field"


def test_a_plugin_kind_that_is_not_installed_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(kinds, "_registered", {})
    path = tmp_path / "c.yaml"
    path.write_text("allow_request_kinds: [ban_range]\n")
    with pytest.raises(SpecError, match=r"allow_request_kinds\[0\]: unknown kind 'ban_range'"):
        load_config(path)


def test_a_config_may_tighten_every_spec_limit(tmp_path):
    from dataclasses import fields

    from dynlogits.specs import SpecLimits

    names = [f.name for f in fields(SpecLimits)]
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"limits": {name: 3 for name in names}}))
    assert load_config(path).limits == SpecLimits(**{name: 3 for name in names})
