"""Prometheus metrics of one server process (one Ray Serve replica), served at GET /metrics.

Each server gets its own CollectorRegistry, so several apps in one process (tests) do not collide.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_RATIO_BUCKETS = (0.05, 0.1, 0.125, 0.25, 0.333, 0.5, 0.75, 0.9, 1.0)


class ServerMetrics:
    """requests by outcome, errors by type, stage latencies, kept-token ratio, queue depth, in flight."""

    def __init__(self, pool=None):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("coverpruner_requests", "Chat completion requests by outcome "
                                "(ok, client_error, server_error, rejected, cancelled, timeout)", ["outcome"],
                                registry=r)
        self.errors = Counter("coverpruner_errors", "Error responses by OpenAI error code", ["code"], registry=r)
        self.stage_seconds = Histogram("coverpruner_stage_seconds", "Per-stage latency of finished generations",
                                       ["stage"], buckets=_LATENCY_BUCKETS, registry=r)
        self.completion_tokens = Counter("coverpruner_completion_tokens", "Generated tokens", registry=r)
        self.kept_ratio = Histogram("coverpruner_kept_token_ratio", "Kept visual tokens / visual tokens",
                                    buckets=_RATIO_BUCKETS, registry=r)
        self.queue_depth = Gauge("coverpruner_queue_depth", "Admitted requests waiting for a worker", registry=r)
        self.in_flight = Gauge("coverpruner_requests_in_flight", "Requests generating now", registry=r)
        if pool is not None:
            self.queue_depth.set_function(lambda: pool.queued)
            self.in_flight.set_function(lambda: pool.running)

    def observe_result(self, result) -> None:
        for stage, seconds in result.timings.items():
            self.stage_seconds.labels(stage).observe(float(seconds))
        self.completion_tokens.inc(len(result.token_ids))
        for image in getattr(result, "images", None) or []:  # per image; none for a text-only request
            self.kept_ratio.observe(len(image.kept_indices) / max(image.num_visual_tokens, 1))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
