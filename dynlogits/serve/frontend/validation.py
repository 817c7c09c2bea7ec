"""The frontend's one check of a client's request body (the client -> deployment trust boundary).

:func:`validate_request` parses the body and its logits entries once and returns the body as
validated: its ``logits_processors`` are the entries it parsed, in wire form, which is what the
frontend forwards. Where each boundary's check lives: ``docs/deployment.md``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from dynlogits.policy.config import DeploymentConfig
from dynlogits.serve.http.bodies import first_error
from dynlogits.serve.http.errors import HTTPError
from dynlogits.serve.limits import RequestLimits, body_limit_problem
from dynlogits.serve.openai_controls import rename_control_paths, with_controls
from dynlogits.specs import SpecError, parse_entries
from dynlogits.specs.wire import request_dump

from .openai_models import RequestBody, unsupported_field

__all__ = ["LIMIT_EXCEEDED", "validate_request"]

#: ``code`` of a 400 for a request over a per-request limit (``dynlogits.serve.limits``).
LIMIT_EXCEEDED = "limit_exceeded"


def validate_request(model: type[RequestBody], data: Any, config: DeploymentConfig,
                     limits: RequestLimits | None = None) -> tuple[RequestBody, list[str]]:
    """The body as validated and its request kinds (its own entries' and those its ``logit_bias`` /
    ``allowed_token_ids`` / ``bad_words`` map onto); ``HTTPError(400)`` naming the first bad field.

    Checked in this order: the per-request limits on the raw JSON, fields this frontend would not
    honour, the body's model, the controls, then every entry in one parse."""
    if not isinstance(data, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    problem = body_limit_problem(data, limits or RequestLimits())
    if problem is not None:
        raise HTTPError(400, problem.message, param=problem.param, code=LIMIT_EXCEEDED)
    unsupported = unsupported_field(data)
    if unsupported is not None:
        raise HTTPError(400, unsupported[1], param=unsupported[0])
    try:
        body = model.model_validate(data)
    except ValidationError as err:
        bad = first_error(err.errors())
        raise HTTPError(400, bad.message, param=bad.param) from None
    own = body.logits_processors
    if own is not None and not isinstance(own, list):  # refused by the parse with the field's own error
        raw, origins = own, []
    else:
        try:
            controls = with_controls(own, body.controls(), config)
        except SpecError as err:
            raise HTTPError(400, str(err), param=err.problems[0].path) from None
        raw, origins = controls.entries, controls.origins
        if own is None and not raw:
            return body, []
    try:
        entries = parse_entries(raw, root="logits_processors", limits=config.limits,
                                allowed_kinds=sorted(config.allow_request_kinds))
    except SpecError as err:
        renamed = rename_control_paths(err, origins)
        raise HTTPError(400, str(renamed), param=renamed.problems[0].path) from None
    if isinstance(own, list):  # forward what was validated: the client's own entries (the controls travel as sent)
        body = body.model_copy(update={"logits_processors": [request_dump(e) for e in entries[:len(own)]]})
    return body, [e.kind for e in entries]
