// The live picture of the pixlimit demo. It draws the events the demo's narrator emits (the same
// ones the terminal prints), received over Server-Sent Events from /events. Every picture is a
// function of the events up to the current step, so stepping back and forth is re-drawing.
"use strict";

const events = [];        // every event so far, by seq
let pos = 0;              // how many events are drawn
let playing = true;       // advancing by itself
let done = false;         // the demo said it is over
let focus = null;         // the focused participant, or null
let offset = null;        // the page's clock minus the run's, in seconds
const stepMs = 60;
// Reduced motion: each event is drawn at once, no step animation, and marks do not slide.
const calm = !!(window.matchMedia && matchMedia("(prefers-reduced-motion: reduce)").matches);

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
function el(name, attrs, parent, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function html(name, attrs, parent, text) {
  const e = document.createElement(name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}

// ---- the stream
const source = new EventSource("events");
source.onmessage = (m) => {
  const e = JSON.parse(m.data);
  if (e.seq < events.length) return; // a reconnection's replay
  events.push(e);
  // The run's clock read from the latest event: a page opened late gets the past replayed at once.
  offset = Math.min(offset ?? Infinity, Date.now() / 1000 - e.at);
  if (e.kind === "done") { done = true; source.close(); }
  if (playing && (calm || pos === events.length - 1)) { pos = events.length; draw(); } else drawPosition();
};

// ---- playback
setInterval(() => {
  if (playing && pos < events.length) { pos++; draw(); }
}, stepMs);
function seek(n) { pos = Math.max(0, Math.min(events.length, n)); draw(); }
$("start").onclick = () => { playing = false; seek(0); };
$("back").onclick = () => { playing = false; seek(pos - 1); };
$("fwd").onclick = () => { playing = false; seek(pos + 1); };
$("end").onclick = () => { seek(events.length); };
$("play").onclick = () => { playing = !playing; drawPosition(); };
document.addEventListener("keydown", (k) => {
  const keys = { " ": "play", ArrowLeft: "back", ArrowRight: "fwd", Home: "start", End: "end" };
  if (!keys[k.key] || k.defaultPrevented) return;
  if (k.key === " " && k.target.closest && k.target.closest("button, [role=button]")) return; // the focused control's own
  k.preventDefault();
  $(keys[k.key]).click();
});

// ---- what the events up to pos say
function scenarioAt(p) {
  for (let i = p - 1; i >= 0; i--) if (events[i].scenario) return events[i].scenario;
  return "";
}
function shown() { return events.slice(0, pos); }

function draw() {
  drawPosition();
  const sc = scenarioAt(pos);
  drawStories(sc);
  drawSequence(sc);
  drawWindows(sc);
  drawHole();
  drawCosts(sc);
}

function drawPosition() {
  $("pos").textContent = `step ${pos} of ${events.length}`;
  $("play").textContent = playing ? "▮▮" : "▶";
  $("status").textContent = done ? "done" : "live";
  $("status").className = done ? "done" : "live";
  $("status").dataset.events = events.length;
}

function drawStories(current) {
  const list = $("story-list");
  list.textContent = "";
  const byScenario = new Map();
  for (const e of shown()) {
    if (e.kind === "title") byScenario.set(e.scenario, { title: e.text, verdicts: [] });
    if (e.kind === "verdict" && byScenario.has(e.scenario)) byScenario.get(e.scenario).verdicts.push(e);
  }
  for (const [name, s] of byScenario) {
    const li = html("li", { "data-scenario": name, class: name === current ? "current" : "" }, list);
    html("div", { class: "title" }, li, s.title);
    const ul = html("ul", {}, li);
    for (const v of s.verdicts) {
      html("li", { class: "verdict " + (v.ok ? "ok" : "no"), title: "saw " + v.observed }, ul, v.text);
    }
  }
  let say = "";
  for (const e of shown()) if (e.kind === "say" || e.kind === "wait" || e.kind === "title") say = e.text;
  $("say").textContent = say;
}

// ---- the sequence
const lanes = ["client", "replica 1", "replica 2", "Redis", "ledger"];
const laneX = (i) => 70 + i * 150;
const ledgerRoutes = ["/v1/pix", "/v1/statement", "/v1/limits", "/v1/devices", "/v1/login"];

function drawSequence(sc) {
  const svg = $("seq");
  svg.textContent = "";
  const defs = el("defs", {}, svg);
  const m = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" }, defs);
  el("path", { d: "M0,0 L10,5 L0,10 z", fill: "#57606a" }, m);
  const calls = shown().filter((e) => e.kind === "call" && e.scenario === sc);
  const rowH = 46, top = 50;
  const height = top + Math.max(1, calls.length) * rowH + 20;
  svg.setAttribute("width", laneX(lanes.length - 1) + 90);
  svg.setAttribute("height", height);
  lanes.forEach((name, i) => {
    const g = el("g", { class: "participant" + (focus === name ? " focused" : ""), "data-participant": name,
      tabindex: 0, role: "button", "aria-pressed": focus === name, "aria-label": `focus ${name}` }, svg);
    el("rect", { x: laneX(i) - 55, y: 6, width: 110, height: 24, rx: 4 }, g);
    el("text", { x: laneX(i), y: 22, "text-anchor": "middle" }, g, name);
    const toggle = () => { focus = focus === name ? null : name; drawSequence(scenarioAt(pos)); };
    g.addEventListener("click", toggle);
    g.addEventListener("keydown", (k) => { if (k.key === "Enter" || k.key === " ") { k.preventDefault(); toggle(); } });
    el("line", { class: "lane", x1: laneX(i), y1: 30, x2: laneX(i), y2: height }, svg);
  });
  const group = el("g", { class: "scenario", "data-scenario": sc }, svg);
  calls.forEach((c, i) => {
    const y = top + i * rowH;
    const rep = laneX(c.replica || 1);
    const involved = ["client", "replica " + (c.replica || 1)];
    const g = el("g", { class: "exchange", "data-path": c.path }, group);
    const call = el("g", { class: "call" }, g);
    el("line", { x1: laneX(0), y1: y, x2: rep - 4, y2: y }, call);
    el("text", { x: laneX(0) + 6, y: y - 3 }, call, `${c.ip}  ${c.method} ${c.path}`);
    const decided = !!c.policy; // the route is limited: its answer declared a policy
    if (c.memory) { // the deny cache or the open breaker answered: no call to Redis
      const d = el("g", { class: "decide memory" }, g);
      el("circle", { cx: rep, cy: y + 6, r: 3 }, d);
      el("text", { x: rep + 6, y: y + 9 }, d, "from memory");
    } else if (c.scripts > 0) {
      // One arrow for each Redis call its limiter made for it (a PIX: its buckets and its limit
      // in one, then the buckets settled).
      const d = el("g", { class: "decide", "data-scripts": c.scripts }, g);
      for (let k = 0; k < c.scripts; k++) {
        const yk = y + 2 + k * 4;
        el("line", { class: "script", x1: rep, y1: yk, x2: laneX(3) - 4, y2: yk }, d);
      }
      el("text", { x: laneX(3) + 4, y: y + 8 }, d, `${c.scripts} script call${c.scripts > 1 ? "s" : ""}`);
      involved.push("Redis");
    } else if (c.scripts === undefined && decided) {
      // Redis decided it, in calls not counted (a deployment's, or a burst's, whose calls mix):
      // one dotted arrow, no number.
      const d = el("g", { class: "decide uncounted", "data-scripts": "" }, g);
      el("line", { class: "script", x1: rep, y1: y + 2, x2: laneX(3) - 4, y2: y + 2 }, d);
      el("text", { x: laneX(3) + 4, y: y + 8 }, d, "Redis calls not counted");
      involved.push("Redis");
    }
    if (askedLedger(c) && ledgerRoutes.some((r) => c.path.startsWith(r))) {
      const l = el("g", { class: "ledger" }, g);
      el("line", { x1: rep, y1: y + 10, x2: laneX(4) - 4, y2: y + 10 }, l);
      involved.push("ledger");
    }
    const kind = c.status >= 200 && c.status < 300 ? "ok" : c.status === 429 ? "refused" : "error";
    const reply = el("g", { class: `reply ${kind} s${c.status}`, "data-status": c.status, "data-path": c.path }, g);
    el("line", { x1: rep, y1: y + 16, x2: laneX(0) + 4, y2: y + 16 }, reply);
    const left = c.remaining ? ` · ${c.remaining} left` : "";
    const retry = c.retry_after ? ` · retry after ${c.retry_after}s` : "";
    const waited = c.waited ? ` · waited its turn ${c.waited} ms` : "";
    el("text", { x: laneX(0) + 6, y: y + 29 }, reply, `${c.text}${left}${retry}${waited}`);
    if (focus && !involved.includes(focus)) g.classList.add("dimmed");
  });
  $("seq-title").textContent = sc ? `The sequence: ${sc}` : "The sequence";
}

// askedLedger says whether the answer came after the ledger was asked: not a refusal before it
// (malformed, too large, limited, a bearer token refused, no limiter to decide).
function askedLedger(c) {
  if (!(c.status > 0) || [400, 413, 415, 429].includes(c.status)) return false;
  if (c.status === 401 && c.path !== "/v1/login") return false;
  return c.code !== "rate_limiter_unavailable";
}

// ---- the window of a key
// parsePolicies reads every item of RateLimit-Policy ("login-ip";q=10;w=600, "login-account";…).
function parsePolicies(p) {
  return [...(p || "").matchAll(/"([^"]+)";q=(\d+);w=(\d+)/g)].map((m) => ({ name: m[1], q: +m[2], w: +m[3] }));
}
function clockAt() {
  if (pos === 0) return 0;
  if (pos === events.length && !done && offset !== null) return Date.now() / 1000 - offset; // live: time runs on
  return events[pos - 1].at;
}
function drawWindows(sc) {
  const svg = $("windows");
  svg.textContent = "";
  const keys = new Map();
  for (const c of shown()) {
    if (c.kind !== "call" || c.scenario !== sc) continue;
    const policies = parsePolicies(c.policy);
    for (const p of policies) {
      // A bucket counts tokens, not requests in a window: the look-ups' are left out.
      if (p.name.startsWith("pix-lookup")) continue;
      // An admission counts in every key decided; a refusal is the refusing key's alone.
      if (c.status === 429 && p.name !== (c.worst || policies[0].name)) continue;
      // Whose key it is: the IP for login-ip, else who sent the request (its account or document).
      const k = `${p.name} · ${p.name === "login-ip" || !c.who ? c.ip : c.who}`;
      if (!keys.has(k)) keys.set(k, { p, calls: [] });
      keys.get(k).calls.push(c);
    }
  }
  // Each key is a row: its window as a line, "now" at the right end; an admission is a dot above
  // the line, a refusal a cross below it, stacked where they came at the same moment.
  const W = 380, x0 = 6, step = 9;
  const now = clockAt();
  svg.setAttribute("width", x0 + W + 14);
  let y = 4;
  for (const [k, { p, calls }] of keys) {
    const g = el("g", { class: "key", "data-key": k }, svg);
    const x = (t) => x0 + ((t - (now - p.w)) / p.w) * W;
    const levels = { ok: new Map(), no: new Map() };
    const marks = [];
    for (const c of calls) {
      if (c.at < now - p.w) continue; // slid out of the window
      const kind = c.status === 429 ? "no" : "ok";
      const column = Math.round((Math.min(x0 + W, x(c.at)) - x0) / step);
      const level = levels[kind].get(column) || 0;
      levels[kind].set(column, level + 1);
      marks.push({ c, kind, cx: x0 + column * step, level });
    }
    const up = Math.max(1, ...levels.ok.values()), down = Math.max(1, ...levels.no.values());
    const admitted = marks.filter((m) => m.kind === "ok").length;
    el("text", { x: 0, y: y + 11 }, g, k);
    el("text", { class: "count", x: x0 + W, y: y + 11, "text-anchor": "end", "data-admitted": admitted }, g,
      `${admitted} of ${p.q} in the window`);
    const axis = y + 18 + up * step;
    el("rect", { class: "window-frame", x: x0, y: y + 16, width: W, height: (up + down) * step + 6 }, g);
    el("line", { class: "axis", x1: x0, y1: axis, x2: x0 + W, y2: axis }, g);
    for (const c of calls) {
      if (c.status !== 429 || !c.retry_after) continue;
      const end = Math.min(x0 + W, x(c.at + +c.retry_after)), start = Math.max(x0, x(c.at));
      if (end > start) el("rect", { class: "retry", x: start, y: axis - 2, width: end - start, height: 4 }, g);
    }
    for (const m of marks) {
      if (m.kind === "ok") el("circle", { class: "mark ok", cx: m.cx, cy: axis - 5 - m.level * step, r: 3.5 }, g);
      else {
        const cy = axis + 5 + m.level * step;
        el("path", { class: "mark no", d: `M${m.cx - 3},${cy - 3} l6,6 m0,-6 l-6,6` }, g);
      }
    }
    const bottom = y + 22 + (up + down) * step;
    el("text", { class: "scale", x: x0, y: bottom + 12 }, g, `−${p.w}s`);
    el("text", { class: "scale", x: x0 + W, y: bottom + 12, "text-anchor": "end" }, g, "now");
    y = bottom + 24;
  }
  svg.setAttribute("height", Math.max(20, y));
}

// ---- the 2× hole
function drawHole() {
  const box = $("hole");
  box.textContent = "";
  const rows = new Map();
  for (const e of shown()) {
    if (e.kind !== "decision") continue;
    const group = e.phase === "before" || e.phase === "after" ? "boundary" : "buckets";
    const k = `${group}:${e.algorithm}`;
    if (!rows.has(k)) rows.set(k, { group, algorithm: e.algorithm, first: [], second: [] });
    const r = rows.get(k);
    (e.phase === "before" || e.phase === "burst" ? r.first : r.second).push(e.allowed);
  }
  let lastGroup = "";
  for (const r of rows.values()) {
    if (r.group !== lastGroup) {
      html("div", { class: "what" }, box, r.group === "boundary" ? "5 per 2s: t−0.3s | t+0.1s, across a boundary" : "burst of 5, then 5 per 2s: at once | one every 200ms");
      lastGroup = r.group;
    }
    const div = html("div", { class: "hole-row", "data-algorithm": r.algorithm, "data-group": r.group }, box);
    html("span", { class: "name" }, div, r.algorithm);
    const marks = (list) => list.forEach((ok) => html("span", { class: "mark " + (ok ? "ok" : "no") }, div, ok ? "✔" : "✘"));
    marks(r.first);
    html("span", { class: "sep" }, div, "|");
    marks(r.second);
    const admitted = r.first.concat(r.second).filter(Boolean).length;
    html("span", { class: "admitted", "data-admitted": admitted }, div, `  ${admitted} admitted`);
  }
}

// ---- the costs
function drawCosts(sc) {
  const box = $("costs");
  box.textContent = "";
  const stats = shown().filter((e) => e.kind === "stats");
  if (stats.length === 0) { html("div", { class: "what" }, box, "(in-process replicas only)"); return; }
  const before = [...stats].reverse().find((e) => e.scenario !== sc) || { redis_calls: 0, cached_refusals: 0 };
  const mine = stats.filter((e) => e.scenario === sc);
  const last = mine.length ? mine[mine.length - 1] : before;
  const redis = (last.redis_calls || 0) - (before.redis_calls || 0);
  const cached = (last.cached_refusals || 0) - (before.cached_refusals || 0);
  html("div", { class: "cost", "data-cached": cached, "data-redis": redis }, box,
    `In this story: ${cached} refusals answered from memory, ${redis} Redis calls.`);
  const line = html("div", { class: "breakers" }, box, "Breaker, at each expectation: ");
  for (const s of mine) html("span", { class: "breaker" + (s.breaker_open ? " open" : ""), title: s.breaker_open ? "open" : "closed" }, line);
}

function tick() { if (pos === events.length && !done) drawWindows(scenarioAt(pos)); requestAnimationFrame(tick); }
if (!calm) requestAnimationFrame(tick);

// For tests and the curious: the events, and a way to step to just after one.
window.pixlimit = {
  events, seek, pause() { playing = false; drawPosition(); },
  seekAfter(text) {
    const i = events.findIndex((e) => (e.text || "").includes(text));
    if (i >= 0) { playing = false; seek(i + 1); }
    return i;
  },
  get pos() { return pos; },
  get done() { return done; },
};
