"""The measured profile: a JSON file of the model's shape, where it was measured and the raw
points (a batch, described as groups of identical sequences, and its measured seconds)."""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from services.simulator.cost_model import FitReport, LinearCostModel, fit_linear
from services.simulator.features import IterationFeatures, from_groups
from services.simulator.shapes import ModelShape

FORMAT = "lenserve-profile"
VERSION = 1


@dataclass(frozen=True)
class ProfilePoint:
    groups: tuple[tuple[int, int, int], ...]     # (count, tokens fed each, computed each)
    seconds: tuple[float, ...]                   # one per repeat

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def features(self) -> IterationFeatures:
        return from_groups(list(self.groups))


@dataclass(frozen=True)
class Profile:
    shape: ModelShape
    device: str
    block_size: int
    num_gpu_blocks: int          # the pool the real executor builds by default on this device
    points: tuple[ProfilePoint, ...]
    knots: tuple[int, ...] = ()
    meta: dict | None = None     # device name, threads, backend, versions, date (not read back)

    def fit(self) -> tuple[LinearCostModel, FitReport]:
        return fit_linear([p.features for p in self.points], [p.median_s for p in self.points],
                          self.knots)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "model": self.shape.as_dict(),
                "device": self.device, "block_size": self.block_size,
                "num_gpu_blocks": self.num_gpu_blocks, "knots": list(self.knots),
                "meta": self.meta or {},
                "points": [{"groups": [list(g) for g in p.groups], "seconds": list(p.seconds)}
                           for p in self.points]}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))


def load_profile(path: str | Path) -> Profile:
    """Read and check a profile; anything malformed is a ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"profile {str(path)!r} does not exist")
    try:
        return parse_profile(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"profile {str(path)!r} is not a valid lenserve profile: {exc}") from None


def parse_profile(data: dict) -> Profile:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"missing \"format\": \"{FORMAT}\"")
    if data.get("version") != VERSION:
        raise ValueError(f"version {data.get('version')!r}, this lenserve reads {VERSION}")
    points = tuple(_point(p) for p in data["points"])
    if len(points) < 2:
        raise ValueError("fewer than two measured points")
    return Profile(ModelShape.from_dict(data["model"]), str(data["device"]),
                   int(data["block_size"]), int(data["num_gpu_blocks"]), points,
                   tuple(int(k) for k in data.get("knots", ())), data.get("meta"))


def _point(raw: dict) -> ProfilePoint:
    groups = tuple((int(c), int(q), int(d)) for c, q, d in raw["groups"])
    seconds = tuple(float(s) for s in raw["seconds"])
    if not groups or not seconds or min(seconds) <= 0 or any(c < 1 or q < 1 or d < 0
                                                              for c, q, d in groups):
        raise ValueError(f"bad point {raw!r}")
    return ProfilePoint(groups, seconds)
