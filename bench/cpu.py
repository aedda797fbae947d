"""CPU per customer message with the settings a new user gets (issue 30): one `python -m bot serve` process, an
OpenAI-compatible provider that serves embeddings too (the fake LLM; `EMBEDDINGS=auto` picks it, as a key is set),
the Driftwing sample's knowledge (ingested at the first start), the router on, and otherwise every default
(`MAX_CONCURRENT_TURNS`, the rate limits, the daily budget, CSAT). Beside it the stripped set-up: the router off and
no embeddings. Each set-up is warmed by one question, then timed: one customer alone (the single turn), 100
different customers in 2 channels at once, then 500 in 10; every model call takes 1 s.

Reported per burst: the bot process's CPU seconds per customer message (/proc utime + stime, taken before the
burst and after its last answer once the process has gone quiet, so that the echoes of its posts count too), the
last answer against the single turn's, whether every answer was posted exactly once, and the peak resident memory.
Beside the bot's CPU, the load generator's (this process: the events sent, the Slack emulator and the fake LLM, the
same work every run) and the ratio of the two: this shared machine's speed moves by a third between runs, and the
ratio in one run does not move with it.

`--profile` samples the process with py-spy (100 Hz) during each set-up's 500 burst: a flame graph per set-up
(docs/flame/cpu-<set-up>.svg) and, in the JSON, the frames and the parts of the code that hold the largest shares of
its busy samples. py-spy stops the process briefly for each sample (its CPU is not the bot's, but its wall time
is), so a profiled burst is marked as such.
"""

from __future__ import annotations

import asyncio
import colorsys
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from bench.inflight import rss_mb
from bench.live import Live, cpu_line, cpu_use, live_bot, paused_gc, print_afterwards, process_cpu_s
from bench.setup import RESULTS, ROOT, run_benchmark, section, summary
from bench.tables import cpu as cpu_table
from bot.settings import Settings
from fakes.openai_server import reply, slow
from harness.slack import Sent, deliver, write

LATENCY_S = 1.0
"""Each model call's time, as in the issue."""
FLAMES = ROOT / "docs" / "flame"
TOP = 15
DEFAULTS = {
    name: Settings.model_fields[name].default
    for name in (
        "embeddings",
        "embeddings_model",
        "router_min_score",
        "csat",
        "rate_limit_user_per_minute",
        "rate_limit_channel_per_minute",
        "daily_token_budget_per_user",
    )
}
"""What the harness sets for its tests, put back to what a user gets (it leaves `MAX_CONCURRENT_TURNS` and
`DB_POOL_SIZE` at their defaults for a `serve` process)."""
SETUPS: dict[str, dict[str, Any]] = {
    "defaults": DEFAULTS,
    "stripped": DEFAULTS | {"router_min_score": "off", "embeddings": "none"},
}
QUIET_CPU = 0.04
"""The process has finished a burst (the echoes of its posts, the outbox) once it uses less than this share of a
core."""
TRUNK_FILES = ("asyncio/", "<frozen runpy>", "threading.py", "concurrent/futures/thread.py")
"""The event loop and thread plumbing most samples pass through: left out of the top frames, as is the entry point's
chain of frames above them (see `trunk`)."""
ENTRY = "<frozen runpy>"
"""Where the main thread's stacks start (`python -m`)."""
WAITS = ("EpollSelector.select (selectors.py)", "_worker (concurrent/futures/thread.py)")
"""Frames that, on top of a stack, mean the thread is waiting (for I/O, for work) though py-spy took it for busy:
such samples are left out."""


@dataclass(frozen=True)
class Burst:
    name: str
    customers: int
    channels: int


def bursts(quick: bool) -> list[Burst]:
    if quick:
        return [Burst("single", 1, 1), Burst("20 in 2", 20, 2), Burst("50 in 5", 50, 5)]
    return [Burst("single", 1, 1), Burst("100 in 2", 100, 2), Burst("500 in 10", 500, 10)]


def customers(live: Live, burst: Burst, tag: str) -> list[Sent]:
    """Different people in the burst's own channels (new ones, so that no channel's rate limit carries over)."""
    channels = [f"C_{tag}_{c}" for c in range(burst.channels)]
    for channel in channels:
        live.emulator.add_channel(channel, channel.lower())
    said = []
    for i in range(burst.customers):
        user = f"U_{tag}_{i}"
        live.emulator.add_user(user, user.lower(), f"Customer {tag} {i}")
        said.append(write(live.emulator, channels[i % len(channels)], f"{tag} question {i}", user=user))
    return said


async def quiet(pid: int, poll_s: float = 0.25, most_s: float = 15.0) -> None:
    """Until the process uses less than QUIET_CPU of a core over `poll_s` (or `most_s` has passed)."""
    deadline = time.monotonic() + most_s
    before = process_cpu_s(pid) or 0.0
    while time.monotonic() < deadline:
        await asyncio.sleep(poll_s)
        now = process_cpu_s(pid) or 0.0
        if now - before < QUIET_CPU * poll_s:
            return
        before = now


async def burst(live: Live, b: Burst, tag: str, profile: Path | None = None) -> dict[str, Any]:
    """The burst's customers at once; each answer's time from the first event, and the bot's CPU over it all."""
    said = customers(live, b, tag)
    answer = {s.text: f"answer: {s.text}" for s in said}
    for text in answer.values():
        live.watcher.expect(post=text)
    spy = await start_profiler(live.bot.proc.pid, profile) if profile is not None else None
    await quiet(live.bot.proc.pid)
    cpu_before = live.cpu()
    started = time.monotonic()
    with paused_gc():
        await asyncio.gather(*(deliver(live.emulator, s) for s in said))
        sent = time.monotonic()
        peak_rss = 0.0
        while live.watcher.awaited_posts and time.monotonic() - started < 120 + 3 * LATENCY_S * b.customers:
            live.watcher.scan()
            live.check_alive()
            peak_rss = max(peak_rss, rss_mb(live.bot.proc.pid))
            await asyncio.sleep(0.02)
        last = time.monotonic() - started
        await quiet(live.bot.proc.pid)
    cpu_after = live.cpu()
    if spy is not None:
        await stop_profiler(spy)
    live.watcher.scan()
    times = [at - started for s in said if (at := live.watcher.posted_at(answer[s.text])) is not None]
    posts = Counter(len(live.watcher.posts.get(a, [])) for a in answer.values())
    cpu = cpu_use(cpu_before, cpu_after)
    bot_s = None if cpu_before.bot is None or cpu_after.bot is None else cpu_after.bot - cpu_before.bot
    load_s = cpu_after.bench - cpu_before.bench
    return {
        "burst": b.name,
        "customers": b.customers,
        "channels": b.channels,
        "profiled": profile is not None,
        "answered_once": posts[1],
        "answered_more_than_once": sum(n for k, n in posts.items() if k > 1),
        "unanswered": posts[0],
        "send_s": round(sent - started, 3),
        "event_to_reply_s": summary(times),
        "last_answer_s": round(max(times), 3) if times else None,
        "wall_to_quiet_s": round(last, 3),
        "peak_rss_mb": round(peak_rss, 1),
        "bot_cpu_s": None if bot_s is None else round(bot_s, 2),
        "bot_cpu_ms_per_message": None if bot_s is None else round(bot_s * 1000 / b.customers, 1),
        "load_cpu_ms_per_message": round(load_s * 1000 / b.customers, 2),
        "bot_cpu_vs_load": None if bot_s is None or load_s <= 0 else round(bot_s / load_s, 2),
        "cpu": cpu,
    }


async def run_setup(server_url: str, name: str, quick: bool, profile: bool) -> dict[str, Any]:
    section(f"set-up: {name}")
    settings = SETUPS[name]
    async with live_bot(server_url, lambda r: slow(LATENCY_S, reply(f"answer: {r.last_user}")), settings) as live:
        warm = await burst(live, Burst("warm-up", 1, 1), f"{name}_warm")
        print(f"warm-up question answered after {warm['last_answer_s']} s", flush=True)
        waves: list[dict[str, Any]] = []
        plan = bursts(quick)
        for n, b in enumerate(plan):
            spied = Path(tempfile.mkdtemp(prefix="helpdesk-spy-")) if profile and n == len(plan) - 1 else None
            waves.append(await burst(live, b, f"{name}_{n}", None if spied is None else spied / "raw.txt"))
            w = waves[-1]
            print(
                f"{b.name}: last answer {w['last_answer_s']} s, {w['answered_once']}/{b.customers} answered once, "
                f"bot CPU {w['bot_cpu_ms_per_message']} ms per message ({w['bot_cpu_vs_load']}× the load generator's "
                f"{w['load_cpu_ms_per_message']} ms), peak RSS {w['peak_rss_mb']} MB",
                flush=True,
            )
            print(cpu_line(w["cpu"]), flush=True)
            if spied is not None:
                w["profile"] = profiled(spied / "raw.txt", name, b)
                shutil.rmtree(spied, ignore_errors=True)
    single = waves[0]["last_answer_s"]
    for w in waves:
        last = w["last_answer_s"]
        w["last_vs_single"] = round(last / single, 2) if last and single else None
    print_afterwards(live.afterwards)
    shown = {k: v for k, v in settings.items() if k in ("embeddings", "embeddings_model", "router_min_score")}
    return {"settings": shown, "warm_up": warm, "waves": waves, "afterwards": live.afterwards}


async def run(server_url: str, quick: bool, profile: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"llm_latency_s": LATENCY_S, "setups": {}}
    for name in SETUPS:
        report["setups"][name] = await run_setup(server_url, name, quick, profile)
    section("summary")
    print(cpu_table(report).markdown())
    return report


# ------------------------------------------------------------------------------------------------ profile


def profiled(raw: Path, name: str, b: Burst) -> dict[str, Any]:
    """The summary of py-spy's samples, and their flame graph written to docs/flame/cpu-<set-up>.svg."""
    stacks = parse_stacks(raw.read_text() if raw.is_file() else "")
    out = FLAMES / f"cpu-{name}.svg"
    flamegraph(busy(stacks), out, f"bot process, {name} set-up, {b.name} at once (py-spy, 100 Hz)")
    result = profile_summary(stacks, f"{name}: {b.name}, {LATENCY_S:.0f} s per model call")
    result["flame_graph"] = str(out.relative_to(ROOT))
    print_profile(result)
    return result


def py_spy() -> str:
    found = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if found is None:
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install -c constraints.txt py-spy")
    return found


async def start_profiler(pid: int, out: Path) -> asyncio.subprocess.Process:
    """py-spy sampling the process into `out` (collapsed stacks, one "frame;frame;... count" a line) until stopped."""
    spy = await asyncio.create_subprocess_exec(
        py_spy(), "record", "--pid", str(pid), "--rate", "100", "--format", "raw", "--nolineno", "-o", str(out),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    await asyncio.sleep(1.0)  # attaching takes a moment: the burst must not start unobserved
    return spy


async def stop_profiler(spy: asyncio.subprocess.Process) -> None:
    """py-spy writes its file when interrupted, as on Ctrl-C."""
    spy.send_signal(signal.SIGINT)
    try:
        _, err = await asyncio.wait_for(spy.communicate(), timeout=60)
    except TimeoutError:
        spy.kill()
        await spy.wait()
        return
    if spy.returncode not in (0, -signal.SIGINT):
        print(f"py-spy exited with {spy.returncode}: {err.decode(errors='replace')[-500:]}", flush=True)


def parse_stacks(raw: str) -> list[tuple[list[str], int]]:
    """py-spy's raw lines: the frames from the outermost ("function (file)"), and the samples seen with them."""
    stacks = []
    for line in raw.splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append((frames.split(";"), int(count)))
    return stacks


def file_of(frame: str) -> str:
    return frame.rpartition(" (")[2].rstrip(")")


def area(frame: str) -> str:
    """Where a frame's code lives: our packages by their second level (`agents/knowledge`, `bot/cli.py`), others
    by their top-level package or standard-library module."""
    path = file_of(frame).removeprefix("/").split("/")
    return "/".join(path[:2]) if path[0] in ("agents", "bot", "escalation") else path[0].removesuffix(".py")


Tree = dict[str, Any]
"""A frame's name -> [its samples, the frames it called (a Tree)]."""


def tree_of(stacks: list[tuple[list[str], int]]) -> Tree:
    tree: Tree = {}
    for frames, n in stacks:
        level = tree
        for frame in frames:
            node = level.setdefault(frame, [0, {}])
            node[0] += n
            level = node[1]
    return tree


def trunk(tree: Tree) -> set[str]:
    """The main thread's entry point (`python -m bot`, the CLI, `asyncio.run`): from its outermost frame down, the
    frames that hold (nearly) all of their caller's samples. (A worker thread's outermost frames are threading's, and
    SQLAlchemy's work in its greenlets shows as stacks of their own, which py-spy cannot join to their callers.)"""
    found: set[str] = set()
    for frame, (n, children) in tree.items():
        if not file_of(frame).startswith(ENTRY):
            continue
        found.add(frame)
        while children:
            callee, (m, below) = max(children.items(), key=lambda item: item[1][0])
            if m < 0.95 * n:
                break
            found.add(callee)
            n, children = m, below
    return found


def busy(stacks: list[tuple[list[str], int]]) -> list[tuple[list[str], int]]:
    return [(frames, n) for frames, n in stacks if frames[-1] not in WAITS]


def profile_summary(stacks: list[tuple[list[str], int]], what: str) -> dict[str, Any]:
    """The share of busy samples each frame is in (itself or what it called: "inclusive") and at the top of
    ("own"), and each part of the code's inclusive share; the entry point's and the event loop's plumbing is left
    out of the frames."""
    working = busy(stacks)
    total = sum(n for _, n in working)
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    for frames, n in working:
        for frame in set(frames):
            inclusive[frame] += n
        for part in {area(f) for f in frames}:
            areas[part] += n
        own[frames[-1]] += n
    waiting = sum(n for _, n in stacks) - total
    if not total:
        return {"what": what, "samples": 0, "waiting_samples_left_out": waiting}

    def share(counts: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
        return [{"frame": f, "share": round(n / total, 3)} for f, n in counts]

    plumbing = trunk(tree_of(working)) | {f for f in inclusive if file_of(f).startswith(TRUNK_FILES)}
    outer = {area(f) for f in plumbing}
    return {
        "what": what,
        "samples": total,
        "waiting_samples_left_out": waiting,
        "top_inclusive": share([(f, n) for f, n in inclusive.most_common() if f not in plumbing][:TOP]),
        "top_own": share(own.most_common(TOP)),
        "areas": [{"area": a, "share": round(n / total, 3)} for a, n in areas.most_common() if a not in outer][:TOP],
    }


def print_profile(profile: dict[str, Any]) -> None:
    print(f"profile ({profile['what']}; {profile['samples']} busy samples), share of them:", flush=True)
    for title, key, name in (
        ("frames, inclusive", "top_inclusive", "frame"),
        ("frames, own", "top_own", "frame"),
        ("parts of the code, inclusive", "areas", "area"),
    ):
        print(f"  {title}:")
        for row in profile.get(key, []):
            print(f"    {row['share']:6.1%}  {row[name]}")


def flamegraph(stacks: list[tuple[list[str], int]], out: Path, title: str) -> None:
    """An icicle SVG (the outermost frame on top, each frame as wide as its share of the samples, its callees
    below): py-spy writes one format a run, and the collapsed stacks are what the summary needs."""
    tree = tree_of(stacks)
    total = sum(node[0] for node in tree.values()) or 1
    width, row, top = 1200.0, 16, 40
    rects: list[str] = []
    depth_max = 0

    def draw(level: Tree, x: float, depth: int) -> None:
        nonlocal depth_max
        for frame, (n, children) in sorted(level.items()):
            w = n / total * width
            if w >= 0.3:
                depth_max = max(depth_max, depth)
                digest = hashlib.md5(area(frame).encode(), usedforsecurity=False).digest()
                r, g, b = (int(c * 255) for c in colorsys.hls_to_rgb(digest[0] / 255 * 0.17, 0.62, 0.75))
                label = frame if len(frame) * 6.2 < w - 4 else frame[: max(0, int((w - 4) / 6.2) - 2)] + ".."
                rects.append(
                    f"<g><title>{escape(frame)}: {n} samples, {n / total:.1%}</title>"
                    f'<rect x="{x:.1f}" y="{top + depth * row}" width="{w:.1f}" height="{row - 1}" '
                    f'fill="rgb({r},{g},{b})" rx="2"/>'
                    + (f'<text x="{x + 3:.1f}" y="{top + depth * row + 12}">{escape(label)}</text>' if w > 20 else "")
                    + "</g>"
                )
                draw(children, x, depth + 1)
            x += w

    draw(tree, 0.0, 0)
    height = top + (depth_max + 1) * row + 10
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
        f'viewBox="0 0 {width:.0f} {height}" font-family="monospace" font-size="11">\n'
        f'<rect width="100%" height="100%" fill="#fdfdfd"/>\n'
        f'<text x="4" y="18" font-size="14">{escape(title)}</text>\n'
        f'<text x="4" y="33" fill="#666">{total} busy samples (waits left out); hover a frame for its share</text>\n'
        + "\n".join(rects)
        + "\n</svg>\n"
    )


def main(*, quick: bool = False, results: Path = RESULTS, profile: bool = False) -> dict[str, Any]:
    if profile:
        py_spy()
    return run_benchmark("cpu", quick, results, lambda url: run(url, quick, profile))
