"""Tools every operator's agents may name without declaring them."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from agents.tools import Tool, ToolContext, function_tool


@function_tool
async def record_customer_name(ctx: ToolContext, name: Annotated[str, Field(min_length=1, max_length=80)]) -> str:
    """Remember the customer's name for the conversation."""
    ctx.state["customer_name"] = name.strip()
    return f"Recorded the customer's name: {name.strip()}."


BUILTINS: dict[str, Tool] = {"record_customer_name": record_customer_name}
