// raftlease live view (raftlease/server/dashboard.py). No framework, no build step.
//
// Data flow: one load of /ui/api/state, then /v1/watch (NDJSON over fetch, so the
// bearer token can be sent; EventSource cannot send headers) from the revision that
// load was taken at. Each lease event updates the table at once; the key's holders
// (remaining TTL: events carry none) and waiters are then re-read with /ui/api/key.
// Waiters joining a queue, session keep-alives and queue depths are not watch events,
// so /ui/api/live (no lease list) and /ui/api/cluster are re-read every few seconds.
//
// Freshness: /readyz (this node's readiness verdict) and /ui/api/health (its role, term
// and leader, from memory: both answer even when the node is cut off) are asked every
// second. The badge
// (#conn) is "live" only while that answer is recent and ready with a leader, the last
// data refresh succeeded within two refresh periods and the watch is connected;
// otherwise "stale" with the reason, the data is dimmed, and links to the other
// members' dashboards are shown (#switch).
//
// Switching: when the node read from has been unreachable, not ready or without a
// leader for SWITCH_AFTER_MS, the page moves all its reads (the /ui/api/ routes,
// /readyz and the watch) to another member's admin endpoint (its origin, from the
// cluster answer's dashboard URL; ready ones and the leader first, each tried once
// until one turns live), says so in #reading ("reading from n2 (n1 unreachable)"), and
// keeps probing its own origin: after HOME_HEALTHY_PROBES ready answers with a leader
// it reads from there again. The badge always judges the node read from. The other
// node lets this page read it (CORS) because this page's origin is a member's admin
// origin (server/http/cors.py), and the page's connect-src lists those origins. The
// token goes there too (same cluster, same tokens). ?pin=1 keeps the page on its node.
//
// Every key, owner and value is hostile input: it only ever reaches the page as
// textContent or an attribute value, never as markup (no innerHTML anywhere).
"use strict";

const TOKEN_KEY = "raftlease.token";
const LIVE_EVERY_MS = 2000;
const CLUSTER_EVERY_MS = 3000;
const HEALTH_EVERY_MS = 1000;
// Data older than two refresh periods (and a little slack) is stale.
const STALE_AFTER_MS = 2 * LIVE_EVERY_MS + 500;
const REQUEST_TIMEOUT_MS = 4000;
const KEY_REFRESH_DELAY_MS = 150;
// Bad this long (unreachable, not ready, no leader): read from another member.
const SWITCH_AFTER_MS = 2 * LIVE_EVERY_MS;
const HOME_PROBE_EVERY_MS = 2000;
const HOME_HEALTHY_PROBES = 2;
const PINNED = new URLSearchParams(location.search).has("pin");
const TIMELINE_WINDOW_MS = 5 * 60 * 1000;
const TIMELINE_MAX_ROWS = 30;
// A read/write lock's capacity (raftlease.models.RW_CAPACITY): a reader takes one unit,
// a writer all of them.
const RW_CAPACITY = 1000000;
const SESSION_KEYS_SHOWN = 8;

const view = {
  keys: new Map(),        // key -> {holders: Map(token -> holder), capacity, waiters: []}
  sessions: [],           // {owner, ttl, remaining, leases, waiters, expiresAt}
  queues: [],
  budgets: { rows: [], more: 0, leader: false },  // from /ui/api/live
  nodes: [],
  revision: 0,
  // {key, owner, token, start, end|null, seeded, sessionRef} on performance.now();
  // seeded: already held when first seen (page load, reconnect): it started earlier.
  intervals: [],
  filter: { mode: "prefix", text: "" },
  openQueue: null,        // the queue whose task view is open
  sessionOwners: new Map(),  // session label -> its owner
  stream: null,           // AbortController of the watch
  pendingKeys: new Set(),
  keyRevision: new Map(),  // key -> revision of the last event on it
  keyTimer: null,
  // Freshness (performance.now() times).
  health: null,           // the last /ui/api/health answer, with /readyz's ready and reason
  healthAt: null,         // when it arrived
  healthError: null,      // the last attempt's error (null: it succeeded)
  dataAt: null,           // the last successful /ui/api/state or /ui/api/live
  dataNode: null,         // the node that answered it
  watching: false,        // the watch stream is connected
  watchError: "",
  authNeeded: false,
  lastHeard: new Map(),   // node id -> when the page last got an answer from or about it
  servedBy: null,         // the node the cluster answer came from
  dashboards: new Map(),  // node id -> its dashboard URL, as last reported
  leaders: [],            // {node, term, at (performance.now()), wall (Date)}: leaders seen
  // Switching (see top): base is "" (this page's own origin) or another member's
  // admin origin, which every read goes to.
  base: "",
  readingNode: null,      // the member read from while base is not ""
  homeNode: null,         // this page's own node (from its health answers)
  homeReason: "",         // why it was left: "unreachable", "not ready", "no leader"
  badSince: null,         // since when the node read from is bad
  tried: new Set(),       // origins moved to since the page was last live
  homeGood: 0,            // consecutive ready probes of the own origin
};

const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function setConn(state, text) {
  const conn = $("conn");
  conn.dataset.state = state;
  conn.textContent = text || state;
}

// ------------------------------------------------------------------ requests

class AuthNeeded extends Error {}

function headers() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: "Bearer " + token } : {};
}

async function getJSON(path) {
  // A node that is stopped (not dead) never answers: give up and call it unreachable.
  const response = await fetch(view.base + path, {
    headers: headers(), cache: "no-store", signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
  if (response.status === 401 || response.status === 403) {
    let message = "token refused";
    try { message = (await response.json()).error.message; } catch (e) { /* keep */ }
    throw new AuthNeeded(message);
  }
  const body = await response.json();
  if (!response.ok) throw new Error((body.error && body.error.message) || response.statusText);
  return body;
}

function askToken(message) {
  view.authNeeded = true;
  $("auth").hidden = false;
  $("auth-error").textContent = message || "";
  setConn("error", "token needed");
}

$("auth").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  $("token").value = "";
  $("auth").hidden = true;
  view.authNeeded = false;
  setConn("connecting");
  start();
  refreshHealth();
  refreshCluster();
});

// ------------------------------------------------------------------- model

function holderFrom(h, sentAt) {
  return {
    owner: h.owner,
    token: h.token,
    units: h.units || 1,
    unitIndices: h.unit_indices || null,
    value: h.value,
    ttl: h.ttl,
    expiresAt: typeof h.remaining === "number" ? sentAt + h.remaining : null,
    sessionRef: h.session_ref || null,
  };
}

function entry(key) {
  let item = view.keys.get(key);
  if (!item) {
    item = { holders: new Map(), capacity: 1, waiters: [] };
    view.keys.set(key, item);
  }
  return item;
}

function dropIfEmpty(key) {
  const item = view.keys.get(key);
  if (item && item.holders.size === 0 && item.waiters.length === 0) view.keys.delete(key);
}

// seeded: the holder was found in a read, not seen granted: it held the key earlier.
function openInterval(key, owner, token, seeded, sessionRef) {
  const open = view.intervals.find((i) => i.key === key && i.token === token && i.end === null);
  if (open) {
    if (sessionRef) open.sessionRef = sessionRef;
    return;
  }
  view.intervals.push({ key, owner, token, start: performance.now(), end: null,
    seeded: !!seeded, sessionRef: sessionRef || null });
}

function closeInterval(key, token) {
  for (const i of view.intervals) {
    if (i.key === key && i.token === token && i.end === null) i.end = performance.now();
  }
}

function loadState(state, sentAt) {
  view.keys.clear();
  for (const h of state.leases) {
    const item = entry(h.key);
    item.holders.set(h.token, holderFrom(h, sentAt));
    if (h.capacity) item.capacity = h.capacity;
    openInterval(h.key, h.owner, h.token, true, h.session_ref);
  }
  // Intervals the new state no longer has ended while we were not watching.
  for (const i of view.intervals) {
    const item = view.keys.get(i.key);
    if (i.end === null && !(item && item.holders.has(i.token))) i.end = performance.now();
  }
  view.revision = state.revision;
  loadLive(state, sentAt);
}

function loadLive(live, sentAt) {
  for (const [key, item] of view.keys) {
    // Own keys only: "constructor" or "toString" is "in" every object.
    if (!Object.hasOwn(live.waiters, key)) item.waiters = [];
  }
  for (const key of Object.keys(live.waiters)) entry(key).waiters = live.waiters[key];
  for (const key of [...view.keys.keys()]) dropIfEmpty(key);
  view.sessions = live.sessions.map((s) => ({ ...s, expiresAt: sentAt + s.remaining }));
  view.sessionOwners = new Map(view.sessions.filter((s) => s.ref).map((s) => [s.ref, s.owner]));
  view.queues = live.queues;
  view.budgets = {
    rows: live.budgets || [], more: live.budgets_more || 0, leader: !!live.budget_decisions_leader,
  };
  view.dataAt = performance.now();
  view.dataNode = live.node;
  $("served").textContent = "applied index " + live.applied_index;
  showTruncated(live);
}

// Lists the server cut at their cap. The leases' flag comes with the state load only
// (the watch adds leases after it); the others with every refresh.
const TRUNCATED_NAMES = {
  leases: "leases",
  waiter_keys: "keys with waiters",
  sessions: "sessions",
  queues: "queues",
  budgets: "budgets",
};
function showTruncated(live) {
  if (!Array.isArray(live.truncated) || !live.limits) return;
  if ("leases" in live) view.leasesTruncated = live.truncated.includes("leases");
  const cut = live.truncated.filter((name) => name !== "leases");
  if (view.leasesTruncated) cut.unshift("leases");
  const box = $("truncated");
  box.hidden = cut.length === 0;
  box.textContent = cut.length === 0 ? "" : "Not everything is shown: only the first " +
    cut.map((name) => live.limits[name] + " " + (TRUNCATED_NAMES[name] || name)).join(", ") +
    ". The CLI (raftlease leases, raftlease sessions) and the HTTP API under /v1/ list more.";
  box.dataset.lists = cut.join(" ");
}

function applyEvent(event) {
  if (typeof event.revision === "number" && event.revision <= view.revision) return;
  view.revision = event.revision;
  const key = event.key;
  // Task events are told by their type (task_put, task_claim, ...): a lease key may
  // start with "queue:" too, and its grants and releases are shown like any other.
  if (typeof event.type === "string" && event.type.startsWith("task_")) {
    scheduleLive();  // a task changed: its queue's depth did
    return;
  }
  view.keyRevision.set(key, event.revision);
  const item = entry(key);
  let reread = false;
  if (event.type === "grant" || event.type === "renew" || event.type === "proclaim") {
    const old = item.holders.get(event.token);
    const ttl = old ? old.ttl : null;
    let expiresAt = old ? old.expiresAt : null;
    // A renewal restarts the lease's TTL as last read (an estimate on this clock,
    // as the event carries no TTL); unknown, the key is re-read.
    if (event.type === "renew") expiresAt = ttl === null ? null : performance.now() + ttl;
    item.holders.set(event.token, {
      owner: event.owner,
      token: event.token,
      units: event.units || 1,
      unitIndices: event.unit_indices || (old ? old.unitIndices : null),
      value: event.value,
      ttl,
      expiresAt,
      sessionRef: old ? old.sessionRef : null,
    });
    reread = expiresAt === null;
    if (event.type === "grant") {
      openInterval(key, event.owner, event.token, false);
      // A grant may be a waiter's: it left the queue in the same entry.
      item.waiters = item.waiters.filter((w) => w.owner !== event.owner);
    }
  } else {
    // release, expire, revoke, transfer (the new holder's grant follows): ends it.
    item.holders.delete(event.token);
    closeInterval(key, event.token);
  }
  dropIfEmpty(key);
  if (reread) scheduleKey(key);
}

// ----------------------------------------------------------------- refresh

function scheduleKey(key) {
  view.pendingKeys.add(key);
  if (view.keyTimer === null) view.keyTimer = setTimeout(refreshKeys, KEY_REFRESH_DELAY_MS);
}

const KEYS_PER_REQUEST = 50;  // dashboard.MAX_KEYS_ASKED

async function refreshKeys() {
  view.keyTimer = null;
  const keys = [...view.pendingKeys];
  view.pendingKeys.clear();
  for (let i = 0; i < keys.length; i += KEYS_PER_REQUEST) {
    const batch = keys.slice(i, i + KEYS_PER_REQUEST);
    const revisions = batch.map((key) => view.keyRevision.get(key));
    const sentAt = performance.now();
    let answer;
    try {
      answer = await getJSON("/ui/api/key?" + batch.map((k) => "key=" + encodeURIComponent(k)).join("&"));
    } catch (e) {
      continue;  // the next event or live refresh tries again
    }
    answer.keys.forEach((one, n) => {
      // An event on this key arrived meanwhile: it is newer than this answer.
      if (view.keyRevision.get(one.key) !== revisions[n]) return;
      const item = entry(one.key);
      item.holders = new Map(one.holders.map((h) => [h.token, holderFrom(h, sentAt)]));
      item.capacity = one.capacity;
      item.waiters = one.waiters;
      for (const h of one.holders) openInterval(one.key, h.owner, h.token, true, h.session_ref);
      dropIfEmpty(one.key);
    });
  }
  renderKeys();
}

let liveTimer = null;
function scheduleLive() {
  if (liveTimer === null) liveTimer = setTimeout(() => { liveTimer = null; refreshLive(); }, 200);
}

let liveInFlight = false;
async function refreshLive() {
  if (liveInFlight) return;  // a slow answer is not asked for twice
  liveInFlight = true;
  const sentAt = performance.now();
  const base = view.base;
  try {
    const live = await getJSON("/ui/api/live");
    if (base !== view.base) return;  // moved meanwhile
    loadLive(live, sentAt);
  } catch (e) {
    if (e instanceof AuthNeeded) askToken(e.message);
    return;
  } finally {
    liveInFlight = false;
  }
  renderKeys();
  renderSessions();
  renderQueues();
  renderBudgets();
  refreshQueue();
}

let clusterInFlight = false;
async function refreshCluster() {
  if (view.authNeeded || clusterInFlight) return;
  clusterInFlight = true;
  const base = view.base;
  try {
    const answer = await getJSON("/ui/api/cluster");
    if (base !== view.base) return;  // moved meanwhile
    const now = performance.now();
    view.nodes = answer.nodes;
    view.servedBy = answer.served_by;
    for (const n of view.nodes) {
      if (n.reachable) view.lastHeard.set(n.node, now);
      if (n.reachable && n.dashboard) view.dashboards.set(n.node, n.dashboard);
      if (n.reachable && n.role === "leader" && n.readiness && n.readiness.ready) {
        noteLeader(n.node, n.term);
      }
    }
  } catch (e) {
    if (e instanceof AuthNeeded) askToken(e.message);
    return;
  } finally {
    clusterInFlight = false;
  }
  renderCluster();
}

let healthInFlight = false;
async function refreshHealth() {
  if (view.authNeeded || healthInFlight) return;
  healthInFlight = true;
  const base = view.base;
  try {
    const [answer, verdict] = await Promise.all([getJSON("/ui/api/health"), getReadiness(base)]);
    if (base !== view.base) return;  // moved meanwhile
    if (base === "") view.homeNode = answer.node;
    answer.ready = verdict.ready === true;
    answer.reason = String(verdict.reason || "");
    const changed = !view.health || view.health.ready !== answer.ready ||
      view.health.reason !== answer.reason;
    view.health = answer;
    if (changed) renderCluster();  // its own row shows this verdict
    view.healthAt = performance.now();
    view.healthError = null;
    view.lastHeard.set(answer.node, view.healthAt);
    if (answer.ready && answer.leader) noteLeader(answer.leader, answer.term);
  } catch (e) {
    if (base !== view.base) return;
    if (e instanceof AuthNeeded) { askToken(e.message); return; }
    view.healthError = e.name === "TimeoutError" ? "no answer" : (e.message || String(e));
  } finally {
    healthInFlight = false;
  }
  judge();
}

// /readyz: 200 ready, 503 not ready, both with {ready, reason}; open, so no token.
async function getReadiness(base) {
  const response = await fetch(base + "/readyz", {
    cache: "no-store", signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
  if (response.status !== 200 && response.status !== 503) {
    throw new Error("/readyz answered " + response.status);
  }
  return response.json();
}

// A leader (and its term) a ready node reported; a new one is a leader change.
function noteLeader(node, term) {
  if (!node || typeof term !== "number") return;
  const last = view.leaders[view.leaders.length - 1];
  if (last && (term < last.term || (term === last.term && node === last.node))) return;
  view.leaders.push({ node, term, at: performance.now(), wall: new Date() });
  if (view.leaders.length > 50) view.leaders.shift();
  renderLeaders();
}

// ------------------------------------------------------------------ watch

async function watch(controller) {
  const url = "/v1/watch?from_revision=" + (view.revision + 1);
  const response = await fetch(view.base + url, { headers: headers(), signal: controller.signal });
  if (response.status === 401 || response.status === 403) throw new AuthNeeded("watch refused");
  if (!response.ok || !response.body) throw new Error("watch answered " + response.status);
  view.watching = true;
  view.watchError = "";
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("watch stream ended");
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, cut).trim();
      buffer = buffer.slice(cut + 1);
      if (!line) continue;  // keep-alive
      const message = JSON.parse(line);
      if (message.error) {
        const error = new Error(message.error.message);
        error.code = message.error.code;
        throw error;
      }
      if (message.type === "sync") continue;
      applyEvent(message);
    }
    renderKeys();
    renderTimeline();
    $("revision").textContent = "revision " + view.revision;
  }
}

async function start() {
  if (view.stream) view.stream.abort();
  const controller = new AbortController();
  view.stream = controller;
  let delay = 500;
  while (view.stream === controller) {
    try {
      const sentAt = performance.now();
      loadState(await getJSON("/ui/api/state"), sentAt);
      renderAll();
      await watch(controller);
    } catch (e) {
      view.watching = false;
      if (view.stream !== controller) return;
      if (e instanceof AuthNeeded) { askToken(e.message); view.stream = null; return; }
      view.watchError = e.name === "TimeoutError" ? "no answer" : (e.message || String(e));
      judge();
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 5000);
      continue;
    }
  }
}

// ----------------------------------------------------------------- render

function seconds(ms) {
  return (Math.max(0, ms) / 1000).toFixed(1) + " s";
}

// A member's dashboard URL: from this answer, else as last reported (an unreachable
// member's status is not in the answer). Only http(s) URLs become links.
function dashboardOf(n) {
  const url = n.dashboard || view.dashboards.get(n.node) || null;
  return url && /^https?:\/\//.test(url) ? url : null;
}

function dashboardLink(n) {
  const url = dashboardOf(n);
  if (!url) return el("td", "-");
  const cell = el("td");
  const a = el("a", url.replace(/^https?:\/\//, "").replace(/\/ui\/$/, ""), "dashboard-link");
  a.href = url;
  a.rel = "noreferrer";
  cell.append(a);
  return cell;
}

function lastHeardCell(n) {
  const cell = el("td", "", "last-heard");
  cell.dataset.node = n.node || "";
  return cell;
}

function renderCluster() {
  const body = $("cluster").tBodies[0];
  body.replaceChildren();
  const sorted = [...view.nodes].sort((a, b) => String(a.node).localeCompare(String(b.node)));
  const idOf = new Map(view.nodes.map((n) => [n.client, n.node]));
  for (const n of sorted) {
    const row = el("tr");
    row.dataset.node = n.node || "";
    if (!n.reachable) {
      row.className = "unreachable";
      const cell = el("td", "unreachable: " + (n.error || ""), "readiness");
      cell.colSpan = 5;
      const rest = el("td");
      rest.colSpan = 6;
      row.append(el("td", n.node), el("td", n.client), cell, lastHeardCell(n), rest,
        dashboardLink(n));
      body.append(row);
      continue;
    }
    if (n.role === "leader") row.className = "leader";
    const rates = Object.values(n.drift || {}).map((p) => Math.abs(p.rate_error || 0));
    const drift = (n.drift_alarm ? "ALARM " : "") +
      (rates.length ? (Math.max(...rates) * 1e6).toFixed(0) + " ppm" : "-");
    // This node's own row: its /readyz verdict, while current (the status tells less).
    const own = view.health && view.health.node === n.node &&
      performance.now() - view.healthAt <= STALE_AFTER_MS;
    const readiness = own ? view.health : (n.readiness || {});
    const ready = el("td", readiness.ready ? "ready" : "not ready: " + (readiness.reason || "?"),
      "readiness");
    ready.dataset.ready = readiness.ready ? "yes" : "no";
    const heard = typeof n.heard_from_leader_ago === "number" && n.role !== "leader"
      ? seconds(n.heard_from_leader_ago * 1000) + " ago" : "-";
    // How late its event loop runs; OVERLOADED while a leader refuses new sessions.
    const lag = el("td", (n.overloaded ? "OVERLOADED " : "") +
      (typeof n.loop_lag_ms === "number" ? n.loop_lag_ms.toFixed(0) + " ms" : "-"), "lag");
    lag.dataset.overloaded = n.overloaded ? "yes" : "no";
    row.append(
      el("td", n.node), el("td", n.client), el("td", n.role, "role"), el("td", n.term, "term"),
      el("td", n.leader ? (idOf.get(n.leader) || n.leader) : "-", "leader"), ready,
      el("td", heard), lastHeardCell(n),
      el("td", n.commit_index), el("td", n.applied_index, "applied"),
      el("td", n.lease_reads ? "yes" : "no"),
      el("td", n.role === "leader" ? seconds((n.lease_remaining || 0) * 1000) : "-"),
      el("td", drift), lag, dashboardLink(n),
    );
    body.append(row);
  }
  renderSwitch();
  tick();
}

function renderLeaders() {
  const list = $("leaders");
  list.replaceChildren();
  view.leaders.forEach((l, i) => {
    const item = el("li", (i === 0 ? "first seen: " : "new leader: ") + l.node + ", term " + l.term +
      " (" + l.wall.toLocaleTimeString() + ")");
    item.dataset.node = l.node;
    item.dataset.term = String(l.term);
    list.append(item);
  });
  const last = view.leaders[view.leaders.length - 1];
  const leader = $("leader");
  if (last) {
    leader.dataset.node = last.node;
    leader.dataset.term = String(last.term);
  }
  renderTimeline();
}

// ----------------------------------------------------------------- freshness

// The badge: "live" only on recent, ready data from a node with a leader (see top).
function judge() {
  if (view.authNeeded) return;  // askToken shows "token needed"
  const now = performance.now();
  const h = view.health;
  let kind = "", reason = "";
  if (view.healthError !== null) {
    kind = "unreachable";
    reason = "unreachable (" + view.healthError + ")";
  } else if (view.healthAt === null) {
    kind = "connecting";
  } else if (now - view.healthAt > STALE_AFTER_MS) {
    kind = "unreachable";
    reason = "unreachable (no answer for " + seconds(now - view.healthAt) + ")";
  } else if (!h.leader) {
    kind = "no-leader";
    reason = h.ready || String(h.reason).startsWith("no leader") ? "no leader" :
      "no leader: " + h.reason;
  } else if (!h.ready) {
    kind = "not-ready";
    reason = "not ready: " + h.reason;
  } else if (view.dataAt === null) {
    kind = "connecting";
  } else if (now - view.dataAt > STALE_AFTER_MS) {
    kind = "old-data";
    reason = "data not refreshed for " + seconds(now - view.dataAt);
  } else if (!view.watching) {
    kind = "watch";
    reason = "watch reconnecting" + (view.watchError ? ": " + view.watchError : "");
  }
  const conn = $("conn");
  if (kind === "connecting") {
    setConn("connecting");
  } else if (kind) {
    setConn("stale", "stale: " + reason);
  } else {
    setConn("live");
  }
  conn.dataset.reason = kind;
  document.body.dataset.stale = kind && kind !== "connecting" ? "yes" : "no";
  renderFreshness();
  renderSwitch();
  if (!PINNED) considerSwitch(kind, now);
}

// ---------------------------------------------------------------- switching

const BAD = { "unreachable": "unreachable", "not-ready": "not ready", "no-leader": "no leader" };

function considerSwitch(kind, now) {
  if (!BAD[kind]) {
    view.badSince = null;
    if (kind === "") view.tried.clear();  // live: every member may be tried again
    return;
  }
  if (view.badSince === null) view.badSince = now;
  if (now - view.badSince < SWITCH_AFTER_MS) return;
  const current = view.base ? view.readingNode : (view.homeNode || (view.health && view.health.node));
  const rank = (n) => (n.reachable && n.readiness && n.readiness.ready ? 0 : 2) +
    (n.role === "leader" ? 0 : 1);
  const candidates = view.nodes
    .filter((n) => n.node !== current && n.node !== view.homeNode && dashboardOf(n))
    .map((n) => ({ n, origin: new URL(dashboardOf(n)).origin }))
    .filter((c) => c.origin !== location.origin && !view.tried.has(c.origin))
    .sort((a, b) => rank(a.n) - rank(b.n) || String(a.n.node).localeCompare(String(b.n.node)));
  if (candidates.length === 0) {
    view.tried.clear();  // all tried: try them again after another period
    view.badSince = now;
    return;
  }
  const { n, origin } = candidates[0];
  if (view.base === "") view.homeReason = BAD[kind];
  view.tried.add(origin);
  moveTo(origin, n.node);
}

// Read from ``origin`` ("" for this page's own) from now on: the watch restarts there.
function moveTo(origin, node) {
  view.base = origin;
  view.readingNode = origin ? node : null;
  if (!origin) { view.homeReason = ""; view.tried.clear(); }
  view.health = null;
  view.healthAt = null;
  view.healthError = null;
  view.badSince = null;
  view.homeGood = 0;
  view.watching = false;
  renderReading();
  setConn("connecting");
  start();
  refreshHealth();
  refreshCluster();
}

function renderReading() {
  const box = $("reading");
  box.hidden = !view.base;
  box.dataset.node = view.readingNode || "";
  box.textContent = view.base ? "reading from " + view.readingNode + " (" +
    (view.homeNode || "this page's node") + " " + view.homeReason + ")" : "";
}

// While reading elsewhere: is this page's own node ready with a leader again?
let homeInFlight = false;
async function probeHome() {
  if (!view.base || homeInFlight || view.authNeeded) return;
  homeInFlight = true;
  try {
    const [answer, verdict] = await Promise.all([getHome("/ui/api/health", true),
      getHome("/readyz", false)]);
    const good = verdict.ready === true && !!answer.leader;
    view.homeGood = good ? view.homeGood + 1 : 0;
  } catch (e) {
    view.homeGood = 0;
  } finally {
    homeInFlight = false;
  }
  if (view.base && view.homeGood >= HOME_HEALTHY_PROBES) moveTo("", null);
}

async function getHome(path, token) {
  const response = await fetch(path, {
    headers: token ? headers() : {}, cache: "no-store",
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
  if (response.status !== 200 && !(path === "/readyz" && response.status === 503)) {
    throw new Error(path + " answered " + response.status);
  }
  return response.json();
}

function renderFreshness() {
  const now = performance.now();
  const fresh = $("fresh");
  fresh.textContent = view.dataAt === null ? "no data yet" :
    "updated " + seconds(now - view.dataAt) + " ago from " + view.dataNode;
  const last = view.leaders[view.leaders.length - 1];
  const live = $("conn").dataset.state === "live";
  $("leader").textContent = !last ? "no leader seen" :
    (live ? "leader " : "last known leader ") + last.node + ", term " + last.term;
}

// When stale: the other members' dashboards, ready ones and the leader first.
function renderSwitch() {
  const box = $("switch");
  const stale = $("conn").dataset.state === "stale";
  box.hidden = !stale;
  if (!stale) return;
  const me = (view.health && view.health.node) || view.servedBy || view.dataNode;
  $("switch-node").textContent = me || "this node";
  $("switch-reason").textContent = $("conn").textContent.replace(/^stale: /, "");
  const others = view.nodes.filter((n) => n.node !== me);
  const rank = (n) => (n.reachable && n.readiness && n.readiness.ready ? 0 : 2) +
    (n.role === "leader" ? 0 : 1);
  others.sort((a, b) => rank(a) - rank(b) || String(a.node).localeCompare(String(b.node)));
  const list = $("switch-links");
  const wanted = others.map((n) => n.node + "|" + dashboardOf(n) + "|" + rank(n) + "|" +
    n.reachable).join(" ");
  if (list.dataset.shown === wanted) return;  // links stay clickable between redraws
  list.dataset.shown = wanted;
  list.replaceChildren();
  for (const n of others) {
    const item = el("li");
    const url = dashboardOf(n);
    if (url) {
      const a = el("a", "open " + n.node + "'s dashboard", "switch-link");
      a.href = url;
      a.rel = "noreferrer";
      a.dataset.node = n.node;
      item.append(a);
    } else {
      item.append(el("span", n.node + ": its status names no admin endpoint"));
    }
    item.append(el("span", n.reachable ? " (" + n.role + ", " +
      (n.readiness && n.readiness.ready ? "ready" : "not ready") + " when last asked)" :
      " (unreachable when last asked)"));
    list.append(item);
  }
  $("switch-none").hidden = others.length > 0;
}

// ------------------------------------------------------------------ filter

// The filter (#filter-mode, #filter-text) over the keys table and the timeline:
// a key prefix, an owner (part of it), or a session (its label's start, or its owner).
function sessionMatches(ref, text) {
  if (!ref) return false;
  if (ref.startsWith(text)) return true;
  const owner = view.sessionOwners.get(ref);
  return owner !== undefined && String(owner).includes(text);
}

function holderMatches(key, owner, sessionRef) {
  const { mode, text } = view.filter;
  if (!text) return true;
  if (mode === "owner") return String(owner).includes(text);
  if (mode === "session") return sessionMatches(sessionRef, text);
  return key.startsWith(text);
}

function keyShown(key, item) {
  const { mode, text } = view.filter;
  if (!text) return true;
  if (mode === "prefix") return key.startsWith(text);
  for (const h of item.holders.values()) {
    if (holderMatches(key, h.owner, h.sessionRef)) return true;
  }
  // Owner mode: a waiter counts too (it is after the key).
  return mode === "owner" && item.waiters.some((w) => String(w.owner).includes(text));
}

function setFilter(mode, text) {
  view.filter = { mode, text };
  $("filter-mode").value = mode;
  $("filter-text").value = text;
  renderKeys();
  renderTimeline();
}

$("filter-mode").addEventListener("change", () => setFilter($("filter-mode").value,
  $("filter-text").value));
$("filter-text").addEventListener("input", () => setFilter($("filter-mode").value,
  $("filter-text").value));
$("filter-clear").addEventListener("click", () => setFilter($("filter-mode").value, ""));

// ------------------------------------------------------------ shared keys

// What a key's units mean, from its capacity: nothing for a lock; "write" or
// "read (N readers)" for a read/write lock; "U of C" (and the unit indices) for a
// pool or semaphore.
function unitsLabel(item, holders) {
  if (item.capacity === RW_CAPACITY) {
    if (holders.some((h) => h.units >= RW_CAPACITY)) return "write";
    if (holders.length === 0) return "read/write lock";
    return "read (" + holders.length + (holders.length === 1 ? " reader)" : " readers)");
  }
  if (item.capacity <= 1) return "";
  const used = holders.reduce((sum, h) => sum + h.units, 0);
  let units = used + " of " + item.capacity;
  const indices = holders.filter((h) => h.unitIndices).map((h) => h.unitIndices.join(","));
  if (indices.length) units += " [" + indices.join("; ") + "]";
  return units;
}

// A holder's own share of a shared key (shown in its lane).
function holderUnits(item, h) {
  if (item.capacity === RW_CAPACITY) return h.units >= RW_CAPACITY ? "write" : "read";
  if (item.capacity <= 1) return "";
  return h.units + (h.units === 1 ? " unit" : " units") +
    (h.unitIndices ? " [" + h.unitIndices.join(",") + "]" : "");
}

function waiterText(item, w) {
  let want = "";
  if (item.capacity === RW_CAPACITY) want = w.units >= RW_CAPACITY ? " (write)" : " (read)";
  else if (w.units > 1) want = " (" + w.units + " units)";
  return w.position + ". " + w.owner + want + (w.priority ? " prio " + w.priority : "");
}

// One row per holder (a lane): a shared key's rows share its key, units and waiters
// cells (rowSpan). The first row carries data-key; the others data-lane-of.
function renderKeys() {
  const body = $("keys").tBodies[0];
  body.replaceChildren();
  const all = [...view.keys.keys()].sort();
  const keys = all.filter((key) => keyShown(key, view.keys.get(key)));
  const hidden = all.length - keys.length;
  $("no-keys").hidden = all.length > 0;
  $("key-count").textContent = all.length ? "(" + all.length + ")" : "";
  const note = $("filter-hidden");
  note.dataset.hidden = String(hidden);
  note.textContent = view.filter.text ? hidden + " of " + all.length +
    (all.length === 1 ? " key" : " keys") + " hidden by the filter" : "";
  for (const key of keys) {
    const item = view.keys.get(key);
    const holders = [...item.holders.values()].sort((a, b) => a.token - b.token);
    const lanes = Math.max(1, holders.length);
    const waitersCell = el("td", null, "waiters");
    for (const w of item.waiters) waitersCell.append(el("span", waiterText(item, w), "waiter"));
    const keyCell = el("td", key, "key");
    const unitsCell = el("td", unitsLabel(item, holders), "units");
    for (const cell of [keyCell, unitsCell, waitersCell]) cell.rowSpan = lanes;
    for (let lane = 0; lane < lanes; lane++) {
      const h = holders[lane];
      const row = el("tr", null, lane === 0 ? "" : "lane");
      if (lane === 0) row.dataset.key = key;  // an attribute value: never parsed as markup
      else row.dataset.laneOf = key;
      const holderCell = el("td", null, "holder");
      const tokenCell = el("td", null, "token");
      const remainingCell = el("td", null, "remaining");
      const shareCell = el("td", null, "share");
      if (h) {
        holderCell.append(el("span", h.owner, "owner"));
        if (h.sessionRef) holderCell.append(el("span", " via " + h.sessionRef, "via-session"));
        tokenCell.textContent = String(h.token);
        const left = el("span", h.expiresAt === null ? "…" : "", "countdown");
        left.dataset.token = String(h.token);
        remainingCell.append(left);
        shareCell.textContent = holderUnits(item, h);
      }
      if (lane === 0) row.append(keyCell);
      row.append(holderCell, tokenCell, remainingCell, shareCell);
      if (lane === 0) row.append(unitsCell, waitersCell);
      body.append(row);
    }
  }
  tick();
}

// Tables with buttons are rebuilt only when what they show changed, so a button is not
// replaced under the pointer between two refreshes (its click would be lost).
function unchanged(node, signature) {
  if (node.dataset.shown === signature) return true;
  node.dataset.shown = signature;
  return false;
}

function renderSessions() {
  const body = $("sessions").tBodies[0];
  const signature = JSON.stringify(view.sessions.map((s) =>
    [s.owner, s.ref, s.ttl, s.leases, s.waiters, s.keys]));
  if (unchanged(body, signature)) {
    // Only the countdowns' base moved.
    [...body.rows].forEach((row, n) => {
      row.querySelector(".session-remaining").dataset.expires = String(view.sessions[n].expiresAt);
    });
    tick();
    return;
  }
  body.replaceChildren();
  for (const s of view.sessions) {
    const row = el("tr");
    row.dataset.owner = String(s.owner);
    if (s.ref) row.dataset.ref = s.ref;
    const left = el("td", "", "session-remaining");
    left.dataset.expires = String(s.expiresAt);
    const refCell = el("td", null, "session-ref");
    if (s.ref) {
      const button = el("button", s.ref, "session-filter");
      button.type = "button";
      button.title = "show only the leases held through this session";
      button.addEventListener("click", () => setFilter("session", s.ref));
      refCell.append(button);
    } else {
      refCell.textContent = "-";
    }
    const keysCell = el("td", null, "session-keys");
    if (Array.isArray(s.keys)) {
      for (const key of s.keys.slice(0, SESSION_KEYS_SHOWN)) {
        keysCell.append(el("span", key, "session-key"));
      }
      if (s.keys.length > SESSION_KEYS_SHOWN) {
        keysCell.append(el("span", "and " + (s.keys.length - SESSION_KEYS_SHOWN) + " more",
          "more"));
      }
      if (s.keys.length === 0) keysCell.textContent = "none";
    } else {
      keysCell.textContent = "not known to this node yet";
    }
    row.append(el("td", s.owner, "owner"), refCell, el("td", seconds(s.ttl)), left,
      el("td", s.leases), el("td", s.waiters), keysCell);
    body.append(row);
  }
  tick();
}

function renderQueues() {
  const body = $("queues").tBodies[0];
  if (unchanged(body, JSON.stringify([view.openQueue, view.queues]))) return;
  body.replaceChildren();
  for (const q of view.queues) {
    const row = el("tr");
    row.dataset.queue = q.queue;
    if (q.queue === view.openQueue) row.className = "open";
    const name = el("td", null, "queue");
    const button = el("button", q.queue, "queue-open");
    button.type = "button";
    button.title = "show this queue's tasks and dead letters";
    button.addEventListener("click", () => openQueue(q.queue));
    name.append(button);
    row.append(name, el("td", q.ready, "ready"), el("td", q.delayed),
      el("td", q.claimed, "claimed"), el("td", q.dead, "dead"), el("td", q.waiting_claims),
      el("td", q.oldest_ready_ms == null ? "" : seconds(q.oldest_ready_ms), "oldest"),
      el("td", q.claims, "claims"), el("td", q.completions, "completions"),
      el("td", q.expiries, "expiries"), el("td", q.retries, "retries"),
      el("td", q.dead_letters, "dead-letters"));
    body.append(row);
  }
}

// A budget's units: at most 3 decimals (a level refills in micro-units).
function units(n) {
  return String(Math.round(n * 1000) / 1000);
}

// Budgets, rebuilt only when a row changed. The decision counts are the leader's
// (counted as it decides): a follower's cover only its own terms as leader, so the
// note says so there.
function renderBudgets() {
  const b = view.budgets;
  const body = $("budgets").tBodies[0];
  $("no-budgets").hidden = b.rows.length > 0;
  const note = $("budgets-note");
  note.hidden = b.leader || b.rows.length === 0;
  note.textContent = b.leader ? "" : "Granted, queued and refused are counted by the leader " +
    "as it decides: this node is not the leader, so they cover only its own time as leader " +
    "(open the leader's page for the current counts).";
  $("budgets-more").textContent = b.more > 0 ? "and " + b.more + " more not shown" : "";
  if (unchanged(body, JSON.stringify([b.rows, b.more, b.leader]))) return;
  body.replaceChildren();
  for (const r of b.rows) {
    const row = el("tr");
    row.dataset.budget = r.key;
    const level = el("td", null, "level");
    // A meter, not a styled div: no inline style (the page's CSP), and it clamps a debt
    // (a negative level) to empty by itself.
    const bar = el("meter");
    bar.min = 0;
    bar.max = r.capacity;
    bar.value = Math.max(0, r.level);
    level.append(el("span", units(r.level) + " of " + r.capacity, "level-text"), bar);
    const d = r.decisions;
    const count = (a, b2) => (d ? d[a] + (b2 ? d[b2] : 0) : "-");
    row.append(el("td", r.key, "budget"), level, el("td", units(r.refill_per_s), "refill"),
      el("td", r.waiting, "waiting"), el("td", r.reservations, "reservations"),
      el("td", count("granted", "gate_granted"), "granted"), el("td", count("queued"), "queued"),
      el("td", count("refused", "gate_refused"), "refused"));
    body.append(row);
  }
}

// ------------------------------------------------------------- queue view

function openQueue(name) {
  view.openQueue = name;
  $("queue-view").hidden = false;
  $("qv-name").textContent = name;
  $("qv-retry").textContent = "";
  $("qv-tasks").tBodies[0].replaceChildren();
  $("qv-dead").tBodies[0].replaceChildren();
  delete $("qv-dead").tBodies[0].dataset.shown;
  $("qv-note").textContent = "loading…";
  renderQueues();
  refreshQueue();
}

$("qv-close").addEventListener("click", () => {
  view.openQueue = null;
  $("queue-view").hidden = true;
  renderQueues();
});

let queueInFlight = false;
async function refreshQueue() {
  const name = view.openQueue;
  if (name === null || queueInFlight || view.authNeeded) return;
  queueInFlight = true;
  try {
    const answer = await getJSON("/ui/api/queue?queue=" + encodeURIComponent(name));
    if (view.openQueue === name) renderQueueView(answer);
  } catch (e) {
    if (e instanceof AuthNeeded) { askToken(e.message); return; }
    if (view.openQueue === name) $("qv-note").textContent = "not refreshed: " + (e.message || e);
  } finally {
    queueInFlight = false;
  }
}

function ago(ms) {
  return typeof ms === "number" ? seconds(ms) + " ago" : "-";
}

function lastError(t) {
  return t.last_error ? "attempt " + t.last_error.attempt + ": " + t.last_error.error : "-";
}

function renderQueueView(answer) {
  $("qv-note").textContent = "open tasks from " + answer.node + " (applied index " +
    answer.applied_index + ")" + (answer.more_tasks ? "; " + answer.more_tasks +
    " more not shown (first " + answer.limits.tasks + ")" : "") +
    "; dead letters read through the log";
  const body = $("qv-tasks").tBodies[0];
  body.replaceChildren();
  for (const t of answer.tasks) {
    const row = el("tr");
    row.dataset.task = String(t.task_id);
    row.dataset.status = String(t.status);
    const attempt = typeof t.attempt === "number"
      ? t.attempt + " of " + t.max_attempts
      : t.attempts + " of " + t.max_attempts + " used";
    let status = t.status;
    if (typeof t.ready_in === "number") status += " (ready in " + seconds(t.ready_in) + ")";
    const progress = typeof t.progress === "number"
      ? String(t.progress) + (typeof t.progress_age === "number" ? " (" + ago(t.progress_age) + ")" : "")
      : "-";
    const heartbeat = t.status !== "claimed" ? "-" :
      (typeof t.heartbeat_age === "number" ? ago(t.heartbeat_age) : "by its session");
    row.append(el("td", t.task_id, "task-id"), el("td", status, "status"),
      el("td", attempt, "attempt"), el("td", t.worker || "-", "worker"),
      el("td", heartbeat, "heartbeat"), el("td", progress, "progress"),
      el("td", lastError(t), "last-error"));
    body.append(row);
  }
  $("qv-no-tasks").hidden = answer.tasks.length > 0;
  const dead = $("qv-dead").tBodies[0];
  $("qv-no-dead").hidden = answer.dead.length > 0;
  if (unchanged(dead, JSON.stringify([answer.queue, answer.dead]))) return;
  dead.replaceChildren();
  for (const t of answer.dead) {
    const row = el("tr");
    row.dataset.task = String(t.task_id);
    const action = el("td");
    const button = el("button", "retry", "retry");
    button.type = "button";
    button.dataset.task = String(t.task_id);
    button.addEventListener("click", () => retryTask(answer.queue, String(t.task_id)));
    action.append(button);
    row.append(el("td", t.task_id, "task-id"), el("td", t.attempts + " of " + t.max_attempts),
      el("td", t.dead_reason || "-", "dead-reason"), el("td", lastError(t), "last-error"),
      action);
    dead.append(row);
  }
}

// Retry a dead letter (task_retry, POST /v1/queues/retry) with this page's token; the answer, a refusal
// included, is shown as it came.
async function retryTask(queue, taskId) {
  const out = $("qv-retry");
  out.dataset.outcome = "pending";
  out.textContent = "retrying " + taskId + "…";
  try {
    const response = await fetch(view.base + "/v1/queues/retry", {
      method: "POST",
      headers: { ...headers(), "Content-Type": "application/json" },
      body: JSON.stringify({ queue, task_id: taskId }),
      cache: "no-store",
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
    let body = {};
    try { body = await response.json(); } catch (e) { /* keep {} */ }
    if (response.ok) {
      out.dataset.outcome = "ok";
      out.textContent = "task " + taskId + " retried: now " + body.status;
    } else {
      out.dataset.outcome = "refused";
      out.textContent = "retry of " + taskId + " refused (HTTP " + response.status + "): " +
        ((body.error && body.error.message) || response.statusText);
    }
  } catch (e) {
    out.dataset.outcome = "refused";
    out.textContent = "retry of " + taskId + " failed: " + (e.message || e);
  }
  refreshQueue();
  refreshLive();
}

// Countdowns: from the local monotonic clock, set when each answer was requested.
function tick() {
  const now = performance.now();
  for (const row of $("keys").tBodies[0].rows) {
    const item = view.keys.get(row.dataset.key || row.dataset.laneOf);
    if (!item) continue;
    for (const span of row.querySelectorAll(".countdown")) {
      const h = item.holders.get(Number(span.dataset.token));
      if (!h || h.expiresAt === null) continue;
      span.textContent = seconds(h.expiresAt - now);
      span.classList.toggle("expiring", h.expiresAt - now < 1000);
    }
  }
  for (const cell of document.querySelectorAll(".session-remaining")) {
    cell.textContent = seconds(Number(cell.dataset.expires) - now);
  }
  for (const cell of document.querySelectorAll(".last-heard")) {
    const at = view.lastHeard.get(cell.dataset.node);
    cell.textContent = at === undefined ? "never" : seconds(now - at) + " ago";
  }
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function colour(owner) {
  let hash = 0;
  for (const ch of String(owner)) hash = (hash * 31 + ch.codePointAt(0)) >>> 0;
  return "hsl(" + (hash % 360) + ", 55%, 55%)";
}

// Lanes of one key: each interval in the first lane free at its start (bars of a
// shared key's holders never overlap).
function lanesOf(intervals) {
  const lanes = [];  // each: the end of its last bar (null: still open)
  const placed = [];
  for (const i of [...intervals].sort((a, b) => a.start - b.start || a.token - b.token)) {
    let lane = lanes.findIndex((end) => end !== null && end <= i.start);
    if (lane < 0) { lane = lanes.length; lanes.push(null); }
    lanes[lane] = i.end;
    placed.push({ interval: i, lane });
  }
  return { count: Math.max(1, lanes.length), placed };
}

// One row per key with a holding interval in the window (a shared key: one lane per
// concurrent holder); like jepsen-style/timeline.py, bars from grant to end (open bars
// reach "now"), labelled with owner and token. A holder already there when the page
// (or a reconnect) first read it is drawn from then, with a "held earlier" mark.
function renderTimeline() {
  const now = performance.now();
  const from = now - TIMELINE_WINDOW_MS;
  view.intervals = view.intervals.filter((i) => i.end === null || i.end > from);
  const shown = view.intervals.filter((i) => holderMatches(i.key, i.owner, i.sessionRef));
  const allKeys = new Set(view.intervals.map((i) => i.key));
  const rows = [];  // {key, lane, lanes, placed}
  const keys = [...new Set(shown.map((i) => i.key))].sort();
  for (const key of keys) {
    const { count, placed } = lanesOf(shown.filter((i) => i.key === key));
    for (let lane = 0; lane < count && rows.length < TIMELINE_MAX_ROWS; lane++) {
      rows.push({ key, lane, placed: placed.filter((p) => p.lane === lane) });
    }
  }
  const hiddenKeys = allKeys.size - keys.length;
  $("timeline-note").textContent = view.filter.text && hiddenKeys > 0
    ? "(" + hiddenKeys + (hiddenKeys === 1 ? " key" : " keys") + " hidden by the filter)" : "";
  const chart = $("timeline");
  chart.dataset.rows = String(rows.length);
  // Drawn in CSS pixels of the chart's own width: text is never stretched.
  const width = Math.max(400, chart.clientWidth || 1000);
  const labelWidth = 200, rowHeight = 18, top = 16;
  const marks = view.leaders.filter((l, i) => i > 0 && l.at >= from);
  // Room under the rows for the leader-change labels.
  const height = top + Math.max(1, rows.length) * rowHeight + 4 + (marks.length ? 14 : 0);
  chart.setAttribute("viewBox", "0 0 " + width + " " + height);
  chart.setAttribute("height", String(height));
  chart.setAttribute("preserveAspectRatio", "xMinYMin meet");
  chart.replaceChildren();
  const x = (t) => labelWidth + ((Math.max(t, from) - from) / TIMELINE_WINDOW_MS) * (width - labelWidth - 4);
  for (let m = 0; m <= 5; m++) {
    const at = x(from + m * 60000);
    chart.append(svg("line", { x1: at, x2: at, y1: 12, y2: height, class: "axis" }));
    const label = { x: m === 5 ? at - 2 : at + 2, y: 10, "text-anchor": m === 5 ? "end" : "start" };
    chart.append(svg("text", label, m === 5 ? "now" : "-" + (5 - m) + " min"));
  }
  // Leader changes: a dashed line and the new leader and term at the time it was seen.
  for (const l of marks) {
    const at = x(l.at);
    chart.append(svg("line", { x1: at, x2: at, y1: 12, y2: height, class: "leader-change" }));
    const right = at > width - 80;  // near "now": the label goes left of its line
    chart.append(svg("text", { x: right ? at - 3 : at + 3, y: height - 3,
      "text-anchor": right ? "end" : "start", class: "leader-change-label" },
    "new leader " + l.node + " t" + l.term));
  }
  rows.forEach(({ key, lane, placed }, row) => {
    const y = top + row * rowHeight;
    if (lane === 0) {
      chart.append(svg("text", { x: 2, y: y + 12, class: "timeline-key" },
        key.length > 26 ? key.slice(0, 25) + "…" : key));
    }
    for (const { interval: i } of placed) {
      const x1 = x(i.start), x2 = x(i.end === null ? now : i.end);
      const bar = svg("rect", { x: x1, y: y + 2, width: Math.max(2, x2 - x1), height: rowHeight - 5,
        fill: colour(i.owner), rx: 2, class: i.seeded ? "bar seeded" : "bar" });
      bar.dataset.key = key;  // attribute values: never parsed as markup
      bar.dataset.owner = i.owner;
      bar.dataset.lane = String(lane);
      bar.append(svg("title", {}, i.owner + " token " + i.token +
        (i.seeded ? " (held before this page first read it: started earlier)" : "")));
      chart.append(bar);
      if (i.seeded) {
        // A left-pointing mark at its start: the holding began before what is drawn.
        const mid = y + 2 + (rowHeight - 5) / 2;
        chart.append(svg("path", { d: "M" + (x1 - 7) + " " + mid + " l6 -5 v10 z",
          class: "seeded-mark" }));
        if (x2 - x1 <= 60) {
          chart.append(svg("text", { x: x1 - 9, y: y + 12, "text-anchor": "end",
            class: "seeded-label" }, "held earlier: " + i.owner + " #" + i.token));
        }
      }
      if (x2 - x1 > 60) chart.append(svg("text", { x: x1 + 3, y: y + 12 }, i.owner + " #" + i.token));
    }
  });
}

function renderAll() {
  renderKeys();
  renderSessions();
  renderQueues();
  renderBudgets();
  renderTimeline();
  $("revision").textContent = "revision " + view.revision;
}

setInterval(() => { tick(); judge(); }, 250);
setInterval(refreshHealth, HEALTH_EVERY_MS);
setInterval(renderTimeline, 1000);
setInterval(() => { if (view.stream) refreshLive(); }, LIVE_EVERY_MS);
setInterval(refreshCluster, CLUSTER_EVERY_MS);
setInterval(probeHome, HOME_PROBE_EVERY_MS);
refreshHealth();
refreshCluster();
start();
