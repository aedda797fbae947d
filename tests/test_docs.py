"""The docs site's generated parts (scripts/mkdocs_hooks.py): the benchmark tables docs/benchmarks.md names render
from the results in bench/results/ (`make docs` builds the whole site)."""

from __future__ import annotations

import re

from scripts.mkdocs_hooks import BENCH, RESULTS, bench_table
from tests import ROOT


def test_every_benchmark_table_renders_from_its_results() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    names = BENCH.findall(page)
    assert names, "docs/benchmarks.md names no benchmark results"
    for name in names:
        assert (RESULTS / f"{name}.json").is_file(), name
        table = bench_table(name).splitlines()
        assert re.fullmatch(r"\|(---\|)+", table[1]) and len(table) > 2, name
        assert len({row.count(" | ") for row in table[:1] + table[2:]}) == 1, f"{name}: rows of different widths"
