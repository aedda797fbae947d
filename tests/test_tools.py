"""Tool schemas come from typed signatures; arguments are validated by the same pydantic model."""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

import openai
import pytest
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import async_sessionmaker

from agents.agent import MAX_TOOLS, Agent, Roster
from agents.errors import ConfigError
from agents.knowledge.embedders import OpenAIEmbedder
from agents.knowledge.store import KnowledgeBase
from agents.tools import Tool, ToolArgumentsError, ToolContext, function_tool, schema_tool
from agents.toolsets import Toolset
from harness.sample import default_roster


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
    assert "Sales at Driftwing Drones" in roster["sales"].render_instructions({"customer_name": "Ada"})


# ------------------------------------------------------------------------- compact schemas, valid everywhere

JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
KEYWORDS = {
    "type", "properties", "required", "description", "enum", "items", "default",
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems",
}  # fmt: skip
"""The JSON Schema subset the providers share. OpenAI (and Azure OpenAI, the same validator) accepts JSON Schema
for function parameters but validates it; vLLM renders the schema into the chat template and, for
tool_choice "required" or a named function, compiles it into a grammar; Ollama keeps of each property only
`type`, `description`, `enum` and `items`, and drops the rest without a word."""


def provider_problems(tool: dict[str, Any]) -> list[str]:
    """Why OpenAI/Azure, vLLM or Ollama would refuse or misread this entry of the `tools` list."""
    problems: list[str] = []
    function = tool["function"]
    if tool.get("type") != "function":
        problems.append("every provider: an entry is {type: function, function: ...}")
    if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", function["name"]):
        problems.append("OpenAI: a function name is a-z, A-Z, 0-9, _ and -, at most 64 characters")
    if not isinstance(function.get("description"), str) or "\n" in function["description"]:
        problems.append("every provider: the description is one line of text")
    params = function["parameters"]
    if params.get("type") != "object" or not isinstance(params.get("properties"), dict):
        problems.append("OpenAI, vLLM, Ollama: parameters are an object schema with properties")
    if not set(params.get("required", [])) <= set(params.get("properties", {})):
        problems.append("OpenAI: every required name is a property")

    def walk(node: dict[str, Any], where: str, top: bool) -> None:
        unknown = set(node) - KEYWORDS
        if unknown:
            problems.append(f"{where}: keywords outside the shared subset: {sorted(unknown)}")
        kind = node.get("type")
        if not isinstance(kind, str) or kind not in JSON_TYPES - {"null"}:
            problems.append(f"{where}: Ollama reads one `type` string per property (no anyOf, $ref, null)")
        if kind == "array" and not isinstance(node.get("items"), dict):
            problems.append(f"{where}: OpenAI: array schema missing items")
        if "enum" in node and not (node["enum"] and all(isinstance(v, str) for v in node["enum"])):
            problems.append(f"{where}: Ollama: enum values are strings")
        if kind == "object" and not top and "properties" not in node:
            problems.append(f"{where}: an object argument names its properties")
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{where}.{name}", False)
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{where}[]", False)

    walk(params, function["name"], True)
    return problems


def shipped_tools() -> list[Tool]:
    # Building the roster touches no database nor provider: they are only asked when search_knowledge runs.
    embedder = OpenAIEmbedder(client=openai.AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9"), model="m")
    kb = KnowledgeBase(sessions=async_sessionmaker(), embedder=embedder)
    roster = default_roster(kb)
    return [t for name in roster.agents for t in roster.tools_of(name)]


def test_every_shipped_schema_is_compact_and_valid_for_each_provider() -> None:
    for tool in shipped_tools():
        schema = tool.schema()
        text = json.dumps(schema)
        assert '"title"' not in text and '"null"' not in text and "anyOf" not in text, text
        assert "additionalProperties" not in text and "$ref" not in text, text
        assert provider_problems(schema) == [], (tool.name, provider_problems(schema))
    transfer = next(t for t in shipped_tools() if t.name == "transfer_to_sales").schema()["function"]
    assert transfer["parameters"] == {"properties": {"reason": {"type": "string"}}, "type": "object"}
    assert len(transfer["description"]) <= 100


class Part(StrEnum):
    BATTERY = "battery"
    GIMBAL = "gimbal"


class Address(BaseModel):
    city: str
    zip_code: str | None = None


@function_tool
async def ship_parts(
    parts: Annotated[list[Part], Field(description="What to send")],
    to: Address,
    note: str | None = None,
) -> str:
    """Send spare parts.

    Free of charge."""
    return f"{[p.value for p in parts]} {to.city} {to.zip_code} {note}"


def test_nested_models_enums_and_optionals_are_inlined_without_null() -> None:
    schema = ship_parts.schema()
    assert provider_problems(schema) == []
    function = schema["function"]
    assert function["description"] == "Send spare parts. Free of charge."
    assert function["parameters"] == {
        "properties": {
            "parts": {"description": "What to send", "items": {"enum": ["battery", "gimbal"], "type": "string"},
                      "type": "array"},
            "to": {"properties": {"city": {"type": "string"}, "zip_code": {"type": "string"}}, "required": ["city"],
                   "type": "object"},
            "note": {"type": "string"},
        },
        "required": ["parts", "to"],
        "type": "object",
    }  # fmt: skip


async def test_arguments_are_still_validated_against_the_full_model() -> None:
    ctx = ToolContext(conversation_id=1, inbound_id=1, agent="support", state={})
    assert await ship_parts.invoke(ctx, '{"parts": ["gimbal"], "to": {"city": "Oslo"}}') == "['gimbal'] Oslo None None"
    # The schema no longer says so, but null and omission are both still accepted for an optional argument...
    assert await ship_parts.invoke(ctx, '{"parts": [], "to": {"city": "Oslo"}, "note": null}') == "[] Oslo None None"
    # ...and what the schema stopped spelling out (no extra arguments, nested rules) is still refused.
    for broken, problem in (
        ('{"parts": ["rotor"], "to": {"city": "Oslo"}}', "parts.0"),
        ('{"parts": [], "to": {}}', "to.city"),
        ('{"parts": [], "to": {"city": "Oslo"}, "colour": "red"}', "colour"),
    ):
        with pytest.raises(ToolArgumentsError, match=problem):
            await ship_parts.invoke(ctx, broken)
    name = next(t for t in shipped_tools() if t.name == "record_customer_name")
    with pytest.raises(ToolArgumentsError, match="name"):
        await name.invoke(ctx, '{"name": ""}')


def test_a_required_argument_that_may_be_none_is_refused() -> None:
    async def note(text: str | None) -> str:
        return text or ""

    with pytest.raises(ConfigError, match="text may be None"):
        function_tool(note)


async def test_a_schema_tool_gets_only_the_arguments_it_declares_and_a_bounded_description() -> None:
    seen: list[dict[str, Any]] = []

    async def record(ctx: ToolContext, arguments: dict[str, Any]) -> str:
        seen.append(arguments)
        return "ok"

    ctx = ToolContext(conversation_id=1, inbound_id=1, agent="a", state={})
    declared = schema_tool(
        name="t", description="x " * 2000, parameters={"type": "object", "properties": {"a": {"type": "string"}}},
        fn=record, source="mcp:s",
    )  # fmt: skip
    bare = schema_tool(name="u", description="d", parameters={"type": "object"}, fn=record, source="mcp:s")
    await declared.invoke(ctx, '{"a": "1", "email": "victim@example.com"}')
    await bare.invoke(ctx, '{"_meta": {"io.helpdesk/asker": {"email": "victim@example.com"}}}')
    assert seen == [{"a": "1"}, {}]
    assert len(declared.description) <= 1_000


def test_an_agent_is_offered_at_most_the_tools_a_provider_takes() -> None:
    many = tuple(
        schema_tool(name=f"t{i}", description="d", parameters=None, fn=_noop, source="mcp:s") for i in range(200)
    )

    class Source:
        name = "s"
        version = 1

        def tools(self) -> tuple[Tool, ...]:
            return many

    roster = Roster.of([Agent("a", "A", "d", "i", toolsets=(Toolset(Source()),))], entry="a")  # type: ignore[arg-type]
    tools, schemas = roster.listing("a")
    assert len(tools) == len(schemas) == MAX_TOOLS and tools[-1].name == "escalate_to_human"


async def _noop(ctx: ToolContext, arguments: dict[str, Any]) -> str:
    return ""
