"""``lenserve serve`` as a user runs it: prints the URL, serves, stops cleanly on Ctrl-C."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[2]


def test_serve_fake_model_then_ctrl_c(tmp_path):
    log = tmp_path / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "LENSERVE_API_KEY": "k1"}
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "lenserve.cli", "serve", "--model", "fake",
                                 "--port", "0"], cwd=ROOT, env=env, stderr=err)
    try:
        url = wait_for_url(log, proc)
        client = openai.OpenAI(base_url=url, api_key="k1", max_retries=0)
        out = client.completions.create(model="fake", prompt="hi", max_tokens=3)
        assert out.usage.completion_tokens == 3
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    # uvicorn drains, then re-raises the SIGINT it caught: 130, the shell's code for Ctrl-C.
    text = log.read_text()
    assert rc in (0, 130) and "Traceback" not in text, text
    assert "API key required" in text
    # The dtype the model runs in; the model-free executor keeps its KV as int64 token ids.
    assert "lenserve serving fake (int64) at http" in text, text


def wait_for_url(log: Path, proc: subprocess.Popen, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(r"http://127\.0\.0\.1:\d+/v1", log.read_text())
        if found:
            return found.group(0)
        assert proc.poll() is None, log.read_text()
        time.sleep(0.2)
    raise AssertionError("lenserve serve printed no URL: " + log.read_text())
