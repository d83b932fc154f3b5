/* The campaigns list: refetch every 5 s (SENDQUEUE_UI_POLL_INTERVAL) while a campaign is in
 * flight, update rows in place. */
(function () {
  "use strict";

  const sq = window.sq;
  const table = document.getElementById("campaigns");
  if (!table || !sq) {
    return;
  }
  const POLL_MS = Number(table.dataset.pollMs) || 5000;
  const IN_FLIGHT = ["provisioning", "active"];
  const status = document.getElementById("list-status");

  function rows() {
    const map = new Map();
    for (const tr of table.tBodies[0].rows) {
      map.set(tr.dataset.campaignId, tr);
    }
    return map;
  }

  function inFlight() {
    for (const tr of table.tBodies[0].rows) {
      const badge = tr.querySelector('[data-field="state"] .badge');
      if (badge && IN_FLIGHT.includes(badge.textContent)) {
        return true;
      }
    }
    return false;
  }

  function apply(campaign, tr) {
    sq.setText(tr.querySelector('[data-field="name"]'), campaign.name);
    const stateCell = tr.querySelector('[data-field="state"]');
    const badge = stateCell.querySelector(".badge");
    if (!badge || badge.textContent !== campaign.state) {
      stateCell.replaceChildren(sq.badge(campaign.state));
    }
    const counts = campaign.counts || {};
    let sum = 0;
    for (const cell of tr.querySelectorAll("[data-count]")) {
      const value = counts[cell.dataset.count] || 0;
      sum += value;
      sq.setText(cell, value);
    }
    sq.updateProgress(tr.querySelector("[data-progress]"), counts, Math.max(campaign.recipients || 0, sum));
    if (campaign.outcomes) {
      sq.setText(tr.querySelector('[data-field="outcomes"]'), outcomesText(campaign.outcomes) || "—");
    }
    if ("next_send_at" in campaign) {
      const time = tr.querySelector('[data-field="next_send"] time');
      time.setAttribute("datetime", campaign.next_send_at || "");
      sq.setText(time, campaign.next_send_at
        ? sq.formatTime(campaign.next_send_at, tr.dataset.timezone || "UTC") : "—");
    }
  }

  // as pages.py's outcomes_text: "2 bounced, 1 replied" (accepted is the rest)
  function outcomesText(outcomes) {
    return ["bounced", "complained", "replied", "unsubscribed"]
      .filter((name) => outcomes[name])
      .map((name) => outcomes[name] + " " + name)
      .join(", ");
  }

  async function poll() {
    if (document.hidden || !inFlight()) {
      return;
    }
    try {
      const data = await sq.api("GET", "/api/campaigns");
      const known = rows();
      let fresh = 0;
      for (const campaign of data.campaigns || []) {
        const tr = known.get(campaign.id);
        if (tr) {
          apply(campaign, tr);
        } else {
          fresh += 1;
        }
      }
      sq.setText(status, fresh ? sq.plural(fresh, "new campaign") + ": reload the page to see them." : "");
    } catch (exc) {
      sq.setText(status, "Could not update: " + exc.message);
    }
  }

  setInterval(poll, POLL_MS);
})();
