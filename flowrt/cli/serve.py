"""``flowrt serve``: serve a Triton-style model repository over HTTP and gRPC (KServe v2)."""

from __future__ import annotations

import argparse
import errno
import signal
from pathlib import Path

import trio

from flowrt.errors import FlowrtError, InputError


def command(args: argparse.Namespace) -> int:
    """``flowrt serve``: see the module docstring. SIGTERM or Ctrl-C: the requests in flight
    finish, the models unload, and it exits 0."""
    try:
        import hypercorn  # noqa: F401
        import prometheus_client  # noqa: F401
    except ImportError as e:
        raise InputError(f"flowrt serve needs the serve extra: pip install 'flowrt[serve]' ({e})") from None
    if not args.no_grpc:
        try:
            import grpc  # noqa: F401
            import tritonclient.grpc  # noqa: F401
        except ImportError as e:
            raise InputError(
                f"flowrt serve's gRPC needs the serve extra: pip install 'flowrt[serve]', or --no-grpc ({e})"
            ) from None
    from flowrt.serve.server import serve

    if args.max_body_mib <= 0:
        raise InputError(f"--max-body-mib must be > 0, got {args.max_body_mib}")

    async def main() -> None:
        shutdown = trio.Event()
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                server, address = await nursery.start(
                    lambda task_status: serve(
                        Path(args.repository),
                        host=args.host,
                        http_port=args.http_port,
                        grpc_port=None if args.no_grpc else args.grpc_port,
                        backends=args.backends,
                        max_body_bytes=int(args.max_body_mib * 2**20),
                        shutdown=shutdown,
                        task_status=task_status,
                    )
                )
                ready = [e["name"] for e in server.index() if e["state"] == "READY"]
                grpc = "" if server.grpc_address is None else f", gRPC at {server.grpc_address}"
                print(
                    f"flowrt serve: {len(ready)} model(s) ({', '.join(ready)}) at {address}{grpc}", flush=True
                )
                async for _ in signals:
                    shutdown.set()
                    break

    try:
        trio.run(main)
    except BaseExceptionGroup as group:  # one error, however deep the nurseries: as it is
        inner = _only(group)
        if isinstance(inner, FlowrtError):
            raise inner from None
        if isinstance(inner, OSError) and inner.errno == errno.EADDRINUSE:  # hypercorn's bind
            raise InputError(
                f"flowrt serve cannot listen for HTTP on {args.host}:{args.http_port}: the address is in use"
            ) from None
        raise
    return 0


def _only(error: BaseException) -> BaseException:
    """The one exception inside nested groups of one exception each, else ``error`` itself."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
