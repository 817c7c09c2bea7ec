"""``python -m dynlogits.serve.frontend`` flags: the drain deadline after SIGTERM."""

from __future__ import annotations

import pytest

from dynlogits.serve.frontend.args import parse_frontend_args

WORKER = ["--agg-worker", "http://127.0.0.1:9"]


def test_the_drain_deadline_defaults_to_10_s_and_takes_the_flag() -> None:
    assert parse_frontend_args(WORKER, environ={}).graceful_timeout_s == 10.0
    assert parse_frontend_args([*WORKER, "--graceful-timeout", "120"], environ={}).graceful_timeout_s == 120.0


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_drain_deadline_that_is_not_positive_is_refused_naming_the_flag(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_frontend_args([*WORKER, "--graceful-timeout", value], environ={})
    assert exc.value.code == 2
    assert "--graceful-timeout: must be > 0" in capsys.readouterr().err
