"""The engine's SQL (`agents.conversations`): storing a message, a turn's first statement (claim or fence the lease,
count the attempt, read what the turn needs) and its last (fence, write what the turn produced, release the
lease). Statements built once, at import (`agents.db.statements`); the inbox includes STORE_MESSAGE in its own
statement."""

from __future__ import annotations

from agents import leases, limits
from agents.db.deliveries import queued_sql
from agents.db.notify import TURNS
from agents.db.statements import Statement
from agents.summary import UNSUMMARISED, VALID_SUMMARY

STORE_MESSAGE = """
found AS (SELECT id FROM conversations WHERE key = :key FOR KEY SHARE),
created AS (
    INSERT INTO conversations (key, active_agent)
    SELECT CAST(:key AS text), CAST(:entry AS text) WHERE {guard} AND NOT EXISTS (SELECT FROM found)
    ON CONFLICT (key) DO UPDATE SET active_agent = conversations.active_agent
    RETURNING id
),
conversation AS (SELECT id FROM found UNION ALL SELECT id FROM created),
stored AS (
    INSERT INTO inbound (conversation_id, text, author, identity, external_id, order_key, kind, files)
    SELECT id, CAST(:text AS text), CAST(:author AS text), CAST(:identity AS jsonb), CAST(:external_id AS text),
           CAST(:order_key AS text), CAST(:kind AS text), CAST(:files AS jsonb)
    FROM conversation WHERE {guard}
    ON CONFLICT (conversation_id, external_id) DO NOTHING
    RETURNING id, conversation_id
)"""
"""Storing a message, as common table expressions that another statement can include (the Slack inbox stores
an event id and its message in one statement), written only where `{guard}` holds: `conversation` yields the
conversation's id, `stored` the new message's (none for a duplicate external_id). The existing row is read
first, FOR KEY SHARE: storing waits only on a transaction that locks it FOR UPDATE (a forget renaming it,
`agents.personal`, after which it is no longer under the key and a fresh conversation starts; a retention batch);
two first messages of one conversation at once meet in the upsert, whose no-op update of a non-key column returns
the row without the key lock that would hold up other inserts."""

SUBMIT = Statement(
    f"WITH {STORE_MESSAGE.format(guard='true')} "
    "SELECT (SELECT id FROM conversation) AS conversation_id, (SELECT id FROM stored) AS inbound_id"
)

_START_TEMPLATE = """
WITH lease AS (
    UPDATE conversations SET {lease_set}
    WHERE id = :id AND {lease_where}
    RETURNING key, mode, active_agent, context, history_from, summary, summary_through, lease_token, language
), next AS (
    UPDATE inbound SET attempts = attempts + CASE WHEN id = ANY(CAST(:uncounted AS bigint[])) THEN 0 ELSE 1 END
    WHERE id = (
        SELECT id FROM inbound WHERE conversation_id = :id AND processed_at IS NULL
        ORDER BY order_key ASC NULLS LAST, id LIMIT 1
    ) AND processed_at IS NULL AND EXISTS (SELECT FROM lease)
    RETURNING id, kind, text, author, identity, external_id, attempts, deleted_at IS NOT NULL AS deleted, files
)
SELECT l.lease_token, l.key, l.mode, l.active_agent, l.context, {summary} AS summary, l.language,
       n.id AS inbound_id, n.kind, n.text, n.author, n.identity, n.external_id, n.attempts, n.deleted, n.files,
       EXISTS (SELECT FROM pauses p WHERE l.key LIKE p.scope) AS paused,
       c.id AS case_id, c.claimed_by, c.first_response_at IS NOT NULL AS answered,
       CASE WHEN n.id IS NOT NULL THEN (
           SELECT jsonb_agg(to_jsonb(h) ORDER BY h.id) FROM (
               SELECT id, role, agent, author, author_name, content, tool_calls, tool_call_id, name FROM messages
               WHERE conversation_id = :id AND {unsummarised}
               ORDER BY id DESC LIMIT :history
           ) h
       ) END AS history,{limits_columns}
FROM lease l
LEFT JOIN next n ON true
LEFT JOIN LATERAL (
    SELECT id, claimed_by, first_response_at FROM escalations
    WHERE conversation_id = :id AND status IN ('open', 'claimed') ORDER BY id DESC LIMIT 1
) c ON true{limits_joins}
"""
_LIMITS = {
    "limits_columns": limits.READ_COLUMNS,
    "limits_joins": limits.READ_JOINS,
    "summary": VALID_SUMMARY.format(c="l"),
    "unsummarised": UNSUMMARISED.format(c="l"),
}
START = Statement(_START_TEMPLATE.format(lease_set=leases.RENEW_SET, lease_where=leases.HELD, **_LIMITS))
START_CLAIMING = Statement(_START_TEMPLATE.format(lease_set=leases.CLAIM_SET, lease_where=leases.FREE, **_LIMITS))

FINISH = Statement(
    """
WITH others AS (
    SELECT EXISTS (
        SELECT FROM inbound WHERE conversation_id = :id AND processed_at IS NULL AND id <> :inbound_id
    ) AS waiting
), more AS (
    SELECT waiting AND CAST(:keep AS boolean) AS waiting FROM others
), conv AS (
    UPDATE conversations
    SET mode = :mode, active_agent = :agent, context = CAST(:context AS jsonb), updated_at = now(),
        language = coalesce(CAST(:language AS text), language),
        lease_owner = CASE WHEN (SELECT waiting FROM more) THEN lease_owner END,
        lease_until = CASE WHEN (SELECT waiting FROM more) THEN now() + make_interval(secs => :ttl) ELSE now() END
    WHERE id = :id AND lease_token = :token AND lease_owner = :owner
    RETURNING id
), opened AS (
    INSERT INTO escalations (
        conversation_id, inbound_id, reason, trigger, agent, customer, status, claimed_by, claimed_at,
        first_response_at
    )
    -- Opened as `:case_status` when a colleague opens it for themselves (claimed, answered), else open.
    SELECT CAST(:id AS bigint), CAST(:inbound_id AS bigint), CAST(:reason AS text), CAST(:trigger AS text),
           CAST(:agent AS text), CAST(:customer AS text), coalesce(CAST(:case_status AS text), 'open'),
           CAST(:claimed_by AS text), CASE WHEN CAST(:claimed_by AS text) IS NOT NULL THEN now() END,
           CASE WHEN CAST(:case_status AS text) IS NOT NULL THEN now() END
    FROM conv WHERE CAST(:escalate AS boolean)
    RETURNING id
), changed AS (
    UPDATE escalations
    SET status = :case_status, claimed_by = :claimed_by,
        claimed_at = CASE WHEN claimed_by IS NULL AND CAST(:claimed_by AS text) IS NOT NULL THEN now()
                          ELSE claimed_at END,
        first_response_at = coalesce(first_response_at, now())
    WHERE id = :case_id AND EXISTS (SELECT FROM conv)
), done AS (
    UPDATE inbound
    SET processed_at = now(),
        outcome = CASE WHEN EXISTS (SELECT FROM opened)
                  THEN jsonb_set(CAST(:outcome AS jsonb), '{escalation_id}', (SELECT to_jsonb(id) FROM opened))
                  ELSE CAST(:outcome AS jsonb) END
    WHERE id = :inbound_id AND EXISTS (SELECT FROM conv)
), transcript AS (
    INSERT INTO messages (
        conversation_id, inbound_id, role, agent, author, author_name, content, tool_calls, tool_call_id, name
    )
    SELECT CAST(:id AS bigint), CAST(:inbound_id AS bigint),
           x.role, x.agent, x.author, x.author_name,
           CASE WHEN x.role = 'staff' THEN i.text ELSE x.content END, x.tool_calls, x.tool_call_id, x.name
    FROM ROWS FROM (jsonb_to_recordset(CAST(:messages AS jsonb)) AS (
        role text, agent text, author text, author_name text, content text, tool_calls jsonb, tool_call_id text,
        name text
    )) WITH ORDINALITY AS x(role, agent, author, author_name, content, tool_calls, tool_call_id, name, n), conv,
    inbound i
    -- A colleague's words as they are now: edited, or deleted (left out), after the turn read them.
    WHERE i.id = :inbound_id AND NOT (x.role = 'staff' AND i.deleted_at IS NOT NULL)
    ORDER BY x.n
), handoffs AS (
    INSERT INTO handoffs (conversation_id, inbound_id, from_agent, to_agent, reason)
    SELECT CAST(:id AS bigint), CAST(:inbound_id AS bigint), x.from_agent, x.to_agent, x.reason
    FROM jsonb_to_recordset(CAST(:handoffs AS jsonb)) AS x(from_agent text, to_agent text, reason text), conv
), tools AS (
    INSERT INTO tool_runs (
        conversation_id, inbound_id, agent, call_id, tool, arguments, ok, output, duration_ms, source
    )
    SELECT CAST(:id AS bigint), CAST(:inbound_id AS bigint),
           x.agent, x.call_id, x.tool, x.arguments, x.ok, x.output, x.duration_ms, x.source
    FROM jsonb_to_recordset(CAST(:tools AS jsonb)) AS x(
        agent text, call_id text, tool text, arguments text, ok boolean, output text, duration_ms float8, source text
    ), conv
), calls AS (
    INSERT INTO llm_calls (
        conversation_id, inbound_id, agent, model, ok, error, prompt_tokens, completion_tokens, cached_tokens,
        latency_ms
    )
    SELECT CAST(:id AS bigint), CAST(:inbound_id AS bigint),
           x.agent, x.model, x.ok, x.error, x.prompt_tokens, x.completion_tokens, x.cached_tokens, x.latency_ms
    FROM jsonb_to_recordset(CAST(:llm_calls AS jsonb)) AS x(
        agent text, model text, ok boolean, error text, prompt_tokens int, completion_tokens int,
        cached_tokens int, latency_ms float8
    ), conv
), queued AS (
    -- The host's deliveries known before the commit (`KnownOwed.owed`); "[]" when it writes its own.
    """
    + queued_sql(fenced_by="conv")
    + """
), """
    + limits.COUNT
    + """
SELECT (SELECT id FROM opened) AS escalation_id, (SELECT waiting FROM more) AS kept,
       -- released while another message waits (a caller that runs one message only): wake a dispatcher
       (SELECT pg_notify('{turns}', '') FROM others, more WHERE others.waiting AND NOT more.waiting)
FROM conv
""".replace("{turns}", TURNS)
)
