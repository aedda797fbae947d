"""Tools: typed Python functions whose JSON schema comes from their signature, or tools described by a JSON schema
(an MCP server's, an HTTP endpoint's: `schema_tool`).

A Python tool is `async def f(ctx: ToolContext, a: int, b: str = "x") -> str | HandoffTo | EscalateTo`.
The first parameter, when annotated `ToolContext`, is injected and hidden from the model; the rest are
built into a pydantic model that both produces the JSON schema and validates the model's arguments. A schema tool's
arguments are validated against its JSON schema (`jsonschema`) before it runs, so a broken call goes back to the model
instead of reaching the operator's system.
The schema sent to the model is pydantic's made compact (`compact_schema`): every call pays for it in prompt tokens,
and pydantic's titles, null unions and `additionalProperties` tell the model nothing the validator does not enforce.
Returning `HandoffTo` or `EscalateTo` is how a tool moves the conversation: the loop acts on the value.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import jsonschema
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db.deliveries import Source
from agents.errors import AgentsError, ConfigError
from agents.identity import Author


@dataclass
class ToolContext:
    """What a running tool may see and change. `state` is the conversation's shared context: changes persist
    with the turn."""

    conversation_id: int
    inbound_id: int | None
    agent: str
    state: dict[str, Any]
    db: async_sessionmaker[AsyncSession] | None = None
    """For tools with durable side effects; each opens its own short transaction and makes itself idempotent,
    because a turn that crashes after the tool ran is run again."""
    asker: Author | None = None
    """The verified author of the message being answered: whom the tool acts for. None when the host knows
    nobody; a tool that needs an owner then refuses. Check ownership against this, never against an id, name or
    email in the model's arguments (the model repeats whatever anyone in the thread wrote)."""
    idempotency_key: str | None = None
    """Set for an acting tool's confirmed action (`agents.confirm`): the same for every try at that one action (a
    retry after a failure, a turn run again after a crash), so the system that acts can do it once per key."""


@dataclass(frozen=True)
class HandoffTo:
    agent: str
    reason: str | None = None


@dataclass(frozen=True)
class EscalateTo:
    reason: str


@dataclass(frozen=True)
class Cited:
    """A tool's answer drawn from knowledge (`search_knowledge`'s): the model sees `text`; an answer the agent then
    writes is shown with `sources` cited under it."""

    text: str
    sources: tuple[Source, ...]


ToolResult = str | Cited | HandoffTo | EscalateTo
ToolFn = Callable[..., Awaitable[ToolResult]]
Check = Callable[[dict[str, Any]], dict[str, Any]]
"""The model's arguments (a JSON object) -> the keyword arguments the tool's function takes; raises
ToolArgumentsError when they do not fit."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    """The JSON schema of the arguments as the model is shown it (`compact_schema`)."""
    check: Check
    fn: ToolFn
    wants_context: bool
    source: str = "python"
    """Where it runs, for the audit trail and /support: "python", "http" or "mcp:<server>"."""
    acts: bool = False
    """It changes something for the asker (a refund, a cancellation): `agents.confirm` makes it wait for the asker's
    yes in a later message."""
    timeout_s: float | None = None
    """Its own time limit (an MCP server's or an HTTP endpoint's `timeout_s`); the engine waits that long (and a
    moment), not only its default."""

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    async def invoke(self, ctx: ToolContext, arguments: str) -> ToolResult:
        """Validate and run; raises ToolArgumentsError for bad arguments, and lets the tool's own errors out."""
        kwargs = self.check(parse_arguments(arguments))
        return await (self.fn(ctx, **kwargs) if self.wants_context else self.fn(**kwargs))


def parse_arguments(arguments: str) -> dict[str, Any]:
    """The model's arguments as a JSON object, or ToolArgumentsError saying what is wrong with them."""
    try:
        raw = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise ToolArgumentsError(f"arguments are not valid JSON ({exc.msg} at position {exc.pos})") from exc
    if not isinstance(raw, dict):
        raise ToolArgumentsError("arguments must be a JSON object")
    return raw


def pydantic_check(model: type[BaseModel]) -> Check:
    def check(raw: dict[str, Any]) -> dict[str, Any]:
        try:
            parsed = model.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            raise ToolArgumentsError(f"invalid arguments: {problems}") from exc
        return {name: getattr(parsed, name) for name in type(parsed).model_fields}

    return check


def schema_check(schema: dict[str, Any]) -> Check:
    """Validation against a JSON schema (an MCP tool's `inputSchema`, an HTTP tool's parameters). Raises ConfigError
    for a schema that is not one, at start-up or when a server lists its tools."""
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"not a valid JSON schema: {exc.message}") from None
    validator = validator_class(schema)
    declared = schema.get("properties")
    # Arguments the schema does not name go nowhere (a model adds "query" or "email" of its own accord), unless the
    # schema says it takes more: the operator's system gets what it declared, never what the model made up.
    if "additionalProperties" in schema:
        keep: set[str] | None = None
    else:
        # No properties at all: a tool that takes no arguments gets none, whatever the model adds.
        keep = set(declared) if isinstance(declared, dict) else set()

    def check(raw: dict[str, Any]) -> dict[str, Any]:
        if keep is not None:
            raw = {k: v for k, v in raw.items() if k in keep}
        errors = sorted(validator.iter_errors(raw), key=lambda e: list(e.path))
        if errors:
            problems = "; ".join(f"{'.'.join(str(p) for p in e.path) or 'arguments'}: {e.message}" for e in errors[:5])
            raise ToolArgumentsError(f"invalid arguments: {problems}")
        return raw

    return check


def schema_tool(
    *,
    name: str,
    description: str,
    parameters: dict[str, Any] | None,
    fn: Callable[[ToolContext, dict[str, Any]], Awaitable[ToolResult]],
    source: str,
    acts: bool = False,
    timeout_s: float | None = None,
) -> Tool:
    """A tool described by a JSON schema rather than a Python signature: `fn(ctx, arguments)` gets the validated
    arguments as one object (an MCP server's or an HTTP endpoint's tools). Raises ConfigError for a name providers
    refuse or a schema that is not one."""
    if not TOOL_NAME.fullmatch(name):
        raise ConfigError(f"tool name {name!r}: use letters, digits, _ and - only (64 at most), as providers require")
    schema = dict(parameters or {"type": "object", "properties": {}})
    schema.setdefault("type", "object")

    async def run(ctx: ToolContext, **arguments: Any) -> ToolResult:
        return await fn(ctx, arguments)

    text = " ".join(description.split())
    return Tool(
        name=name,
        # Every call pays for it in prompt tokens: an operator's server may describe a tool at any length.
        description=(text[: DESCRIPTION_CHARS - 1] + "…" if len(text) > DESCRIPTION_CHARS else text)
        or name.replace("_", " "),
        parameters=compact_schema(schema),
        check=schema_check(schema),
        fn=run,
        wants_context=True,
        source=source,
        acts=acts,
        timeout_s=timeout_s,
    )


def idempotency_key(conversation_id: int, inbound_id: int | None, tool: str, arguments: Mapping[str, Any]) -> str:
    """The idempotency key of one call (HTTP tools' X-Helpdesk-Idempotency-Key, MCP calls' `_meta`): hex SHA-256 of
    `<conversation>:<inbound>:<tool>:<arguments>`, the arguments as compact JSON with sorted keys (an inbound of None
    is written `None`). The same for the same message and arguments, so a turn run again after a crash asks for the
    same action, not a second one."""
    canonical = json.dumps(dict(arguments), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{conversation_id}:{inbound_id}:{tool}:{canonical}".encode()).hexdigest()


DESCRIPTION_CHARS = 1_000
"""A schema tool's description, shown to the model, at most."""
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What OpenAI (and the providers that copy its API) accept as a function's name."""


_KEPT = frozenset({"type", "description", "enum", "items", "properties", "required"})
"""What the model is shown of an argument: what Ollama keeps of a property, and enough for every model. The rest is
enforced on the way in (and a refusal goes back to the model): titles repeat the names, a default applies by
itself ("optional" is said by leaving the argument out of `required`), limits like `maxLength`, and
`additionalProperties: false`."""


def compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Pydantic's JSON schema in the subset every provider we serve accepts (OpenAI and Azure validate the schema,
    vLLM hands it to its grammar, Ollama keeps only `type`, `description`, `enum` and `items` of each property):
    `$ref`s inlined, no titles, and an optional argument as its own type rather than `anyOf` with null."""
    defs = {
        f"#/{section}/{name}": value
        for section in ("$defs", "definitions")
        for name, value in (schema.get(section) or {}).items()
    }

    def walk(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [walk(n, seen) for n in node]
        if not isinstance(node, dict):
            return node
        node = dict(node)
        if "$ref" in node:
            ref = str(node.pop("$ref"))
            if ref in seen or ref == "#":
                raise ConfigError(f"tool schema: {ref} refers to itself, which not every provider accepts")
            if ref not in defs or not isinstance(defs[ref], dict):
                raise ConfigError(f"tool schema: {ref} is not among the schema's $defs or definitions")
            node = {**defs[ref], **node}
            seen = (*seen, ref)
        branches = node.get("anyOf")
        if isinstance(branches, list) and {"type": "null"} in branches:
            rest = [b for b in branches if b != {"type": "null"}]
            if len(rest) == 1:
                # The argument is optional (function_tool makes sure it has a default): not `required` says so.
                del node["anyOf"]
                node = {**rest[0], **node}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key not in _KEPT:
                continue
            if key == "properties":
                out[key] = {name: walk(sub, seen) for name, sub in value.items()}
            elif key == "description":
                out[key] = " ".join(str(value).split())
            else:
                out[key] = walk(value, seen)
        return out

    compact: dict[str, Any] = walk(schema, ())
    return compact


class ToolArgumentsError(AgentsError):
    """The model's arguments did not fit the tool's signature; the message goes back to the model."""


def function_tool(
    fn: ToolFn | None = None, *, name: str | None = None, description: str | None = None, acts: bool = False
) -> Any:
    """Decorator: turn a typed async function into a Tool. Parameter docs come from `Annotated[T, Field(...)]`;
    `acts`: the tool changes something for the asker and runs only after their yes (`agents.confirm`)."""

    def build(f: ToolFn) -> Tool:
        if not inspect.iscoroutinefunction(f):
            raise ConfigError(f"tool {f.__name__} must be an async function")
        hints = get_type_hints(f, include_extras=True)
        params = list(inspect.signature(f).parameters.values())
        wants_context = bool(params) and hints.get(params[0].name) is ToolContext
        fields: dict[str, Any] = {}
        for p in params[1:] if wants_context else params:
            if p.name not in hints:
                raise ConfigError(f"tool {f.__name__}: parameter {p.name} needs a type hint")
            default = ... if p.default is inspect.Parameter.empty else p.default
            if default is ... and _nullable(hints[p.name]):
                # The compact schema leaves null out and says "optional" by leaving the argument out of
                # `required`; a required argument that may be null cannot be said that way.
                raise ConfigError(f"tool {f.__name__}: parameter {p.name} may be None, so it needs a default")
            fields[p.name] = (hints[p.name], default)
        model = create_model(f"{f.__name__}_args", __config__=ConfigDict(extra="forbid"), **fields)
        doc = " ".join((f.__doc__ or "").split())
        return Tool(
            name=name or f.__name__,
            description=description or doc or f.__name__.replace("_", " "),
            # Built once: pydantic's schema generation costs about a millisecond, on every LLM call otherwise.
            parameters=compact_schema(model.model_json_schema()),
            check=pydantic_check(model),
            fn=f,
            wants_context=wants_context,
            acts=acts,
        )

    return build(fn) if fn is not None else build


def _nullable(hint: Any) -> bool:
    if get_origin(hint) is Annotated:
        hint = get_args(hint)[0]
    return get_origin(hint) in (Union, UnionType) and type(None) in get_args(hint)
