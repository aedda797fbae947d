"""`python -m bot eval`: YAML conversations through the real engine (a subprocess, the real database, the fake LLM
over HTTP), the report's numbers, a bad file, and the diff against a previous run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from fakes.openai_server import FakeOpenAI, reply, tool_call, tools
from harness.bot import run_bot
from tests import ROOT

CASES = """\
prices:
  fake-model: {input: 1.0, output: 2.0}
cases:
  - name: order status
    messages: ["Where is DW-1007?"]
    expect: {agent: support, contains: [shipped], cites: true}
  - name: battery question
    messages: ["Which battery fits the Osprey?"]
    expect: {agent: support}
  - name: wants a person
    messages: ["Let me talk to a human."]
    expect: {escalate: true}
  - name: angry customer
    messages: ["This is useless.", "Still useless."]
    expect: {escalate: true, contains: [sorry]}
"""


def script(fake: FakeOpenAI, *, cite: bool, battery_to: str) -> None:
    fake.script(
        tools(tool_call("transfer_to_support", {"reason": "order"})),
        reply("Your order has shipped" + (", see [1] Shipping." if cite else ".")),
        tools(tool_call(f"transfer_to_{battery_to}", {"reason": "battery"})),
        reply("The LB-6800P fits."),
        tools(tool_call("escalate_to_human", {"reason": "asked for a person"})),
        reply("I'm sorry to hear that."),
        reply("I'm sorry, let me try again."),
    )


def prompt_tokens(fake: FakeOpenAI) -> int:
    """Prompt tokens as the fake counts them: a quarter of each request's characters (its tools only when it has
    some: a summary's request has none)."""
    return sum(
        math.ceil(len(json.dumps(r.messages) + (json.dumps(r.tools) if r.tools else "")) / 4) for r in fake.requests
    )


def env(database_url: str, fake: FakeOpenAI) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url,
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_MODEL": "fake-model",
        "EMBEDDINGS": "openai",
    }


async def run_eval(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, *args: str, cite: bool, battery_to: str
) -> tuple[int, str, str]:
    (tmp_path / "cases.yaml").write_text(CASES)
    script(fake, cite=cite, battery_to=battery_to)
    return await run_bot("eval", "cases.yaml", *args, env=env(database_url, fake), cwd=tmp_path, wait_s=300)


async def test_eval_reports_routing_escalation_citations_tokens_and_cost(
    database_url: str, fake_llm: FakeOpenAI, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    code, out, err = await run_eval(
        tmp_path, database_url, fake_llm, "--out", "run1.json", cite=True, battery_to="sales"
    )
    # Two cases fail their expectations: the report is written and printed all the same, and the exit says so.
    assert code == 1 and err.strip().endswith("2 of 4 cases failed: battery question, angry customer"), err
    result = json.loads((tmp_path / "run1.json").read_text())
    s = result["summary"]
    assert (s["cases"], s["messages"], s["llm_calls"]) == (4, 5, 7) and fake_llm.calls == 7
    assert s["routing_accuracy"] == 0.5  # support answered the order, sales (not support) the battery question
    assert (s["escalation_precision"], s["escalation_recall"]) == (1.0, 0.5)  # the angry customer was not escalated
    assert s["citation_rate"] == 1.0 and s["contains_rate"] == 1.0
    cases = {c["name"]: c for c in result["cases"]}
    assert cases["order status"]["checks"] == {"routing": True, "escalation": True, "contains": True, "citation": True}
    assert cases["battery question"]["agent"] == "sales" and cases["battery question"]["checks"]["routing"] is False
    assert cases["wants a person"]["escalated"] and cases["wants a person"]["checks"]["escalation"]
    angry = cases["angry customer"]
    assert angry["checks"]["contains"] and not angry["checks"]["escalation"] and angry["messages"] == 2
    prompt = prompt_tokens(fake_llm)
    assert s["prompt_tokens"] == prompt and s["prompt_tokens_per_message"] == round(prompt / 5, 4)
    completion = s["completion_tokens"]
    assert s["cost_usd"] == round((prompt * 1.0 + completion * 2.0) / 1e6, 6)
    assert s["cost_per_message"] == round((prompt * 1.0 + completion * 2.0) / 1e6 / 5, 6)
    assert "routing accuracy      0.50" in out and "recall 0.50" in out and "FAIL" in out
    # The run's conversations are gone: nothing mixes with real ones.
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(m.Conversation)) == 0


async def test_eval_diff_against_the_previous_run(
    database_url: str, fake_llm: FakeOpenAI, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    code, _, err = await run_eval(
        tmp_path, database_url, fake_llm, "--out", "before.json", cite=True, battery_to="sales"
    )
    assert code == 1, err
    # The new model routes the battery question right but cites no more; and it is free.
    args = ("--out", "after.json", "--previous", "before.json", "--price", "fake-model=0,0")
    code, out, err = await run_eval(tmp_path, database_url, fake_llm, *args, cite=False, battery_to="support")
    assert code == 1 and "2 of 4 cases failed: order status, angry customer" in err, err
    diff = json.loads((tmp_path / "after.json").read_text())["diff"]
    assert diff["better"] == [{"case": "battery question", "check": "routing"}]
    assert diff["worse"] == [{"case": "order status", "check": "citation"}]
    assert diff["overall"]["routing_accuracy"] == {"previous": 0.5, "current": 1.0, "change": "better"}
    assert diff["overall"]["citation_rate"] == {"previous": 1.0, "current": 0.0, "change": "worse"}
    assert diff["overall"]["cost_per_message"]["change"] == "better"  # the flag's price (free) beat the file's
    assert "better: battery question (routing)" in out and "worse: order status (citation)" in out


async def test_eval_exits_0_only_when_every_case_meets_its_expectations(
    database_url: str, fake_llm: FakeOpenAI, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    (tmp_path / "cases.yaml").write_text(
        "cases:\n"
        "  - name: order status\n"
        '    messages: ["Where is DW-1007?"]\n'
        "    expect: {agent: support, contains: [shipped], cites: true}\n"
    )
    fake_llm.script(
        tools(tool_call("transfer_to_support", {"reason": "order"})), reply("Your order has shipped, see [1] Shipping.")
    )
    code, out, err = await run_bot("eval", "cases.yaml", env=env(database_url, fake_llm), cwd=tmp_path, wait_s=300)
    assert code == 0 and "FAIL" not in out and "failed" not in err, err


@pytest.mark.services
async def test_a_bad_file_names_the_line_and_field_and_exits_2(tmp_path: Path) -> None:
    bad = CASES.replace("expect: {agent: support}", "expect: {agent: support, escalte: true}")
    (tmp_path / "bad.yaml").write_text(bad)
    code, out, err = await run_bot("eval", "bad.yaml", env={}, cwd=tmp_path)
    assert code == 2 and out == ""
    assert "bad.yaml:9: cases.1.expect.escalte: Extra inputs are not permitted" in err

    (tmp_path / "empty.yaml").write_text("cases:\n  - name: x\n    messages: []\n")
    code, _, err = await run_bot("eval", "empty.yaml", env={}, cwd=tmp_path)
    assert code == 2 and "empty.yaml:3: cases.0.messages: List should have at least 1 item" in err

    (tmp_path / "broken.yaml").write_text("cases:\n  - name: [x\n")
    code, _, err = await run_bot("eval", "broken.yaml", env={}, cwd=tmp_path)
    assert code == 2 and "broken.yaml:3: not valid YAML" in err


def test_the_shipped_example_is_valid() -> None:
    from bot.eval import load

    spec = load(ROOT / "bot" / "examples" / "driftwing" / "eval.yaml")
    assert 10 <= len(spec.cases) <= 15
    agents = {c.expect.agent for c in spec.cases}
    assert {"sales", "support"} <= agents
    assert any(c.expect.escalate for c in spec.cases) and any(c.expect.cites for c in spec.cases)
    assert any("refund" in " ".join(c.messages).lower() for c in spec.cases)


async def test_the_running_summarys_calls_count_in_the_tokens_and_the_cost(
    database_url: str, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    """HISTORY_TOKENS low: the angry customer's second message makes a summary of the first turn. Its call is a
    provider's call like the agents': it counts in the tokens and the cost, and is reported apart from them."""
    (tmp_path / "cases.yaml").write_text(CASES)
    script(fake_llm, cite=True, battery_to="support")
    fake_llm.script(reply("The customer called the bot useless; the agent apologised."))
    run_env = env(database_url, fake_llm) | {"HISTORY_TOKENS": "1"}
    code, out, err = await run_bot("eval", "cases.yaml", "--out", "run.json", env=run_env, cwd=tmp_path, wait_s=300)
    assert code == 1 and "1 of 4 cases failed: angry customer" in err, err
    s = json.loads((tmp_path / "run.json").read_text())["summary"]
    assert fake_llm.calls == 8 and (s["llm_calls"], s["summary_calls"]) == (7, 1)
    assert "summary" in json.dumps(fake_llm.requests[-1].messages).casefold()
    assert s["prompt_tokens"] == prompt_tokens(fake_llm)
    assert s["cost_usd"] == round((s["prompt_tokens"] * 1.0 + s["completion_tokens"] * 2.0) / 1e6, 6)
    assert "running summaries     1 calls" in out
