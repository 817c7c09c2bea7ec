"""The summary of a load run: counts per verdict, latency percentiles, throughput, worker state."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .costly import CostlyOutcome
from .driver import Answer, Verdict

__all__ = ["CostlyReport", "Summary", "WorkerSnapshot", "percentile", "summarize"]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class WorkerSnapshot:
    """One worker's ``/stats`` before and after the run (``None`` where it did not say)."""

    url: str
    pid: int | None = None
    rss_bytes_before: int | None = None
    rss_bytes_after: int | None = None
    rss_by_process_before: dict[str, int] = field(default_factory=dict)
    rss_by_process_after: dict[str, int] = field(default_factory=dict)
    in_flight_after: int | None = None
    adapter_requests_after: int | None = None
    requests_served: int | None = None


@dataclass
class CostlyReport:
    """The normal requests alone and beside ``clients`` costly clients (``--costly-clients``): their
    p99 beside them must stay within ``2 x alone + 1 s`` (``bound_ms``), with no 503/504 to them."""

    clients: int
    costly_sent: int
    costly_statuses: dict[str, int]
    costly_p50_ms: float
    alone_p99_ms: float
    beside_p99_ms: float
    bound_ms: float
    alone_errors: int
    beside_unavailable: int  # normal requests answered 503 or 504 beside the costly clients

    @classmethod
    def of(cls, clients: int, alone: Sequence[Answer], beside: Sequence[Answer], costly: CostlyOutcome) -> CostlyReport:
        alone_p99 = percentile([a.latency_ms for a in alone if a.error is None], 99)
        return cls(clients=clients, costly_sent=costly.sent,
                   costly_statuses={str(k): v for k, v in sorted(costly.statuses.items())},
                   costly_p50_ms=percentile(costly.latencies_ms, 50), alone_p99_ms=alone_p99,
                   beside_p99_ms=percentile([a.latency_ms for a in beside if a.error is None], 99),
                   bound_ms=2 * alone_p99 + 1000, alone_errors=sum(a.error is not None for a in alone),
                   beside_unavailable=sum(a.status in (503, 504) for a in beside))

    @property
    def met(self) -> bool:
        return self.beside_p99_ms <= self.bound_ms and self.beside_unavailable == 0 and self.alone_errors == 0

    def lines(self) -> list[str]:
        statuses = ", ".join(f"{k}: {v}" for k, v in self.costly_statuses.items()) or "none"
        return [f"costly clients {self.clients}: {self.costly_sent} costly requests ({statuses}), p50 "
                f"{self.costly_p50_ms:.0f} ms",
                f"normal p99 alone {self.alone_p99_ms:.0f} ms, beside the costly clients {self.beside_p99_ms:.0f} ms "
                f"(ratio {self.beside_p99_ms / max(self.alone_p99_ms, 1e-9):.2f}); bound 2 x alone + 1 s = "
                f"{self.bound_ms:.0f} ms: {'met' if self.beside_p99_ms <= self.bound_ms else 'NOT MET'}; "
                f"503/504 to normal requests: {self.beside_unavailable}; errors alone: {self.alone_errors}"]


@dataclass
class Summary:
    """What ``--json FILE`` writes. A clean run has ``ok == requests`` and every other count 0."""

    base_url: str
    model: str
    concurrency: int
    requests: int
    ok: int
    cross_talk: int
    wrong_output: int
    lost: int
    duplicated: int
    errors: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    duration_s: float
    requests_per_s: float
    completion_tokens: int
    tokens_per_s: float
    streamed: int
    by_kind: dict[str, dict[str, int]]
    samples: list[str] = field(default_factory=list)
    workers: list[WorkerSnapshot] = field(default_factory=list)
    #: Only with ``--launch`` (the tool knows the frontend's process then).
    frontend_rss_bytes_before: int | None = None
    frontend_rss_bytes_after: int | None = None
    #: Only with ``--costly-clients``.
    costly: CostlyReport | None = None

    @property
    def clean(self) -> bool:
        return self.ok == self.requests and (self.costly is None or self.costly.met)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The human-readable report."""
        out = [
            f"requests {self.requests} at concurrency {self.concurrency} against {self.base_url} ({self.model}), "
            f"{self.streamed} streamed",
            f"ok {self.ok} | cross_talk {self.cross_talk} | wrong_output {self.wrong_output} | lost {self.lost} | "
            f"duplicated {self.duplicated} | errors {self.errors}",
            f"latency ms: p50 {self.p50_ms:.1f} p95 {self.p95_ms:.1f} p99 {self.p99_ms:.1f} max {self.max_ms:.1f}",
            f"throughput: {self.requests_per_s:.1f} requests/s, {self.tokens_per_s:.1f} completion tokens/s "
            f"({self.completion_tokens} tokens in {self.duration_s:.1f} s)",
            "by kind: " + ", ".join(f"{k} {v['ok']}/{v['requests']}" for k, v in sorted(self.by_kind.items())),
        ]
        for w in self.workers:
            mib = [None if b is None else b / 2**20 for b in (w.rss_bytes_before, w.rss_bytes_after)]
            rss = "unknown" if None in mib else f"{mib[0]:.0f} -> {mib[1]:.0f} MiB"
            parts = ", ".join(f"{name} {(after - w.rss_by_process_before[name]) / 2**20:+.0f}"
                              for name, after in sorted(w.rss_by_process_after.items())
                              if name in w.rss_by_process_before)
            out.append(f"worker {w.url}: RSS {rss}{f' ({parts} MiB)' if parts else ''}, in flight after "
                       f"{w.in_flight_after}, adapter per-request state after {w.adapter_requests_after}")
        if self.frontend_rss_bytes_before is not None and self.frontend_rss_bytes_after is not None:
            out.append(f"frontend: RSS {self.frontend_rss_bytes_before / 2**20:.0f} -> "
                       f"{self.frontend_rss_bytes_after / 2**20:.0f} MiB")
        if self.costly is not None:
            out += self.costly.lines()
        out += [f"  e.g. {s}" for s in self.samples]
        return out


def summarize(answers: Sequence[Answer], verdicts: Sequence[Verdict], *, base_url: str, model: str,
              concurrency: int, duration_s: float, max_samples: int = 5) -> Summary:
    counts = Counter(v.status for v in verdicts)
    by_kind: dict[str, dict[str, int]] = {}
    for v in verdicts:
        row = by_kind.setdefault(v.plan.kind, {"requests": 0, "ok": 0})
        row["requests"] += 1
        row["ok"] += v.status == "ok"
    latencies = [a.latency_ms for a in answers if a.error is None]
    tokens = sum(a.completion_tokens for a in answers)
    bad = [v for v in verdicts if v.status != "ok"]
    return Summary(
        base_url=base_url, model=model, concurrency=concurrency, requests=len(answers),
        ok=counts["ok"], cross_talk=counts["cross_talk"], wrong_output=counts["wrong_output"], lost=counts["lost"],
        duplicated=counts["duplicated"], errors=counts["error"],
        p50_ms=percentile(latencies, 50), p95_ms=percentile(latencies, 95), p99_ms=percentile(latencies, 99),
        max_ms=max(latencies, default=0.0), duration_s=duration_s,
        requests_per_s=len(answers) / duration_s if duration_s > 0 else 0.0, completion_tokens=tokens,
        tokens_per_s=tokens / duration_s if duration_s > 0 else 0.0, streamed=sum(a.plan.stream for a in answers),
        by_kind=by_kind,
        samples=[f"request {v.plan.index} ({v.plan.kind}, {'stream' if v.plan.stream else 'json'}): "
                 f"{v.status}: {v.detail}" for v in bad[:max_samples]],
    )
