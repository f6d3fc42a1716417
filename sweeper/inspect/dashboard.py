"""``sweeper dashboard``: optuna-dashboard over the study's storage and artifact store."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wsgiref.types import WSGIApplication

from sweeper.config import SweeperConfig
from sweeper.errors import ConfigError
from sweeper.store import artifact_store, open_storage, redact


def serve(cfg: SweeperConfig, *, storage_url: str | None, host: str, port: int,
          echo: Callable[[str], None] = print) -> None:
    """Blocks serving the dashboard. Binds loopback unless ``host`` says otherwise."""
    from optuna_dashboard import run_server

    url = storage_url or cfg.study.resolved_storage
    # the tuned storage (WAL, busy timeout) so that reading never disturbs a live sweep
    storage = open_storage(url, create=False)
    store = artifact_store(cfg.study.resolved_artifacts)
    echo(f"optuna-dashboard for study {cfg.study.name!r} ({redact(url)})")
    echo(f"open http://{host}:{port}/dashboard/")
    try:
        run_server(storage, host=host, port=port, artifact_store=store)
    except OSError as exc:  # the port taken, or an address not here (a request's own errors stay inside)
        raise ConfigError(f"--host {host} --port {port}: cannot serve there ({exc.strerror or exc})") from exc


def app(cfg: SweeperConfig, storage_url: str | None = None) -> WSGIApplication:
    """The WSGI app, for tests and for serving behind another server."""
    from optuna_dashboard import wsgi

    storage = open_storage(storage_url or cfg.study.resolved_storage, create=False)
    return wsgi(storage, artifact_store=artifact_store(cfg.study.resolved_artifacts))
