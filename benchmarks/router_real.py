"""The real half of ``benchmarks/router.py``, on this machine: three scheduler replicas of
opt-125m (in-process executors, random weights, outputs forced to the replies' lengths, no
prefix caching: every router sends the same prompts), one predictor service, and one router
per policy in front of the same replicas, so the policies meet the same replicas back to
back. Measures, per round: each router's summary at a loaded rate (``lenserve bench``'s
metrics, failures by cause); then the replica-kill drill (a replica killed under load: lost
requests that had not started, failures that had). The router hop's own latency is measured
apart, on a stub replica (``benchmarks/router_hop.py``)."""
from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path


from benchmarks.stamp import REPO

ROUTERS = ("round-robin", "least-loaded", "length-aware")
MODEL = "opt-125m"
BOUND_S = 600


class Cluster:
    """The processes of one measurement, started together and stopped by their ids."""

    def __init__(self, raw: Path, replicas: int = 3, model: str = MODEL):
        self.raw, self.num_replicas, self.model = raw, replicas, model
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}

    def _spawn(self, name: str, *argv: str) -> None:
        from lenserve.commands.up import free_port
        port = self.ports[name] = free_port("127.0.0.1")
        env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
        log = open(self.raw / f"{name}.log", "w")        # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", *argv, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def target(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def start(self) -> None:
        self.raw.mkdir(parents=True, exist_ok=True)
        self._spawn("predictor", "services.predictor", "serve", "--model", self.model,
                    "--seed-data", "bundled")
        for i in range(self.num_replicas):
            # No prefix caching: every router sends the same prompts to the same replicas,
            # so a cache would serve a later router's prompts from an earlier one's work.
            self._spawn(f"replica-{i}", "services.scheduler", "--model", self.model,
                        "--policy", "vllm", "--max-num-seqs", "8", "--no-prefix-caching")
        replicas = ",".join(self.target(f"replica-{i}") for i in range(self.num_replicas))
        for router in ROUTERS:
            predictor = ("--predictor", f"grpc://{self.target('predictor')}") \
                if router == "length-aware" else ()
            self._spawn(router, "services.router", "--replicas", replicas, "--policy", router,
                        *predictor)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        from services.rpc import check_health
        deadline = time.monotonic() + BOUND_S
        for name in self.procs:
            while not check_health(self.target(name)):
                if self.procs[name].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start; see {self.raw / name}.log")
                time.sleep(1)

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def workload(dataset: Path, num: int, rate: float, max_output: int = 48, seed: int = 0):
    """``num`` ShareGPT prompts (cut to 128 tokens) with their replies' lengths (capped),
    Poisson arrivals at ``rate``: (prompt token ids, output length, arrival offset)."""
    from lenserve.workloads import load_samples
    from services.executor.factory import load_tokenizer
    tok = load_tokenizer(MODEL)
    rng = random.Random(seed)
    samples = [s for s in load_samples("sharegpt", dataset) if s.prompt and s.reference]
    rng.shuffle(samples)
    out, t = [], 0.0
    for s in samples[:num]:
        ids = tok.encode(s.prompt)[:128]
        n = max(4, min(max_output, len(tok.encode(s.reference))))
        out.append((ids, n, t))
        t += rng.expovariate(rate)
    return out, tok


async def _one(client, rid: str, ids, n: int, arrival: float, t0: float, text: str):
    from lenserve.bench.metrics import RequestRecord
    from lenserve_contract.sampling_params import SamplingParams
    await asyncio.sleep(max(0.0, t0 + arrival - time.perf_counter()))
    start, times, error = time.perf_counter(), [], None
    try:
        params = SamplingParams(max_tokens=n, ignore_eos=True, temperature=0)
        async for out in client.generate(text, params, rid):
            now = time.perf_counter() - t0
            times += [now] * len(out.outputs[0].token_ids)
            error = out.error or error
    except Exception as exc:  # noqa: BLE001 - a failed request is recorded, not raised
        error = f"{type(exc).__name__}: {exc}"
    return RequestRecord(rid, len(ids), n, start - t0, times, time.perf_counter() - t0,
                         error if error or len(times) == n else f"{len(times)} of {n} tokens")


async def drive(target: str, requests, tok, tag: str):
    """Send the workload through ``target``; (records, wall seconds)."""
    from lenserve.client import AsyncClient
    async with AsyncClient(target, multiplex=True) as client:
        t0 = time.perf_counter()
        texts = [tok.decode(ids) for ids, _, _ in requests]
        records = await asyncio.wait_for(asyncio.gather(*(
            _one(client, f"{tag}-{i}", ids, n, a, t0, text)
            for i, ((ids, n, a), text) in enumerate(zip(requests, texts)))), BOUND_S)
    return list(records), time.perf_counter() - t0


def failure_causes(records) -> dict[str, int]:
    """Failed requests counted by cause: the gRPC status and its details, or the error's
    text with its numbers blanked (so one cause is one line)."""
    causes: dict[str, int] = {}
    for r in records:
        if r.success:
            continue
        error = r.error or "no error text"
        code = re.search(r"StatusCode\.(\w+)", error)
        details = re.search(r'details = "([^"]*)"', error)
        key = f"{code[1]}: {details[1] if details else ''}" if code else \
            re.sub(r"\d+", "N", error.splitlines()[0])[:100]
        causes[key] = causes.get(key, 0) + 1
    return causes


async def kill_drill(cluster: Cluster, router: str, requests, tok) -> dict:
    """The workload through ``router``; once the first request finished, one replica's
    process is killed. Lost = failed with no token (had not started)."""
    from lenserve.client import AsyncClient
    async with AsyncClient(cluster.target(router), multiplex=True) as client:
        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(_one(client, f"kill-{i}", ids, n, 0.0, t0,
                                            tok.decode(ids)))
                 for i, (ids, n, _) in enumerate(requests)]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED,
                                     timeout=BOUND_S)
        cluster.kill(f"replica-{cluster.num_replicas - 1}")
        records = await asyncio.wait_for(asyncio.gather(*tasks), BOUND_S)
    failed = [r for r in records if not r.success]
    return {"requests": len(records), "completed": len(records) - len(failed),
            "failed_started": sum(1 for r in failed if r.token_times),
            "lost_not_started": sum(1 for r in failed if not r.token_times),
            "errors": sorted({(r.error or "")[:120] for r in failed})}


def measure(dataset: Path, raw: Path, num: int, rate: float, runs: int) -> dict:
    """``runs`` rounds of each router at the loaded rate (every other round in reverse
    order), then the kill drill."""
    from lenserve.bench.metrics import summarize
    requests, tok = workload(dataset, num, rate)
    cluster = Cluster(raw)
    cluster.start()
    result: dict = {"loaded": []}
    try:
        for run in range(runs):
            # Every other round in reverse, so that a drift of the machine's load over the
            # rounds does not favour the router that always runs first.
            for router in ROUTERS if run % 2 == 0 else ROUTERS[::-1]:
                records, wall = asyncio.run(drive(cluster.target(router), requests, tok,
                                                  f"{router}-{run}"))
                result["loaded"].append({"run": run, "router": router, "rate": rate,
                                         "load_avg": os.getloadavg()[0],
                                         "summary": summarize(records, wall),
                                         "failures": failure_causes(records)})
        result["kill"] = asyncio.run(kill_drill(cluster, "length-aware", requests, tok))
    finally:
        cluster.stop()
    return result


def measure_or_reuse(dataset: Path, raw: Path, params: dict, reuse: bool) -> dict:
    """``measure``, its result kept in ``raw/result.json``; with ``reuse``, an earlier result
    there with the same parameters instead (its load average recorded with it)."""
    saved = raw / "result.json"
    if reuse and saved.exists():
        got = json.loads(saved.read_text())
        if got.get("params") == params:
            return got
    result = measure(dataset, raw, params["num"], params["rate"], params["runs"])
    result["params"] = params
    saved.write_text(json.dumps(result, indent=1))
    return result
