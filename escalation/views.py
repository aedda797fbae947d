"""What the staff side's messages show, as pure functions of what they are about: the case message (Block Kit),
relays both ways and reminders. The outbox's sender posts the `Message`s returned here.

Names, reasons and messages are other people's text (a customer's, a colleague's, a model's): each is escaped or made
inert (`agents.markup.text`) where it enters a message, and the blocks are clipped to what Slack accepts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agents.address import is_teams_id
from agents.db.deliveries import Source
from agents.markup.limits import MESSAGE_TEXT, clip, fit
from agents.markup.text import escape, inert
from escalation.machine import OPEN_CASE, CaseStatus

ACTION_CLAIM = "case_claim"
ACTION_RESOLVE = "case_resolve"
ACTION_HAND_BACK = "case_hand_back"
REASON_IN_TEXT = 300
"""Characters of the reason in the case's notification text; the blocks show more."""


@dataclass(frozen=True)
class Person:
    """Someone as a message shows them."""

    name: str
    avatar: str | None = None
    """An image URL."""


@dataclass(frozen=True)
class Message:
    """What one post shows; where it goes, and the mark that makes it exactly-once, the sender adds."""

    text: str
    """The message, or with `blocks` its fallback and notification text."""
    blocks: list[dict[str, Any]] | None = None
    """Block Kit layout."""
    shown_as: Person | None = None
    """Posted under this name and avatar instead of the bot's own."""
    broadcast: bool = False
    """A thread reply that is shown in the channel too."""
    native: bool = False
    """`text` is already in the destination platform's markup (an answer rendered when it was queued); otherwise
    it is Slack mrkdwn, which a Teams sender converts."""
    ai: bool = False
    """An AI agent's answer: labelled as AI-made, with the platform's own rating control, where the platform has them
    (Teams); a notice, relay or case is not."""
    sources: tuple[Source, ...] = ()
    """What the answer was grounded in, cited where the platform cites (Teams; Slack shows them in `blocks`)."""


@dataclass(frozen=True)
class CaseView:
    escalation_id: int
    customer: str
    """The customer's display name (or their user id when the profile could not be read)."""
    channel: str
    permalink: str | None
    reason: str
    summary: str
    """mrkdwn, its untrusted parts already made inert (it is built from the transcript, or by a model)."""
    agent: str
    status: str
    claimed_by: str | None = None
    closed_by: str | None = None
    names: dict[str, str] | None = None
    """Display names of the people above who are not Slack users (Teams colleagues), which no `<@…>` can show."""


def _person(case: CaseView, user: str | None) -> str:
    """A colleague as the case shows them: a Slack mention (Slack shows their name), else their name."""
    if user is None or not is_teams_id(user):
        return f"<@{user}>"
    return escape((case.names or {}).get(user, "a colleague"))


def _where(case: CaseView, *, label: str) -> str:
    """The customer's conversation: a Slack channel mention, or for Teams (whose ids Slack cannot show) a link."""
    if not is_teams_id(case.channel):
        return f"<#{case.channel}>" + (f" · <{escape(case.permalink)}|{label}>" if case.permalink else "")
    return "Microsoft Teams" + (f" · <{escape(case.permalink)}|{label}>" if case.permalink else "")


def _status_line(case: CaseView) -> str:
    match case.status:
        case CaseStatus.OPEN:
            return ":large_orange_circle: *Waiting for a colleague*"
        case CaseStatus.CLAIMED:
            return f":large_blue_circle: *Claimed by {_person(case, case.claimed_by)}*"
        case CaseStatus.RESOLVED:
            return f":white_check_mark: *Resolved by {_person(case, case.closed_by)}*"
        case CaseStatus.HANDED_BACK:
            return f":robot_face: *Handed back to the bot by {_person(case, case.closed_by)}*"
    return case.status


def case_text(case: CaseView) -> str:
    """The notification text (its first line), and the whole case where blocks cannot be used: a post Slack
    refused the layout of, a direct message to the admins. The summary is inert already (`CaseRenderer`)."""
    reason = clip(inert(case.reason), REASON_IN_TEXT)
    where = f"<#{case.channel}>" + (f" <{escape(case.permalink)}>" if case.permalink else "")
    if is_teams_id(case.channel):
        where = _where(case, label="open the conversation")
    return (
        f"Case #{case.escalation_id}: {escape(case.customer)} needs a person ({reason})\n"
        f"Where: {where} · escalated by the {escape(case.agent)} agent\nSummary: {case.summary}\n{_status_line(case)}"
    )


def case_message(case: CaseView) -> Message:
    return Message(case_text(case), blocks=case_blocks(case))


def relay_to_staff(customer: Person, text: str) -> Message:
    return Message(clip(f"*{escape(customer.name)}* (customer): {inert(text)}", MESSAGE_TEXT))


def relay_text(text: str) -> str:
    """A colleague's message (Slack mrkdwn, as its event delivered it) as the customer sees it, also when edited:
    an @channel or a mention in the staff channel must not reach a customer channel as one."""
    return clip(inert(text), MESSAGE_TEXT)


def relay_to_customer(colleague: Person, text: str, *, suffix: str) -> Message:
    """`suffix` follows the colleague's name (STAFF_NAME_SUFFIX), so the customer sees who speaks for the company."""
    # The username is plain text to Slack (no mentions, no links), so the colleague's name goes in as it is.
    return Message(relay_text(text), shown_as=Person(f"{colleague.name}{suffix}", colleague.avatar))


def files_from_colleague(colleague: Person, *, suffix: str) -> Message:
    """What introduces a colleague's files to the customer: a file share cannot carry another name and avatar, so
    the name their relays are shown under goes in its text."""
    shown = relay_to_customer(colleague, "", suffix=suffix).shown_as
    return Message(f"*{escape(shown.name if shown else colleague.name)}*:")


def files_not_shared(comment: str, left_out: Sequence[tuple[str, str]]) -> str:
    """A relay with the names of the files that did not go with it, each with why (name, why)."""
    listed = ", ".join(f"{escape(name)} ({why})" for name, why in left_out)
    return clip(f"{comment}\n_Files not relayed: {listed}_", MESSAGE_TEXT)


_FIXES = {
    "not_in_channel": "Invite me to that channel (`/invite` me there).",
    "channel_not_found": "Check STAFF_CHANNEL_ID: no such channel, or I cannot see it.",
    "is_archived": "The channel is archived: unarchive it or set another STAFF_CHANNEL_ID.",
    "restricted_action": "Posting there is restricted: allow apps to post, or set another STAFF_CHANNEL_ID.",
}


def case_problem(escalation_id: int, channel: str, error: str) -> str:
    """For the admins: a case the staff channel would not take."""
    fix = _FIXES.get(error, "I will keep trying for a few minutes.")
    return f":warning: I could not post case #{escalation_id} in <#{channel}> (`{error}`). {fix}"


def case_given_up(escalation_id: int, error: str, case_text: str) -> str:
    """For the admins: a case that could not be posted at all, with the case itself so that someone can act."""
    return (
        f":rotating_light: I gave up posting case #{escalation_id} for staff (`{error}`); the customer was told "
        f"that nobody could be reached yet. The case:\n\n{case_text}"
    )


def reminder_text(escalation_id: int, waited_minutes: int) -> str:
    return f":alarm_clock: Case #{escalation_id} has waited {waited_minutes} min for a colleague. Can someone take it?"


def reminder(text: str) -> Message:
    return Message(text, broadcast=True)


def case_blocks(case: CaseView) -> list[dict[str, Any]]:
    """The case message's layout; each text clipped to its field's limit, so a long reason or name still posts."""
    customer = escape(case.customer)
    where = _where(case, label="open the thread")
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": f"Case #{case.escalation_id}: {customer}"}},
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": f"*Customer*\n{customer}"},
                {"type": "mrkdwn", "text": f"*Where*\n{where}"},
                {"type": "mrkdwn", "text": f"*Reason*\n{inert(case.reason)}"},
                {"type": "mrkdwn", "text": f"*Escalated by*\n{escape(case.agent)} agent"},
            ],
        },
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*Summary*\n{case.summary}"}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": _status_line(case)}]},
    ]
    if case.status in OPEN_CASE:
        value = str(case.escalation_id)
        buttons = [
            {
                "type": "button",
                "action_id": ACTION_RESOLVE,
                "value": value,
                "style": "primary",
                "text": {"type": "plain_text", "text": "Resolve"},
            },
            {
                "type": "button",
                "action_id": ACTION_HAND_BACK,
                "value": value,
                "text": {"type": "plain_text", "text": "Hand back to bot"},
            },
        ]
        if case.status == CaseStatus.OPEN:
            buttons.insert(
                0,
                {
                    "type": "button",
                    "action_id": ACTION_CLAIM,
                    "value": value,
                    "text": {"type": "plain_text", "text": "Claim"},
                },
            )
        blocks.append({"type": "actions", "block_id": f"case-{case.escalation_id}", "elements": buttons})
    blocks.append(
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": "Reply in this thread to talk to the customer. "
                    "Start a message with `note:` to keep it internal.",
                }
            ],
        }
    )
    return fit(blocks)
