"""CLI: `python -m app {api,worker,migrate,token,dashboard-token,demo}`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Sequence

from agent_async import AgentError, ConfigurationError
from agent_async.logs import configure_logging
from agent_async.storage.engine import describe, parse_url
from app.db import require_async_url
from app.settings import AppSettings

logger = logging.getLogger("app")

# Exit codes: the invocation or its settings are wrong / the command could not do its work.
EXIT_USAGE = 2
EXIT_FAILURE = 1
# Commands that open the database (the token command never does).
_DATABASE_COMMANDS = frozenset({"api", "worker", "migrate", "demo"})


class CliError(Exception):
    """A failure reported as one line on stderr, with its exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _check_bindable(host: str, port: int) -> None:
    """Fail before the app starts (and connects to Redis) if the address cannot be listened on.

    hypercorn binds only after the app's start-up and lets the OSError escape as a traceback.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as hypercorn does
            sock.bind(address)
    except OSError as exc:  # socket.gaierror included
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _stop_event() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM, so servers shut down cleanly (lifespan, worker hooks)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _serve_api(settings: AppSettings, host: str, port: int) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from app.factory import create_app

    settings.require_secret()  # fail before binding, with the message naming AGENT_SECRET_KEY
    _check_bindable(host, port)
    # app/hypercorn_config.py: what `hypercorn --config python:app.hypercorn_config` would load too.
    config = Config.from_object("app.hypercorn_config")
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    stop = _stop_event()
    logger.info("API on http://%s:%d (OpenAPI at /openapi.json, docs at /docs)", host, port)
    try:
        await serve(create_app(settings), config, shutdown_trigger=stop.wait)
    except OSError as exc:  # the port was taken between the check and hypercorn's bind
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


async def _run_worker(settings: AppSettings) -> None:
    from app.factory import create_app
    from app.runtime import EXTENSION_KEY, AppRuntime

    runtime: AppRuntime = create_app(settings).extensions[EXTENSION_KEY]
    try:
        # arq owns SIGINT/SIGTERM: stop taking jobs, let running ones finish within
        # AGENT_SHUTDOWN_DRAIN_SECONDS, then hand the rest back according to their `resume`.
        await runtime.agent.run_worker(handle_signals=True)
    except asyncio.CancelledError:
        logger.info("worker stopped")
    finally:
        await runtime.agent.close()


def _migrate(settings: AppSettings) -> int:
    from app.migrate import upgrade

    upgrade(settings.agent.database_url)
    print(f"migrated {describe(parse_url(settings.agent.database_url))}: blob store and app tables at head")
    return 0


def _token(settings: AppSettings, uid: str, admin: bool) -> int:
    from app.auth import TokenSigner

    signer = TokenSigner(settings.require_secret(), max_age_s=settings.token_max_age_s)
    try:
        token = signer.issue(uid, admin=admin)
    except ValueError as exc:
        raise CliError(f"invalid uid {uid!r}: {exc}", EXIT_USAGE) from None
    print(token)
    return 0


def _dashboard_token(settings: AppSettings, uid: str, role: str) -> int:
    from app.dashboard.session import DashboardRole, DashboardSigner

    signer = DashboardSigner(
        settings.require_secret(), token_max_age_s=settings.dashboard_token_max_age_s,
        session_max_age_s=settings.dashboard_session_max_age_s,
    )
    try:
        token = signer.issue_sign_in(uid, DashboardRole(role))
    except ValueError as exc:
        raise CliError(f"invalid uid {uid!r}: {exc}", EXIT_USAGE) from None
    print(token)
    minutes = settings.dashboard_token_max_age_s / 60
    print(f"paste it at /admin/ui/login within {minutes:g} min (it signs in {uid} as {role})", file=sys.stderr)
    return 0


def _port(raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {raw!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {port}")
    return port


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app", description="agent-async reference application")
    commands = parser.add_subparsers(dest="command", required=True)
    api = commands.add_parser("api", help="serve the HTTP API with hypercorn")
    api.add_argument("--host", help="bind address (default: $AGENT_HOST or 127.0.0.1)")
    api.add_argument("--port", type=_port, help="port (default: $AGENT_PORT or 8000)")
    commands.add_parser("worker", help="run a job worker (same as `arq app.worker.WorkerSettings`)")
    commands.add_parser("migrate", help="create or upgrade the blob store and app tables")
    token = commands.add_parser("token", help="print a bearer token for a user")
    token.add_argument("uid", help="the user id the token carries")
    token.add_argument("--admin", action="store_true", help="set the admin flag")
    dash = commands.add_parser("dashboard-token", help="print a sign-in token for the dashboard (/admin/ui)")
    dash.add_argument("uid", help="who signs in (shown in the dashboard and its change logs)")
    dash.add_argument("--role", choices=("viewer", "operator"), required=True,
                      help="viewer: sees everything, changes nothing; operator: may act")
    demo = commands.add_parser("demo", help="migrate, start API and worker, run a scripted scenario")
    demo.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    demo.add_argument("--port", type=_port, help="port (default: $AGENT_PORT or 8000; 0 picks a free one)")
    demo.add_argument("--once", action="store_true", help="exit after the scenario instead of serving on")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = AppSettings.from_env()
        configure_logging(settings.agent.log_format)
        if args.command in _DATABASE_COMMANDS:
            require_async_url(settings.agent.database_url)  # one clear line, not a traceback at connect
        port = settings.port if getattr(args, "port", None) is None else args.port
        if args.command == "api":
            asyncio.run(_serve_api(settings, args.host or settings.host, port))
            return 0
        if args.command == "worker":
            asyncio.run(_run_worker(settings))
            return 0
        if args.command == "migrate":
            return _migrate(settings)
        if args.command == "token":
            return _token(settings, args.uid, args.admin)
        if args.command == "dashboard-token":
            return _dashboard_token(settings, args.uid, args.role)
        from app.demo import run_demo

        return run_demo(settings, host=args.host, port=port, once=args.once)
    except ConfigurationError as exc:
        # The settings are wrong (a usage error): one clear line, no traceback.
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except AgentError as exc:
        # Redis or the database unreachable, and the like: one clear line, no traceback.
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
