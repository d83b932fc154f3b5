/* The senders page: add a sender (errors next to the field), remove one after a confirmation.
 * The API does the checking; the charts are drawn by the server, so an added sender reloads. */
(function () {
  "use strict";

  const sq = window.sq;
  const form = document.getElementById("sender-add");
  const list = document.getElementById("senders");
  if (!form || !list || !sq) {
    return;
  }
  const status = document.getElementById("senders-status");
  const pageError = document.getElementById("senders-error");
  const formError = document.getElementById("sender-form-error");
  const NUMBERS = ["daily_cap", "min_gap_seconds", "warmup_start", "warmup_step"];
  const OPTIONAL = ["name", "timezone", "reply_to", "transport", "warmup_start", "warmup_step",
    "imap", "signature_text", "signature_html"];

  function clearErrors() {
    for (const node of form.querySelectorAll("[data-error-for]")) {
      sq.showError(node, "");
    }
    for (const node of form.querySelectorAll("[aria-invalid]")) {
      node.removeAttribute("aria-invalid");
    }
    formError.hidden = true;
  }

  function fieldError(field, message) {
    const slot = form.querySelector('[data-error-for="' + CSS.escape(field) + '"]');
    const control = form.querySelector('[name="' + CSS.escape(field) + '"]');
    if (!slot || !control) {
      return false;
    }
    sq.showError(slot, message);
    control.setAttribute("aria-invalid", "true");
    control.focus();
    return true;
  }

  function showError(exc) {
    const detail = exc.detail || {};
    const field = detail.field ? String(detail.field) : "";
    if (field && fieldError(field, detail.reason || detail.message || exc.message)) {
      return;
    }
    sq.setText(document.getElementById("sender-form-error-message"), "Not added: " + exc.message);
    formError.hidden = false;
    formError.setAttribute("tabindex", "-1");
    formError.focus();
  }

  /** The JSON body: empty optional fields left out (the server's defaults apply), numbers
   * as numbers, and a number input the browser could not read refused here, by its name. */
  function body() {
    const data = {};
    for (const input of form.querySelectorAll("input[name], textarea[name]")) {
      const name = input.name;
      const text = input.value.trim();
      if (name.startsWith("oauth.")) {
        // the grant's fields as one object, sent only when one of them is filled in
        if (text) {
          data.oauth = data.oauth || {};
          data.oauth[name.slice("oauth.".length)] = text;
        }
        continue;
      }
      if (input.tagName === "TEXTAREA") {
        if (text) {
          data[name] = input.value;
        }
        continue;
      }
      if (NUMBERS.includes(name)) {
        if (input.validity && input.validity.badInput) {
          return { error: [name, "expected a whole number"] };
        }
        if (!text) {
          if (!OPTIONAL.includes(name)) {
            return { error: [name, "give a whole number"] };
          }
          continue;
        }
        data[name] = Number(text);
      } else if (text || !OPTIONAL.includes(name)) {
        data[name] = text;
      }
    }
    return { data: data };
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors();
    sq.showError(pageError, "");
    const built = body();
    if (built.error) {
      fieldError(built.error[0], built.error[1]);
      return;
    }
    const button = document.getElementById("sender-add-button");
    button.disabled = true;
    sq.setText(status, "Adding…");
    try {
      const sender = await sq.api("POST", "/api/senders", built.data);
      sq.setText(status, "Added; loading its chart…");
      location.assign("/senders?added=" + encodeURIComponent(sender.id) + "#sender-" + sender.id);
      return;
    } catch (exc) {
      sq.setText(status, "");
      showError(exc);
    }
    button.disabled = false;
  });

  list.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-remove-sender]");
    if (!button) {
      return;
    }
    const section = button.closest("[data-sender-id]");
    const id = button.dataset.removeSender;
    const email = section.dataset.email;
    const question = "Remove the sender " + email + "? Campaigns can no longer send from it, " +
      "and this cannot be undone.";
    if (!(await sq.confirm(question, "Remove sender"))) {
      return;
    }
    sq.showError(pageError, "");
    button.disabled = true;
    try {
      await sq.api("DELETE", "/api/senders/" + encodeURIComponent(id));
      section.remove();
      const count = document.getElementById("senders-count");
      sq.setText(count, sq.plural(list.querySelectorAll("[data-sender-id]").length, "sender"));
      document.getElementById("senders-empty").hidden = list.querySelector("[data-sender-id]") !== null;
      sq.setText(status, "Sender " + email + " removed.");
      document.getElementById("s-email").focus();
    } catch (exc) {
      sq.showError(pageError, "Not removed: " + exc.message);
      button.disabled = false;
      button.focus();
    }
  });
})();
