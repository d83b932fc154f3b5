/* The suppression page: add an address, remove one. The API does the checking. */
(function () {
  "use strict";

  const sq = window.sq;
  const table = document.getElementById("suppressions");
  const form = document.getElementById("supp-add");
  if (!table || !form || !sq) {
    return;
  }
  const status = document.getElementById("supp-status");
  const error = document.getElementById("supp-error");
  const email = document.getElementById("supp-email");
  const total = document.getElementById("supp-total");

  function setTotal(delta) {
    const count = Math.max(0, (Number(total.dataset.count) || 0) + delta);
    total.dataset.count = String(count);
    sq.setText(total, sq.plural(count, "address", "addresses"));
  }

  function showEmpty() {
    document.getElementById("supp-empty").hidden = table.tBodies[0].rows.length > 0;
  }

  /** A row as suppressions.html renders it (its time in the page's zone, with the zone). */
  function row(entry) {
    const zone = table.dataset.timezone || "UTC";
    return sq.el("tr", { "data-email": entry.email },
      sq.el("td", { class: "card-title mono address", "data-label": "Address" }, entry.email),
      sq.el("td", { "data-label": "Reason" }, entry.reason),
      sq.el("td", { class: "mono address", "data-label": "From email" }, entry.task_id || "—"),
      sq.el("td", { "data-label": "Since" },
        sq.el("time", { class: "nowrap", datetime: entry.at }, sq.formatTime(entry.at, zone))),
      sq.el("td", { class: "row-actions" },
        sq.el("button", {
          type: "button",
          class: "button small danger",
          "data-remove": entry.email,
          "aria-label": "Remove " + entry.email + " from the list",
        }, "Remove")));
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    sq.showError(error, "");
    email.removeAttribute("aria-invalid");
    const body = { email: email.value, reason: document.getElementById("supp-reason").value };
    try {
      const entry = await sq.api("POST", "/api/suppressions", body);
      if (entry.new) {
        table.tBodies[0].prepend(row(entry));
        setTotal(1);
        sq.setText(status, entry.email + " suppressed (" + entry.reason + ").");
      } else {
        sq.setText(status, entry.email + " was suppressed already (" + entry.reason + ").");
      }
      email.value = "";
      showEmpty();
    } catch (exc) {
      if (exc.detail && exc.detail.field === "email") {
        email.setAttribute("aria-invalid", "true");
      }
      sq.showError(error, "Not suppressed: " + exc.message);
      email.focus();
    }
  });

  table.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-remove]");
    if (!button) {
      return;
    }
    const address = button.dataset.remove;
    sq.showError(error, "");
    button.disabled = true;
    try {
      await sq.api("DELETE", "/api/suppressions/" + encodeURIComponent(address));
      button.closest("tr").remove();
      setTotal(-1);
      sq.setText(status, address + " removed from the list.");
      showEmpty();
      email.focus();
    } catch (exc) {
      sq.showError(error, "Not removed: " + exc.message);
      button.disabled = false;
    }
  });
})();
