/* The Webhooks page and one endpoint's page: add an endpoint (its secret shown once), edit its
 * filters, enable or disable it, rotate its secret and remove it (both after a confirmation),
 * redeliver one event or every failed one. The API does the checking; errors show next to
 * their field. After a change the page's lists are fetched again as the server draws them
 * (#webhooks, #delivery-log: the page's own HTML, escaped by Jinja, parsed by DOMParser into an
 * inert document where no script runs; never innerHTML), so a signing secret stays only in
 * the panel that shows it. */
(function () {
  "use strict";

  const sq = window.sq;
  const list = document.getElementById("webhooks");
  if (!list || !sq) {
    return;
  }
  const status = document.getElementById("webhooks-status");
  const pageError = document.getElementById("webhooks-error");
  const panel = document.getElementById("secret-panel");
  const secretValue = document.getElementById("secret-value");
  const copied = document.getElementById("secret-copied");

  function clearErrors(form) {
    for (const node of form.querySelectorAll("[data-error-for], [data-form-error]")) {
      sq.showError(node, "");
    }
    for (const node of form.querySelectorAll("[aria-invalid]")) {
      node.removeAttribute("aria-invalid");
    }
  }

  /** The API's error next to the field it names, else at the top of the form. */
  function formError(form, exc, verb) {
    const detail = exc.detail || {};
    const field = detail.field ? String(detail.field).split(".")[0] : "";
    const slot = field ? form.querySelector('[data-error-for="' + CSS.escape(field) + '"]') : null;
    if (slot) {
      sq.showError(slot, detail.reason || exc.message);
      const control = form.querySelector('[name="' + CSS.escape(field) + '"]');
      if (control) {
        if (control.type !== "checkbox") {
          control.setAttribute("aria-invalid", "true");
        }
        control.focus();
      }
      return;
    }
    const box = form.querySelector("[data-form-error]");
    sq.showError(box, verb + ": " + exc.message);
    box.setAttribute("tabindex", "-1");
    box.focus();
  }

  function ticked(form, name) {
    return Array.from(form.querySelectorAll('input[name="' + name + '"]:checked'), (i) => i.value);
  }

  /** Draw #webhooks and #delivery-log (and the count) again from the server's page. */
  async function refresh() {
    let response;
    try {
      response = await fetch(location.href, { credentials: "same-origin", cache: "no-store" });
    } catch (exc) {
      return;
    }
    if (!response.ok) {
      return;
    }
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const id of ["webhooks", "delivery-log", "webhooks-count", "webhooks-empty"]) {
      const now = document.getElementById(id);
      const next = fresh.getElementById(id);
      if (now && next) {
        now.replaceWith(document.importNode(next, true));
      }
    }
  }

  // Deliveries happen in the worker: while the page is visible and nobody is working in its
  // lists (focus or an open filter form there), draw them again every poll interval.
  const pollMs = Number(list.dataset.pollMs) || 5000;
  function busy() {
    const active = document.activeElement;
    const lists = [document.getElementById("webhooks"), document.getElementById("delivery-log")];
    return lists.some((node) => node && (node.contains(active) || node.querySelector("details[open]")));
  }
  window.setInterval(() => {
    if (!document.hidden && !busy()) {
      refresh();
    }
  }, pollMs);

  function card(id) {
    return document.getElementById("webhook-" + id);
  }

  function showSecret(secret, text) {
    secretValue.textContent = secret;
    sq.setText(document.getElementById("secret-for"), text);
    sq.setText(copied, "");
    panel.hidden = false;
    panel.focus();
  }

  document.getElementById("secret-copy").addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(secretValue.textContent);
      sq.setText(copied, "Copied.");
    } catch (exc) {
      // no clipboard (an http page, say): select it for the user's own copy
      window.getSelection().selectAllChildren(secretValue);
      sq.setText(copied, "Selected: copy it with Ctrl+C (⌘C).");
    }
  });
  document.getElementById("secret-done").addEventListener("click", () => {
    secretValue.textContent = "";
    panel.hidden = true;
    const add = document.getElementById("w-url");
    (add || document.getElementById("main")).focus();
  });

  const addForm = document.getElementById("webhook-add");
  if (addForm) {
    addForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      clearErrors(addForm);
      sq.showError(pageError, "");
      const button = document.getElementById("webhook-add-button");
      button.disabled = true;
      const body = {
        url: document.getElementById("w-url").value.trim(),
        events: ticked(addForm, "events"),
        campaigns: ticked(addForm, "campaigns"),
      };
      try {
        const made = await sq.api("POST", "/api/webhooks", body);
        addForm.reset();
        await refresh();
        sq.setText(status, "Webhook " + made.url + " (" + made.id + ") added.");
        showSecret(made.signing_secret, "The secret of " + made.url + " signs every delivery to it.");
      } catch (exc) {
        formError(addForm, exc, "Not added");
      }
      button.disabled = false;
    });
  }

  // the edit forms live inside #webhooks, which refresh() replaces: listen on the document
  document.addEventListener("submit", async (event) => {
    const form = event.target.closest("[data-edit-form]");
    if (!form) {
      return;
    }
    event.preventDefault();
    clearErrors(form);
    const section = form.closest("[data-webhook-id]");
    const body = { events: ticked(form, "events"), campaigns: ticked(form, "campaigns") };
    try {
      await sq.api("PATCH", "/api/webhooks/" + encodeURIComponent(section.dataset.webhookId), body);
      await refresh();
      sq.setText(status, "Filters of " + section.dataset.url + " saved.");
    } catch (exc) {
      formError(form, exc, "Not saved");
    }
  });

  const ACTIONS = {
    async toggle(section) {
      const enable = section.dataset.enabled !== "true";
      await sq.api("PATCH", "/api/webhooks/" + encodeURIComponent(section.dataset.webhookId),
        { enabled: enable });
      return section.dataset.url + (enable ? " enabled; its missed events follow in order." : " disabled.");
    },
    async rotate(section) {
      let question = "Rotate the signing secret of " + section.dataset.url + "? The new one " +
        "is shown once; the old one keeps signing beside it for 24 hours.";
      if (section.dataset.previousSigns === "true") {
        // at most two secrets sign: the one already signing beside the current one goes
        question += " The secret the last rotation replaced stops signing now.";
      }
      if (!(await sq.confirm(question, "Rotate secret"))) {
        return null;
      }
      const id = section.dataset.webhookId;
      const made = await sq.api("POST", "/api/webhooks/" + encodeURIComponent(id) + "/rotate-secret");
      showSecret(made.signing_secret, "The new secret of " + made.url + "; the old one signs too for 24 hours.");
      return "Secret of " + made.url + " rotated.";
    },
    async remove(section) {
      const question = "Remove the webhook " + section.dataset.url + "? It gets no more events " +
        "and its delivery log is deleted; this cannot be undone.";
      if (!(await sq.confirm(question, "Remove webhook"))) {
        return null;
      }
      await sq.api("DELETE", "/api/webhooks/" + encodeURIComponent(section.dataset.webhookId));
      if (document.getElementById("delivery-log")) {
        location.assign("/webhooks"); // its own page is gone with it
        return null;
      }
      return "Webhook " + section.dataset.url + " removed.";
    },
  };

  async function redeliver(body) {
    const id = document.querySelector("#webhooks [data-webhook-id]").dataset.webhookId;
    const sent = await sq.api("POST", "/api/webhooks/" + encodeURIComponent(id) + "/redeliver", body);
    const ok = sent.deliveries.filter((d) => d.ok).length;
    return "Redelivered " + sq.plural(sent.deliveries.length, "event") + ": " + ok + " delivered, " +
      (sent.deliveries.length - ok) + " failed.";
  }

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-action]");
    if (!button) {
      return;
    }
    const action = button.dataset.action;
    sq.showError(pageError, "");
    button.disabled = true;
    try {
      let said;
      if (action === "redeliver") {
        said = await redeliver({ events: [button.dataset.event] });
      } else if (action === "redeliver-failed") {
        const log = document.getElementById("delivery-log");
        said = await redeliver({ failed_since: log.dataset.failedSince });
      } else {
        said = await ACTIONS[action](button.closest("[data-webhook-id]"));
      }
      if (said !== null) {
        await refresh();
        sq.setText(status, said);
      }
    } catch (exc) {
      sq.showError(pageError, "Not done: " + exc.message);
    }
    button.disabled = false;
    // the button may have been drawn again: the focus goes to its new self, or to the page
    const section = button.closest("[data-webhook-id]");
    let again = button.isConnected ? button : null;
    if (!again && section) {
      const fresh = card(section.dataset.webhookId);
      again = fresh ? fresh.querySelector('[data-action="' + action + '"]') : null;
    }
    if (!again && action.startsWith("redeliver")) {
      again = document.getElementById("log-title");
      again.setAttribute("tabindex", "-1");
    }
    if (again && panel.hidden) {
      again.focus();
    } else if (!again && panel.hidden) {
      document.getElementById("main").focus();
    }
  });
})();
