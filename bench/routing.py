"""Routing without a call (agents.router): precision and coverage on both routing sets, no database needed.

For each message of bench/data/routing.jsonl (where the threshold is calibrated) and routing_b.jsonl (written
separately, to check it): the agent the router names and its score, with the shipped agents' examples and the
bundled local model. A message counts as routed when the router names an agent at a score >= the threshold and
the engine would take the route (`acts_on`: to the entry agent only for a question; the engine then skips a
call: the entry agent's, or the specialist's transfer back); precision is the share of routed messages whose
label is that agent ("human" messages routed anywhere are wrong), coverage the share of all messages routed.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from agents.knowledge.local import LocalEmbedder
from agents.router import MIN_SCORE, Router, Scored, acts_on
from bench.setup import RESULTS, section, table
from harness.sample import default_roster

DATA = Path(__file__).resolve().parent / "data"
SETS = ("routing.jsonl", "routing_b.jsonl")
THRESHOLDS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.24, 0.3)


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


async def measure(threshold: float) -> dict[str, Any]:
    roster = default_roster()
    embedder = LocalEmbedder()
    started = time.perf_counter()
    await embedder.load()
    loaded = time.perf_counter() - started
    router = Router(embedder, {n: a.examples for n, a in roster.agents.items()}, min_score=threshold)
    started = time.perf_counter()
    await router.score("hello")
    examples = time.perf_counter() - started
    out: dict[str, Any] = {"model_load_s": round(loaded, 2), "examples_embedded_s": round(examples, 2)}
    for name in SETS:
        rows = [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]
        started = time.perf_counter()
        scored = [await router.score(r["message"]) for r in rows]
        per_message = (time.perf_counter() - started) / len(rows) * 1000
        out[name] = {
            "messages": len(rows),
            "ms_per_message": round(per_message, 1),
            "at_threshold": figures(rows, scored, roster.entry, threshold),
            "sweep": [figures(rows, scored, roster.entry, t) for t in sorted({*THRESHOLDS, threshold})],
        }
    return out


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Print the routing figures at MIN_SCORE and the sweep; write `results/routing.json`."""
    report = asyncio.run(measure(MIN_SCORE))
    section(f"Routing without a call at {MIN_SCORE} (model load {report['model_load_s']} s, examples embedded "
            f"once {report['examples_embedded_s']} s)")  # fmt: skip
    for name in SETS:
        f = report[name]
        print(f"{name}: {f['messages']} messages, {f['ms_per_message']} ms per message")
        print(table(("threshold", "routed", "precision", "coverage"),
                    [(s["threshold"], s["routed"], s["precision"], s["coverage"]) for s in f["sweep"]]))  # fmt: skip
        at = f["at_threshold"]
        print(f"at {MIN_SCORE}: routed per label {at['per_label_routed']}")
        for w in at["wrong"]:
            print(f"  wrong: {w['label']} -> {w['routed']} ({w['score']}): {w['message']!r}")
    results.mkdir(parents=True, exist_ok=True)
    (results / "routing.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report
