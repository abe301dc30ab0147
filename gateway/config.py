"""The gateway's one frozen config, and the only place it is parsed (CLI flags and env)."""
from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lenserve_contract.sampling_params import MAX_N

log = logging.getLogger(__name__)

API_KEY_ENV = "LENSERVE_API_KEY"


@dataclass(frozen=True)
class GatewayConfig:
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()          # none: the API is open (keep it on loopback)
    max_body_bytes: int = 1 << 20
    max_prompt_len: int = 100_000           # characters of text, or token ids
    max_tokens_limit: int = 4096            # the largest max_tokens accepted
    default_max_tokens: int = 16            # /v1/completions without max_tokens (OpenAI's)
    default_chat_max_tokens: int = 512      # /v1/chat/completions without max_tokens
    max_waiting: int | None = None          # 429 once this many requests wait for admission
    retry_after_s: int = 1
    max_concurrency: int | None = None      # open requests beyond it get 503 before any parsing
    stats_interval_s: float = 0.05          # how stale the admission check's queue length may be
    max_n: int = 16                         # the largest n (samples per request) accepted

    def __post_init__(self) -> None:
        positive = ("max_body_bytes", "max_prompt_len", "max_tokens_limit", "default_max_tokens",
                    "default_chat_max_tokens", "retry_after_s")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.max_waiting is not None and self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if not 1 <= self.max_n <= MAX_N:
            raise ValueError(f"max_n must be in [1, {MAX_N}], got {self.max_n}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")

    @property
    def is_open(self) -> bool:
        return not self.api_keys


def add_gateway_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--served-model-name", help="model name the API reports (default: --model)")
    p.add_argument("--api-key", action="append", default=[],
                   help=f"bearer key clients must send (repeatable; also ${API_KEY_ENV}, "
                        "comma-separated); none: the API is open")
    p.add_argument("--api-key-file", help="file with one API key per line (# comments)")
    p.add_argument("--max-body-bytes", type=int, default=GatewayConfig.max_body_bytes)
    p.add_argument("--max-prompt-len", type=int, default=GatewayConfig.max_prompt_len,
                   help="characters of a text prompt or number of prompt token ids")
    p.add_argument("--max-tokens-limit", type=int, default=GatewayConfig.max_tokens_limit)
    p.add_argument("--max-n", type=int, default=GatewayConfig.max_n,
                   help=f"the largest n (parallel samples of one prompt) a request may ask "
                        f"for, at most {MAX_N}; above it a 400")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="answer 429 once this many requests wait for admission (default: no bound)")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="open requests and connections beyond this are answered 503 at once "
                        "(default: no bound)")
    p.add_argument("--retry-after", type=int, default=GatewayConfig.retry_after_s,
                   help="seconds sent in Retry-After with a 429")


def read_api_keys(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, ...]:
    keys = list(args.api_key or [])
    keys += [k.strip() for k in environ.get(API_KEY_ENV, "").split(",")]
    if args.api_key_file:
        lines = Path(args.api_key_file).read_text().splitlines()
        keys += [line.strip() for line in lines if not line.lstrip().startswith("#")]
    return tuple(dict.fromkeys(k for k in keys if k))


def gateway_config(args: argparse.Namespace, environ: Mapping[str, str] | None = None,
                   model: str = "") -> GatewayConfig:
    """The config from the flags above (and ``$LENSERVE_API_KEY``)."""
    environ = os.environ if environ is None else environ
    config = GatewayConfig(
        served_model_name=args.served_model_name or model, host=args.host, port=args.port,
        api_keys=read_api_keys(args, environ), max_body_bytes=args.max_body_bytes,
        max_prompt_len=args.max_prompt_len, max_tokens_limit=args.max_tokens_limit,
        max_waiting=args.max_waiting, retry_after_s=args.retry_after,
        max_concurrency=args.max_concurrency, max_n=args.max_n)
    if config.is_open and not is_loopback(config.host):
        log.warning("the API is open (no API key) and bound to %s, beyond loopback", config.host)
    return config


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
