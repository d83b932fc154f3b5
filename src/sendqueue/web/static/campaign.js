/* The campaign page: live rows, counts, chart and actions.
 *
 * The page's state and wiring: its counts and actions, the funnel, the filters and paging, and
 * the (throttled) refetch of the counts and the visible page. campaign_live.js keeps it live
 * (the event stream, and polling while that is delayed or down); campaign_rows.js draws the rows.
 */
(function () {
  "use strict";

  const sq = window.sq;
  const root = document.getElementById("campaign");
  if (!root || !sq) {
    return;
  }

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

  // -- the rows (campaign_rows.js) --------------------------------------------------------------
  const taskRows = sq.campaignRows({
    campaignId: id,
    timeZone: () => timeZone,
    localTime: document.getElementById("tasks-table").dataset.localTime === "true",
    // a sequence: rows carry a Step cell
    steps: document.getElementById("tasks-table").dataset.steps === "true",
  });

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
          taskRows.updateRow(tr, task);
        }
      } else {
        tr = taskRows.newRow(task);
        taskRows.updateRow(tr, task);
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
    const mark = feed.lastEventId();
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
      feed.fallback(); // the counts may have changed what is in flight
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

  // -- the live feed (campaign_live.js), and what a change does ---------------------------------
  const feed = sq.liveFeed({
    eventsUrl: base + "/events",
    lastEventId: Number(root.dataset.lastChange) || 0,
    refetchMs: REFETCH_MS,
    pollMs: POLL_MS,
    refresh,
    refreshSoon,
    active,
    onChange,
  });
  // task id -> id of the last event that changed its row (see applyTasks)
  const rowMarks = new Map();

  /** A change event of the stream (``eventId`` its id): patch the row it names, or the
   * campaign's state, and refetch soon. */
  function onChange(event, eventId) {
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
        taskRows.setField(tr, "outcome", outcome);
        taskRows.setOutcomeData(tr, outcome, data.at);
        rowMarks.set(data.task_id, eventId || feed.lastEventId());
      }
    } else if (data.task_id) {
      // An event applies to the state it was made from, like the store's compare-and-set:
      // a row that already shows a later state (from a refetch) is not moved back by it.
      const tr = rowById(data.task_id);
      if (tr && data.to && tr.dataset.state === data.from) {
        taskRows.setRowState(tr, data.to);
        rowMarks.set(data.task_id, eventId || feed.lastEventId());
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
        taskRows.updateRow(tr, task);
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
  feed.start();
})();
