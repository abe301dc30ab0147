"""Tables and text of the prefix caching benchmark (``prefix_caching.py``)."""
from __future__ import annotations

from benchmarks import output, stamp, tables

MODES = ("off", "device", "host")
LABEL = {"off": "off", "device": "device", "host": "device + host"}


def _hit(s: dict) -> str:
    rate = s.get("prefix_cache_hit_rate")
    return f"{rate:.1%}" if rate is not None else "0.0%"


def _host_share(s: dict) -> str:
    """Prompt tokens uploaded from the host tier, over the cached prompt tokens (an upload
    the device evicts again before its request is admitted counts, unused: the share can
    pass 100%)."""
    hits = s.get("prefix_cache_hits") or 0
    uploaded = s.get("prefix_cache_host_hits") or 0
    return f"{uploaded / hits:.0%}" if hits else ("-" if not uploaded else f"{uploaded} tok")


def cpu_table(found: list[dict]) -> list[str]:
    rows = [[str(r["run"] + 1), LABEL[r["mode"]], f"{r['summary']['ttft_ms']['mean']:.0f}",
             f"{r['summary']['ttft_ms']['p99']:.0f}", f"{r['summary']['output_throughput']:.1f}",
             _hit(r["summary"]), _host_share(r["summary"])] for r in found]
    return tables.markdown(["run", "caching", "mean TTFT (ms)", "P99 TTFT (ms)",
                            "output tok/s", "hit rate", "uploaded from host / cached"], rows)


def cpu_ratio(found: list[dict], mode: str, base: str) -> tuple[float, float]:
    """Mean TTFT of ``mode`` over ``base``'s, per run: (min, max)."""
    ratios = []
    for i in {r["run"] for r in found}:
        ttft = {r["mode"]: r["summary"]["ttft_ms"]["mean"] for r in found if r["run"] == i}
        if ttft.get(base) and mode in ttft:
            ratios.append(ttft[mode] / ttft[base])
    return (min(ratios), max(ratios)) if ratios else (float("nan"), float("nan"))


def sustained(found: list[dict], policy: str, mode: str, slo_ms: float) -> tuple[float, str]:
    points = [(r["request_rate"], r["summary"]["ttft_ms"]["mean"]) for r in found
              if r["policy"] == policy and r["mode"] == mode]
    return tables.sustained_rate(points, slo_ms)


def _at_1x(found: list[dict], policy: str, mode: str) -> dict | None:
    return next((r for r in found if r["policy"] == policy and r["mode"] == mode
                 and r["scale"] == 1.0), None)


def sim_table(found: list[dict], ideal: float, slo_ms: float) -> list[str]:
    rows = []
    for policy in ("vllm", "alise"):
        for mode in MODES:
            r = _at_1x(found, policy, mode)
            if r is None:
                continue
            s = r["summary"]
            rate, note = sustained(found, policy, mode, slo_ms)
            rows.append([policy, LABEL[mode], f"{s['ttft_ms']['mean']:.0f}",
                         f"{s['ttft_ms']['p99']:.0f}", f"{_hit(s)} of {ideal:.1%}",
                         _host_share(s), f"{s.get('num_preemptions', 0):.0f}",
                         f"{note}{rate:.2f}"])
    return tables.markdown(["policy", "caching", "mean TTFT at 1x (ms)", "P99 TTFT at 1x (ms)",
                            "hit rate at 1x (of ideal)", "uploaded from host / cached",
                            "preemptions at 1x", f"req/s with mean TTFT < {slo_ms:g} ms"], rows)


def sweep_table(found: list[dict]) -> list[str]:
    rows = [[r["policy"], LABEL[r["mode"]], f"{1 / r['scale']:.2f}x", f"{r['request_rate']:.2f}",
             f"{r['summary']['ttft_ms']['mean']:.0f}", f"{r['summary']['ttft_ms']['p99']:.0f}",
             _hit(r["summary"])]
            for r in sorted(found, key=lambda r: (r["policy"] != "vllm", MODES.index(r["mode"]),
                                                  -r["scale"]))]
    return tables.markdown(["policy", "caching", "trace speed", "served req/s",
                            "mean TTFT (ms)", "P99 TTFT (ms)", "hit rate"], rows)


def chat_table(found: list[dict]) -> list[str]:
    rows = [[r["policy"], LABEL[r["mode"]], f"{r['conversation_rate']:g}",
             f"{r['request_rate']:.2f}", f"{r['summary']['ttft_ms']['mean']:.0f}",
             f"{r['summary']['ttft_ms']['p99']:.0f}", _hit(r["summary"]),
             _host_share(r["summary"]), f"{r['summary'].get('num_preemptions', 0):.0f}"]
            for r in sorted(found, key=lambda r: (r["policy"] != "vllm", r["conversation_rate"],
                                                  MODES.index(r["mode"])))]
    return tables.markdown(["policy", "caching", "conversations/s", "served req/s",
                            "mean TTFT (ms)", "P99 TTFT (ms)", "hit rate",
                            "uploaded from host / cached",
                            "preemptions"], rows)


def _chat_text(chat: list[dict], c: dict) -> str:
    if not chat:
        return ""
    parts = []
    for rate in sorted({r["conversation_rate"] for r in chat}):
        ratios = []
        for mode in MODES:
            v, a = (next((r for r in chat if r["policy"] == policy and r["mode"] == mode
                          and r["conversation_rate"] == rate), None)
                    for policy in ("vllm", "alise"))
            if v and a and v["summary"]["ttft_ms"]["mean"]:
                ratio = a["summary"]["ttft_ms"]["mean"] / v["summary"]["ttft_ms"]["mean"]
                ratios.append(f"{LABEL[mode]} {ratio:.2f}x")
        parts.append(f"at {rate:g}/s " + ", ".join(ratios))
    rates = ", ".join(f"{r:g}" for r in c["rates"])
    return (f"Simulator (estimates), multi-turn ShareGPT: {c['num_prompts']} turns of the "
            f"conversations file, conversations starting at {rates}/s with {c['think']:g} s "
            f"of think time, A100/Llama-2-7B, {c['swap_gib']:g} GiB "
            f"of swap space in every mode and a host tier of {c['host_blocks']} blocks. "
            f"`alise`'s mean TTFT relative to `vllm`'s: {'; '.join(parts)}. ")


def _alise_text(sim: list[dict]) -> str:
    parts = []
    for mode in MODES:
        v, a = _at_1x(sim, "vllm", mode), _at_1x(sim, "alise", mode)
        if v and a:
            mean = a["summary"]["ttft_ms"]["mean"] / v["summary"]["ttft_ms"]["mean"]
            p99 = a["summary"]["ttft_ms"]["p99"] / v["summary"]["ttft_ms"]["p99"]
            parts.append(f"{LABEL[mode]} {mean:.2f}x mean, {p99:.2f}x P99")
    return ("At 1x, `alise`'s TTFT relative to `vllm`'s with caching " + "; ".join(parts)
            + ". ") if parts else ""


def _sim_text(sim: list[dict], ideal: float, q: dict) -> str:
    if not sim:
        return "The simulated part was not run this time (`--parts cpu`). "
    slo = q["ttft_slo_ms"]
    rates = "; ".join(
        f"`{policy}` " + ", ".join(f"{LABEL[m]} {n}{r:.2f}" for m in MODES
                                   for r, n in [sustained(sim, policy, m, slo)])
        for policy in ("vllm", "alise"))
    v = {m: _at_1x(sim, "vllm", m) for m in MODES}
    hits = ", ".join(f"{LABEL[m]} {_hit(v[m]['summary'])}" for m in MODES if v[m])
    return (f"Simulator (estimates): the first {q['num_prompts']} requests of the Mooncake "
            f"conversation trace at A100/Llama-2-7B, hash blocks scaled to "
            f"{q['block_tokens']} tokens, {q['swap_gib']:g} GiB of swap space in every mode "
            f"and a host tier of {q['host_blocks']} blocks. At the trace's own speed `vllm` "
            f"served {hits} of prompt tokens from cache against the trace's ideal "
            f"{ideal:.1%} (an unbounded cache; the hit rate counts readmissions after "
            f"preemption too). Highest served rate with mean TTFT under {slo:g} ms (req/s, "
            f"interpolated between the trace replayed at "
            f"{1 / max(q['scales']):.2f}x-{1 / min(q['scales']):.2f}x its speed): {rates}. "
            f"{_alise_text(sim)}")


def _cpu_text(cpu: list[dict], p: dict, shared: str) -> str:
    if not cpu:
        return ("The real-engine part has no runs at its current settings (`--parts cpu` "
                "makes them), so the page has no measured timings. ")
    dev, host = cpu_ratio(cpu, "device", "off"), cpu_ratio(cpu, "host", "off")
    return (f"Real engine ({p['model']}, random weights, this CPU): {p['num_prompts']} turns "
            f"of multi-turn ShareGPT (prompts up to {p['max_prompt_len']} tokens), "
            f"conversations at {p['rate']:g}/s, think time {p['think']:g} s, outputs forced to "
            f"{p['output_len']} tokens, a {p['num_gpu_blocks']}-block device pool (16-token "
            f"blocks) and a {p['host_blocks']}-block host tier; mean TTFT over caching off: "
            f"device {dev[0]:.2f}-{dev[1]:.2f}, device + host {host[0]:.2f}-{host[1]:.2f} "
            f"(min-max of {p['runs']} runs, the three modes back to back in each). {shared}")


def section(cpu, sim, chat, ideal, params, run_stamp) -> output.Section:
    p, q, c = params
    shared = ("The CPU was shared with other work during the run (see the stamp): its "
              "timings are loaded and noisy; compare within a run. "
              if stamp.cpu_was_shared(run_stamp) else "")
    cpu_tables = ([("Real engine, multi-turn ShareGPT (opt-125m, this CPU)", cpu_table(cpu))]
                  if cpu else [])
    sim_tables = ([("Simulated A100/Llama-2-7B, Mooncake conversation trace (estimates)",
                    sim_table(sim, ideal, q["ttft_slo_ms"])),
                   ("Simulated rate sweep (estimates)", sweep_table(sim))] if sim else [])
    chat_tables = ([("Simulated A100/Llama-2-7B, multi-turn ShareGPT (estimates)",
                     chat_table(chat))] if chat else [])
    return output.Section(
        title="Prefix caching with a host tier (simulated A100 on the Mooncake trace and "
              "multi-turn ShareGPT" + ("; real engine on this CPU)" if cpu else ")"),
        text=_cpu_text(cpu, p, shared) + _sim_text(sim, ideal, q) + _chat_text(chat, c),
        tables=cpu_tables + sim_tables + chat_tables,
        figure_alt="mean TTFT against served rate, caching off, device and device + host, "
                   "vllm and alise, on the Mooncake trace and multi-turn ShareGPT")
