"""What a worker does for its host besides running jobs: checks, preloading, /metrics.

OwnHost      ``rq worker agents``: the worker is alone on its host as far as it
             knows; it runs the checks of ``agent-worker check``, preloads the
             configuration and serves /metrics and /healthz itself
(a member)   a worker forked by ``agent-worker pool``: the pool did the first two
             once for every worker it forks, and serves the host's one /metrics;
             the member forwards its metrics there (``worker.daemon.pool``)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from prometheus_client import write_to_textfile
from redis import Redis

from worker.exceptions import WorkerError
from worker.logs import log_event
from worker.metrics import start_metrics_server, stop_metrics_server, worker_metrics
from worker.operations import check_at_start
from worker.settings import Settings


class OwnHost:
    """The host duties of a worker started on its own (``rq worker agents``)."""

    def prepare(
        self, settings: Settings, connection: Redis, preload: Callable[[frozenset[str]], None]
    ) -> None:
        """The checks of ``agent-worker check`` (an error stops here), then ``preload`` of the
        providers the agents name. The definitions read are cached in Redis for the first tasks."""
        preload(check_at_start(settings, agent_cache=connection))

    def tasks_at_once(self, settings: Settings) -> int:
        return settings.worker_concurrency

    def serve_metrics(
        self, settings: Settings, health_client: Callable[[], Redis], queue_names: Sequence[str]
    ) -> int | None:
        return start_metrics_server(
            settings.metrics_port,
            health_client,
            queue_names=queue_names,
            host=settings.metrics_host,
        )

    def stop_serving(self, settings: Settings) -> None:
        write_metrics_textfile(settings)
        stop_metrics_server()


# Stateless: every worker started on its own shares it.
OWN_HOST = OwnHost()


def preload_configuration(providers: frozenset[str]) -> None:
    """Parse MCP_CONFIG, GRANT_POLICY and PRICES_FILE once; a bad file stops start-up."""
    from worker.pipeline import preload

    try:
        preload(providers)
    except WorkerError as exc:
        print(f"agent-worker: {exc.message}", file=sys.stderr)
        raise SystemExit(2) from None


def write_metrics_textfile(settings: Settings) -> None:
    """For burst or cron workers nobody scrapes: the textfile-collector convention."""
    path = settings.metrics_textfile
    if path is None:
        return
    try:
        write_to_textfile(str(path), worker_metrics().registry)
    except OSError as exc:
        log_event("metrics_textfile_failed", level="error", path=str(path), error=str(exc))
