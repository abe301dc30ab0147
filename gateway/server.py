"""Running an app under uvicorn on a socket bound first, so port 0 (a free port) is known
before serving starts and the caller can print or hand out the URL."""
from __future__ import annotations

import socket
import threading

import uvicorn


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it a keep-alive response waits out the client's delayed ACK (40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def make_server(app, log_level: str = "warning", loop: str = "auto") -> uvicorn.Server:
    """``loop``: uvicorn's event loop, "auto" (uvloop where installed) or "asyncio"; see
    ``gateway.__main__`` for why the gateway in front of the gRPC scheduler takes asyncio."""
    # Keep-alive beyond uvicorn's 5 s default: benchmark clients reuse idle connections.
    # No limit_concurrency: the app's guard bounds open requests and answers 503 in the
    # OpenAI error shape; uvicorn's own 503 is plain text.
    config = uvicorn.Config(app, log_level=log_level, loop=loop, timeout_keep_alive=30,
                            timeout_graceful_shutdown=5)
    return uvicorn.Server(config)


class ServerThread:
    """uvicorn in a background thread (tests, benchmarks); ``stop()`` shuts it down."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        self.sock = bind(host, port)
        self.url = url_of(self.sock)
        self.server = make_server(app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        self.thread.start()
        for _ in range(int(timeout_s / 0.01)):
            if self.server.started:
                return self
            self.thread.join(0.01)
        raise RuntimeError("the gateway did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
