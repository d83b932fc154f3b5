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

  function row(entry) {
    const tr = sq.el("tr", { "data-email": entry.email });
    const time = sq.el("time", { datetime: entry.at });
    sq.setText(time, entry.at);
    const button = sq.el("button", {
      type: "button",
      class: "button small danger",
      "data-remove": entry.email,
      "aria-label": "Remove " + entry.email + " from the list",
    });
    sq.setText(button, "Remove");
    const cells = [
      [entry.email, "mono"], [entry.reason, null], [entry.task_id || "", "mono"],
    ];
    for (const [text, cls] of cells) {
      const td = sq.el("td", { class: cls });
      sq.setText(td, text);
      tr.append(td);
    }
    const at = sq.el("td", {});
    at.append(time);
    const actions = sq.el("td", {});
    actions.append(button);
    tr.append(at, actions);
    return tr;
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
