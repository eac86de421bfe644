"""Start the server: bind, print where it listens, serve until interrupted, close the record."""
from __future__ import annotations

import importlib.util
import signal
import socket
import sys

from kvsim.errors import ConfigError
from kvsim.serve.config import ServeConfig


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port); a busy port is a ConfigError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(config: ServeConfig, announce=print) -> None:
    """Run ``kvsim serve`` in this process until SIGINT/SIGTERM."""
    missing = [m for m in ("uvicorn", "starlette", "pydantic", "httpx", "prometheus_client")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"kvsim serve needs the optional packages {', '.join(missing)} "
                          "(pip install 'kvsim[serve]')")
    import uvicorn

    from kvsim.serve.app import build_app
    from kvsim.serve.service import CacheService

    service = CacheService(config)
    proxy = None
    if config.upstream is not None:
        from kvsim.serve.proxy import Proxy

        proxy = Proxy(service, config.upstream, config.upstream_api_key, config.upstream_timeout)
    sock = bind(config.host, config.port)
    port = sock.getsockname()[1]
    app = build_app(service, proxy)
    uv = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                        limit_concurrency=4096)
    server = uvicorn.Server(uv)
    host = f"[{config.host}]" if ":" in config.host else config.host
    mode = f"proxy to {config.upstream}" if proxy is not None else "synthetic replies"
    if service.timed is not None:
        t = service.timed
        mode += f", --replay timed ({t.cost.describe()}; scheduler defaults: {t.defaults})"
    announce(f"kvsim serve: {config.policy} cache model, {mode}, model {config.served_model_name!r}"
             f"{' + ' + str(len(config.lora_modules)) + ' LoRA adapter(s)' if config.lora_modules else ''}, "
             f"max_model_len {service.max_model_len}")
    if service.recorder is not None:
        rec = service.recorder
        note = f" (appending after {rec.existing_lines} existing lines)" if rec.existing_lines else ""
        announce(f"recording to {rec.path}{note}")
    if config.api_key is None and config.host not in ("127.0.0.1", "localhost", "::1"):
        announce(f"warning: listening on {config.host} without --api-key: anyone who can reach it can use it")
    announce(f"listening on http://{host}:{port}/v1")
    sys.stdout.flush()
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal: end quietly
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        if proxy is not None:
            proxy.close_sync()
        service.close()
        sock.close()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
