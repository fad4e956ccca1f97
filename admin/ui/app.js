// keyway dashboard: polls the admin API every 2 s and renders it. No
// build step, no external assets; every value is inserted as text.
"use strict";

const REFRESH_MS = 2000;
const EVENTS = 20;

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v;
    else el.setAttribute(k, v);
  }
  for (const kid of kids.flat()) {
    if (kid == null || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

async function getJSON(path) {
  let resp;
  try {
    resp = await fetch(path, { cache: "no-store" });
  } catch (e) {
    throw new Error("admin API unreachable (" + path + "): " + e.message);
  }
  let body;
  try {
    body = await resp.json();
  } catch (e) {
    throw new Error(path + ": HTTP " + resp.status + ", not JSON");
  }
  if (!resp.ok) {
    const err = new Error((body && body.error) || "HTTP " + resp.status);
    err.status = resp.status;
    throw err;
  }
  return body;
}

function showError(msg) {
  const b = document.getElementById("error");
  if (msg) {
    b.textContent = "⚠ " + msg + " — showing the last data received; retrying every " + REFRESH_MS / 1000 + " s";
    b.hidden = false;
  } else {
    b.hidden = true;
    b.textContent = "";
  }
}

function pct(x) {
  return (100 * (x || 0)).toFixed(1) + "%";
}

// RECENT_S is how long a past ejection is still mentioned: after it, the
// health cell says nothing of it (keyway_ejections_total keeps the count).
const RECENT_S = 300;

function healthText(hl) {
  if (!hl) return "not tracked";
  const parts = [];
  if (hl.probe && hl.probe !== "off") parts.push("probe " + hl.probe);
  if (hl.excluded && hl.excluded !== "none") parts.push("excluded: " + hl.excluded);
  if (hl.consecutive_failures) parts.push(hl.consecutive_failures + " failures in a row");
  const until = Date.parse(hl.ejected_until || "");
  if (!isNaN(until) && until < Date.now() && Date.now() - until < RECENT_S * 1000) {
    parts.push("was ejected" + (hl.last_reason ? " (" + hl.last_reason + ")" : "") + " until " + fmtTime(hl.ejected_until));
  }
  return parts.length ? parts.join(" · ") : "healthy";
}

function healthClass(hl) {
  if (!hl) return "";
  if (hl.excluded && hl.excluded !== "none") return "bad";
  if (hl.probe === "failing" || hl.consecutive_failures > 0) return "warn";
  return "ok";
}

// fmtRate prints a per-second rate; null (not measured yet) is a dash.
function fmtRate(x) {
  if (x == null) return "—";
  if (x === 0) return "0";
  if (x < 0.1) return x.toFixed(2);
  if (x < 100) return x.toFixed(1);
  return String(Math.round(x));
}

function errorKinds(tr) {
  const parts = [];
  if (tr.responses_5xx_total) parts.push("5xx " + tr.responses_5xx_total);
  for (const [k, n] of Object.entries(tr.transport_errors || {}).sort()) parts.push(k + " " + n);
  return parts.join(" · ");
}

// rateCell is a replica's request rate (per second, "—" until measured)
// with the total below; data-rate is "" when not measured yet.
function rateCell(tr) {
  if (!tr) return h("td", { class: "num rate" }, "—");
  return h("td", { class: "num rate", "data-rate": tr.requests_per_second == null ? "" : String(tr.requests_per_second),
      "data-total": String(tr.requests_total || 0) },
    h("span", { class: "big" }, fmtRate(tr.requests_per_second)), tr.requests_per_second == null ? "" : "/s",
    h("div", { class: "meta" }, (tr.requests_total || 0) + " total"));
}

// errorsCell is a replica's errors: the 5xx answers its clients got
// (per second, total below), and apart from them the failed attempts
// (dial, stale_conn, …) that keyway retried on the next candidate or
// answered itself, which no client saw as such.
function errorsCell(tr) {
  if (!tr) return h("td", { class: "num errors" }, "—");
  const eps = tr.responses_5xx_per_second;
  const failed = tr.failed_attempts_per_second;
  const kinds = Object.entries(tr.transport_errors || {}).sort().map(([k, n]) => k + " " + n).join(" · ");
  return h("td", { class: "num errors" + (eps > 0 ? " bad-text" : ""), "data-rate": eps == null ? "" : String(eps),
      "data-total": String(tr.responses_5xx_total || 0), "data-failed": failed == null ? "" : String(failed),
      title: "5xx answers its clients got; below, failed exchanges keyway retried or answered itself (no client saw them as such)" },
    h("span", { class: "big" }, fmtRate(eps)), eps == null ? "" : "/s",
    h("div", { class: "meta" }, (tr.responses_5xx_total || 0) + " 5xx total"),
    (tr.transport_errors_total || 0) > 0
      ? h("div", { class: "meta retried" }, fmtRate(failed) + "/s failed attempts, retried · " + tr.transport_errors_total + " total: " + kinds)
      : null);
}

// fmtDuration prints a number of seconds as its two largest units.
function fmtDuration(sec) {
  const s = Math.max(0, Math.floor(sec));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
}

// since is the line under a state or rotation pill: how long the replica
// has been so, as this proxy saw it (data-seconds "" when unknown).
function since(cls, prefix, sec) {
  if (sec == null) return null;
  return h("div", { class: "meta " + cls, "data-seconds": String(sec) }, prefix + fmtDuration(sec));
}

// fmtLatency prints seconds in µs, ms or s.
function fmtLatency(x) {
  if (x < 0.001) return Math.round(x * 1e6) + " µs";
  if (x < 0.01) return (x * 1000).toFixed(2) + " ms";
  if (x < 1) return (x * 1000).toFixed(1) + " ms";
  return x.toFixed(2) + " s";
}

// latencyCell is a replica's mean latency over the window with its p99
// below; "—" until measured or without an answer in the window.
function latencyCell(tr) {
  const mean = tr ? tr.mean_latency_seconds : null;
  const p99 = tr ? tr.p99_latency_seconds : null;
  if (mean == null) {
    return h("td", { class: "num latency", "data-mean": "", "data-p99": "",
      title: "no answer from this replica over the window" }, "—");
  }
  return h("td", { class: "num latency", "data-mean": String(mean), "data-p99": p99 == null ? "" : String(p99),
      title: "over the last " + Math.round(tr.window_seconds || 0) + " s: mean, and the 99th percentile estimated from the latency histogram's buckets" },
    h("span", { class: "big" }, fmtLatency(mean)),
    h("div", { class: "meta" }, p99 == null ? "mean" : "p99 " + fmtLatency(p99)));
}

// shareCell is the replica's share of the key space. Out of rotation, its
// keys go to stand-ins (the next replicas along the ring) until it is back:
// the share stays its own on the ring, but it serves none of it now, so the
// bar is hatched grey and says so.
function shareCell(r) {
  const out = !r.in_rotation;
  return h("td", { class: "num share" + (out ? " out" : ""), "data-out": String(out),
      title: out ? "out of rotation: the next replicas along the ring serve its keys until it is back" : "" },
    h("span", { class: "bar" + (out ? " out" : ""), style: "width:" + Math.round(80 * (r.share || 0)) + "px" }),
    h("span", { class: "pct" }, pct(r.share)),
    out ? h("div", { class: "meta standin" }, "(stand-ins serve it)") : null,
    h("div", { class: "meta" }, (r.partitions || 0) + " partitions, slot " + r.slot));
}

function stateClass(r) {
  if (r.down) return "bad";
  if (r.state === "ready") return "ok";
  if (r.state === "failed" || r.state === "dead") return "bad";
  return "warn";
}

function replicaRow(r) {
  const rot = r.in_rotation
    ? h("span", { class: "pill ok" }, "in rotation")
    : h("span", { class: "pill bad" }, "out: " + (r.reason || "unknown"));
  return h("tr", { class: "replica-row" + (r.in_rotation ? "" : " out"), "data-replica": r.name, "data-in-rotation": String(!!r.in_rotation) },
    h("td", {}, h("strong", {}, r.name), h("div", { class: "meta" }, r.addr, r.zone ? " · " + r.zone : "", r.source ? " · " + r.source : "")),
    h("td", {}, h("span", { class: "pill " + stateClass(r) }, r.down ? r.state + " (down)" : r.state),
      since("state-since", "for ", r.state_seconds)),
    h("td", {}, rot,
      since("rotation-since", (r.in_rotation ? "in" : "out") + " for ", r.rotation_seconds),
      r.why ? h("div", { class: "meta why" }, r.why) : null,
      r.back_in_seconds != null ? h("div", { class: "meta back", "data-back": String(r.back_in_seconds) },
        "back in " + fmtDuration(r.back_in_seconds) + " if it answers") : null,
      (r.held_by || []).length ? h("div", { class: "meta held-by" }, "held out of the fleet's rotation by " + r.held_by.map((v) => v === "self" ? "this proxy" : v).join(", ")) : null,
      (r.fleet_inflight || 0) > 0 || !r.in_rotation
        ? h("div", { class: "meta inflight", "data-inflight": String(r.fleet_inflight || 0) },
          (r.fleet_inflight || 0) + " in flight" + ((r.fleet_proxies || 1) > 1 ? " on " + r.fleet_proxies + " proxies" : ""))
        : null),
    shareCell(r),
    rateCell(r.traffic),
    errorsCell(r.traffic),
    latencyCell(r.traffic),
    h("td", { title: r.traffic ? (r.traffic.ejections_total || 0) + " ejections since this proxy started tracking it" : "" },
      h("span", { class: "pill " + healthClass(r.health) }, healthText(r.health))));
}

// setRate is the set's total over the window: answers/s, the 5xx
// clients got, answers keyway gave itself, sheds, and p50/p99 latency.
function setRate(tr) {
  if (!tr) return null;
  if (tr.requests_per_second == null) {
    return h("span", { class: "set-rate muted", "data-rate": "", title: tr.rate_note || "" },
      "rate: measuring… (" + (tr.requests_total || 0) + " requests so far)");
  }
  const cerr = tr.client_errors_per_second || 0;
  return h("span", { class: "set-rate", "data-rate": String(tr.requests_per_second), title: "over the last " + tr.window_seconds + " s" },
    h("strong", {}, fmtRate(tr.requests_per_second) + " req/s"),
    h("span", { class: cerr > 0 ? "bad-text" : "muted" }, " · " + fmtRate(cerr) + " 5xx/s to clients"),
    tr.local_answers_per_second > 0 ? h("span", { class: "warn-text" }, " · " + fmtRate(tr.local_answers_per_second) + " answered by keyway/s") : null,
    tr.shed_per_second > 0 ? h("span", { class: "warn-text" }, " · " + fmtRate(tr.shed_per_second) + " shed/s (overload)") : null,
    tr.p50_latency_seconds != null
      ? h("span", { class: "set-latency", "data-p50": String(tr.p50_latency_seconds), "data-p99": String(tr.p99_latency_seconds) },
        " · p50 " + fmtLatency(tr.p50_latency_seconds) + ", p99 " + fmtLatency(tr.p99_latency_seconds))
      : null,
    h("span", { class: "muted" }, " · over " + Math.round(tr.window_seconds) + " s"));
}

// codesLine shows the answers clients got by status class, with the
// failed attempts keyway retried apart.
function codesLine(tr) {
  if (!tr) return null;
  const classes = ["1xx", "2xx", "3xx", "4xx", "5xx"].filter((c) => (tr.codes || {})[c] > 0);
  const rates = tr.codes_per_second || {};
  const cls = { "2xx": "ok", "3xx": "", "4xx": "warn", "5xx": "bad" };
  return h("div", { class: "meta codes" }, "answers by status: ",
    classes.length ? classes.map((c) => h("span", { class: "pill code " + (c === "2xx" || rates[c] > 0 ? cls[c] || "" : ""), "data-class": c },
      c + " " + (rates[c] != null ? fmtRate(rates[c]) + "/s" : "") + " (" + tr.codes[c] + ")")) : "none yet",
    (tr.failed_attempts_total || 0) > 0
      ? h("span", { class: "muted retried" }, " · failed attempts, retried or answered by keyway: " +
        fmtRate(tr.failed_attempts_per_second) + "/s (" + tr.failed_attempts_total + ")") : null);
}

// sparkline draws values (null: a gap) as an inline SVG polyline.
function sparkline(values, cls, label, fmt) {
  const W = 180, H = 28;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  svg.setAttribute("class", "spark " + cls);
  svg.setAttribute("role", "img");
  const nums = values.filter((v) => v != null);
  const top = Math.max(...nums, 0);
  const last = nums.length ? nums[nums.length - 1] : null;
  svg.setAttribute("aria-label", label + ": last " + (last == null ? "—" : fmt(last)) + ", max " + fmt(top));
  const title = document.createElementNS(ns, "title");
  title.textContent = label + " over the last " + Math.round(values.length * 10 / 60) + " min (10 s steps): max " + fmt(top);
  svg.append(title);
  let d = "";
  values.forEach((v, i) => {
    if (v == null) return;
    const x = values.length > 1 ? (i * (W - 2)) / (values.length - 1) + 1 : W / 2;
    const y = H - 2 - (top > 0 ? (v / top) * (H - 4) : 0);
    d += (d && values[i - 1] != null ? "L" : "M") + x.toFixed(1) + " " + y.toFixed(1);
  });
  const path = document.createElementNS(ns, "path");
  path.setAttribute("d", d);
  svg.append(path);
  return svg;
}

// historyLine is the set's last 15 minutes: rate, 5xx to clients, p99.
function historyLine(tr) {
  const pts = (tr && tr.history) || [];
  if (pts.length < 2) {
    return h("div", { class: "meta history", "data-points": String(pts.length) }, "history: a point every 10 s, shown from the second one");
  }
  const fmtR = (x) => fmtRate(x) + "/s";
  return h("div", { class: "history", "data-points": String(pts.length) },
    h("span", { class: "spark-box" }, h("span", { class: "meta" }, "req/s "), sparkline(pts.map((p) => p.requests_per_second), "rate", "requests per second", fmtR)),
    h("span", { class: "spark-box" }, h("span", { class: "meta" }, "5xx/s "), sparkline(pts.map((p) => p.client_errors_per_second), "errors", "5xx answers per second", fmtR)),
    h("span", { class: "spark-box" }, h("span", { class: "meta" }, "p99 "), sparkline(pts.map((p) => p.p99_latency_seconds), "p99", "p99 latency", fmtLatency)),
    h("span", { class: "meta" }, " last " + Math.round((Date.parse(pts[pts.length - 1].at) - Date.parse(pts[0].at)) / 60000) + " min"));
}

// matchLine is the set's match rule.
function matchLine(s) {
  const m = s.match || {};
  return h("div", { class: "meta match", "data-host": m.host || "", "data-path": m.path_prefix || "" },
    "takes requests for ", h("code", {}, (m.host || "any host") + " " + (m.path_prefix || "/") + "…"));
}

// restartLine shows a set's rolling restart (GET …/restart): its progress
// while it runs, its result afterwards. A failed or interrupted one is
// shown while the API marks it (r.mark: until the set is Running again
// after the failure, or an operator acknowledges it), with when it failed,
// the error and an Acknowledge button; then it is not shown.
function restartLine(set, r) {
  const steps = r.steps || [];
  const last = steps.length ? steps[steps.length - 1] : null;
  const total = 6 * (r.replicas || []).length;
  if (r.state === "running") {
    return h("div", { class: "meta restart", "data-state": r.state },
      h("span", { class: "pill warn" }, r.force ? "rolling restart (forced)" : "rolling restart"), " step " + steps.length + " of " + total +
      (last ? ": " + last.replica + " " + last.step : ""));
  }
  if (r.state === "done") {
    return h("div", { class: "meta restart", "data-state": r.state },
      h("span", { class: "pill ok" }, "rolling restart done"), " " + fmtTime(r.finished) + (r.force ? " · forced" : "") +
      (r.owner ? " · run by " + r.owner : ""));
  }
  if (!r.mark) return null;
  return h("div", { class: "meta restart restart-mark", "data-state": r.state, "data-finished": r.finished || "" },
    h("span", { class: "pill bad" }, "rolling restart " + r.state), " at " + fmtDateTime(r.finished) +
    (r.error ? " · " + r.error : "") + (r.owner ? " · run by " + r.owner : "") + " ",
    h("button", { type: "button", class: "restart-ack", "data-set": set,
      title: "hide this mark (POST /v1/replica_sets/" + set + "/restart/ack); the restart's record stays" }, "Acknowledge"));
}

// adminToken asks once per browser tab for the admin bearer token that
// changes need (acknowledging a restart); null when the user cancels.
function adminToken() {
  let tok = sessionStorage.getItem("keyway-admin-token");
  if (!tok) {
    tok = window.prompt("Admin bearer token (KEYWAY_ADMIN_TOKEN), kept for this tab only:");
    if (tok) sessionStorage.setItem("keyway-admin-token", tok);
  }
  return tok;
}

// ackRestart acknowledges a set's failed restart, then refreshes.
async function ackRestart(set) {
  const tok = adminToken();
  if (!tok) return;
  let resp, body;
  try {
    resp = await fetch("/v1/replica_sets/" + encodeURIComponent(set) + "/restart/ack",
      { method: "POST", headers: { Authorization: "Bearer " + tok }, cache: "no-store" });
    body = await resp.json().catch(() => null);
  } catch (e) {
    showError("acknowledging the restart of " + set + ": " + e.message);
    return;
  }
  if (resp.status === 401) sessionStorage.removeItem("keyway-admin-token");
  if (!resp.ok) {
    showError("acknowledging the restart of " + set + ": " + ((body && body.error) || "HTTP " + resp.status));
    return;
  }
  refresh();
}

// runtimeLine says that a set is stopped, or that the fleet's run-time
// state (a create, stop, scale through the admin API) overrides the file.
function runtimeLine(s) {
  const parts = [];
  if (s.stopped) parts.push(h("span", { class: "pill bad" }, "stopped"), " every request gets 503 until it is started ");
  if (s.runtime) {
    parts.push(h("span", { class: "pill warn" }, s.source === "runtime" ? "created at run time" : "run-time override"),
      " " + (s.runtime.overrides || []).join(", ") + " · " + s.runtime.action + " by " + s.runtime.by + " via " + s.runtime.via +
      // Not the version: a hybrid clock value above 2^53, which a JS number rounds.
      " · " + new Date(s.runtime.at).toLocaleString([], { hour12: false }));
  }
  return parts.length ? h("div", { class: "meta runtime" }, ...parts) : null;
}

function setCard(s) {
  const phase = s.phase || "unknown";
  const card = h("div", { class: "set-card p-" + phase.toLowerCase(), "data-set": s.name },
    h("div", { class: "set-head" },
      h("h3", {}, s.name),
      h("span", { class: "phase" }, phase),
      h("span", { class: "count" }, s.ready + "/" + s.declared + " ready"),
      h("span", { class: "muted" }, s.in_rotation + " in rotation · failover " + s.failover),
      setRate(s.traffic)),
    matchLine(s),
    h("div", { class: "meta" }, "ring " + s.ring_size + " members, " + s.partitions + " partitions · fingerprint " + s.fingerprint + " · generation " + s.generation),
    codesLine(s.traffic),
    historyLine(s.traffic));
  const rt = runtimeLine(s);
  if (rt) card.append(rt);
  const rl = s.restart ? restartLine(s.name, s.restart) : null;
  if (rl) card.append(rl);
  const reps = s.replicas || [];
  if (reps.length === 0) {
    card.append(h("div", { class: "empty" }, "no replicas yet — start agents or add static replicas"));
  } else {
    card.append(h("table", {},
      h("thead", {}, h("tr", {}, ["replica", "state", "rotation", "share of keys", "requests", "errors", "latency", "health"].map((t, i) =>
        h("th", i >= 3 && i <= 6 ? { class: "num" } : {}, t)))),
      h("tbody", {}, reps.map(replicaRow))));
  }
  return card;
}

function eventDetails(ev) {
  const skip = new Set(["ts", "node", "kind", "set"]);
  return Object.entries(ev)
    .filter(([k]) => !skip.has(k))
    .map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v))
    .join("  ");
}

function list(x) {
  return Array.isArray(x) ? (x.length ? x.join(", ") : "none") : String(x);
}

// SENTENCES says what each kind of audit event means, from its fields;
// a kind without one is shown as its fields.
const SENTENCES = {
  member_join: (e) => (e.replica || e.member || "a member") + (e.role ? " (" + e.role + ")" : "") + " joined gossip",
  member_leave: (e) => (e.replica || e.member || "a member") + " left gossip",
  member_dead: (e) => (e.replica || e.member || "a member") + " is dead in gossip (crash or partition)",
  state_change: (e) => (e.replica || e.member) + ": " + (e.from || "?") + " → " + (e.state || "?"),
  probe_down: (e) => e.replica + " failed its health probes" + (e.result ? " (" + e.result + ")" : ""),
  probe_up: (e) => e.replica + " passes its health probes again",
  ejected: (e) => e.replica + " ejected" + (e.reason ? " after failures (" + e.reason + ")" : "") + (e.duration ? " for " + e.duration : ""),
  readmitted: (e) => e.replica + " back in rotation after its ejection",
  failed: (e) => e.replica + " held out as failed (too many ejections)",
  recovered: (e) => e.replica + " no longer held out as failed",
  ring_rebuild: (e) => "ring rebuilt (" + (e.cause || "?") + "): " + (e.moved_partitions || 0) + " partitions moved" +
    ((e.joined || []).length ? "; joined " + list(e.joined) : "") + ((e.left || []).length ? "; left " + list(e.left) : ""),
  rotation_change: (e) => "rotation changed (" + (e.cause || "?") + "): " + (e.in_rotation != null ? e.in_rotation + " in rotation" : "") +
    (e.diverted_partitions ? ", " + e.diverted_partitions + " partitions on stand-ins" : ""),
  phase_change: (e) => "phase " + (e.from || "—") + " → " + e.to + (e.declared != null ? " (" + (e.in_rotation || 0) + " of " + e.declared + " in rotation)" : ""),
  admin_action: (e) => (e.action || "admin action") + (e.replica ? " " + e.replica : "") + (e.by ? " by " + e.by : "") + (e.result ? ": " + e.result : ""),
  config_reload: (e) => "configuration reload " + (e.result || "") + (e.error ? ": " + e.error : ""),
  runtime_change: (e) => (e.action || "change") + " by " + (e.by || "?") + (e.via ? " via " + e.via : ""),
  tls_reload: (e) => "TLS certificates of the " + (e.listener || "") + " listener " + (e.result || "reloaded"),
  replica_process: (e) => e.replica + ": process " + (e.event || "") + (e.pid ? " (pid " + e.pid + ")" : "") + (e.exit ? ", " + e.exit : ""),
  replica_job: (e) => e.replica + ": job " + (e.event || e.action || ""),
  gossip_refused: (e) => "refused " + (e.what || "a message") + " from " + (e.member || "?") + ": " + (e.reason || "") + (e.detail ? " — " + e.detail : ""),
  statefulset: (e) => "StatefulSet: " + (e.action || "") + (e.step ? " (" + e.step + ")" : "") + (e.from != null && e.to != null ? " " + e.from + " → " + e.to : "") + (e.pod ? " pod " + e.pod : ""),
  fleet_hold: (e) => e.replica + " held out by the fleet on the evidence of " + list((e.voters || []).map((v) => v === "self" ? "this proxy" : v)),
  fleet_release: (e) => e.replica + " let back by the fleet",
  fleet_disagreement: (e) => (e.peer || "another proxy") + " routes this set differently" + (e.seconds ? " for " + e.seconds + " s" : ""),
  fleet_agreement: (e) => (e.peer || "another proxy") + " routes this set like this proxy again",
};

function eventSentence(ev) {
  const f = SENTENCES[ev.kind];
  if (f) {
    try {
      const s = f(ev);
      if (s && !s.includes("undefined")) return s;
    } catch (e) { /* fall back to the fields */ }
  }
  return eventDetails(ev);
}

// eventFilter is the set the audit list shows ("" all); eventKind,
// eventReplica, eventKey (a key, or a partition number) and eventSince
// (seconds back, "" for any time) the other filters, which the API applies
// (GET /v1/events, as keyway audit does); showGone whether the events of
// sets this proxy no longer serves are unfolded.
let eventFilter = "";
let eventKind = "";
let eventReplica = "";
let eventKey = "";
let eventSince = "";
let showGone = false;
let knownSets = [];

function fmtTime(ts) {
  const d = new Date(ts);
  return isNaN(d) ? String(ts || "") : d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

// fmtDateTime prints a time with its date, in the browser's time zone.
function fmtDateTime(ts) {
  const d = new Date(ts);
  return isNaN(d) ? String(ts || "") : d.toLocaleString([], { hour12: false });
}

// eventsURL asks the API for the events the filters keep.
function eventsURL() {
  const q = new URLSearchParams();
  const filtered = eventFilter || eventKind || eventReplica || eventKey || eventSince;
  q.set("limit", String(filtered || showGone ? 1000 : 10 * EVENTS));
  if (eventFilter) q.set("set", eventFilter);
  if (eventKind) q.set("kind", eventKind);
  if (eventReplica) q.set("replica", eventReplica);
  if (eventKey) q.set(/^\d+$/.test(eventKey) ? "partition" : "key", eventKey);
  if (eventSince) q.set("since", new Date(Date.now() - Number(eventSince) * 1000).toISOString());
  return "/v1/events?" + q.toString();
}

// placementText says where a followed partition's keys went after an event.
function placementText(p) {
  const pick = p.pick || "none (503)";
  if (p.in_force) return "partition " + p.partition + ": owner " + p.owner + ", taken by " + pick + " (in force then)";
  if (p.moved && (p.was_owner || p.was_pick)) {
    return "partition " + p.partition + " moved: " + (p.was_owner !== p.owner ? "owner " + p.was_owner + " → " + p.owner + ", " : "") +
      "taken by " + (p.was_pick || "none") + " → " + pick;
  }
  return "partition " + p.partition + ": taken by " + pick;
}

function renderEventsError(msg) {
  document.getElementById("events").replaceChildren(h("tr", {}, h("td", { colspan: "4", class: "skipped" }, msg)));
}

function renderEvents(evs) {
  const tb = document.getElementById("events");
  // Newest first, whatever order the source keeps.
  let newest = [...evs].sort((a, b) => (Date.parse(b.ts) || 0) - (Date.parse(a.ts) || 0));
  const gone = newest.filter((ev) => ev.set && !knownSets.includes(ev.set));
  if (!showGone) newest = newest.filter((ev) => !ev.set || knownSets.includes(ev.set));
  newest = newest.slice(0, EVENTS);
  const rows = newest.map((ev) =>
    h("tr", { class: "event-row", "data-kind": ev.kind || "", "data-set": ev.set || "", "data-replica": ev.replica || "",
      "data-partition": ev.placement ? String(ev.placement.partition) : "" },
      h("td", {}, fmtTime(ev.ts)),
      h("td", {}, h("code", {}, ev.kind || "")),
      h("td", {}, ev.set || ""),
      h("td", { title: eventDetails(ev) }, eventSentence(ev),
        ev.placement ? h("div", { class: "placement" + (ev.placement.moved ? " moved" : "") }, placementText(ev.placement)) : null)));
  if (gone.length && !showGone) {
    const names = [...new Set(gone.map((ev) => ev.set))].sort();
    rows.push(h("tr", { class: "events-gone" }, h("td", { colspan: "4", class: "muted" },
      gone.length + " events of sets this proxy no longer serves (" + names.join(", ") + ") folded away ",
      h("button", { type: "button", class: "show-gone" }, "show"))));
  }
  const filtered = eventFilter || eventKind || eventReplica || eventKey || eventSince;
  if (!rows.length) rows.push(h("tr", {}, h("td", { colspan: "4", class: "muted" }, filtered ? "no audit events match" : "no audit events yet")));
  tb.replaceChildren(...rows);
}

function updateSetChoices(names) {
  knownSets = names;
  const filter = document.getElementById("event-set");
  const want = ["", ...names];
  if ([...filter.options].map((o) => o.value).join(",") !== want.join(",")) {
    filter.replaceChildren(...want.map((n) => h("option", { value: n }, n || "all sets")));
    filter.value = want.includes(eventFilter) ? eventFilter : "";
  }
  const sel = document.querySelector("#route-form select[name=set]");
  const cur = sel.value;
  if ([...sel.options].map((o) => o.value).join(",") === names.join(",")) return;
  sel.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
  if (names.includes(cur)) sel.value = cur;
}

// renderFleet shows the other proxies and, per set, whether they route it
// like this one (GET /v1/fleet); hidden while gossip is off.
function renderFleet(f) {
  const sec = document.getElementById("fleet-section");
  if (!f || !f.self) {
    sec.hidden = true;
    return;
  }
  sec.hidden = false;
  const rows = (f.sets || []).map((s) => {
    const dis = (s.peers || []).filter((p) => !p.agrees);
    const n = (s.peers || []).length;
    const agreement = n === 0 ? h("span", { class: "muted" }, "no other proxy serves it")
      : dis.length === 0 ? h("span", { class: "pill ok" }, "agrees with all " + n)
      : h("span", {}, h("span", { class: "pill bad" }, "disagrees with " + dis.map((p) => p.id + " for " + (p.disagreeing_seconds || 0).toFixed(1) + " s").join(", ")),
        s.why ? h("div", { class: "meta fleet-why" }, "why: " + s.why) : null,
        s.fix ? h("div", { class: "meta fleet-fix" }, "what to do: " + s.fix) : null);
    const held = (s.held || []).map((x) => x.replica + " (" + x.voters.join(", ") + ")").join("; ") || "—";
    return h("tr", { class: "fleet-row", "data-set": s.set, "data-agree": String(s.agree) },
      h("td", {}, h("strong", {}, s.set)), h("td", {}, h("code", {}, s.digest)), h("td", {}, agreement), h("td", {}, held));
  });
  const box = document.getElementById("fleet");
  box.replaceChildren(...[
    f.isolated ? h("div", { class: "banner fleet-isolated" }, "This proxy is isolated from gossip since " + fmtTime(f.isolated_since) +
      ": it routes on its last view of the replicas and takes them out only on data-path evidence.") : null,
    h("div", { class: "meta" }, "this proxy " + f.self + " · " + (f.proxies || []).length + " other " +
      ((f.proxies || []).length === 1 ? "proxy" : "proxies") + ((f.proxies || []).length ? " (" + f.proxies.map((p) => p.id + ((p.nodes || []).length > 1 ? " [" + p.nodes.join(", ") + "]" : "")).join(", ") + ")" : "") +
      " · shared evidence " + (f.share ? "on" : "off")),
    h("table", { class: "events fleet" },
      h("thead", {}, h("tr", {}, h("th", {}, "set"), h("th", {}, "digest"), h("th", {}, "agreement"), h("th", {}, "held by the fleet"))),
      h("tbody", {}, ...rows))].filter((x) => x != null));
}

async function refresh() {
  const errors = [];
  try {
    const list = await getJSON("/v1/replica_sets");
    const sets = await Promise.all(list.replica_sets.map(async (s) => {
      const one = await getJSON("/v1/replica_sets/" + encodeURIComponent(s.name)).catch(() => s);
      // The set's last rolling restart on this proxy; 404: none.
      one.restart = await getJSON("/v1/replica_sets/" + encodeURIComponent(s.name) + "/restart").catch(() => null);
      return one;
    }));
    const box = document.getElementById("sets");
    if (sets.length === 0) {
      box.replaceChildren(h("div", { class: "empty" }, "no replicas yet — start agents or add static replicas (no replica set is configured)"));
    } else {
      box.replaceChildren(...sets.map(setCard));
    }
    updateSetChoices(sets.map((s) => s.name));
  } catch (e) {
    errors.push(e.message);
  }
  try {
    renderFleet(await getJSON("/v1/fleet"));
  } catch (e) {
    if (e.status === 501 || e.status === 404) renderFleet(null);
    else errors.push(e.message);
  }
  try {
    if (eventKey && !eventFilter) renderEventsError("choose a set: a key or a partition is one set's");
    else renderEvents((await getJSON(eventsURL())).events || []);
  } catch (e) {
    if (e.status === 501) renderEvents([]);
    else if (e.status === 400) renderEventsError(e.message);
    else errors.push(e.message);
  }
  showError(errors.join("; "));
  document.getElementById("status").textContent =
    (errors.length ? "last attempt failed at " : "updated ") + new Date().toLocaleTimeString([], { hour12: false });
}

async function lookup(ev) {
  ev.preventDefault();
  const form = ev.target;
  const set = form.elements.set.value;
  const key = form.elements.key.value;
  const out = document.getElementById("route-result");
  out.className = "";
  if (!set) {
    out.replaceChildren("no replica set to look the key up in");
    return;
  }
  try {
    const r = await getJSON("/v1/route?set=" + encodeURIComponent(set) + "&key=" + encodeURIComponent(key));
    out.replaceChildren(
      h("div", { class: "pick" }, "key ", h("code", {}, r.key), " → ",
        r.pick ? h("strong", {}, r.pick) : h("strong", { class: "skipped" }, "keyway answers " + r.answer_status + ": " + r.answer),
        r.fail_open ? h("span", { class: "pill bad" }, "fail open: no replica in rotation") : null),
      h("div", { class: "meta" }, "owner " + (r.owner || "none (empty ring)") + " · partition " + r.partition +
        " · hash " + r.hash + " · failover " + r.failover),
      h("ol", {}, (r.candidates || []).map((c) =>
        h("li", {}, h("strong", {}, c.name), " (" + c.state + ") ",
          c.picked ? h("span", { class: "pill ok" }, "picked") : null,
          c.attempt > 1 ? h("span", { class: "muted" }, "retry " + (c.attempt - 1)) : null,
          c.skipped ? h("span", { class: "skipped" }, "skipped: " + c.skipped) : null,
          !c.attempt && !c.skipped ? h("span", { class: "muted" }, "not considered") : null))));
  } catch (e) {
    out.replaceChildren(h("span", { class: "skipped" }, "lookup failed: " + e.message));
  }
}

document.getElementById("route-form").addEventListener("submit", lookup);
document.getElementById("event-set").addEventListener("change", (ev) => {
  eventFilter = ev.target.value;
  refresh();
});
document.getElementById("event-kind").replaceChildren(
  h("option", { value: "" }, "all kinds"), ...Object.keys(SENTENCES).sort().map((k) => h("option", { value: k }, k)));
document.getElementById("event-kind").addEventListener("change", (ev) => {
  eventKind = ev.target.value;
  refresh();
});
document.getElementById("event-since").addEventListener("change", (ev) => {
  eventSince = ev.target.value;
  refresh();
});
for (const [id, set] of [["event-replica", (v) => { eventReplica = v; }], ["event-key", (v) => { eventKey = v; }]]) {
  document.getElementById(id).addEventListener("change", (ev) => {
    set(ev.target.value.trim());
    refresh();
  });
}
document.getElementById("event-filter").addEventListener("submit", (ev) => {
  ev.preventDefault();
  eventReplica = document.getElementById("event-replica").value.trim();
  eventKey = document.getElementById("event-key").value.trim();
  refresh();
});
document.getElementById("events").addEventListener("click", (ev) => {
  if (ev.target.closest("button.show-gone")) {
    showGone = true;
    refresh();
  }
});
document.getElementById("sets").addEventListener("click", (ev) => {
  const b = ev.target.closest("button.restart-ack");
  if (b) ackRestart(b.dataset.set);
});
refresh();
setInterval(refresh, REFRESH_MS);
