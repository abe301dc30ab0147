"""Where the replicas are: a static list (``HOST:PORT,HOST:PORT``) or a DNS name resolved
again every ``refresh_s`` (``dns://NAME:PORT``: a Kubernetes headless service answers with one
address per ready pod), so that replicas join and leave without restarting the router."""
from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)
DNS_SCHEME = "dns://"


def parse_replicas(text: str) -> tuple[str, ...]:
    """``a:1,b:2`` or ``dns://name:port`` -> the targets, checked (ValueError says why)."""
    items = tuple(i.strip().removeprefix("grpc://") for i in text.split(",") if i.strip())
    if not items:
        raise ValueError("--replicas names no replica: give HOST:PORT[,HOST:PORT...] or "
                         "dns://NAME:PORT")
    for item in items:
        _, sep, port = item.removeprefix(DNS_SCHEME).rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"replica {item!r} is not HOST:PORT or dns://NAME:PORT")
    if any(i.startswith(DNS_SCHEME) for i in items) and len(items) > 1:
        raise ValueError("dns://NAME:PORT stands alone: the name's addresses are the replicas")
    return items


async def resolve(target: str) -> list[str]:
    """The replicas a ``dns://NAME:PORT`` names now (``HOST:PORT`` each, sorted)."""
    name, _, port = target.removeprefix(DNS_SCHEME).rpartition(":")
    infos = await asyncio.get_running_loop().getaddrinfo(name, int(port),
                                                         type=socket.SOCK_STREAM)
    addrs = {f"[{i[4][0]}]:{port}" if ":" in i[4][0] else f"{i[4][0]}:{port}" for i in infos}
    return sorted(addrs)


async def follow(replicas: tuple[str, ...], apply: Callable[[list[str]], None],
                 refresh_s: float) -> None:
    """Apply the static list once, or a DNS name's addresses now and on every refresh (a
    lookup that fails keeps the last answer: a DNS blip must not drain every replica)."""
    if not replicas[0].startswith(DNS_SCHEME):
        apply(list(replicas))
        return
    while True:
        try:
            apply(await resolve(replicas[0]))
        except OSError as exc:
            log.warning("cannot resolve %s (keeping the last answer): %s", replicas[0], exc)
        await asyncio.sleep(refresh_s)
