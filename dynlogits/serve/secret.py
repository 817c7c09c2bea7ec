"""The per-deployment secret between the frontend and its workers.

A worker answers every route but ``/health`` with 401 unless the caller presents the secret as
``Authorization: Bearer <secret>`` (:class:`RequireWorkerSecret`); the frontend sends it on every
call (:func:`secret_headers`), and it unlocks the frontend's detailed ``/health``. It comes from
``DYN_WORKER_SECRET`` or ``--worker-secret-file``, never the command line.
"""

from __future__ import annotations

import argparse
import hmac
import os
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from .http.bearer_auth import bearer_token, read_key_file, send_unauthorized

__all__ = ["MIN_SECRET_CHARS", "WORKER_SECRET_ENV", "RequireWorkerSecret", "add_worker_secret_flag", "load_worker_secret",
           "presents_secret", "secret_headers", "worker_secret_from_flags"]

WORKER_SECRET_ENV = "DYN_WORKER_SECRET"
#: A shorter secret is refused: the launch scripts generate 43 characters (32 random bytes).
MIN_SECRET_CHARS = 16


def load_worker_secret(file: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The secret from ``file`` (its first key line) or else ``$DYN_WORKER_SECRET``; ``None`` when
    neither is set. ``ValueError`` naming the source when it is unreadable or too short."""
    if file:
        secret, source = read_key_file(file)[0], file
    else:
        secret, source = environ.get(WORKER_SECRET_ENV, "").strip(), WORKER_SECRET_ENV
        if not secret:
            return None
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"{source}: the worker secret must be at least {MIN_SECRET_CHARS} characters")
    return secret


def presents_secret(scope: Mapping[str, Any], secret: str | None) -> bool:
    """Whether the request carries ``secret`` as its bearer token (never, when ``secret`` is ``None``)."""
    token = bearer_token(scope)
    return secret is not None and token is not None and hmac.compare_digest(token.encode(), secret.encode())


def secret_headers(secret: str | None) -> dict[str, str]:
    """The headers a call to a worker carries."""
    return {"Authorization": f"Bearer {secret}"} if secret else {}


class RequireWorkerSecret:
    """Pure ASGI middleware: 401 for every HTTP route but ``open_paths`` unless the request presents
    ``secret``; with ``secret=None`` every request passes (a worker started without one)."""

    def __init__(self, app: ASGIApp, *, secret: str | None, open_paths: frozenset[str] = frozenset({"/health"})) -> None:
        self.app, self.secret, self.open_paths = app, secret, open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and self.secret is not None and scope.get("path") not in self.open_paths
                and not presents_secret(scope, self.secret)):
            await send_unauthorized(send, "this port is for the deployment's frontend only: send the deployment's "
                                          f"worker secret as a bearer token (${WORKER_SECRET_ENV})",
                                    code="invalid_worker_secret")
            return
        await self.app(scope, receive, send)


def add_worker_secret_flag(p: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """``--worker-secret-file``, on the frontend and the workers alike."""
    p.add_argument("--worker-secret-file", default=environ.get("DYN_WORKER_SECRET_FILE") or None, metavar="FILE",
                   help="the deployment's worker secret, read from FILE ($DYN_WORKER_SECRET_FILE); default: "
                        f"${WORKER_SECRET_ENV} (the launch scripts generate one per deployment)")


def worker_secret_from_flags(p: argparse.ArgumentParser, ns: argparse.Namespace,
                             environ: Mapping[str, str]) -> str | None:
    """The secret the flags and the environment give (``None``: none), or the parser's error."""
    try:
        return load_worker_secret(ns.worker_secret_file, environ)
    except ValueError as err:
        p.error(f"worker secret: {err}")
