"""The router's one frozen config."""
from __future__ import annotations

from dataclasses import dataclass

from services.router.discovery import parse_replicas
from services.router.policies import DEFAULT_POLICY, POLICIES

DEFAULT_PORT = 50061     # the scheduler keeps 50051; a gateway points at either


@dataclass(frozen=True)
class RouterConfig:
    replicas: tuple[str, ...]
    policy: str = DEFAULT_POLICY
    predictor: str | None = None    # grpc://HOST:PORT; None: lengths default
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    hold_s: float = 30.0            # longest a request waits for a replica to be up
    load_interval_s: float = 0.1
    dns_refresh_s: float = 5.0
    grace_s: float = 5.0
    prefix_affinity: bool = True    # the prefix map, for the policies that read it

    def __post_init__(self) -> None:
        parse_replicas(",".join(self.replicas))
        if self.policy not in POLICIES:
            raise ValueError(f"unknown router policy {self.policy!r}; choose from "
                             f"{', '.join(sorted(POLICIES))}")
        if self.predictor is not None and not self.predictor.startswith("grpc://"):
            raise ValueError(f"--predictor must be grpc://HOST:PORT, got {self.predictor!r}")
        for name in ("hold_s", "load_interval_s", "dns_refresh_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
