// The playground page: renders the emulator's workspace and the bot's audit trail, polled once a second.
// Every action is a POST that the playground turns into what Slack would send the bot (signed requests).
"use strict";

const EMOJI = {
  eyes: "👀", white_check_mark: "✅", large_orange_circle: "🟠", large_blue_circle: "🔵",
  robot_face: "🤖", memo: "📝", warning: "⚠️", wave: "👋", x: "❌", hourglass_flowing_sand: "⏳",
};
const state = {
  role: localStorage.getItem("role") || "customer",
  channel: "C_SUPPORT",
  thread: null,   // ts of the open thread's root
  ws: null,       // last /api/workspace answer
  convs: [],      // last /api/conversations answer
  rendered: "",   // what was last drawn, to redraw only on change (keeps scroll and selection)
};
const $ = (sel) => document.querySelector(sel);

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function userName(id) {
  const u = state.ws && state.ws.users[id];
  return u ? u.real_name : id;
}
function channelName(id) {
  const c = state.ws && state.ws.channels.find((c) => c.id === id);
  return c ? c.name : id;
}
function me() { return state.ws ? state.ws.roles[state.role] : "U_CUSTOMER"; }
function time(ts) { return new Date(parseFloat(ts) * 1000).toLocaleTimeString(); }

const emoji = (name) => (Object.hasOwn(EMOJI, name) ? EMOJI[name] : null);

// Slack's mrkdwn, the parts the bot uses. Links and mentions are taken out first and put back last, so that
// formatting never reaches inside an address.
function mrkdwn(text) {
  const kept = [];
  const keep = (html) => `\u0000${kept.push(html) - 1}\u0000`;
  let h = String(text ?? "").replace(/<([^<>\n]+)>/g, (whole, inner) => {
    const [target, label] = inner.split("|", 2);
    if (/^@\w+$/.test(target)) return keep(`<span class="mention">@${esc(userName(target.slice(1)))}</span>`);
    if (/^#\w+$/.test(target)) return keep(`<span class="mention">#${esc(label || channelName(target.slice(1)))}</span>`);
    const href = target.replace(/&amp;/g, "&");
    if (/^https?:\/\/[^\s"]+$/.test(href)) {
      return keep(`<a href="${esc(href)}" target="_blank" rel="noopener">${esc((label || href).replace(/&amp;/g, "&"))}</a>`);
    }
    return whole;
  });
  h = esc(unescapeSlack(h));
  h = h.replace(/```([\s\S]*?)```/g, "<pre>$1</pre>");
  h = h.replace(/`([^`\n]+)`/g, "<code>$1</code>");
  h = h.replace(/(^|[\s(>])\*([^*\n]+)\*/g, "$1<b>$2</b>");
  h = h.replace(/(^|[\s(>])_([^_\n]+)_/g, "$1<i>$2</i>");
  h = h.replace(/(^|[\s(>])~([^~\n]+)~/g, "$1<s>$2</s>");
  h = h.replace(/^&gt; ?(.*)$/gm, "<blockquote>$1</blockquote>");
  h = h.replace(/:([a-z0-9_+-]+):/g, (m, n) => emoji(n) || m);
  h = h.replace(/\u0000(\d+)\u0000/g, (_, i) => kept[Number(i)]);
  return h.replace(/\n/g, "<br>");
}

// Slack's three entities, in one pass (so "&amp;lt;" is the text "&lt;"); plain_text has them too.
function unescapeSlack(text) { return text.replace(/&(amp|lt|gt);/g, (_, e) => ({amp: "&", lt: "<", gt: ">"}[e])); }

function textObj(t) { return t ? (t.type === "mrkdwn" ? mrkdwn(t.text) : esc(unescapeSlack(t.text))) : ""; }

function blocks(list, msg) {
  return list.map((b) => {
    switch (b.type) {
      case "header": return `<div class="b-header">${textObj(b.text)}</div>`;
      case "divider": return "<hr>";
      case "section": {
        const fields = (b.fields || []).map((f) => `<div>${textObj(f)}</div>`).join("");
        return `<div class="b-section">${textObj(b.text)}${fields ? `<div class="b-fields">${fields}</div>` : ""}</div>`;
      }
      case "context": return `<div class="b-context">${(b.elements || []).map(textObj).join(" ")}</div>`;
      case "actions": return `<div class="b-actions">${(b.elements || []).filter((e) => e.type === "button").map((e) =>
        `<button class="b-button ${esc(e.style || "")}" data-action-id="${esc(e.action_id)}" data-value="${esc(e.value)}"` +
        ` data-block-id="${esc(b.block_id || "b")}" data-channel="${esc(msg.channel)}" data-ts="${esc(msg.ts)}"` +
        `${msg.ephemeral ? " disabled" : ""}>${textObj(e.text)}</button>`).join("")}</div>`;
      // An answer: its Markdown shown through the mrkdwn fallback (the page's renderer), and the 👍/👎 pair.
      case "markdown": return `<div class="text">${mrkdwn(msg.text)}</div>`;
      case "context_actions": return `<div class="b-actions">${(b.elements || []).filter((e) => e.type === "feedback_buttons")
        .flatMap((e) => [e.positive_button, e.negative_button].filter(Boolean).map((button) =>
          `<button class="b-button" data-element="feedback_buttons" data-action-id="${esc(e.action_id)}"` +
          ` data-value="${esc(button.value)}" data-block-id="${esc(b.block_id || "b")}" data-channel="${esc(msg.channel)}"` +
          ` data-ts="${esc(msg.ts)}">${textObj(button.text)}</button>`)).join("")}</div>`;
      default: return "";
    }
  }).join("");
}

function avatar(m) {
  const name = m.username || userName(m.user);
  let url = m.icon_url;
  // The emulator's profile pictures live on a made-up domain; draw initials instead of a broken image.
  try {
    if (url && !/^https?:$/.test(new URL(url).protocol)) url = null;
    if (url && new URL(url).hostname.endsWith(".test")) url = null;
  } catch { url = null; }
  if (url) return `<img class="avatar" src="${esc(url)}" alt="">`;
  const initials = name.split(/\s+/).map((w) => w[0]).join("").slice(0, 2).toUpperCase();
  const app = m.bot && (!m.username || m.ephemeral);
  return `<div class="avatar ${app ? "bot" : ""}">${app ? "🤖" : esc(initials)}</div>`;
}

// A streamed answer's task cards (task_update chunks), one line each.
const TASK_ICONS = {pending: "○", in_progress: "◐", complete: "✓", error: "✗"};
function tasks(list) {
  return list && list.length ? `<ul class="tasks">${list.map((t) =>
    `<li class="task ${esc(t.status)}">${TASK_ICONS[t.status] || "·"} ${esc(t.title)}</li>`).join("")}</ul>` : "";
}

function message(m, inThread) {
  const name = m.username || (m.bot ? "helpdesk" : userName(m.user));
  // A stream's text is the message itself and its blocks come after it (chat.stopStream), unless a markdown block
  // already shows the text.
  const textFirst = m.streaming && !(m.blocks || []).some((b) => b.type === "markdown");
  const body = tasks(m.tasks) + (m.blocks
    ? (textFirst ? `<div class="text">${mrkdwn(m.text)}</div>` : "") + blocks(m.blocks, m)
    : `<div class="text">${mrkdwn(m.text)}</div>`);
  const live = m.streaming === "in_progress" ? ' <span class="hint streaming">…</span>'
    : m.streaming === "expired" ? ' <span class="hint">(stream expired)</span>' : "";
  const reactions = Object.entries(m.reactions || {}).map(([n, users]) =>
    `<span class="reaction" data-reaction="${esc(n)}">${emoji(n) || ":" + esc(n) + ":"} ${users.length}</span>`).join("");
  const replies = inThread ? "" : repliesOf(m.channel, m.ts).length;
  const threadLink = inThread || m.ephemeral ? "" :
    `<a class="replies-link" data-ts="${esc(m.ts)}">${replies ? `${replies} repl${replies === 1 ? "y" : "ies"}` : "Reply in thread"}</a>`;
  return `<div class="msg ${m.ephemeral ? "ephemeral" : ""} ${m.bot ? "from-bot" : ""}" data-ts="${esc(m.ts)}" data-user="${esc(m.user)}">
    ${avatar(m)}<div class="body">
      <div class="meta"><b class="name">${esc(name)}</b>${m.bot ? ' <span class="tag">APP</span>' : ""}
        <span class="time">${time(m.ts)}</span>${m.edited ? ' <span class="hint">(edited)</span>' : ""}${live}</div>
      ${m.ephemeral ? `<div class="hint only-you">${m.in_channel ? "Answer to your " + esc(m.source) + " (in channel)" : "Only visible to you"}</div>` : ""}
      ${body}<div class="reactions">${reactions}</div>${threadLink}
    </div></div>`;
}

function channelMessages(channel) { return (state.ws.messages[channel] || []).map((m) => ({...m, channel})); }
function repliesOf(channel, ts) { return channelMessages(channel).filter((m) => m.thread_ts === ts && m.ts !== ts); }
function ephemerals(channel, thread) {
  return state.ws.ephemerals.filter((e) => e.channel === channel && (e.thread_ts || null) === thread)
    .map((e) => ({...e, ephemeral: true, bot: true, username: "helpdesk", reactions: {}}));
}

function render() {
  const ws = state.ws;
  const drawn = JSON.stringify([ws, state.convs, state.role, state.channel, state.thread]);
  if (drawn === state.rendered) return;
  state.rendered = drawn;
  $("#brand").textContent = ws.brand;
  const customer = ws.users[ws.roles.customer];
  if (customer) $("#role option[value=customer]").textContent = `Customer (${customer.real_name.split(" ")[0]})`;
  document.title = `${ws.brand} helpdesk · playground`;
  $("#brain").textContent = ws.brain;
  $("#brain").className = "brain " + (ws.offline ? "offline" : "llm");
  $("#role").value = state.role;
  $("#channels").innerHTML = ws.channels.map((c) =>
    `<li><a data-channel="${esc(c.id)}" class="${c.id === state.channel ? "active" : ""}"># ${esc(c.name)}</a></li>`).join("");
  $("#channel-name").textContent = "# " + channelName(state.channel);
  $("#channel-hint").textContent = state.channel === "C_STAFF"
    ? "cases for staff; reply in a case's thread to talk to the customer"
    : "customers write here; each thread is one conversation";
  const top = channelMessages(state.channel).filter((m) => !m.thread_ts || m.thread_ts === m.ts)
    .concat(ephemerals(state.channel, null)).sort((a, b) => parseFloat(a.ts) - parseFloat(b.ts));
  fill($("#messages"), top.map((m) => message(m, false)).join("") || '<div class="hint empty">No messages yet.</div>');
  const pane = $("#thread");
  pane.hidden = !state.thread;
  if (state.thread) {
    const root = channelMessages(state.channel).find((m) => m.ts === state.thread);
    const list = (root ? [root] : []).concat(repliesOf(state.channel, state.thread), ephemerals(state.channel, state.thread))
      .sort((a, b) => parseFloat(a.ts) - parseFloat(b.ts));
    fill($("#thread-messages"), list.map((m) => message(m, true)).join(""));
  }
  renderPanel();
}

// Redraw a scrolling list, staying at the bottom if the reader was there.
function fill(el, html) {
  const atBottom = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
  el.innerHTML = html;
  if (atBottom) el.scrollTop = el.scrollHeight;
}

function selectedConversation() {
  if (!state.thread) return null;
  return state.convs.find((c) => (c.channel === state.channel && c.thread_ts === state.thread) ||
    c.escalations.some((e) => e.case_channel === state.channel && e.case_ts === state.thread)) || null;
}

function renderPanel() {
  const selected = selectedConversation();
  const convs = selected ? [selected, ...state.convs.filter((c) => c !== selected)] : state.convs;
  const html = convs.map((c) => {
    const esc_ = c.escalations[c.escalations.length - 1];
    const events = [
      ...c.handoffs.map((h) => ({at: h.at, html: `<li class="ev-handoff">↪ handoff <b>${esc(h.from_agent)}</b> → <b>${esc(h.to_agent)}</b>${h.reason ? ` <span class="hint">${esc(h.reason)}</span>` : ""}</li>`})),
      ...c.tools.map((t) => ({at: t.at, html: `<li class="ev-tool ${t.ok ? "ok" : "failed"}">🔧 [${esc(t.agent)}] <b>${esc(t.tool)}</b> ${t.ok ? "✓" : "✗ failed"}</li>`})),
      ...c.escalations.map((e) => ({at: e.at, html: `<li class="ev-escalation">🙋 escalated by ${esc(e.agent)} (${esc(e.trigger)}): ${esc(e.reason)}</li>`})),
      ...c.escalations.filter((e) => e.claimed_at).map((e) => ({at: e.claimed_at, html: `<li class="ev-escalation">👤 claimed by ${esc(userName(e.claimed_by))}</li>`})),
      ...c.escalations.filter((e) => e.closed_at).map((e) => ({at: e.closed_at, html: `<li class="ev-escalation">${e.status === "resolved" ? "✅ resolved" : "🤖 handed back"} by ${esc(userName(e.closed_by))}</li>`})),
    ].sort((a, b) => a.at.localeCompare(b.at)).map((e) => e.html).join("");
    const escalation = esc_ ? `<div>Escalation <b class="esc-status" data-status="${esc(esc_.status)}">#${esc_.id} ${esc(esc_.status.replace("_", " "))}</b>` +
      `${esc_.claimed_by ? ` · owner ${esc(userName(esc_.claimed_by))}` : ""}${esc_.closed_by ? ` · closed by ${esc(userName(esc_.closed_by))}` : ""}</div>` : "";
    return `<div class="conv ${c === selected ? "selected" : ""}" data-key="${esc(c.key)}" data-thread="${esc(c.thread_ts)}" data-conv-channel="${esc(c.channel)}">
      <div class="conv-title">#${esc(channelName(c.channel))} · thread ${c.thread_ts ? time(c.thread_ts) : ""}</div>
      <div>Mode <b class="mode" data-mode="${esc(c.mode)}">${esc(c.mode.replace("_", " "))}</b> · agent <b class="agent">${esc(c.active_agent)}</b></div>
      <div class="hint">${c.messages} messages · ${c.llm_calls} model calls</div>
      ${escalation}<ul class="events">${events}</ul></div>`;
  }).join("");
  fill($("#conversations"), html || '<div class="hint empty">Conversations appear here when a customer writes in #support.</div>');
}

async function post(path, body) {
  const r = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status} ${await r.text()}`);
  return r.json();
}

async function send(text, thread) {
  text = text.trim();
  if (!text) return;
  const slash = text.match(/^(\/[a-z0-9_-]+)\s*([\s\S]*)$/);
  if (slash) {
    await post("/api/command", {user: me(), channel: state.channel, command: slash[1], text: slash[2]});
  } else {
    const said = await post("/api/say", {user: me(), channel: state.channel, text, thread_ts: thread});
    if (!thread) state.thread = said.ts;  // a new message starts a thread: open it, where the answer comes
  }
  await refresh();
}

function composer(form, thread) {
  const area = form.querySelector("textarea");
  const submit = async (e) => {
    e.preventDefault();
    const text = area.value;
    area.value = "";
    try { await send(text, thread()); } catch (err) { area.value = text; alert(err.message); }
  };
  form.addEventListener("submit", submit);
  area.addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey && !e.isComposing) submit(e); });
}

let asked = 0;
let shown = 0;
async function refresh() {
  // Answers can arrive out of order (a slow poll, then a role switch): never draw an older one over a newer.
  const ticket = ++asked;
  const [ws, convs] = await Promise.all([
    fetch(`/api/workspace?user=${encodeURIComponent(me())}`).then((r) => r.json()),
    fetch("/api/conversations").then((r) => r.json()),
  ]);
  if (ticket < shown) return;
  shown = ticket;
  state.ws = ws;
  state.convs = convs;
  render();
}

// Faster while an answer streams, so that it grows word by word rather than a second at a time.
function streaming() {
  return Object.values(state.ws?.messages || {}).some((list) => list.some((m) => m.streaming === "in_progress"));
}

async function poll() {
  try { await refresh(); } catch (err) { console.warn(err); }
  setTimeout(poll, streaming() ? 250 : 1000);
}

// A Slack permalink (https://<team>.slack.com/archives/<channel>/p<ts without the dot>[?thread_ts=…]).
function permalink(href) {
  const m = href.match(/\/archives\/([A-Z0-9_]+)\/p(\d{10})(\d{6})(?:\?thread_ts=([\d.]+))?/);
  return m && state.ws.channels.some((c) => c.id === m[1]) ? {channel: m[1], thread: m[4] || `${m[2]}.${m[3]}`} : null;
}

document.addEventListener("click", async (e) => {
  const t = e.target.closest("[data-channel]:not(button), .replies-link, .b-button, #close-thread, .conv, a[href]");
  if (!t) return;
  if (t.matches("a[href]")) {
    const link = permalink(t.getAttribute("href"));
    if (!link) return;
    e.preventDefault();
    state.channel = link.channel;
    state.thread = link.thread;
  } else if (t.matches(".b-button")) {
    t.disabled = true;
    try {
      await post("/api/click", {user: me(), channel: t.dataset.channel, message_ts: t.dataset.ts,
        action_id: t.dataset.actionId, value: t.dataset.value, block_id: t.dataset.blockId,
        element: t.dataset.element || "button"});
    } catch (err) {
      t.disabled = false;
      alert(err.message);
    }
  } else if (t.matches(".replies-link")) {
    state.thread = t.dataset.ts;
  } else if (t.matches("#close-thread")) {
    state.thread = null;
  } else if (t.matches(".conv")) {
    if (t.dataset.thread) { state.channel = t.dataset.convChannel; state.thread = t.dataset.thread; }
  } else {
    state.channel = t.dataset.channel;
    state.thread = null;
  }
  await refresh();
});
$("#role").addEventListener("change", async (e) => {
  state.role = e.target.value;
  localStorage.setItem("role", state.role);
  await refresh();
});
composer($("#composer"), () => null);
composer($("#thread-composer"), () => state.thread);
poll();
