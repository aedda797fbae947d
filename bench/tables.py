"""Benchmark results as tables: one function per benchmark, from the result it writes to `bench/results/NAME.json`
to a `Table`. The benchmark prints it (`bench.setup.table`) and the docs' build renders it into docs/benchmarks.md
where the page says `<!-- bench: NAME -->` (scripts/mkdocs_hooks.py), so the page shows what the last run wrote.

Only the standard library here: the docs' build imports this module without the bench's dependencies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Result = dict[str, Any]


@dataclass(frozen=True)
class Table:
    headers: Sequence[str]
    rows: Sequence[Sequence[object]]

    def markdown(self) -> str:
        def line(cells: Sequence[object]) -> str:
            return "| " + " | ".join(_cell(c).replace("|", "\\|") for c in cells) + " |"

        return "\n".join([line(self.headers), "|" + "---|" * len(self.headers), *(line(r) for r in self.rows)])


def _cell(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return _number(value)
    return str(value)


def _number(value: float) -> str:
    """Two or three significant figures, as a reader compares them: 0.004, 0.23, 1.19, 30.8, 1,299."""
    size = abs(value)
    if size < 0.1:
        return f"{value:.3f}"
    if size < 10:
        return f"{value:.2f}"
    if size < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


# ------------------------------------------------------------------------------------------------ faults

FAULT_HEADERS = ["scenario", "messages", "answered", "to a person", "once", "twice+", "lost", "recovered -> last s"]
"""The faults' summary columns, for every scenario's rows; the last counts from the fault's end (the kill, the
database or the provider or Slack back, the disk freed) unless the label says otherwise."""


def _fault_row(label: str, r: Result, last_s: object, *, to_a_person: int = 0, lost: str = "unanswered") -> list[Any]:
    return [label, r["customers"], r["answered"], to_a_person, r["exactly_once"], r["twice_or_more"], r[lost], last_s]


def engine_faults(result: Result) -> list[list[Any]]:
    """`bench.faults`' own scenarios: a killed process, a Postgres restart, the provider failing and hanging."""
    kill, restart = result["killed_worker"], result["postgres_restart"]
    rows = [
        _fault_row(
            f"the only process SIGKILLed with {kill['customers']} conversations in flight (lease "
            f"{kill['lease_seconds']:.0f} s), a new one started",
            kill, kill["kill_to_last_answer_s"],
        ),
        _fault_row(
            f"Postgres stopped for {restart['down_s']:.0f} s with {restart['customers']} conversations in flight "
            f"({restart['llm_calls']} model calls: turns cut mid-commit are redone)",
            restart, restart["restart_to_last_answer_s"],
        ),
    ]  # fmt: skip
    outage, timeout = result["provider_outage"], result["provider_timeout"]
    for label, r in (
        (f"the provider answering 503 for {outage['outage_s']:.0f} s", outage),
        (f"the provider slower than a {timeout['openai_timeout_s']:.0f} s `OPENAI_TIMEOUT_S` for "
         f"{timeout['outage_s']:.0f} s", timeout),
    ):  # fmt: skip
        label += f" while {r['customers']} customers write ({r['sent_during_outage']} during it)"
        persons = r["handed_to_a_person"]
        once = r["customers"] - r["lost"] - r["twice_or_more"]
        rows.append([label, r["customers"], r["answered"], f"{persons} (apology and a case each)", once,
                     r["twice_or_more"], r["lost"], r["recovery_to_last_reply_s"]])  # fmt: skip
    return rows


def slack_faults(result: Result) -> list[list[Any]]:
    """`bench.fault_slack`: Slack failing every call for a while, and its rate limits."""
    storm, limits = result["slack_storm"], result["slack_rate_limits"]
    return [
        _fault_row(
            f"Slack failing every call for {storm['storm_s']:.0f} s in turns (5xx, answers lost after doing it, 429; "
            f"{storm['sent_during_storm']} sent in it)",
            storm, storm["recovery_to_last_answer_s"],
        ),
        _fault_row(
            f"Slack's rate limits, {limits['customers']} customers at once in one channel: {limits['post_calls']} "
            f"`chat.postMessage` calls; from the first event (the limit allows "
            f"{limits['least_s_the_limit_allows']:.0f} s)",
            limits, limits["first_event_to_last_answer_s"],
        ),
    ]  # fmt: skip


def process_faults(result: Result) -> list[list[Any]]:
    """`bench.fault_processes`: a process frozen past its lease, and the web and worker processes killed apart."""
    frozen, worker, web = result["stopped_process"], result["worker_killed"], result["web_killed"]
    return [
        _fault_row(
            f"one of two processes SIGSTOPped for {frozen['stopped_s']:.0f} s (lease {frozen['lease_seconds']:.0f} s) "
            f"holding {frozen['leases_at_stop']['stopped']['turns']} turns, then resumed; from the stop (its "
            f"{frozen['stale_turns_fenced']} stale turns fenced)",
            frozen, frozen["stop_to_last_answer_s"],
        ),
        _fault_row(
            f"`PROCESS_ROLE=worker` SIGKILLed while customers write to the web process ({worker['at_once']} at once, "
            f"{worker['written_while_no_worker']} meanwhile; {_number(worker['restart_to_last_answer_s'])} s from "
            "the new worker)",
            worker, worker["kill_to_last_answer_s"],
        ),
        _fault_row(
            f"`PROCESS_ROLE=web` SIGKILLed, {web['refused_first']} deliveries refused and sent again once a new web "
            "process is up; from the new web process",
            web, web["restart_to_last_answer_s"],
        ),
    ]  # fmt: skip


def disk_faults(result: Result) -> list[list[Any]]:
    """`bench.fault_disk`: the database's disk nearly full, and full; a scenario not run (not root) says so."""
    rows: list[list[Any]] = []
    for key, label in (("disk_nearly_full", "the database's disk nearly full"), ("disk_full", "the disk full")):
        r = result.get(key)
        if r is None:
            continue
        if "not_run" in r:
            rows.append([f"{label}: not run: {r['not_run']}", r["customers"], None, None, None, None, None, None])
            continue
        if key == "disk_nearly_full":
            label += f" ({r['free_after_fill_kb']} KB left, its own {r['tmpfs_mb']} MB tmpfs) for {r['fault_s']:.0f} s"
        elif r["postmaster_exited"]:
            label += ": a WAL write PANICs Postgres, restarted once the disk is freed"
        refused = r["refused_until_disk_freed"]
        label += f"; {r['customers']} over {r['spread_s']:.0f} s, {refused} refused (503) and sent again"
        rows.append(_fault_row(label, r, r["freed_to_last_answer_s"], to_a_person=r["handed_to_a_person"], lost="lost"))
    return rows


def faults(result: Result) -> Table:
    """`python -m bench faults`: every scenario, those of the modules it runs included (any one may be absent)."""
    rows: list[list[Any]] = []
    for part, keys in (
        (engine_faults, ("killed_worker",)),
        (slack_faults, ("slack_storm",)),
        (process_faults, ("stopped_process",)),
        (disk_faults, ("disk_nearly_full", "disk_full")),
    ):
        if any(key in result for key in keys):
            rows += part(result)
    return Table(FAULT_HEADERS, rows)


# ------------------------------------------------------------------------------------------------ the others

TOOL_LABELS = {
    "python": "Python (`function_tool`)",
    "http tool": "HTTP endpoint (signed headers, verified by the endpoint)",
    "mcp stdio": "MCP over stdio",
    "mcp http": "MCP over Streamable HTTP",
}


def tools(result: Result) -> Table:
    """`python -m bench tools`: one tool call after another, per kind of tool (x: against the Python tool)."""
    rows = [
        [TOOL_LABELS.get(label, label), f["latency_ms"]["p50"], f["latency_ms"]["p99"], f["p50_vs_python"],
         f["bot_cpu_ms_per_call"], f["bot_cpu_vs_python"], f["server_cpu_ms_per_call"]]
        for label, f in sorted(result["sequential"].items(), key=lambda item: item[1]["latency_ms"]["p50"])
    ]  # fmt: skip
    return Table(["tool", "p50 ms", "p99 ms", "p50 x", "bot CPU ms/call", "CPU x", "server CPU ms/call"], rows)


def first_start(result: Result) -> Table:
    """`python -m bench first_start`: the playground's start, from launch to the line giving its URL."""
    rows = [
        [label, s["p50"], s["max"]]
        for label, s in (
            ("first start, empty `DATA_DIR` (Postgres created and migrated, sample stored, bot and page up)",
             result["first_start"]),
            ("second start, same `DATA_DIR`", result["second_start"]),
        )
    ]  # fmt: skip
    return Table(["start", "p50 s", "max s"], rows)


def install(result: Result, before: Result | None = None) -> Table:
    """`python -m bench install`; with `before`, the same figures of another checkout (`--source`) beside them."""

    def column(r: Result) -> list[object]:
        commands, venvs = r["commands"], r.get("virtualenvs", {})
        heavy = commands["help_heavy_imports"]

        def venv(label: str) -> object:
            v = venvs.get(label)
            return None if v is None else f"{v['mb']:.1f} MB, {v['packages']} packages, {v['install_s']:.0f} s"

        runtime = venvs.get("runtime")
        return [
            f"{_number(commands['help_median_s'])} / {_number(max(commands['help_s']))} s",
            f"{_number(commands['version_median_s'])} s",
            f"{commands['help_modules']:,} ({', '.join(heavy) or 'none'})",
            venv("runtime"),
            venv("runtime+dev"),
            None if runtime is None else f"{runtime['pip_output_lines']} ({runtime['warnings']} warnings)",
        ]

    labels = [
        "`python -m bot --help`, median / max",
        "`python -m bot --version`, median",
        "modules `--help` imports (the heavy ones among them)",
        "virtualenv `make run` makes, and its install time",
        "virtualenv `make test` makes, and its install time",
        "lines pip prints with `--quiet`",
    ]
    columns = [column(r) for r in (before, result) if r is not None]
    headers = ["", "before", "after"] if before is not None else ["", "this checkout"]
    return Table(headers, [[label, *cells] for label, *cells in zip(labels, *columns, strict=True)])


def streaming(result: Result) -> Table:
    """`python -m bench streaming`: answers streamed against posted whole, and a kill -9 mid-stream, in Slack and (in
    a result that has them) in Teams' personal chats."""
    first_token = result["parameters"]["first_token_s"]
    platforms = [("Slack", result), *([("Teams", result["teams"])] if "teams" in result else [])]
    headers = [""]
    columns: list[tuple[Result, Result | None, Result]] = []  # (the mode's figures, the kills or None, the platform's)
    for name, figures in platforms:
        headers += [f"{name}, streamed", f"{name}, posted whole (`STREAM_ANSWERS=false`, today's)"]
        columns += [(figures["streamed"], figures["killed"], figures), (figures["today"], None, figures)]

    def each(cell: Callable[[Result, Result | None, Result], object]) -> list[object]:
        return [cell(mode, kills, figures) for mode, kills, figures in columns]

    def spread(figures: Result, p: str = "p90") -> str:
        return f"{_number(figures['p50'])} / {_number(figures[p])}"

    def calls(per: Result) -> str:
        return f"{_number(sum(per.values()))} ({', '.join(f'`{m}` {_number(n)}' for m, n in per.items())})"

    def once(kills: Result) -> str:
        return " / ".join(str(kills[k]) for k in ("once", "twice_or_more", "half", "none"))

    kills = result["killed"]
    rows = [
        ["first words, p50 / p90 s", *each(lambda r, _, __: spread(r["first_words_s"]))],
        ["whole answer standing, p50 / p90 s", *each(lambda r, _, __: spread(r["whole_answer_s"]))],
        [f"first words / the model's {_number(first_token)} s to its first token, p50 (goal 1.5 at most)",
         *each(lambda r, _, __: r["first_words_s"]["p50"] / first_token)],
        ["first words streamed / the whole answer today's, p50",
         *each(lambda _, k, p: None if k is None else p["first_words_vs_whole_today"])],
        ["platform calls per answer (Slack's `chat.*`, `assistant.*`; Teams' Bot Connector calls by kind)",
         *each(lambda r, _, __: calls(r["calls_per_answer"]))],
        ["bot messages per answer", *each(lambda r, _, __: r["messages_per_answer"])],
        [f"killed -9 once words show, a new process started ({kills['conversations']} each; lease "
         f"{_number(kills['lease_seconds'])} s): the answer stands once / twice or more / half / not at all",
         *each(lambda _, k, __: None if k is None else once(k))],
        ["killed -9: from the kill to the answer standing, p50 / max s",
         *each(lambda _, k, __: None if k is None else spread(k["kill_to_answer_s"], "max"))],
        ["killed -9: platform calls per answer, both processes'",
         *each(lambda _, k, __: None if k is None else calls(k["calls_per_answer"]))],
    ]  # fmt: skip
    return Table(headers, rows)


def cpu(result: Result) -> Table:
    """`python -m bench cpu`: CPU per customer message with the defaults and stripped, one row per burst."""
    rows = [
        [
            name,
            f"{w['customers']} in {w['channels']} channel{'s' if w['channels'] > 1 else ''}",
            f"{w['answered_once']}/{w['customers']}",
            w["last_answer_s"],
            w.get("last_vs_single"),
            w["bot_cpu_ms_per_message"],
            w.get("bot_cpu_vs_load"),
            w["peak_rss_mb"],
        ]
        for name, setup in result["setups"].items()
        for w in setup["waves"]
    ]
    headers = ["set-up", "customers at once", "answered once", "last answer s", "last / single", "bot CPU ms/message"]
    return Table([*headers, "bot CPU ÷ load generator's", "peak RSS MB"], rows)


def scale(result: Result) -> Table:
    """`python -m bench scale`: one web process and 1, 2, 4 workers on one database, one row per configuration."""
    rows = []
    for r in result["runs"]:
        b = r["burst"]
        cpu, db = b["cpu_ms_per_message"], b["database_per_message"]
        rows.append(
            [
                r["setup"],
                f"1 + {r['workers']}" + (f", DB_POOL_SIZE={r['db_pool_size']}" if r.get("db_pool_size") else ""),
                f"{b['answered_once']}/{b['customers']}",
                b["last_answer_s"],
                b.get("last_vs_single"),
                b["messages_per_s"],
                cpu["web"],
                cpu["workers"],
                cpu["postgres"],
                db["xact_commit"],
                db["wal_bytes"],
                b["peak_backends"],
                b.get("connections_refused"),
            ]
        )
    headers = ["set-up", "web + workers", "answered once", "last answer s", "last / single", "messages/s"]
    headers += ["web CPU ms/msg", "workers CPU ms/msg", "Postgres CPU ms/msg", "commits/msg", "WAL bytes/msg"]
    return Table([*headers, "peak backends", "connections refused"], rows)


RENDERERS: dict[str, Callable[[Result, Result | None], Table]] = {
    "cpu": lambda result, _: cpu(result),
    "scale": lambda result, _: scale(result),
    "faults": lambda result, _: faults(result),
    "tools": lambda result, _: tools(result),
    "first_start": lambda result, _: first_start(result),
    "install": install,
    "streaming": lambda result, _: streaming(result),
}
"""What docs/benchmarks.md may name in `<!-- bench: NAME -->`: NAME.json rendered, with NAME-other.json (the same
benchmark run on another checkout, written by `--source` or `--python`) as `before` where the table compares."""
