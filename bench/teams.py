"""Benchmark of the Teams edge beside Slack's: one bot process (`python -m bot serve`) serving both, fed by this
process, which also plays both platforms (the emulators) and the LLM (answering "re: <the customer's message>");
see `bench.live`. The same phases as `bench.slack` run for Slack and then for Teams, so that the two are
comparable on one machine in one run.

Teams' traffic: half the conversations are personal (1:1) chats, each with its own customer, half are posts in
a channel that mention the bot, followed by replies in their reply chains (mentioning it too). Its figures are
Slack's: the ack (the HTTP answer to the activity, which Teams wants within 15 s), the time from sending an
activity to the emulator's record of the bot's reply post, and exactly one reply per activity, in its
conversation; instead of reactions, the bot's typing indicator: its latency in the sequential phase, and in the
burst for each conversation's first activity (later ones' indicators cannot be told apart).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import aiohttp
import slack_bolt

from bench.live import CORES_NOTE, Live, disturbed, live_bot, print_afterwards
from bench.setup import RESULTS, run_benchmark, section, summary, table
from bench.slack import Mark, Params, SlackChats, answer, phase_cpu, phases, reply_text
from fakes.teams_api import BOT_NAME, TeamsEmulator
from harness import teams as th

TEAMS_ACK_DEADLINE_S = 15.0
"""Teams gives up on an activity the bot has not answered within 15 seconds (and may send it again)."""
SUPPORT = "support"
MENTION = f"<at>{BOT_NAME}</at> "


@dataclass
class TeamsChats:
    """Customers in Teams: new conversations alternate between a new customer's personal chat and a new post in
    the support channel; the bot's typing indicators and replies, from the emulator's record."""

    live: Live
    teams: TeamsEmulator
    watcher: th.Watcher
    name: str = "Teams"
    ack_deadline_s: float = TEAMS_ACK_DEADLINE_S
    marks: tuple[Mark, ...] = (
        # Sent when the message is stored; left out when the reply was ready first (the reply ends it anyway).
        Mark("typing_indicator", "the typing indicator", optional=True),
        Mark("reply", "the reply post"),
    )
    conversations: itertools.count[int] = field(default_factory=itertools.count)
    awaiting: set[str] = field(default_factory=set)

    async def write(self, text: str, root: th.Sent | None) -> th.Sent:
        if root is not None and root.root is not None:
            return await th.channel_reply(self.teams, SUPPORT, root.root, text, mention_bot=True, send=False)
        if root is not None:
            return await th.personal(self.teams, text, user=root.activity["from"]["id"], send=False)
        n = next(self.conversations)
        if n % 2:
            return await th.channel_post(self.teams, SUPPORT, text, send=False)
        customer = self.teams.add_user(f"29:customer-{n}", f"Customer{n} Bench")
        return await th.personal(self.teams, text, user=customer.id, send=False)

    async def deliver(self, message: th.Sent) -> th.Sent:
        return await th.deliver(self.teams, message)

    def text(self, message: th.Sent) -> str:
        return str(message.activity["text"]).removeprefix(MENTION)

    def typed(self, message: th.Sent, until: float = float("inf")) -> float | None:
        """The first typing indicator in `message`'s conversation (its reply chain, in a channel) after it was
        sent and before `until`."""
        ats = (t.at for t in self.teams.typing if t.conversation_id == message.conversation_id)
        return next((at for at in ats if message.sent <= at < until), None)

    def marked(self, message: th.Sent) -> dict[str, float | None]:
        self.watcher.scan()
        return {
            "typing_indicator": self.typed(message),
            "reply": self.watcher.posted_at(reply_text(self.text(message))),
        }

    def replies(self, message: th.Sent) -> list[tuple[float, bool]]:
        posts = self.watcher.posts.get(reply_text(self.text(message)), [])
        return [(p.at, p.conversation_id == message.conversation_id) for p in posts]

    def expect(self, message: th.Sent) -> None:
        self.awaiting.add(reply_text(self.text(message)))

    def awaited(self) -> bool:
        self.watcher.scan()
        self.awaiting = {text for text in self.awaiting if text not in self.watcher.posts}
        return bool(self.awaiting)

    async def after_burst(self, live: Live, sent: list[th.Sent], replied: bool, last_sent: float) -> dict[str, Any]:
        """Typing indicators: how many, and, for each conversation's first activity, how soon (one sent before
        that activity's reply was posted is its own: the outbox keeps a conversation's deliveries in order)."""
        conversations = {s.conversation_id for s in sent}
        firsts = [(s, self.typed(s, until=min(at for at, _ in self.replies(s)) if self.replies(s) else float("inf")))
                  for s in {s.conversation_id: s for s in reversed(sent)}.values()]  # fmt: skip
        return {
            "typing_indicators": sum(1 for t in self.teams.typing if t.conversation_id in conversations),
            "first_event_to_typing_indicator_ms": summary([(at - s.sent) * 1000 for s, at in firsts if at is not None]),
            "first_typing_indicators_skipped": sum(1 for _, at in firsts if at is None),
        }


# ------------------------------------------------------------------------------------------------ report


def side_by_side(figures: dict[str, dict[str, Any]]) -> None:
    section("Slack and Teams side by side (ms unless said)")
    names = list(figures)

    def row(label: str, phase: str, key: str, stat: str | None = None) -> list[object]:
        values = [figures[n][phase].get(key) for n in names]
        return [label, *(v[stat] if stat and isinstance(v, dict) else v for v in values)]

    signal = {"Slack": "event_to_working_reaction_ms", "Teams": "event_to_typing_indicator_ms"}
    rows = [
        row("sequential: ack p50", "sequential", "ack_ms", "p50"),
        row("sequential: ack p99", "sequential", "ack_ms", "p99"),
        ["sequential: working signal p50", *(figures[n]["sequential"][signal[n]]["p50"] for n in names)],
        row("sequential: reply p50", "sequential", "event_to_reply_ms", "p50"),
        row("sequential: reply p99", "sequential", "event_to_reply_ms", "p99"),
        row("burst: ack p50", "burst", "ack_ms", "p50"),
        row("burst: ack p99", "burst", "ack_ms", "p99"),
        row("burst: ack max", "burst", "ack_ms", "max"),
        row("burst: reply p50", "burst", "event_to_reply_ms", "p50"),
        row("burst: reply p99", "burst", "event_to_reply_ms", "p99"),
        row("burst: drain, s", "burst", "drain_s"),
        ["burst: exactly one reply each", *("yes" if figures[n]["burst"]["exactly_once"] else "NO" for n in names)],
    ]
    print(table(["", *names], rows))
    print("working signal: Slack's working reaction, Teams' typing indicator")
    burst = figures["Teams"]["burst"]
    typing = burst["first_event_to_typing_indicator_ms"]
    print(
        f"Teams burst: {burst['typing_indicators']} typing indicators for {burst['events']} activities; from each "
        f"conversation's first activity to its typing indicator p50 {typing['p50']:,.0f} ms, p99 {typing['p99']:,.0f} "
        f"ms ({burst['first_typing_indicators_skipped']} without)"
    )


# ------------------------------------------------------------------------------------------------ entry


async def run(server_url: str, params: Params) -> dict[str, Any]:
    async with live_bot(server_url, answer, {}, teams=True) as live:
        assert live.teams is not None
        slack = await phases(live, SlackChats(live), params)
        teams_chats = TeamsChats(live, live.teams, th.Watcher(live.teams))
        teams = await phases(live, teams_chats, params)
    figures = {"Slack": slack, "Teams": teams}
    side_by_side(figures)
    section("Afterwards (both platforms)")
    print_afterwards(live.afterwards)
    cpu = {f"{n.lower()}_{phase}": use for n, f in figures.items() for phase, use in phase_cpu(f).items()}
    return {
        "machine": {
            "slack_bolt": slack_bolt.version.__version__,
            "microsoft_agents_hosting_core": version("microsoft-agents-hosting-core"),
            "aiohttp": aiohttp.__version__,
        },
        "note": CORES_NOTE.format(cores=os.cpu_count()) + "; the Teams emulator runs in this process too",
        "parameters": asdict(params) | {"events": params.events},
        "figures": {"slack": slack, "teams": teams},
        "disturbed_by_other_processes": disturbed(cpu),
        **live.afterwards,
        "failed_connector_calls": dict(teams_chats.watcher.failed),
    }


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the Slack and Teams benchmark, print its figures and write `results/teams.json`."""
    params = Params.of(quick)
    return run_benchmark("teams", quick, results, lambda url: run(url, params))
