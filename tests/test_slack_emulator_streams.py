"""The Slack emulator's streamed messages (chat.startStream, chat.appendStream, chat.stopStream) and the agent
messaging experience's calls, driven through the real slack_sdk AsyncWebClient over HTTP: what Slack does, and
where Slack refuses, so that the bot's streaming fails here where it would fail against Slack."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.playground.slack_emulator import (
    SLACK_RATE_LIMITS,
    STREAM_TEXT_LIMIT,
    TEAM_ID,
    TIER_2,
    TIER_4,
    SlackEmulator,
    Task,
)

pytestmark = pytest.mark.services  # every test serves the emulator

FOR_CASEY: dict[str, Any] = {"recipient_user_id": "U_CUSTOMER", "recipient_team_id": TEAM_ID}
METADATA = {"event_type": "helpdesk_outbox", "event_payload": {"outbox_id": 7}}
FEEDBACK = {"type": "context", "elements": [{"type": "mrkdwn", "text": "Was this helpful?"}]}


@pytest.fixture
async def emu() -> AsyncIterator[SlackEmulator]:
    async with SlackEmulator() as emulator:
        emulator.add_channel("D_CASEY", "casey", is_im=True)
        yield emulator


def client(emu: SlackEmulator) -> AsyncWebClient:
    return AsyncWebClient(token="xoxb-test", base_url=emu.api_url)


async def refused(call: Any) -> str:
    """The error Slack answered `call` with."""
    with pytest.raises(SlackApiError) as excinfo:
        await call
    return str(excinfo.value.response["error"])


async def started(emu: SlackEmulator, text: str = "Hello", **arguments: Any) -> tuple[str, str]:
    """A stream replying in a customer's thread in #support: (thread ts, stream ts)."""
    root = emu.add_message("C_SUPPORT", "where is my order?")
    reply = await client(emu).chat_startStream(
        channel="C_SUPPORT", thread_ts=root.ts, markdown_text=text, **(FOR_CASEY | arguments)
    )
    return root.ts, str(reply["ts"])


async def test_a_stream_grows_in_place_and_stops_with_blocks_and_metadata(emu: SlackEmulator) -> None:
    web = client(emu)
    thread, ts = await started(emu, "Your order")
    assert emu.message("C_SUPPORT", ts) is not None
    await web.chat_appendStream(channel="C_SUPPORT", ts=ts, markdown_text=" ships")
    live = await web.conversations_replies(channel="C_SUPPORT", ts=thread)
    growing = [(m["text"], m.get("streaming_state")) for m in live["messages"][1:]]
    assert growing == [("Your order ships", "in_progress")]
    assert emu.stream_state("C_SUPPORT", ts) == "in_progress"

    stopped = await web.chat_stopStream(
        channel="C_SUPPORT", ts=ts, markdown_text=" today.", blocks=[FEEDBACK], metadata=METADATA
    )
    assert (stopped["ts"], stopped["message"]["text"]) == (ts, "Your order ships today.")
    replies = await web.conversations_replies(channel="C_SUPPORT", ts=thread, include_all_metadata=True)
    answer = replies["messages"][1]
    assert (answer["ts"], answer["thread_ts"], answer["streaming_state"]) == (ts, thread, "completed")
    assert (answer["metadata"], answer["blocks"]) == (METADATA, [FEEDBACK])
    assert [m.ts for m in emu.posts("C_SUPPORT", thread)] == [ts]  # one message, grown, never a second
    stream = emu.stream("C_SUPPORT", ts)
    assert stream is not None and stream.ended == "stopped"
    assert stream.texts == ["Your order", "Your order ships", "Your order ships today."]
    assert [s.state for s in stream.shown] == ["in_progress", "in_progress", "completed"]
    assert emu.stream_state("C_SUPPORT", ts) == "completed"
    assert await refused(web.chat_appendStream(channel="C_SUPPORT", ts=ts, markdown_text="!")) == (
        "message_not_in_streaming_state"
    )


async def test_a_top_level_stream_is_found_by_its_metadata_in_the_history(emu: SlackEmulator) -> None:
    web = client(emu)
    start = await web.chat_startStream(channel="C_SUPPORT", thread_ts="", markdown_text="Hi", **FOR_CASEY)
    await web.chat_stopStream(channel="C_SUPPORT", ts=start["ts"], metadata=METADATA)
    history = await web.conversations_history(channel="C_SUPPORT", include_all_metadata=True)
    assert [(m["ts"], m["text"], m["metadata"]) for m in history["messages"]] == [(start["ts"], "Hi", METADATA)]


async def test_slack_sdks_own_stream_helper_works_against_it(emu: SlackEmulator) -> None:
    """chat_stream() buffers and sends chunks: start, appends and a stop with blocks all land in one message."""
    root = emu.add_message("D_CASEY", "hi")
    streamer = await client(emu).chat_stream(channel="D_CASEY", thread_ts=root.ts, buffer_size=10)
    for word in ("Good ", "morning, ", "Casey. ", "How can I help?"):
        await streamer.append(markdown_text=word)
    await streamer.stop(blocks=[FEEDBACK])
    [answer] = emu.posts("D_CASEY", root.ts)
    assert (answer.text, answer.blocks, answer.streaming_state) == (
        "Good morning, Casey. How can I help?",
        [FEEDBACK],
        "completed",
    )
    assert [c.method for c in emu.calls] == ["chat.startStream", "chat.appendStream", "chat.stopStream"]


async def test_outside_a_dm_slack_wants_to_know_whom_the_stream_is_for(emu: SlackEmulator) -> None:
    web = client(emu)
    root = emu.add_message("C_SUPPORT", "hello")
    cases: tuple[tuple[dict[str, Any], str], ...] = (
        ({}, "missing_recipient_user_id"),
        ({"recipient_user_id": "U_CUSTOMER"}, "missing_recipient_team_id"),
        ({"recipient_team_id": TEAM_ID}, "missing_recipient_user_id"),
    )
    for arguments, error in cases:
        call = web.chat_startStream(channel="C_SUPPORT", thread_ts=root.ts, markdown_text="Hi", **arguments)
        assert await refused(call) == error
    assert emu.posts("C_SUPPORT") == [] and emu.streams() == []
    dm_root = emu.add_message("D_CASEY", "hello")
    in_dm = await web.chat_startStream(channel="D_CASEY", thread_ts=dm_root.ts, markdown_text="Hi")
    assert [s.ts for s in emu.streams()] == [in_dm["ts"]]


async def test_each_call_carries_at_most_12000_characters(emu: SlackEmulator) -> None:
    web = client(emu)
    root = emu.add_message("D_CASEY", "hello")
    over = "x" * (STREAM_TEXT_LIMIT + 1)
    assert await refused(web.chat_startStream(channel="D_CASEY", thread_ts=root.ts, markdown_text=over)) == (
        "msg_too_long"
    )
    start = await web.chat_startStream(channel="D_CASEY", thread_ts=root.ts, markdown_text="y" * STREAM_TEXT_LIMIT)
    ts = start["ts"]
    await web.chat_appendStream(channel="D_CASEY", ts=ts, markdown_text="z" * STREAM_TEXT_LIMIT)
    assert await refused(web.chat_appendStream(channel="D_CASEY", ts=ts, markdown_text=over)) == "msg_too_long"
    assert await refused(web.chat_stopStream(channel="D_CASEY", ts=ts, markdown_text=over)) == "msg_too_long"
    msg = emu.message("D_CASEY", ts)
    assert msg is not None and len(msg.text) == 2 * STREAM_TEXT_LIMIT  # refused calls add nothing
    assert emu.stream_state("D_CASEY", ts) == "in_progress"


async def test_an_expired_stream_refuses_appends_and_its_stop_and_chat_update_finishes_it(emu: SlackEmulator) -> None:
    web = client(emu)
    thread, ts = await started(emu, "Half an ans")
    # Slack's stream is the message's while it lives: an edit is refused then.
    assert await refused(web.chat_update(channel="C_SUPPORT", ts=ts, text="x")) == "streaming_state_conflict"
    emu.stream_lifetime_s = 0.0  # five minutes have passed
    assert emu.stream_state("C_SUPPORT", ts) == "expired"
    assert await refused(web.chat_appendStream(channel="C_SUPPORT", ts=ts, markdown_text="wer")) == (
        "message_not_in_streaming_state"
    )
    stop = web.chat_stopStream(channel="C_SUPPORT", ts=ts, markdown_text="wer", metadata=METADATA)
    assert await refused(stop) == "message_not_in_streaming_state"
    msg = emu.message("C_SUPPORT", ts)
    assert msg is not None and (msg.text, msg.metadata) == ("Half an ans", None)  # what the customer is left with

    await web.chat_update(channel="C_SUPPORT", ts=ts, text="Half an answer, whole.", metadata=METADATA)
    replies = await web.conversations_replies(channel="C_SUPPORT", ts=thread, include_all_metadata=True)
    answer = replies["messages"][1]
    assert (answer["text"], answer["metadata"], answer["streaming_state"]) == (
        "Half an answer, whole.",
        METADATA,
        "completed",
    )
    stream = emu.stream("C_SUPPORT", ts)
    assert stream is not None and stream.ended == "updated"
    assert stream.texts == ["Half an ans", "Half an answer, whole."]
    assert emu.stream_state("C_SUPPORT", ts) == "completed"


async def test_a_long_gap_between_appends_ends_the_stream(emu: SlackEmulator) -> None:
    web = client(emu)
    _, ts = await started(emu)
    await web.chat_appendStream(channel="C_SUPPORT", ts=ts, markdown_text=" there")
    emu.stream_idle_s = 0.0  # the model thought for minutes
    assert await refused(web.chat_appendStream(channel="C_SUPPORT", ts=ts, markdown_text="!")) == (
        "message_not_in_streaming_state"
    )
    assert emu.stream_state("C_SUPPORT", ts) == "expired"


async def test_only_a_live_stream_of_the_apps_own_takes_appends(emu: SlackEmulator) -> None:
    web = client(emu)
    human = emu.add_message("C_SUPPORT", "a customer's words")
    post = await web.chat_postMessage(channel="C_SUPPORT", text="an ordinary post")
    for ts, error in (
        (human.ts, "message_not_owned_by_app"),
        (post["ts"], "message_not_in_streaming_state"),
        ("1.000001", "message_not_found"),
    ):
        assert await refused(web.chat_appendStream(channel="C_SUPPORT", ts=ts, markdown_text="x")) == error
        assert await refused(web.chat_stopStream(channel="C_SUPPORT", ts=ts)) == error
    _, ts = await started(emu)
    assert await refused(web.chat_appendStream(channel="C_SUPPORT", ts=ts)) == "no_text"
    emu.user_stops_stream("C_SUPPORT", ts)
    assert await refused(web.chat_appendStream(channel="C_SUPPORT", ts=ts, markdown_text="x")) == "stopped_by_user"
    assert emu.stream_state("C_SUPPORT", ts) == "completed"


async def test_a_stream_keeps_to_the_kind_of_content_it_started_with(emu: SlackEmulator) -> None:
    """Opened with markdown_text it takes markdown_text; opened with chunks, chunks of every kind (the markdown ones
    too). Slack answers the other kind with `streaming_mode_mismatch` (measured, not documented)."""
    web = client(emu)
    _, text_ts = await started(emu)
    task = {"type": "task_update", "id": "t1", "title": "Looking up the order", "status": "in_progress"}
    assert await refused(web.chat_appendStream(channel="C_SUPPORT", ts=text_ts, chunks=[task])) == (
        "streaming_mode_mismatch"
    )
    root = emu.add_message("D_CASEY", "hello")
    start = await web.chat_startStream(channel="D_CASEY", thread_ts=root.ts, chunks=[task])
    ts = start["ts"]
    await web.chat_appendStream(channel="D_CASEY", ts=ts, chunks=[{"type": "markdown_text", "text": "Found it: "}])
    done = task | {"status": "complete", "details": "order 1042"}
    second = {"type": "task_update", "id": "t2", "title": "Checking the carrier", "status": "pending"}
    await web.chat_appendStream(channel="D_CASEY", ts=ts, chunks=[done, second])
    assert await refused(web.chat_appendStream(channel="D_CASEY", ts=ts, markdown_text="x")) == (
        "streaming_mode_mismatch"
    )
    await web.chat_stopStream(channel="D_CASEY", ts=ts, chunks=[{"type": "markdown_text", "text": "it ships today."}])
    msg = emu.message("D_CASEY", ts)
    assert msg is not None and msg.text == "Found it: it ships today."
    assert msg.tasks == (
        Task("t1", "Looking up the order", "complete", "order 1042"),
        Task("t2", "Checking the carrier", "pending"),
    )


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "task_update", "id": "t1", "title": "x", "status": "done"},
        {"type": "task_update", "id": "t1", "title": "x" * 257, "status": "pending"},
        {"type": "task_update", "title": "no id", "status": "pending"},
        {"type": "thinking", "text": "hmm"},
        "just text",
    ],
)
async def test_malformed_chunks_are_refused(emu: SlackEmulator, chunk: Any) -> None:
    root = emu.add_message("D_CASEY", "hello")
    call = client(emu).chat_startStream(channel="D_CASEY", thread_ts=root.ts, chunks=[chunk])
    assert await refused(call) == "invalid_chunks"
    assert emu.streams() == []


async def test_the_stop_checks_its_blocks_and_metadata_and_leaves_the_stream_open_when_refused(
    emu: SlackEmulator,
) -> None:
    web = client(emu)
    _, ts = await started(emu)
    bad_blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": ""}}]
    assert await refused(web.chat_stopStream(channel="C_SUPPORT", ts=ts, blocks=bad_blocks)) == "invalid_blocks"
    bad = {"event_payload": {"outbox_id": 7}}
    assert await refused(web.chat_stopStream(channel="C_SUPPORT", ts=ts, metadata=bad)) == "invalid_metadata_format"
    assert emu.stream_state("C_SUPPORT", ts) == "in_progress"
    await web.chat_stopStream(channel="C_SUPPORT", ts=ts, metadata=METADATA)
    assert emu.stream_state("C_SUPPORT", ts) == "completed"


async def test_faults_apply_to_the_streaming_methods(emu: SlackEmulator) -> None:
    web = client(emu)
    _, ts = await started(emu, "a")
    emu.fail_next("chat.appendStream", status=500, error="internal_error", ts=ts)
    assert await refused(web.chat_appendStream(channel="C_SUPPORT", ts=ts, markdown_text="b")) == "internal_error"
    emu.fail_next("chat.appendStream", status=500, error="internal_error", performed=True)
    assert await refused(web.chat_appendStream(channel="C_SUPPORT", ts=ts, markdown_text="c")) == "internal_error"
    emu.fail_next("chat.stopStream", error="ratelimited")
    assert await refused(web.chat_stopStream(channel="C_SUPPORT", ts=ts)) == "ratelimited"
    stream = emu.stream("C_SUPPORT", ts)
    assert stream is not None and stream.texts == ["a", "ac"]  # the refused append did nothing, the lost one did
    assert [(c.method, c.injected) for c in emu.calls if c.failed] == [
        ("chat.appendStream", True),
        ("chat.appendStream", False),
        ("chat.stopStream", True),
    ]


async def test_rate_limits_are_slacks_tiers() -> None:
    assert (SLACK_RATE_LIMITS["chat.startStream"], SLACK_RATE_LIMITS["chat.stopStream"]) == (TIER_2, TIER_2)
    assert SLACK_RATE_LIMITS["chat.appendStream"] == TIER_4
    async with SlackEmulator(rate_limits=SLACK_RATE_LIMITS) as emu:
        web = client(emu)
        root = emu.add_message("C_SUPPORT", "hello")
        starts = [
            await web.chat_startStream(channel="C_SUPPORT", thread_ts=root.ts, markdown_text="a", **FOR_CASEY)
            for _ in range(TIER_2.burst)
        ]
        with pytest.raises(SlackApiError) as limited:
            await web.chat_startStream(channel="C_SUPPORT", thread_ts=root.ts, markdown_text="a", **FOR_CASEY)
        assert limited.value.response.status_code == 429 and int(limited.value.response.headers["Retry-After"]) >= 1
        ts = starts[0]["ts"]
        for _ in range(TIER_4.burst):
            await web.chat_appendStream(channel="C_SUPPORT", ts=ts, markdown_text="b")
        assert await refused(web.chat_appendStream(channel="C_SUPPORT", ts=ts, markdown_text="b")) == "ratelimited"
        await web.chat_stopStream(channel="C_SUPPORT", ts=ts)  # a bucket of its own
        msg = emu.message("C_SUPPORT", ts)
        assert msg is not None and msg.text == "a" + "b" * TIER_4.burst


async def test_suggested_prompts_in_the_agent_messaging_experience(emu: SlackEmulator) -> None:
    web = client(emu)
    four = [{"title": f"Prompt {i}", "message": f"Say {i}"} for i in range(4)]
    await web.assistant_threads_setSuggestedPrompts(channel_id="D_CASEY", prompts=four, title="Try one")
    [shown] = emu.suggested_prompts
    assert (shown.channel, shown.title, shown.shown, len(shown.prompts)) == ("D_CASEY", "Try one", True, 4)
    for prompts in ([*four, {"title": "Prompt 4", "message": "Say 4"}], [], [{"title": "No message"}]):
        call = web.assistant_threads_setSuggestedPrompts(channel_id="D_CASEY", prompts=prompts)
        assert await refused(call) == "invalid_arguments"
    # An agent_view app naming a thread: Slack answers ok, and shows nothing.
    root = emu.add_message("D_CASEY", "hello")
    await web.assistant_threads_setSuggestedPrompts(channel_id="D_CASEY", thread_ts=root.ts, prompts=four[:1])
    assert [p.shown for p in emu.suggested_prompts] == [True, False]
    call = web.assistant_threads_setSuggestedPrompts(channel_id="D_NOPE", prompts=four[:1])
    assert await refused(call) == "channel_not_found"


async def test_thread_titles(emu: SlackEmulator) -> None:
    web = client(emu)
    root = emu.add_message("D_CASEY", "where is my order?")
    await web.assistant_threads_setTitle(channel_id="D_CASEY", thread_ts=root.ts, title="Order 1042")
    assert emu.titles == {("D_CASEY", root.ts): "Order 1042"}
    call = web.assistant_threads_setTitle(channel_id="D_CASEY", thread_ts="1.000001", title="x")
    assert await refused(call) == "invalid_thread_ts"
    assert await refused(web.assistant_threads_setTitle(channel_id="D_CASEY", thread_ts=root.ts, title="")) == (
        "invalid_arguments"
    )
