"""A profile says which dtype and device it timed, and ``simulate`` says when it is asked to
model another: a float32 profile standing for a bfloat16 run predicted 4x its latency."""
from __future__ import annotations

import dataclasses
import json

import pytest

from lenserve.cli import main
from services.simulator.profile_file import Profile, ProfilePoint, load_profile
from services.simulator.target import from_profile, from_roofline, precision_mismatch, \
    resolve_dtype
from tests.simulator.sim_helpers import SHAPE


def _save(tmp_path, dtype: str, device: str = "cpu"):
    points = tuple(ProfilePoint(((1, q, 0),), (0.001 * q, 0.001 * q)) for q in (1, 4, 16, 64))
    path = tmp_path / "p.json"
    Profile(dataclasses.replace(SHAPE, dtype=dtype), device, 4, 64, points).save(path)
    return path


def test_the_profile_records_its_dtype_beside_its_device(tmp_path):
    path = _save(tmp_path, "bfloat16")
    data = json.loads(path.read_text())
    assert (data["dtype"], data["device"]) == ("bfloat16", "cpu")
    assert load_profile(path).shape.dtype == "bfloat16"


def test_a_dtype_that_contradicts_the_models_is_refused(tmp_path):
    path = _save(tmp_path, "bfloat16")
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "dtype": "float32"}))
    with pytest.raises(ValueError, match="'float32' but the model's is 'bfloat16'"):
        load_profile(path)


def test_a_profile_without_the_top_level_dtype_reads_the_models(tmp_path):
    path = _save(tmp_path, "float32")
    data = json.loads(path.read_text())
    del data["dtype"]
    path.write_text(json.dumps(data))
    assert load_profile(path).shape.dtype == "float32"


@pytest.mark.parametrize("dtype", ["auto", "float32", "bfloat16"])
@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
def test_auto_resolves_as_the_executor_does(dtype, device):
    from services.executor.models.loader import resolve_dtype as executor_resolve
    assert resolve_dtype(dtype, device) == executor_resolve(dtype, device)


def test_a_mismatch_is_one_line_naming_both_settings(tmp_path):
    target = from_profile(str(_save(tmp_path, "float32")))
    assert precision_mismatch(target, "float32", "cpu") is None
    line = precision_mismatch(target, "bfloat16", "cpu")
    assert "\n" not in line and "measured in float32 on cpu" in line
    assert "bfloat16 on cpu is asked" in line and "--dtype bfloat16" in line
    assert "measured in float32 on cpu" in precision_mismatch(target, "float32", "cuda:0")


def test_the_roofline_is_never_a_mismatch():
    assert precision_mismatch(from_roofline("a100-80g", "llama-2-7b"), "float32", "cpu") is None


def _simulate(capsys, *flags) -> str:
    assert main(["simulate", "--num-prompts", "4", "--request-rate", "4", "--disable-tqdm",
                 "--predictor", "none", *flags]) == 0
    return capsys.readouterr().err


def test_simulate_with_the_bundled_profile_says_what_it_models(capsys):
    bundled = load_profile(_bundled())
    assert (bundled.shape.dtype, bundled.device) == ("float32", "cpu")
    err = _simulate(capsys, "--dtype", "float32")
    assert "modelling opt-125m in float32 on cpu" in err and "note:" not in err
    err = _simulate(capsys, "--dtype", "bfloat16")
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "measured in float32 on cpu" in notes[0]


def _bundled():
    from importlib import resources
    return resources.files("lenserve.data") / "profile_opt-125m_cpu.json"
