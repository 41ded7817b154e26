// The dashboard page: reads /api/run once, follows /api/events (server-sent events: every
// line of the run's events.jsonl, then new ones as they are written) and draws the run.
//
// How it stays smooth with 1,000 loops for hours:
// - an event only changes state and marks what is dirty; one requestAnimationFrame callback
//   draws whatever changed since the last frame (a burst of 500 events is one redraw);
// - the loops table keeps only the rows in view (plus a few) in the DOM, reused by position;
//   a cell is written only when its text changed;
// - the timeline keeps the newest items in the DOM (capped) and adds new ones at the top;
// - every per-event step is O(1) or O(log n) except re-sorting, which happens at most once a
//   frame and only when a sort key changed.
// Everything from the server is text: it is put in the page with textContent, never as HTML.
"use strict";

// What went wrong in the page, for the browser test (and anyone with the console closed).
window.tdErrors = [];
window.addEventListener("error", (e) => window.tdErrors.push(String(e.message || e)));
window.addEventListener("unhandledrejection", (e) => window.tdErrors.push("unhandled: " + String(e.reason)));

(function () {
  // ---------------------------------------------------------------- helpers

  const TOKEN = new URLSearchParams(location.search).get("token");
  const ROW_H = 30; // px, must match `#loops tbody tr` in app.css
  const OVERSCAN = 8; // rows drawn above and below the view
  const TIMELINE_PAGE = 200; // timeline items kept in the DOM per "show older"
  const PER_LOOP_EVENTS = 5000; // events kept per loop for its detail view
  const METRICS_CAP = 200000; // latencies kept for window.tdMetrics

  const $ = (id) => document.getElementById(id);

  /** The URL of an API path relative to the page, with the start token when there is one. */
  function apiUrl(path, params) {
    const q = new URLSearchParams(params || {});
    if (TOKEN) q.set("token", TOKEN);
    const s = q.toString();
    return path + (s ? "?" + s : "");
  }

  /** Fetches JSON; throws an Error whose message is the server's error and hint. */
  async function getJson(path, params, init) {
    let res;
    try {
      res = await fetch(apiUrl(path, params), init);
    } catch (e) {
      throw new Error("cannot reach the dashboard server (" + e.message + "); is the run's process still there?");
    }
    let body = null;
    try {
      body = await res.json();
    } catch (e) {
      body = null;
    }
    if (!res.ok) {
      const what = body && typeof body.error === "string" ? body.error : "HTTP " + res.status;
      const hint = body && typeof body.hint === "string" ? " — " + body.hint : "";
      throw new Error(what + hint);
    }
    return body;
  }

  function h(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function setText(e, text) {
    const t = text === undefined || text === null ? "" : String(text);
    if (e.textContent !== t) e.textContent = t;
  }

  function str(v) {
    return typeof v === "string" ? v : "";
  }

  function num(v) {
    return typeof v === "number" && Number.isFinite(v) ? v : 0;
  }

  function parseTime(t) {
    const ms = typeof t === "string" ? Date.parse(t) : NaN;
    return Number.isFinite(ms) ? ms : null;
  }

  function fmtDuration(ms) {
    if (ms === null || ms === undefined || !Number.isFinite(ms) || ms < 0) return "";
    if (ms < 1000) return Math.round(ms) + " ms";
    const s = Math.floor(ms / 1000);
    if (s < 60) return (ms / 1000).toFixed(s < 10 ? 1 : 0) + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + "m " + String(s % 60).padStart(2, "0") + "s";
    const hh = Math.floor(m / 60);
    return hh + "h " + String(m % 60).padStart(2, "0") + "m";
  }

  function fmtTokens(n) {
    if (!n) return "";
    if (n < 1000) return String(n);
    if (n < 1e6) return (n / 1e3).toFixed(n < 1e4 ? 1 : 0) + "k";
    return (n / 1e6).toFixed(n < 1e7 ? 2 : 1) + "M";
  }

  function fmtCost(spend) {
    if (!spend.calls) return "";
    const usd = spend.nano / 1e9;
    const known = usd >= 0.01 ? "$" + usd.toFixed(2) : usd > 0 ? "$" + usd.toFixed(4) : "";
    if (spend.unpriced > 0) return known ? known + "+?" : "?";
    return known || "$0";
  }

  function fmtCostLong(spend) {
    if (!spend.calls) return "";
    if (spend.unpriced > 0 && !spend.nano) return "unknown price";
    const c = fmtCost(spend);
    return spend.unpriced > 0 ? c.replace("+?", "") + " + " + spend.unpriced + " call(s) without a price" : c;
  }

  function fmtClock(ms) {
    if (ms === null) return "";
    const d = new Date(ms);
    return [d.getHours(), d.getMinutes(), d.getSeconds()].map((x) => String(x).padStart(2, "0")).join(":");
  }

  function clip(text, n) {
    const t = String(text);
    return t.length > n ? t.slice(0, n - 1) + "…" : t;
  }

  function jsonText(v, indent) {
    try {
      return JSON.stringify(v, null, indent ? 2 : 0) || "";
    } catch (e) {
      return String(v);
    }
  }

  function newSpend() {
    return { tokens: 0, nano: 0, unpriced: 0, calls: 0 };
  }

  function addSpend(to, s) {
    if (!s || typeof s !== "object") return;
    to.tokens += num(s.input_tokens) + num(s.output_tokens) + num(s.cache_read_tokens) + num(s.cache_write_tokens);
    to.nano += num(s.cost_nano_usd);
    to.unpriced += num(s.unpriced_calls);
    to.calls += num(s.model_calls);
  }

  function spendFrom(s) {
    const out = newSpend();
    addSpend(out, s);
    return out;
  }

  let toastTimer = 0;
  function toast(text, bad) {
    const t = $("toast");
    t.textContent = text;
    t.classList.toggle("bad", !!bad);
    t.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => (t.hidden = true), bad ? 8000 : 3500);
  }

  // ---------------------------------------------------------------- state

  const STATUS_ORDER = ["running", "pending", "blocked", "paused", "failed", "stopped", "completed"];
  const FINAL = new Set(["completed", "failed", "stopped", "paused"]);

  const S = {
    runId: "",
    dir: "",
    live: false,
    ended: false, // the server said `end`: nothing more will come
    runStatus: "",
    runStart: null,
    runEnd: null,
    loops: new Map(), // name -> loop
    order: [], // names shown, filtered and sorted
    sortKey: "status",
    sortDir: 1,
    filter: "",
    statusFilter: null,
    runSpend: newSpend(),
    timeline: [], // items, oldest first
    queries: new Map(), // query id -> timeline item
    kinds: { query: true, share: true, alert: true, system: false, merge: true, conflict: true, control: true, lifecycle: false },
    tlCap: TIMELINE_PAGE,
    notes: new Map(), // loop -> [{iteration, note, time}]
    perLoop: new Map(), // loop -> [event]
    lastSeq: 0,
    detail: null,
    openedAt: 0, // when the event stream was first opened (performance.now())
  };

  // What needs drawing at the next frame.
  const dirty = {
    order: true, // the sorted/filtered list must be made again
    rows: true, // visible rows must be refreshed
    header: true,
    graph: true, // nodes or edges changed
    graphColors: false,
    merges: true,
    timelineRebuild: true,
    detailMeta: false,
  };
  const tlNew = []; // items added since the last frame
  const tlChanged = new Set(); // items whose content changed

  function loopOf(name) {
    let l = S.loops.get(name);
    if (!l) {
      l = {
        name: name,
        type: "",
        status: "pending",
        iteration: 0,
        maxIter: null,
        tool: null,
        toolSince: null,
        validation: null, // {passed, exit}
        spend: newSpend(),
        started: null,
        ended: null,
        last: "",
        lastTime: null,
        asked: 0,
        answered: 0,
        shares: 0,
        dependsOn: [],
        merge: null, // {state: waiting|merged|handed_back|blocked, into, commit, attempts, reason, time}
        reason: "",
        branch: null,
        worktree: null,
        host: null, // the worker host it runs on; null: the head
        stopping: false,
        v: 0, // bumped when the row must be redrawn
      };
      S.loops.set(name, l);
      dirty.order = true;
      dirty.graph = true;
      dirty.header = true;
    }
    return l;
  }

  function touch(l, sortKeys) {
    l.v++;
    dirty.rows = true;
    if (sortKeys && (sortKeys.includes(S.sortKey) || S.filter || S.statusFilter)) dirty.order = true;
    if (S.detail && S.detail.name === l.name) dirty.detailMeta = true;
  }

  function setStatus(l, status, time) {
    if (l.status !== status) {
      l.status = status;
      dirty.header = true;
      dirty.graphColors = true;
      if (l.merge) dirty.merges = true;
    }
    if (FINAL.has(status) || status === "blocked") {
      l.tool = null;
      if (time) l.ended = parseTime(time);
    }
    if (status !== "running") l.stopping = l.stopping && status === "pending";
    touch(l, ["status", "elapsed", "tool"]);
  }

  function setLast(l, text, time) {
    l.last = text;
    l.lastTime = parseTime(time);
    touch(l, ["last"]);
  }

  /** Takes what the summary knows and the events do not say (types, dependencies, limits). */
  function applySummary(summary) {
    if (!summary || typeof summary !== "object") return;
    S.runStatus = str(summary.status);
    if (summary.started_at) S.runStart = parseTime(summary.started_at);
    S.runEnd = summary.ended_at ? parseTime(summary.ended_at) : null;
    let loops = summary.loops;
    if (loops && !Array.isArray(loops) && typeof loops === "object") loops = Object.values(loops);
    if (!Array.isArray(loops)) loops = [];
    for (const s of loops) {
      if (!s || typeof s.name !== "string" || !s.name) continue;
      const l = loopOf(s.name);
      if (s.loop_type) l.type = str(s.loop_type);
      const deps = Array.isArray(s.depends_on) ? s.depends_on.filter((d) => typeof d === "string") : null;
      if (deps && deps.join("\n") !== l.dependsOn.join("\n")) {
        l.dependsOn = deps;
        dirty.graph = true;
      }
      const max = s.max_iterations;
      if (typeof max === "number" && max > 0) l.maxIter = max;
      if (s.branch) l.branch = str(s.branch);
      if (s.worktree) l.worktree = str(s.worktree);
      const host = typeof s.host === "string" && s.host ? s.host : null;
      if (host !== l.host) {
        l.host = host;
        if (S.detail && S.detail.name === l.name) dirty.detailMeta = true;
      }
      touch(l);
    }
  }

  /** At the end of a run the summary is the authority on status and spend. */
  function reconcileSummary(summary) {
    applySummary(summary);
    if (!summary || typeof summary !== "object") return;
    let loops = summary.loops;
    if (loops && !Array.isArray(loops) && typeof loops === "object") loops = Object.values(loops);
    if (!Array.isArray(loops)) return;
    for (const s of loops) {
      if (!s || typeof s.name !== "string") continue;
      const l = loopOf(s.name);
      if (typeof s.status === "string" && STATUS_ORDER.includes(s.status)) setStatus(l, s.status, s.ended_at);
      if (s.charged) l.spend = spendFrom(s.charged);
      if (typeof s.iterations === "number") l.iteration = Math.max(l.iteration, s.iterations);
      touch(l, ["tokens", "cost", "status"]);
    }
    if (summary.spend) S.runSpend = spendFrom(summary.spend);
    dirty.header = true;
  }

  // ---------------------------------------------------------------- events

  function addItem(item) {
    S.timeline.push(item);
    tlNew.push(item);
  }

  function remember(name, e) {
    if (typeof name !== "string" || !name) return;
    let list = S.perLoop.get(name);
    if (!list) S.perLoop.set(name, (list = []));
    list.push(e);
    if (list.length > PER_LOOP_EVENTS) list.splice(0, list.length - PER_LOOP_EVENTS);
    if (S.detail && S.detail.name === name) S.detail.newEvents = true;
  }

  /** Applies one record event to the state. Unknown events are kept for the loop's detail. */
  function applyEvent(e) {
    const kind = str(e.event);
    const time = str(e.time);
    if (typeof e.seq === "number" && e.seq > S.lastSeq) S.lastSeq = e.seq;
    const name = str(e.loop_name);
    if (name) remember(name, e);
    switch (kind) {
      case "run_started": {
        S.runId = str(e.run_id) || S.runId;
        S.runStart = parseTime(time);
        S.runEnd = null;
        if (Array.isArray(e.loops)) {
          for (const p of e.loops) {
            if (p && typeof p.name === "string" && p.name) {
              const l = loopOf(p.name);
              if (p.loop_type) l.type = str(p.loop_type);
            }
          }
        }
        dirty.header = true;
        break;
      }
      case "loop_started": {
        const l = loopOf(name);
        if (e.loop_type) l.type = str(e.loop_type);
        l.started = parseTime(time);
        l.ended = null;
        l.reason = "";
        setStatus(l, "running", null);
        setLast(l, "started", time);
        break;
      }
      case "iteration_started": {
        const l = loopOf(name);
        l.iteration = num(e.iteration);
        if (l.status === "pending") setStatus(l, "running", null);
        setLast(l, "iteration " + l.iteration + " started", time);
        touch(l, ["iteration"]);
        break;
      }
      case "iteration_ended": {
        const l = loopOf(name);
        if (typeof e.validation_passed === "boolean") {
          l.validation = { passed: e.validation_passed, exit: typeof e.validation_exit === "number" ? e.validation_exit : null };
        }
        if (e.spend) {
          addSpend(l.spend, e.spend);
          addSpend(S.runSpend, e.spend);
          dirty.header = true;
        }
        const v = l.validation && typeof e.validation_passed === "boolean" ? (e.validation_passed ? ", validation passed" : ", validation failed") : "";
        setLast(l, "iteration " + num(e.iteration) + " ended by " + str(e.ended_by) + v, time);
        touch(l, ["validation", "tokens", "cost"]);
        break;
      }
      case "loop_completed": {
        const l = loopOf(name);
        if (typeof e.iterations === "number") l.iteration = e.iterations;
        setStatus(l, "completed", time);
        l.merge = S.live && !S.ended ? { state: "waiting", time: parseTime(time) } : l.merge;
        dirty.merges = true;
        setLast(l, "completed" + (e.summary ? ": " + str(e.summary) : ""), time);
        addItem({ kind: "lifecycle", seq: e.seq, time: parseTime(time), loop: name, what: "completed", text: str(e.summary) });
        break;
      }
      case "loop_failed":
      case "loop_blocked":
      case "loop_paused": {
        const l = loopOf(name);
        const status = kind.slice(5);
        l.reason = str(e.reason);
        if (kind === "loop_blocked" && l.merge && l.merge.state === "waiting") {
          l.merge = { state: "blocked", reason: l.reason, time: parseTime(time) };
          dirty.merges = true;
        }
        setStatus(l, status, time);
        setLast(l, status + ": " + l.reason, time);
        addItem({ kind: "lifecycle", seq: e.seq, time: parseTime(time), loop: name, what: status, text: l.reason, bad: status !== "paused" });
        break;
      }
      case "loop_stopped": {
        const l = loopOf(name);
        setStatus(l, "stopped", time);
        setLast(l, "stopped", time);
        addItem({ kind: "lifecycle", seq: e.seq, time: parseTime(time), loop: name, what: "stopped", text: "" });
        break;
      }
      case "loop_restarted": {
        const l = loopOf(name);
        setLast(l, "restarted after a panic (" + num(e.restarts) + ")", time);
        addItem({ kind: "lifecycle", seq: e.seq, time: parseTime(time), loop: name, what: "restarted", text: str(e.reason), bad: true });
        break;
      }
      case "loop_merged": {
        const l = loopOf(name);
        l.merge = { state: "merged", into: str(e.into), commit: str(e.commit), time: parseTime(time), attempts: l.merge ? l.merge.attempts : 0 };
        dirty.merges = true;
        setLast(l, "merged into " + shortBranch(str(e.into)), time);
        addItem({ kind: "merge", seq: e.seq, time: parseTime(time), loop: name, into: str(e.into), commit: str(e.commit) });
        break;
      }
      case "merge_handed_back": {
        const l = loopOf(name);
        l.merge = { state: "handed_back", into: str(e.into), attempts: num(e.attempt), reason: str(e.reason), time: parseTime(time) };
        dirty.merges = true;
        setStatus(l, "running", null);
        l.ended = null;
        setLast(l, "merge handed back: " + str(e.reason), time);
        addItem({
          kind: "conflict", seq: e.seq, time: parseTime(time), loop: name, what: "handed_back",
          into: str(e.into), attempt: num(e.attempt), text: str(e.reason),
          files: Array.isArray(e.files) ? e.files.map(String) : [],
        });
        break;
      }
      case "conflict_predicted": {
        const loops = Array.isArray(e.loops) ? e.loops.map(String) : [];
        for (const n of loops) remember(n, e);
        addItem({ kind: "conflict", seq: e.seq, time: parseTime(time), what: "predicted", loops: loops, files: Array.isArray(e.files) ? e.files.map(String) : [] });
        break;
      }
      case "query_asked": {
        const from = str(e.from), to = str(e.to);
        remember(from, e);
        remember(to, e);
        const lf = loopOf(from);
        lf.asked++;
        touch(lf, ["msgs"]);
        setLast(lf, "asked " + to + ": " + clip(str(e.question), 80), time);
        const item = { kind: "query", seq: e.seq, time: parseTime(time), id: e.id, from: from, to: to, question: str(e.question), state: "waiting" };
        S.queries.set(String(e.id), item);
        addItem(item);
        break;
      }
      case "query_answered":
      case "query_failed": {
        const from = str(e.from), to = str(e.to);
        remember(from, e);
        remember(to, e);
        let item = S.queries.get(String(e.id));
        if (!item) {
          // The question was before what we read (a damaged record): show the answer alone.
          item = { kind: "query", seq: e.seq, time: parseTime(time), id: e.id, from: from, to: to, question: "", state: "waiting" };
          S.queries.set(String(e.id), item);
          addItem(item);
        }
        const at = parseTime(time);
        item.took = item.time !== null && at !== null ? at - item.time : null;
        if (kind === "query_answered") {
          item.state = "answered";
          item.reply = str(e.reply);
          const lt = loopOf(to);
          lt.answered++;
          touch(lt, ["msgs"]);
        } else {
          item.state = "failed";
          item.reply = str(e.error);
        }
        if (e.spend) {
          // An answer's model calls are charged to the loop that asked.
          const lf = loopOf(from);
          addSpend(lf.spend, e.spend);
          addSpend(S.runSpend, e.spend);
          touch(lf, ["tokens", "cost"]);
          dirty.header = true;
        }
        tlChanged.add(item);
        break;
      }
      case "shared": {
        const from = str(e.from), to = str(e.to);
        remember(from, e);
        remember(to, e);
        const lf = loopOf(from);
        lf.shares++;
        touch(lf, ["msgs"]);
        setLast(lf, "shared " + str(e.data_type) + " with " + to, time);
        addItem({ kind: "share", seq: e.seq, time: parseTime(time), from: from, to: to, dataType: str(e.data_type), data: e.data, error: e.error ? str(e.error) : "" });
        break;
      }
      case "alert": {
        const from = str(e.from);
        const system = from === "taskdaemon";
        if (!system) remember(from, e);
        const recipients = Array.isArray(e.recipients) ? e.recipients.length : 0;
        addItem({
          kind: system ? "system" : "alert", seq: e.seq, time: parseTime(time), from: from,
          eventType: str(e.event_type), text: str(e.message), recipients: recipients, error: e.error ? str(e.error) : "",
        });
        break;
      }
      case "progress_noted": {
        let list = S.notes.get(name);
        if (!list) S.notes.set(name, (list = []));
        list.push({ iteration: num(e.iteration), note: str(e.note), time: parseTime(time) });
        break;
      }
      case "inbox_shown": {
        const l = loopOf(name);
        setLast(l, "read " + num(e.items) + " inbox message(s)", time);
        break;
      }
      case "model_retried": {
        const l = loopOf(name);
        setLast(l, "model call failed (" + (e.status ? "HTTP " + e.status : "no answer") + "), retry " + num(e.attempt) + " in " + fmtDuration(num(e.wait_ms)), time);
        break;
      }
      case "heavy_queued": {
        const l = loopOf(name);
        setLast(l, "waiting for the heavy lane (" + str(e.tool) + ")", time);
        break;
      }
      case "stop_requested": {
        const target = e.loop_name === null || e.loop_name === undefined ? null : str(e.loop_name);
        if (target) {
          const l = loopOf(target);
          l.stopping = true;
          touch(l);
        }
        addItem({ kind: "control", seq: e.seq, time: parseTime(time), loop: target, by: str(e.by) || "someone" });
        break;
      }
      default:
        break;
    }
  }

  /** The `tool` event: what a loop's model is waiting on now (null: nothing). */
  function applyTool(d) {
    const name = str(d.loop_name);
    if (!name) return;
    const l = loopOf(name);
    const tool = typeof d.tool === "string" ? d.tool : null;
    if (l.tool !== tool) {
      l.tool = tool;
      l.toolSince = tool ? parseTime(d.time) : null;
      touch(l, ["tool"]);
    }
    if (S.detail && S.detail.name === name) S.detail.newEvents = true;
  }

  // ---------------------------------------------------------------- metrics

  // For the bench: per event, the time it was recorded (its `time`), received and painted.
  const metrics = { events: 0, latencies_ms: [], page_ms: [] };
  window.tdMetrics = metrics;
  let unpainted = []; // [eventTimeMs, receivedPerfMs]

  function noteReceived(time) {
    metrics.events++;
    const t = parseTime(time);
    if (t !== null) unpainted.push([t, performance.now()]);
  }

  /** Called in the frame that drew the events: measures at the next frame, after the paint. */
  function measureAfterPaint() {
    if (!unpainted.length) return;
    const batch = unpainted;
    unpainted = [];
    requestAnimationFrame(() => {
      const now = Date.now();
      const perf = performance.now();
      for (const [t, got] of batch) {
        metrics.latencies_ms.push(now - t);
        metrics.page_ms.push(perf - got);
      }
      if (metrics.latencies_ms.length > METRICS_CAP) {
        metrics.latencies_ms.splice(0, METRICS_CAP / 2);
        metrics.page_ms.splice(0, METRICS_CAP / 2);
      }
    });
  }

  // ---------------------------------------------------------------- frame

  let frameAsked = false;
  function schedule() {
    if (frameAsked) return;
    frameAsked = true;
    requestAnimationFrame(frame);
  }

  function frame() {
    frameAsked = false;
    if (dirty.order) {
      computeOrder();
      dirty.order = false;
      dirty.rows = true;
    }
    if (dirty.rows) {
      drawRows();
      dirty.rows = false;
    }
    if (dirty.header) {
      drawHeader();
      dirty.header = false;
    }
    if (dirty.timelineRebuild || tlNew.length || tlChanged.size) drawTimeline();
    if (dirty.graph) {
      drawGraph();
      dirty.graph = false;
      dirty.graphColors = false;
    } else if (dirty.graphColors) {
      colorGraph();
      dirty.graphColors = false;
    }
    if (dirty.merges) {
      drawMerges();
      dirty.merges = false;
    }
    if (S.detail) {
      if (dirty.detailMeta) drawDetailMeta();
      if (S.detail.newEvents) detailFollow();
    }
    dirty.detailMeta = false;
    measureAfterPaint();
  }

  // ---------------------------------------------------------------- loops table

  function sortValue(l, key, now) {
    switch (key) {
      case "status": return STATUS_ORDER.indexOf(l.status);
      case "name": return l.name;
      case "type": return l.type;
      case "iteration": return l.iteration;
      case "tool": return l.tool || "";
      case "validation": return l.validation ? (l.validation.passed ? 2 : 1) : 0;
      case "tokens": return l.spend.tokens;
      case "cost": return l.spend.nano;
      case "elapsed": return elapsed(l, now) || 0;
      case "msgs": return l.asked + l.answered + l.shares;
      case "last": return l.lastTime || 0;
      default: return 0;
    }
  }

  function elapsed(l, now) {
    if (l.started === null) return null;
    const end = l.ended !== null ? l.ended : S.live && !S.ended ? now : S.runEnd;
    return end === null ? null : Math.max(0, end - l.started);
  }

  function matches(l) {
    if (S.statusFilter && l.status !== S.statusFilter) return false;
    if (!S.filter) return true;
    const f = S.filter;
    return l.name.toLowerCase().includes(f) || l.type.toLowerCase().includes(f) || l.status.includes(f) || (l.tool || "").toLowerCase().includes(f) || (l.host || "").toLowerCase().includes(f);
  }

  function computeOrder() {
    const now = Date.now();
    const key = S.sortKey, dir = S.sortDir;
    const rows = [];
    for (const l of S.loops.values()) if (matches(l)) rows.push([sortValue(l, key, now), l.name]);
    rows.sort((a, b) => {
      if (a[0] < b[0]) return -dir;
      if (a[0] > b[0]) return dir;
      return a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0;
    });
    S.order = rows.map((r) => r[1]);
    setText($("loops-count"), S.order.length === S.loops.size ? S.loops.size + " loops" : S.order.length + " of " + S.loops.size);
    $("loops-empty").hidden = S.order.length > 0 || S.loops.size === 0;
  }

  const COLS = ["status", "name", "iteration", "tool", "validation", "tokens", "cost", "elapsed", "msgs", "last", "actions"];
  const body = $("loops-body");
  const topPad = document.createElement("tr");
  const bottomPad = document.createElement("tr");
  topPad.className = bottomPad.className = "pad";
  topPad.appendChild(h("td")).colSpan = COLS.length;
  bottomPad.appendChild(h("td")).colSpan = COLS.length;
  body.appendChild(topPad);
  body.appendChild(bottomPad);
  const rowPool = []; // tr elements currently between the pads, in order

  function makeRow() {
    const tr = document.createElement("tr");
    tr._cells = {};
    for (const c of COLS) {
      const td = document.createElement("td");
      td.dataset.col = c;
      tr._cells[c] = td;
      tr.appendChild(td);
    }
    const st = tr._cells.status;
    st.appendChild(h("span", "dot"));
    st.appendChild(h("span", "st"));
    const btn = h("button", "stop small", "Stop");
    btn.type = "button";
    btn.title = "Stop this loop";
    tr._cells.actions.appendChild(btn);
    tr._stop = btn;
    return tr;
  }

  function drawRows() {
    const scroller = $("loops-scroll");
    const n = S.order.length;
    const head = $("loops").tHead.offsetHeight || ROW_H;
    const top = Math.max(0, scroller.scrollTop - head);
    const view = scroller.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
    const last = Math.min(n, Math.ceil((top + view) / ROW_H) + OVERSCAN);
    const count = Math.max(0, last - first);
    topPad.firstChild.style.height = first * ROW_H + "px";
    bottomPad.firstChild.style.height = (n - last) * ROW_H + "px";
    topPad.hidden = first === 0;
    bottomPad.hidden = n === last;
    while (rowPool.length < count) {
      const tr = makeRow();
      body.insertBefore(tr, bottomPad);
      rowPool.push(tr);
    }
    while (rowPool.length > count) rowPool.pop().remove();
    const now = Date.now();
    const selected = S.detail ? S.detail.name : null;
    for (let i = 0; i < count; i++) {
      const l = S.loops.get(S.order[first + i]);
      const tr = rowPool[i];
      if (!l) continue;
      if (tr._name !== l.name || tr._v !== l.v || tr._live !== controlsOn() || l.status === "running") fillRow(tr, l, now);
      tr.classList.toggle("selected", l.name === selected);
    }
  }

  function controlsOn() {
    return S.live && !S.ended;
  }

  function fillRow(tr, l, now) {
    const c = tr._cells;
    tr._name = l.name;
    tr._v = l.v;
    tr._live = controlsOn();
    if (tr.dataset.loop !== l.name) tr.dataset.loop = l.name;
    if (tr.dataset.status !== l.status) tr.dataset.status = l.status;
    setText(c.status.lastChild, l.stopping && !FINAL.has(l.status) ? "stopping" : l.status);
    setText(c.name, l.name);
    c.name.title = l.name + (l.type ? " (" + l.type + ")" : "") + (l.host ? " on host " + l.host : "") + (l.reason ? ": " + l.reason : "");
    setText(c.iteration, l.iteration ? l.iteration + (l.maxIter ? "/" + l.maxIter : "") : l.maxIter ? "0/" + l.maxIter : "");
    const since = l.tool && l.toolSince !== null ? " · " + fmtDuration(now - l.toolSince) : "";
    setText(c.tool, l.tool ? l.tool + since : "");
    c.tool.classList.toggle("busy", !!l.tool);
    if (l.validation) {
      setText(c.validation, l.validation.passed ? "✓ passed" : "✗ exit " + (l.validation.exit === null ? "none" : l.validation.exit));
      c.validation.className = l.validation.passed ? "ok" : "bad";
    } else {
      setText(c.validation, "");
      c.validation.className = "";
    }
    setText(c.tokens, fmtTokens(l.spend.tokens));
    setText(c.cost, fmtCost(l.spend));
    c.cost.title = l.spend.unpriced ? l.spend.unpriced + " call(s) without a price" : "";
    setText(c.elapsed, fmtDuration(elapsed(l, now)));
    const talk = [["Q", l.asked], ["A", l.answered], ["S", l.shares]].filter((x) => x[1]).map((x) => x[0] + x[1]);
    setText(c.msgs, talk.join(" "));
    c.msgs.title = l.asked + " question(s) asked, " + l.answered + " answered for others, " + l.shares + " share(s) sent";
    setText(c.last, l.last);
    c.last.title = l.last + (l.lastTime !== null ? " (" + fmtClock(l.lastTime) + ")" : "");
    const stoppable = controlsOn() && (l.status === "running" || l.status === "pending");
    tr._stop.hidden = !stoppable;
    tr._stop.disabled = l.stopping;
    setText(tr._stop, l.stopping ? "Stopping…" : "Stop");
    if (stoppable) tr._stop.dataset.stopLoop = l.name;
    else delete tr._stop.dataset.stopLoop;
  }

  $("loops").tHead.addEventListener("click", (ev) => {
    const th = ev.target.closest("th[data-sort]");
    if (!th) return;
    const key = th.dataset.sort;
    if (S.sortKey === key) S.sortDir = -S.sortDir;
    else {
      S.sortKey = key;
      S.sortDir = ["tokens", "cost", "elapsed", "msgs", "last", "iteration"].includes(key) ? -1 : 1;
    }
    for (const x of $("loops").tHead.querySelectorAll("th[data-sort]")) {
      x.classList.toggle("asc", x === th && S.sortDir > 0);
      x.classList.toggle("desc", x === th && S.sortDir < 0);
      x.setAttribute("aria-sort", x === th ? (S.sortDir > 0 ? "ascending" : "descending") : "none");
    }
    dirty.order = true;
    schedule();
  });

  body.addEventListener("click", (ev) => {
    const stop = ev.target.closest("button[data-stop-loop]");
    if (stop) {
      ev.stopPropagation();
      stopLoop(stop.dataset.stopLoop);
      return;
    }
    const tr = ev.target.closest("tr[data-loop]");
    if (tr) openDetail(tr.dataset.loop);
  });

  $("loops-scroll").addEventListener("scroll", () => {
    dirty.rows = true;
    schedule();
  }, { passive: true });
  window.addEventListener("resize", () => {
    dirty.rows = true;
    schedule();
  });

  $("filter").addEventListener("input", (ev) => {
    S.filter = ev.target.value.trim().toLowerCase();
    dirty.order = true;
    schedule();
  });

  // ---------------------------------------------------------------- header

  function drawHeader() {
    setText($("run-id"), S.runId || "…");
    $("run-id").title = S.dir ? "run record: " + S.dir : "";
    const state = $("run-state");
    const label = controlsOn() ? "live" : S.runStatus || (S.ended ? "finished" : "loading");
    setText(state, label);
    state.dataset.state = label;
    // Chips and totals are made once and then only their text changes (this runs in most
    // frames of a busy run).
    const counts = new Map();
    for (const l of S.loops.values()) counts.set(l.status, (counts.get(l.status) || 0) + 1);
    const box = $("counts");
    for (const st of STATUS_ORDER) {
      let b = chips.get(st);
      if (!b) {
        b = h("button", "chip");
        b.type = "button";
        b.dataset.status = st;
        b.appendChild(h("span", "dot"));
        b.appendChild(h("b"));
        b.appendChild(document.createTextNode(" " + st));
        chips.set(st, b);
        box.appendChild(b);
      }
      const n = counts.get(st) || 0;
      b.hidden = !n;
      setText(b.children[1], n);
      const on = S.statusFilter === st;
      if (b.classList.contains("on") !== on) b.classList.toggle("on", on);
      b.title = on ? "show every loop" : "show only " + st + " loops";
    }
    const run = elapsedRun();
    setTotal("tokens", S.runSpend.tokens ? fmtTokens(S.runSpend.tokens) : "");
    setTotal("cost", S.runSpend.calls ? fmtCostLong(S.runSpend) : "");
    setTotal("elapsed", run !== null ? fmtDuration(run) : "");
    $("stop-run").hidden = !controlsOn();
  }

  const chips = new Map(); // status -> its chip
  const totals = new Map(); // name -> its <b>

  function setTotal(name, value) {
    let b = totals.get(name);
    if (!b) {
      const span = h("span", "total");
      span.appendChild(h("span", "muted", name + " "));
      b = span.appendChild(h("b"));
      totals.set(name, b);
      $("totals").appendChild(span);
    }
    b.parentNode.hidden = !value;
    setText(b, value);
  }

  function elapsedRun() {
    if (S.runStart === null) return null;
    const end = S.runEnd !== null ? S.runEnd : controlsOn() ? Date.now() : null;
    return end === null ? null : Math.max(0, end - S.runStart);
  }

  $("counts").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-status]");
    if (!b) return;
    S.statusFilter = S.statusFilter === b.dataset.status ? null : b.dataset.status;
    dirty.order = dirty.header = true;
    schedule();
  });

  // ---------------------------------------------------------------- timeline

  const KIND_LABELS = [
    ["query", "questions"], ["share", "shares"], ["alert", "alerts"], ["merge", "merges"],
    ["conflict", "conflicts"], ["control", "controls"], ["lifecycle", "loop ends"], ["system", "system alerts"],
  ];

  function drawKinds() {
    const box = $("kinds");
    box.textContent = "";
    for (const [k, label] of KIND_LABELS) {
      const b = h("button", "kind", label);
      b.type = "button";
      b.dataset.kindToggle = k;
      b.classList.toggle("on", !!S.kinds[k]);
      b.setAttribute("aria-pressed", S.kinds[k] ? "true" : "false");
      box.appendChild(b);
    }
  }

  $("kinds").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-kind-toggle]");
    if (!b) return;
    const k = b.dataset.kindToggle;
    S.kinds[k] = !S.kinds[k];
    drawKinds();
    S.tlCap = TIMELINE_PAGE;
    dirty.timelineRebuild = true;
    schedule();
  });

  $("timeline-more").addEventListener("click", () => {
    S.tlCap += TIMELINE_PAGE;
    dirty.timelineRebuild = true;
    schedule();
  });

  function shown(item) {
    return !!S.kinds[item.kind];
  }

  function drawTimeline() {
    const list = $("timeline");
    if (dirty.timelineRebuild) {
      for (const it of S.timeline) it.el = null;
      list.textContent = "";
      let n = 0, more = false;
      const frag = document.createDocumentFragment();
      for (let i = S.timeline.length - 1; i >= 0; i--) {
        const it = S.timeline[i];
        if (!shown(it)) continue;
        if (n >= S.tlCap) {
          more = true;
          break;
        }
        it.el = itemElement(it);
        frag.appendChild(it.el);
        n++;
      }
      list.appendChild(frag);
      $("timeline-more").hidden = !more;
      dirty.timelineRebuild = false;
    } else {
      // Only the newest `tlCap` of this frame's items can be shown (a replayed history may
      // bring thousands in one frame): build those, newest first, in one fragment.
      const fresh = [];
      for (let i = tlNew.length - 1; i >= 0 && fresh.length < S.tlCap; i--) if (shown(tlNew[i])) fresh.push(tlNew[i]);
      const frag = document.createDocumentFragment();
      for (const it of fresh) {
        it.el = itemElement(it);
        // New items flash briefly, except the history read when the page opens.
        if (fresh.length <= 20 && performance.now() - S.openedAt > 2000) it.el.classList.add("new");
        frag.appendChild(it.el);
      }
      list.insertBefore(frag, list.firstChild);
      let extra = list.childElementCount - S.tlCap;
      while (extra-- > 0 && list.lastChild) {
        const gone = list.lastChild;
        if (gone._item) gone._item.el = null;
        gone.remove();
        $("timeline-more").hidden = false;
      }
      for (const it of tlChanged) {
        if (it.el && it.el.parentNode === list) {
          const next = itemElement(it);
          list.replaceChild(next, it.el);
          it.el = next;
        }
      }
    }
    tlNew.length = 0;
    tlChanged.clear();
    $("timeline-empty").hidden = list.childElementCount > 0;
  }

  /** `taskdaemon/<this run>/integration` is just `integration` here. */
  function shortBranch(b) {
    const own = "taskdaemon/" + S.runId + "/";
    return S.runId && b.startsWith(own) ? b.slice(own.length) : b;
  }

  function loopLink(name) {
    const a = h("button", "loop-link", name);
    a.type = "button";
    a.dataset.openLoop = name;
    a.title = "Open " + name;
    return a;
  }

  function itemElement(it) {
    const li = h("li", "tl-item");
    li._item = it;
    li.dataset.kind = it.kind;
    li.dataset.seq = String(it.seq);
    const when = h("time", "tl-time", fmtClock(it.time));
    li.appendChild(when);
    const box = h("div", "tl-body");
    li.appendChild(box);
    const head = h("div", "tl-head");
    box.appendChild(head);
    const badge = h("span", "badge");
    head.appendChild(badge);
    const arrow = (a, b, sym) => {
      head.appendChild(loopLink(a));
      head.appendChild(h("span", "arrow", sym));
      head.appendChild(loopLink(b));
    };
    switch (it.kind) {
      case "query": {
        badge.textContent = "ask";
        arrow(it.from, it.to, "→");
        li.dataset.state = it.state;
        const q = h("div", "tl-q");
        q.appendChild(h("span", "lbl", "Q"));
        q.appendChild(h("span", "txt", clip(it.question || "(question not in the record)", 600)));
        box.appendChild(q);
        const a = h("div", "tl-a");
        if (it.state === "waiting") {
          a.appendChild(h("span", "lbl", "…"));
          a.appendChild(h("span", "txt muted", "waiting for " + it.to + "'s answer"));
        } else {
          a.appendChild(h("span", "lbl", it.state === "failed" ? "✗" : "A"));
          a.appendChild(h("span", "txt" + (it.state === "failed" ? " bad" : ""), clip(it.reply, 600)));
          if (it.took !== null && it.took !== undefined) head.appendChild(h("span", "took", (it.state === "failed" ? "failed after " : "answered in ") + fmtDuration(it.took)));
        }
        box.appendChild(a);
        break;
      }
      case "share": {
        badge.textContent = "share";
        arrow(it.from, it.to, "⇒");
        head.appendChild(h("span", "tag", it.dataType));
        box.appendChild(h("pre", "tl-data", clip(jsonText(it.data, false), 400)));
        if (it.error) box.appendChild(h("div", "bad", clip("not delivered: " + it.error, 160)));
        break;
      }
      case "alert":
      case "system": {
        badge.textContent = it.kind === "system" ? "system" : "alert";
        head.appendChild(it.kind === "system" ? h("span", "muted", "taskdaemon") : loopLink(it.from));
        head.appendChild(h("span", "tag", it.eventType));
        head.appendChild(h("span", "muted", "to " + it.recipients + " loop" + (it.recipients === 1 ? "" : "s")));
        box.appendChild(h("div", "tl-text", clip(it.text, 400)));
        if (it.error) box.appendChild(h("div", "bad", clip("refused: " + it.error, 160)));
        break;
      }
      case "merge": {
        badge.textContent = "merge";
        head.appendChild(loopLink(it.loop));
        head.appendChild(h("span", "arrow", "⤳"));
        const into = h("span", "mono", shortBranch(it.into));
        into.title = it.into;
        head.appendChild(into);
        box.appendChild(h("div", "tl-text mono", "commit " + it.commit.slice(0, 12)));
        break;
      }
      case "conflict": {
        badge.textContent = "conflict";
        if (it.what === "predicted") {
          it.loops.forEach((n, i) => {
            if (i) head.appendChild(h("span", "arrow", "×"));
            head.appendChild(loopLink(n));
          });
          head.appendChild(h("span", "muted", "will conflict"));
        } else {
          head.appendChild(loopLink(it.loop));
          head.appendChild(h("span", "muted", "handed back (attempt " + it.attempt + ") from " + it.into));
          box.appendChild(h("div", "tl-text", clip(it.text, 400)));
        }
        if (it.files.length) box.appendChild(h("div", "tl-files mono", clip(it.files.join("  "), 300)));
        break;
      }
      case "control": {
        badge.textContent = "stop";
        head.appendChild(h("span", null, it.by + " asked to stop "));
        if (it.loop) head.appendChild(loopLink(it.loop));
        else head.appendChild(h("b", null, "the run"));
        break;
      }
      case "lifecycle": {
        badge.textContent = it.what;
        li.dataset.what = it.what;
        head.appendChild(loopLink(it.loop));
        if (it.text) box.appendChild(h("div", "tl-text" + (it.bad ? " bad" : ""), clip(it.text, 400)));
        break;
      }
      default:
        break;
    }
    return li;
  }

  $("timeline").addEventListener("click", (ev) => {
    const a = ev.target.closest("[data-open-loop]");
    if (a) openDetail(a.dataset.openLoop);
  });

  // ---------------------------------------------------------------- run pane

  // A layer (loops at one depth of the dependency graph) of more than this many loops is
  // drawn as one node with its loops counted by status, so 1,000 loops stay a readable graph.
  const LAYER_MAX = 12;
  const svgNS = "http://www.w3.org/2000/svg";
  let graphNodes = []; // {g, names: [loop], group: bool}

  function svg(tag, attrs) {
    const e = document.createElementNS(svgNS, tag);
    for (const k in attrs) e.setAttribute(k, String(attrs[k]));
    return e;
  }

  function drawGraph() {
    const box = $("graph");
    box.textContent = "";
    graphNodes = [];
    const all = [...S.loops.values()];
    let edgesIn = 0;
    for (const l of all) for (const d of l.dependsOn) if (S.loops.has(d)) edgesIn++;
    setText($("graph-note"), !all.length ? "" : edgesIn ? "" : "no dependencies between loops");
    if (!all.length) return;
    // Depth = longest chain of dependencies above a loop (a cycle is cut where it is found).
    const depth = new Map();
    const visiting = new Set();
    const depthOf = (name) => {
      if (depth.has(name)) return depth.get(name);
      if (visiting.has(name)) return 0;
      visiting.add(name);
      const l = S.loops.get(name);
      let d = 0;
      if (l) for (const p of l.dependsOn) if (S.loops.has(p)) d = Math.max(d, depthOf(p) + 1);
      visiting.delete(name);
      depth.set(name, d);
      return d;
    };
    const layers = [];
    for (const l of all) {
      const d = depthOf(l.name);
      (layers[d] = layers[d] || []).push(l);
    }
    const W = 150, H = 26, GX = 56, GY = 10, GH = 58;
    const nodeOf = new Map(); // loop name -> node index
    const pos = []; // node index -> [x, y, h]
    let height = 0;
    layers.forEach((layer, x) => {
      if (!layer) return;
      layer.sort((a, b) => (a.name < b.name ? -1 : 1));
      const px = 8 + x * (W + GX);
      if (layer.length > LAYER_MAX) {
        const i = graphNodes.length;
        graphNodes.push({ names: layer.map((l) => l.name), group: true });
        for (const l of layer) nodeOf.set(l.name, i);
        pos.push([px, 8, GH]);
        height = Math.max(height, 8 + GH);
      } else {
        layer.forEach((l, y) => {
          const i = graphNodes.length;
          graphNodes.push({ names: [l.name], group: false });
          nodeOf.set(l.name, i);
          pos.push([px, 8 + y * (H + GY), H]);
          height = Math.max(height, 8 + y * (H + GY) + H);
        });
      }
    });
    const width = 16 + layers.length * (W + GX) - GX;
    height += 8;
    const root = svg("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height, role: "img" });
    root.appendChild(svg("title", {})).textContent = "Dependencies between loops";
    const edges = svg("g", { class: "edges" });
    root.appendChild(edges);
    const drawn = new Set();
    for (const l of all) {
      const to = nodeOf.get(l.name);
      for (const d of l.dependsOn) {
        const from = nodeOf.get(d);
        if (from === undefined || to === undefined || from === to || drawn.has(from + ">" + to)) continue;
        drawn.add(from + ">" + to);
        const [fx, fy, fh] = pos[from];
        const [tx, ty, th] = pos[to];
        const x1 = fx + W, y1 = fy + fh / 2, x2 = tx, y2 = ty + th / 2;
        const mx = (x1 + x2) / 2;
        edges.appendChild(svg("path", { d: "M" + x1 + "," + y1 + " C" + mx + "," + y1 + " " + mx + "," + y2 + " " + x2 + "," + y2 }));
      }
    }
    graphNodes.forEach((n, i) => {
      const [x, y, hh] = pos[i];
      const g = svg("g", { class: n.group ? "node group" : "node", transform: "translate(" + x + "," + y + ")" });
      g.appendChild(svg("rect", { width: W, height: hh, rx: 6 }));
      if (n.group) {
        const t = svg("text", { x: 10, y: 18 });
        t.textContent = n.names.length + " loops";
        g.appendChild(t);
        g.appendChild(svg("g", { class: "bar", transform: "translate(10,28)" }));
        g.appendChild(svg("text", { x: 10, y: 50, class: "sub" }));
      } else {
        g.setAttribute("data-node", n.names[0]);
        g.appendChild(svg("circle", { cx: 12, cy: H / 2, r: 4.5 }));
        const t = svg("text", { x: 22, y: H / 2 + 4 });
        t.textContent = clip(n.names[0], 18);
        g.appendChild(t);
      }
      g.appendChild(svg("title", {}));
      n.g = g;
      root.appendChild(g);
    });
    box.appendChild(root);
    colorGraph();
  }

  /** Node colours (and a layer's counts) from the loops' statuses. */
  function colorGraph() {
    for (const n of graphNodes) {
      if (!n.group) {
        const l = S.loops.get(n.names[0]);
        if (!l) continue;
        if (n.g.getAttribute("data-status") !== l.status) n.g.setAttribute("data-status", l.status);
        n.g.lastChild.textContent = l.name + ": " + l.status;
        continue;
      }
      const counts = new Map();
      for (const name of n.names) {
        const l = S.loops.get(name);
        if (l) counts.set(l.status, (counts.get(l.status) || 0) + 1);
      }
      const bar = n.g.querySelector(".bar");
      bar.textContent = "";
      let x = 0;
      const words = [];
      for (const st of STATUS_ORDER) {
        const c = counts.get(st);
        if (!c) continue;
        const w = (130 * c) / n.names.length;
        bar.appendChild(svg("rect", { x: x, y: 0, width: Math.max(w, 1), height: 6, class: "seg", "data-status": st }));
        x += w;
        words.push(c + " " + st);
      }
      n.g.querySelector("text.sub").textContent = clip(words.slice(0, 2).join(", "), 24);
      n.g.lastChild.textContent = words.join(", ");
    }
  }

  $("graph").addEventListener("click", (ev) => {
    const g = ev.target.closest("[data-node]");
    if (g) openDetail(g.getAttribute("data-node"));
  });

  function drawMerges() {
    const box = $("merge-list");
    box.textContent = "";
    const groups = { waiting: [], handed_back: [], blocked: [], merged: [] };
    for (const l of S.loops.values()) {
      if (!l.merge) continue;
      // A loop without a branch works in the checkout itself and is never integrated.
      if (l.merge.state === "waiting" && (l.status !== "completed" || !controlsOn() || !l.branch)) continue;
      (groups[l.merge.state] || []).push(l);
    }
    const titles = { waiting: "completed, not merged yet", handed_back: "handed back", blocked: "blocked", merged: "merged" };
    let any = false;
    for (const k of ["waiting", "handed_back", "blocked", "merged"]) {
      const list = groups[k];
      if (!list.length) continue;
      any = true;
      list.sort((a, b) => (b.merge.time || 0) - (a.merge.time || 0));
      const sec = h("div", "mq-group");
      sec.dataset.state = k;
      sec.appendChild(h("div", "mq-title", titles[k] + " · " + list.length));
      const ul = h("ul");
      for (const l of list.slice(0, 30)) {
        const li = h("li");
        li.appendChild(loopLink(l.name));
        const m = l.merge;
        const info = k === "merged" ? m.commit.slice(0, 8) : k === "handed_back" ? "attempt " + m.attempts + ": " + clip(m.reason || "", 60) : k === "blocked" ? clip(m.reason || "", 60) : "";
        if (info) li.appendChild(h("span", "muted mono", info));
        ul.appendChild(li);
      }
      if (list.length > 30) ul.appendChild(h("li", "muted", "and " + (list.length - 30) + " more"));
      sec.appendChild(ul);
      box.appendChild(sec);
    }
    if (!any) box.appendChild(h("p", "muted", "Nothing merged yet."));
  }

  $("merge-list").addEventListener("click", (ev) => {
    const a = ev.target.closest("[data-open-loop]");
    if (a) openDetail(a.dataset.openLoop);
  });

  // ---------------------------------------------------------------- controls

  async function stopLoop(name) {
    const l = S.loops.get(name);
    if (!l || !controlsOn()) return;
    l.stopping = true;
    touch(l);
    schedule();
    try {
      await getJson("api/loops/" + encodeURIComponent(name) + "/stop", null, { method: "POST" });
      toast("Asked " + name + " to stop.");
    } catch (e) {
      l.stopping = false;
      touch(l);
      schedule();
      toast("Could not stop " + name + ": " + e.message, true);
    }
  }

  let runStopArmed = 0;
  $("stop-run").addEventListener("click", async () => {
    const b = $("stop-run");
    if (!runStopArmed) {
      b.textContent = "Click again to stop every loop";
      b.classList.add("armed");
      runStopArmed = setTimeout(() => {
        runStopArmed = 0;
        b.textContent = "Stop run";
        b.classList.remove("armed");
      }, 4000);
      return;
    }
    clearTimeout(runStopArmed);
    runStopArmed = 0;
    b.disabled = true;
    b.textContent = "Stopping…";
    try {
      await getJson("api/run/stop", null, { method: "POST" });
      toast("Asked the run to stop.");
    } catch (e) {
      b.disabled = false;
      b.textContent = "Stop run";
      b.classList.remove("armed");
      toast("Could not stop the run: " + e.message, true);
    }
  });

  // ---------------------------------------------------------------- loop detail

  function openDetail(name) {
    if (!S.loops.has(name)) return;
    if (S.detail && S.detail.name === name) return;
    S.detail = {
      name: name,
      tab: S.detail ? S.detail.tab : "transcript",
      tNext: 0, tBusy: false,
      rNext: 0, rBusy: false,
      newEvents: false,
      followTimer: 0,
      info: null,
    };
    $("detail").hidden = false;
    document.body.classList.add("with-detail");
    for (const id of ["transcript", "receipts", "notes", "diff", "events"]) $(id).textContent = "";
    setText($("detail-name"), name);
    if (location.hash !== "#loop=" + encodeURIComponent(name)) history.replaceState(null, "", "#loop=" + encodeURIComponent(name));
    dirty.rows = true;
    drawDetailMeta();
    showTab(S.detail.tab);
    const d = S.detail;
    getJson("api/loops/" + encodeURIComponent(name)).then((info) => {
      if (S.detail !== d || !info || typeof info !== "object") return;
      d.info = info;
      const l = S.loops.get(name);
      if (l) {
        if (typeof info.max_iterations === "number" && info.max_iterations > 0) l.maxIter = info.max_iterations;
        if (info.branch) l.branch = str(info.branch);
        if (info.worktree) l.worktree = str(info.worktree);
        touch(l);
      }
      drawDetailMeta();
      schedule();
    }).catch((e) => {
      if (S.detail === d) toast(e.message, true);
    });
    schedule();
  }

  function closeDetail() {
    if (!S.detail) return;
    clearTimeout(S.detail.followTimer);
    S.detail = null;
    $("detail").hidden = true;
    document.body.classList.remove("with-detail");
    if (location.hash) history.replaceState(null, "", location.pathname + location.search);
    dirty.rows = true;
    schedule();
  }

  $("detail-close").addEventListener("click", closeDetail);
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && S.detail) closeDetail();
    if (ev.key === "/" && document.activeElement !== $("filter")) {
      ev.preventDefault();
      $("filter").focus();
    }
  });

  $("detail-stop").addEventListener("click", () => {
    if (S.detail) stopLoop(S.detail.name);
  });

  function drawDetailMeta() {
    const d = S.detail;
    if (!d) return;
    const l = S.loops.get(d.name);
    if (!l) return;
    $("detail-status").dataset.status = l.status;
    setText($("detail-type"), [l.type, l.stopping && !FINAL.has(l.status) ? "stopping" : l.status].filter(Boolean).join(" · "));
    const stop = $("detail-stop");
    const stoppable = controlsOn() && (l.status === "running" || l.status === "pending");
    stop.hidden = !stoppable;
    stop.disabled = l.stopping;
    if (stoppable) stop.dataset.stopLoop = l.name;
    else delete stop.dataset.stopLoop;
    const info = d.info || {};
    const rows = [
      ["iteration", l.iteration ? l.iteration + (l.maxIter ? " of " + l.maxIter : "") : ""],
      ["tool", l.tool || ""],
      ["validation", l.validation ? (l.validation.passed ? "passed" : "failed, exit " + l.validation.exit) : ""],
      ["tokens", fmtTokens(l.spend.tokens)],
      ["cost", fmtCostLong(l.spend)],
      ["elapsed", fmtDuration(elapsed(l, Date.now()))],
      ["depends on", l.dependsOn.join(", ")],
      ["host", l.host || ""],
      ["branch", l.branch || str(info.branch)],
      ["base", str(info.base)],
      ["worktree", l.worktree || str(info.worktree)],
      ["merge", l.merge ? l.merge.state.replace("_", " ") + (l.merge.commit ? " " + l.merge.commit.slice(0, 10) : "") : ""],
      ["reason", l.reason],
    ];
    const dl = $("detail-meta");
    dl.textContent = "";
    for (const [k, v] of rows) {
      if (!v) continue;
      const div = h("div");
      div.appendChild(h("dt", null, k));
      div.appendChild(h("dd", k === "branch" || k === "worktree" || k === "base" ? "mono" : null, v));
      dl.appendChild(div);
    }
  }

  $("tabs").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-tab]");
    if (b && S.detail) showTab(b.dataset.tab);
  });

  function showTab(tab) {
    const d = S.detail;
    d.tab = tab;
    for (const b of $("tabs").querySelectorAll("button[data-tab]")) b.classList.toggle("on", b.dataset.tab === tab);
    for (const id of ["transcript", "receipts", "notes", "diff", "events"]) $(id).hidden = id !== tab;
    if (tab === "transcript") loadTranscript();
    else if (tab === "receipts") loadReceipts();
    else if (tab === "notes") drawNotes();
    else if (tab === "diff") loadDiff();
    else if (tab === "events") drawLoopEvents();
  }

  /** New events for the open loop: fetch what its files gained, at most twice a second. */
  function detailFollow() {
    const d = S.detail;
    d.newEvents = false;
    if (d.followTimer) return;
    d.followTimer = setTimeout(() => {
      d.followTimer = 0;
      if (S.detail !== d) return;
      if (d.tab === "transcript") loadTranscript();
      else if (d.tab === "receipts") loadReceipts();
      else if (d.tab === "notes") drawNotes();
      else if (d.tab === "events") drawLoopEvents();
      drawDetailMeta();
    }, 400);
  }

  function nearBottom(e) {
    return e.scrollHeight - e.scrollTop - e.clientHeight < 80;
  }

  async function loadTranscript() {
    const d = S.detail;
    if (!d || d.tBusy) return;
    d.tBusy = true;
    const pane = $("transcript");
    const scroller = $("detail-body");
    try {
      for (let pages = 0; pages < 20; pages++) {
        const stick = nearBottom(scroller);
        const res = await getJson("api/loops/" + encodeURIComponent(d.name) + "/transcript", { after: d.tNext, limit: 200 });
        if (S.detail !== d) return;
        const entries = res && Array.isArray(res.entries) ? res.entries : [];
        const empty = pane.querySelector(".empty");
        if (empty && entries.length) empty.remove();
        const frag = document.createDocumentFragment();
        for (const x of entries) if (x && typeof x === "object") renderEntry(frag, d, x.entry, x.n);
        pane.appendChild(frag);
        // A running loop opens at its latest turn; a finished one at its start. Once open,
        // the view follows new turns only while it is at the bottom.
        const first = d.tNext === 0;
        if (res && typeof res.next === "number" && res.next > d.tNext) d.tNext = res.next;
        const running = (S.loops.get(d.name) || {}).status === "running";
        if (d.tab === "transcript" && (first ? running : stick)) scroller.scrollTop = scroller.scrollHeight;
        if (entries.length < 200) break;
      }
      if (!pane.childElementCount) pane.appendChild(h("p", "empty", "Nothing in the transcript yet."));
    } catch (e) {
      if (S.detail === d) pane.appendChild(h("p", "error", "Transcript: " + e.message));
    } finally {
      d.tBusy = false;
    }
  }

  /** A text block, folded when long. */
  function textBlock(cls, text, fold) {
    const t = String(text);
    const lines = t.split("\n").length;
    if (fold && (t.length > 1500 || lines > 24)) {
      const det = h("details", cls);
      det.appendChild(h("summary", null, clip(t.split("\n")[0], 140) + "  (" + lines + " lines)"));
      det.appendChild(h("pre", null, t));
      return det;
    }
    return h("pre", cls, t);
  }

  function renderEntry(parent, d, e, n) {
    if (!e || typeof e !== "object") return;
    const kind = str(e.entry) || str(e.kind);
    const div = h("div", "t-entry");
    div.dataset.entry = kind;
    if (typeof n === "number") div.dataset.n = String(n);
    const iter = typeof e.iteration === "number" ? e.iteration : null;
    switch (kind) {
      case "iteration_started": {
        div.className = "t-entry t-iter";
        div.appendChild(h("div", "t-iter-title", "Iteration " + iter));
        const sys = h("details", "t-system");
        sys.appendChild(h("summary", null, "system prompt"));
        sys.appendChild(h("pre", null, str(e.system)));
        div.appendChild(sys);
        break;
      }
      case "request": {
        const p = e.purpose && typeof e.purpose === "object" ? e.purpose : {};
        if (p.kind === "query_answer") {
          div.classList.add("t-answering");
          div.appendChild(h("div", "t-label", "answering " + str(p.from) + "'s question"));
          div.appendChild(textBlock("t-text", str(p.question), true));
          break;
        }
        const msgs = Array.isArray(e.new_messages) ? e.new_messages : [];
        let any = false;
        for (const m of msgs) {
          if (!m || m.role !== "user" || !Array.isArray(m.content)) continue;
          for (const b of m.content) {
            if (!b || b.type !== "text") continue;
            const text = str(b.text);
            if (text.startsWith("[inbox:")) {
              const box = h("div", "t-inbox");
              box.appendChild(h("div", "t-label", "inbox"));
              box.appendChild(textBlock("t-text", text, true));
              div.appendChild(box);
            } else if (text.startsWith("[files changed")) {
              div.appendChild(h("div", "t-notice", text));
            } else {
              div.appendChild(h("div", "t-label", e.turn === 1 ? "prompt" : "to the model"));
              div.appendChild(textBlock("t-text", text, true));
            }
            any = true;
          }
        }
        if (!any) return;
        div.classList.add("t-user");
        break;
      }
      case "response": {
        const r = e.response && typeof e.response === "object" ? e.response : {};
        div.classList.add("t-model");
        const lbl = h("div", "t-label", (iter === 0 ? "answer" : "model") + (e.turn ? " · turn " + e.turn : ""));
        div.appendChild(lbl);
        if (r.text) div.appendChild(textBlock("t-text", str(r.text), true));
        const calls = Array.isArray(r.tool_calls) ? r.tool_calls : [];
        for (const c of calls) {
          if (!c || typeof c !== "object") continue;
          const call = h("details", "t-call");
          const sum = h("summary");
          sum.appendChild(h("span", "tool-name", str(c.name)));
          sum.appendChild(h("span", "muted", clip(jsonText(c.input, false), 120)));
          call.appendChild(sum);
          call.appendChild(h("pre", null, jsonText(c.input, true)));
          div.appendChild(call);
        }
        if (!r.text && !calls.length) div.appendChild(h("div", "muted", "(empty response)"));
        break;
      }
      case "spent": {
        const s = spendFrom(e.spend);
        const to = e.charged_to ? " · charged to " + str(e.charged_to) : "";
        div.className = "t-entry t-spent";
        div.textContent = fmtTokens(s.tokens) + " tokens" + (s.calls ? " · " + fmtCostLong(s) : "") + to;
        break;
      }
      case "tool_result": {
        div.classList.add(e.is_error ? "t-result-err" : "t-result");
        const det = h("details", "t-res");
        const content = str(e.content);
        const sum = h("summary");
        sum.appendChild(h("span", "tool-name", "↳ " + str(e.name)));
        sum.appendChild(h("span", e.is_error ? "bad" : "muted", clip(content.replace(/\s+/g, " "), 140)));
        det.appendChild(sum);
        det.appendChild(h("pre", null, content));
        det.open = !!e.is_error && content.length < 2000;
        div.appendChild(det);
        break;
      }
      case "validation": {
        div.classList.add(e.passed ? "t-valid-ok" : "t-valid-bad");
        div.appendChild(h("div", "t-label", "validation " + (e.passed ? "passed" : "failed") + (typeof e.exit_code === "number" ? " (exit " + e.exit_code + ")" : "")));
        if (e.output) div.appendChild(textBlock("t-text", str(e.output), true));
        break;
      }
      case "model_error": {
        div.classList.add("t-error");
        div.appendChild(h("div", "t-label", "model error"));
        div.appendChild(h("pre", "t-text", str(e.error)));
        break;
      }
      case "too_large": {
        div.classList.add("t-notice");
        div.textContent = "a line of " + num(e.bytes) + " bytes, too large to show here (see `taskdaemon logs`)";
        break;
      }
      default: {
        div.appendChild(h("div", "t-label", kind || "entry"));
        div.appendChild(h("pre", "t-text", clip(jsonText(e, true), 4000)));
      }
    }
    parent.appendChild(div);
  }

  async function loadReceipts() {
    const d = S.detail;
    if (!d || d.rBusy) return;
    d.rBusy = true;
    const pane = $("receipts");
    try {
      let table = pane.querySelector("table");
      if (!table) {
        pane.textContent = "";
        table = h("table", "receipts");
        const tr = h("tr");
        for (const c of ["#", "time", "tool", "took", "output", "result", "effects"]) tr.appendChild(h("th", null, c));
        table.appendChild(h("thead")).appendChild(tr);
        table.appendChild(h("tbody"));
        pane.appendChild(table);
      }
      const tb = table.tBodies[0];
      for (let pages = 0; pages < 20; pages++) {
        const res = await getJson("api/loops/" + encodeURIComponent(d.name) + "/receipts", { after: d.rNext, limit: 500 });
        if (S.detail !== d) return;
        const entries = res && Array.isArray(res.entries) ? res.entries : [];
        for (const x of entries) {
          const r = x && x.entry && typeof x.entry === "object" ? x.entry : {};
          const tr = h("tr");
          tr.appendChild(h("td", "num", r.seq !== undefined ? r.seq : x.n));
          tr.appendChild(h("td", "mono", fmtClock(parseTime(r.time))));
          tr.appendChild(h("td", "tool-name", str(r.tool)));
          tr.appendChild(h("td", "num", fmtDuration(num(r.latency_ms))));
          tr.appendChild(h("td", "num", num(r.output_bytes) + " B" + (r.output_capped ? " (capped)" : "")));
          tr.appendChild(h("td", r.is_error ? "bad" : "ok", r.is_error ? str(r.error_kind) || "error" : "ok"));
          const fx = Array.isArray(r.side_effects) ? r.side_effects : [];
          tr.appendChild(h("td", "muted", fx.map((f) => str(f.kind) + " " + str(f.path || f.command)).join(", ")));
          tr.title = jsonText(r.input, true).slice(0, 2000);
          tb.appendChild(tr);
        }
        if (res && typeof res.next === "number" && res.next > d.rNext) d.rNext = res.next;
        if (entries.length < 500) break;
      }
      if (!tb.childElementCount && !pane.querySelector(".empty")) pane.appendChild(h("p", "empty", "No tool call yet."));
      else if (tb.childElementCount) {
        const e = pane.querySelector(".empty");
        if (e) e.remove();
      }
    } catch (e) {
      if (S.detail === d) pane.appendChild(h("p", "error", "Receipts: " + e.message));
    } finally {
      d.rBusy = false;
    }
  }

  function drawNotes() {
    const d = S.detail;
    const pane = $("notes");
    pane.textContent = "";
    const list = S.notes.get(d.name) || [];
    if (!list.length) pane.appendChild(h("p", "empty", "No progress note yet: a loop writes one at the end of each iteration."));
    for (let i = list.length - 1; i >= 0; i--) {
      const n = list[i];
      const div = h("div", "note");
      div.appendChild(h("div", "t-label", "after iteration " + n.iteration + (n.time !== null ? " · " + fmtClock(n.time) : "")));
      div.appendChild(h("pre", "t-text", n.note));
      pane.appendChild(div);
    }
  }

  async function loadDiff() {
    const d = S.detail;
    const pane = $("diff");
    pane.textContent = "";
    const bar = h("div", "diff-bar");
    const again = h("button", "ghost small", "Refresh");
    again.type = "button";
    again.addEventListener("click", loadDiff);
    bar.appendChild(again);
    pane.appendChild(bar);
    const wait = h("p", "muted", "Loading the diff…");
    pane.appendChild(wait);
    try {
      const res = await getJson("api/loops/" + encodeURIComponent(d.name) + "/diff");
      if (S.detail !== d) return;
      wait.remove();
      bar.insertBefore(h("span", "mono", str(res.branch) + "  against  " + str(res.base)), again);
      const text = str(res.diff);
      if (!text) {
        pane.appendChild(h("p", "empty", "No change against the base."));
        return;
      }
      const pre = h("pre", "diff");
      const frag = document.createDocumentFragment();
      for (const line of text.split("\n")) {
        let cls = "";
        if (line.startsWith("diff --git")) cls = "d-file";
        else if (line.startsWith("@@")) cls = "d-hunk";
        else if (line.startsWith("+++") || line.startsWith("---")) cls = "d-meta";
        else if (line.startsWith("+")) cls = "d-add";
        else if (line.startsWith("-")) cls = "d-del";
        frag.appendChild(h("span", cls, line + "\n"));
      }
      pre.appendChild(frag);
      pane.appendChild(pre);
      if (res.truncated) pane.appendChild(h("p", "muted", "The diff is cut at 1 MiB: see the branch with git for the rest."));
    } catch (e) {
      wait.remove();
      if (S.detail === d) pane.appendChild(h("p", "error", "Diff: " + e.message));
    }
  }

  function eventLine(e) {
    const k = str(e.event);
    const parts = [];
    for (const key of Object.keys(e)) {
      if (key === "seq" || key === "time" || key === "event" || key === "loop_name" || key === "spend" || key === "sandbox") continue;
      const v = e[key];
      parts.push(key + "=" + (typeof v === "string" ? clip(v, 120) : clip(jsonText(v, false), 120)));
    }
    return [k, parts.join("  ")];
  }

  function drawLoopEvents() {
    const d = S.detail;
    const pane = $("events");
    pane.textContent = "";
    const list = S.perLoop.get(d.name) || [];
    const table = h("table", "loop-events");
    const tb = h("tbody");
    for (let i = list.length - 1, n = 0; i >= 0 && n < 500; i--, n++) {
      const e = list[i];
      const [k, rest] = eventLine(e);
      const tr = h("tr");
      tr.appendChild(h("td", "mono muted", fmtClock(parseTime(e.time))));
      tr.appendChild(h("td", "ev-kind", k));
      tr.appendChild(h("td", null, rest));
      tb.appendChild(tr);
    }
    table.appendChild(tb);
    pane.appendChild(list.length ? table : h("p", "empty", "No event yet."));
  }

  // ---------------------------------------------------------------- connection

  let source = null;

  function setConn(state, text) {
    const c = $("conn");
    c.dataset.conn = state;
    setText(c, text);
  }

  function connect() {
    const params = S.lastSeq > 0 ? { after: S.lastSeq } : {};
    source = new EventSource(apiUrl("api/events", params));
    source.onopen = () => setConn("live", "connected");
    if (!S.openedAt) S.openedAt = performance.now();
    source.onerror = () => {
      if (S.ended) return;
      setConn("retrying", "reconnecting…");
    };
    source.onmessage = (m) => {
      let e;
      try {
        e = JSON.parse(m.data);
      } catch (err) {
        return; // not an event: skip it (the server sends only JSON)
      }
      if (!e || typeof e !== "object") return;
      if (typeof e.seq === "number" && e.seq <= S.lastSeq) return; // already seen (a reconnect)
      noteReceived(e.time);
      applyEvent(e);
      schedule();
    };
    source.addEventListener("tool", (m) => {
      let d;
      try {
        d = JSON.parse(m.data);
      } catch (err) {
        return;
      }
      if (!d || typeof d !== "object") return;
      noteReceived(d.time);
      applyTool(d);
      schedule();
    });
    source.addEventListener("end", () => {
      S.ended = true;
      source.close();
      setConn("done", "complete");
      refreshRun(true);
    });
  }

  async function refreshRun(final) {
    try {
      const run = await getJson("api/run");
      S.runId = str(run.run_id) || S.runId;
      S.dir = str(run.dir);
      S.live = run.live === true && !S.ended;
      if (final) reconcileSummary(run.summary);
      else applySummary(run.summary);
      $("banner").hidden = true;
      dirty.header = dirty.rows = dirty.order = dirty.merges = true;
      schedule();
      return true;
    } catch (e) {
      const b = $("banner");
      b.textContent = "Cannot load the run: " + e.message;
      b.hidden = false;
      return false;
    }
  }

  // Elapsed times and running tools tick once a second (visible rows only).
  setInterval(() => {
    if (!controlsOn()) return;
    dirty.rows = true;
    dirty.header = true;
    if (S.sortKey === "elapsed") dirty.order = true;
    if (S.detail) dirty.detailMeta = true;
    schedule();
  }, 1000);

  async function start() {
    drawKinds();
    if (!(await refreshRun(false))) {
      setConn("retrying", "offline");
      setTimeout(start, 3000);
      return;
    }
    connect();
    const m = /^#loop=(.+)$/.exec(location.hash);
    if (m) {
      const name = decodeURIComponent(m[1]);
      // The loop may only be known once the first events arrive.
      const tryOpen = (left) => {
        if (S.loops.has(name)) openDetail(name);
        else if (left > 0) setTimeout(() => tryOpen(left - 1), 200);
      };
      tryOpen(25);
    }
  }

  start();
})();
