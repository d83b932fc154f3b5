/* The campaign page's email rows: task_row.html's markup built and filled from the API's task.
 *
 * task_rows.py (task_row) writes the same texts on the server: keep both in step.
 * sq.campaignRows({...}) returns the row functions campaign.js patches the table with.
 */
(function () {
  "use strict";

  const sq = window.sq;
  if (!sq) {
    return;
  }

  // fields holding a time: its date and clock never wrap apart (task_row.html, clock)
  const CLOCKS = ["send_at", "local", "sent_at"];

  // as task_rows.py's moved_text: "1 move: worker down 16:50-17:48 UTC"
  function movedText(moves, reason) {
    if (!moves) {
      return "";
    }
    return sq.plural(moves, "move") + (reason ? ": " + reason : "");
  }

  /**
   * The rows of one campaign. ``timeZone`` is a getter (the campaign's zone can change while
   * the page is open); ``localTime``: its emails go out in each recipient's zone; ``steps``: a
   * sequence, whose rows carry a Step cell.
   */
  sq.campaignRows = function ({ campaignId, timeZone, localTime, steps }) {
    /** The texts of a task's fields, as the server renders them. */
    function taskCells(task) {
      // a local-time campaign: the zone this email's windows are read in
      const ownZone = localTime ? task.timezone || timeZone() : null;
      return {
        position: String(task.position + 1),
        step: String(task.step || 1),
        email: task.email,
        name: task.name || "",
        subject: task.subject || "",
        // who it goes out from, "Name <address>": its sender, or the campaign's From
        sender: task.sender_name ? task.sender_name + " <" + task.sender + ">" : task.sender || "",
        // a paused campaign's Pending emails have no send time until it resumes
        send_at: task.paused ? "paused" : sq.formatTime(task.send_at, timeZone()),
        local: task.paused || !ownZone ? "" : sq.formatZoneTime(task.send_at, ownZone),
        // sent more than a minute after its send time: marked late
        sent_at: task.sent_at ? sq.formatTime(task.sent_at, timeZone()) + (task.late ? " (late)" : "") : "",
        // what happened after sending: "bounced: 5.1.1 smtp; 550 user unknown"
        outcome: (task.outcome || "") + (task.outcome && task.outcome_detail ? ": " + task.outcome_detail : ""),
        moved: movedText(task.moves, task.moved_reason),
        // why it failed, or why it was cancelled ("suppressed: bounced")
        error: task.error || task.reason || "",
      };
    }

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
      const url = "/campaigns/" + encodeURIComponent(campaignId) + "/emails/" + encodeURIComponent(task.id);
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
        moved.setAttribute("title", "first planned " + sq.formatTime(task.planned_at, timeZone()));
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
        cell.setAttribute("title", "since " + sq.formatTime(at, timeZone()));
      } else {
        cell.removeAttribute("title");
      }
    }

    return { newRow, updateRow, setField, setRowState, setOutcomeData };
  };
})();
