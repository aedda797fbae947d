"""The outbox's deliveries: a closed set of typed values that round-trip through their `outbox` rows."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from db import deliveries as d
from db import models as m
from db.deliveries import KINDS, Delivery, delivery_of, enqueue, row_of

Sessions = async_sessionmaker[AsyncSession]


def examples(conversation_id: int = 1, escalation_id: int = 1) -> list[Delivery]:
    """One of each kind, every field set to a value no other field has."""
    c, e = conversation_id, escalation_id
    return [
        d.Post(c, "C_SUPPORT", "1.000001", "hello"),
        d.Post(c, "D_DIRECT", None, "a direct message"),
        d.AddReaction(c, "C_SUPPORT", "1.000002", "eyes"),
        d.RemoveReaction(c, "C_SUPPORT", "1.000003", "white_check_mark"),
        d.CasePost(c, e, "C_STAFF"),
        d.CaseUpdate(c, e),
        d.RelayToStaff(c, e, "U_CUSTOMER", "hello? anyone?"),
        d.RelayToCustomer(c, e, "C_SUPPORT", "1.000004", "U_STAFF", "Sam here.", "2.000001"),
        d.RelayEdit(c, e, "2.000002", "Sam here, edited."),
        d.RelayDelete(c, e, "2.000003"),
        d.Reminder(c, e, "Case #1 has waited 16 min"),
    ]


def test_every_delivery_kind_round_trips_through_its_row() -> None:
    owed = examples()
    assert {type(d) for d in owed} == set(KINDS.values())  # an example of every kind, so a new one is tested too
    assert len(KINDS) == len({cls.kind for cls in KINDS.values()})
    for delivery in owed:
        row = row_of(delivery)
        assert row["kind"] == delivery.kind and delivery_of(row) == delivery
        assert set(row) <= {c.name for c in m.Outbox.__table__.columns}
    with pytest.raises(ValueError, match="unknown outbox kind 'carrier_pigeon'"):
        delivery_of(row_of(owed[0]) | {"kind": "carrier_pigeon"})


async def test_deliveries_round_trip_through_the_outbox_table(sessions: Sessions, engine: AsyncEngine) -> None:
    async with sessions() as s, s.begin():
        conversation = m.Conversation(key="slack:T0001:C_SUPPORT:1.000001", active_agent="triage")
        s.add(conversation)
        await s.flush()
        escalation = m.Escalation(conversation_id=conversation.id, reason="r", trigger="tool", agent="triage")
        s.add(escalation)
        await s.flush()
        owed = examples(conversation.id, escalation.id)
        await enqueue(s, owed)
    async with engine.connect() as conn:
        rows = (await conn.execute(select(m.Outbox).order_by(m.Outbox.id))).all()
    assert [delivery_of(r._mapping) for r in rows] == owed
