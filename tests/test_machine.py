"""Human takeover's state machine, alone: every mode and case status it moves between, and what it refuses."""

from __future__ import annotations

import pytest

from agents.conversations import OpenCase
from escalation.machine import TAKEOVER, CaseStatus, Mode, Moved, Refused


@pytest.mark.parametrize(
    ("mode", "route"),
    [(Mode.BOT, "bot"), (Mode.CLOSED, "reopen"), (Mode.AWAITING_HUMAN, "human"), (Mode.HUMAN, "human")],
)
def test_who_answers_a_customer(mode: Mode, route: str) -> None:
    assert TAKEOVER.route(mode) == route


def test_a_turn_ends_with_the_bot_or_waiting_for_a_human() -> None:
    assert TAKEOVER.after_turn(escalated=False) == Mode.BOT
    assert TAKEOVER.after_turn(escalated=True) == Mode.AWAITING_HUMAN


def test_the_first_staff_reply_claims_an_unclaimed_case_for_its_author() -> None:
    step = TAKEOVER.staff_reply(Mode.AWAITING_HUMAN, OpenCase(7, None, answered=False), "U_STAFF")
    assert step is not None
    mode, change = step
    assert mode == Mode.HUMAN and change.status == CaseStatus.CLAIMED and change.claimed_by == "U_STAFF"
    # A case someone claimed stays theirs when a colleague writes too.
    step = TAKEOVER.staff_reply(Mode.HUMAN, OpenCase(7, "U_FIRST", answered=True), "U_OTHER")
    assert step is not None and step[1].claimed_by == "U_FIRST"


@pytest.mark.parametrize("mode", [Mode.BOT, Mode.CLOSED])
def test_a_staff_reply_after_hand_back_or_close_is_not_relayed(mode: Mode) -> None:
    assert TAKEOVER.staff_reply(mode, OpenCase(7, "U_STAFF", answered=True), "U_STAFF") is None
    assert TAKEOVER.staff_reply(Mode.HUMAN, None, "U_STAFF") is None


def test_staff_actions_on_an_open_case() -> None:
    claim = TAKEOVER.act("claim", status=CaseStatus.OPEN, claimed_by=None, user="U1", case_id=3)
    assert isinstance(claim, Moved) and (claim.mode, claim.status, claim.claimed_by) == (
        Mode.HUMAN,
        CaseStatus.CLAIMED,
        "U1",
    )
    resolve = TAKEOVER.act("resolve", status=CaseStatus.CLAIMED, claimed_by="U1", user="U2", case_id=3)
    assert isinstance(resolve, Moved) and (resolve.mode, resolve.status, resolve.closed) == (
        Mode.CLOSED,
        CaseStatus.RESOLVED,
        True,
    )
    assert resolve.tell_customer == "resolved"
    back = TAKEOVER.act("hand_back", status=CaseStatus.OPEN, claimed_by=None, user="U2", case_id=3)
    assert isinstance(back, Moved) and (back.mode, back.status, back.tell_customer) == (
        Mode.BOT,
        CaseStatus.HANDED_BACK,
        "handed_back",
    )


def test_staff_actions_refused() -> None:
    taken = TAKEOVER.act("claim", status=CaseStatus.CLAIMED, claimed_by="U1", user="U2", case_id=3)
    assert isinstance(taken, Refused) and "already claimed by <@U1>" in taken.message
    for action in ("claim", "resolve", "hand_back"):
        done = TAKEOVER.act(action, status=CaseStatus.RESOLVED, claimed_by="U1", user="U2", case_id=3)  # type: ignore[arg-type]
        assert isinstance(done, Refused) and done.message == "Case #3 is already resolved."
    assert isinstance(TAKEOVER.close(Mode.CLOSED), Refused)
    assert TAKEOVER.close(Mode.BOT) == Mode.CLOSED


@pytest.mark.parametrize(("mode", "tell"), [(Mode.BOT, False), (Mode.AWAITING_HUMAN, True), (Mode.HUMAN, True)])
def test_reset_goes_back_to_the_bot(mode: Mode, tell: bool) -> None:
    assert TAKEOVER.reset(mode) == (Mode.BOT, tell)
