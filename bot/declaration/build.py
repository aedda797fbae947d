"""A checked declaration made into what runs: the roster, the operator's tools (Python, HTTP, MCP) and the settings
with the declaration's brand and texts. Imports the operator's Python tools and connects to their servers; every
problem found here is still located in the file (`Declaration.error`).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import regex

from agents.agent import Agent, Planned, Prefetch, Roster
from agents.builtins import BUILTINS
from agents.errors import ConfigError
from agents.http_tools import HTTPToolConfig, HTTPTools, openapi_tools, parse_http_tool
from agents.identity import Author
from agents.knowledge.store import KnowledgeBase
from agents.knowledge.tool import knowledge_search
from agents.language import Language
from agents.tools import Tool, function_tool
from agents.toolsets import Toolset, ToolSource
from bot.declaration.parse import Blank, Declaration, DeclarationError, Place, load
from bot.settings import Settings

if TYPE_CHECKING:
    from agents.mcp_servers import MCPServer, MCPServerConfig

log = logging.getLogger(__name__)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SAMPLE = EXAMPLES / "driftwing" / "helpdesk.yaml"
"""What runs when the operator has declared nothing: the Driftwing Drones sample."""
DEFAULT_FILE = Path("helpdesk.yaml")
"""Where the operator's declaration is looked for when HELPDESK_FILE is not set (in the working folder)."""

CITE = (
    " For facts, products and policies, use search_knowledge first and cite the passages you use as [n] Title; if it "
    "finds nothing, say so and offer a colleague."
)


def find(settings: Settings) -> Path:
    """HELPDESK_FILE, else ./helpdesk.yaml, else the sample."""
    if settings.helpdesk_file is not None:
        return settings.helpdesk_file
    return DEFAULT_FILE if DEFAULT_FILE.is_file() else SAMPLE


def declared(settings: Settings) -> tuple[Settings, Declaration]:
    """The declaration the settings point to, and the settings with its brand and texts where the environment did not
    set them. Raises DeclarationError."""
    path = find(settings)
    declaration = load(path)
    if path == SAMPLE:
        log.info(
            "no helpdesk.yaml here and HELPDESK_FILE is unset: running the Driftwing sample (`bot init` starts yours)"
        )
    return with_declaration(settings, declaration), declaration


def with_declaration(settings: Settings, declaration: Declaration) -> Settings:
    spec = declaration.spec
    chosen = settings.model_fields_set
    update: dict[str, Any] = {k: v for k, v in spec.texts.items() if isinstance(v, str) and k not in chosen}
    if "default_language" not in chosen:
        update["default_language"] = spec.language
    if "texts_by_language" not in chosen:
        update["texts_by_language"] = {Language(k): v for k, v in spec.texts.items() if isinstance(v, dict)}
    if settings.staff_name_suffix is None:
        update["staff_name_suffix"] = (
            spec.brand.staff_signature if spec.brand.staff_signature is not None else f" ({spec.brand.name} team)"
        )
    if "teams_bot_name" not in chosen:
        update["teams_bot_name"] = teams_app_name(declaration)
    return settings.model_copy(update=update)


def teams_app_name(declaration: Declaration) -> str:
    brand = declaration.spec.brand
    if brand.teams_app_name:
        return brand.teams_app_name
    name = f"{brand.name} Helpdesk"
    return name if len(name) <= 30 else brand.name[:30]


def test_customer(declaration: Declaration, platform: str = "cli") -> Author:
    """Who the terminal chat, the playground and `bot eval` write as."""
    person = declaration.spec.test_customer
    if person is None:
        return Author(platform, None, "tester", "Test Customer", None)
    return Author(platform, None, "tester", person.name, person.email)


@dataclass(frozen=True)
class Collection:
    name: str
    folder: Path
    vectors: Path | None
    language: Language | None = None
    """Declared for its documents; None: detected per document."""


@dataclass
class Helpdesk:
    """The operator's helpdesk, ready to run: `roster()` for the engine, `sources` to start and close with the
    process."""

    declaration: Declaration
    python_tools: Mapping[str, Tool]
    http: HTTPTools | None
    mcp: Mapping[str, MCPServer]
    http_names: frozenset[str] = field(default_factory=frozenset)

    @property
    def sources(self) -> tuple[ToolSource, ...]:
        return ((self.http,) if self.http is not None else ()) + tuple(self.mcp.values())

    @property
    def sample(self) -> bool:
        return self.declaration.path.resolve() == SAMPLE

    @property
    def collections(self) -> list[Collection]:
        return [
            Collection(
                name,
                self.declaration.resolve(k.path),
                self.declaration.resolve(k.vectors) if k.vectors else None,
                k.language,
            )
            for name, k in self.declaration.spec.knowledge.items()
        ]

    async def start(self) -> None:
        """Connect to the operator's servers, all at once (one that is down is reported and retried, never fatal),
        then check what the declaration says of their tools against what each server that answered lists: the tools
        agents name one by one, the tools it says act, and that no agent is offered two tools of one name."""
        await asyncio.gather(*(source.start() for source in self.sources))
        problems = self._listed_problems()
        if problems:
            await self.close()
            raise DeclarationError(self.declaration.path, problems)

    def _listed_problems(self) -> list[str]:
        spec, at = self.declaration.spec, self.declaration.at
        problems = []
        for server_name, raw in spec.mcp_servers.items():
            server = self.mcp.get(server_name)
            if server is None or not server.status().up:
                continue
            listed = {t.name for t in server.tools()}
            for i, acting in enumerate(raw.get("acting") or ()):
                if acting not in listed:
                    # Fail closed: a misspelt name would leave the real tool acting without the customer's yes.
                    problems.append(
                        at(("mcpServers", server_name, "acting", i), f"{server_name} lists no tool {acting!r}")
                    )
        for name, agent in spec.agents.items():
            offered: dict[str, str] = {t: "built in" for t in agent.tools if t in BUILTINS}
            offered |= {t: "tools:" for t in agent.tools if t in self.python_tools}
            offered |= {t: "http" for t in agent.tools if t in self.http_names}
            for i, entry in enumerate(agent.tools):
                if not entry.startswith("mcp:"):
                    continue
                server_name, _, tool = entry[4:].partition("/")
                server = self.mcp[server_name]
                if not server.status().up:
                    continue
                listed = {t.name for t in server.tools()}
                if tool and tool not in listed:
                    names = ", ".join(sorted(listed)) or "none"
                    problems.append(
                        at(("agents", name, "tools", i), f"{server_name} lists no tool {tool!r}; it lists: {names}")
                    )
                    continue
                for offered_name in {tool} if tool else listed:
                    other = offered.get(offered_name)
                    if other is not None and other != f"mcp:{server_name}":
                        problems.append(
                            at(
                                ("agents", name, "tools", i),
                                f"{offered_name} of mcp:{server_name} has the name of a tool from {other}; an agent's "
                                "tools need one name each: name the server's tools one by one (mcp:SERVER/TOOL)",
                            )
                        )
                    offered[offered_name] = f"mcp:{server_name}"
        return problems

    async def close(self) -> None:
        for source in self.sources:
            await source.close()

    def roster(self, knowledge: KnowledgeBase | None = None, *, min_similarity: float | None = None) -> Roster:
        spec = self.declaration.spec
        agents = []
        for name, declared_agent in spec.agents.items():
            own: list[Tool] = []
            toolsets: list[Toolset] = []
            by_server: dict[str, set[str] | None] = {}
            for entry in declared_agent.tools:
                if entry.startswith("mcp:"):
                    server, _, tool = entry[4:].partition("/")
                    if tool and by_server.get(server, set()) is not None:
                        by_server.setdefault(server, set()).add(tool)  # type: ignore[union-attr]
                    elif not tool:
                        by_server[server] = None
                elif entry in self.http_names:
                    assert self.http is not None
                    toolsets.append(Toolset(self.http, frozenset({entry})))
                else:
                    own.append(self.python_tools.get(entry) or BUILTINS[entry])
            for server, only in by_server.items():
                toolsets.append(Toolset(self.mcp[server], None if only is None else frozenset(only)))
            template = declared_agent.instructions + (f"\n\n{spec.instructions}" if spec.instructions else "")
            agent = Agent(
                name=name,
                title=declared_agent.title,
                description=declared_agent.description,
                instructions=_instructions(template, spec.brand.name),
                tools=tuple(own),
                handoffs=declared_agent.handoffs,
                model=declared_agent.model,
                examples=declared_agent.examples,
                toolsets=_merged(toolsets),
                knowledge=declared_agent.knowledge,
                prefetch=_prefetch(declared_agent.prefetch) if declared_agent.prefetch else None,
            )
            if knowledge is not None and declared_agent.knowledge:
                search, retrieve = knowledge_search(
                    knowledge, collections=declared_agent.knowledge, min_similarity=min_similarity
                )
                agent = replace(
                    agent,
                    tools=(*agent.tools, search),
                    retrieve=retrieve,
                    instructions=_instructions(template + CITE, spec.brand.name),
                )
            agents.append(agent)
        try:
            return Roster.of(agents, entry=spec.entry)
        except ConfigError as exc:  # parse.check refuses what Roster.of would: a tool name taken twice is left
            raise self.declaration.error(("agents",), str(exc)) from None


def _merged(toolsets: Sequence[Toolset]) -> tuple[Toolset, ...]:
    """One toolset per source: an HTTP tool named twice, or by name and then all of it, is offered once."""
    by_source: dict[int, Toolset] = {}
    for toolset in toolsets:
        seen = by_source.get(id(toolset.source))
        if seen is None:
            by_source[id(toolset.source)] = toolset
        elif seen.only is None or toolset.only is None:
            by_source[id(toolset.source)] = Toolset(toolset.source, None)
        else:
            by_source[id(toolset.source)] = Toolset(toolset.source, seen.only | toolset.only)
    return tuple(by_source.values())


class _Fields(dict[str, Any]):
    def __missing__(self, key: str) -> Any:
        return Blank()


def _instructions(template: str, brand: str) -> Any:
    def render(context: Mapping[str, Any]) -> str:
        fields = _Fields(context=_Fields(context), brand=brand)
        for key in ("writer", "customer_name"):
            if context.get(key):
                fields[key] = context[key]
        return template.format_map(fields)

    return render


PREFETCH_TIMEOUT_S = 0.05
"""One prefetch pattern's search of a message at most: it runs on the event loop, before every agent's first call,
and a pattern that backtracks without end must not stall every conversation (it then plans nothing)."""


def _prefetch(planned: Sequence[Any]) -> Prefetch:
    patterns = [(regex.compile(p.pattern), p.tool, p.argument, p.upper) for p in planned]

    def plan(message: str) -> list[Planned]:
        found: dict[tuple[str, str], Planned] = {}
        for pattern, tool, argument, upper in patterns:
            try:
                matches = [m.group(0) for m in pattern.finditer(message, timeout=PREFETCH_TIMEOUT_S)]
            except TimeoutError:
                log.warning("the prefetch pattern %r took too long on a message; nothing planned", pattern.pattern)
                continue
            for value in matches:
                value = value.upper() if upper else value
                found.setdefault((tool, value.casefold()), Planned(tool, {argument: value}))
        return list(found.values())

    return plan


def build(declaration: Declaration) -> Helpdesk:
    """Import the Python tools and make the HTTP and MCP sources (not started). Raises DeclarationError."""
    spec = declaration.spec
    problems: list[str] = []
    python_tools: dict[str, Tool] = {}
    http_configs: list[HTTPToolConfig] = []
    for name, raw in spec.tools.items():
        place: Place = ("tools", name)
        if "python" in raw:
            try:
                python_tools[name] = _python_tool(declaration, name, raw)
            except ConfigError as exc:
                problems.append(declaration.at((*place, "python"), str(exc)))
        else:
            try:
                http_configs.append(parse_http_tool(name, raw))
            except ConfigError as exc:
                located, message = _located(str(exc))
                problems.append(declaration.at(located or place, message))
    for i, api in enumerate(spec.openapi):
        try:
            document = _document(declaration, api.document)
            http_configs += openapi_tools(
                document,
                api.operations,
                base_url=api.base_url,
                where=f"openapi[{i}]",
                acting=frozenset(api.acting),
                headers=api.headers,
            )
        except ConfigError as exc:
            located, message = _located(str(exc))
            problems.append(declaration.at(located or ("openapi", i), message))
    for name, knowledge in spec.knowledge.items():
        folder = declaration.resolve(knowledge.path)
        if not folder.is_dir():
            problems.append(
                declaration.at(("knowledge", name), f"{folder} is not a folder; put the collection's documents there")
            )
        if knowledge.vectors and not declaration.resolve(knowledge.vectors).is_file():
            problems.append(declaration.at(("knowledge", name, "vectors"), "no such file; leave vectors out to embed"))
    mcp = _mcp_servers(declaration, problems) if spec.mcp_servers else {}
    http: HTTPTools | None = None
    if http_configs:
        try:
            http = HTTPTools(
                http_configs,
                signing_secret=spec.http.signing_secret,
                allowed_hosts=frozenset(spec.http.allowed_hosts),
            )
        except ConfigError as exc:
            problems.append(declaration.at(("tools",), str(exc)))
    if problems:
        raise DeclarationError(declaration.path, problems)
    return Helpdesk(declaration, python_tools, http, mcp, frozenset(c.name for c in http_configs))


def _mcp_servers(declaration: Declaration, problems: list[str]) -> dict[str, MCPServer]:
    """The declared MCP servers, not yet connected; a bad entry is a problem located in the file."""
    # Imported only here: the MCP SDK and its dependencies are ~27 MB of RSS that a helpdesk without servers never uses.
    from agents.mcp_servers import MCPServer, parse_mcp_servers

    mcp: dict[str, MCPServer] = {}
    for name, raw in declaration.spec.mcp_servers.items():
        entry = dict(raw) if isinstance(raw, Mapping) else raw
        acting = entry.pop("acting", []) if isinstance(entry, dict) else []
        try:
            if not (isinstance(acting, list) and all(isinstance(a, str) for a in acting)):
                raise ConfigError(f"mcpServers.{name}.acting: a list of the server's tool names that act for the asker")
            config = parse_mcp_servers({name: entry})[name]
        except ConfigError as exc:
            place, message = _located(str(exc))
            problems.append(declaration.at(place, message))
            continue
        mcp[name] = MCPServer(_beside(config, declaration.folder), acting=frozenset(acting))
    return mcp


def _beside(config: MCPServerConfig, folder: Path) -> MCPServerConfig:
    """A stdio server runs in the declaration's folder (its `./server.py` is the operator's), and `python` is the
    bot's own interpreter, so a server written against the bot's environment finds its packages."""
    if config.command is None:
        return config
    command = sys.executable if config.command in ("python", "python3") else config.command
    cwd = str(folder / config.cwd) if config.cwd else str(folder)
    return replace(config, command=command, cwd=cwd)


def _located(message: str) -> tuple[Place, str]:
    """A component's error ("mcpServers.orders.url: ...") as a place in the file and the rest of the message."""
    found = re.match(r"^([A-Za-z_][\w.-]*(?:\[\d+\])?(?:\.[\w-]+)*): (.*)$", message, re.DOTALL)
    if found is None:
        return (), message
    place: list[str | int] = []
    for part in re.split(r"\.", found.group(1)):
        index = re.fullmatch(r"(.*)\[(\d+)\]", part)
        place += [index.group(1), int(index.group(2))] if index else [part]
    return tuple(place), found.group(2)


def _python_tool(declaration: Declaration, name: str, raw: Mapping[str, Any]) -> Tool:
    reference = str(raw["python"])
    module_name, _, attribute = reference.partition(":")
    folder = declaration.folder.resolve()
    if str(folder) not in sys.path:
        # Their own modules import each other; appended, they can shadow no library nor the bot's own modules.
        sys.path.append(str(folder))
    try:
        module = _import(module_name, folder)
    except (Exception, SystemExit) as exc:  # an operator's module that exits at import is still their file's problem
        raise ConfigError(
            f"cannot import {module_name!r} ({type(exc).__name__}: {exc}); it is looked for beside "
            f"{declaration.path.name} and among the installed packages"
        ) from None
    target = getattr(module, attribute, None)
    if target is None:
        raise ConfigError(f"{module_name} has no {attribute!r}")
    if isinstance(target, Tool):
        tool = target
    elif inspect.iscoroutinefunction(target):
        tool = function_tool(target, name=name)
    else:
        raise ConfigError(f"{reference} is neither an async function nor a @function_tool")
    tool = replace(tool, name=name, acts=bool(raw.get("acts", tool.acts)))
    if raw.get("description"):
        tool = replace(tool, description=" ".join(str(raw["description"]).split()))
    return tool


def _import(module_name: str, folder: Path) -> ModuleType:
    """The operator's module beside the declaration (tools.py, or a package), loaded from its file under a name of
    its own, so a `tools.py` never stands in for an installed `tools`, nor the other way round; else an installed
    module by its name."""
    relative = Path(*module_name.split("."))
    for candidate in (folder / relative.with_suffix(".py"), folder / relative / "__init__.py"):
        if candidate.is_file():
            # One namespace per declaration folder: two helpdesks' tools.py are two modules.
            name = f"helpdesk_operator_{hashlib.sha1(str(folder).encode()).hexdigest()[:10]}.{module_name}"
            if name in sys.modules:
                return sys.modules[name]
            spec = importlib.util.spec_from_file_location(name, candidate)
            if spec is None or spec.loader is None:
                break
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
            return module
    return importlib.import_module(module_name)


def _document(declaration: Declaration, where: str) -> dict[str, Any]:
    """An OpenAPI document from a file beside the declaration (YAML or JSON)."""
    import yaml

    if re.match(r"https?://", where):
        raise ConfigError(
            "give the OpenAPI document as a file beside the declaration (download it once); URLs are not read"
        )
    path = declaration.resolve(where)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the OpenAPI document {path} ({exc})") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path} is not an OpenAPI document (a mapping with openapi:, paths:)")
    return document


def helpdesk(settings: Settings) -> tuple[Settings, Helpdesk]:
    """The declared helpdesk, built (not started), and the settings with its texts."""
    settings, declaration = declared(settings)
    return settings, build(declaration)
