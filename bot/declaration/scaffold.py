"""`python -m bot init`: a commented starter for a new company, which runs as it is (`python -m bot run` in that
folder picks up its helpdesk.yaml) and says in comments how to grow it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

DECLARATION = """\
# {name}'s helpdesk: who answers your customers, what they know and which of your systems they may use.
# Check it with `python -m bot check`, try it with `python -m bot playground` (or `chat`), and measure a change
# with `python -m bot eval cases.yaml` before you deploy it. Reference: docs/declaration.md.
version: 1

brand:
  name: {name}
  # staff_signature: " ({name} team)"   # after a colleague's name on what they write to customers
  # teams_app_name: {name} Helpdesk     # the Teams app's name (30 characters at most)

# Who new conversations start with.
entry: frontdesk

# Who `chat`, the playground and `eval` write as (your tools see this person as the asker).
test_customer:
  name: Casey Customer
  email: casey@example.com

# Added to every agent's instructions. Placeholders: {{brand}}, {{writer}} (the writer's profile name),
# {{customer_name}} (the name they gave) and {{context[key]}} (anything your tools stored); a literal brace is {{{{.
instructions: >-
  Be warm, brief and concrete. Never invent facts, prices or policies: use your tools and documents, or say you
  don't know. If the customer asks for a person, or is upset, call escalate_to_human.

# Your language (en, es, de, fr, pt): the bot's own words until a customer's language is known, and what staff
# read. Customers are answered in theirs.
language: en

# Customer-facing texts (every one has a default in each language; these are the ones you are most likely to
# change). A name is your words in `language`; a block under a language's code holds another language's:
#   es: {{escalation_message: "Un compañero de {name} te escribe enseguida."}}
texts:
  escalation_message: "I've asked a colleague from {name} to join. A person will reply here shortly."
  off_hours_message: "Our team is available {{hours}}; a colleague will reply as soon as they are back."
  offline_greeting: "Hello! I'm {name}'s assistant. Ask me anything about our products or your account."

# Your documents, one folder per collection (Markdown, HTML, text, PDF, DOCX): replace knowledge/help/returns.md
# with your own help articles. Each collection is read at the first start;
# later changes go in with `python -m bot kb ingest knowledge/help --collection help`.
knowledge:
  help: knowledge/help

# Your tools. Python: "module:function" (an async function, or one decorated with agents.tools.function_tool;
# the module is looked for beside this file). acts: true makes the agent ask the customer's yes first.
tools:
  order_status: {{python: "tools:order_status"}}
  # An HTTP endpoint of yours. Each call carries the verified asker in signed headers (X-Helpdesk-Asker,
  # X-Helpdesk-Signature; see docs/declaration.md), never in the model's arguments.
  # cancel_order:
  #   url: https://api.example.com/orders/{{order_id}}/cancel
  #   method: POST
  #   description: Cancel one of the customer's orders.
  #   parameters: {{type: object, properties: {{order_id: {{type: string}}}}, required: [order_id]}}
  #   headers: {{Authorization: "Bearer ${{SHOP_API_TOKEN}}"}}
  #   acts: true

# http:
#   signing_secret: ${{HELPDESK_TOOLS_SECRET}}   # the shared secret your endpoints check signatures with
#   allowed_hosts: []                           # private addresses the bot may call (none by default)

# MCP servers, in the shape other MCP clients use (paste a block from theirs). Name them in an agent's tools as
# mcp:NAME (all of its tools) or mcp:NAME/TOOL.
# mcpServers:
#   shop:
#     command: npx
#     args: ["-y", "@your-company/shop-mcp"]
#     env: {{SHOP_TOKEN: "${{SHOP_TOKEN}}"}}
#   billing:
#     url: https://mcp.example.com/mcp
#     headers: {{Authorization: "Bearer ${{BILLING_MCP_TOKEN}}"}}

agents:
  frontdesk:
    title: the front desk
    description: Greets customers, answers simple questions and routes them to the right colleague.
    instructions: >-
      You are the front desk of {{brand}}. Greet the customer and learn what they need. Questions about orders,
      deliveries, returns and how our products work go to support. When the customer tells you their name,
      record it with record_customer_name.
    tools: [record_customer_name]
    handoffs: [support]
    # Messages like these are routed without a model call (write a few dozen of your customers' own words).
    examples: ["hello", "hi there", "thanks, bye", "who are you?"]

  support:
    title: Support
    description: Orders, deliveries, returns and how our products work.
    instructions: >-
      You are Support at {{brand}}. Answer from the documents (search_knowledge) and look orders up with
      order_status before you say anything about one. For anything else, transfer back to the front desk.
    tools: [order_status]
    knowledge: [help]
    handoffs: [frontdesk]
    examples: ["where is my order?", "how do I return something?", "my parcel has not arrived"]
"""

TOOLS = '''\
"""{name}'s own tools, named in helpdesk.yaml as "tools:<function>".

A tool is an async function with typed arguments (the model fills them; their docs come from Field descriptions).
Its first argument, typed ToolContext, is filled by the bot: `ctx.asker` is the person asking as the platform vouched
for them (their verified email, when there is one). Decide what they may see from it, never from the arguments.
"""

from typing import Annotated

from pydantic import Field

from agents.tools import ToolContext

ORDERS = {{"A-1001": ("casey@example.com", "shipped on Monday, arriving Thursday")}}


async def order_status(ctx: ToolContext, order_id: Annotated[str, Field(description="Like A-1001")]) -> str:
    """The customer's order: where it is."""
    order = ORDERS.get(order_id.strip().upper())
    email = ctx.asker.email if ctx.asker else None
    if order is None or email is None or order[0] != email.casefold():
        return f"No order {{order_id!r}} on the account of the person asking."
    return f"Order {{order_id}}: {{order[1]}}."
'''

HELP = """\
# Returns

Any item may be returned within 45 days of delivery for a full refund, if it is unused and in its box.

Start a return from your order's page. Refunds reach the original payment method within 5 working days.
"""

CASES = """\
# Your customers' questions and what a good answer holds: `python -m bot eval cases.yaml`.
cases:
  - name: returns window
    messages: ["How long do I have to return something?"]
    expect: {agent: support, contains: ["45 days"], cites: true}
  - name: order status
    messages: ["Where is my order A-1001?"]
    expect: {agent: support, contains: ["Thursday"]}
  - name: asks for a person
    messages: ["I want to talk to a human"]
    expect: {escalate: true}
"""


def add_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    init = sub.add_parser("init", help="write a commented starter helpdesk.yaml (and tools, documents, eval cases)")
    init.add_argument("folder", nargs="?", type=Path, default=Path("."), help="where to write it (default: here)")
    init.add_argument("--name", default="Acme", help="your company's name, as customers see it (default: Acme)")
    check = sub.add_parser(
        "check", help="check the declaration (HELPDESK_FILE or ./helpdesk.yaml) and say what it runs"
    )
    check.add_argument("file", nargs="?", type=Path, help="the declaration to check (default: the one the bot runs)")


def files(name: str) -> dict[str, str]:
    return {
        "helpdesk.yaml": DECLARATION.format(name=name),
        "tools.py": TOOLS.format(name=name),
        "knowledge/help/returns.md": HELP.format(name=name),
        "cases.yaml": CASES,
    }


def run(args: argparse.Namespace) -> int:
    name = " ".join(str(args.name).split())
    if not name or re.search(r"[\"\\{}\n]", name):
        print("--name: a company name without quotes, braces or backslashes", flush=True)
        return 2
    folder: Path = args.folder
    written = files(name)
    taken = [path for path in written if (folder / path).exists()]
    if taken:
        print(f"Nothing written: {', '.join(str(folder / p) for p in taken)} already exist(s).")
        return 1
    for relative, text in written.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    shown = "" if folder == Path(".") else f"cd {folder} && "
    print(
        f"Wrote {', '.join(written)} in {folder.resolve()}.\n"
        f"Next: {shown}helpdesk-bot check, then {shown}helpdesk-bot playground (or chat; or python -m bot ...)."
    )
    return 0
