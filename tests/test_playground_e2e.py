"""The playground in a real browser: headless Chromium (Debian's package) drives the page, the page drives the
emulator, the emulator sends signed requests to the real bot, and the bot works on the real Postgres.

Offline mode, as a user without a provider key sees it: the similarity router sends the product question to
sales, "a person" escalates, and after the hand-back the sales agent answers from the catalogue again.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from playwright.async_api import Page, async_playwright, expect
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.playground.app import Playground, running_playground
from bot.settings import Settings
from fakes.openai_server import FakeOpenAI, reply, slow_words
from tests import ROOT as PROJECT_ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = PROJECT_ROOT / "test-artifacts" / "playground.png"
# Waits cover a loaded 2-core machine embedding with the local model; they are deadlines, not expectations.
WAIT_MS = 90_000
PRODUCT_QUESTION = "Is the Harrier X4 available, and what's its price?"
T = TypeVar("T")
STAFF_REPLY = "Hi Casey, Sam from Driftwing here: the Harrier X4 ships today."


PAGE_TIMEOUT = aiohttp.ClientTimeout(total=60)
"""Far above what a page request takes: a request that never answers fails in a minute, not aiohttp's five."""


def offline_settings(database_url: str) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=database_url,
        openai_api_key=None,
        openai_base_url=None,
        embeddings="local",
        max_concurrent_turns=2,
    )


def provider_settings(database_url: str, fake_llm: FakeOpenAI, **extra: Any) -> Settings:
    """With the (fake) LLM provider, which serves the embeddings too."""
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=database_url,
        openai_api_key="test-key",  # type: ignore[arg-type]
        openai_base_url=fake_llm.base_url,
        openai_model="fake-model",
        openai_max_retries=0,
        embeddings="openai",
        embeddings_model="fake-embed",
        **extra,
    )


@pytest.fixture
async def playground(database_url: str, sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[Playground]:
    async with running_playground(offline_settings(database_url), port=0) as pg:
        yield pg


async def as_role(page: Page, role: str, channel: str) -> None:
    await page.select_option("#role", role)
    await page.click(f"#channels [data-channel={channel}]")


async def write(page: Page, where: str, text: str) -> None:
    await page.fill(f"{where} textarea", text)
    await page.press(f"{where} textarea", "Enter")


@pytest.fixture
def chromium() -> Path:
    # A failure, not a skip: CI installs the browser, and a skipped browser test would hide a broken page.
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium; `make test` does)")
    return CHROMIUM


async def test_customer_sales_escalation_staff_reply_and_hand_back(chromium: Path, playground: Playground) -> None:
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1500, "height": 900})
            try:
                await scenario(page, playground)
            except BaseException:
                await screenshot(page, "playground-failure.png")  # what the page showed when it went wrong
                raise
        finally:
            await browser.close()


async def screenshot(page: Page, name: str) -> None:
    await asyncio.to_thread(SCREENSHOT.parent.mkdir, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOT.parent / name))


async def scenario(page: Page, pg: Playground) -> None:
    thread, panel = page.locator("#thread-messages"), page.locator("#conversations .conv.selected")
    await page.goto(pg.url)
    await expect(page.locator("#brain")).to_contain_text("Offline mode")

    # A customer asks about a product: triage hands the conversation to sales, which answers from the catalogue.
    await as_role(page, "customer", "C_SUPPORT")
    await write(page, "#composer", PRODUCT_QUESTION)
    await expect(thread).to_contain_text("Connecting you with Sales", timeout=WAIT_MS)
    await expect(thread).to_contain_text("Here is what I found in our help articles", timeout=WAIT_MS)
    await expect(panel.locator(".agent")).to_have_text("sales")
    await expect(panel.locator(".ev-handoff")).to_contain_text("triage → sales")
    await expect(panel.locator(".ev-tool", has_text="search_knowledge")).to_contain_text("✓")

    # ...and asks for a person: the conversation waits for a human, and a case card appears for staff.
    await write(page, "#thread-composer", "Thanks, but can I talk to a person, please?")
    await expect(thread).to_contain_text("I've asked a colleague to join", timeout=WAIT_MS)
    await expect(panel.locator(".mode")).to_have_text("awaiting human", timeout=WAIT_MS)
    await expect(panel.locator(".esc-status")).to_contain_text("open")

    # Staff: the case card, claimed with its button, then a reply in the case thread.
    await as_role(page, "staff", "C_STAFF")
    case = page.locator("#messages .msg", has=page.locator(".b-header", has_text="Case #"))
    await expect(case).to_contain_text("Casey Customer", timeout=WAIT_MS)
    await expect(case).to_contain_text("sales agent")
    await case.locator("button[data-action-id=case_claim]").click()
    await expect(case).to_contain_text("Claimed by @Sam Staff", timeout=WAIT_MS)
    await case.locator(".replies-link").click()
    await expect(panel.locator(".esc-status")).to_contain_text("claimed", timeout=WAIT_MS)
    await expect(panel).to_contain_text("owner Sam Staff")
    await write(page, "#thread-composer", STAFF_REPLY)
    await expect(panel.locator(".mode")).to_have_text("human", timeout=WAIT_MS)
    await expect(thread).to_contain_text("Casey Customer: Thanks, but can I talk to a person")  # the summary
    await expect(thread.locator(".msg", has_text=STAFF_REPLY).locator(".name")).to_have_text("Sam Staff")
    await screenshot(page, "playground-staff.png")

    # The case's permalink leads to the customer's thread, as in Slack.
    await case.locator("a", has_text="open the thread").click()
    await expect(page.locator("#channel-name")).to_have_text("# support")
    await expect(thread.locator(".msg").first).to_contain_text(PRODUCT_QUESTION)

    # The customer sees the reply in their thread, under the colleague's name.
    await as_role(page, "customer", "C_SUPPORT")
    await page.locator("#messages .msg", has_text=PRODUCT_QUESTION).locator(".replies-link").click()
    relayed = thread.locator(".msg", has_text=STAFF_REPLY)
    await expect(relayed.locator(".name")).to_have_text("Sam Staff (Driftwing team)", timeout=WAIT_MS)

    # Staff hand the conversation back to the bot.
    await as_role(page, "staff", "C_STAFF")
    await case.locator("button[data-action-id=case_hand_back]").click()
    await expect(case).to_contain_text("Handed back to the bot by @Sam Staff", timeout=WAIT_MS)
    await expect(case.locator("button")).to_have_count(0)

    # An admin's slash command, answered to the admin alone; a colleague who is no admin is refused.
    await as_role(page, "admin", "C_STAFF")
    await write(page, "#composer", "/support conversations")
    admin_answer = page.locator("#messages .msg.ephemeral")
    await expect(admin_answer).to_contain_text("Only visible to you", timeout=WAIT_MS)
    await expect(admin_answer).to_contain_text("Conversations: recent")
    await expect(admin_answer).to_contain_text("sales")
    await as_role(page, "staff", "C_STAFF")
    await expect(page.locator("#messages .msg.ephemeral")).to_have_count(0)
    await write(page, "#composer", "/support pause")
    await expect(page.locator("#messages .msg.ephemeral")).to_contain_text(
        "only for the people who run this bot", timeout=WAIT_MS
    )
    await expect(page.locator("#messages .msg.ephemeral")).to_have_count(1)  # the admin's answer is not here

    # The customer writes again, and the bot answers again.
    await as_role(page, "customer", "C_SUPPORT")
    await page.locator("#messages .msg", has_text=PRODUCT_QUESTION).locator(".replies-link").click()
    await expect(thread).to_contain_text("You're back with our assistant", timeout=WAIT_MS)
    await write(page, "#thread-composer", "Great. How long does the Harrier X4 fly on one battery?")
    answers = thread.locator(".msg.from-bot", has_text="Here is what I found in our help articles")
    await expect(answers).to_have_count(2, timeout=WAIT_MS)
    await expect(panel.locator(".mode")).to_have_text("bot")
    await expect(panel.locator(".esc-status")).to_contain_text("handed back")
    await expect(thread.locator(".msg").last).to_contain_text(re.compile(r"Source: .*Harrier X4"))

    await expect(panel.locator(".ev-escalation", has_text="handed back by Sam Staff")).to_have_count(1)
    # Tall enough for the whole thread: the screenshot shows the conversation from question to last answer.
    await page.set_viewport_size({"width": 1500, "height": 2600})
    await screenshot(page, SCREENSHOT.name)

    # What the page did reached the bot as signed Slack requests (events, clicks, slash commands), all accepted.
    kinds = {"command" if "command" in d.payload else d.payload.get("type") for d in pg.slack.deliveries}
    assert kinds == {"event_callback", "block_actions", "command"}
    assert all(d.result is not None and d.result.status == 200 for d in pg.slack.deliveries)


async def until(fetch: Callable[[], Awaitable[T]], done: Callable[[T], bool], what: str) -> T:
    for _ in range(1200):
        value = await fetch()
        if done(value):
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}; last value {value!r}")


async def test_json_endpoints_with_an_llm_provider(
    database_url: str, sessions: async_sessionmaker[AsyncSession], fake_llm: FakeOpenAI
) -> None:
    """The page's API without a browser, with a (fake) LLM provider: state, validation, a conversation in the
    side panel, and a slash command's answer shown only to the user who typed it."""
    settings = provider_settings(database_url, fake_llm, case_summary="transcript")
    fake_llm.script(reply("It is $899."))
    async with (
        running_playground(settings, port=0) as pg,
        aiohttp.ClientSession(base_url=pg.url, timeout=PAGE_TIMEOUT) as http,
    ):

        async def get(path: str, **params: str) -> Any:
            async with http.get(path, params=params) as r:
                assert r.status == 200, await r.text()
                return await r.json()

        async def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
            async with http.post(path, json=body) as r:
                return r.status, await r.json() if r.status == 200 else await r.text()

        async with http.get("/") as r:
            assert r.status == 200 and "playground" in await r.text()
        async with http.get("/static/app.js") as r:
            assert r.status == 200
        workspace = await get("/api/workspace", user="U_ADMIN")
        assert workspace["offline"] is False
        assert f"LLM provider: fake-model at {fake_llm.base_url}" in workspace["brain"]
        assert workspace["roles"] == {"customer": "U_CUSTOMER", "staff": "U_STAFF", "admin": "U_ADMIN"}
        assert workspace["users"]["U_ADMIN"]["is_admin"] is True
        assert {c["id"] for c in workspace["channels"]} == {"C_SUPPORT", "C_STAFF"}
        assert await get("/api/conversations") == []

        assert (await post("/api/say", {"user": "U_NOBODY", "channel": "C_SUPPORT", "text": "hi"}))[0] == 400
        assert (await post("/api/say", {"user": "U_CUSTOMER", "channel": "C_SUPPORT", "text": ""}))[0] == 400
        assert (await post("/api/command", {"user": "U_ADMIN", "channel": "C_STAFF", "command": "support"}))[0] == 400

        status, said = await post(
            "/api/say", {"user": "U_CUSTOMER", "channel": "C_SUPPORT", "text": "What does the Harrier X4 cost?"}
        )
        assert status == 200 and said["status"] == 200
        conversations = await until(
            lambda: get("/api/conversations"), lambda cs: bool(cs) and cs[0]["llm_calls"] == 1, "the model's call"
        )
        [conversation] = conversations
        assert (conversation["channel"], conversation["thread_ts"]) == ("C_SUPPORT", said["ts"])
        assert (conversation["mode"], conversation["active_agent"]) == ("bot", "sales")
        # The router sent the price question to sales without a call, and sales searched its catalogue for it
        # before its first call (issue 16: answer in one call).
        [handoff] = conversation["handoffs"]
        assert (handoff["from_agent"], handoff["to_agent"]) == ("triage", "sales")
        assert handoff["reason"].startswith("router ")
        assert [(t["tool"], t["ok"]) for t in conversation["tools"]] == [("search_knowledge", True)]
        thread = await until(
            lambda: get("/api/workspace", user="U_CUSTOMER"),
            lambda w: any(m["text"] == "It is $899." for m in w["messages"]["C_SUPPORT"]),
            "the answer in the thread",
        )
        assert all(m["thread_ts"] == said["ts"] for m in thread["messages"]["C_SUPPORT"][1:])

        status, answer = await post(
            "/api/command", {"user": "U_ADMIN", "channel": "C_STAFF", "command": "/support", "text": "help"}
        )
        assert status == 200
        admin_sees = (
            await until(
                lambda: get("/api/workspace", user="U_ADMIN"), lambda w: bool(w["ephemerals"]), "the admin's answer"
            )
        )["ephemerals"]
        staff_sees = (await get("/api/workspace", user="U_STAFF"))["ephemerals"]
    # The slash command's answer came through the response_url, and only the admin who typed it sees it.
    assert answer["status"] == 200 and staff_sees == []
    assert [(e["source"], e["channel"]) for e in admin_sees] == [("/support", "C_STAFF")]
    assert "/support status" in json.dumps(admin_sees[0]["blocks"])


async def test_a_streamed_answer_grows_in_the_page(
    chromium: Path, database_url: str, sessions: async_sessionmaker[AsyncSession], fake_llm: FakeOpenAI
) -> None:
    """With a provider that writes slowly, the customer's thread shows the answer growing (the page polls the
    emulator's streamed message), then the whole answer once."""
    answer = " ".join(f"word{i}" for i in range(1, 31)) + "."
    fake_llm.rule = lambda request: slow_words(answer, first_s=0.2, each_s=0.15)
    settings = provider_settings(database_url, fake_llm, router_min_score="off")
    async with running_playground(settings, port=0) as pg, async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1500, "height": 900})
            thread = page.locator("#thread-messages")
            await page.goto(pg.url)
            await as_role(page, "customer", "C_SUPPORT")
            await write(page, "#composer", "Tell me everything, slowly.")
            await expect(thread).to_contain_text("word3", timeout=WAIT_MS)
            partial = await thread.inner_text()
            assert "word30." not in partial  # seen while it was still being written
            await screenshot(page, "playground-streaming.png")
            await expect(thread).to_contain_text("word30.", timeout=WAIT_MS)
            await page.wait_for_timeout(1500)  # a second copy would show by now
            assert (await thread.inner_text()).count("word30.") == 1
        finally:
            await browser.close()
