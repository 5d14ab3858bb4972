"""The same FastAPI app on Ray Serve: K replicas, each loading its own pipelines (``serve.ingress``).

Each replica builds the app with ``create_app(config)`` when it starts (late-bound ingress), so every
replica owns ``config.workers`` pipelines and their KV buffers; Ray Serve's proxy spreads requests over
the replicas. A replica admits at most ``workers + max_queue`` requests (Ray's ``max_ongoing_requests``),
and Ray's proxy holds at most ``max_queue`` more before it answers 503 itself, so the whole deployment is
bounded like one server rather than piling requests onto one replica.
"""

from __future__ import annotations

import signal
import time

from coverpruner.serving.app import ServerConfig

#: Requests a replica takes beyond generations (health checks, /metrics) before Ray holds them back.
_CONTROL_SLOTS = 4


def deployment(config: ServerConfig, replicas: int, num_cpus: float = 1.0):
    """A bound Ray Serve application of ``replicas`` replicas serving ``config``."""
    from ray import serve

    from coverpruner.serving.app import create_app

    # an explicit --max-batch B lets each worker hold B requests; auto (None) keeps Ray's limit at one per worker
    slots = config.workers * (config.max_batch or 1)

    @serve.deployment(name="coverpruner", num_replicas=replicas,
                      max_ongoing_requests=slots + config.max_queue + _CONTROL_SLOTS,
                      max_queued_requests=max(config.max_queue, 1),
                      ray_actor_options={"num_cpus": num_cpus})
    @serve.ingress()
    class CoverPrunerReplica:
        def __init__(self, cfg: ServerConfig):
            self.cfg = cfg

        def __serve_build_asgi_app__(self):
            from coverpruner.serving.memory import freeze_startup_heap, leave_full_collections_to_the_engines

            app = create_app(self.cfg)
            freeze_startup_heap()  # as coverpruner-serve's process: full collections skip the replica's own heap
            leave_full_collections_to_the_engines()
            return app

    return CoverPrunerReplica.bind(config)


def run(config: ServerConfig, replicas: int, host: str, port: int, address: str | None = None,
        num_cpus: float = 1.0, blocking: bool = True) -> None:
    """Connect to the Ray cluster at ``address`` (a new local instance when None), start Serve's HTTP
    proxy on host:port and deploy. blocking: serve until interrupted, then shut Serve and Ray down."""
    import ray
    from ray import serve

    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    if blocking:
        # Stop on SIGINT and SIGTERM alike, also when started with SIGINT ignored (a background job of a
        # non-interactive shell); installed after ray.init, whose own SIGTERM handler logs and exits without
        # shutting Serve down (seen in the CLI test).
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _interrupt)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(deployment(config, replicas, num_cpus), name="coverpruner", route_prefix="/", blocking=False)
        if not blocking:
            return
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if blocking:
            for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal must not cut the clean-up short
                signal.signal(sig, signal.SIG_IGN)
            serve.shutdown()
            ray.shutdown()


def _interrupt(signum, frame):
    raise KeyboardInterrupt()
