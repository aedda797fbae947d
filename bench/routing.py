"""Routing without a call (agents.router): precision and coverage on both routing sets, no database needed.

For each message of bench/data/routing.jsonl (where the threshold is calibrated) and routing_b.jsonl (written
separately, to check it): the agent the router names and its score, with the shipped agents' examples, for each
embedder the router could use: the static table it uses (`agents.knowledge.static`, at MIN_SCORE) and the MiniLM it
is distilled from (at `MINILM_MIN_SCORE`, its threshold when the router ran it). A message counts as routed when
the router names an agent at a score >= the threshold and the engine would take the route (`acts_on`: to the entry
agent only for a question; the engine then skips a call: the entry agent's, or the specialist's transfer back);
precision is the share of routed messages whose label is that agent ("human" messages routed anywhere are wrong),
coverage the share of all messages routed.

Each embedder's cost is measured in a fresh process of its own: the resident memory its loading adds, and the CPU
time (process_time) per message embedding one message at a time and 100 at once (`asyncio.gather`, as a crowd of
customers), the median of a few rounds after a warm-up.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agents.knowledge.embedders import Embedder
from agents.knowledge.local import LocalEmbedder
from agents.knowledge.static import StaticEmbedder
from agents.router import MIN_SCORE, Router, Scored, acts_on
from bench.setup import RESULTS, ROOT, section, table
from harness.sample import default_roster

DATA = Path(__file__).resolve().parent / "data"
SETS = ("routing.jsonl", "routing_b.jsonl")
MINILM_MIN_SCORE = 0.24
"""MiniLM's threshold (0.15 was the lowest with precision >= 0.97 on routing.jsonl, where routing_b.jsonl had 0.95)."""
EMBEDDERS: dict[str, tuple[type[LocalEmbedder | StaticEmbedder], float, tuple[float, ...]]] = {
    "static": (StaticEmbedder, MIN_SCORE, (0.0, 0.04, 0.06, 0.07, 0.08, 0.09, 0.1, 0.12)),
    "minilm": (LocalEmbedder, MINILM_MIN_SCORE, (0.0, 0.05, 0.1, 0.15, 0.2, 0.22, 0.24, 0.3)),
}
"""Each embedder, its threshold and the thresholds swept: the static router's margins are about a third of MiniLM's."""


def figures(rows: list[dict[str, str]], scored: list[Scored], entry: str, threshold: float) -> dict[str, Any]:
    pairs = zip(rows, scored, strict=True)
    routed = [
        (r, s)
        for r, s in pairs
        if s.agent is not None and acts_on(s.agent, entry=entry, text=r["message"]) and s.score >= threshold
    ]
    right = sum(1 for r, s in routed if r["agent"] == s.agent)
    labels = sorted({r["agent"] for r in rows})
    return {
        "threshold": threshold,
        "routed": len(routed),
        "precision": round(right / max(1, len(routed)), 3),
        "coverage": round(len(routed) / max(1, len(rows)), 3),
        "per_label_routed": {x: sum(1 for r, _ in routed if r["agent"] == x) for x in labels},
        "wrong": [
            {"message": r["message"], "label": r["agent"], "routed": s.agent, "score": round(s.score, 3)}
            for r, s in routed
            if r["agent"] != s.agent
        ],
    }


async def measure(embedder: Embedder, threshold: float, thresholds: tuple[float, ...]) -> dict[str, Any]:
    roster = default_roster()
    assert isinstance(embedder, LocalEmbedder | StaticEmbedder)
    started = time.perf_counter()
    await embedder.load()
    loaded = time.perf_counter() - started
    router = Router(embedder, {n: a.examples for n, a in roster.agents.items()}, min_score=threshold)
    started = time.perf_counter()
    await router.score("hello")
    examples = time.perf_counter() - started
    out: dict[str, Any] = {
        "embedder": embedder.name,
        "threshold": threshold,
        "model_load_s": round(loaded, 2),
        "examples_embedded_s": round(examples, 2),
    }
    for name in SETS:
        rows = [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]
        started = time.perf_counter()
        scored = [await router.score(r["message"]) for r in rows]
        per_message = (time.perf_counter() - started) / len(rows) * 1000
        out[name] = {
            "messages": len(rows),
            "ms_per_message": round(per_message, 1),
            "at_threshold": figures(rows, scored, roster.entry, threshold),
            "sweep": [figures(rows, scored, roster.entry, t) for t in sorted({*thresholds, threshold})],
        }
    return out


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _cost(kind: str, rounds: int) -> dict[str, Any]:
    """In the child process: what loading `kind` adds to resident memory, and its CPU time per message."""
    rows = [json.loads(line) for name in SETS for line in (DATA / name).read_text().splitlines() if line.strip()]
    texts = [r["message"] for r in rows]
    before = _rss_mb()
    embedder = EMBEDDERS[kind][0]()
    assert await embedder.load() is None
    await embedder.embed(texts[:4])
    out: dict[str, Any] = {"rss_mb": round(_rss_mb() - before, 1)}
    for n in (1, 100):
        cpu = []
        for _ in range(rounds):
            started = time.process_time()
            if n == 1:
                for text in texts[:20]:  # one message at a time: 20 of them, for a measurable time
                    await embedder.embed([text])
                cpu.append((time.process_time() - started) * 1000 / 20)
            else:
                await asyncio.gather(*(embedder.embed([t]) for t in texts[:n]))
                cpu.append((time.process_time() - started) * 1000 / n)
        out[f"cpu_ms_per_message_{n}"] = round(statistics.median(cpu), 3)
    return out


def cost(kind: str, rounds: int = 7) -> dict[str, Any]:
    """Measured in a fresh process, so that one embedder's memory and threads do not count for the other's."""
    done = subprocess.run(
        [sys.executable, "-c", f"import bench.routing as r; r.print_cost({kind!r}, {rounds})"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return figures


def print_cost(kind: str, rounds: int) -> None:
    print(json.dumps(asyncio.run(_cost(kind, rounds))))


def package_bytes(embedder: StaticEmbedder | LocalEmbedder) -> int:
    """The files the embedder ships in the package (the tokenizer, shared, not counted)."""
    if isinstance(embedder, StaticEmbedder):
        files = ["static.npy", "static.scale.npy"]
    else:
        files = ["model.safetensors", "config.json"]
    return sum((embedder.path / f).stat().st_size for f in files)


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Print the routing figures of each embedder at its threshold, the sweep and the cost; write
    `results/routing.json`."""
    report: dict[str, Any] = {}
    for kind, (make, threshold, thresholds) in EMBEDDERS.items():
        embedder = make()
        f = report[kind] = asyncio.run(measure(embedder, threshold, thresholds))
        f |= cost(kind, rounds=3 if quick else 7) | {"package_bytes": package_bytes(embedder)}
        section(f"Routing without a call, {f['embedder']} at {threshold} (load {f['model_load_s']} s, examples "
                f"embedded once {f['examples_embedded_s']} s)")  # fmt: skip
        print(f"loading adds {f['rss_mb']} MB resident; CPU per message {f['cpu_ms_per_message_1']} ms one at a time, "
              f"{f['cpu_ms_per_message_100']} ms 100 at once; {f['package_bytes']} bytes in the package")  # fmt: skip
        for name in SETS:
            s = f[name]
            print(f"{name}: {s['messages']} messages, {s['ms_per_message']} ms per message (scoring)")
            sweep = [(x["threshold"], x["routed"], x["precision"], x["coverage"]) for x in s["sweep"]]
            print(table(("threshold", "routed", "precision", "coverage"), sweep))
            at = s["at_threshold"]
            print(f"at {threshold}: routed per label {at['per_label_routed']}")
            for w in at["wrong"]:
                print(f"  wrong: {w['label']} -> {w['routed']} ({w['score']}): {w['message']!r}")
    results.mkdir(parents=True, exist_ok=True)
    (results / "routing.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report
