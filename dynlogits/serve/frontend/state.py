"""What the frontend's handlers share: the worker router, the deployment config, the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from dynlogits.policy.config import DeploymentConfig
from dynlogits.serve.http.bodies import DEFAULT_MAX_BODY_BYTES

from .metrics import FrontendMetrics
from .routing import Router

__all__ = ["FrontendState"]


@dataclass
class FrontendState:
    router: Router
    config: DeploymentConfig
    metrics: FrontendMetrics
    #: Bodies larger than this are refused with 413 before they are read in full.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: The deployment's worker secret: a ``/health`` request presenting it gets the detailed view.
    worker_secret: str | None = field(default=None, repr=False)
