"""What a turn owes the channels: its deliveries (`agents.db.deliveries`), queued by the engine's after_turn hook in
the turn's own transaction, and written as the conversation's channel shows them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from agents.address import Address
from agents.agent import Roster
from agents.conversations import ResultKind, TurnCommit
from agents.db.deliveries import (
    AddReaction,
    Answer,
    CasePost,
    CaseUpdate,
    Delivery,
    FilesToCustomer,
    FilesToStaff,
    Post,
    RelayToCustomer,
    RelayToStaff,
    RemoveReaction,
    Source,
    enqueue,
)
from agents.db.statements import Conn, Statement
from agents.markup.limits import split_text
from agents.texts import Text
from bot.channels.capabilities import Channel, Channels, ReplyStyle
from escalation.policy import EscalationPolicy


def posts(channel: Channel, *, conversation_id: int, address: Address, body: str) -> list[Post]:
    """Markdown (a notice, an answer) as `channel` shows it, in as many posts as its length needs."""
    return [Post(conversation_id, address.channel, address.thread, part) for part in channel.format.posts(body)]


def answers(
    channel: Channel, *, conversation_id: int, address: Address, body: str, sources: tuple[Source, ...] = ()
) -> list[Post] | list[Answer]:
    """An agent's answer: `Answer`s, kept as the model's Markdown and rendered when sent, where the channel renders
    rich answers; elsewhere posts marked as an answer. Its sources go with its last part, under all of it."""
    where = (conversation_id, address.channel, address.thread)
    if not channel.capabilities.rich_answers:
        parts = channel.format.posts(body)
        return [Post(*where, part, answer=True, sources=_last(n, parts, sources)) for n, part in enumerate(parts)]
    pieces = split_text(body)
    return [Answer(*where, piece, sources=_last(n, pieces, sources)) for n, piece in enumerate(pieces)]


def _last(n: int, parts: list[str], sources: tuple[Source, ...]) -> tuple[Source, ...]:
    return sources if n == len(parts) - 1 else ()


class TurnOutbox:
    """The engine's after_turn hook: what the channels should see of a turn (the customer's replies, the case for
    staff, relays both ways), queued with the turn's commit."""

    def __init__(
        self,
        roster: Roster,
        style: ReplyStyle,
        policy: EscalationPolicy,
        *,
        channels: Channels,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.roster = roster
        self.style = style
        self.policy = policy
        self.channels = channels
        self.clock = clock

    async def __call__(self, s: Conn, commit: TurnCommit) -> None:
        """Queued in the turn's transaction (`KnownOwed`), after reading what `owed` could not know."""
        streamed = self._reads_preview(commit) and await _streamed(s, commit.conversation_id)
        await enqueue(s, self._owed(commit, streamed=streamed))

    def owed(self, commit: TurnCommit) -> list[Delivery] | None:
        """The deliveries, unless they depend on whether the customer watched the answer grow (a read)."""
        return None if self._reads_preview(commit) else self._owed(commit, streamed=False)

    def _reads_preview(self, commit: TurnCommit) -> bool:
        """An answer after handoff notices, where the channel streams: one message if the customer watched them all
        grow in one (`bot.channels.previews.Words`), which the open preview tells."""
        result = commit.result
        if not (result.handoffs and result.reply and result.kind == ResultKind.REPLY):
            return False
        address = Address.parse(commit.key)
        return address is not None and self.channels.of(address.platform).capabilities.streaming

    def _owed(self, commit: TurnCommit, *, streamed: bool) -> list[Delivery]:
        address = Address.parse(commit.key)
        if address is None:
            return []
        roster, style, policy, clock = self.roster, self.style, self.policy, self.clock
        customer = self.channels.of(address.platform)
        channel, thread = address.channel, address.thread
        cid, result, escalation_id = commit.conversation_id, commit.result, commit.result.escalation_id
        owed: list[Delivery] = []
        notices = [
            notice
            for handoff in result.handoffs
            if (notice := style.notice(roster.get(handoff.to_agent).title, commit.language))
        ]
        reply = result.reply
        if notices and reply and result.kind == ResultKind.REPLY and streamed:
            # The customer watched the notices and the answer grow in one message (`bot.channels.previews.Words`):
            # the answer of record is that message.
            reply, notices = "\n\n".join([*notices, reply]), []
        for notice in notices:
            owed += posts(customer, conversation_id=cid, address=address, body=notice)
        if result.kind == ResultKind.STAFF:
            if escalation_id is not None:
                source = commit.external_id
                if commit.text.strip() or not commit.files:
                    owed.append(
                        RelayToCustomer(cid, escalation_id, channel, thread, commit.author, commit.text, source)
                    )
                if commit.files and source:
                    owed.append(FilesToCustomer(cid, escalation_id, channel, thread, commit.author, source))
                owed.append(CaseUpdate(cid, escalation_id))
        elif reply and result.kind == ResultKind.REPLY:
            owed += answers(customer, conversation_id=cid, address=address, body=reply, sources=result.sources)
        elif result.reply:  # a notice: escalated, over a limit
            owed += posts(customer, conversation_id=cid, address=address, body=result.reply)
        if result.kind == ResultKind.ESCALATED and escalation_id is not None and policy.staff_channel:
            if policy.hours is not None and not policy.hours.is_open(clock()):
                notice = policy.texts.get(Text.OFF_HOURS_MESSAGE, commit.language).format(hours=policy.hours.label)
                owed += posts(customer, conversation_id=cid, address=address, body=notice)
            owed.append(CasePost(cid, escalation_id, policy.staff_channel))
        if result.kind == ResultKind.HUMAN and escalation_id is not None and policy.staff_channel:
            if commit.files and commit.external_id:  # the files, shared with the words
                owed.append(FilesToStaff(cid, escalation_id, commit.author, commit.text, commit.external_id))
            else:
                owed.append(RelayToStaff(cid, escalation_id, commit.author, commit.text))
        if result.kind == ResultKind.TAKEN_OVER and escalation_id is not None and policy.staff_channel:
            # Staff learn of it from the case alone (posted, or showing its new owner); the words stay in the thread.
            if result.escalation_reason is not None:  # opened for them
                owed.append(CasePost(cid, escalation_id, policy.staff_channel))
            else:
                owed.append(CaseUpdate(cid, escalation_id))
        # Without reactions, the "being handled" signal is the typing indicator, sent when the message is stored,
        # and the reply itself ends it.
        from_customer = result.kind not in (ResultKind.STAFF, ResultKind.TAKEN_OVER)
        if commit.external_id and from_customer and customer.capabilities.reactions:
            message = commit.external_id
            if style.working_reaction:
                owed.append(RemoveReaction(cid, channel, message, style.working_reaction))
            # ✅ says "answered": not for a message that waits for a person (handed to one, or with one already) or
            # was over a limit.
            if style.done_reaction and result.kind == ResultKind.REPLY:
                owed.append(AddReaction(cid, channel, message, style.done_reaction))
        return owed


_OPEN_PREVIEW = Statement("SELECT EXISTS (SELECT FROM previews WHERE conversation_id = :c AND state = 'open')")


async def _streamed(s: Conn, conversation_id: int) -> bool:
    """The conversation has a preview open: its answer finishes it in place (`bot.delivery.sender`)."""
    return bool((await _OPEN_PREVIEW.run(s, {"c": conversation_id})).scalar())
