"""GatewayConfig from flags and env, parsed in one place."""
from __future__ import annotations

import argparse

import pytest
from gateway.config import GatewayConfig, add_gateway_arguments, gateway_config


def parse(argv, environ=None):
    p = argparse.ArgumentParser()
    add_gateway_arguments(p)
    return gateway_config(p.parse_args(argv), environ or {}, model="m")


def test_defaults_are_open_and_loopback():
    config = parse([])
    assert config.is_open and config.host == "127.0.0.1" and config.served_model_name == "m"


def test_api_keys_from_flag_env_and_file(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\nk-file\n\nk-flag\n")
    config = parse(["--api-key", "k-flag", "--api-key-file", str(key_file)],
                   {"LENSERVE_API_KEY": "k-env1, k-env2"})
    assert config.api_keys == ("k-flag", "k-env1", "k-env2", "k-file")


def test_config_is_frozen_and_checked():
    config = parse(["--max-waiting", "8", "--served-model-name", "x", "--max-concurrency", "5"])
    assert config.max_waiting == 8 and config.served_model_name == "x"
    assert config.max_concurrency == 5
    with pytest.raises(AttributeError):
        config.port = 1
    with pytest.raises(ValueError):
        GatewayConfig(served_model_name="m", max_body_bytes=0)


def test_bound_socket_says_tcp_so_asyncio_sets_nodelay():
    import socket

    from gateway.server import bind
    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP and sock.getsockname()[1] > 0
    finally:
        sock.close()
