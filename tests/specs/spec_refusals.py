"""Shared by the admission-consistency tests: the one problem a refused wire payload is named by,
whether one is admitted, and whether its realized processors fail while writing a given output."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.specs import SpecError, decode_wire_payload


def refusal(payload: list[dict[str, Any]]) -> str:
    """``path: rule`` of the single problem ``decode_wire_payload`` refuses ``payload`` with."""
    with pytest.raises(SpecError) as err:
        decode_wire_payload(payload)
    (problem,) = err.value.problems
    return str(problem)


def admitted(payload: list[dict[str, Any]]) -> bool:
    """Whether ``decode_wire_payload`` admits ``payload``."""
    try:
        decode_wire_payload(payload)
    except SpecError:
        return False
    return True


def fails_writing(payload: list[dict[str, Any]], output: list[int], *, vocab_size: int = 64, stop: int = 2) -> bool:
    """Whether the realized processors of ``payload`` (the host path) fail its request while it
    writes ``output`` one token a step; every token written before that must have been allowed.
    Admission's checks are left out of the realization (and out of its memo), so a payload that
    admission refuses is realized too: the processors themselves must fail."""
    from unittest import mock

    import torch

    from dynlogits import sdk
    from dynlogits.processors.kept import Kept
    from dynlogits.sdk import realization

    with mock.patch.object(realization, "finish_entries", lambda entries, **_: entries), \
            mock.patch.object(realization, "_checked_memo", Kept(1, 1 << 30)):
        request = sdk.realize(payload, vocab_size=vocab_size, stop_token_id=stop)
    assert request is not None and not request.failed
    for n, token in enumerate(output):
        row = sdk.apply_row(request, output[:n], torch.zeros(vocab_size))
        if request.failed:
            break
        assert bool(torch.isfinite(row[token])), (n, token)
    return request.failed
