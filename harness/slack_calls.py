"""The Slack Web API calls the bot makes, read from its source: every `<client>.<method>(...)` named like one of
slack_sdk's client methods, and every `api_call("x.y")`, with the keyword arguments each is given. The manifests'
scopes are checked against them (tests/test_manifests.py), and so is who may post (tests/test_deliveries.py)."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from slack_sdk.web import async_chat_stream, async_client

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("bot", "escalation", "agents")

# Methods called for the bot by its libraries, not by our code.
LIBRARY_METHODS: dict[str, str] = {
    # slack_bolt's single-workspace authorization, on the first request: the bot's user and bot ids.
    "auth.test": "slack_bolt (authorization)",
}


@dataclass(frozen=True)
class Call:
    method: str
    """The dotted Web API method, e.g. chat.postMessage; empty for a slack_sdk helper the scan cannot see into."""
    arguments: frozenset[str]
    where: str


@cache
def sdk_methods() -> dict[str, frozenset[str]]:
    """slack_sdk's client methods (`chat_postMessage`) -> the Web API methods each calls (`chat.postMessage`),
    read from AsyncWebClient's source: each calls `self.api_call("chat.postMessage", ...)`, and the few helpers
    call other client methods, directly (files_upload_v2) or from the object they return (chat_stream's
    AsyncChatStream calls `self._client.chat_startStream(...)`)."""
    streamed = {
        node.func.attr
        for node in ast.walk(ast.parse(inspect.getsource(async_chat_stream)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "_client"
    }
    tree = ast.parse(inspect.getsource(async_client))
    client = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "AsyncWebClient")
    direct: dict[str, set[str]] = {}
    on_self: dict[str, set[str]] = {}
    for function in client.body:
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) or function.name.startswith("_"):
            continue
        direct[function.name], on_self[function.name] = set(), set()
        for node in ast.walk(function):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr == "api_call" and node.args and isinstance(node.args[0], ast.Constant):
                direct[function.name].add(str(node.args[0].value))
            elif isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
                on_self[function.name].add(node.func.attr)
        made = (n for n in ast.walk(function) if isinstance(n, ast.Call))
        if any(getattr(n.func, "id", None) == "AsyncChatStream" for n in made):
            on_self[function.name] |= streamed
    return {
        name: frozenset(methods.union(*(direct[other] for other in on_self[name] if other in direct)))
        for name, methods in direct.items()
    }


def _slack_call(node: ast.AST) -> str | None:
    """The client method name of `<something>.<client method>(...)`, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in sdk_methods():
        return node.func.attr
    return None


def _called_name(node: ast.Call) -> str | None:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)


def slack_calls(source: str, where: str) -> Iterator[Call]:
    """The Web API calls in one module, with the keyword arguments each is given."""
    tree = ast.parse(source)
    methods = sdk_methods()
    # Helpers that pass their **keywords on to a Slack call (`self._post(row, username=...)` ->
    # `chat_postMessage(..., **fields)`): the keywords given to the helper are the call's too.
    forwarders: dict[str, frozenset[str]] = {}
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                name = _slack_call(node)
                if name and isinstance(node, ast.Call) and any(k.arg is None for k in node.keywords):
                    forwarders[function.name] = forwarders.get(function.name, frozenset()) | methods[name]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        arguments = frozenset(k.arg for k in node.keywords if k.arg is not None)
        here = f"{where}:{node.lineno}"
        name = _slack_call(node)
        if name is not None:
            yield from (Call(method, arguments, here) for method in sorted(methods[name] or {""}))
        elif _called_name(node) == "api_call" and node.args and isinstance(node.args[0], ast.Constant):
            yield Call(str(node.args[0].value), arguments, here)
        elif _called_name(node) in forwarders:
            yield from (Call(method, arguments, here) for method in sorted(forwarders[str(_called_name(node))]))


def scanned_modules() -> Iterator[tuple[str, str]]:
    """(path from the checkout, source) of every module in SCANNED."""
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield str(path.relative_to(ROOT)), path.read_text()


@cache
def calls() -> tuple[Call, ...]:
    """Every Web API call the bot makes: those in its code, and those its libraries make for it."""
    found = [call for where, source in scanned_modules() for call in slack_calls(source, where)]
    found += [Call(method, frozenset(), who) for method, who in LIBRARY_METHODS.items()]
    return tuple(found)
