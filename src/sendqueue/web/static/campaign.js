/* The campaign page: live rows, counts, chart and actions.
 *
 * Live by default: an EventSource on /api/campaigns/{id}/events patches rows as changes arrive
 * and schedules a (throttled) refetch of the counts and the visible page. While the campaign
 * has Pending or Running emails the page also refetches in the background: every 30 s while
 * the stream is live (SENDQUEUE_UI_REFETCH_INTERVAL; a change the stream missed shows within
 * that), every 5 s (SENDQUEUE_UI_POLL_INTERVAL) while it is delayed or down. The server says
 * "delayed" in a `status` event when its change-log reader fails or falls behind the store;
 * a ping only proves the connection, never that changes still arrive. When the stream errors,
 * or is silent for longer than the heartbeat allows, the page keeps trying to reopen it with
 * backoff. The indicator (#connection[data-connection]) says which: connecting, live,
 * delayed, polling (the stream is down) or idle (down, and nothing in flight to poll).
 */
(function () {
  "use strict";

  const sq = window.sq;
  const root = document.getElementById("campaign");
  if (!root || !sq) {
    return;
  }

  const STALE_MS = 20000; // the server pings every 15 s (docs/api.md)
  const BACKOFF_MIN_MS = 1000;
  const BACKOFF_MAX_MS = 10000;
  const REFRESH_GAP_MS = 1000; // at most one refetch a second while events pour in
  const REFRESH_DELAY_MS = 150; // let a burst of events settle first

  // Which controls each campaign state offers; pages.py (_ACTIONS) keeps the same table.
  const ACTIONS = {
    provision: ["draft"],
    pause: ["active"],
    resume: ["paused"],
    "retry-failed": ["active", "paused", "completed"],
    cancel: ["draft", "provisioning", "active", "paused"],
  };
  const CONFIRM = {
    cancel: ["Cancel this campaign? Every email not sent yet is cancelled. This cannot be undone.",
      "Cancel campaign"],
  };

  const id = root.dataset.campaignId;
  const base = "/api/campaigns/" + encodeURIComponent(id);
  const tbody = document.getElementById("tasks");
  const indicator = document.getElementById("connection");
  const pageSize = Number(root.dataset.pageSize) || 50;
  // the background refetch while live, and the polling while the stream is delayed or down
  const REFETCH_MS = Number(root.dataset.refetchMs) || 30000;
  const POLL_MS = Number(root.dataset.pollMs) || 5000;

  const params = new URLSearchParams(location.search);
  const view = {
    state: document.getElementById("filter-state").value,
    search: document.getElementById("filter-search").value,
    after: root.dataset.cursor || "-1",
    next: root.dataset.nextCursor || null,
    stack: [],
  };
  let timeZone = root.dataset.timezone || "UTC";
  let campaignState = root.dataset.state;
  let counts = {};
  for (const node of document.querySelectorAll("[data-count]")) {
    counts[node.dataset.count] = Number(node.textContent) || 0;
  }

  // -- rendering ------------------------------------------------------------------------------
  // The rows are task_row.html's markup; task_rows.py (task_row) writes the same texts.
  const localTime = document.getElementById("tasks-table").dataset.localTime === "true";
  // a sequence: rows carry a Step cell
  const steps = document.getElementById("tasks-table").dataset.steps === "true";

  /** The texts of a task's fields, as the server renders them. */
  function taskCells(task) {
    // a local-time campaign: the zone this email's windows are read in
    const ownZone = localTime ? task.timezone || timeZone : null;
    return {
      position: String(task.position + 1),
      step: String(task.step || 1),
      email: task.email,
      name: task.name || "",
      subject: task.subject || "",
      // who it goes out from, "Name <address>": its sender, or the campaign's From
      sender: task.sender_name ? task.sender_name + " <" + task.sender + ">" : task.sender || "",
      // a paused campaign's Pending emails have no send time until it resumes
      send_at: task.paused ? "paused" : sq.formatTime(task.send_at, timeZone),
      local: task.paused || !ownZone ? "" : sq.formatZoneTime(task.send_at, ownZone),
      // sent more than a minute after its send time: marked late
      sent_at: task.sent_at ? sq.formatTime(task.sent_at, timeZone) + (task.late ? " (late)" : "") : "",
      // what happened after sending: "bounced: 5.1.1 smtp; 550 user unknown"
      outcome: (task.outcome || "") + (task.outcome && task.outcome_detail ? ": " + task.outcome_detail : ""),
      moved: movedText(task.moves, task.moved_reason),
      // why it failed, or why it was cancelled ("suppressed: bounced")
      error: task.error || task.reason || "",
    };
  }

  // as task_rows.py's moved_text: "1 move: worker down 16:50-17:48 UTC"
  function movedText(moves, reason) {
    if (!moves) {
      return "";
    }
    return sq.plural(moves, "move") + (reason ? ": " + reason : "");
  }

  // fields holding a time: its date and clock never wrap apart (task_row.html, clock)
  const CLOCKS = ["send_at", "local", "sent_at"];

  /** Set a field's text; the line that holds it shows only while it has some. */
  function setField(tr, field, text) {
    const node = tr.querySelector('[data-field="' + field + '"]');
    if (!node) {
      return;
    }
    if (CLOCKS.includes(field)) {
      if (node.textContent !== text || !node.querySelector(".nowrap")) {
        node.replaceChildren(sq.el("span", { class: "nowrap" }, text.slice(0, 16)), text.slice(16));
      }
    } else {
      sq.setText(node, text);
    }
    const line = node.closest(".line");
    if (line && field !== "email" && field !== "send_at") {
      line.hidden = !text;
    }
  }

  function cancelButton(taskId, email) {
    return sq.el("button", {
      type: "button", class: "button small danger", "data-cancel-task": taskId,
      "aria-label": "Cancel the email to " + email,
    }, "Cancel");
  }

  function setRowState(tr, state) {
    if (tr.dataset.state === state) {
      return;
    }
    tr.dataset.state = state;
    const cell = tr.querySelector('[data-field="state"]');
    cell.replaceChildren(sq.badge(state));
    const actions = tr.querySelector('[data-field="actions"]');
    const button = actions.querySelector("[data-cancel-task]");
    if (state === "Pending" && !button) {
      const email = tr.querySelector('[data-field="email"]').textContent;
      actions.append(cancelButton(tr.dataset.taskId, email));
    } else if (state !== "Pending" && button) {
      if (document.activeElement === button) {
        // the control is gone with the state it served: the row's details link keeps the focus
        actions.querySelector("[data-details]").focus();
      }
      button.remove();
    }
  }

  /** An empty row in task_row.html's markup, for a task the page did not render. */
  function newRow(task) {
    const line = (attrs, ...children) => sq.el("span", Object.assign({ class: "line" }, attrs), ...children);
    const url = "/campaigns/" + encodeURIComponent(id) + "/emails/" + encodeURIComponent(task.id);
    return sq.el("tr", { "data-task-id": task.id },
      sq.el("td", { class: "num pos", "data-label": "#", "data-field": "position" }),
      steps ? sq.el("td", { class: "num", "data-label": "Step", "data-field": "step" }) : null,
      sq.el("td", { class: "card-title", "data-label": "Recipient" },
        line({ class: "line strong", "data-field": "name", hidden: true }),
        line({ class: "line mono address", "data-field": "email" })),
      sq.el("td", { "data-label": "Subject" },
        line({ "data-field": "subject" }),
        line({ class: "line muted", hidden: true }, "from ",
          sq.el("span", { class: "address", "data-field": "sender" }))),
      sq.el("td", { "data-label": "State" },
        line({ "data-field": "state" }),
        line({ "data-field": "outcome", "data-outcome": "", hidden: true }),
        line({ class: "line error-text", "data-field": "error", hidden: true }),
        line({ class: "line muted", "data-field": "moved", hidden: true })),
      sq.el("td", { "data-label": "Send time" },
        line({}, sq.el("time", { "data-field": "send_at", datetime: "" })),
        line({ class: "line muted", hidden: true }, "recipient's time ",
          sq.el("span", { "data-field": "local" })),
        line({ hidden: true }, "sent ", sq.el("time", { "data-field": "sent_at", datetime: "" }))),
      sq.el("td", { class: "row-actions", "data-field": "actions" },
        sq.el("a", {
          class: "button small", href: url, "data-details": true,
          "aria-label": "Details of the email to " + task.email,
        }, "Details")));
  }

  function updateRow(tr, task) {
    const cells = taskCells(task);
    for (const [field, text] of Object.entries(cells)) {
      setField(tr, field, text);
    }
    tr.querySelector('[data-field="send_at"]').setAttribute("datetime", task.paused ? "" : task.send_at || "");
    tr.querySelector('[data-field="sent_at"]').setAttribute("datetime", task.sent_at || "");
    const moved = tr.querySelector('[data-field="moved"]');
    if (task.planned_at) {
      moved.setAttribute("title", "first planned " + sq.formatTime(task.planned_at, timeZone));
    } else {
      moved.removeAttribute("title");
    }
    setRowState(tr, task.state);
    setOutcomeData(tr, task.outcome, task.outcome_at);
  }

  /** The row's outcome as data (and a tooltip with its time); the text is the caller's. */
  function setOutcomeData(tr, outcome, at) {
    const cell = tr.querySelector('[data-field="outcome"]');
    cell.dataset.outcome = outcome || "";
    if (at) {
      cell.setAttribute("title", "since " + sq.formatTime(at, timeZone));
    } else {
      cell.removeAttribute("title");
    }
  }

  function rowById(taskId) {
    for (const tr of tbody.rows) {
      if (tr.dataset.taskId === taskId) {
        return tr;
      }
    }
    return null;
  }

  /**
   * Make the table show ``tasks`` in order, reusing the rows it already has (by task id).
   * ``mark`` is the last event id the page had when it asked for the page: a row an event
   * changed after that knows more than this answer, and keeps its state until the refetch
   * that event scheduled.
   */
  function applyTasks(page, mark) {
    const existing = new Map();
    for (const tr of Array.from(tbody.rows)) {
      existing.set(tr.dataset.taskId, tr);
    }
    const wanted = [];
    for (const task of page.tasks) {
      let tr = existing.get(task.id);
      if (tr) {
        existing.delete(task.id);
        // Finished and Cancelled never change again: an answer read before (a refetch still
        // in flight when the cancel's own answer updated the row) does not undo them.
        const final = tr.dataset.state === "Cancelled" || tr.dataset.state === "Finished";
        const stale = final && task.state !== tr.dataset.state;
        if (!stale && !((rowMarks.get(task.id) || 0) > mark)) {
          updateRow(tr, task);
        }
      } else {
        tr = newRow(task);
        updateRow(tr, task);
      }
      wanted.push(tr);
    }
    for (const tr of existing.values()) {
      tr.remove();
    }
    for (const [taskId, eventId] of rowMarks) {
      if (eventId <= mark) {
        rowMarks.delete(taskId); // this answer already knew of that event
      }
    }
    wanted.forEach((tr, i) => {
      if (tbody.rows[i] !== tr) {
        tbody.insertBefore(tr, tbody.rows[i] || null);
      }
    });
    view.next = page.next === null || page.next === undefined ? null : String(page.next);
    document.getElementById("tasks-empty").hidden = page.tasks.length > 0;
    if (page.tasks.length === 0) {
      sq.setText(document.getElementById("tasks-empty"), campaignState === "draft"
        ? "No emails yet: provision the campaign to plan and schedule them."
        : "No emails match.");
    }
    updatePager(page.tasks.length);
  }

  function updatePager(shown) {
    const prev = document.getElementById("prev-page");
    const next = document.getElementById("next-page");
    prev.hidden = view.after === "-1";
    next.hidden = view.next === null;
    prev.setAttribute("href", "?" + query({ after: view.stack.length ? view.stack[view.stack.length - 1] : null }));
    next.setAttribute("href", "?" + query({ after: view.next }));
    sq.setText(document.getElementById("page-info"),
      shown + " shown, " + pageSize + " a page, times in " + timeZone);
  }

  function query(extra) {
    const q = new URLSearchParams();
    if (view.state) {
      q.set("state", view.state);
    }
    if (view.search) {
      q.set("search", view.search);
    }
    const after = extra && "after" in extra ? extra.after : view.after;
    if (after !== null && after !== undefined && after !== "-1") {
      q.set("after", after);
    }
    return q.toString();
  }

  /** A sequence's funnel (campaign.html's Steps card) from the API's campaign read. */
  function applyFunnel(funnel) {
    if (!Array.isArray(funnel) || !funnel.length) {
      return;
    }
    const widest = Math.max(1, funnel[0].made);
    for (const f of funnel) {
      const row = document.querySelector('#steps-table tr[data-step="' + f.step + '"]');
      if (!row) {
        continue;
      }
      for (const name of ["made", "sent", "answered", "stopped", "pending", "failed"]) {
        const cell = row.querySelector('[data-funnel="' + name + '"]');
        if (cell) {
          sq.setText(cell, String(f[name]));
        }
      }
      const meter = row.querySelector("meter");
      if (meter) {
        const most = Math.max(widest, f.made);
        meter.max = most;
        meter.value = f.made;
        meter.setAttribute("aria-label",
          "Step " + f.step + ": " + f.made + " emails made, of " + most + " in step 1");
      }
    }
  }

  function applyCampaign(c) {
    applyFunnel(c.funnel);
    campaignState = c.state;
    root.dataset.state = c.state;
    if (c.policy && c.policy.timezone) {
      timeZone = c.policy.timezone;
    }
    const stateNode = document.getElementById("campaign-state");
    const badge = stateNode.querySelector(".badge");
    if (!badge || badge.textContent !== c.state) {
      stateNode.replaceChild(sq.badge(c.state), stateNode.firstElementChild);
    }
    sq.setText(document.getElementById("campaign-state-reason"), c.state_reason || "");
    if (c.policy_text) {
      sq.setText(document.getElementById("policy-text"), c.policy_text);
    }
    if (c.counts) {
      counts = c.counts;
      for (const node of document.querySelectorAll("[data-count]")) {
        sq.setText(node, counts[node.dataset.count] || 0);
      }
      const sum = Object.values(counts).reduce((n, v) => n + v, 0);
      sq.updateProgress(document.getElementById("campaign-progress"), counts, Math.max(c.recipients || 0, sum));
    }
    if (c.outcomes) {
      for (const node of document.querySelectorAll("[data-outcome-count]")) {
        sq.setText(node, c.outcomes[node.dataset.outcomeCount] || 0);
      }
    }
    for (const key of ["moved", "late", "suppressed"]) {
      if (key in c) {
        sq.setText(document.getElementById("campaign-" + key), c[key]);
      }
    }
    if ("next_send_at" in c) {
      const next = document.getElementById("next-send");
      next.setAttribute("datetime", c.next_send_at || "");
      sq.setText(next, c.next_send_at ? sq.formatTime(c.next_send_at, timeZone) : "—");
      document.getElementById("next-send-zone").hidden = !c.next_send_at;
    }
    // a draft has no tasks yet: keep the planned chart the page was rendered with
    if (Array.isArray(c.timeline) && (c.timeline.length || c.state !== "draft")) {
      sq.drawDayChart(document.getElementById("timeline"), c.timeline);
    }
    updateActions();
  }

  function updateActions() {
    let offered = 0;
    for (const button of document.querySelectorAll("[data-action]")) {
      const action = button.dataset.action;
      let allowed = (ACTIONS[action] || []).includes(campaignState);
      if (action === "retry-failed") {
        allowed = allowed && (counts.Failed || 0) > 0;
      }
      button.hidden = !allowed;
      offered += allowed ? 1 : 0;
    }
    // no empty card: the Actions card shows while it offers something
    document.getElementById("actions-card").hidden = offered === 0;
  }

  function active() {
    return (counts.Pending || 0) + (counts.Running || 0) > 0 || campaignState === "provisioning";
  }

  // -- fetching --------------------------------------------------------------------------------
  let refreshTimer = null;
  let refreshing = false;
  let refreshAgain = false;
  let lastRefresh = 0;

  function tasksUrl() {
    const q = new URLSearchParams({ limit: String(pageSize) });
    if (view.state) {
      q.set("state", view.state);
    }
    if (view.search) {
      q.set("search", view.search);
    }
    if (view.after !== "-1") {
      q.set("after", view.after);
    }
    return base + "/tasks?" + q.toString();
  }

  async function refresh() {
    if (refreshing) {
      refreshAgain = true;
      return;
    }
    refreshing = true;
    lastRefresh = Date.now();
    const mark = lastEventId;
    const tableError = document.getElementById("table-error");
    try {
      const [c, page] = await Promise.all([sq.api("GET", base), sq.api("GET", tasksUrl())]);
      applyCampaign(c);
      applyTasks(page, mark);
      sq.showError(tableError, "");
    } catch (exc) {
      sq.showError(tableError, "Could not update: " + exc.message);
    } finally {
      refreshing = false;
      fallback(); // the counts may have changed what is in flight
      if (refreshAgain) {
        refreshAgain = false;
        refreshSoon();
      }
    }
  }

  /** Refetch soon, coalescing bursts: at most one refetch per REFRESH_GAP_MS. */
  function refreshSoon() {
    if (refreshTimer !== null) {
      return;
    }
    const wait = Math.max(REFRESH_DELAY_MS, REFRESH_GAP_MS - (Date.now() - lastRefresh));
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      refresh();
    }, wait);
  }

  // -- the stream, and the polling fallback --------------------------------------------------------
  let source = null;
  let lastHeard = 0;
  let lastEventId = Number(root.dataset.lastChange) || 0;
  // task id -> id of the last event that changed its row (see applyTasks)
  const rowMarks = new Map();
  let backoff = BACKOFF_MIN_MS;
  let reconnectTimer = null;
  let pollTimer = null;
  let pollEvery = null; // the period pollTimer was set for
  let serverDelayed = false; // the last status event said "delayed"
  const every = Math.round(POLL_MS / 100) / 10 + " s";
  const LABELS = {
    connecting: "Connecting…",
    live: "Live",
    delayed: "Delayed: live updates are behind; refreshing every " + every,
    polling: "Polling every " + every + " (live updates interrupted)",
    idle: "Not live; nothing in flight to poll",
  };

  function setMode(mode) {
    if (indicator.dataset.connection !== mode) {
      indicator.dataset.connection = mode;
      sq.setText(document.getElementById("connection-text"), LABELS[mode]);
    }
    schedulePoll();
  }

  /** How often to refetch now: never with nothing in flight (nor before the stream opened). */
  function pollPeriod() {
    const mode = indicator.dataset.connection;
    if (!active() || mode === "connecting" || mode === "idle") {
      return null;
    }
    return mode === "live" ? REFETCH_MS : POLL_MS;
  }

  /** Keep one refetch timer at the period the mode asks for (a running one keeps its beat). */
  function schedulePoll() {
    const period = pollPeriod();
    if (pollTimer !== null && period === pollEvery) {
      return;
    }
    stopPolling();
    pollEvery = period;
    if (period !== null) {
      pollTimer = setTimeout(() => {
        pollTimer = null;
        refresh();
      }, period);
    }
  }

  function heard() {
    lastHeard = Date.now();
  }

  function connect() {
    reconnectTimer = null;
    if (source) {
      source.close();
    }
    const es = new EventSource(base + "/events?after=" + encodeURIComponent(String(lastEventId)));
    source = es;
    heard();
    es.addEventListener("open", () => {
      if (source !== es) {
        return;
      }
      heard();
      backoff = BACKOFF_MIN_MS;
      // the stream's first frame says whether the server is delayed; until then, as it was
      setMode(serverDelayed ? "delayed" : "live");
      refreshSoon(); // catch up with whatever changed while we were away
    });
    es.addEventListener("ping", () => {
      // the connection is open; that says nothing of the changes, so the mode stays
      if (source === es) {
        heard();
      }
    });
    es.addEventListener("status", (event) => {
      if (source === es) {
        heard();
        onStatus(event);
      }
    });
    es.addEventListener("change", (event) => {
      if (source === es) {
        onChange(event);
      }
    });
    es.addEventListener("error", () => {
      if (source === es) {
        streamDown();
      }
    });
  }

  /** The stream failed or went stale: close it, fall back, and try again later. */
  function streamDown() {
    if (source) {
      source.close();
      source = null;
    }
    fallback();
    if (reconnectTimer === null) {
      const wait = backoff + Math.floor(Math.random() * 250);
      backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
      reconnectTimer = setTimeout(connect, wait);
    }
  }

  /** Without an open stream, poll while emails are in flight, else sit idle; with one, keep
   * the mode the stream set, at the period it asks for. */
  function fallback() {
    const mode = indicator.dataset.connection;
    if (source && (mode === "live" || mode === "delayed" || mode === "connecting")) {
      schedulePoll();
      return;
    }
    setMode(active() ? "polling" : "idle");
  }

  function stopPolling() {
    if (pollTimer !== null) {
      clearTimeout(pollTimer);
      pollTimer = null;
    }
    pollEvery = null;
  }

  /** The server's word on its change-log reader: "delayed" (poll) or "live" again. */
  function onStatus(event) {
    let data;
    try {
      data = JSON.parse(event.data);
    } catch (exc) {
      return;
    }
    serverDelayed = data.state === "delayed";
    const mode = indicator.dataset.connection;
    if (serverDelayed) {
      indicator.setAttribute("title", data.reason || "");
      setMode("delayed");
    } else {
      indicator.removeAttribute("title");
      setMode("live");
      if (mode === "delayed") {
        refreshSoon(); // what the delay held back
      }
    }
  }

  function onChange(event) {
    heard();
    const eventId = Number(event.lastEventId);
    if (eventId > lastEventId) {
      lastEventId = eventId;
    }
    let data;
    try {
      data = JSON.parse(event.data);
    } catch (exc) {
      return;
    }
    const outcome = outcomeOf(data);
    if (data.task_id && outcome) {
      // An outcome change of a sent email (its state stays): show it in the row now; its
      // detail and the outcome counts come with the refetch below.
      const tr = rowById(data.task_id);
      if (tr) {
        setField(tr, "outcome", outcome);
        setOutcomeData(tr, outcome, data.at);
        rowMarks.set(data.task_id, eventId || lastEventId);
      }
    } else if (data.task_id) {
      // An event applies to the state it was made from, like the store's compare-and-set:
      // a row that already shows a later state (from a refetch) is not moved back by it.
      const tr = rowById(data.task_id);
      if (tr && data.to && tr.dataset.state === data.from) {
        setRowState(tr, data.to);
        rowMarks.set(data.task_id, eventId || lastEventId);
      }
    } else if (data.to === "progress") {
      sq.setText(document.getElementById("provision-progress"), "Provisioning: " + (data.note || ""));
    } else if (data.to) {
      campaignState = data.to;
      if (data.to !== "provisioning") {
        sq.setText(document.getElementById("provision-progress"), "");
      }
      if (data.from === "provisioning" && data.to === "active") {
        sq.setText(actionStatus, "Provisioned: every email is scheduled.");
      }
      updateActions();
    }
    refreshSoon();
  }

  /** The outcome an outcome-change entry sets (from == to, note "outcome: bounced"), or null
   * for any other entry (domain/feedback.py writes the note). */
  function outcomeOf(data) {
    const match = /^outcome: ([a-z]+)$/.exec(data.note || "");
    return data.from && data.from === data.to && match ? match[1] : null;
  }

  // a stream that says nothing past the heartbeat is as good as gone
  setInterval(() => {
    if (source && Date.now() - lastHeard > STALE_MS) {
      streamDown();
    }
  }, 1000);

  // -- actions -----------------------------------------------------------------------------------
  const actionError = document.getElementById("action-error");
  const actionStatus = document.getElementById("action-status");

  async function runAction(button) {
    const action = button.dataset.action;
    const ask = CONFIRM[action];
    if (ask && !(await sq.confirm(ask[0], ask[1]))) {
      return;
    }
    sq.showError(actionError, "");
    sq.setText(actionStatus, "");
    button.disabled = true;
    try {
      const result = await sq.api("POST", base + "/" + action);
      if (result) {
        applyCampaign(result);
      }
      if (action === "retry-failed" && result && typeof result.affected === "number") {
        sq.setText(actionStatus, sq.plural(result.affected, "failed email") + " will be sent again.");
      } else if (action === "provision") {
        sq.setText(actionStatus, "Provisioning started.");
      } else {
        sq.setText(actionStatus, "Done: " + button.textContent.toLowerCase() + ".");
      }
      refreshSoon();
    } catch (exc) {
      sq.showError(actionError, exc.message);
    } finally {
      button.disabled = false;
      if (button.hidden) {
        // the control is gone with the state it served: keep the keyboard focus nearby (the
        // campaign's state, when the card went with its last control)
        const next = document.querySelector("#actions [data-action]:not([hidden])");
        const state = document.getElementById("campaign-state");
        if (next && !document.getElementById("actions-card").hidden) {
          next.focus();
        } else {
          state.setAttribute("tabindex", "-1");
          state.focus();
        }
      }
    }
  }

  for (const button of document.querySelectorAll("[data-action]")) {
    button.addEventListener("click", () => runAction(button));
  }

  tbody.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-cancel-task]");
    if (!button) {
      return;
    }
    const taskId = button.dataset.cancelTask;
    const tr = button.closest("tr");
    const email = tr.querySelector('[data-field="email"]').textContent;
    if (!(await sq.confirm("Cancel the email to " + email + "? This cannot be undone.", "Cancel email"))) {
      return;
    }
    const tableError = document.getElementById("table-error");
    sq.showError(tableError, "");
    button.disabled = true;
    try {
      const task = await sq.api("POST", base + "/tasks/" + encodeURIComponent(taskId) + "/cancel");
      if (task && tr.isConnected) {
        updateRow(tr, task);
      }
      refreshSoon();
    } catch (exc) {
      sq.showError(tableError, "Could not cancel the email to " + email + ": " + exc.message);
      button.disabled = false;
    }
  });

  // -- filters and paging --------------------------------------------------------------------------
  function loadPage() {
    history.replaceState(null, "", "?" + query());
    refresh();
  }

  document.getElementById("task-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    view.state = document.getElementById("filter-state").value;
    view.search = document.getElementById("filter-search").value.trim();
    view.after = "-1";
    view.stack = [];
    loadPage();
  });
  document.getElementById("filter-state").addEventListener("change", () => {
    document.getElementById("task-filter").requestSubmit();
  });
  let searchTimer = null;
  document.getElementById("filter-search").addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => document.getElementById("task-filter").requestSubmit(), 400);
  });
  document.getElementById("next-page").addEventListener("click", (event) => {
    event.preventDefault();
    if (view.next === null) {
      return;
    }
    view.stack.push(view.after);
    view.after = view.next;
    loadPage();
  });
  document.getElementById("prev-page").addEventListener("click", (event) => {
    event.preventDefault();
    view.after = view.stack.length ? view.stack.pop() : "-1";
    loadPage();
  });

  if (params.has("after") && view.after !== "-1") {
    // opened on a later page by a link: "previous" leads back to the first page
    view.stack = ["-1"];
  }
  updateActions();
  updatePager(tbody.rows.length);
  connect();
})();
