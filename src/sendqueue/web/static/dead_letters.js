/* The dead-letter page: redrive one entry, or all of them. */
(function () {
  "use strict";

  const sq = window.sq;
  const table = document.getElementById("dead-letters");
  if (!table || !sq) {
    return;
  }
  const status = document.getElementById("dlq-status");
  const error = document.getElementById("dlq-error");
  const all = document.getElementById("redrive-all");

  function removeRows(ids) {
    for (const id of ids) {
      for (const tr of Array.from(table.tBodies[0].rows)) {
        if (tr.dataset.letterId === id) {
          tr.remove();
        }
      }
    }
    const empty = table.tBodies[0].rows.length === 0;
    document.getElementById("dlq-empty").hidden = !empty;
    all.disabled = empty;
  }

  async function redrive(url, button) {
    sq.showError(error, "");
    button.disabled = true;
    try {
      const result = await sq.api("POST", url);
      const ids = result.redriven || [];
      removeRows(ids);
      sq.setText(status, sq.plural(ids.length, "dead letter") + " redriven as " +
        ((result.schedules || []).join(", ") || "new schedules") + ".");
    } catch (exc) {
      sq.showError(error, "Redrive failed: " + exc.message);
      button.disabled = false;
    }
  }

  table.addEventListener("click", (event) => {
    const button = event.target.closest("[data-redrive]");
    if (button) {
      redrive("/api/dead-letters/" + encodeURIComponent(button.dataset.redrive) + "/redrive", button);
    }
  });
  all.addEventListener("click", () => redrive("/api/dead-letters/redrive", all));
})();
