"""The Slack app manifests ask for what the code uses, and for nothing else.

The Web API methods are read from the code (harness/slack_calls.py: every `<client>.<method>(...)` named like one
of slack_sdk's client methods, and every `api_call("x.y")`), the event types from the handlers; each needs the
scopes the tables below give, taken from Slack's method and event reference. A new Slack call or event without its
scope in both manifests fails here, and so does a scope that nothing needs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from typing import Any

import pytest
import yaml

from bot.channels.incoming import Ignored
from bot.settings import Settings
from bot.slack.app import DIRECT_EVENTS
from bot.slack.events import Policy, classify
from harness.slack_calls import calls, scanned_modules, sdk_methods, slack_calls
from tests import ROOT

MANIFESTS = ("manifest.yml", "manifest.socket.yml")
URL_KEYS = frozenset({"url", "request_url", "message_menu_options_url"})

HISTORY = frozenset({"channels:history", "groups:history", "im:history", "mpim:history"})

# Dotted Web API method -> the bot scopes it needs (https://api.slack.com/methods/<method>, "Required scopes"):
# every group is needed, and any one scope of a group is enough.
METHOD_SCOPES: dict[str, tuple[frozenset[str], ...]] = {
    "auth.test": (),  # no scope
    "chat.postMessage": (frozenset({"chat:write"}),),
    "chat.update": (frozenset({"chat:write"}),),
    "chat.delete": (frozenset({"chat:write"}),),
    # Either, since 2026-03 (docs.slack.dev changelog: set status scope update); assistant:write is on its way out.
    "assistant.threads.setStatus": (frozenset({"chat:write", "assistant:write"}),),
    "chat.getPermalink": (),  # no scope
    "reactions.add": (frozenset({"reactions:write"}),),
    "reactions.remove": (frozenset({"reactions:write"}),),
    "users.info": (frozenset({"users:read"}),),
    "chat.postEphemeral": (frozenset({"chat:write"}),),
    "usergroups.users.list": (frozenset({"usergroups:read"}),),
    # The staff channel, public or private: the read scope of each.
    "conversations.info": (frozenset({"channels:read"}), frozenset({"groups:read"})),
    # The history scope of the conversation's type (public, private, DM, group DM).
    "conversations.history": (HISTORY,),
    "conversations.replies": (HISTORY,),
    "views.publish": (),  # no scope (https://docs.slack.dev/reference/methods/views.publish)
    "views.open": (),  # no scope: the CSAT comment modal (https://docs.slack.dev/reference/methods/views.open)
    # File relays (bot/slack/messenger.py): upload again, share, and look for a share after a lost answer.
    "files.getUploadURLExternal": (frozenset({"files:write"}),),
    "files.completeUploadExternal": (frozenset({"files:write"}),),
    "files.delete": (frozenset({"files:write"}),),
    "files.info": (frozenset({"files:read"}),),
    # Streamed answers (https://docs.slack.dev/reference/methods/chat.startStream and its two siblings).
    "chat.startStream": (frozenset({"chat:write"}),),
    "chat.appendStream": (frozenset({"chat:write"}),),
    "chat.stopStream": (frozenset({"chat:write"}),),
    # The agent messaging experience: prompts offered in a DM, and a thread's title in the app's history.
    "assistant.threads.setSuggestedPrompts": (frozenset({"assistant:write"}),),
    "assistant.threads.setTitle": (frozenset({"assistant:write"}),),
}

# (method, keyword argument) -> the scope that argument needs on top of the method's own.
ARGUMENT_SCOPES: dict[tuple[str, str], str] = {
    # A custom name or avatar (https://api.slack.com/methods/chat.postMessage#authorship).
    ("chat.postMessage", "username"): "chat:write.customize",
    ("chat.postMessage", "icon_url"): "chat:write.customize",
    ("chat.postMessage", "icon_emoji"): "chat:write.customize",
    ("chat.startStream", "username"): "chat:write.customize",
    ("chat.startStream", "icon_url"): "chat:write.customize",
    ("chat.startStream", "icon_emoji"): "chat:write.customize",
    # Reading message metadata back (https://api.slack.com/scopes/metadata.message:read).
    ("conversations.history", "include_all_metadata"): "metadata.message:read",
    ("conversations.replies", "include_all_metadata"): "metadata.message:read",
}

# Methods called for the bot by its libraries, not by our code, are in harness/slack_calls.py LIBRARY_METHODS.
# Not bot-token calls, so no bot scopes: Socket Mode's apps.connections.open uses the app-level token (its
# connections:write scope is set on that token, see manifest.socket.yml), and `respond()` posts to a response_url.

# Event type the code handles -> the subscriptions that deliver it (https://api.slack.com/events/<type>).
# The `message` subtypes the code reads (message_changed and message_deleted in the staff channel, file_share,
# thread_broadcast) arrive through the same message.* subscriptions: they have no subscription of their own.
EVENT_SUBSCRIPTIONS: dict[str, tuple[str, ...]] = {
    # The bot answers in every kind of conversation it is in.
    "message": ("message.channels", "message.groups", "message.im", "message.mpim"),
    "app_mention": ("app_mention",),
    "app_home_opened": ("app_home_opened",),  # needs no scope
    "assistant_thread_started": ("assistant_thread_started",),
}

# Event subscription -> the scope it needs (None: none).
EVENT_SCOPES: dict[str, str | None] = {
    "message.channels": "channels:history",
    "message.groups": "groups:history",
    "message.im": "im:history",
    "message.mpim": "mpim:history",
    "app_mention": "app_mentions:read",
    "app_home_opened": None,
    "assistant_thread_started": "assistant:write",  # https://docs.slack.dev/reference/events/assistant_thread_started
}

# Scopes that no method, event or slash command needs but are kept anyway, with the reason. Keep it small.
OTHERWISE_JUSTIFIED: dict[str, str] = {
    # No method of its own: it adds profile.email to users.info's answer (https://api.slack.com/scopes/users:read.email),
    # which intake stores with each customer message (bot/slack/app.py SlackDirectory.writer) and tools match
    # a shop's customer records on.
    "users:read.email": "the author's verified email, for tools that check identity",
    # No method either: downloading a file's url_private with the bot token needs it
    # (https://docs.slack.dev/messaging/working-with-files), as bot/slack/files.py SlackFiles does.
    "files:read": "downloading the files customers attach, to read them for the agents",
}

# A floor for the scan, so that a scanner broken into finding nothing cannot pass.
KNOWN_CALLS = {
    "chat.postMessage",
    "chat.update",
    "chat.delete",
    "chat.getPermalink",
    "reactions.add",
    "reactions.remove",
    "users.info",
    "conversations.history",
    "conversations.replies",
}


def event_types(source: str) -> set[str]:
    """The event types one module handles: Bolt listeners (`app.event("x")`, `app.message(...)`), and the
    strings an event's "type" is compared with (`kind = event.get("type")` ... `kind in ("message", ...)`),
    which is how the durable inbox's `classify` picks the events it acts on."""
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        listener, first = node.func, node.args[0] if node.args else None
        # `app.message(...)` only: other objects have a `.message()` too (the Slack emulator's).
        if listener.attr == "message" and isinstance(listener.value, ast.Name) and listener.value.id == "app":
            found.add("message")
        elif listener.attr == "event" and isinstance(first, ast.Constant) and isinstance(first.value, str):
            found.add(first.value)
        elif listener.attr == "event" and isinstance(first, ast.Dict):
            found |= {
                str(v.value)
                for k, v in zip(first.keys, first.values, strict=True)
                if isinstance(k, ast.Constant) and k.value == "type" and isinstance(v, ast.Constant)
            }

    def is_type_of_event(node: ast.AST) -> bool:
        """`event.get("type")` or `event["type"]`."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            receiver, key = node.func.value, node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript):
            receiver, key = node.value, node.slice
        else:
            return False
        named_event = isinstance(receiver, ast.Name) and receiver.id == "event"
        return named_event and isinstance(key, ast.Constant) and key.value == "type"

    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        names = {
            target.id
            for node in ast.walk(function)
            if isinstance(node, ast.Assign) and is_type_of_event(node.value)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(function):
            if not isinstance(node, ast.Compare):
                continue
            left = node.left
            if not ((isinstance(left, ast.Name) and left.id in names) or is_type_of_event(left)):
                continue
            for compared in node.comparators:
                values = compared.elts if isinstance(compared, ast.Tuple | ast.List | ast.Set) else [compared]
                found |= {str(v.value) for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
    return found


@cache
def handled_events() -> frozenset[str]:
    return frozenset(kind for _, source in scanned_modules() for kind in event_types(source))


def load(name: str) -> dict[str, Any]:
    manifest = yaml.safe_load((ROOT / name).read_text())
    assert isinstance(manifest, dict)
    return manifest


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every (path, value) in a manifest, lists' items included: `features.slash_commands[0].url`."""
    if isinstance(value, dict):
        items = [(f"{path}.{key}" if path else str(key), inner) for key, inner in value.items()]
    elif isinstance(value, list):
        items = [(f"{path}[{i}]", inner) for i, inner in enumerate(value)]
    else:
        return
    for inner_path, inner in items:
        yield inner_path, inner
        yield from _walk(inner, inner_path)


def _leaves(manifest: Any) -> dict[str, Any]:
    return {path: value for path, value in _walk(manifest) if not isinstance(value, dict | list)}


def _urls(manifest: dict[str, Any]) -> dict[str, Any]:
    return {path: value for path, value in _walk(manifest) if path.rsplit(".", 1)[-1] in URL_KEYS}


def _without_transport(value: Any) -> Any:
    """A manifest without what HTTP and Socket Mode set differently: URLs and socket_mode_enabled."""
    if isinstance(value, dict):
        return {k: _without_transport(v) for k, v in value.items() if k not in URL_KEYS | {"socket_mode_enabled"}}
    if isinstance(value, list):
        return [_without_transport(v) for v in value]
    return value


def needed_subscriptions() -> dict[str, str]:
    """Event subscription -> the handled event type that needs it."""
    return {sub: kind for kind in sorted(handled_events()) for sub in EVENT_SUBSCRIPTIONS.get(kind, ())}


def needed_scopes(manifest: dict[str, Any]) -> list[tuple[frozenset[str], str]]:
    """(any one of these scopes, why) for everything the code and the manifest's features need."""
    needs: list[tuple[frozenset[str], str]] = []
    for call in calls():
        needs += [(group, f"{call.method} ({call.where})") for group in METHOD_SCOPES.get(call.method, ())]
        needs += [
            (frozenset({ARGUMENT_SCOPES[call.method, argument]}), f"{call.method}({argument}=...) ({call.where})")
            for argument in sorted(call.arguments)
            if (call.method, argument) in ARGUMENT_SCOPES
        ]
    needs += [
        (frozenset({scope}), f"{sub} events") for sub in needed_subscriptions() if (scope := EVENT_SCOPES.get(sub))
    ]
    if manifest.get("features", {}).get("slash_commands"):
        needs.append((frozenset({"commands"}), "slash commands"))
    # The scope that lets an app act as an agent (https://docs.slack.dev/reference/scopes/assistant.write).
    if manifest.get("features", {}).get("agent_view"):
        needs.append((frozenset({"assistant:write"}), "the agent messaging experience (features.agent_view)"))
    return needs


# The scan itself: it must find what it is there to find.


def test_the_scanner_reads_calls_and_ignores_the_rest() -> None:
    sample = """
async def answer(client, mapping, self):
    await client.chat_postMessage(channel="C1", text="hi")
    await client.api_call("pins.add", json={})
    mapping.get("chat_postMessage")
    mapping.items()
    await self._post(username="Ann", icon_url="https://x")

async def _post(self, **fields):
    await self.client.chat_postMessage(channel="C1", **fields)
"""
    found = {(c.method, c.arguments) for c in slack_calls(sample, "sample.py")}
    assert found == {
        ("chat.postMessage", frozenset({"channel", "text"})),
        ("pins.add", frozenset({"json"})),
        ("chat.postMessage", frozenset({"username", "icon_url"})),
        ("chat.postMessage", frozenset({"channel"})),
    }
    assert sdk_methods()["files_upload_v2"] >= {"files.getUploadURLExternal", "files.completeUploadExternal"}
    # The streaming helper calls its methods from the stream object it returns.
    assert sdk_methods()["chat_stream"] == {"chat.startStream", "chat.appendStream", "chat.stopStream"}


def test_the_scanner_reads_event_handlers() -> None:
    sample = """
def register(app):
    app.event("reaction_added")(handler)
    app.event({"type": "member_joined_channel"})(handler)
    app.message("hello")(handler)

def classify(event, other):
    kind = event.get("type")
    if kind not in ("app_home_opened", "team_join"):
        return None
    if event["type"] == "link_shared" or other.get("type") == "not_an_event":
        return None
"""
    assert event_types(sample) == {
        "reaction_added",
        "member_joined_channel",
        "message",
        "app_home_opened",
        "team_join",
        "link_shared",
    }


def test_the_scan_finds_the_known_calls_and_events() -> None:
    found = {call.method for call in calls()}
    assert found >= KNOWN_CALLS, f"the scan missed {sorted(KNOWN_CALLS - found)}: is it still reading the code?"
    arguments = {(call.method, a) for call in calls() for a in call.arguments}
    # The relay's custom author is passed to the sender's one post call (bot/delivery/sender.py); the crash check reads
    # metadata back.
    assert ("chat.postMessage", "username") in arguments
    assert ("conversations.replies", "include_all_metadata") in arguments
    assert handled_events() >= {"message", "app_mention"}
    print("Web API methods:", ", ".join(sorted(found)))
    print("event types:", ", ".join(sorted(handled_events())))


def test_classify_handles_exactly_the_scanned_event_types() -> None:
    """The inbox stores every event and `classify` picks what to act on: the scan read it right if a found type
    gets past the type filter and any other type is ignored for its type. Events a listener answers directly
    (DIRECT_EVENTS: the App Home) never reach the inbox."""
    policy = Policy(bot_user_id="UBOT", staff_channel="CSTAFF")

    def envelope(kind: str) -> dict[str, Any]:
        event = {
            "type": kind,
            "user": "U1",
            "channel": "C1",
            "ts": "1.000001",
            "text": "hello",
            "channel_type": "channel",
        }
        return {"type": "event_callback", "team_id": "T1", "event_id": "Ev1", "event": event}

    for kind in sorted(handled_events() - DIRECT_EVENTS):
        result = classify(envelope(kind), policy)
        assert not (isinstance(result, Ignored) and result.reason.startswith("event type")), (kind, result)
    for kind in sorted({"reaction_added", "app_home_opened", "member_joined_channel", "team_join"} - handled_events()):
        assert classify(envelope(kind), policy) == Ignored(f"event type {kind}")


def test_every_call_and_event_is_in_the_tables() -> None:
    unseen = [c for c in calls() if not c.method]
    assert not unseen, f"slack_sdk helpers the scan cannot see into: {unseen}; teach sdk_methods() what they call"
    unknown = sorted({(c.method, c.where) for c in calls() if c.method not in METHOD_SCOPES})
    assert not unknown, "\n".join(
        f"{where} calls {method}, which METHOD_SCOPES does not list: add its scopes from "
        f"https://api.slack.com/methods/{method}"
        for method, where in unknown
    )
    events = sorted(handled_events() - set(EVENT_SUBSCRIPTIONS))
    assert not events, f"event types handled but not in EVENT_SUBSCRIPTIONS: {events} (https://api.slack.com/events)"
    subscriptions = sorted(set(needed_subscriptions()) - set(EVENT_SCOPES))
    assert not subscriptions, f"subscriptions without their scope in EVENT_SCOPES: {subscriptions}"


# Each manifest.


@pytest.mark.parametrize("name", MANIFESTS)
def test_every_needed_scope_is_granted_and_no_other(name: str) -> None:
    manifest = load(name)
    assert set(manifest["oauth_config"]["scopes"]) == {"bot"}, "bot scopes only: the bot acts as itself"
    listed = manifest["oauth_config"]["scopes"]["bot"]
    assert len(listed) == len(set(listed)), "a scope is listed twice"
    granted = set(listed)
    needs = needed_scopes(manifest)
    missing = [f"{' or '.join(sorted(group))}: needed by {why}" for group, why in needs if not group & granted]
    assert not missing, f"{name} lacks scopes:\n" + "\n".join(missing)
    justified = set().union(*(group for group, _ in needs)) | set(OTHERWISE_JUSTIFIED)
    unused = sorted(granted - justified)
    assert not unused, f"{name} asks for scopes nothing uses: {unused}. Remove them, or say why in OTHERWISE_JUSTIFIED."


@pytest.mark.parametrize("name", MANIFESTS)
def test_subscribes_to_exactly_the_handled_events(name: str) -> None:
    subscriptions = load(name)["settings"]["event_subscriptions"]
    assert set(subscriptions) <= {"request_url", "bot_events"}, "no user events: the bot acts as itself"
    assert sorted(subscriptions["bot_events"]) == sorted(needed_subscriptions())


@pytest.mark.parametrize("name", MANIFESTS)
def test_features(name: str) -> None:
    manifest = load(name)
    features, settings = manifest["features"], manifest["settings"]
    # The one slash command the code registers (ADMIN_COMMAND renames it; the default is what ships).
    assert [c["command"] for c in features["slash_commands"]] == [Settings.model_fields["admin_command"].default]
    # Case buttons (claim, resolve, hand back) need interactivity.
    assert settings["interactivity"]["is_enabled"] is True
    # Customers can write to the bot in a DM: without the Messages tab, or with it read-only, Slack refuses.
    home = features.get("app_home") or {}
    assert home.get("messages_tab_enabled") is True, "features.app_home.messages_tab_enabled must be true"
    assert home.get("messages_tab_read_only_enabled") is False, "features.app_home.messages_tab_read_only_enabled"
    has_home_handler = "app_home_opened" in handled_events()
    assert home.get("home_tab_enabled") is has_home_handler, "a Home tab only with an app_home_opened handler"
    # The agent messaging experience, which Slack requires of new AI apps
    # (https://docs.slack.dev/ai/migrating-to-agent-messaging): agent_view, never the assistant_view it replaces,
    # with a description and at most four suggested prompts, each a title and a message.
    assert "assistant_view" not in features, "assistant_view is replaced by agent_view"
    agent = features.get("agent_view") or {}
    assert isinstance(agent.get("agent_description"), str) and agent["agent_description"].strip()
    prompts = agent.get("suggested_prompts") or []
    assert 1 <= len(prompts) <= 4, "features.agent_view.suggested_prompts: one to four"
    assert all(set(p) == {"title", "message"} and all(str(v).strip() for v in p.values()) for p in prompts), prompts


def test_http_manifest_points_everything_at_the_one_endpoint() -> None:
    manifest = load("manifest.yml")
    assert manifest["settings"]["socket_mode_enabled"] is False
    urls = _urls(manifest)
    assert set(urls) == {
        "features.slash_commands[0].url",
        "settings.event_subscriptions.request_url",
        "settings.interactivity.request_url",
    }
    assert all(str(url).endswith("/slack/events") for url in urls.values()), urls


def test_socket_manifest_has_no_urls() -> None:
    manifest = load("manifest.socket.yml")
    assert manifest["settings"]["socket_mode_enabled"] is True
    assert _urls(manifest) == {}
    header = (ROOT / "manifest.socket.yml").read_text().split("\ndisplay_information:")[0]
    assert "connections:write" in header and "SLACK_APP_TOKEN" in header


def test_both_manifests_describe_the_same_app() -> None:
    http, socket = (
        _leaves(_without_transport(load("manifest.yml"))),
        _leaves(_without_transport(load("manifest.socket.yml"))),
    )
    differ = sorted(path for path in http.keys() | socket.keys() if http.get(path) != socket.get(path))
    assert not differ, f"manifest.yml and manifest.socket.yml differ beyond URLs and socket_mode_enabled: {differ}"
