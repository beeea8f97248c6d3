// The live page: polls GET /ui/api/live for the caller's new requests, its pins and the tiers.
// Every server-provided string goes into the page as text (textContent / text nodes), never as HTML.
"use strict";

const POLL_MS = 1500;
const KEY = "kvreuse-ui-key";
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
const view = { after: 0, records: [], selected: null, paused: false, timer: null, history: 200 };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

const fmt = (n) => Number(n).toLocaleString("en-US");
const pct = (x) => `${(100 * x).toFixed(1)}%`;
const secs = (s) => (s === null || s === undefined ? "–" : s < 1 ? `${(s * 1000).toFixed(0)} ms` : `${s.toFixed(2)} s`);
const bytes = (b) => (b >= 1 << 30 ? `${(b / (1 << 30)).toFixed(1)} GiB` : `${(b / (1 << 20)).toFixed(1)} MiB`);
const clock = (t) => new Date(t * 1000).toLocaleTimeString("en-GB");
// widths through the CSSOM: the page's Content-Security-Policy refuses inline style attributes
function seg(cls, n, total, title) {
  const s = el("span", { class: cls, title });
  s.style.width = `${(100 * n) / Math.max(total, 1)}%`;
  return s;
}

const causeClass = (c) => (c === "append_only" || c === "precomputed" ? "hit" : c === "new_conversation" || !c ? "" : "miss");

function setStatus(text, cls) {
  const s = $("status");
  s.textContent = text;
  s.className = `status ${cls}`;
}

function schedule() {
  clearTimeout(view.timer);
  if (!view.paused) view.timer = setTimeout(poll, POLL_MS);
}

async function poll() {
  const key = sessionStorage.getItem(KEY);
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  let r;
  try {
    r = await fetch(`/ui/api/live?after=${view.after}`, { headers, cache: "no-store" });
  } catch (e) {
    setStatus("server unreachable", "down");
    return schedule();
  }
  const body = await r.json().catch(() => ({}));
  if (r.status === 401) return showLogin(key ? (body.error && body.error.message) || "key refused" : "");
  if (!r.ok) {
    setStatus((body.error && body.error.message) || `HTTP ${r.status}`, "down");
    return schedule();
  }
  $("login").hidden = true;
  $("main").hidden = false;
  $("forget").hidden = !key;
  apply(body);
  setStatus(view.paused ? "paused" : "live", "up");
  schedule();
}

function showLogin(message) {
  $("main").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message;
  setStatus("API key needed", "down");
}

function apply(body) {
  view.history = body.history;
  view.records.push(...body.requests);
  view.records = view.records.slice(-view.history);
  if (view.records.length) view.after = view.records[view.records.length - 1].seq;
  $("model").textContent = body.model;
  $("tenant").hidden = !body.keys;
  $("tenant").textContent = `tenant ${body.tenant}`;
  renderCards(body);
  renderTiers(body.tiers, body.cache);
  renderPins(body.cache);
  if (body.requests.length) {
    renderRequests();
    renderCharts();
  }
}

function renderCards(body) {
  const rs = view.records;
  const prompt = rs.reduce((a, r) => a + r.prompt_tokens, 0);
  const cached = rs.reduce((a, r) => a + r.cached_tokens, 0);
  $("hit-rate").textContent = prompt ? pct(cached / prompt) : "–";
  $("hit-sub").textContent = `${fmt(cached)} of ${fmt(prompt)} prompt tokens cached, last ${rs.length} requests`;
  const ttfts = rs.map((r) => r.ttft_s).filter((t) => t !== null).sort((a, b) => a - b);
  $("ttft").textContent = ttfts.length ? secs(ttfts[Math.floor(ttfts.length / 2)]) : "–";
  $("ttft-sub").textContent = ttfts.length ? `median; max ${secs(ttfts[ttfts.length - 1])}` : "";
  if (!body.engine) {  // a tenant key: the engine's queues move with other tenants' traffic
    $("running").textContent = "–";
    $("engine-sub").textContent = "the server's queues are shown to the operator key";
    return;
  }
  $("running").textContent = `${body.engine.running} running`;
  $("engine-sub").textContent = `${body.engine.waiting} waiting, ${body.engine.in_flight} HTTP requests in flight`;
}

function meter(label, used, total, parts) {
  const bar = el("div", { class: "bar" });
  for (const [cls, n, title] of parts) {
    if (n > 0) bar.append(seg(cls, n, total, title));
  }
  return el("div", { class: "tier", "data-tier": label },
    el("div", { class: "label" }, el("b", {}, label), el("span", {}, used)), bar);
}

function renderTiers(t, cache) {
  const p = t.pool;
  if (t.scope === "own") {  // a tenant key: the pool's size and its own pins, as its /v1/cache
    $("tiers").replaceChildren(meter("pool", `${fmt(p.pinned)} of ${fmt(p.total)} pages pinned by this key`, p.total,
      [["p-pinned", p.pinned, `${p.pinned} pages pinned by this key`]]),
    el("div", { class: "tier sub", "data-tier": "own" }, "the pool's other pages and the lower tiers are shown to the operator key"));
    return;
  }
  const out = [meter("pool", `${fmt(p.total - p.free)} / ${fmt(p.total)} pages`, p.total, [
    ["p-inuse", p.in_use, `${p.in_use} pages held by running requests`],
    ["p-pinned", p.pinned, `${p.pinned} pages pinned (sessions, prewarm)`],
    ["p-cached", p.cached, `${p.cached} cached pages, evictable`],
  ]), el("div", { class: "legend sub" }, el("i", { class: "p-inuse" }), `requests ${fmt(p.in_use)}`,
    el("i", { class: "p-pinned" }), `pinned ${fmt(p.pinned)}`, el("i", { class: "p-cached" }),
    `cached ${fmt(p.cached)}`, ` · free ${fmt(p.free)}`)];
  out.push(t.host
    ? meter("host", `${fmt(t.host.pages)} / ${fmt(t.host.capacity_pages)} pages`, t.host.capacity_pages,
        [["seg-host", t.host.pages, "host tier pages"]])
    : el("div", { class: "tier sub", "data-tier": "host" }, "host tier: off (--kv-host-memory)"));
  out.push(t.disk
    ? meter("disk", `${fmt(t.disk.pages)} pages, ${bytes(t.disk.bytes)} / ${bytes(t.disk.budget_bytes)}`,
        t.disk.budget_bytes, [["seg-disk", t.disk.bytes, "disk tier bytes"]])
    : el("div", { class: "tier sub", "data-tier": "disk" }, "disk tier: off (--kv-store)"));
  out.push(sharedTier(t.shared));
  if (cache && cache.eviction_shadows) out.push(shadowsRow(cache.eviction_shadows));
  if (cache && cache.eviction_predictor) out.push(predictorRow(cache.eviction_predictor));
  $("tiers").replaceChildren(...out);
}

// --eviction-shadows: the pool's hit rate beside what each shadow policy would have hit on the same requests.
function shadowsRow(s) {
  const rate = (key, label, r, cls) => el("span", { class: cls, "data-policy": key }, `${label} `, el("b", {}, pct(r.hit_rate)));
  const best = Math.max(...Object.values(s.policies).map((r) => r.hit_rate));
  return el("div", { class: "tier", "data-tier": "shadows" },
    el("div", { class: "label" }, el("b", {}, "eviction shadows"), el("span", { class: "sub" }, `${fmt(s.prompt_tokens)} prompt tokens`)),
    el("div", { class: "sub" }, rate("served", `served (${s.served.policy})`, s.served, "served"), " · ",
      ...Object.entries(s.policies).flatMap(([name, r], i) =>
        [i ? " · " : "", rate(name, name, r, r.hit_rate === best && best > s.served.hit_rate ? "better" : "")])));
}

// --eviction-policy predict: how often what it kept came back, against what it evicted (labels seen afterwards).
function predictorRow(p) {
  const rate = (side) => el("b", { "data-field": side }, p[side].return_rate === null ? "-" : pct(p[side].return_rate));
  return el("div", { class: "tier", "data-tier": "predictor" },
    el("div", { class: "label" }, el("b", {}, "eviction predictor"), el("span", { class: "sub" }, `${fmt(p.labelled)} labelled`)),
    el("div", { class: "sub" }, "kept came back ", rate("kept"), " · evicted came back ", rate("evicted")));
}

// No meter: the store's budget is the Valkey server's maxmemory, which this replica does not hold.
function sharedTier(s) {
  if (!s) return el("div", { class: "tier sub", "data-tier": "shared" }, "shared tier: off (--kv-shared-store)");
  const row = el("div", { class: `tier${s.degraded ? " degraded" : ""}`, "data-tier": "shared" },
    el("div", { class: "label" }, el("b", {}, "shared"), el("span", { class: "sub" }, s.url)),
    el("div", { class: "sub" }, el("i", { class: "seg-shared" }), "written ",
      el("b", { "data-field": "written" }, fmt(s.written_pages)), " pages · loaded ",
      el("b", { "data-field": "loaded" }, fmt(s.loaded_tokens)), " tokens · failures ",
      el("b", { "data-field": "failures" }, fmt(s.failures))));
  if (s.degraded) {
    row.append(el("div", { class: "error" }, "degraded: serving from the pool alone, store unreachable: ",
      el("span", { "data-field": "degraded" }, s.degraded)));
  }
  return row;
}

function renderPins(cache) {
  const rows = [];
  if (cache.prefix_cache === "off") {
    rows.push(el("tr", {}, el("td", { colspan: 4 }, "prefix cache off")));
  } else {
    for (const [kind, list] of [["session", cache.sessions], ["prewarmed", cache.prewarmed]]) {
      for (const p of list) {
        rows.push(el("tr", { "data-pin": p.id }, el("td", {}, kind), el("td", {}, String(p.id)),
          el("td", {}, fmt(p.pinned_tokens)), el("td", {}, `${p.ttl_left_s.toFixed(0)} s`)));
      }
    }
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 4, class: "hint" }, "no live pins: send a `user` or X-Session-Id to pin a session")));
    const l = cache.evictions.pin_lapses;
    const evicted = cache.evictions.evicted_pages;  // absent for a tenant key (others' traffic moves it)
    $("lapses").textContent = (evicted === undefined ? "" : `evicted pages ${fmt(evicted)}; `) + "pin lapses: " +
      Object.entries(l).map(([k, v]) => `${k} ${v}`).join(", ");
  }
  document.querySelector("#pins tbody").replaceChildren(...rows);
}

function segments(r) {
  const t = r.cached_by_tier;
  return [["seg-pool", t.pool, "cached (pool)"], ["seg-host", t.host, "cached (host)"], ["seg-disk", t.disk, "cached (disk)"],
    ["seg-shared", t.shared, "cached (shared)"], ["seg-prefill", r.prefilled_tokens, "prefilled"], ["seg-gen", r.generated_tokens, "generated"]];
}

function requestRow(r, scale) {
  const bar = el("div", { class: "bar" });
  for (const [cls, n, what] of segments(r)) {
    if (n > 0) bar.append(seg(cls, n, scale, `${fmt(n)} ${what}`));
  }
  const cause = r.cache ? r.cache.cause : "no diagnosis";
  const figures = el("div", { class: "figures" },
    "cached ", el("b", { "data-field": "cached" }, String(r.cached_tokens)),
    " · prefilled ", el("b", { "data-field": "prefilled" }, String(r.prefilled_tokens)),
    " · generated ", el("b", { "data-field": "generated" }, String(r.generated_tokens)),
    " · TTFT ", el("b", {}, secs(r.ttft_s)), ` · ${r.id}`);
  const row = el("div", { class: `req${view.selected === r.id ? " selected" : ""}`, "data-testid": "request", "data-id": r.id },
    el("span", { class: "when" }, clock(r.time)), bar, el("span", { class: `cause ${causeClass(r.cache && r.cache.cause)}` }, cause), figures);
  row.addEventListener("click", () => select(r.id));
  return row;
}

function renderRequests() {
  const rs = view.records;
  const scale = Math.max(1, ...rs.map((r) => r.prompt_tokens + r.generated_tokens));
  $("requests").replaceChildren(...rs.slice().reverse().map((r) => requestRow(r, scale)));
}

function select(id) {
  view.selected = id;
  renderRequests();
  renderDetail(view.records.find((r) => r.id === id));
}

function renderDetail(r) {
  const d = $("detail");
  if (!r) return d.replaceChildren(el("p", { class: "hint" }, "That request left the page's history."));
  const t = r.cached_by_tier;
  const parts = [el("h2", {}, `request ${r.id}`), el("dl", {},
    el("dt", {}, "prompt tokens"), el("dd", {}, fmt(r.prompt_tokens)),
    el("dt", {}, "cached"), el("dd", { "data-field": "cached" }, `${fmt(r.cached_tokens)} (pool ${fmt(t.pool)}, host ${fmt(t.host)}, disk ${fmt(t.disk)}, shared ${fmt(t.shared)})`),
    el("dt", {}, "prefilled"), el("dd", { "data-field": "prefilled" }, fmt(r.prefilled_tokens)),
    el("dt", {}, "generated"), el("dd", {}, fmt(r.generated_tokens)),
    el("dt", {}, "TTFT"), el("dd", {}, secs(r.ttft_s)),
    el("dt", {}, "session"), el("dd", {}, r.session === null ? "–" : String(r.session)),
    el("dt", {}, "finished"), el("dd", {}, `${clock(r.time)} (${r.finish_reason})`))];
  const c = r.cache;
  if (!c) {
    parts.push(el("p", { class: "hint" }, "No cache diagnosis: only chat requests (/v1/chat/completions, /v1/messages) are diagnosed."));
    return d.replaceChildren(...parts);
  }
  parts.push(el("h2", {}, "cache"),
    el("p", {}, el("span", { class: `cause ${causeClass(c.cause)}`, "data-field": "cause" }, c.cause), " ",
      el("span", { "data-field": "cause-detail" }, c.detail)),
    el("p", { class: "sub" }, `${fmt(c.reusable_tokens)} tokens shared with the closest earlier request; ${fmt(c.cached_tokens)} were cached`));
  const v = c.divergence;
  if (v) parts.push(...breakView(v, r.break || {}));
  d.replaceChildren(...parts);
}

function breakView(v, b) {
  const out = [el("h2", {}, "where the prefix broke"),
    el("p", { "data-field": "where" }, `token ${fmt(v.token_index)}: ${v.where}` + (v.where.includes(`(${v.segment})`) ? "" : ` (${v.segment})`)),
    el("div", { class: "sides" },
      el("div", {}, el("h3", {}, v.in_generated_part ? "earlier request (as generated)" : "earlier request"),
        el("pre", { "data-field": "earlier" }, v.before_text, el("mark", { class: "old" }, b.earlier_text || "…"))),
      el("div", {}, el("h3", {}, "this request"),
        el("pre", { "data-field": "new" }, v.before_text, el("mark", { class: "new" }, v.new_text))))];
  if (b.message) {
    out.push(el("div", { class: "message" }, el("h3", {}, `message ${b.message.index} (${b.message.role})`),
      el("pre", { "data-field": "message" }, b.message.text)));
  }
  return out;
}

function chart(id, values, top, label) {
  const svg = $(id);
  const W = 400, H = 120, pad = 14;
  const n = values.length;
  const x = (i) => pad + (n <= 1 ? 0 : ((W - 2 * pad) * i) / (n - 1));
  const y = (v) => H - pad - ((H - 2 * pad) * v) / (top || 1);
  const kids = [];
  const line = (x1, y1, x2, y2) => { const l = document.createElementNS(SVG, "line"); for (const [k, v] of Object.entries({ x1, y1, x2, y2, class: "axis" })) l.setAttribute(k, v); return l; };
  kids.push(line(pad, H - pad, W - pad, H - pad), line(pad, pad, W - pad, pad));
  const text = document.createElementNS(SVG, "text");
  text.setAttribute("x", 2); text.setAttribute("y", pad - 4); text.textContent = label;
  kids.push(text);
  const pts = values.map((v, i) => `${x(i)},${y(v)}`);
  const poly = document.createElementNS(SVG, "polyline");
  poly.setAttribute("points", pts.join(" "));
  kids.push(poly);
  svg.replaceChildren(...kids);
}

function renderCharts() {
  const rs = view.records;
  chart("chart-hit", rs.map((r) => (r.prompt_tokens ? r.cached_tokens / r.prompt_tokens : 0)), 1, "100%");
  const ttfts = rs.map((r) => r.ttft_s || 0);
  const top = Math.max(...ttfts, 0.001);
  chart("chart-ttft", ttfts, top, secs(top));
}

$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(KEY, $("key").value.trim());
  $("key").value = "";
  poll();
});
$("forget").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  location.reload();
});
$("pause").addEventListener("click", () => {
  view.paused = !view.paused;
  $("pause").textContent = view.paused ? "resume" : "pause";
  setStatus(view.paused ? "paused" : "live", "up");
  if (!view.paused) poll();
  else clearTimeout(view.timer);
});
poll();
