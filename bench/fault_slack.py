"""Slack failing under load (issue 26), part of `python -m bench faults`: the real bot as `python -m bot serve`
against the Slack emulator and the fake LLM, loopback only.

    5xx storm       for STORM_S seconds every Web API call fails, in turn: 503 (Slack's JSON, nothing done), 500
                    `internal_error` after the call was done, a gateway's 502 page after it was done, a gateway's
                    504 page with nothing done, the connection closed unanswered after it was done, and 429 with
                    Retry-After; customers write one every SPACING_S meanwhile, then Slack recovers. Every message
                    must end answered in its thread exactly once (a call that was done and answered with an error
                    is looked for, not repeated). Slack's rate limits hold throughout, so the posts owed when it
                    recovers go out one a second. Figures: replies per thread, calls failed, seconds from the
                    recovery to the last answer.
    rate limits     Slack's published limits enforced (`SLACK_RATE_LIMITS`: chat.postMessage one a second per
                    channel after a short burst, the tiers for the rest) while N customers write in one channel
                    at once: 429s with Retry-After for most posts. Figures: answers exactly once, 429s, and the
                    seconds to the last answer beside the least the limit allows.

About 60 s (30 s with --quick) on 2 cores; `python -m bench.fault_slack` runs these two alone.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.fault_scene import (
    CHANNEL,
    LLM_LATENCY_S,
    QUIET_S,
    answer_to,
    last_post_at,
    replies,
    scene,
    tally,
    until,
)
from bench.setup import RESULTS, run_benchmark, section, table
from bench.tables import FAULT_HEADERS, slack_faults
from bot.playground.slack_emulator import SLACK_RATE_LIMITS, Fault
from harness.slack import Sent, deliver, write

STORM = (
    Fault(503, error="service_unavailable"),
    Fault(500, error="internal_error", performed=True),
    Fault(502, page=True, performed=True),
    Fault(504, page=True),
    Fault(0, lost=True),
    Fault(429, retry_after=2),
)
"""What each call answers during the storm, in turn."""


async def storm(server_url: str, logs: Path, customers: int, storm_s: float) -> dict[str, Any]:
    """Every Web API call fails for `storm_s` seconds, in STORM's ways by turn, while customers write."""
    spacing_s = (storm_s + 5) / customers
    async with scene(server_url, logs) as s:
        s.fake.rule = answer_to
        s.slack.rate_limits = SLACK_RATE_LIMITS  # and Slack's own limits throughout, as after any storm
        bot = await s.start()
        turn = itertools.cycle(STORM)
        ends = time.monotonic() + storm_s

        def weather(method: str, params: Mapping[str, Any]) -> Fault | None:
            return next(turn) if time.monotonic() < ends else None

        s.slack.weather = weather
        started, said, sent_in_storm = time.monotonic(), list[Sent](), 0
        for i in range(customers):
            sent_in_storm += time.monotonic() < ends
            said.append(await deliver(s.slack, write(s.slack, CHANNEL, f"storm question {i:03d}")))
            await asyncio.sleep(max(0.0, started + (i + 1) * spacing_s - time.monotonic()))
        # Slack sends a refused event again (after 1 minute, then 5; compressed here to once the storm is over).
        refused = [m for m in said if m.status != 200]
        for m in refused:
            m.status = (await s.slack.deliver(m.envelope, retry_num=1, retry_reason="http_error")).status
        complete = await until(lambda: all(replies(s.slack, said)), 120)
        await asyncio.sleep(QUIET_S)
        failed = Counter(c.error for c in s.slack.calls if c.failed and c.at < ends)
        last = last_post_at(s.slack)
        bot.check_alive()
        figures = tally(s.slack, said)
    return {
        "customers": customers,
        "acked": sum(m.status == 200 for m in said),
        "refused_then_sent_again": len(refused),
        "storm_s": storm_s,
        "spacing_s": round(spacing_s, 2),
        "sent_during_storm": sent_in_storm,
        **figures,
        "all_answered_in_time": complete,
        "calls_failed_in_storm": dict(failed),
        "recovery_to_last_answer_s": None if last is None else round(last - ends, 2),
    }


async def rate_limited(server_url: str, logs: Path, customers: int) -> dict[str, Any]:
    """Slack's own limits, with `customers` writing in one channel at once."""
    async with scene(server_url, logs) as s:
        s.fake.rule = answer_to
        s.slack.rate_limits = SLACK_RATE_LIMITS
        bot = await s.start()
        said = [write(s.slack, CHANNEL, f"busy channel question {i:03d}") for i in range(customers)]
        started = time.monotonic()
        await asyncio.gather(*(deliver(s.slack, m) for m in said))
        complete = await until(lambda: all(replies(s.slack, said)), 60 + 3 * customers)
        await asyncio.sleep(QUIET_S)
        posts = s.slack.calls_to("chat.postMessage")
        limited = Counter(c.method for c in s.slack.calls if c.error == "ratelimited")
        last = last_post_at(s.slack)
        bot.check_alive()
        figures = tally(s.slack, said)
    post_limit = SLACK_RATE_LIMITS["chat.postMessage"]
    least_s = LLM_LATENCY_S + max(0, customers - post_limit.burst) / post_limit.per_s
    return {
        "customers": customers,
        "acked": sum(m.status == 200 for m in said),
        **figures,
        "all_answered_in_time": complete,
        "post_calls": len(posts),
        "ratelimited_by_method": dict(limited),
        "least_s_the_limit_allows": round(least_s, 1),
        "first_event_to_last_answer_s": None if last is None else round(last - started, 2),
    }


async def run(server_url: str, quick: bool, logs: Path) -> dict[str, Any]:
    section("Slack failing every call in turns of 5xx, lost answers and 429s for a while")
    storm_figures = await storm(server_url, logs / "storm", 10 if quick else 30, 10.0 if quick else 30.0)
    print(storm_figures, flush=True)
    section("Slack's rate limits, a crowd in one channel")
    limits = await rate_limited(server_url, logs / "limits", 10 if quick else 30)
    print(limits, flush=True)
    result = {"slack_storm": storm_figures, "slack_rate_limits": limits}
    print(table(FAULT_HEADERS, slack_faults(result)))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.fault_slack", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smaller run to check that it works")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="helpdesk-faults-") as tmp:
        run_benchmark("faults-slack", args.quick, args.results, lambda url: run(url, args.quick, Path(tmp)))
