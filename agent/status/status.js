// supernode-agent status page: reads the agent's stream (GET api/v1/status/stream, server-sent events read
// with fetch so the admin token travels in the Authorization header) and draws the rack.
//
// Every string that came from a device, an alert or the config is put in the page as a text node
// (el() below never parses markup): a GPU name or an alert label such as "<img src=x onerror=...>" shows
// as those characters. The agent's Content Security Policy forbids inline script and any other origin.
"use strict";

(function () {
  const TOKEN_KEY = "supernode-agent-token";
  const STALE_AFTER_MS = 12000;  // no byte from the agent for this long: the stream is dead
  let token = sessionStorage.getItem(TOKEN_KEY) || "";
  let state = null;
  let access = null;  // the stream's hello: may this page see incidents?
  let lastByte = 0;
  let lastState = 0;
  let live = false;
  let lostAt = null;
  let attempt = 0;
  let controller = null;
  let switching = false;  // the stream is being reopened on purpose (a new token): not a loss

  // -- DOM helpers: text only ---------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "onclick") node.addEventListener("click", v);
      else if (k.startsWith("data-") || ["id", "title", "type", "role", "colspan", "scope"].includes(k) || k.startsWith("aria-"))
        node.setAttribute(k, String(v));
      else throw new Error("el: attribute not allowed: " + k);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  const SHAPES = { ok: "\u25CF", warn: "\u25C6", bad: "\u25B2", unknown: "?" };
  function badge(kind, text, title) {
    return el("span", { class: "badge " + kind, title: title || null }, SHAPES[kind] + " " + text);
  }
  function replace(id, ...children) {
    const body = document.querySelector("#" + id + " > .body");
    body.replaceChildren(...children.flat().filter((c) => c));
  }
  function fmt(v, unit, digits) {
    if (v === null || v === undefined) return "\u2013";
    return Number(v).toFixed(digits === undefined ? 1 : digits) + (unit ? " " + unit : "");
  }
  function age(s) {
    if (s === null || s === undefined) return "never";
    if (s < 90) return Math.round(s) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    return (s / 3600).toFixed(1) + " h ago";
  }
  function duration(s) {
    if (s === null || s === undefined) return "\u2013";
    if (s >= 86400) return (s / 86400).toFixed(1) + " d";
    if (s >= 3600) return (s / 3600).toFixed(1) + " h";
    if (s >= 60) return (s / 60).toFixed(1) + " min";
    return Math.round(s) + " s";
  }
  function clock(ts) { return ts ? new Date(ts * 1000).toLocaleTimeString() : "\u2013"; }
  function bar(value, limit) {
    if (value === null || value === undefined || !limit) return null;
    const ratio = Math.max(0, Math.min(1, value / limit));
    const cls = ratio >= 1 ? "bar bad" : ratio >= 0.9 ? "bar warn" : "bar";
    const fill = el("span");
    fill.style.width = Math.round(ratio * 100) + "%";
    return el("span", { class: cls, title: Math.round(100 * value / limit) + " % of the limit" }, fill);
  }
  function targets(t) {
    return Object.entries(t || {}).sort().map(([k, v]) => k + "=" + v).join(",");
  }
  function td(label, ...children) { return el("td", { "data-label": label }, ...children); }
  function table(headers, rows) {
    return el("table", { class: "stack" }, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
              el("tbody", {}, rows));
  }

  // -- sections ---------------------------------------------------------------------------------

  function attention(s) {
    const items = [];
    for (const z of s.coolant.zones) {
      if (z.state === "wet") items.push(badge("bad", "LEAK: zone " + z.name + " is WET (nodes " + (z.nodes.join(", ") || "none listed") + ")"));
      else if (z.state === "unknown") items.push(badge("bad", "zone " + z.name + ": leak state UNKNOWN"));
      else if (z.state === "fault") items.push(badge("warn", "zone " + z.name + ": leak sensor fault"));
    }
    const inc = s.incidents;
    if (inc) {
      if (inc.pending_approvals.length) items.push(badge("warn", inc.pending_approvals.length + " step(s) waiting for approval"));
      const crit = inc.open.filter((i) => i.severity === "critical").length;
      if (crit) items.push(badge("bad", crit + " critical incident(s) open"));
      if (inc.breaker_open) items.push(badge("bad", "circuit breaker OPEN: the agent stopped acting"));
    }
    for (const n of s.nodes) {
      if (n.reach === "unreachable") items.push(badge("warn", n.name + ": not reachable from here"));
      const card = n.card;
      if (card && n.reach !== "unreachable") {
        const capped = card.gpus.filter((g) => g.capped).length;
        if (capped) items.push(badge("warn", n.name + ": " + capped + " GPU(s) capped"));
        const lost = card.gpus.filter((g) => g.marks.some((m) => m === "lost" || m === "hung" || m === "missing")).length;
        if (lost) items.push(badge("bad", n.name + ": " + lost + " GPU(s) lost, hung or missing"));
        const unread = card.gpus.filter((g) => g.marks.includes("not read")).length;
        if (unread) items.push(badge("warn", n.name + ": " + unread + " GPU(s) not read (no fresh NVML reading)"));
      }
    }
    const failing = s.sources.filter((x) => x.state === "failing" || x.state === "stale");
    if (failing.length) items.push(badge("warn", failing.length + " source(s) failing or stale"));
    if (s.remediation_degraded) items.push(badge("bad", "remediation not running: " + s.remediation_degraded));
    if (s.coordination && s.coordination.state === "degraded") {
      items.push(badge("bad", "rack coordination LOST: this agent acts on its own node only"));
    }
    if (!items.length) items.push(badge("ok", "nothing needs attention"));
    replace("attention", el("p", { class: "row" }, items));
  }

  function stepLine(step) {
    const parts = [el("strong", {}, step.action)];
    if (!step.targets.length) parts.push(" ", badge("unknown", "not started (waits for an earlier step, or no target here)"));
    for (const t of step.targets) {
      const where = (t.target || "no target") + (t.phase === "undo" ? " (undo)" : "");
      let b;
      if (t.state === "done") b = badge("ok", "done" + (t.result && t.result !== "done" ? " (" + t.result + ")" : ""));
      else if (t.state === "running") b = badge("warn", "running" + (t.why ? ": " + t.why : ""));
      else if (t.state === "waiting_approval") b = badge("warn", "waiting for approval (" + t.approval + ")");
      else if (t.state === "blocked") b = badge("bad", "blocked by " + t.guardrail + (t.why ? ": " + t.why : ""));
      else if (t.state === "failed") b = badge("bad", "failed: " + t.why);
      else if (t.state === "not_configured") b = badge("unknown", "not configured" + (t.why ? ": " + t.why : ""));
      else b = badge("unknown", t.state);
      parts.push(el("div", { "data-step-target": t.target }, where + " \u2014 ", b));
    }
    return el("li", { "data-action": step.action }, parts);
  }

  function locked() {
    return el("p", {}, badge("unknown", "locked"), " ", access && access.locked ? access.locked
      : "incidents need the admin token", ". Enter it above to see incidents and approve steps.");
  }

  // Apart from the incidents, so an Approve button stays the same element while steps' states change around it.
  function approvalsSection(s) {
    if (!s.incidents) {
      replace("approvals", locked());
      return;
    }
    const pending = s.incidents.pending_approvals;
    replace("approvals", pending.length ? el("ul", { class: "plain", id: "pending" }, pending.map((p) =>
      el("li", { "data-approval-id": p.id }, badge("warn", "waiting"), " ", el("strong", {}, p.action),
        " " + p.target + (p.phase === "undo" ? " (undo)" : ""),
        " \u2014 " + p.approval + " \u00B7 incident " + p.incident_id + " \u00B7 expires " + clock(p.expires_at) + " ",
        p.dry_history ? el("small", {}, "dry hold " + (p.dry_hold_passed ? "passed" : "not passed") + ": " +
          p.dry_history.map((r) => r.sensor + " " + r.state + " " + Math.round(r.dry_seconds) + " s").join(", ") + " ") : null,
        el("button", { type: "button", class: "primary", "data-approve": p.id, onclick: () => openApprove(p) },
           "Approve\u2026")))) : el("p", {}, badge("ok", "nothing waits for a person")));
  }

  function incidentsSection(s) {
    if (!s.incidents) {
      replace("incidents", locked());
      return;
    }
    const inc = s.incidents;
    const out = [el("p", { class: "row" }, "mode ", el("strong", {}, inc.mode), " \u00B7 circuit breaker ",
      inc.breaker_open ? badge("bad", "OPEN") : badge("ok", "closed"),
      Object.keys(inc.maintenance || {}).length ? badge("warn", "maintenance: " + Object.entries(inc.maintenance)
        .map(([n, m]) => n + " (by " + m.by + ", set on " + m.set_via + ")").join(", ")) : null)];
    for (const l of inc.leak_scope || []) {  // the leak's scope now (agent/remediation/leak_scope.py), widest first
      out.push(el("p", { class: "row", "data-leak-scope": l.scope }, badge("bad", "leak scope " + l.scope), " " +
        targets(l.targets) + (l.watched.length ? " \u00B7 watched below: " + l.watched.join(", ") : "") +
        (l.evidence ? " \u00B7 " + l.evidence : "")));
    }
    if (!inc.open.length) out.push(el("p", {}, badge("ok", "no open incident")));
    for (const i of inc.open) {
      const sev = i.severity === "critical" ? "bad" : "warn";
      out.push(el("div", { class: "card " + sev, "data-incident": i.id },
        el("h3", {}, badge(sev, i.severity), el("span", {}, i.detector), el("span", {}, targets(i.targets)),
           el("small", {}, i.state + " \u00B7 opened " + clock(i.opened_at))),
        i.summary ? el("p", { class: "summary" }, i.summary) : null,
        el("p", { class: "muted" }, "id " + i.id + (i.playbook ? " \u00B7 playbook " + i.playbook : " \u00B7 no playbook")),
        i.steps.length ? el("ol", { class: "steps" }, i.steps.map(stepLine)) : null));
    }
    if (inc.recent.length) {
      out.push(el("h3", {}, "Recently resolved"));
      out.push(el("ul", { class: "plain" }, inc.recent.map((r) => el("li", {}, badge("ok", "resolved"), " " + r.detector + " " +
        targets(r.targets) + " \u00B7 " + duration(r.duration_seconds) + " \u00B7 " + clock(r.resolved_at)))));
    }
    replace("incidents", out);
  }

  // A drill's banner on every page while it runs: its leak (or fault) is synthetic, nobody should run for a bucket.
  function drillBanner(s) {
    const d = s.drill;
    document.getElementById("drill-banner").hidden = !(d && d.active);
    replace("drill-banner", d && d.active ? [badge("warn", "DRILL"), " fault drill ", el("strong", {}, d.name),
      " running since " + clock(d.started_at) + ": " + d.scenario + " on " + d.nodes.join(", ") +
      ". Its readings are synthetic (labelled drill=\"true\"); its incident and journal rows say drill."] : []);
  }

  function drillSection(s) {
    const d = s.drill;
    if (!d) {
      replace("drill", el("p", { class: "muted" }, "no drill since this agent started (supernode-agent drill PLAN)"));
      return;
    }
    const kind = d.active ? "warn" : d.state === "passed" ? "ok" : "bad";
    const out = [el("p", { class: "row", "data-drill-state": d.state }, badge(kind, d.state), " " + d.name + " \u00B7 " +
      d.scenario + " \u00B7 nodes " + d.nodes.join(", ") + " \u00B7 started " + clock(d.started_at) + (d.by ? " by " + d.by : ""))];
    const r = d.report;
    if (d.conductor && d.conductor !== s.agent.node) {
      // a zone's drill: this agent drained its own node; the report is on the page of the agent that started it
      out.push(el("p", { class: "muted" }, "this node's part of a drill started on " + d.conductor +
        "'s agent: the report is on its page"));
    } else if (!r) {
      out.push(s.incidents ? el("p", { class: "muted" }, "no report yet") : locked());
    } else {
      out.push(table(["stage", "from injection", "target", "journal rows", "result"], r.stages.map((x) =>
        el("tr", { "data-stage": x.stage }, td("stage", x.stage), td("from injection", fmt(x.seconds, "s")),
          td("target", fmt(x.target, "s", 0)), td("journal rows", x.journal.join(", ") || "\u2013"),
          td("result", badge(x.result === "PASS" ? "ok" : "bad", x.result), x.why ? " " + x.why : "")))));
      const parts = Object.entries(r.per_node || {});
      if (parts.length > 1) {  // a zone's drill: each node's own agent drained it; the stage above is the slowest
        const names = Object.keys(parts[0][1].stages);
        out.push(table(["node", "incident", ...names], parts.map(([node, p]) => el("tr", { "data-node": node },
          td("node", node), td("incident", p.incident || "\u2013"), ...names.map((n) => td(n,
            p.stages[n].seconds === null ? badge("bad", "no") : fmt(p.stages[n].seconds, "s"),
            p.stages[n].why ? " " + p.stages[n].why : ""))))));
      }
      out.push(el("p", { class: "muted" }, "dry-run (journaled, not done): " +
        (r.dry_run.map((x) => x.action + " " + x.target + (x.node ? " on " + x.node : "")).join(", ") || "nothing")));
    }
    replace("drill", out);
  }

  const SYM = { ok: "\u00B7", down: "\u2715", errors: "!", ber: "B", unknown: "?" };  // an NVLink cell's symbol

  function linkCells(states) {
    const counts = {};
    for (const st of states) counts[st] = (counts[st] || 0) + 1;
    const summary = Object.entries(counts).map(([k, v]) => v + " " + (k === "ok" ? "up" : k)).join(", ");
    return el("span", { class: "links", role: "img", "aria-label": "NVLink: " + summary, title: "NVLink: " + summary },
      states.map((st, i) => el("span", { class: "cell " + st, title: "link " + i + ": " + st }, SYM[st] || "?")));
  }

  // The GPU fault judge's word: last XID with NVIDIA's catalogue text, the recovery recommended and taken.
  function faultLine(f) {
    if (!f) return null;
    const parts = [];
    if (f.xid !== null && f.xid !== undefined) {
      parts.push(el("span", { title: f.description || "" }, "XID " + f.xid + (f.mnemonic ? " " + f.mnemonic : "")));
    }
    if (f.recommended && f.recommended !== "none") {
      parts.push(" \u00B7 ", badge(f.recommended === "app" ? "warn" : "bad", "recommended: " + f.recommended,
        f.rule ? "rule: " + f.rule : ""));
    }
    if (f.taken) parts.push(" \u00B7 ", el("span", { title: f.taken_why || "" }, "taken: " + f.taken));
    return el("div", { class: "row fault", "data-fault": f.recommended || "none" }, parts);
  }

  function gpuRows(card, dim) {
    return card.gpus.map((g) => {
      const marks = g.marks.map((m) => badge(m === "lost" || m === "hung" || m === "missing" || /critical/.test(m) ? "bad" : "warn", m));
      const hot = g.temperature_celsius !== null && g.slowdown_celsius !== null && g.temperature_celsius >= g.slowdown_celsius - 3;
      return el("tr", { "data-gpu": card.name + "/" + g.index, class: dim ? "muted" : null },
        td("GPU", el("strong", {}, "GPU " + g.index), g.name ? el("small", {}, " " + g.name) : null,
           marks.length ? el("div", { class: "row" }, marks) : null, faultLine(g.fault)),
        td("temperature", fmt(g.temperature_celsius, "\u00B0C", 0), hot ? [" ", badge("warn", "near slowdown")] : null,
           g.slowdown_celsius !== null ? el("small", {}, " (slowdown " + fmt(g.slowdown_celsius, "", 0) + ")") : null),
        td("power", fmt(g.power_watts, "", 0) + " / " + fmt(g.limit_watts, "W", 0), bar(g.power_watts, g.limit_watts),
           g.capped ? [" ", badge("warn", "capped", "limit " + g.limit_watts + " W of " + g.default_limit_watts + " W")] : null),
        td("cold plate", plateCell(g)),
        td("NVLink", g.nvlink.length ? linkCells(g.nvlink) : el("span", { class: "muted" }, "no links reported")));
    });
  }

  // The cold plate's thermal resistance (K/W) against its learnt baseline (agent/derived_thermal.py); when it is
  // not computed, why (below the load gate, no coolant supply reading...), never a blank that reads as fine.
  function plateCell(g) {
    const r = g.thermal_resistance, b = g.thermal_resistance_baseline;
    if (r === null || r === undefined) {
      const why = g.thermal_resistance_unavailable;
      return el("span", { class: "muted", "data-plate": why || "unknown", title: why ? null : "not computed yet" },
        why ? why.replace(/_/g, " ") : "\u2013");
    }
    const over = g.thermal_resistance_over_baseline;
    return el("span", { "data-plate": g.thermal_resistance_degraded ? "over" : "ok" }, fmt(r, "K/W", 3),
      b ? el("small", {}, " (baseline " + fmt(b, "", 3) + ")") : el("small", {}, " (baseline learning)"),
      g.thermal_resistance_degraded ? [" ", badge("warn", "+" + (over * 100).toFixed(0) + " % over baseline")] : null);
  }

  // The NVLink domain as one matrix: a row per compute tray, a column per NVLink index = NVSwitch chip (GB200
  // NVL72), each cell the worst state of that link over the tray's GPUs (agent/status/view.py nvlink_domain).
  // A column of red is one switch chip; a row is one tray.
  function nvlinkSection(s) {
    const d = s.nvlink_domain;
    if (!d || !d.chips.length) {
      replace("nvlink", el("p", { class: "muted" }, "no NVLink reported by this node or its peers"));
      return;
    }
    const head = [];
    if (d.switch_trays.length) {  // a header row of switch trays over their chips
      const groups = [];
      for (const c of d.chips) {
        const last = groups[groups.length - 1];
        if (last && last.name === c.switch_tray) last.span += 1;
        else groups.push({ name: c.switch_tray, span: 1 });
      }
      head.push(el("tr", {}, el("th", { scope: "col" }, "switch tray"),
        groups.map((g) => el("th", { scope: "col", colspan: g.span, "data-switch-tray": g.name }, g.name || "\u2013"))));
    }
    head.push(el("tr", {}, el("th", { scope: "col" }, "tray \\ chip"),
      d.chips.map((c) => el("th", { scope: "col", "data-chip": c.index,
        title: "NVSwitch chip " + c.index + (c.switch_tray ? " (" + c.switch_tray + ")" : "") + ": NVLink " + c.index + " of every GPU" },
        String(c.index)))));
    const rows = d.rows.map((r) => el("tr", { "data-tray": r.node, class: r.reach === "unreachable" ? "muted" : null },
      el("th", { scope: "row" }, r.node),
      r.cells.map((st, k) => el("td", { class: "cell " + st, "data-cell": r.node + "/" + k,
        title: r.node + ", chip " + k + (d.chips[k].switch_tray ? " (" + d.chips[k].switch_tray + ")" : "") + ": " + st },
        SYM[st] || "?"))));
    const notes = d.chips.map((c, k) => {
      const bad = d.rows.filter((r) => r.cells[k] !== "ok" && r.cells[k] !== "unknown");
      if (bad.length < 2) return null;
      return el("li", { "data-column": c.index }, "chip " + c.index + (c.switch_tray ? " (" + c.switch_tray + ")" : "") +
        ": failing on " + bad.length + " of " + d.rows.length + " trays (" + bad.map((r) => r.node).join(", ") +
        ") \u2014 a column points at the switch chip, not the trays");
    }).filter((x) => x);
    // The rack's own verdict (agent/coordination/attribution.py), where this agent attributes: which switch chips,
    // and so which switch trays, to service; no compute tray is drained for them.
    const a = d.attribution;
    const verdict = !a ? null : el("p", { "data-verdict": a.switch_side.length ? "switch" : "none" },
      a.switch_side.length
        ? [badge("bad", "domain degraded"), " the rack attributes " + a.switch_side.map((c) => "chip " + c.chip +
            (c.switch_tray ? " (switch tray " + c.switch_tray + ")" : "")).join(", ") +
            " to its NVSwitch: service " + (a.switch_side.some((c) => c.switch_tray) ? "that switch tray" : "that switch chip") +
            "; the fabric routes over the other chips, no compute tray is drained for it" +
            (a.tray_side_links ? "; " + a.tray_side_links + " tray-side link(s) failing" : "")]
        : "no switch-side fault attributed" + (a.tray_side_links ? "; " + a.tray_side_links + " tray-side link(s) failing" : ""));
    replace("nvlink", verdict, el("div", { class: "matrix-wrap" }, el("table", { class: "matrix", "aria-label": "NVLink domain: trays by switch chips" },
      el("thead", {}, head), el("tbody", {}, rows))), notes.length ? el("ul", { class: "plain" }, notes) : null);
  }

  // One line on how the rack's agents share their devices and who drives the shared valves and outlets.
  function coordinationLine(c) {
    if (!c) return null;
    const parts = [el("strong", {}, "coordination " + c.backend)];
    if (c.state === "degraded") {
      parts.push(" ", badge("bad", "DOWN (degraded)"), " this agent drains and caps its own node only, reads the leak " +
        "inputs itself and queues shared steps for a person; nobody leads" + (c.why ? " \u2014 " + c.why : ""));
    } else {
      parts.push(" ", badge("ok", c.backend === "static" ? "up (from the config, no failover)" : "up"),
        " leader " + (c.leader || "none yet") + (c.this_agent_leads ? " (this agent)" : ""));
      if (c.members) parts.push(" \u00B7 " + c.members.length + " agent(s) alive");
    }
    if (c.polls_here.length || c.polled_elsewhere.length) {
      parts.push(" \u00B7 shared devices polled here: " + (c.polls_here.join(", ") || "none"));
    }
    return el("p", { class: "row", id: "coordination", "data-state": c.state }, parts);
  }

  function rackSection(s) {
    const cards = s.nodes.map((n) => {
      let head;
      if (n.reach === "self") head = badge("ok", "this agent");
      else if (n.reach === "peer") head = badge("ok", "from its agent, " + age(n.age_seconds));
      else if (n.reach === "unreachable") head = badge("bad", "not reachable from here: " + n.why);
      else if (n.reach === "waiting") head = badge("unknown", "asking its agent");
      else head = badge("unknown", "not reachable from here: " + n.why);
      const card = n.card;
      const body = [];
      if (card) {
        const failing = card.sources_failing || [];
        const counts = card.incidents_open || {};
        body.push(el("p", { class: "row muted" }, "mode " + (card.agent.mode || "?") + " \u00B7 " + card.gpus.length + " GPUs" +
          (card.expected_gpus ? " (inventory: " + card.expected_gpus + ")" : ""),
          counts.critical ? badge("bad", counts.critical + " critical incident(s)") : null,
          counts.warning ? badge("warn", counts.warning + " warning incident(s)") : null,
          failing.length ? badge("warn", "failing: " + failing.join(", ")) : null));
        if (n.reach === "unreachable") body.push(el("p", { class: "muted" }, "last answer " + age(n.age_seconds) + ", shown dimmed"));
        body.push(table(["GPU", "temp", "power / limit", "cold plate R", "NVLink"], gpuRows(card, n.reach === "unreachable")));
      }
      const cls = n.reach === "unreachable" ? "card warn" : "card";
      return el("div", { class: cls, "data-node": n.name }, el("h3", {}, el("span", {}, n.name), head), body);
    });
    replace("rack", coordinationLine(s.coordination), el("div", { class: "grid" }, cards));
  }

  function zoneLine(z) {
    const kind = z.state === "wet" || z.state === "unknown" ? "bad" : z.state === "fault" ? "warn" : "ok";
    const word = { wet: "WET", dry: "dry", fault: "sensor fault", unknown: "unknown" }[z.state] || z.state;
    const sensors = z.sensors.map((x) => x.sensor + " " + x.state + (x.faults.length ? " (" + x.faults.join(", ") + ")" : ""));
    let valve = null;
    if (z.valve) {
      const vk = z.valve.state === "closed" ? "warn" : z.valve.state === "open" ? "ok" : "unknown";
      valve = el("span", { "data-valve": z.valve.ref }, " \u00B7 valve " + z.valve.ref + " ", badge(vk, z.valve.state));
    }
    return el("li", { "data-zone": z.name, "data-state": z.state }, el("strong", {}, z.name), " ", badge(kind, word),
      " \u00B7 nodes " + (z.nodes.join(", ") || "none listed"), valve,
      el("div", { class: "muted" }, sensors.length ? "sensors: " + sensors.join("; ") : "no sensor reading"));
  }

  function coolantSection(s) {
    const c = s.coolant;
    const cdus = c.cdus.map((d) => {
      const pumps = d.pumps.map((p) => el("div", {}, "pump " + p.pump + " ",
        p.running === null ? badge("unknown", "?") : p.running ? badge("ok", "running") : badge("bad", "stopped"),
        p.speed_ratio !== null ? " " + Math.round(p.speed_ratio * 100) + " %" : ""));
      const dT = d.supply_celsius !== null && d.return_celsius !== null ? d.return_celsius - d.supply_celsius : null;
      const margin = d.dew_point_margin_celsius;
      return el("div", { class: "card", "data-cdu": d.name },
        el("h3", {}, el("span", {}, d.name), el("small", {}, d.model),
           d.reporting ? null : badge("bad", "no fresh reading")),
        el("dl", { class: "kv" },
          el("dt", {}, "supply / return"), el("dd", {}, fmt(d.supply_celsius, "\u00B0C") + " / " + fmt(d.return_celsius, "\u00B0C") +
            (dT !== null ? " (\u0394T " + fmt(dT, "K") + ")" : "")),
          el("dt", {}, "flow"), el("dd", {}, fmt(d.flow_lpm, "L/min")),
          el("dt", {}, "dew-point margin"), el("dd", {}, fmt(margin, "K"),
            margin !== null && margin < 3 ? [" ", badge("warn", "condensation risk")] : null),
          d.heat_removed_watts !== null ? [el("dt", {}, "heat removed"), el("dd", {}, fmt(d.heat_removed_watts / 1000, "kW"))] : null,
          d.valve_position_ratio !== null ? [el("dt", {}, "valve position"), el("dd", {}, Math.round(d.valve_position_ratio * 100) + " %")] : null,
          el("dt", {}, "pumps"), el("dd", {}, pumps.length ? pumps : "none reported"),
          el("dt", {}, "alarms"), el("dd", {}, d.alarms.length ? d.alarms.map((a) => badge("bad", a))
            : d.reporting ? badge("ok", "none") : badge("unknown", "not read"))));
    });
    replace("coolant", el("h3", {}, "Leak zones"),
      c.zones.length ? el("ul", { class: "plain", id: "zones" }, c.zones.map(zoneLine)) : el("p", { class: "muted" }, "no leak zone in the inventory"),
      el("h3", {}, "CDUs"), cdus.length ? el("div", { class: "grid" }, cdus) : el("p", { class: "muted" }, "no CDU in the inventory"));
  }

  function outletBadges(d) {
    // "all on" only when every watched outlet was read on: one not read is not known to be on
    const out = d.outlets_off.map((o) => badge("bad", "outlet " + o.outlet + " OFF (feeds " + o.feeds + ")"))
      .concat((d.outlets_unread || []).map((o) => badge("unknown", "outlet " + o.outlet + " not read (feeds " + o.feeds + ")")));
    return out.length ? out : badge("ok", d.outlets_watched + " outlets feeding nodes: all on");
  }

  function powerSection(s) {
    const p = s.power;
    const out = [];
    if (p.rack_watts !== null) {
      const over = p.budget_watts && p.rack_watts > p.budget_watts;
      out.push(el("p", { class: "row", id: "rack-power" }, "rack " + fmt(p.rack_watts / 1000, "kW", 2) +
        (p.budget_watts ? " of " + fmt(p.budget_watts / 1000, "kW", 1) + " budget (" + Math.round(100 * p.rack_watts / p.budget_watts) + " %)" : ""),
        bar(p.rack_watts, p.budget_watts), over ? badge("bad", "over budget") : p.budget_watts ? badge("ok", "within budget") : null));
    } else out.push(el("p", { class: "muted" }, "rack power: no fresh PDU reading"));
    for (const d of p.pdus) {
      const rows = d.phases.map((ph) => el("tr", {}, td("phase", "inlet " + ph.inlet + " phase " + ph.phase),
        td("current", fmt(ph.current_amperes, "A", 1) + (ph.limit_amperes ? " / " + fmt(ph.limit_amperes, "A", 0) : ""),
           bar(ph.current_amperes, ph.limit_amperes)),
        td("power", fmt(ph.power_watts, "W", 0))));
      out.push(el("div", { class: "card", "data-pdu": d.name }, el("h3", {}, el("span", {}, d.name), el("small", {}, d.model),
        d.inlet_watts !== null ? el("small", {}, fmt(d.inlet_watts / 1000, "kW", 2)) : badge("bad", "no fresh reading")),
        rows.length ? table(["phase", "current / limit", "power"], rows) : null,
        el("p", {}, outletBadges(d))));
    }
    replace("power", out);
  }

  function linksSection(s) {
    const rows = [];
    for (const n of s.nodes) {
      if (!n.card) continue;
      for (const port of n.card.ports) {
        const kind = port.state === "down" ? "bad" : port.state === "ok" ? "ok" : port.state === "unknown" ? "unknown" : "warn";
        const word = { ok: "up", down: "DOWN", optic_low: "optic below threshold", flapping: "flapping", unknown: "unknown" }[port.state];
        rows.push(el("tr", { "data-port": n.name + "/" + port.port }, td("node", n.name), td("port", port.port + " (" + port.kind + ")"),
          td("state", badge(kind, word)),
          td("optic rx", port.rx_min_dbm !== null ? fmt(port.rx_min_dbm, "dBm", 2) + (port.rx_low_warning_dbm !== null
            ? " (warning below " + fmt(port.rx_low_warning_dbm, "dBm", 2) + ")" : "") : "\u2013")));
      }
    }
    replace("links", rows.length ? table(["node", "port", "state", "optic rx (weakest lane)"], rows)
      : el("p", { class: "muted" }, "no port reported"));
  }

  function sourcesSection(s) {
    const rows = s.sources.map((x) => {
      const kind = { up: "ok", failing: "bad", stale: "warn", waiting: "unknown", idle: "unknown" }[x.state];
      return el("tr", { "data-source": x.source + "/" + x.device, "data-state": x.state }, td("source", x.source + "/" + x.device),
        td("state", badge(kind, x.state)), td("last success", age(x.age_seconds)),
        td("why", x.why || el("span", { class: "muted" }, "\u2013")));
    });
    replace("sources", table(["source", "state", "last success", "why"], rows));
  }

  function reliabilitySection(s) {
    const r = s.reliability;
    if (!r) {
      replace("reliability", el("p", { class: "muted" }, s.incidents ? "not available (the journal could not be read)"
        : "needs the admin token, as incidents do"));
      return;
    }
    const rows = r.classes.map((c) => el("tr", { "data-class": c.class }, td("class", c.class),
      td("components", c.components === null ? "?" : c.components), td("failures", c.failures),
      td("MTBF", c.mtbf_seconds !== null ? duration(c.mtbf_seconds)
        : c.observed_seconds !== null && c.components ? "> " + duration(c.observed_seconds) : "\u2013"),
      td("MTTR", duration(c.mttr_seconds))));
    const worst = r.worst.map((o) => el("li", {}, el("strong", {}, o.component), " (" + o.class + "): " + o.failures +
      " failure(s), down " + duration(o.down_seconds) + (o.open ? ", still open" : "")));
    replace("reliability", el("p", { class: "muted" }, "watched " + duration(r.watched_seconds) + " in " + r.runs +
      " run(s). MTBF = component-time / failures; MTTR = mean time from a failure's incident to its resolution."),
      table(["class", "components", "failures", "MTBF", "MTTR"], rows),
      el("h3", {}, "Worst offenders"), worst.length ? el("ul", { class: "plain" }, worst) : el("p", { class: "muted" }, "no component failed"));
  }

  // What each section is drawn from: a section is drawn again only when that changed, so a button under the
  // pointer (Approve) is not replaced between the press and the release by an update that changed nothing there.
  const SECTIONS = [
    ["attention", attention, (s) => [s.coolant.zones, s.incidents && [s.incidents.pending_approvals.length,
      s.incidents.open.map((i) => i.severity), s.incidents.breaker_open], s.nodes.map((n) => [n.reach,
      n.card && n.card.gpus.map((g) => [g.capped, g.marks])]), s.sources.map((x) => x.state), s.remediation_degraded,
      s.coordination && s.coordination.state]],
    ["approvals", approvalsSection, (s) => [s.incidents && s.incidents.pending_approvals, access && access.locked]],
    ["incidents", incidentsSection, (s) => [s.incidents && [s.incidents.open, s.incidents.recent.map((r) => r.id),
      s.incidents.mode, s.incidents.breaker_open, s.incidents.maintenance], access && access.locked]],
    ["drill-banner", drillBanner, (s) => s.drill && [s.drill.active, s.drill.name, s.drill.started_at]],
    ["drill", drillSection, (s) => [s.drill, access && access.locked]],
    ["coolant", coolantSection, (s) => s.coolant],
    ["rack", rackSection, (s) => [s.coordination, s.nodes.map((n) => [n.name, n.reach, n.why, n.card && [n.card.gpus,
      n.card.agent, n.card.incidents_open, n.card.sources_failing, n.card.expected_gpus], n.age_seconds !== undefined &&
      n.age_seconds !== null && Math.round(n.age_seconds)])]],
    ["nvlink", nvlinkSection, (s) => s.nvlink_domain],
    ["power", powerSection, (s) => s.power],
    ["links", linksSection, (s) => s.nodes.map((n) => n.card && n.card.ports)],
    ["sources", sourcesSection, (s) => s.sources.map((x) => [x.source, x.device, x.state, x.why, Math.round(x.age_seconds || 0)])],
    ["reliability", reliabilitySection, (s) => [s.reliability, !!s.incidents]],
  ];
  const drawn = {};
  function skipDurations(k, v) { return k === "duration_seconds" ? undefined : v; }

  function render() {
    if (!state) return;
    const s = state;
    document.getElementById("title").textContent = "Rack " + s.agent.rack + " \u00B7 " + s.agent.node + " agent \u00B7 mode " + s.agent.mode;
    for (const [name, fn, input] of SECTIONS) {
      try {
        const key = JSON.stringify(input(s), skipDurations);
        if (drawn[name] === key) continue;
        drawn[name] = key;
        fn(s);
      } catch (e) {
        drawn[name] = null;
        replace(name, el("p", {}, badge("bad", "could not draw this section: " + e.message)));
      }
    }
  }

  // -- connection state ---------------------------------------------------------------------------

  function showConnection() {
    const conn = document.getElementById("conn");
    const main = document.getElementById("main");
    if (live) {
      conn.replaceChildren(badge("ok", "live"), " updated " + new Date(lastState).toLocaleTimeString());
      main.classList.remove("stale");
      document.title = "supernode-agent status";
    } else {
      const since = lostAt ? " since " + new Date(lostAt).toLocaleTimeString() : "";
      conn.replaceChildren(badge("bad", "STALE" + since), " \u2014 no live data from the agent; reconnecting (attempt " + attempt + ")\u2026",
        state ? " What you see was true at " + new Date(lastState).toLocaleTimeString() + "." : "");
      conn.setAttribute("data-stale", "1");
      main.classList.add("stale");
      document.title = "STALE \u2014 supernode-agent status";
    }
    if (live) conn.removeAttribute("data-stale");
  }
  function goStale() {
    if (live || lostAt === null) lostAt = Date.now();
    live = false;
    showConnection();
  }

  function handleEvent(block) {
    let event = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).trim());
    }
    if (!data.length) return;
    const payload = JSON.parse(data.join("\n"));
    if (event === "hello") { access = payload; tokenNote(); }
    else if (event === "state") {
      state = payload;
      lastState = Date.now();
      live = true;
      lostAt = null;
      attempt = 0;
      render();
      showConnection();
    }
  }

  async function readStream() {
    controller = new AbortController();
    switching = false;
    const headers = { Accept: "text/event-stream" };
    if (token) headers.Authorization = "Bearer " + token;
    const resp = await fetch("api/v1/status/stream", { headers, signal: controller.signal, cache: "no-store" });
    if (resp.status === 401 && token) {
      token = "";
      sessionStorage.removeItem(TOKEN_KEY);
      document.getElementById("token-note").textContent = "That token was refused (401): incidents stay locked.";
      return;
    }
    if (!resp.ok || !resp.body) throw new Error("the agent answered HTTP " + resp.status);
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    lastByte = Date.now();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new Error("the agent closed the stream");
      lastByte = Date.now();
      buffer += decoder.decode(value, { stream: true });
      let i;
      while ((i = buffer.indexOf("\n\n")) >= 0) {
        handleEvent(buffer.slice(0, i));
        buffer = buffer.slice(i + 2);
      }
    }
  }

  async function run() {
    for (;;) {
      try {
        await readStream();
      } catch (e) {
        if (!switching) goStale();
      }
      if (switching) {
        switching = false;
        continue;
      }
      attempt += 1;
      showConnection();
      await new Promise((ok) => setTimeout(ok, Math.min(5000, 250 * 2 ** Math.min(attempt, 5))));
    }
  }

  function reconnect() {  // a new token: start the stream again with it
    switching = true;
    if (controller) controller.abort();
  }

  setInterval(() => {  // a stream that stops sending (a dead peer, a cut network) is stale, then reopened
    if (live && Date.now() - lastByte > STALE_AFTER_MS) {
      goStale();
      if (controller) controller.abort();
    }
  }, 1000);

  // -- the token and the approve dialog -----------------------------------------------------------

  function tokenNote() {
    const note = document.getElementById("token-note");
    if (access && access.incidents) note.textContent = "Incidents visible" + (access.who ? " (as " + access.who + ")" : "") + ".";
    else if (access && access.locked) note.textContent = access.locked + ".";
  }

  document.getElementById("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = document.getElementById("token");
    token = input.value.trim();
    input.value = "";
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
    reconnect();
  });
  document.getElementById("token-forget").addEventListener("click", () => {
    token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    reconnect();
  });

  let approving = null;
  function openApprove(p) {
    approving = p;
    document.getElementById("approve-what").textContent = p.action + " on " + p.target + (p.phase === "undo" ? " (undo)" : "") +
      " \u2014 " + p.approval + ", incident " + p.incident_id + ".";
    document.getElementById("approve-result").textContent = "";
    const input = document.getElementById("approve-token");
    input.value = token;
    document.getElementById("approve-dialog").hidden = false;
    input.focus();
  }
  function closeApprove() {
    approving = null;
    document.getElementById("approve-token").value = "";
    document.getElementById("approve-dialog").hidden = true;
  }
  document.getElementById("approve-cancel").addEventListener("click", closeApprove);
  document.getElementById("approve-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (!approving) return;
    const result = document.getElementById("approve-result");
    const given = document.getElementById("approve-token").value.trim();
    const headers = {};
    if (given) headers.Authorization = "Bearer " + given;
    result.textContent = "asking the agent\u2026";
    try {
      const resp = await fetch("api/v1/incidents/" + encodeURIComponent(approving.id) + "/approve",
                               { method: "POST", headers, cache: "no-store" });
      let body = {};
      try { body = await resp.json(); } catch (e) { body = {}; }
      if (resp.ok) {
        result.replaceChildren(badge("ok", "approved by " + (body.by || "?")));
        approving = null;
        setTimeout(closeApprove, 1500);
      } else {
        result.replaceChildren(badge("bad", "refused (" + resp.status + "): " + (body.error || resp.statusText)));
      }
    } catch (e) {
      result.replaceChildren(badge("bad", "the agent did not answer: " + e.message));
    }
  });
  document.addEventListener("keydown", (ev) => { if (ev.key === "Escape") closeApprove(); });

  showConnection();
  run();
})();
