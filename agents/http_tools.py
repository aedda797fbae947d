"""The operator's HTTP endpoints as tools: declared one by one in `helpdesk.yaml` (`parse_http_tool`) or picked by
`operationId` from an OpenAPI document (`openapi_tools`), and offered to agents by one `ToolSource` (`HTTPTools`).

A call fills the URL's `{param}` templates from the model's arguments (each value one path segment, percent-encoded,
so `../` cannot climb out of it), sends the other arguments in the query string (GET, DELETE) or as a JSON body (POST,
PUT, PATCH), and gives the model the answer: JSON made compact, text as it is, at most `max_response_bytes` of either.
A 4xx is the operator's system answering ("no such order"), so its body goes to the model as "Error: HTTP 404: ...";
a 5xx, 429, redirect, timeout or failed connection means the system cannot answer, and the model is told to say so
and offer a colleague (`ToolUnavailable`). What failed is said by the exception's class and a reason in our words,
never by aiohttp's message (which holds the whole URL, an API key in its query included), and a URL shown anywhere
(errors, `/support status`, logs) is shown as scheme://host[:port]/path, without its userinfo, query and fragment.

Who is asking (signed by the bot, never taken from the model)
--------------------------------------------------------------
Every request carries the asker as the platform vouched for it (`agents.identity.asker_claims`):

    X-Helpdesk-Asker:            base64url, unpadded, of the compact JSON of the claims (sorted keys, UTF-8), e.g.
                                 {"email":"ann@example.com","key":"slack:T1:U1","name":"Ann","platform":"slack",
                                 "user":"U1","workspace":"T1"}; `{}` when the bot knows nobody
    X-Helpdesk-Idempotency-Key:  hex SHA-256 of "<conversation id>:<inbound message id>:<tool name>:<arguments as
                                 compact JSON, keys sorted>" (`idempotency_key`): the same when a turn that crashed
                                 is run again and calls the tool with the same arguments, so a system that acts (a
                                 refund) does so once per key
    X-Helpdesk-Timestamp:        unix seconds when the bot sent it
    X-Helpdesk-Signature:        v1=<hex HMAC-SHA256(signing secret, base)>, only when a signing secret is set, where
                                 base = "v1:" + timestamp + ":" + METHOD + ":" + path_and_query + ":"
                                        + X-Helpdesk-Asker + ":" + X-Helpdesk-Idempotency-Key + ":" + body bytes

`path_and_query` is the request target exactly as sent (percent-encoding untouched, e.g. `/orders/A%2F1?full=true`),
the body is the raw bytes (empty for GET and DELETE). The asker header is inside the signature, so a captured request
cannot be replayed for somebody else; so is the idempotency key, so it cannot be swapped to make one action twice; the
timestamp is inside it too, so the operator's system refuses requests older than a few minutes. A Python service
checks a request with `verify_request`, which returns the claims or None:

    claims = verify_request(secret, request.method, request.raw_path, await request.read(), request.headers)
    if claims is None: return 401
    customer = claims.get("email")     # never an email, id or name from the query or the body
    once = request.headers["X-Helpdesk-Idempotency-Key"]   # act at most once per key

Addresses: the bot calls public addresses only. A host that resolves to a loopback, private, link-local, multicast,
reserved or unspecified address (IPv4 or IPv6, including IPv4 inside IPv6) is refused at connection time, where every
resolved address is checked (so DNS rebinding cannot get round it), unless the operator lists the host in
`http.allowed_hosts`. Redirects are never followed, no proxy from the environment is used, and no cookie is kept between
calls (one customer's session must not reach another's request).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import re
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from agents.errors import ConfigError, ToolUnavailable
from agents.identity import asker_claims
from agents.tools import (
    TOOL_NAME,
    Tool,
    ToolArgumentsError,
    ToolContext,
    ToolResult,
    idempotency_key,
    schema_check,
    schema_tool,
)
from agents.toolsets import SourceStatus

log = logging.getLogger(__name__)

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
QUERY_METHODS = frozenset({"GET", "DELETE"})
"""Methods whose arguments travel in the query string: many servers and proxies drop a body on these."""

ASKER_HEADER = "X-Helpdesk-Asker"
IDEMPOTENCY_HEADER = "X-Helpdesk-Idempotency-Key"
TIMESTAMP_HEADER = "X-Helpdesk-Timestamp"
SIGNATURE_HEADER = "X-Helpdesk-Signature"
_RESERVED_HEADERS = frozenset(
    h.lower()
    for h in (
        ASKER_HEADER,
        IDEMPOTENCY_HEADER,
        TIMESTAMP_HEADER,
        SIGNATURE_HEADER,
        "Host",
        "Content-Length",
        "Content-Type",
        "Cookie",
    )
)
"""Headers an operator may not configure: the identity ones are the bot's to set, the rest are the request's own."""
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_TEMPLATE = re.compile(r"\{([^{}]*)\}")
USER_AGENT = "helpdesk-bot"
UNSIGNED_WARNING = (
    "HTTP tools send the asker unsigned (http.unsigned: true): anyone who can reach your endpoints can claim to be "
    "anyone"
)
"""Logged at start-up when there is no signing secret (the declaration allows that only with `http.unsigned`)."""
ALLOW_SETTING = "http.allowed_hosts"
"""The declaration's key an operator adds a host to when it is theirs on a private network; named in every refusal."""


@dataclass(frozen=True)
class HTTPToolConfig:
    """One operator endpoint, as declared (`parse_http_tool`) or taken from an OpenAPI document (`openapi_tools`)."""

    name: str
    """The tool's name as the model calls it."""
    description: str
    """What the tool does and when to use it: the model chooses tools by it."""
    method: str
    """GET, POST, PUT, PATCH or DELETE."""
    url: str = field(repr=False)
    """The full URL; `{param}` in its path is filled from the argument of that name, as one path segment."""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    """The JSON schema (type object) of the arguments, which are checked against it before any request."""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Sent with every request (an API key the operator configured); never shown to the model."""
    acts: bool = False
    """The endpoint changes something (a refund, a cancellation), so the asker confirms first (`agents.confirm`)."""
    timeout_s: float = 10
    """For the whole exchange, answer read included."""
    max_response_bytes: int = 65536
    """What of the answer is read at most (and then the model is told it was cut): it all goes into the prompt."""
    query: frozenset[str] = frozenset()
    """Arguments sent in the query string even though the method sends a JSON body (an OpenAPI operation's query
    parameters); GET and DELETE send every argument that is not in the path there anyway."""


# ---------------------------------------------------------------------------------------------------------------------
# The declaration in helpdesk.yaml


_KEYS = ("method", "url", "description", "parameters", "headers", "acts", "timeout_s", "max_response_bytes")


def parse_http_tool(name: str, raw: Mapping[str, Any]) -> HTTPToolConfig:
    """One entry of the declaration's `tools:` as a config; ConfigError naming the key path and the fix otherwise."""
    at = f"tools.{name}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{at}: expected a mapping with method, url and description; got {_show(raw)}")
    if not TOOL_NAME.fullmatch(name):
        raise ConfigError(f"{at}: a tool's name may hold letters, digits, _ and - only (64 at most); rename it")
    for key in raw:
        if key not in _KEYS:
            raise ConfigError(f"{at}.{key}: unknown key; use {', '.join(_KEYS[:-1])} or {_KEYS[-1]}")

    method = raw.get("method")
    if method is None:
        raise ConfigError(f"{at}.method: missing; add one of GET, POST, PUT, PATCH or DELETE")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise ConfigError(f"{at}.method: {_show(method)} is not an HTTP method; use GET, POST, PUT, PATCH or DELETE")

    description = raw.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ConfigError(
            f"{at}.description: missing; say in a sentence what the tool does and when to use it (the model chooses "
            "tools by it)"
        )

    parameters = raw.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"{at}.parameters: expected a JSON schema of type object; got {_show(parameters)}")
    parameters = dict(parameters)
    if parameters.setdefault("type", "object") != "object":
        raise ConfigError(
            f"{at}.parameters.type: {_show(parameters['type'])} is not allowed; the arguments are one object, so "
            "use type: object with properties"
        )
    _check_schema(parameters, f"{at}.parameters")

    url = raw.get("url")
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{at}.url: missing; add the endpoint's full URL, like https://shop.example/orders/{{id}}")
    slots = _Endpoint.of(url.strip(), f"{at}.url").slots
    parameters = _require_slots(parameters, slots, at)

    headers = raw.get("headers", {})
    if not isinstance(headers, Mapping):
        raise ConfigError(f"{at}.headers: expected a mapping of header names to values; got {_show(headers)}")
    for key, value in headers.items():
        _check_header(str(key), value, f"{at}.headers.{key}")

    acts = raw.get("acts", False)
    if not isinstance(acts, bool):
        raise ConfigError(
            f"{at}.acts: {_show(acts)} is not true or false; write true when the tool changes something (a refund, a "
            "cancellation), else false"
        )
    timeout_s = raw.get("timeout_s", 10)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s < math.inf:
        raise ConfigError(f"{at}.timeout_s: {_show(timeout_s)} is not a positive number of seconds; use e.g. 10")
    limit = raw.get("max_response_bytes", 65536)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise ConfigError(
            f"{at}.max_response_bytes: {_show(limit)} is not a positive whole number of bytes; use e.g. 65536"
        )
    return HTTPToolConfig(
        name=name,
        description=description.strip(),
        method=method.upper(),
        url=url.strip(),
        parameters=parameters,
        headers={str(k): v for k, v in headers.items()},
        acts=acts,
        timeout_s=float(timeout_s),
        max_response_bytes=limit,
    )


def _show(value: Any) -> str:
    """A value as the operator wrote it, quoted the way YAML and JSON would show it."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return json.dumps(value, ensure_ascii=False, default=str)


def _check_schema(schema: dict[str, Any], at: str) -> None:
    try:
        schema_check(schema)
    except ConfigError as exc:
        raise ConfigError(f"{at}: {exc}; write JSON Schema, type: object with properties") from None


def _require_slots(parameters: dict[str, Any], slots: Sequence[str], at: str) -> dict[str, Any]:
    """The schema with every path template's argument required: a URL with a hole in it cannot be sent."""
    properties = parameters.get("properties") or {}
    for slot in slots:
        if slot not in properties:
            raise ConfigError(
                f"{at}.url: {{{slot}}} is not one of the parameters; add {slot} to {at}.parameters.properties or "
                "take it out of the URL"
            )
        kind = properties[slot].get("type") if isinstance(properties[slot], Mapping) else None
        if kind in ("object", "array", "null"):
            raise ConfigError(
                f"{at}.parameters.properties.{slot}.type: {_show(kind)} cannot fill a URL path; use string or integer"
            )
    required = list(parameters.get("required") or [])
    missing = [s for s in slots if s not in required]
    return {**parameters, "required": required + missing} if missing else parameters


def _check_header(name: str, value: Any, at: str) -> None:
    if not _HEADER_NAME.fullmatch(name):
        raise ConfigError(f"{at}: {_show(name)} is not a header name; use letters, digits and -")
    if name.lower() in _RESERVED_HEADERS:
        raise ConfigError(f"{at}: the bot sets this header itself; remove it")
    if not isinstance(value, str):
        raise ConfigError(f"{at}: {_show(value)} is not a string; quote it")
    if "\r" in value or "\n" in value:
        raise ConfigError(f"{at}: a header value cannot span lines; put it on one line")


# ---------------------------------------------------------------------------------------------------------------------
# OpenAPI


def openapi_tools(
    document: Mapping[str, Any],
    operations: Sequence[str],
    *,
    base_url: str | None,
    where: str,
    acting: Collection[str] = (),
    headers: Mapping[str, str] | None = None,
) -> list[HTTPToolConfig]:
    """The operations named by `operationId` in an OpenAPI 3.x document (parsed already) as tools.

    The URL is `base_url` + the operation's path when given (the operator's own deployment wins over the document),
    else the first `servers` entry's (the operation's, its path's, then the document's; variables at their defaults).
    The arguments are the path and query parameters and the properties of a JSON request body, in one object schema,
    with local `$ref`s inlined. An operation acts when it says `x-helpdesk-acts: true` or is named in `acting`.
    `headers` go with every request (an API key). `where` prefixes every ConfigError (the declaration's key path),
    followed by the place in the document when the error is there (`<where>.paths./orders.get.parameters: ...`): a
    part of the document of a shape this cannot read is a ConfigError naming it, never a traceback."""
    if not isinstance(document, Mapping) or not str(document.get("openapi", "")).startswith("3."):
        raise ConfigError(f"{where}: not an OpenAPI 3 document (no `openapi: 3.x`); convert Swagger 2 documents first")
    paths = document.get("paths")
    if not isinstance(paths, Mapping):
        raise ConfigError(f"{where}: the document has no paths; point it at the API's OpenAPI document")
    found: dict[str, _Operation] = {}
    for path, raw_item in paths.items():
        item_at = f"{where}.paths.{path}"
        if isinstance(path, str) and path.startswith("x-"):
            continue  # an extension, not a path
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError(f"{item_at}: a path starts with /; fix the document")
        item = _mapping(_resolve(raw_item, document, item_at), item_at, "a path item (a mapping of methods)")
        for method in METHODS:
            at = f"{item_at}.{method.lower()}"
            if (raw := item.get(method.lower())) is None:
                continue
            operation = _mapping(raw, at, "an operation (a mapping with operationId, parameters, ...)")
            op = operation.get("operationId")
            if op is None or op == "":
                continue
            if not isinstance(op, str):
                raise ConfigError(f"{at}.operationId: {_show(op)} is not a name; quote it")
            if op in found:
                raise ConfigError(
                    f"{at}.operationId: {op!r} is also {found[op].at}'s; an operationId names one operation"
                )
            found[op] = _Operation(path, method, item, operation, item_at, at)
    unknown = [op for op in [*operations, *acting] if op not in found]
    if unknown:
        raise ConfigError(
            f"{where}: no operation {unknown[0]!r} in the document; available: {', '.join(sorted(found)) or 'none'}"
        )
    for key in headers or {}:
        _check_header(key, (headers or {})[key], f"{where}.headers.{key}")
    return [
        _operation_tool(document, op, found[op], base_url=base_url, where=where, acting=acting, headers=headers or {})
        for op in operations
    ]


@dataclass(frozen=True)
class _Operation:
    """An operation of the document, with what it inherits from its path and its places for error messages."""

    path: str
    method: str
    item: Mapping[str, Any]
    """Its path item: parameters and servers that apply to every method of the path."""
    operation: Mapping[str, Any]
    item_at: str
    """The path item's place: `<where>.paths./orders/{id}`."""
    at: str
    """The operation's place: `<where>.paths./orders/{id}.get`."""


_PLACES = ("path", "query", "header", "cookie")


def _operation_tool(
    document: Mapping[str, Any],
    op: str,
    found: _Operation,
    *,
    base_url: str | None,
    where: str,
    acting: Collection[str],
    headers: Mapping[str, str],
) -> HTTPToolConfig:
    at, operation = found.at, found.operation
    if not TOOL_NAME.fullmatch(op):
        raise ConfigError(f"{at}.operationId: {op!r} cannot be a tool's name (letters, digits, _ and - only)")
    properties: dict[str, Any] = {}
    required: list[str] = []
    query: set[str] = set()
    # Operation-level parameters override path-level ones of the same name and place.
    declared = {
        (parameter["name"], parameter["in"]): (parameter, here)
        for parameter, here in [
            *_parameters(found.item, document, found.item_at),
            *_parameters(operation, document, at),
        ]
    }
    for (name, place), (parameter, here) in declared.items():
        if place not in ("path", "query"):
            continue  # headers and cookies are the operator's to set (`headers`), not the model's
        schema = _schema(parameter.get("schema", {}), document, f"{here}.schema")
        if not isinstance(schema, dict):
            raise ConfigError(f"{here}.schema: not a JSON schema object; fix the document")
        text = parameter.get("description")
        if isinstance(text, str) and text and "description" not in schema:
            schema["description"] = text
        properties[name] = schema
        if place == "path" or parameter.get("required") is True:
            required.append(name)
        if place == "query":
            query.add(name)
    body = _request_body(operation, document, f"{at}.requestBody")
    if body is not None:
        fields, needed = body
        for name, schema in fields.items():
            if name in properties:
                raise ConfigError(
                    f"{at}: {name!r} is both a parameter and a body property; HTTP tools need one name per argument"
                )
            properties[name] = schema
        required += [r for r in needed if r in properties]
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    _check_schema(parameters, at)

    url = _server_url(document, found, base_url, where) + found.path
    slots = _Endpoint.of(url, found.item_at).slots
    for slot in slots:
        if slot not in properties:
            raise ConfigError(f"{at}: the path's {{{slot}}} has no path parameter; declare it in the operation")
    summary, detail = str(operation.get("summary") or ""), str(operation.get("description") or "")
    description = " ".join(dict.fromkeys(t for t in (summary.strip(), detail.strip()) if t)) or op
    return HTTPToolConfig(
        name=op,
        description=description[:1000],
        method=found.method,
        url=url,
        parameters=parameters,
        headers=dict(headers),
        acts=operation.get("x-helpdesk-acts") is True or op in acting,
        query=frozenset(query) if found.method not in QUERY_METHODS else frozenset(),
    )


def _mapping(node: Any, at: str, what: str) -> Mapping[str, Any]:
    """`node` when it is a mapping; a ConfigError naming its place and what was expected there otherwise."""
    if not isinstance(node, Mapping):
        raise ConfigError(f"{at}: expected {what}; got {_show(node)}")
    return node


def _parameters(holder: Mapping[str, Any], document: Mapping[str, Any], at: str) -> list[tuple[Mapping[str, Any], str]]:
    """A path item's or an operation's `parameters`, each resolved, checked to have a name and a place (`in`), and
    paired with its place in the document."""
    listed = holder.get("parameters")
    at = f"{at}.parameters"
    if listed is None:
        return []
    if not isinstance(listed, list):
        raise ConfigError(f"{at}: expected a list of parameters; got {_show(listed)}")
    found: list[tuple[Mapping[str, Any], str]] = []
    for i, raw in enumerate(listed):
        here = f"{at}[{i}]"
        parameter = _mapping(_resolve(raw, document, here), here, "a parameter (a mapping with name, in and schema)")
        name, place = parameter.get("name"), parameter.get("in")
        if not isinstance(name, str) or not name:
            problem = "missing" if name is None else f"{_show(name)} is not a name"
            raise ConfigError(f"{here}.name: {problem}; every parameter needs its name")
        if place not in _PLACES:
            problem = "missing" if place is None else f"{_show(place)} is not a place"
            raise ConfigError(f"{here}.in: {problem}; use path, query, header or cookie")
        found.append((parameter, here))
    return found


def _request_body(
    operation: Mapping[str, Any], document: Mapping[str, Any], at: str
) -> tuple[dict[str, Any], list[str]] | None:
    """A JSON request body's properties and required names, with `allOf` branches merged; None when the operation
    has no body."""
    if "requestBody" not in operation:
        return None
    body = _mapping(_resolve(operation["requestBody"], document, at), at, "a request body (a mapping with content)")
    content = _mapping(body.get("content") or {}, f"{at}.content", "a mapping of media types to schemas")
    kind = next(
        (k for k in content if isinstance(k, str) and (k == "application/json" or k.split(";")[0].endswith("+json"))),
        None,
    )
    if kind is None:
        raise ConfigError(
            f"{at}: {', '.join(map(str, content)) or 'no content'} cannot be sent; HTTP tools send application/json "
            "bodies only"
        )
    media = _mapping(content[kind], f"{at}.content.{kind}", "a media type (a mapping with schema)")
    here = f"{at}.content.{kind}.schema"
    schema = _schema(media.get("schema", {}), document, here)
    if not isinstance(schema, dict):
        raise ConfigError(f"{here}: the body's schema is not a JSON schema object; fix the document")
    properties, required = _fields(schema, here)
    branches = schema.pop("allOf", [])
    if not isinstance(branches, list):
        raise ConfigError(f"{here}.allOf: expected a list of schemas; got {_show(branches)}")
    for i, branch in enumerate(branches):
        more, also = _fields(_mapping(branch, f"{here}.allOf[{i}]", "a schema (a mapping)"), f"{here}.allOf[{i}]")
        properties, required = {**properties, **more}, [*required, *also]
    if schema.get("type", "object") != "object" or "oneOf" in schema or "anyOf" in schema:
        raise ConfigError(f"{at}: the body is not one object with properties, which is what the model fills")
    return properties, required


def _fields(schema: Mapping[str, Any], at: str) -> tuple[dict[str, Any], list[str]]:
    """An object schema's properties and required names, checked to be a mapping and a list of names."""
    properties = schema.get("properties") or {}
    if not isinstance(properties, Mapping):
        raise ConfigError(f"{at}.properties: expected a mapping of names to schemas; got {_show(properties)}")
    required = schema.get("required") or []
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ConfigError(f"{at}.required: expected a list of property names; got {_show(required)}")
    return dict(properties), required


def _server_url(document: Mapping[str, Any], found: _Operation, base_url: str | None, where: str) -> str:
    if base_url:
        return base_url.rstrip("/")
    levels = ((found.operation, found.at), (found.item, found.item_at), (document, where))
    named = next(((holder["servers"], f"{at}.servers") for holder, at in levels if holder.get("servers")), None)
    if named is None:
        raise ConfigError(f"{where}: the document names no servers; set base_url to the API's address")
    servers, at = named
    if not isinstance(servers, list):
        raise ConfigError(f"{at}: expected a list of servers; got {_show(servers)}")
    server = _mapping(servers[0], f"{at}[0]", "a server (a mapping with url)")
    url = server.get("url")
    if not isinstance(url, str):
        raise ConfigError(f"{at}[0].url: {_show(url)} is not a URL; set base_url to the API's address")
    variables = _mapping(server.get("variables") or {}, f"{at}[0].variables", "a mapping of names to variables")
    for name, variable in variables.items():
        default = _mapping(variable, f"{at}[0].variables.{name}", "a variable (a mapping with default)").get("default")
        url = url.replace(f"{{{name}}}", "" if default is None else str(default))
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{at}[0].url: {_show(_redact(url))} is not a full URL; set base_url to the API's address")
    return url.rstrip("/")


def _resolve(node: Any, document: Mapping[str, Any], where: str, seen: tuple[str, ...] = ()) -> Any:
    """`node` with a `$ref` at its top replaced by what it points to in this document (siblings kept over it)."""
    if not isinstance(node, Mapping) or "$ref" not in node:
        return node
    ref = node["$ref"]
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise ConfigError(f"{where}: {_show(ref)} points outside the document; bundle the document into one file first")
    if ref in seen:
        raise ConfigError(f"{where}: {ref} refers to itself, which a tool's arguments cannot")
    target: Any = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, Mapping) or part not in target:
            raise ConfigError(f"{where}: {ref} is not in the document; fix the reference")
        target = target[part]
    resolved = _resolve(target, document, where, (*seen, ref))
    siblings = {k: v for k, v in node.items() if k != "$ref"}
    if not siblings:
        return resolved
    return {**_mapping(resolved, where, f"{ref} to point to a mapping"), **siblings}


def _schema(node: Any, document: Mapping[str, Any], where: str, seen: tuple[str, ...] = ()) -> Any:
    """An OpenAPI schema as plain JSON Schema: every local `$ref` inlined, OpenAPI 3.0's boolean exclusive bounds made
    numbers and `nullable` dropped (the validator would read them wrongly), and read-only properties left out (the
    server fills them; the model must not be asked for them)."""
    if isinstance(node, list):
        return [_schema(n, document, where, seen) for n in node]
    if not isinstance(node, Mapping):
        return node
    if "$ref" in node:
        ref = str(node["$ref"])
        if ref in seen:
            raise ConfigError(f"{where}: {ref} refers to itself, which a tool's arguments cannot")
        return _schema(_resolve(node, document, where, seen), document, where, (*seen, ref))
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "nullable":
            continue
        if key == "properties" and isinstance(value, Mapping):
            out[key] = {
                name: _schema(sub, document, where, seen)
                for name, sub in value.items()
                if not (isinstance(sub, Mapping) and sub.get("readOnly") is True)
            }
        else:
            out[key] = _schema(value, document, where, seen)
    if isinstance(out.get("required"), list) and isinstance(out.get("properties"), Mapping):
        # A non-string entry stays for the schema check to refuse.
        out["required"] = [r for r in out["required"] if not isinstance(r, str) or r in out["properties"]]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), bool) and out.pop(bound) and plain in out:
            out[bound] = out.pop(plain)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Signing


def sign(
    secret: str, timestamp: str, method: str, path_and_query: str, asker: str, idempotency: str, body: bytes
) -> str:
    """The X-Helpdesk-Signature value for one request (see the module docstring): an HMAC-SHA256 of
    `v1:<timestamp>:<METHOD>:<path and query>:<X-Helpdesk-Asker>:<X-Helpdesk-Idempotency-Key>:<body>`."""
    base = f"v1:{timestamp}:{method.upper()}:{path_and_query}:{asker}:{idempotency}:".encode() + body
    return "v1=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def encode_asker(claims: Mapping[str, str]) -> str:
    """The X-Helpdesk-Asker value: unpadded base64url of the claims' compact JSON."""
    data = json.dumps(dict(claims), ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def verify_request(
    secret: str,
    method: str,
    path_and_query: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    now: float | None = None,
    tolerance_s: float = 300,
) -> dict[str, str] | None:
    """The asker's claims when the request was signed with `secret` within `tolerance_s` of `now`; None otherwise.

    For the operator's services: `path_and_query` is the request target as received, percent-encoding untouched
    (aiohttp's `request.raw_path`), and `body` the raw bytes. Header names are matched in any case. The idempotency
    key is checked with the rest, so a service that acts once per key can trust it."""
    lower = {k.lower(): v for k, v in headers.items()}
    timestamp, asker = lower.get(TIMESTAMP_HEADER.lower(), ""), lower.get(ASKER_HEADER.lower(), "")
    idempotency, signature = lower.get(IDEMPOTENCY_HEADER.lower(), ""), lower.get(SIGNATURE_HEADER.lower(), "")
    if not (timestamp.isascii() and timestamp.isdigit()) or not asker or not idempotency or not signature:
        return None
    if abs((time.time() if now is None else now) - int(timestamp)) > tolerance_s:
        return None  # a replay, or a clock far off
    expected = sign(secret, timestamp, method, path_and_query, asker, idempotency, body)
    if not hmac.compare_digest(expected.encode(), signature.strip().encode()):
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(asker + "=" * (-len(asker) % 4)))
    except ValueError:
        return None
    if not isinstance(claims, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in claims.items()):
        return None
    return claims


# ---------------------------------------------------------------------------------------------------------------------
# Addresses


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _refusal(address: str) -> str | None:
    """Why the bot does not connect to this IP address ("loopback", "private", ...), or None when it may."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        # An IPv4 address inside an IPv6 one reaches that IPv4 address: judge it by what it reaches.
        inner = (
            ip.ipv4_mapped or ip.sixtofour or (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None)
        )
        if inner is not None:
            return _refusal(str(inner))
    for why, hit in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
        ("non-public", not ip.is_global),  # e.g. 100.64.0.0/10, carrier-grade NAT
    ):
        if hit:
            return why
    return None


def _host_key(host: str) -> str:
    """A host as `allowed_hosts` is matched: lower case, no brackets or final dot, an IP address in its one form."""
    host = host.strip("[]").rstrip(".").lower()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


class _Refused(OSError):
    """Raised by the resolver for a host that resolves to an address the bot does not call. An OSError, as the
    resolver's own failures are, so aiohttp hands it back wrapped in ClientConnectorDNSError."""

    def __init__(self, host: str, address: str, why: str) -> None:
        super().__init__(f"{host} resolves to {address} ({why})")
        self.host, self.address, self.why = host, address, why


class _GuardedResolver(AbstractResolver):
    """Every address a host resolves to, checked before aiohttp connects to any: one refused address refuses the host
    (a name answering with a public and a private address is the DNS rebinding trick)."""

    def __init__(self, inner: AbstractResolver, allowed: frozenset[str]) -> None:
        self._inner, self._allowed = inner, allowed

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if _host_key(host) not in self._allowed:
            for result in found:
                if why := _refusal(result["host"]):
                    raise _Refused(_host_key(host), result["host"], why)
        return found

    async def close(self) -> None:
        await self._inner.close()


# ---------------------------------------------------------------------------------------------------------------------
# The tool source


@dataclass(frozen=True)
class _Endpoint:
    """A URL split once, at start-up, into what a call fills in: the origin (never from the model), the path as
    literal pieces with the template names between them (odd positions), and the static query."""

    origin: str
    host: str
    pieces: tuple[str, ...]
    query: str

    @property
    def slots(self) -> tuple[str, ...]:
        return self.pieces[1::2]

    @classmethod
    def of(cls, url: str, at: str) -> _Endpoint:
        try:
            parts = urlsplit(url)
        except ValueError:  # e.g. an IPv6 host without its closing bracket
            raise ConfigError(f"{at}: {_show(_redact(url))} is not a URL; write the endpoint's full URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"{at}: {_show(_redact(url))} is not an http:// or https:// URL; write the endpoint's full URL"
            )
        if parts.username is not None or parts.password is not None:
            raise ConfigError(f"{at}: put credentials in headers, not in the URL")
        for outside in (parts.netloc, parts.query):
            if found := _TEMPLATE.search(outside):
                raise ConfigError(
                    f"{at}: {found.group(0)} is outside the path; templates fill path segments only, and the other "
                    "arguments go in the query string or the body by themselves"
                )
        try:
            origin = URL.build(scheme=parts.scheme, host=parts.hostname, port=parts.port)
        except ValueError as exc:
            raise ConfigError(f"{at}: {_show(_redact(url))} has a bad host or port ({exc}); fix the URL") from None
        pieces = _TEMPLATE.split(parts.path or "/")
        for slot in pieces[1::2]:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", slot):
                raise ConfigError(f"{at}: {{{slot}}} is not a parameter's name; use letters, digits and _")
        # Static text keeps the URL's own escapes; anything else a server would choke on is escaped here.
        literal = [quote(p, safe="/%:@!$&'()*+,;=") if i % 2 == 0 else p for i, p in enumerate(pieces)]
        query = quote(parts.query, safe="=&%:@!$'()*+,;/?")
        return cls(str(origin), _host_key(origin.raw_host or ""), tuple(literal), query)

    def target(self, arguments: Mapping[str, Any], in_query: Collection[str] | None) -> URL:
        """The URL of one call: templates filled, and the arguments named by `in_query` (all but the path's when
        None) appended to the query string."""
        path = "".join(
            piece if i % 2 == 0 else _segment(piece, arguments.get(piece)) for i, piece in enumerate(self.pieces)
        )
        slots = set(self.slots)
        pairs = [
            (name, text)
            for name, value in arguments.items()
            if name not in slots and (in_query is None or name in in_query)
            for text in _query_values(value)
        ]
        query = "&".join(q for q in (self.query, urlencode(pairs, quote_via=quote)) if q)
        return URL(self.origin + path + ("?" + query if query else ""), encoded=True)


def _segment(name: str, value: Any) -> str:
    """One argument as one path segment: `/` and every other reserved character percent-encoded."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str | int | float):
        text = str(value)
    else:
        raise ToolArgumentsError(f"invalid arguments: {name}: give a string or a number")
    if text in ("", ".", ".."):
        # Servers remove dot segments before routing: /orders/.. would be /.
        raise ToolArgumentsError(f"invalid arguments: {name}: {text!r} is not a value")
    return quote(text, safe="")


def _query_values(value: Any) -> list[str]:
    """An argument as query values: a list repeats the name (OpenAPI's default), an object goes as compact JSON."""
    if value is None:
        return []
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, str | int | float):
        return [str(value)]
    if isinstance(value, list):
        return [v for item in value for v in _query_values(item)]
    return [json.dumps(value, ensure_ascii=False, separators=(",", ":"))]


@dataclass(frozen=True)
class _Failure:
    at: datetime
    tool: str
    what: str


class HTTPTools:
    """The operator's HTTP endpoints as one tool source. The tools never change, so `version` is constant; the source
    is up as long as it runs, and its status names the last failed call for whoever reads `/support status`."""

    def __init__(
        self,
        configs: Sequence[HTTPToolConfig],
        *,
        signing_secret: str | None,
        allowed_hosts: frozenset[str] = frozenset(),
        name: str = "http",
        resolver: AbstractResolver | None = None,
    ) -> None:
        """Raises ConfigError for a URL whose host is a private address (or `localhost`) not in `allowed_hosts`, two
        tools of one name, or a tool that `schema_tool` refuses. `resolver` is the DNS the guard asks (the system's
        when None; tests give a fake one)."""
        if signing_secret == "":
            raise ConfigError("the HTTP tools' signing secret is empty; set a long random string or leave it unset")
        self.name = name
        self._secret = signing_secret
        self._allowed = frozenset(_host_key(h) for h in allowed_hosts)
        self._inner_resolver = resolver
        self._session: aiohttp.ClientSession | None = None
        self._resolver: _GuardedResolver | None = None
        self._started: datetime | None = None
        self._failure: _Failure | None = None
        tools: list[Tool] = []
        for config in configs:
            at = f"tools.{config.name}"
            if config.name in (t.name for t in tools):
                raise ConfigError(f"{at}: two HTTP tools are named {config.name}; rename one")
            if config.method not in METHODS:
                raise ConfigError(
                    f"{at}.method: {_show(config.method)} is not an HTTP method; use {', '.join(METHODS)}"
                )
            endpoint = _Endpoint.of(config.url, f"{at}.url")
            self._check_host(endpoint.host, at)
            parameters = _require_slots(dict(config.parameters), endpoint.slots, at)
            tools.append(
                schema_tool(
                    name=config.name,
                    description=config.description,
                    parameters=parameters,
                    fn=self._caller(config, endpoint),
                    source="http",
                    acts=config.acts,
                    timeout_s=config.timeout_s,
                )
            )
        self._tools = tuple(tools)

    def _check_host(self, host: str, at: str) -> None:
        """A literal address is never resolved (aiohttp connects to it directly), so it is judged here, once: the host
        of a call is always the declared one, as templates fill the path only."""
        if host in self._allowed:
            return
        if host == "localhost" or host.endswith(".localhost"):
            why: str | None = "loopback"
        elif ":" in host or host.replace(".", "").isdigit():
            why = _refusal(host)
            if why == "not an IP address":
                raise ConfigError(f"{at}.url: {host} is an address written in short; write all four numbers")
        else:
            return  # a name: judged by what it resolves to, at every connection
        if why:
            raise ConfigError(
                f"{at}.url: {host} is {_a(why)} address, which the bot does not call; list {host} in "
                f"{ALLOW_SETTING} if it is your own system"
            )

    @property
    def version(self) -> int:
        return 1

    def tools(self) -> tuple[Tool, ...]:
        return self._tools

    def status(self) -> SourceStatus:
        count = len(self._tools)
        detail = f"{count} tool{'' if count == 1 else 's'}"
        if self._session is None:
            detail += "; not started"
        if self._failure is not None:
            f = self._failure
            detail += f"; last failure {f.at:%H:%M} UTC {f.tool}: {f.what}"
        return SourceStatus(self.name, "http", self._session is not None, detail, count, self._started)

    async def start(self) -> None:
        if self._session is not None:
            return
        if self._secret is None and self._tools:
            log.warning(UNSIGNED_WARNING)
        self._resolver = _GuardedResolver(self._inner_resolver or aiohttp.DefaultResolver(), self._allowed)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(resolver=self._resolver),
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,  # a proxy from the environment would connect wherever it likes, past the guard
            headers={"User-Agent": USER_AGENT},
        )
        self._started = datetime.now(UTC)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._resolver is not None:
            await self._resolver.close()  # the connector closes only a resolver it made itself
            self._resolver = None

    def _caller(
        self, config: HTTPToolConfig, endpoint: _Endpoint
    ) -> Callable[[ToolContext, dict[str, Any]], Awaitable[ToolResult]]:
        async def call(ctx: ToolContext, arguments: dict[str, Any]) -> str:
            return await self._call(config, endpoint, ctx, arguments)

        return call

    async def _call(
        self, config: HTTPToolConfig, endpoint: _Endpoint, ctx: ToolContext, arguments: Mapping[str, Any]
    ) -> str:
        in_body = config.method not in QUERY_METHODS
        url = endpoint.target(arguments, config.query if in_body else None)
        body = b""
        if in_body:
            fields = {k: v for k, v in arguments.items() if k not in endpoint.slots and k not in config.query}
            body = json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()
        session = self._session
        if session is None:
            raise self._unavailable(config, "not started", "the bot's HTTP client is not running")
        headers = self._headers(config, url, body, ctx, arguments)
        try:
            async with session.request(
                config.method,
                url,
                data=body if in_body else None,
                headers=headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=config.timeout_s),
            ) as response:
                data, cut = await _read(response, config.max_response_bytes)
                status, reason = response.status, response.reason or ""
                kind, charset = response.content_type, response.charset
                location = response.headers.get("Location", "")
        except TimeoutError:
            raise self._unavailable(config, f"no answer within {config.timeout_s:g} s") from None
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, _Refused):
                refused = exc.os_error
                log.warning("HTTP tool %s: refused %s", config.name, refused)
                self._record(config, f"refused {refused.address} ({refused.why}) for {refused.host}")
                raise ToolUnavailable(
                    f"the {config.name} system at {refused.host} is on {_a(refused.why)} address ({refused.address}), "
                    f"which the bot calls only when {refused.host} is listed in {ALLOW_SETTING}; "
                    f"{_tell(config)}"
                ) from None
            raise self._unavailable(config, f"connection failed ({exc.__class__.__name__})") from None
        except aiohttp.ClientError as exc:
            raise self._unavailable(config, f"failed ({_failure(exc)})") from None

        if 300 <= status < 400:
            raise self._unavailable(
                config,
                f"HTTP {status} redirect to {_redact(location)[:200]}",
                f"HTTP {status}, a redirect, which the bot does not follow",
            )
        if status >= 500 or status == 429:
            raise self._unavailable(config, f"HTTP {status}")
        text = _text(data, kind, charset)
        if cut:
            text += f" [cut: the answer is longer than {config.max_response_bytes} bytes; only its start is shown]"
        if status >= 400:
            if status in (401, 403, 407):
                self._record(config, f"HTTP {status} (check the tool's headers)")
            return f"Error: HTTP {status}: {text or reason}"
        return text or f"HTTP {status} {reason}".rstrip()  # a 204: the model still learns it was done

    def _headers(
        self, config: HTTPToolConfig, url: URL, body: bytes, ctx: ToolContext, arguments: Mapping[str, Any]
    ) -> dict[str, str]:
        """The operator's headers, then the identity ones, which nothing configured can replace."""
        idempotency = ctx.idempotency_key or idempotency_key(
            ctx.conversation_id, ctx.inbound_id, config.name, arguments
        )
        headers = {k: v for k, v in config.headers.items() if k.lower() not in _RESERVED_HEADERS}
        if config.method not in QUERY_METHODS:
            headers["Content-Type"] = "application/json"
        asker = encode_asker(asker_claims(ctx.asker))
        timestamp = str(int(time.time()))
        headers[ASKER_HEADER] = asker
        headers[IDEMPOTENCY_HEADER] = idempotency
        headers[TIMESTAMP_HEADER] = timestamp
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = sign(
                self._secret, timestamp, config.method, url.raw_path_qs, asker, idempotency, body
            )
        return headers

    def _unavailable(self, config: HTTPToolConfig, what: str, told: str | None = None) -> ToolUnavailable:
        log.warning("HTTP tool %s: %s", config.name, what)
        self._record(config, what)
        return ToolUnavailable(f"the {config.name} system is unavailable right now ({told or what}); {_tell(config)}")

    def _record(self, config: HTTPToolConfig, what: str) -> None:
        self._failure = _Failure(datetime.now(UTC), config.name, what)


def _failure(exc: aiohttp.ClientError) -> str:
    """A failed exchange said safely: the class and a reason in our words (or the operating system's), never
    `str(exc)`, which for aiohttp's errors holds the whole URL (an API key in its query) and, for a malformed answer,
    the answer's bytes (which may echo the request)."""
    match exc:
        case aiohttp.ServerDisconnectedError():
            reason = "the server closed the connection"
        case aiohttp.ClientPayloadError():
            reason = "the answer broke off"
        case aiohttp.ClientResponseError():
            reason = "the answer is not valid HTTP"
        case OSError(strerror=str() as strerror) if strerror:
            reason = strerror[:100]
        case _:
            reason = ""
    return f"{exc.__class__.__name__}: {reason}" if reason else exc.__class__.__name__


def _redact(url: str) -> str:
    """A URL as it may be shown (errors, status, logs): scheme://host[:port]/path, without the userinfo, query and
    fragment, where tokens and API keys travel. A relative one (a redirect's Location) keeps its path only."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(a URL that cannot be read)"
    scheme = f"{parts.scheme}:" if parts.scheme else ""
    host = f"//{parts.netloc.rpartition('@')[2]}" if parts.netloc else ""
    return scheme + host + parts.path


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _tell(config: HTTPToolConfig) -> str:
    return f"tell the customer you cannot {'do' if config.acts else 'check'} this now and offer a colleague"


async def _read(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of the body, and whether there was more: reading stops there, so a huge answer costs
    neither memory nor time."""
    data = bytearray()
    async for chunk in response.content.iter_any():
        data += chunk
        if len(data) > limit:
            response.close()  # the rest is never read; the connection cannot be reused
            return bytes(data[:limit]), True
    return bytes(data), False


def _text(data: bytes, kind: str, charset: str | None) -> str:
    """The answer as the model reads it: JSON compact (whitespace is tokens), anything else as it came."""
    try:
        text = data.decode(charset or "utf-8", errors="replace")
    except LookupError:
        text = data.decode("utf-8", errors="replace")
    if kind == "application/json" or kind.endswith("+json"):
        try:
            return json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
        except ValueError:
            pass  # cut, or not JSON after all: the text as it came
    return text
