"""Fuzz the gateway from its own OpenAPI schema with schemathesis: an in-process gateway over
the fake model (with an API key), every schemathesis check but ``positive_data_acceptance``,
each request allowed 120 s, then a count of the requests sent per operation and status.
Exits non-zero on any failure or any 5xx.

    python3 -m evaluation.gateway.fuzz --max-examples 400 --seed 0    # about 1,500 cases

``positive_data_acceptance`` is left out because the OpenAPI schema cannot say everything the
gateway checks: limits across fields (``min_tokens <= max_tokens``), the served model's
vocabulary and context length, text without lone surrogates. Such a request gets a 400 in
OpenAI's error shape naming the parameter, which ``response_schema_conformance`` checks.
Needs ``pip install schemathesis``.
"""
from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from gateway import GatewayConfig, create_app
from gateway.server import ServerThread
from services.scheduler.async_engine import AsyncEngine
from services.scheduler.wiring import EngineConfig

API_KEY = "sk-fuzz"
# The check the schema cannot support (see above).
EXCLUDED_CHECKS = ("positive_data_acceptance",)
# schemathesis gives a request 10 s by default; a chat answer of the default length on a
# busy CPU can take longer. A request that hangs still fails the run.
REQUEST_TIMEOUT_S = 120


def schemathesis_command(url: str, max_examples: int, seed: int, har: Path,
                         workers: int) -> list[str]:
    return [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
            "--checks", "all", "--exclude-checks", ",".join(EXCLUDED_CHECKS),
            "--max-examples", str(max_examples), "--seed", str(seed),
            "--request-timeout", str(REQUEST_TIMEOUT_S),
            "--header", f"Authorization: Bearer {API_KEY}", "--continue-on-failure",
            "--workers", str(workers), "--report", "har", "--report-har-path", str(har),
            "--no-color"]


def tally(har: Path) -> collections.Counter:
    """(method path, status) -> requests sent, from the HAR log of the run."""
    entries = json.loads(har.read_text())["log"]["entries"]
    counts: collections.Counter = collections.Counter()
    for entry in entries:
        request = entry["request"]
        path = "/" + request["url"].split("://", 1)[1].split("/", 1)[1].split("?")[0]
        counts[(f"{request['method']} {path}", entry["response"]["status"])] += 1
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-examples", type=int, default=400,
                    help="schemathesis cases per operation and phase")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--har", type=Path, help="keep the HAR log of every request here")
    args = ap.parse_args()

    engine = AsyncEngine(EngineConfig(model="fake"))
    config = GatewayConfig(served_model_name="fake", api_keys=(API_KEY,))
    server = ServerThread(create_app(engine, config, tokenizer=engine.engine.tokenizer)).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            har = args.har or Path(tmp) / "run.har"
            proc = subprocess.run(schemathesis_command(server.url, args.max_examples, args.seed,
                                                       har, args.workers), check=False)
            counts = tally(har) if har.exists() else collections.Counter()
    finally:
        server.stop()
        engine.shutdown()

    print("\nrequests sent, by operation and status:")
    operations = sorted({op for op, _ in counts})
    refused_methods = 0             # the unsupported_method check's probes, one per method
    for op in operations:
        statuses = {s: n for (o, s), n in sorted(counts.items()) if o == op}
        if set(statuses) == {405}:
            refused_methods += statuses[405]
            continue
        print(f"  {op:28s} {sum(statuses.values()):6d}   "
              + "  ".join(f"{s}: {n}" for s, n in statuses.items()))
    print(f"  {'other methods':28s} {refused_methods:6d}   405: {refused_methods}")
    total = sum(counts.values())
    server_errors = sum(n for (_, s), n in counts.items() if s >= 500)
    print(f"  {'total':28s} {total:6d}   5xx: {server_errors}")
    print(f"schemathesis exit status: {proc.returncode}")
    return 1 if proc.returncode or server_errors or not total else 0


if __name__ == "__main__":
    sys.exit(main())
