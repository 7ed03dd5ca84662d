// The keraunos dashboard: one page, one view per location hash, data from /ui/api.
//
// Everything an agent or a model wrote (messages, replies, event data, error messages, ids) is put
// on the page as text: `el` makes elements and text nodes only; nothing here assigns HTML.
"use strict";

const API = "/ui/api";
const PAGE = 50;
const CALLS_PAGE = 10;
// How long a task that draws calls runs before it lets the browser paint.
const FRAME_MS = 12;

// -- small helpers ---------------------------------------------------------------------------

/** An element with attributes (`class`, `href`, `title`, data-*, on* handlers) and children
 * (strings become text nodes, null and false are skipped). */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function getJson(path) {
  const response = await fetch(API + path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (response.status === 401) {
    window.location.assign("/ui/login");
    throw new Error("not logged in");
  }
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = JSON.stringify((await response.json()).detail); } catch (e) { /* keep the status text */ }
    throw new Error(`${response.status}: ${detail}`);
  }
  return response.json();
}

/** POST a dashboard action with its JSON body. `X-Keraunos-UI` tells the gateway the request comes
 * from this script (no form can send it, and another site's script cannot without a preflight). */
async function postJson(path, body) {
  const response = await fetch(API + path, {
    method: "POST",
    credentials: "same-origin",
    headers: { Accept: "application/json", "Content-Type": "application/json", "X-Keraunos-UI": "1" },
    body: JSON.stringify(body),
  });
  if (response.status === 401) {
    window.location.assign("/ui/login");
    throw new Error("not logged in");
  }
  if (!response.ok) {
    let detail = response.statusText;
    try {
      const found = (await response.json()).detail;
      detail = typeof found === "string" ? found : JSON.stringify(found);
    } catch (e) { /* keep the status text */ }
    throw new Error(`${response.status}: ${detail}`);
  }
  return response.json();
}

function when(seconds) {
  if (seconds === null || seconds === undefined) return "";
  return new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19);
}

function num(value, digits = 3) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

function text(value) {
  if (value === null || value === undefined) return "";
  return typeof value === "string" ? value : JSON.stringify(value, null, 1);
}

function link(hash, label) {
  return el("a", { href: hash }, label);
}

function enc(value) {
  return encodeURIComponent(value);
}

function parseHash() {
  const raw = window.location.hash.replace(/^#\/?/, "");
  const [path, query] = raw.split("?");
  return { parts: path.split("/").map(decodeURIComponent), params: new URLSearchParams(query || "") };
}

function show(...nodes) {
  const view = document.getElementById("view");
  view.replaceChildren(...nodes.flat().filter((node) => node !== null && node !== undefined && node !== false));
  return view;
}

/** Run `fn` once the next frame has been painted. */
function afterPaint(fn) {
  requestAnimationFrame(() => setTimeout(fn, 0));
}

function failure(error) {
  return el("p", { class: "error" }, String(error.message || error));
}

let stopPolling = () => {};

// -- the rollouts table ---------------------------------------------------------------------

const FILTERS = [
  ["state", "select", ["", "queuing", "running", "succeeded", "failed"]],
  ["mode", "select", ["", "train", "val"]],
  ["group", "input"],
  ["step", "input"],
  ["data_id", "input"],
  ["q", "input"],
  ["resource", "input"],
  ["version", "input"],
  ["failed_attempt", "select", ["", "true", "false"]],
  // What the trainer's step reported of the rollout's merge: a break, none (not reported: neither).
  ["merge_break", "select", [["", "any"], ["true", "yes"], ["false", "no"]]],
];
const COLUMNS = [
  ["rollout_id", "rollout", "rollout_id"],
  ["state", "state", "state"],
  ["mode", "mode", null],
  ["group_id", "group", null],
  ["data_id", "data id", null],
  ["attempts", "attempts", null],
  ["reward", "reward", null],
  ["merge_breaks", "merge breaks", null],
  ["created_at", "created", "created"],
  ["updated_at", "updated", "updated"],
  ["error_message", "error", null],
];

async function rolloutsView(params) {
  const form = el("form", { class: "filters", id: "filters" });
  for (const [name, kind, options] of FILTERS) {
    const control = kind === "select"
      ? el("select", { name, id: `filter-${name}` }, options.map((o) => {
        const [value, label] = Array.isArray(o) ? o : [o, o || "any"];
        return el("option", { value }, label);
      }))
      : el("input", { name, id: `filter-${name}`, placeholder: name === "q" ? "id prefix" : name, size: 14 });
    control.value = params.get(name) || "";
    form.append(el("label", {}, name.replace("_", " "), control));
  }
  form.append(el("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const [name, value] of new FormData(form)) if (value) next.set(name, value);
    for (const keep of ["sort", "order"]) if (params.get(keep)) next.set(keep, params.get(keep));
    window.location.hash = `#/rollouts?${next}`;
  });
  const table = el("table", { class: "rollouts", id: "rollouts-table" });
  const summary = el("p", { class: "summary", id: "rollouts-summary" }, "loading…");
  const pager = el("div", { class: "pager" });
  show(el("h1", {}, "Rollouts"), form, summary, table, pager);

  const sort = params.get("sort") || "created";
  const order = params.get("order") || "desc";
  const offset = Number(params.get("offset") || 0);
  const query = new URLSearchParams(params);
  query.set("limit", String(PAGE));
  let page;
  try {
    page = await getJson(`/rollouts?${query}`);
  } catch (error) {
    summary.replaceWith(failure(error));
    return;
  }
  const head = el("tr", {}, COLUMNS.map(([, label, key]) => {
    if (!key) return el("th", {}, label);
    const next = new URLSearchParams(params);
    next.set("sort", key);
    next.set("order", sort === key && order === "desc" ? "asc" : "desc");
    next.delete("offset");
    const arrow = sort === key ? (order === "desc" ? " ▼" : " ▲") : "";
    return el("th", {}, link(`#/rollouts?${next}`, label + arrow));
  }));
  const rows = page.items.map((row) => el("tr", { class: `state-${row.state}` },
    el("td", {}, link(`#/rollout/${enc(row.rollout_id)}`, row.rollout_id)),
    el("td", {}, el("span", { class: `badge ${row.state}` }, row.state)),
    el("td", {}, row.mode),
    el("td", {}, row.group_id ? link(`#/group/${enc(row.group_id)}`, row.group_id) : ""),
    el("td", {}, row.data_id),
    el("td", {}, String(row.attempts)),
    el("td", { class: "reward" }, num(row.reward)),
    el("td", { class: "breaks", title: row.merge_breaks === null ? "not reported by a trainer" : null },
      row.merge_breaks === null || row.merge_breaks === undefined ? "–" : String(row.merge_breaks)),
    el("td", {}, when(row.created_at)),
    el("td", {}, when(row.updated_at)),
    el("td", { class: "clip" }, row.error_message || ""),
  ));
  table.replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
  const last = Math.min(offset + page.items.length, page.total);
  summary.textContent = `${page.total} rollouts; ${page.total ? offset + 1 : 0}–${last} shown`;
  const move = (to) => { const next = new URLSearchParams(params); next.set("offset", String(to)); return `#/rollouts?${next}`; };
  if (offset > 0) pager.append(link(move(Math.max(0, offset - PAGE)), "← previous"));
  if (last < page.total) pager.append(link(move(offset + PAGE), "next →"), " ", link(move(Math.floor((page.total - 1) / PAGE) * PAGE), "last"));
}

// -- one rollout ----------------------------------------------------------------------------

/** One token: its text (or its id), coloured by its mask and, when it trains, by its log
 * probability. Its id and log probability show on hover (`describeToken`), so nothing else is
 * done per token. */
function tokenSpan(id, textValue, cls, logprob) {
  const span = document.createElement("span");
  span.className = cls;
  span.textContent = textValue === undefined ? String(id) : textValue;
  if (logprob !== null && logprob !== undefined) {
    // Heat: a confident token is pale, an unlikely one strong.
    span.style.setProperty("--heat", Math.min(1, -Number(logprob) / 5).toFixed(2));
  }
  return span;
}

// A tokens box's call, for the title of the token the pointer is over.
const callOfTokens = new WeakMap();

function tokensBlock(call) {
  const box = el("div", { class: "tokens" });
  // Built apart and put in the page at once: one insertion, not one per token.
  const spans = document.createDocumentFragment();
  const obs = call.observation || { ids: [] };
  if (obs.hidden) spans.append(el("span", { class: "tok hidden" }, `… ${obs.hidden} prompt ids`));
  for (let i = 0; i < obs.ids.length; i++) {
    spans.append(tokenSpan(obs.ids[i], obs.text ? obs.text[i] : undefined, "tok observation", null));
  }
  const resp = call.response || { ids: [] };
  for (let i = 0; i < resp.ids.length; i++) {
    const cls = resp.mask && resp.mask[i] === 1 ? "tok trained" : "tok masked";
    spans.append(tokenSpan(resp.ids[i], resp.text ? resp.text[i] : undefined, cls, resp.logprobs ? resp.logprobs[i] : null));
  }
  box.append(spans);
  callOfTokens.set(box, call);
  return box;
}

/** Give the token under the pointer its title (id and log probability), from its call's data and
 * its place in its box: one handler for all the calls' tokens. */
function describeToken(event) {
  const span = event.target;
  const box = span.parentElement;
  const call = box ? callOfTokens.get(box) : undefined;
  if (!call || span.title || !span.classList.contains("tok") || span.classList.contains("hidden")) return;
  const obs = call.observation || { ids: [] };
  const resp = call.response || { ids: [] };
  let at = Array.prototype.indexOf.call(box.children, span) - (obs.hidden ? 1 : 0);
  let logprob = null;
  let id;
  if (at < obs.ids.length) id = obs.ids[at];
  else {
    at -= obs.ids.length;
    id = resp.ids[at];
    logprob = resp.logprobs ? resp.logprobs[at] : null;
  }
  span.title = `id ${id}` + (logprob === null || logprob === undefined ? "" : ` · logprob ${Number(logprob).toFixed(3)}`);
}

function messageBlock(message) {
  if (message === null || message === undefined) return null;
  if (typeof message !== "object") return el("div", { class: "msg" }, el("pre", {}, text(message)));
  const role = message.role || "?";
  const parts = [];
  if (typeof message.content === "string") parts.push(message.content);
  else if (Array.isArray(message.content)) {
    for (const part of message.content) parts.push(part && typeof part.text === "string" ? part.text : text(part));
  } else if (message.content !== undefined && message.content !== null) parts.push(text(message.content));
  if (message.tool_calls) parts.push(text(message.tool_calls));
  return el("div", { class: `msg role-${String(role).replace(/[^a-z_]/g, "")}` }, el("span", { class: "role" }, role), el("pre", {}, parts.join("\n")));
}

function breakBlock(brk) {
  const side = (title, textValue, ids) => el("div", { class: "side" },
    el("h4", {}, title),
    textValue !== null && textValue !== undefined ? el("pre", { class: "break-text" }, textValue) : null,
    el("pre", { class: "break-ids" }, ids.join(" ")));
  return el("details", { class: "merge-break", open: true },
    el("summary", {}, `merge break: ${brk.kind} (shares ${brk.shared_prefix} ids; shown from id ${brk.from})`),
    el("div", { class: "sides" },
      side("previous prompt + response", brk.expected_text, brk.expected_ids),
      side("this prompt", brk.actual_text, brk.actual_ids)));
}

function callBlock(call) {
  return el("section", { class: "call", id: `call-${call.index}` },
    el("h3", {}, `call ${call.index}`,
      el("span", { class: "meta" }, ` · ${call.model || "?"} · version ${call.version ?? "?"} · ${call.status}${call.agent_id ? " · agent " + call.agent_id : ""}${call.trained ? "" : " · not trained"}`)),
    call.break ? breakBlock(call.break) : null,
    el("div", { class: "messages", id: `messages-${call.index}` }, el("p", { class: "summary" }, "messages loading…")),
    call.response ? tokensBlock(call) : null);
}

/** Fill in the messages and replies of calls already drawn (they are read apart: the full
 * records cost more to read than the tokens). */
function fillMessages(items) {
  for (const item of items) {
    const box = document.getElementById(`messages-${item.index}`);
    if (!box) continue;
    if (!item.messages) { box.replaceChildren(el("p", { class: "summary" }, "messages not found")); continue; }
    const parts = [
      item.history_rewritten ? el("p", { class: "summary" }, "history rewritten: every message of this request") : null,
      ...item.messages.map(messageBlock),
      el("div", { class: "reply" }, el("h4", {}, "reply"), messageBlock(item.reply)),
    ];
    box.replaceChildren(...parts.filter((node) => node !== null));
  }
}

function timeline(detail) {
  const n = detail.calls;
  const box = el("div", { class: "timeline", id: "timeline" });
  if (!n) return box;
  const versions = [...new Set(detail.timeline.map((c) => c.version))];
  const ticks = document.createDocumentFragment();
  for (const c of detail.timeline) {
    const hue = (210 + versions.indexOf(c.version) * 67) % 360;
    const mark = el("a", { href: `#call-${c.index}`, class: `tick ${c.status === "ok" ? "" : "bad"}`, title: `call ${c.index} · version ${c.version ?? "?"} · ${c.status}` });
    mark.style.left = `${(100 * c.index) / n}%`;
    mark.style.setProperty("--hue", String(hue));
    ticks.append(mark);
  }
  for (const event of detail.events || []) {
    const at = Math.max(0, event.after_call + 1);
    const value = event.data && event.data.value !== undefined ? ` = ${text(event.data.value)}` : "";
    const mark = el("span", { class: `event ${event.event_type === "reward" ? "reward" : ""}`, title: `${event.event_type}${value} after call ${event.after_call}` }, event.event_type === "reward" ? "★" : "•");
    mark.style.left = `${(100 * at) / n}%`;
    ticks.append(mark);
  }
  box.append(ticks);
  // One handler for every tick: a tick scrolls to its call (if drawn) and leaves the location be.
  box.addEventListener("click", (event) => {
    const mark = event.target.closest("a.tick");
    if (!mark) return;
    event.preventDefault();
    const target = document.getElementById(mark.getAttribute("href").slice(1));
    if (target) target.scrollIntoView();
  });
  return box;
}

/** Resolves once the next frame has been painted. */
function nextPaint() {
  return new Promise((resolve) => afterPaint(resolve));
}

async function rolloutView(parts, params) {
  const id = parts[1];
  const attempt = params.get("attempt");
  let detail;
  try {
    // The first page of calls comes with the rollout: its tokens draw without a second request.
    detail = await getJson(`/rollouts/${enc(id)}?first_calls=${CALLS_PAGE}` + (attempt ? `&attempt=${enc(attempt)}` : ""));
  } catch (error) {
    show(el("h1", {}, "Rollout ", id), failure(error));
    return;
  }
  const r = detail.rollout;
  const group = r.metadata && r.metadata.data_id !== undefined ? String(r.metadata.data_id) : null;
  const facts = el("dl", { class: "facts" },
    el("dt", {}, "state"), el("dd", {}, el("span", { class: `badge ${r.status.state}` }, r.status.state)),
    el("dt", {}, "mode"), el("dd", {}, r.is_train ? "train" : "val"),
    el("dt", {}, "group"), el("dd", {}, group ? link(`#/group/${enc(group)}`, group) : "–"),
    el("dt", {}, "reward"), el("dd", { id: "rollout-reward" }, num(detail.reward)),
    el("dt", {}, "model calls"), el("dd", {}, String(detail.calls)),
    el("dt", {}, "merge breaks"), el("dd", {}, String(detail.breaks ?? 0)),
    el("dt", {}, "created"), el("dd", {}, when(r.status.created_at)),
    el("dt", {}, "error"), el("dd", { class: "clip" }, r.status.error_message || "–"),
  );
  const attempts = el("table", { class: "attempts" },
    el("thead", {}, el("tr", {}, ["attempt", "state", "outcome", "started", "ended", "exit", "reason"].map((h) => el("th", {}, h)))),
    el("tbody", {}, detail.attempts.map((a) => el("tr", { class: a.id === detail.attempt ? "current" : "" },
      el("td", {}, link(`#/rollout/${enc(id)}?attempt=${enc(a.id)}`, a.id)),
      el("td", {}, a.state), el("td", {}, a.outcome || ""), el("td", {}, when(a.started_at)),
      el("td", {}, when(a.ended_at)), el("td", {}, a.exit_code ?? ""), el("td", { class: "clip" }, a.reason || "")))));
  const resources = Object.entries(detail.resources || {}).map(([name, a]) => el("li", {}, `${name}: version ${a.version} (${a.selector})${a.release_id ? ` release ${a.release_id} ${a.arm}` : ""}`));
  const events = el("ul", { class: "events" }, (detail.events || []).map((e) => el("li", {}, `${when(e.timestamp)} · ${e.event_type} after call ${e.after_call}: `, el("code", {}, text(e.data)))));
  const calls = el("div", { id: "calls", onmouseover: describeToken });
  const more = el("button", { id: "more-calls", type: "button" }, "load more calls");
  show(
    el("h1", {}, "Rollout ", el("code", {}, id)),
    facts,
    el("h2", {}, "Attempts"), attempts,
    resources.length ? el("div", {}, el("h2", {}, "Resources"), el("ul", {}, resources)) : null,
    el("h2", {}, `Timeline (attempt ${detail.attempt ?? "–"})`), timeline(detail),
    el("h2", {}, "Events"), events,
    detail.log_tail ? el("details", {}, el("summary", {}, "attempt log (tail)"), el("pre", { class: "log" }, detail.log_tail)) : null,
    el("h2", {}, "Model calls"),
    el("p", { class: "legend" }, el("span", { class: "tok trained" }, "trained"), " ", el("span", { class: "tok masked" }, "sampled, not trained"), " ", el("span", { class: "tok observation" }, "observation (mask 0)"), " — hover a token for its id and log probability"),
    calls, more);
  if (!detail.attempt) { more.remove(); return; }
  let offset = 0;
  let first = detail.first_calls;
  const load = async () => {
    more.disabled = true;
    const page = first || await getJson(`/rollouts/${enc(id)}/attempts/${enc(detail.attempt)}/calls?offset=${offset}&limit=${CALLS_PAGE}`);
    first = null;
    // Incremental: a page of calls at a time, the next when the reader scrolls near the end; and
    // within a page, the first call is painted before the others are drawn, a few per frame.
    let drawn;
    const allDrawn = new Promise((resolve) => { drawn = resolve; });
    let frame = performance.now();
    for (const [k, call] of page.items.entries()) {
      calls.append(callBlock(call));
      if (k === 0 || performance.now() - frame > FRAME_MS) {
        await nextPaint();
        frame = performance.now();
      }
      if (k === 0) {
        // The page's messages are asked for once its first call is on screen (they come from
        // the full records, which cost the gateway more than the tokens did), and filled in
        // once all its calls are drawn.
        getJson(`/rollouts/${enc(id)}/attempts/${enc(detail.attempt)}/messages?offset=${offset}&limit=${CALLS_PAGE}`)
          .then(async (found) => { await allDrawn; fillMessages(found.items); })
          .catch((error) => calls.append(failure(error)));
      }
    }
    drawn();
    offset += page.items.length;
    more.disabled = false;
    if (offset >= page.total) { more.remove(); observer.disconnect(); }
  };
  more.addEventListener("click", load);
  const observer = new IntersectionObserver((entries) => { if (entries.some((e) => e.isIntersecting) && !more.disabled) load(); });
  observer.observe(more);
  await load();
}

// -- a group --------------------------------------------------------------------------------

async function groupView(parts) {
  const id = parts[1];
  let page;
  try { page = await getJson(`/groups/${enc(id)}`); } catch (error) { show(el("h1", {}, "Group ", id), failure(error)); return; }
  const max = Math.max(1e-9, ...page.items.map((r) => Math.abs(r.advantage || 0)));
  const cards = page.items.map((r) => {
    const bar = el("div", { class: `adv ${r.advantage >= 0 ? "pos" : "neg"}` });
    bar.style.width = `${(50 * Math.abs(r.advantage || 0)) / max}%`;
    return el("div", { class: "sibling" },
      el("h3", {}, link(`#/rollout/${enc(r.rollout_id)}`, r.rollout_id)),
      el("span", { class: `badge ${r.state}` }, r.state),
      el("p", {}, "reward ", el("strong", { class: "reward" }, num(r.reward))),
      el("p", {}, "advantage ", el("strong", {}, num(r.advantage))),
      el("div", { class: "advbar" }, bar));
  });
  show(el("h1", {}, "Group ", el("code", {}, id)), el("p", {}, `${page.total} siblings; advantages: GRPO (group mean, std) over those with a reward`), el("div", { class: "siblings" }, cards));
}

// -- training runs --------------------------------------------------------------------------

const CURVES = [
  ["reward_mean", "reward (mean)"],
  ["train/approx_kl", "KL (approx.)"],
  ["train/entropy", "entropy"],
  ["train/clip_fraction", "clip fraction"],
  ["train/tokens_per_s", "tokens / s"],
  ["rows/breaks", "merge breaks"],
];

async function runsView() {
  let runs;
  try { runs = await getJson("/runs"); } catch (error) { show(el("h1", {}, "Training runs"), failure(error)); return; }
  show(el("h1", {}, "Training runs"),
    runs.items.length ? el("table", {}, el("thead", {}, el("tr", {}, ["run", "steps", "last step", "first report", "last report"].map((h) => el("th", {}, h)))),
      el("tbody", {}, runs.items.map((r) => el("tr", {}, el("td", {}, link(`#/run/${enc(r.run_id)}`, r.run_id)), el("td", {}, String(r.steps)), el("td", {}, String(r.last_step)), el("td", {}, when(r.first_at)), el("td", {}, when(r.last_at))))))
      : el("p", {}, "No run has reported metrics yet (keraunos train reports each step to its gateway)."));
}

async function runView(parts) {
  const id = parts[1];
  const records = [];
  const charts = CURVES.map(([key, label]) => window.KeraunosCharts.lineChart(label, key));
  const status = el("p", { class: "summary", id: "run-status" }, "loading…");
  show(el("h1", {}, "Training run ", el("code", {}, id)), status, el("div", { class: "charts" }, charts.map((c) => c.node)));
  let stopped = false;
  stopPolling = () => { stopped = true; };
  const poll = async () => {
    if (stopped) return;
    const after = records.length ? records[records.length - 1].step : -1;
    try {
      const page = await getJson(`/runs/${enc(id)}?after=${after}`);
      records.push(...page.items);
      for (const chart of charts) chart.draw(records);
      status.textContent = `${records.length} steps; last step ${records.length ? records[records.length - 1].step : "–"}; updating every 2 s`;
      status.dataset.steps = String(records.length);
    } catch (error) {
      status.textContent = String(error.message || error);
    }
    setTimeout(poll, 2000);
  };
  poll();
}

// -- resources and releases -----------------------------------------------------------------

async function resourcesView() {
  let resources, releases, audit;
  try {
    [resources, releases, audit] = await Promise.all([getJson("/resources"), getJson("/releases"), getJson("/audit?limit=50")]);
  } catch (error) { show(el("h1", {}, "Resources and releases"), failure(error)); return; }
  const resourceBlocks = resources.items.map((r) => el("section", { class: "resource" },
    el("h3", {}, r.name, el("span", { class: "meta" }, ` · ${r.kind} · latest ${r.latest}`)),
    el("p", {}, "labels: ", Object.entries(r.labels).map(([label, v]) => el("span", { class: "badge" }, `${label} → ${v}`))),
    el("table", { class: "versions" }, el("thead", {}, el("tr", {}, ["version", "hash", "message", "by", "created", "rollouts", "finished", "error rate", "reward (mean, interval)"].map((h) => el("th", {}, h)))),
      el("tbody", {}, r.versions.slice().reverse().map((v) => {
        const s = (r.stats || {})[v.version] || {};
        return el("tr", {},
          el("td", {}, String(v.version)), el("td", {}, el("code", {}, v.hash.slice(0, 12))), el("td", { class: "clip" }, v.message),
          el("td", {}, v.created_by), el("td", {}, when(v.created_at)),
          el("td", {}, link(`#/rollouts?resource=${enc(r.name)}&version=${v.version}`, String(s.rollouts ?? 0))),
          el("td", {}, String(s.finished ?? 0)), el("td", {}, num(s.error_rate, 2)),
          el("td", { class: "reward" }, s.reward_mean === null || s.reward_mean === undefined ? "–" : `${num(s.reward_mean)} [${num(s.reward_lower, 2)}, ${num(s.reward_upper, 2)}]`));
      })))));
  const releaseTable = el("table", { class: "releases" },
    el("thead", {}, el("tr", {}, ["release", "resource", "label", "baseline → candidate", "state", "stage", "share", "waiting for", "reason", "updated", "actions"].map((h) => el("th", {}, h)))),
    el("tbody", {}, releases.items.map((x) => el("tr", { "data-release": x.release_id },
      el("td", {}, x.release_id), el("td", {}, x.resource), el("td", {}, x.label), el("td", {}, `${x.baseline} → ${x.candidate}`),
      el("td", {}, el("span", { class: `badge ${x.state}` }, x.state)), el("td", {}, String(x.stage)), el("td", {}, x.share ?? "–"),
      el("td", {}, x.waiting_for || ""), el("td", { class: "clip" }, x.reason), el("td", {}, when(x.updated_at)),
      releaseActions(x)))));
  const auditTable = el("table", { class: "audit" },
    el("thead", {}, el("tr", {}, ["#", "at", "actor", "action", "subject", "reason"].map((h) => el("th", {}, h)))),
    el("tbody", {}, audit.items.map((a) => el("tr", {},
      el("td", {}, String(a.seq)), el("td", {}, when(a.at)), el("td", {}, a.actor), el("td", {}, a.action), el("td", {}, a.subject), el("td", { class: "clip", title: text(a.evidence) }, a.reason)))));
  show(el("h1", {}, "Resources and releases"),
    el("h2", {}, "Resources"), resources.items.length ? resourceBlocks : el("p", {}, "No resources."),
    el("h2", {}, "Releases and their decisions"), releases.items.length ? releaseTable : el("p", {}, "No releases."),
    el("h2", {}, `Audit log (${audit.count} entries, newest first)`), auditTable);
}

const COMMAND_NAMES = { approve: "Approve", abort: "Abort", rollback: "Rollback" };

/** A release's actions cell: a button per command its state takes and the session may give (the
 * server's `commands`), a confirm step with an optional reason, then the command against the step
 * the page shows (a release that moved meanwhile answers 409) and the view drawn again. */
function releaseActions(release) {
  const cell = el("td", { class: "actions" });
  const offer = (...notes) => cell.replaceChildren(...notes, ...(release.commands || []).map((command) =>
    el("button", { type: "button", "data-command": command, onclick: () => confirmStep(command) }, COMMAND_NAMES[command])));
  const confirmStep = (command) => {
    const reason = el("input", { type: "text", class: "reason", placeholder: "reason (audit log)", maxlength: 4096 });
    const go = el("button", { type: "button", class: "confirm", "data-confirm": command }, `Confirm ${COMMAND_NAMES[command].toLowerCase()}`);
    go.addEventListener("click", async () => {
      go.disabled = true;
      try {
        await postJson(`/releases/${enc(release.release_id)}/${command}`, { expected_step: release.step, reason: reason.value });
      } catch (error) {
        offer(failure(error));
        return;
      }
      if ((parseHash().parts[0] || "") === "resources") resourcesView();
    });
    cell.replaceChildren(el("div", { class: "confirm-step" }, el("span", {}, `${COMMAND_NAMES[command]} at step ${release.step}?`), reason, go,
      el("button", { type: "button", class: "cancel", onclick: () => offer() }, "Cancel")));
    reason.focus({ preventScroll: true });
  };
  offer();
  return cell;
}

// -- routing --------------------------------------------------------------------------------

async function route() {
  stopPolling();
  stopPolling = () => {};
  const { parts, params } = parseHash();
  const name = parts[0] || "rollouts";
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.nav === name || (name === "run" && a.dataset.nav === "runs"));
  if (name === "rollout" && parts[1]) return rolloutView(parts, params);
  if (name === "group" && parts[1]) return groupView(parts);
  if (name === "runs") return runsView();
  if (name === "run" && parts[1]) return runView(parts);
  if (name === "resources") return resourcesView();
  return rolloutsView(params);
}

document.addEventListener("DOMContentLoaded", () => {
  window.addEventListener("hashchange", route);
  // Who is logged in is asked for once the view has its data: the view's request goes first.
  const who = () => getJson("/session")
    .then((found) => { document.getElementById("who").textContent = found.auth ? `${found.actor} (${found.role})` : "auth disabled"; })
    .catch(() => {});
  route().then(who, who);
});
