"""Bounds on the work one request may ask for (:class:`RequestLimits`), checked before that work is done.

The frontend checks a client's raw JSON (:func:`body_limit_problem`), the worker every ``/generate``
call again (:func:`generate_limit_problem`); a problem names the field and the limit's setting. Each
limit is read from ``DYN_<NAME>`` and overridable by the same-named flag of either process
(``docs/reliability.md``, "Limits"). Imports neither torch nor an engine.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["DEFAULT_MAX_TOKENS", "LimitProblem", "RequestLimits", "add_limit_flags", "body_limit_problem",
           "check_positive_fields", "env_name", "generate_limit_problem", "limits_from_flags", "positive_int", "positive_int_from_env"]

#: What the engine generates when a request gives no ``max_tokens`` (vLLM's default).
DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class RequestLimits:
    """Per-request bounds; every value is an integer >= 1."""

    #: Stop strings per request (OpenAI's API allows 4); the engine scans each after every token.
    max_stop_sequences: int = 4
    #: Characters per stop string.
    max_stop_chars: int = 256
    #: Prompt size before tokenization: characters of a text prompt or of all chat messages' text
    #: (roles, contents, other string fields), or token ids of a token-id prompt.
    max_prompt_chars: int = 131072
    #: Chat messages per request (each goes through the chat template).
    max_messages: int = 2048
    #: ``n * max_tokens`` (16 tokens when ``max_tokens`` is not given): tokens one request may generate.
    max_request_tokens: int = 32768
    #: Keys plus list items in ``vllm_xargs`` / ``extra_args`` (they travel to the engine with the request).
    max_extra_args: int = 64

    def __post_init__(self) -> None:
        check_positive_fields(self)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> RequestLimits:
        """Defaults, overridden by ``DYN_<LIMIT>`` variables; ``ValueError`` naming a bad variable."""
        defaults = cls()
        return cls(**{f.name: positive_int_from_env(environ, f.name, getattr(defaults, f.name)) for f in fields(cls)})


def check_positive_fields(limits: Any) -> None:
    """``ValueError`` naming the first field of the dataclass ``limits`` that is not an integer >= 1."""
    for f in fields(limits):
        value = getattr(limits, f.name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{f.name}: must be an integer >= 1, got {value!r}")


def env_name(limit: str) -> str:
    """``max_stop_sequences`` -> ``DYN_MAX_STOP_SEQUENCES``."""
    return f"DYN_{limit.upper()}"


def positive_int_from_env(environ: Mapping[str, str], limit: str, default: int) -> int:
    """``$DYN_<LIMIT>`` as an integer >= 1, or ``default`` when unset or blank; ``ValueError`` naming
    the variable otherwise."""
    name = env_name(limit)
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {raw!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1, else a usage error quoting ``text``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def add_limit_flags(parser: argparse.ArgumentParser, environ: Mapping[str, str] = os.environ) -> None:
    """Add ``--max-stop-sequences`` ... to ``parser``, defaulting to the environment's values.
    A bad variable is a usage error naming it."""
    try:
        defaults = RequestLimits.from_env(environ)
    except ValueError as err:
        parser.error(str(err))
    group = parser.add_argument_group("per-request limits (default: $DYN_<NAME>, else the built-in value)")
    for f in fields(RequestLimits):
        group.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=positive_int,
                           default=getattr(defaults, f.name), metavar="N",
                           help=f"(${env_name(f.name)}, default {getattr(defaults, f.name)})")


def limits_from_flags(ns: argparse.Namespace) -> RequestLimits:
    return RequestLimits(**{f.name: getattr(ns, f.name) for f in fields(RequestLimits)})


@dataclass(frozen=True)
class LimitProblem:
    """One exceeded limit: ``param`` names the request field, ``message`` the value and the limit."""

    param: str
    message: str


def _over(param: str, what: str, count: int, limit: str, bound: int) -> LimitProblem:
    return LimitProblem(param, f"{param}: {what} is {count}; the most allowed is {bound} (limit {limit})")


def _stop_problem(stop: Any, limits: RequestLimits, param: str) -> LimitProblem | None:
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    if len(stops) > limits.max_stop_sequences:
        return _over(param, "the number of stop sequences", len(stops), "max_stop_sequences",
                     limits.max_stop_sequences)
    for i, s in enumerate(stops):
        if isinstance(s, str) and len(s) > limits.max_stop_chars:
            where = param if isinstance(stop, str) else f"{param}[{i}]"
            return _over(where, "the stop sequence's length in characters", len(s), "max_stop_chars",
                         limits.max_stop_chars)
    return None


def _message_chars(message: Mapping[str, Any]) -> int:
    """Characters of a message's string fields (role, content, any other the template may render)
    and of its text parts."""
    chars = 0
    for value in message.values():
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, list):  # text parts
            chars += sum(len(p["text"]) for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return chars


def _messages_problem(messages: Any, limits: RequestLimits, param: str) -> LimitProblem | None:
    if not isinstance(messages, list):
        return None
    if len(messages) > limits.max_messages:
        return _over(param, "the number of messages", len(messages), "max_messages", limits.max_messages)
    chars = sum(_message_chars(m) for m in messages if isinstance(m, Mapping))
    if chars > limits.max_prompt_chars:
        return _over(param, "the prompt's length in characters (all messages' text)", chars,
                     "max_prompt_chars", limits.max_prompt_chars)
    return None


def _prompt_problem(prompt: Any, limits: RequestLimits, param: str) -> LimitProblem | None:
    if isinstance(prompt, str):
        size, what = len(prompt), "the prompt's length in characters"
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        size, what = sum(len(p) for p in prompt if isinstance(p, str)), "the prompt's length in characters"
    elif isinstance(prompt, list):
        size, what = len(prompt), "the prompt's length in token ids"
    else:
        return None
    if size > limits.max_prompt_chars:
        return _over(param, what, size, "max_prompt_chars", limits.max_prompt_chars)
    return None


def _tokens_problem(n: Any, max_tokens: Any, limits: RequestLimits, param: str) -> LimitProblem | None:
    if not isinstance(n, int) or isinstance(n, bool):
        n = 1
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or n < 1 or max_tokens < 1:
        return None  # the type and range checks report these
    if n * max_tokens > limits.max_request_tokens:
        return LimitProblem(param, f"{param}: n * max_tokens is {n} * {max_tokens} = {n * max_tokens} tokens; the most "
                                   f"allowed per request is {limits.max_request_tokens} (limit max_request_tokens)")
    return None


def _extra_args_problem(extra: Any, limits: RequestLimits, param: str) -> LimitProblem | None:
    if not isinstance(extra, Mapping):
        return None
    items = sum(1 + (len(v) if isinstance(v, list) else 0) for v in extra.values())
    if items > limits.max_extra_args:
        return _over(param, "the number of keys plus list items", items, "max_extra_args", limits.max_extra_args)
    return None


def body_limit_problem(body: Mapping[str, Any], limits: RequestLimits) -> LimitProblem | None:
    """The first limit a client's OpenAI body (chat or text completion, raw JSON) exceeds, else ``None``.

    Values of the wrong type are skipped: the body's model reports those."""
    # the field that set the token count (chat's max_completion_tokens counts when max_tokens is absent)
    tokens_field = next((f for f in ("max_tokens", "max_completion_tokens") if body.get(f) is not None), "n")
    max_tokens = body.get(tokens_field) if tokens_field != "n" else None
    checks = (
        lambda: _stop_problem(body.get("stop"), limits, "stop"),
        lambda: _messages_problem(body.get("messages"), limits, "messages"),
        lambda: _prompt_problem(body.get("prompt"), limits, "prompt"),
        lambda: _tokens_problem(body.get("n", 1), max_tokens, limits, tokens_field),
        lambda: _extra_args_problem(body.get("vllm_xargs"), limits, "vllm_xargs"),
        lambda: _extra_args_problem(body.get("extra_args"), limits, "extra_args"),
    )
    for check in checks:
        problem = check()
        if problem is not None:
            return problem
    return None


def generate_limit_problem(*, prompt: str | None, prompt_token_ids: list[int] | None,
                           messages: list[Any] | None, n: int, max_tokens: int | None, stop: list[str],
                           extra_args: Mapping[str, Any], limits: RequestLimits) -> LimitProblem | None:
    """The first limit a worker ``/generate`` request exceeds (paths as in its protocol), else ``None``."""
    dumped = [m if isinstance(m, Mapping) else m.model_dump() for m in messages or []]
    checks = (
        lambda: _stop_problem(stop, limits, "sampling.stop"),
        lambda: _messages_problem(dumped, limits, "messages") if messages is not None else None,
        lambda: _prompt_problem(prompt, limits, "prompt"),
        lambda: _prompt_problem(prompt_token_ids, limits, "prompt_token_ids"),
        lambda: _tokens_problem(n, max_tokens, limits, "sampling.max_tokens"),
        lambda: _extra_args_problem(extra_args, limits, "extra_args"),
    )
    for check in checks:
        problem = check()
        if problem is not None:
            return problem
    return None
