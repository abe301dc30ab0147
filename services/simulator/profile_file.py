"""The measured profile: a JSON file of the model's shape, where and in which dtype it was
measured, and the raw points (a batch, described as groups of identical sequences, and its
measured seconds). The dtype is the shape's (``model.dtype``), repeated beside ``device`` at the
top so that a reader sees at once what the times are of; both must agree."""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from services.simulator.cost_model import FitReport, LinearCostModel, fit_linear
from services.simulator.features import IterationFeatures, from_groups
from services.simulator.host_tier import HostLink
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
class SwapPoint:
    """One swap size: seconds to copy ``num_blocks`` device blocks out to the host and back."""
    num_blocks: int
    out_s: tuple[float, ...]     # one per repeat
    in_s: tuple[float, ...]


@dataclass(frozen=True)
class Profile:
    shape: ModelShape
    device: str
    block_size: int
    num_gpu_blocks: int          # the pool the real executor builds by default on this device
    points: tuple[ProfilePoint, ...]
    knots: tuple[int, ...] = ()
    meta: dict | None = None     # device name, threads, backend, versions, date (not read back)
    swap: tuple[SwapPoint, ...] = ()     # host-tier copies (older profiles have none)

    def fit(self) -> tuple[LinearCostModel, FitReport]:
        return fit_linear([p.features for p in self.points], [p.median_s for p in self.points],
                          self.knots)

    def host_link(self) -> HostLink | None:
        """Latency and bandwidth fitted to the swap points (None: none were measured)."""
        if len(self.swap) < 2:
            return None
        block_bytes = self.shape.kv_bytes_per_token() * self.block_size
        sizes = [p.num_blocks * block_bytes for p in self.swap]
        out_lat, out_bw = _fit_copy(sizes, [statistics.median(p.out_s) for p in self.swap])
        in_lat, in_bw = _fit_copy(sizes, [statistics.median(p.in_s) for p in self.swap])
        date = (self.meta or {}).get("swap_date") or (self.meta or {}).get("date", "undated")
        return HostLink(out_bw, in_bw, (out_lat + in_lat) / 2,
                        f"measured through the executor on {self.device}, {date}",
                        overlaps_compute=self.device != "cpu")

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "model": self.shape.as_dict(),
                "device": self.device, "dtype": self.shape.dtype, "block_size": self.block_size,
                "num_gpu_blocks": self.num_gpu_blocks, "knots": list(self.knots),
                "meta": self.meta or {},
                "points": [{"groups": [list(g) for g in p.groups], "seconds": list(p.seconds)}
                           for p in self.points],
                "swap": [{"num_blocks": p.num_blocks, "out_s": list(p.out_s),
                          "in_s": list(p.in_s)} for p in self.swap]}

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
    swap = tuple(_swap_point(p) for p in data.get("swap", ()))
    shape = ModelShape.from_dict(data["model"])
    if data.get("dtype", shape.dtype) != shape.dtype:
        raise ValueError(f"\"dtype\": {data['dtype']!r} but the model's is {shape.dtype!r}")
    return Profile(shape, str(data["device"]),
                   int(data["block_size"]), int(data["num_gpu_blocks"]), points,
                   tuple(int(k) for k in data.get("knots", ())), data.get("meta"), swap)


def _swap_point(raw: dict) -> SwapPoint:
    point = SwapPoint(int(raw["num_blocks"]), tuple(float(s) for s in raw["out_s"]),
                      tuple(float(s) for s in raw["in_s"]))
    if point.num_blocks < 1 or not point.out_s or not point.in_s or min(
            point.out_s + point.in_s) <= 0:
        raise ValueError(f"bad swap point {raw!r}")
    return point


def _fit_copy(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """Least squares of ``seconds = latency + bytes / bandwidth``; (latency, bandwidth), the
    latency kept >= 0 (a negative intercept is noise: refit through the origin)."""
    n = len(sizes)
    mean_x, mean_y = sum(sizes) / n, sum(seconds) / n
    var = sum((x - mean_x) ** 2 for x in sizes)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, seconds)) / var
             if var else 0.0)
    latency = mean_y - slope * mean_x
    if latency < 0 or slope <= 0:
        latency = 0.0
        slope = sum(x * y for x, y in zip(sizes, seconds)) / sum(x * x for x in sizes)
    return latency, 1.0 / slope


def _point(raw: dict) -> ProfilePoint:
    groups = tuple((int(c), int(q), int(d)) for c, q, d in raw["groups"])
    seconds = tuple(float(s) for s in raw["seconds"])
    if not groups or not seconds or min(seconds) <= 0 or any(c < 1 or q < 1 or d < 0
                                                              for c, q, d in groups):
        raise ValueError(f"bad point {raw!r}")
    return ProfilePoint(groups, seconds)
