import json

import pytest

from services.simulator.profile_file import Profile, ProfilePoint, load_profile
from services.simulator.target import from_profile
from tests.simulator.sim_helpers import SHAPE


def _profile() -> Profile:
    points = tuple(ProfilePoint(((1, q, 0),), (0.001 * q, 0.001 * q)) for q in (1, 4, 16, 64))
    return Profile(SHAPE, "cpu", 4, 64, points, meta={"date": "today"})


def test_round_trip_and_fit(tmp_path):
    path = tmp_path / "p.json"
    _profile().save(path)
    loaded = load_profile(path)
    assert loaded.shape == SHAPE and loaded.points == _profile().points
    target = from_profile(str(path))
    assert target.num_gpu_blocks == 64 and target.block_size == 4
    assert any("fit over 4 points" in note for note in target.notes)


def test_profile_of_another_model_is_refused(tmp_path):
    path = tmp_path / "p.json"
    _profile().save(path)
    with pytest.raises(ValueError, match="measured on 'tiny-shape', not 'opt-125m'"):
        from_profile(str(path), "opt-125m")


@pytest.mark.parametrize("text", ["not json", "{}", json.dumps({"format": "lenserve-profile"}),
                                  "CORRUPT_POINT"])
def test_corrupt_profile_is_a_clear_error(tmp_path, text):
    path = tmp_path / "p.json"
    if text == "CORRUPT_POINT":
        data = _profile().to_json()
        data["points"][0]["seconds"] = [-1.0]
        text = json.dumps(data)
    path.write_text(text)
    with pytest.raises(ValueError, match="is not a valid lenserve profile"):
        load_profile(path)


def test_missing_profile_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_profile(tmp_path / "absent.json")
