"""The bundled English model (all-MiniLM-L6-v2) under a crowd: N customer messages embedded at once, before and after.

N short messages (5-20 words, from bench/data's routing sets, as the router embeds them) are given to one
`LocalEmbedder` at the same time (`asyncio.gather`), and the process's CPU time (all its threads) and the wall time
until the last vector are measured, the median of a few rounds after a warm-up. The same script runs in a fresh
process on this tree and on a copy of the baseline commit (`git archive`, EMBEDDING_BASELINE, default HEAD: the
code before an uncommitted change), in the order before, after, after, before, with the machine's BLAS settings and
again with one BLAS thread (OPENBLAS_NUM_THREADS=1), so the ratios come from one run on one machine. No database needed.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.setup import RESULTS, ROOT, machine, section, source_version, table, write_report

BASELINE = "EMBEDDING_BASELINE"
"""A git ref to compare with (default HEAD)."""
COUNTS = (1, 10, 100)
DATA = Path(__file__).resolve().parent / "data"


def messages() -> list[str]:
    rows = [json.loads(line) for name in ("routing.jsonl", "routing_b.jsonl") for line in (DATA / name).open()]
    return [r["message"] for r in rows if 5 <= len(r["message"].split()) <= 20]


async def crowd(counts: list[int], rounds: int) -> dict[str, Any]:
    """In the child process, importing `agents` from the tree it runs in."""
    from agents.knowledge import local

    embedder = local.LocalEmbedder()
    await embedder.load()
    texts = messages()
    await embedder.embed_query(texts[:4])
    figures: dict[str, Any] = {"module": local.__file__}
    for n in counts:
        cpu, wall = [], []
        for _ in range(rounds):
            started_cpu, started = time.process_time(), time.perf_counter()
            vectors = await asyncio.gather(*(embedder.embed_query([t]) for t in texts[:n]))
            cpu.append((time.process_time() - started_cpu) * 1000)
            wall.append((time.perf_counter() - started) * 1000)
            assert len(vectors) == n
        figures[str(n)] = {"cpu_ms": round(statistics.median(cpu), 1), "wall_ms": round(statistics.median(wall), 1)}
    return figures


def run_in(tree: Path, counts: list[int], rounds: int, **env: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps([counts, rounds])],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert Path(figures["module"]).is_relative_to(tree), figures["module"]  # the tree's own code, not the install
    return figures


def mean(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    return {
        n: {k: round((v + second[n][k]) / 2, 1) for k, v in figures.items()}
        for n, figures in first.items()
        if n != "module"
    }


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Print CPU and wall time per crowd size, before and after, with ratios; write `results/embedding.json`."""
    counts, rounds = list(COUNTS[:2] if quick else COUNTS), 3 if quick else 5
    ref = os.environ.get(BASELINE, "HEAD")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="embedding-baseline-") as folder:
        before = Path(folder)
        archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        runs: dict[str, dict[str, Any]] = {}
        for suffix, env in (("", {}), ("_one_blas_thread", {"OPENBLAS_NUM_THREADS": "1"})):
            # Before, after, after, before: the load of a shared machine drifts, and each side gets both ends of it.
            b1, a1, a2, b2 = (run_in(tree, counts, rounds, **env) for tree in (before, ROOT, ROOT, before))
            runs[f"before{suffix}"], runs[f"after{suffix}"] = mean(b1, b2), mean(a1, a2)
    report: dict[str, Any] = {"benchmark": "embedding", "quick": quick, "baseline": ref, "rounds": rounds}
    report |= runs
    blas = {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    report |= {"machine": machine("none", None, blas_threads_env=blas), "source": source_version()}
    report["total_s"] = round(time.perf_counter() - started, 1)
    print_report(report, counts)
    return write_report(report, results / "embedding.json")


def print_report(report: dict[str, Any], counts: list[int]) -> None:
    for blas, suffix in (("the machine's BLAS threads", ""), ("one BLAS thread", "_one_blas_thread")):
        section(f"{', '.join(map(str, counts))} messages embedded at once, {blas} (median of {report['rounds']})")
        rows = []
        for n in counts:
            b, a = report[f"before{suffix}"][str(n)], report[f"after{suffix}"][str(n)]
            rows.append(
                (
                    n,
                    b["cpu_ms"],
                    a["cpu_ms"],
                    round(b["cpu_ms"] / a["cpu_ms"], 2),
                    round(a["cpu_ms"] / n, 2),
                    b["wall_ms"],
                    a["wall_ms"],
                    round(b["wall_ms"] / a["wall_ms"], 2),
                )
            )
        headers = ("N", "CPU before ms", "CPU after ms", "ratio", "CPU/msg after", "wall before", "wall after", "ratio")
        print(table(headers, rows))


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    counts, rounds = json.loads(sys.argv[2])
    print(json.dumps(asyncio.run(crowd(counts, rounds))))
