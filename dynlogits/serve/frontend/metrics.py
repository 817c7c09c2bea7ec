"""Prometheus metrics of the frontend, on a registry of its own (``GET /metrics``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["FrontendMetrics"]


class FrontendMetrics:
    """Requests, errors, latency, ready workers, and logits processors per kind."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("dynlogits_requests", "HTTP requests received", ["endpoint"], registry=r)
        self.errors = Counter("dynlogits_request_errors", "Requests answered with an error", ["endpoint", "status"],
                              registry=r)
        self.latency = Histogram("dynlogits_request_latency_seconds", "Time to the last byte of a response",
                                 ["endpoint"], registry=r,
                                 buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.active_processors = Gauge("dynlogits_active_logits_processors",
                                       "Logits-processor entries of in-flight requests", ["kind"], registry=r)
        self.processor_requests = Counter("dynlogits_logits_processor_requests",
                                          "Requests that carried an entry of this kind", ["kind", "source"], registry=r)
        self.workers_ready = Gauge("dynlogits_workers_ready", "Workers answering /ready", ["role"], registry=r)
        # client limits (docs/reliability.md, "Limits")
        self.refused = Counter("dynlogits_requests_refused", "Requests refused by a client limit before any work",
                               ["reason"], registry=r)
        self.paced = Counter("dynlogits_requests_paced", "Requests held back because their client's bodies cost "
                             "more CPU than its share (client_cpu_ms_per_s)", registry=r)
        self.paced_seconds = Counter("dynlogits_requests_paced_seconds", "Seconds requests were held back by pacing",
                                     registry=r)
        self.connections_closed = Counter("dynlogits_connections_closed",
                                          "Connections closed by a client limit", ["reason"], registry=r)
        self.inflight_sequences = Gauge("dynlogits_inflight_sequences", "Sequences admitted and not yet finished",
                                        registry=r)
        self.queued_requests = Gauge("dynlogits_queued_requests", "Requests waiting for admission", registry=r)
        self.failures = Counter("dynlogits_request_failures",
                                "Requests whose logits-processor entries failed while they generated, answered with "
                                "an error (422/500, or an error event when streamed), by reason", ["endpoint", "reason"],
                                registry=r)
        self.protocol_errors = Counter("dynlogits_client_protocol_errors",
                                       "Requests the server refused for their HTTP framing, or whose body never "
                                       "arrived (dynlogits.serve.http.protocol_errors.KINDS)", ["kind"], registry=r)

    @contextmanager
    def processors_active(self, request_kinds: Iterable[str], deployment_kinds: Iterable[str]) -> Iterator[None]:
        """Count the kinds as active for the duration of one request."""
        kinds = [*request_kinds, *deployment_kinds]
        for k in request_kinds:
            self.processor_requests.labels(kind=k, source="request").inc()
        for k in deployment_kinds:
            self.processor_requests.labels(kind=k, source="deployment").inc()
        for k in kinds:
            self.active_processors.labels(kind=k).inc()
        try:
            yield
        finally:
            for k in kinds:
                self.active_processors.labels(kind=k).dec()

    def render(self) -> bytes:
        return generate_latest(self.registry)
