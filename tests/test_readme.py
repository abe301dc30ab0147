"""The README's set-up section: its two commands as CI and users run them, and what the torch
install really gives on a CPU-only machine."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
SETUP = README[README.index("## Set up and run"):README.index("## The system")]


def test_setup_commands_stay_as_they_are():
    assert ("python3 -m pip install torch==2.13.0 && python3 -m pip install -e . && "
            "lenserve generate --model opt-125m") in SETUP
    assert "bash scripts/test.sh" in SETUP
    assert "exec bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_setup_says_pypi_torch_is_the_cuda_build_and_gives_the_cpu_index():
    assert "CUDA one" in SETUP
    assert ("python3 -m pip install torch==2.13.0 --index-url "
            "https://download.pytorch.org/whl/cpu") in SETUP
