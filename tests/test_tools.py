"""Tool schemas come from typed signatures; arguments are validated by the same pydantic model."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import Field

from agents.agent import Agent, Roster
from agents.errors import ConfigError
from agents.roster import default_roster
from agents.tools import ToolArgumentsError, ToolContext, function_tool


@function_tool
async def book_repair(
    ctx: ToolContext,
    order_id: Annotated[str, Field(description="The order number")],
    kind: Literal["battery", "gimbal", "motor"],
    urgent: bool = False,
) -> str:
    """Book a repair slot."""
    ctx.state["booked"] = order_id
    return f"{order_id} {kind} {urgent}"


def test_schema_from_signature_hides_context() -> None:
    schema = book_repair.schema()["function"]
    assert schema["name"] == "book_repair"
    assert schema["description"] == "Book a repair slot."
    params = schema["parameters"]
    assert set(params["properties"]) == {"order_id", "kind", "urgent"}
    assert params["required"] == ["order_id", "kind"]
    assert params["properties"]["order_id"]["description"] == "The order number"
    assert params["properties"]["kind"]["enum"] == ["battery", "gimbal", "motor"]
    assert params["additionalProperties"] is False


async def test_invoke_validates_and_updates_context() -> None:
    ctx = ToolContext(conversation_id=1, inbound_id=1, agent="support", state={})
    assert await book_repair.invoke(ctx, '{"order_id": "DW-1", "kind": "motor"}') == "DW-1 motor False"
    assert ctx.state == {"booked": "DW-1"}
    with pytest.raises(ToolArgumentsError, match="kind"):
        await book_repair.invoke(ctx, '{"order_id": "DW-1", "kind": "propeller"}')
    with pytest.raises(ToolArgumentsError, match="JSON object"):
        await book_repair.invoke(ctx, "[1, 2]")


def test_roster_refuses_unknown_handoff_target() -> None:
    with pytest.raises(ConfigError, match="unknown agent 'billing'"):
        Roster.of([Agent("a", "A", "d", "i", handoffs=("billing",))], entry="a")


def test_shipped_roster_shape() -> None:
    roster = default_roster()
    assert roster.entry == "triage"
    assert set(roster.agents) == {"triage", "sales", "support"}
    for name in roster.agents:
        names = [t.name for t in roster.tools_of(name)]
        assert names[-1] == "escalate_to_human"
    assert "transfer_to_support" in [t.name for t in roster.tools_of("sales")]
    assert {"lookup_order", "issue_refund"} <= {t.name for t in roster.tools_of("support")}
    assert "Ada" in roster["sales"].render_instructions({"customer_name": "Ada"})
