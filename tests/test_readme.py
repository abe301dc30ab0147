"""The README runs as pasted: every code block in it is run here, as a user would run it (a
server block in the background while the client blocks after it run against it), except the
few named in ``NOT_RUN`` with the reason. A new block that this file does not know fails the
suite, so the README cannot grow an example nobody runs."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w*)\n(.*?)```", README, re.DOTALL)]

SETUP = ("python3 -m pip install torch==2.13.0 && python3 -m pip install -e . && "
         "lenserve generate --model opt-125m")
CPU_TORCH = "python3 -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
# Blocks not run here, and why.
NOT_RUN = {
    CPU_TORCH: "installs from PyTorch's index, which CI does not reach; the suite runs on it",
    "bash scripts/test.sh": "the test command itself",
    "docker compose up": "no Docker on CI; tests/test_deploy.py checks the compose file",
    "chat app ──REST/SSE": "the system picture",
}
# Every other block, by a phrase it contains -> the test that runs it.
RUN = {
    SETUP: "test_main_job",
    "lenserve bench --backends": "test_policy_comparison",
    "from lenserve import LLM": "test_python_api",
    "lenserve serve --model opt-125m": "test_serve_with_curl_and_openai",
    "curl -s http://127.0.0.1:8000": "test_serve_with_curl_and_openai",
    "from openai import OpenAI": "test_serve_with_curl_and_openai",
    "lenserve up --model opt-125m": "test_up_with_the_sdk",
    "from lenserve.client import Client": "test_up_with_the_sdk",
    "lenserve generate --model ./my-llama": "test_real_checkpoint",
}


def block(phrase: str) -> str:
    found = [code for _, code in BLOCKS if phrase in code]
    assert len(found) == 1, f"{len(found)} README blocks contain {phrase!r}"
    return found[0]


def test_every_block_is_run_or_named_with_a_reason():
    for lang, code in BLOCKS:
        known = [p for p in (*NOT_RUN, *RUN) if p in code]
        assert len(known) == 1, f"README block not covered by tests/test_readme.py:\n{code}"


def test_setup_commands_are_what_ci_runs():
    assert SETUP in README and CPU_TORCH in README
    assert "exec bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    # The README's install steps are the test script's own, so CI runs them on every clone.
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "pip install -q torch==2.13.0" in script and "pip install -q -e '.[test]'" in script
    # The CPU line comes before the command a CPU user would otherwise copy first.
    assert README.index(CPU_TORCH) < README.index(SETUP)


def test_readme_is_a_front_door():
    assert len(README.splitlines()) <= 250


def run(cmd: str, *, lang: str = "bash", cwd: Path = ROOT, timeout: float = 600):
    argv = [sys.executable, "-c", cmd] if lang == "python" else ["bash", "-euo", "pipefail", "-c", cmd]
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert proc.returncode == 0, f"{cmd}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    return proc


def test_main_job():
    steps = block(SETUP).strip().split(" && ")
    # The two installs are scripts/test.sh's own (see above); the job runs here as pasted.
    assert [s for s in steps if not s.startswith("python3 -m pip install")] == [steps[-1]]
    out = run(steps[-1]).stdout
    assert out.strip(), "the main job printed nothing"


def test_policy_comparison():
    out = run(block("lenserve bench --backends")).stdout
    for name in ("lenserve:vllm", "lenserve:alise"):
        assert name in out


def test_python_api():
    assert run(block("from lenserve import LLM"), lang="python").stdout.strip()


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:      # it already exited (and the test says why)
        pass


@contextmanager
def background(cmd: str, ready, timeout: float = 300):
    """``cmd`` as a server in its own process group until the block ends; ``ready()`` says
    when it answers."""
    for port in (8000, 50051):
        assert not _port_open(port), f"port {port} is taken: the README's commands use it"
    proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, f"{cmd} exited:\n{proc.stdout.read()[-3000:]}"
            assert time.monotonic() < deadline, f"{cmd} not ready in {timeout} s"
            time.sleep(0.5)
        yield proc
    finally:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        deadline = time.monotonic() + 30
        while (_port_open(8000) or _port_open(50051)) and time.monotonic() < deadline:
            time.sleep(0.2)


def test_serve_with_curl_and_openai():
    import json

    with background(block("lenserve serve --model opt-125m"),
                    lambda: _http_ok("http://127.0.0.1:8000/health")):
        reply = json.loads(run(block("curl -s http://127.0.0.1:8000")).stdout)
        assert reply["choices"][0]["message"]["role"] == "assistant", reply
        assert reply["usage"]["completion_tokens"] > 0
        run(block("from openai import OpenAI"), lang="python", timeout=120)


def test_up_with_the_sdk():
    with background(block("lenserve up --model opt-125m"),
                    lambda: _port_open(50051) and _http_ok("http://127.0.0.1:8000/health")):
        out = run(block("from lenserve.client import Client"), lang="python", timeout=120).stdout
        assert out, "the SDK streamed nothing"


def test_real_checkpoint(tmp_path):
    """A Llama checkpoint as ``save_pretrained`` writes it, with a tokenizer: random weights of
    a tiny shape, since no real weights can be fetched here."""
    pytest.importorskip("transformers")
    make_checkpoint(tmp_path / "my-llama")
    run(block("lenserve generate --model ./my-llama"), cwd=tmp_path)


def make_checkpoint(path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from services.executor.models.naming import model_tokenizer

    tokenizer = model_tokenizer("llama-tiny")   # the presets' WordPiece tokenizer, as files
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, eos_token_id=tokenizer.sep_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def test_policy_figures_are_the_results_page_s():
    """Each figure of the README's policy table is what the results page's JSON gives, so a
    re-run of ``benchmarks/policies_simulated.py`` that moves one fails here until the README
    follows."""
    import json

    sys.path.insert(0, str(ROOT))
    from benchmarks import tables

    found = json.loads((ROOT / "docs" / "results" / "policies_simulated.json").read_text())["runs"]
    base = tables.sustained_rate(tables.nl_points(found, "vllm"), 0.05)[0]
    rows = re.findall(r"^\| `([\w-]+)` \|.*\| ([<≥]?)(\d+\.\d\d)x \|$", README, re.MULTILINE)
    assert len(rows) == 14
    for policy, mark, figure in rows:
        label = "alise (embedded)" if policy == "alise" else policy
        rate, note = tables.sustained_rate(tables.nl_points(found, label), 0.05)
        assert (mark, figure) == ({">=": "≥"}.get(note, note), f"{rate / base:.2f}"), policy
    assert f"over `vllm`'s {base:.2f} req/s" in README
