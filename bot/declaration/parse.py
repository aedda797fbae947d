"""The operator's declaration of their helpdesk (`helpdesk.yaml`), read and checked: file in, typed values or one
located error per problem out. No I/O but reading the file, nothing imported or connected (that is `build`).

Every problem names the file, the line, the place in the declaration and the fix:

    helpdesk.yaml:14:17: agents.sales.handoffs[1]: unknown agent 'billing'; the agents are: support, triage

The shape, the texts and the placeholders are the reference in docs/declaration.md; `python -m bot init` writes a
commented starter.
"""

from __future__ import annotations

import difflib
import os
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import regex
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agents.language import Language
from agents.texts import SHORT, TEMPLATES, Text

Place = tuple[str | int, ...]
"""Where in the declaration: keys and list indexes from the top, as `agents.sales.handoffs[1]` reads."""

INSTRUCTION_FIELDS = frozenset({"brand", "writer", "customer_name", "context"})
"""What an agent's instructions may name in braces: the store, the writer's profile name, the name the customer gave,
and any key of the conversation's shared context (`{context[plan]}`); a missing value is left empty."""

TEXTS = tuple(text.value for text in Text)
"""The customer-facing texts a declaration may set: the settings of the same names (bot.settings), so that a text is
called one thing in the file, in the environment and in the docs."""
LANGUAGES = tuple(language.value for language in Language)


def place_str(place: Place) -> str:
    out = ""
    for part in place:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top)"


class DeclarationError(Exception):
    """The declaration cannot be used; `problems` each say where and what to do."""

    def __init__(self, path: Path, problems: Sequence[str]) -> None:
        self.path = path
        self.problems = tuple(problems)
        count = f"{len(problems)} problems" if len(problems) > 1 else "a problem"
        super().__init__(f"{path} has {count}; nothing was started:\n" + "\n".join(f"  {p}" for p in problems))


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BrandSpec(_Spec):
    name: str = Field(min_length=1)
    staff_signature: str | None = None
    """After a colleague's name on what they say to customers; unset: " (<name> team)"."""
    teams_app_name: str | None = Field(default=None, min_length=1, max_length=30)
    """The Teams app's name (the manifest's short name, 30 at most); unset: "<name> Helpdesk"."""


class PersonSpec(_Spec):
    name: str = Field(min_length=1)
    email: str | None = None
    note: str | None = None
    """What `chat` tells whoever types about the person they write as ("owns orders DW-1006 and DW-1007")."""


class PromptSpec(_Spec):
    """A prompt offered in a customer's DM with the app (Slack's suggested prompts): the button's title, and the
    message it sends."""

    title: str = Field(min_length=1)
    message: str = Field(min_length=1)


SUGGESTED_PROMPTS_MOST = 4
"""Slack shows up to four (assistant.threads.setSuggestedPrompts)."""


class PrefetchSpec(_Spec):
    pattern: str
    tool: str
    argument: str
    upper: bool = False
    """Pass what was found in capitals (order numbers customers type in lower case)."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            regex.compile(value)
        except regex.error as exc:
            raise ValueError(f"not a regular expression ({exc})") from None
        return value


class AgentSpec(_Spec):
    title: str = Field(min_length=1)
    description: str = Field(min_length=1)
    instructions: str = Field(min_length=1)
    model: str | None = None
    handoffs: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()
    knowledge: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    prefetch: tuple[PrefetchSpec, ...] = ()


class KnowledgeSpec(_Spec):
    path: str
    vectors: str | None = None
    language: Language | None = None
    """The language of the collection's documents (`es`, `de`...): their full text is stemmed in it. Unset: each
    document's is detected from its text (English when unsure)."""

    @field_validator("language", mode="before")
    @classmethod
    def _language(cls, value: object) -> object:
        if value is None or not isinstance(value, str):
            return value
        if (language := Language.parse(value)) is None:
            raise ValueError(f"one of {', '.join(Language)}")
        return language


class PythonToolSpec(_Spec):
    python: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    acts: bool = False
    description: str | None = None


class OpenAPISpec(_Spec):
    document: str
    operations: tuple[str, ...] = Field(min_length=1)
    base_url: str | None = None
    acting: tuple[str, ...] = ()
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every call of these operations (an API key: `Bearer ${TOKEN}`)."""


class HTTPSpec(_Spec):
    signing_secret: str | None = None
    """The secret the HTTP tools sign who is asking with (`X-Helpdesk-Signature`); required unless `unsigned`."""
    unsigned: bool = False
    """Send the asker unsigned: for endpoints that cannot check a signature, behind a network only the bot reaches."""
    allowed_hosts: tuple[str, ...] = ()


class DeclarationSpec(_Spec):
    version: Literal[1] = 1
    brand: BrandSpec
    entry: str
    test_customer: PersonSpec | None = None
    instructions: str = ""
    language: Language = Language.EN
    """The operator's language: the bot's own words until a customer's is known, and what staff read."""
    texts: dict[str, str | dict[str, str]] = Field(default_factory=dict)
    """A text's name and its words in `language`, or a language's code and its texts in that language."""
    suggested_prompts: tuple[PromptSpec, ...] = ()
    """Offered when a customer opens a DM with the app; none: the Slack manifest's own prompts show."""
    agents: dict[str, AgentSpec] = Field(min_length=1)
    knowledge: dict[str, KnowledgeSpec] = Field(default_factory=dict)
    tools: dict[str, dict[str, Any]] = Field(default_factory=dict)
    openapi: tuple[OpenAPISpec, ...] = ()
    http: HTTPSpec = HTTPSpec()
    mcp_servers: dict[str, dict[str, Any]] = Field(default_factory=dict, alias="mcpServers")

    @field_validator("knowledge", mode="before")
    @classmethod
    def _short_knowledge(cls, value: object) -> object:
        # `help: ./docs/help` is the short form of `help: {path: ./docs/help}`.
        if isinstance(value, Mapping):
            return {k: {"path": v} if isinstance(v, str) else v for k, v in value.items()}
        return value


@dataclass(frozen=True)
class Declaration:
    """A checked declaration, and where it came from (relative paths in it are the file's folder's)."""

    spec: DeclarationSpec
    path: Path
    places: Mapping[Place, tuple[int, int]]
    """Line and column of each key and item, for errors found later (an import, a server's listing)."""

    @property
    def folder(self) -> Path:
        return self.path.parent

    def at(self, place: Place, message: str) -> str:
        """A problem at `place`, as the operator reads it: file:line:column: place: message."""
        line, column = _nearest(self.places, place)
        return f"{self.path}:{line}:{column}: {place_str(place)}: {message}"

    def error(self, place: Place, message: str) -> DeclarationError:
        return DeclarationError(self.path, [self.at(place, message)])

    def resolve(self, relative: str) -> Path:
        path = Path(os.path.expanduser(relative))
        return path if path.is_absolute() else (self.folder / path)


def load(path: Path, *, environ: Mapping[str, str] | None = None) -> Declaration:
    """Read and check the declaration at `path`; DeclarationError with every problem found."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DeclarationError(
            path, [f"{path}: no such file; write a starter with `python -m bot init` (or unset HELPDESK_FILE)"]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DeclarationError(path, [f"{path}: cannot be read ({exc})"]) from None
    return parse(text, path, environ=os.environ if environ is None else environ)


def parse(text: str, path: Path, *, environ: Mapping[str, str]) -> Declaration:
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                at = f":{event.start_mark.line + 1}:{event.start_mark.column + 1}" if event.start_mark else ""
                raise DeclarationError(path, [f"{path}{at}: aliases (*{event.anchor}) are not read; write it out"])
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise DeclarationError(path, [f"{where}: not valid YAML ({problem})"]) from None
    if node is None:
        raise DeclarationError(path, [f"{path}: the file is empty; `python -m bot init` writes a starter"])
    places: dict[Place, tuple[int, int]] = {}
    duplicates: list[str] = []
    _walk(node, (), places, duplicates)
    if duplicates:
        raise DeclarationError(path, [f"{path}:{d}" for d in duplicates])
    raw = yaml.safe_load(text)
    if not isinstance(raw, dict):
        raise DeclarationError(path, [f"{path}:1:1: the declaration is a mapping (brand:, entry:, agents:, ...)"])
    declaration = Declaration(DeclarationSpec.model_construct(), path, places)
    interpolated, missing = _environment(raw, environ)
    problems = [declaration.at(place, message) for place, message in missing]
    try:
        spec = DeclarationSpec.model_validate(interpolated)
    except ValidationError as exc:
        errors = exc.errors()
        misspelt = {
            (tuple(e["loc"][:-1]), close)
            for e in errors
            if e["type"] == "extra_forbidden"
            for close in difflib.get_close_matches(str(e["loc"][-1]), [str(x["loc"][-1]) for x in errors], n=3)
        }
        # A misspelt key is one mistake: say "did you mean", not also that the right one is missing.
        errors = [
            e for e in errors if not (e["type"] == "missing" and (tuple(e["loc"][:-1]), e["loc"][-1]) in misspelt)
        ]
        problems += [declaration.at(_place(e["loc"]), _advice(e, interpolated)) for e in errors]
        raise DeclarationError(path, problems) from None
    if problems:
        raise DeclarationError(path, problems)
    declaration = Declaration(spec, path, places)
    problems = [declaration.at(place, message) for place, message in check(spec)]
    if problems:
        raise DeclarationError(path, problems)
    return declaration


def check(spec: DeclarationSpec) -> list[tuple[Place, str]]:
    """What the shape cannot say: names that must refer to something declared, templates that must fill."""
    from agents.builtins import BUILTINS

    problems: list[tuple[Place, str]] = []
    agents = sorted(spec.agents)
    if spec.entry not in spec.agents:
        problems.append((("entry",), f"unknown agent {spec.entry!r}{_did_you_mean(spec.entry, agents)}"))
    for name in spec.agents:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,40}", name):
            problems.append(
                (("agents", name), "an agent's name is lower case letters, digits and _ (it names its transfer tool)")
            )
    if len(spec.suggested_prompts) > SUGGESTED_PROMPTS_MOST:
        problems.append(
            (
                ("suggested_prompts", SUGGESTED_PROMPTS_MOST),
                f"at most {SUGGESTED_PROMPTS_MOST} suggested prompts (Slack shows four); remove "
                f"{len(spec.suggested_prompts) - SUGGESTED_PROMPTS_MOST}",
            )
        )
    problems += _texts_problems(spec.texts)
    declared = set(spec.tools) | set(BUILTINS) | {op for api in spec.openapi for op in api.operations}
    servers = set(spec.mcp_servers)
    collections = set(spec.knowledge)
    for name, agent in spec.agents.items():
        here: Place = ("agents", name)
        for i, target in enumerate(agent.handoffs):
            if target == name:
                problems.append(((*here, "handoffs", i), "an agent cannot hand off to itself"))
            elif target not in spec.agents:
                problems.append(
                    (
                        (*here, "handoffs", i),
                        f"unknown agent {target!r}{_did_you_mean(target, agents)}; the agents are: {', '.join(agents)}",
                    )
                )
        unknown_tools = False
        for i, entry in enumerate(agent.tools):
            found = _tool_reference(entry, declared, servers)
            unknown_tools = unknown_tools or bool(found)
            problems += [((*here, "tools", i), p) for p in found]
        for i, collection in enumerate(agent.knowledge):
            if spec.knowledge and collection not in collections:
                problems.append(
                    (
                        (*here, "knowledge", i),
                        f"unknown collection {collection!r}{_did_you_mean(collection, collections)}; declare it under "
                        "knowledge: (with the folder of its documents), or leave knowledge: out to use collections "
                        "filled with `python -m bot kb ingest`",
                    )
                )
        names = {t.rsplit("/", 1)[-1] for t in agent.tools if not t.startswith("mcp:") or "/" in t}
        whole_servers = any(t.startswith("mcp:") and "/" not in t for t in agent.tools)
        for i, planned in enumerate(agent.prefetch):
            # A whole server's tools are known once it answers (build checks them then); one mistake, one error.
            if planned.tool not in names and not unknown_tools and not whole_servers:
                problems.append(
                    (
                        (*here, "prefetch", i, "tool"),
                        f"{planned.tool!r} is not among this agent's tools: add it to tools",
                    )
                )
        if problem := template_problem(agent.instructions, INSTRUCTION_FIELDS):
            problems.append(((*here, "instructions"), problem))
    if problem := template_problem(spec.instructions, INSTRUCTION_FIELDS):
        problems.append((("instructions",), problem))
    for name, tool in spec.tools.items():
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            problems.append(
                (("tools", name), "a tool's name is letters, digits, _ and - (64 at most), as providers want")
            )
        if name in BUILTINS:
            problems.append((("tools", name), f"{name} is built in; give yours another name"))
        if "python" not in tool and "url" not in tool:
            problems.append(
                (("tools", name), 'give either python: "module:function" (a Python tool) or url: (an HTTP tool)')
            )
        elif "python" in tool and "url" in tool:
            problems.append((("tools", name), "give either python: or url:, not both"))
        elif "python" in tool:
            try:
                PythonToolSpec.model_validate(tool)
            except ValidationError as exc:
                problems += [(("tools", name, *_place(e["loc"])), _python_advice(e)) for e in exc.errors()]
    for i, api in enumerate(spec.openapi):
        for j, operation in enumerate(api.operations):
            if operation in spec.tools or operation in BUILTINS:
                problems.append(
                    (("openapi", i, "operations", j), f"{operation} is also a tool under tools:; rename one")
                )
    http_tools = [name for name, tool in spec.tools.items() if "url" in tool] + [
        o for a in spec.openapi for o in a.operations
    ]
    if http_tools and not spec.http.signing_secret and not spec.http.unsigned:
        problems.append(
            (
                ("http",) if "http" in spec.model_fields_set else ("tools",),
                "HTTP tools tell your endpoints who is asking in signed headers: set http.signing_secret (a shared "
                "secret, e.g. ${HELPDESK_TOOLS_SECRET}), or http.unsigned: true for endpoints that cannot check one",
            )
        )
    return problems


def _python_advice(error: Any) -> str:
    if error["type"] == "string_pattern_mismatch":
        return 'write "module:function", e.g. "tools:lookup_order" for lookup_order in tools.py beside this file'
    if error["type"] == "extra_forbidden":
        return "unknown key; a Python tool has python:, acts: and description:"
    return str(error["msg"])


def _tool_reference(entry: str, declared: set[str], servers: set[str]) -> list[str]:
    if entry.startswith("mcp:"):
        server, slash, tool = entry[4:].partition("/")
        if slash and not tool:
            return [f"write mcp:{server} for all of the server's tools, or mcp:{server}/TOOL for one"]
        if server not in servers:
            known = ", ".join(sorted(servers)) or "none is declared"
            return [
                f"unknown MCP server {server!r}{_did_you_mean(server, servers)}; the servers under mcpServers: {known}"
            ]
        return []
    if entry not in declared:
        return [
            f"unknown tool {entry!r}{_did_you_mean(entry, declared)}; declare it under tools: (python: or url:), name "
            "an operation of openapi:, or write mcp:SERVER (all of a server's tools) or mcp:SERVER/TOOL"
        ]
    return []


def _texts_problems(texts: Mapping[str, str | dict[str, str]], at: Place = ("texts",)) -> list[tuple[Place, str]]:
    """`texts:` holds texts of the operator's language by name, and blocks of another language's by its code."""
    problems: list[tuple[Place, str]] = []
    for key, value in texts.items():
        here = (*at, key)
        if isinstance(value, dict):
            if key not in LANGUAGES:
                languages = ", ".join(LANGUAGES)
                problems.append((here, f"unknown language{_did_you_mean(key, LANGUAGES)}; the languages: {languages}"))
            elif len(at) > 1:
                problems.append((here, "a language's block holds texts, not another language"))
            else:
                problems += _texts_problems(value, here)
        elif key in LANGUAGES:
            problems.append((here, f"the texts in {Language(key).english_name} are a block: {key}: {{name: words}}"))
        elif key not in TEXTS:
            problems.append((here, f"unknown text{_did_you_mean(key, TEXTS)}; the texts: {', '.join(TEXTS)}"))
        elif key in TEMPLATES and (problem := template_problem(value, TEMPLATES[key])):
            problems.append((here, problem))
        elif key not in TEMPLATES and "${" in value:  # would reach customers as written
            problems.append((here, "${...} is read from the environment only in tools, openapi, http and mcpServers"))
        elif key in SHORT and len(value) > SHORT[key]:
            problems.append((here, f"at most {SHORT[key]} characters (Slack refuses more); {len(value)} here"))
    return problems


def template_problem(text: str, allowed: Iterable[str]) -> str | None:
    """Why `text` cannot be filled with the fields `allowed`, or None. Checked at start-up: a template that cannot be
    filled would fail every message it is used on."""
    allowed = frozenset(allowed)
    if "${" in text:
        return "${...} is read from the environment only in tools, openapi, http and mcpServers, never in texts"
    names = ", ".join("{" + name + "}" for name in sorted(allowed))
    hint = f"it may use {names}; write a literal brace as {{{{ or }}}}" if allowed else "write a brace as {{ or }}"
    try:
        fields = [
            (field, spec, conversion)
            for _, field, spec, conversion in string.Formatter().parse(text)
            if field is not None
        ]
    except ValueError as exc:
        return f"not a valid template ({exc}); {hint}"
    for field, spec, conversion in fields:
        # Only plain names (and context[key]): a format spec or a conversion would fail on a value stored later.
        if spec or conversion or not re.fullmatch(r"[A-Za-z_]\w*(\[[^\[\]{}:!]+\])?", field):
            written = field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            return f"{{{written}}} is not a plain placeholder; {hint}"
        if "[" in field and not field.startswith("context["):
            return f"{{{field}}}: only context[...] takes a key; {hint}"
    used = {re.split(r"[.\[]", field)[0] for field, _, _ in fields}
    if unknown := used - allowed:
        return f"unknown placeholder {', '.join('{' + n + '}' for n in sorted(unknown))}; {hint}"
    try:
        text.format_map(Blank())
    except (ValueError, IndexError, KeyError, AttributeError) as exc:
        return f"not a valid template ({exc!r}); {hint}"
    return None


class Blank(dict[str, Any]):
    """Fills any field with an empty value (and any `{context[key]}` too)."""

    def __missing__(self, key: str) -> Any:
        return Blank()

    def __format__(self, spec: str) -> str:
        return ""

    def __str__(self) -> str:
        return ""


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SECRETS = ("mcpServers", "http", "tools", "openapi")
"""Where `${VAR}` is read from the environment: secrets belong in headers and server settings, not in prompts."""


def _environment(raw: dict[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, Any], list[tuple[Place, str]]]:
    missing: list[tuple[Place, str]] = []

    def fill(value: Any, place: Place) -> Any:
        if isinstance(value, str):

            def variable(match: re.Match[str]) -> str:
                name, default = match.group(1), match.group(2)
                if name in environ:
                    return environ[name]
                if default is not None:
                    return default
                missing.append(
                    (place, f"${{{name}}} is not set in the environment; set it, or write ${{{name}:-default}}")
                )
                return ""

            return _VARIABLE.sub(variable, value)
        if isinstance(value, dict):
            return {k: fill(v, (*place, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v, (*place, i)) for i, v in enumerate(value)]
        return value

    return {k: fill(v, (k,)) if k in _SECRETS else v for k, v in raw.items()}, missing


def _walk(node: yaml.Node, place: Place, places: dict[Place, tuple[int, int]], duplicates: list[str]) -> None:
    places.setdefault(place, (node.start_mark.line + 1, node.start_mark.column + 1))
    if isinstance(node, yaml.MappingNode):
        seen: set[object] = set()
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key.value)
            if name in seen:
                duplicates.append(
                    f"{key.start_mark.line + 1}:{key.start_mark.column + 1}: {place_str((*place, name))}: "
                    "written twice; keep one"
                )
            seen.add(name)
            _walk(value, (*place, name), places, duplicates)
            # A value written on the line: its own place; a block below its key: the key's line.
            mark = value.start_mark if isinstance(value, yaml.ScalarNode) else key.start_mark
            places[(*place, name)] = (mark.line + 1, mark.column + 1)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*place, i), places, duplicates)


def _nearest(places: Mapping[Place, tuple[int, int]], place: Place) -> tuple[int, int]:
    while place not in places and place:
        place = place[:-1]
    return places.get(place, (1, 1))


def _place(loc: Sequence[str | int]) -> Place:
    aliases = {"mcp_servers": "mcpServers"}
    return tuple(aliases.get(p, p) if isinstance(p, str) else p for p in loc)


_FIELDS: dict[tuple[str | int, ...], type[BaseModel]] = {
    (): DeclarationSpec,
    ("brand",): BrandSpec,
    ("test_customer",): PersonSpec,
    ("http",): HTTPSpec,
}


def _advice(error: Any, raw: Mapping[str, Any]) -> str:
    """Pydantic's message, with the fix where one is plain (a misspelt key: the right one)."""
    loc = tuple(error["loc"])
    if error["type"] == "extra_forbidden":
        model: type[BaseModel] | None = _FIELDS.get(loc[:-1])
        if model is None and len(loc) == 3 and loc[0] == "agents":
            model = AgentSpec
        if model is None and len(loc) >= 2 and loc[0] == "knowledge":
            model = KnowledgeSpec
        if model is None and len(loc) == 3 and loc[0] == "suggested_prompts":
            model = PromptSpec
        known = sorted((f.alias or n) for n, f in model.model_fields.items()) if model is not None else []
        suggestion = _did_you_mean(str(loc[-1]), known)
        return f"unknown key{suggestion}" + (f"; the keys here: {', '.join(known)}" if known else "")
    if error["type"] == "missing":
        return "missing: add it (docs/declaration.md shows every key)"
    if error["type"] == "literal_error" and loc == ("version",):
        return "this bot reads version: 1"
    return str(error["msg"])


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
