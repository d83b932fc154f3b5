/* The new-campaign form: extra windows, preview chart, create, and errors next to the fields. */
(function () {
  "use strict";

  const sq = window.sq;
  const form = document.getElementById("new-campaign");
  if (!form || !sq) {
    return;
  }
  const windows = document.getElementById("windows");
  const status = document.getElementById("form-status");
  // API field names that have no input of their own, mapped to the one that causes them
  const FIELD_ALIASES = {
    recipients: "file", header: "file", csv: "file", templates: "subject", window: "windows",
    // step 1 of a sequence is the subject and bodies above the steps
    "steps[1].subject": "subject", "steps[1].text": "body", "steps[1].html": "html",
  };

  // -- windows ---------------------------------------------------------------------------------
  function renumberWindows() {
    Array.from(windows.children).forEach((li, i) => {
      const input = li.querySelector("input");
      const label = li.querySelector("label");
      input.id = "f-window-" + (i + 1);
      label.setAttribute("for", input.id);
      sq.setText(label, "Window " + (i + 1));
      const remove = li.querySelector("[data-remove-window]");
      remove.hidden = windows.children.length === 1;
      remove.setAttribute("aria-label", "Remove window " + (i + 1));
    });
  }

  document.getElementById("add-window").addEventListener("click", () => {
    const li = windows.lastElementChild.cloneNode(true);
    li.querySelector("input").value = "";
    windows.append(li);
    renumberWindows();
    li.querySelector("input").focus();
  });

  windows.addEventListener("click", (event) => {
    const button = event.target.closest("[data-remove-window]");
    if (!button || windows.children.length === 1) {
      return;
    }
    const li = button.closest("li");
    const index = Array.from(windows.children).indexOf(li);
    li.remove();
    renumberWindows();
    windows.children[Math.max(0, index - 1)].querySelector("input").focus();
  });

  // -- follow-up steps: without JavaScript every slot shows; with it, the filled ones and
  // those added, in order (a removed step's followers move up a slot) ----------------------
  const stepList = document.getElementById("steps");
  const addStep = document.getElementById("add-step");
  const slots = Array.from(stepList.querySelectorAll("[data-step-slot]"));
  const stepControls = (slot) => Array.from(slot.querySelectorAll("input, textarea"));

  function slotFilled(slot) {
    return stepControls(slot).some((c) => (c.type === "checkbox" ? c.checked : c.value.trim() !== ""));
  }

  function copySlot(from, to) {
    const a = from ? stepControls(from) : [];
    stepControls(to).forEach((c, i) => {
      if (c.type === "checkbox") {
        c.checked = from ? a[i].checked : false;
      } else {
        c.value = from ? a[i].value : "";
      }
    });
  }

  function updateStepButtons() {
    const shown = slots.filter((s) => !s.hidden);
    addStep.hidden = shown.length === slots.length;
    for (const slot of slots) {
      slot.querySelector("[data-remove-step]").hidden = slot.hidden;
    }
  }

  // the slots up to the last filled one stay shown, the rest wait for "Add step"
  const lastFilled = slots.map(slotFilled).lastIndexOf(true);
  slots.forEach((slot, i) => { slot.hidden = i > lastFilled; });
  updateStepButtons();

  addStep.addEventListener("click", () => {
    const next = slots.find((s) => s.hidden);
    if (!next) {
      return;
    }
    next.hidden = false;
    updateStepButtons();
    next.querySelector("input").focus();
  });

  stepList.addEventListener("click", (event) => {
    const button = event.target.closest("[data-remove-step]");
    if (!button) {
      return;
    }
    const shown = slots.filter((s) => !s.hidden);
    const index = shown.indexOf(button.closest("[data-step-slot]"));
    for (let i = index; i < shown.length; i++) {
      copySlot(shown[i + 1] || null, shown[i]);
    }
    const last = shown[shown.length - 1];
    last.hidden = true;
    updateStepButtons();
    const stay = shown[Math.min(index, shown.length - 2)];
    (stay ? stay.querySelector("input") : addStep).focus();
  });

  // -- the request body ----------------------------------------------------------------------------
  function body() {
    const data = new FormData(form);
    data.delete("csrf_token");
    const days = data.getAll("weekdays");
    data.delete("weekdays");
    data.set("weekdays", days.join(","));
    const wins = data.getAll("windows").map((w) => String(w).trim()).filter((w) => w);
    data.delete("windows");
    for (const w of wins) {
      data.append("windows", w);
    }
    // empty optional fields are left out, so the server applies its defaults
    for (const key of ["from", "reply_to", "subject", "body", "html", "start", "skip_dates", "timezone"]) {
      if (!String(data.get(key) || "").trim()) {
        data.delete(key);
      }
    }
    const file = data.get("file");
    if (file instanceof File && !file.name && file.size === 0) {
      data.delete("file");
    }
    return data;
  }

  // -- errors ----------------------------------------------------------------------------------------
  function clearErrors() {
    for (const node of form.querySelectorAll("[data-error-for]")) {
      sq.showError(node, "");
    }
    for (const node of form.querySelectorAll("[aria-invalid]")) {
      node.removeAttribute("aria-invalid");
    }
    document.getElementById("form-error").hidden = true;
    document.getElementById("row-errors").replaceChildren();
    document.getElementById("row-errors-more").hidden = true;
  }

  function controlFor(field) {
    if (field === "windows") {
      return windows.querySelector("input");
    }
    if (field === "weekdays") {
      return form.querySelector('input[name="weekdays"]');
    }
    if (/^steps\[\d+\]$/.test(field)) {
      // a step as a whole (a template that cannot render): its body
      return form.querySelector('[name="' + CSS.escape(field + ".text") + '"]');
    }
    if (field === "steps") {
      return addStep.hidden ? null : addStep;
    }
    return form.querySelector('[name="' + CSS.escape(field) + '"]');
  }

  function showErrors(exc) {
    clearErrors();
    const detail = exc.detail || {};
    const box = document.getElementById("form-error");
    const list = document.getElementById("row-errors");
    let first = null;
    const rows = Array.isArray(detail.errors) ? detail.errors : [];
    for (const problem of rows) {
      const where = problem.row !== undefined && problem.row !== null ? "row " + problem.row + ": " : "";
      const value = problem.value !== undefined && problem.value !== null && problem.value !== ""
        ? " (got " + JSON.stringify(problem.value) + ")" : "";
      list.append(sq.el("li", { "data-row": problem.row }, where + problem.field + ": " + problem.reason + value));
    }
    if (typeof detail.total === "number" && detail.total > rows.length && rows.length) {
      const more = document.getElementById("row-errors-more");
      sq.setText(more, "… and " + (detail.total - rows.length) + " more.");
      more.hidden = false;
    }
    let field = detail.field ? String(detail.field) : "";
    field = FIELD_ALIASES[field] || field;
    const slot = field ? form.querySelector('[data-error-for="' + CSS.escape(field) + '"]') : null;
    const stepSlot = slot ? slot.closest("[data-step-slot]") : null;
    if (stepSlot && stepSlot.hidden) {
      stepSlot.hidden = false;
      updateStepButtons();
    }
    if (slot) {
      sq.showError(slot, detail.reason || detail.message || exc.message);
      first = controlFor(field);
    }
    if (rows.length) {
      first = first || document.getElementById("f-file");
      sq.showError(form.querySelector('[data-error-for="file"]'),
        sq.plural(detail.total || rows.length, "problem") + " in the CSV file; see the list above.");
    }
    if (!slot || rows.length) {
      const message = exc.status === 413 ? "The file is too large: " + exc.message : exc.message;
      sq.setText(document.getElementById("form-error-message"), message);
      box.hidden = false;
    }
    if (first) {
      first.setAttribute("aria-invalid", "true");
      first.focus();
    } else {
      box.setAttribute("tabindex", "-1");
      box.focus();
    }
  }

  // -- preview ---------------------------------------------------------------------------------------
  const SENDS_SHOWN = 20; // the first sends the preview lists (the API answers up to 1,000)

  function showPreview(result) {
    const section = document.getElementById("preview");
    section.hidden = false;
    sq.addZoneNames(result.zone_names);
    const zone = result.timezone || "UTC";
    const days = Array.isArray(result.days) ? result.days : [];
    const sends = Array.isArray(result.sends) ? result.sends : [];
    let text = sq.plural(result.count, "email") + ": " + (result.policy_text || "");
    if (result.duplicates) {
      text += "; " + sq.plural(result.duplicates, "duplicate address", "duplicate addresses") + " dropped";
    }
    // the sends come in time order: the first is the earliest, on the first day below
    if (sends.length) {
      text += ". First send " + sq.formatTime(sends[0].send_at, zone);
    }
    if (days.length) {
      const last = days[days.length - 1];
      text += ", last on " + last.day + " (" + sq.plural(days.length, "sending day") + ").";
    }
    sq.setText(document.getElementById("preview-summary"), text);
    sq.drawDayChart(document.getElementById("preview-chart"),
      days.map((d) => ({ day: d.day, planned: d.count, done: 0 })));
    const tbody = document.querySelector("#preview-days tbody");
    tbody.replaceChildren(...days.slice(0, 100).map((d) => sq.el("tr", {},
      sq.el("th", { scope: "row", class: "card-title" }, d.day),
      sq.el("td", { class: "num", "data-label": "Emails" }, d.count),
      sq.el("td", { "data-label": "First" }, sq.formatTime(d.first, zone)),
      sq.el("td", { "data-label": "Last" }, sq.formatTime(d.last, zone)))));
    showSteps(result);
    // the first sends, each with its recipient's own time where the plan reads their zone
    const shown = sends.slice(0, SENDS_SHOWN);
    const local = Boolean(result.local_time);
    document.getElementById("preview-sends-local").hidden = !local;
    document.querySelector("#preview-sends tbody").replaceChildren(...shown.map((send, i) => sq.el("tr", {},
      sq.el("td", { class: "num pos", "data-label": "#" }, i + 1),
      sq.el("td", { class: "card-title mono address", "data-label": "Recipient" }, send.email || ""),
      // the planned sender (or the From): who the recipient sees the email from
      sq.el("td", { class: "address", "data-label": "From", "data-field": "sender" }, send.sender || ""),
      sq.el("td", { "data-label": "Send at" }, sq.formatTime(send.send_at, zone)),
      local ? sq.el("td", { "data-label": "Recipient's time" }, sq.formatZoneTime(send.send_at, send.zone || zone))
        : null)));
    const more = document.getElementById("preview-sends-more");
    more.hidden = result.count <= shown.length;
    sq.setText(more, "… and " + Math.max(0, result.count - shown.length) + " more.");
    // a local-time plan: the sends per recipient zone, each in its own local days
    const zones = Array.isArray(result.zones) ? result.zones : [];
    const zoneBox = document.getElementById("preview-zones");
    zoneBox.hidden = zones.length < 2;
    document.querySelector("#preview-zones-table tbody").replaceChildren(...zones.map((z) => {
      const zoneDays = Array.isArray(z.days) ? z.days : [];
      const first = zoneDays.length ? zoneDays[0].first : "";
      const last = zoneDays.length ? zoneDays[zoneDays.length - 1].last : "";
      return sq.el("tr", { "data-zone": z.zone },
        sq.el("th", { scope: "row", class: "card-title" }, z.zone),
        sq.el("td", { class: "num", "data-label": "Emails" }, z.count),
        sq.el("td", { class: "num", "data-label": "Days" }, zoneDays.length),
        sq.el("td", { "data-label": "First (local)" }, sq.formatZoneTime(first, z.zone)),
        sq.el("td", { "data-label": "Last (local)" }, sq.formatZoneTime(last, z.zone)));
    }));
  }

  /** A sequence's expected emails per day and step (an estimate: no one answers). */
  function showSteps(result) {
    const steps = Array.isArray(result.steps) ? result.steps : [];
    const box = document.getElementById("preview-steps");
    box.hidden = steps.length < 2;
    const table = document.getElementById("preview-steps-table");
    if (box.hidden) {
      table.querySelector("thead tr").replaceChildren();
      table.querySelector("tbody").replaceChildren();
      return;
    }
    sq.setText(document.getElementById("preview-steps-note"), result.steps_note || "");
    const perDay = new Map();
    steps.forEach((step, i) => {
      for (const d of step.days || []) {
        if (!perDay.has(d.day)) {
          perDay.set(d.day, steps.map(() => 0));
        }
        perDay.get(d.day)[i] = d.count;
      }
    });
    table.querySelector("thead tr").replaceChildren(
      sq.el("th", { scope: "col" }, "Day"),
      ...steps.map((s) => sq.el("th", { scope: "col", class: "num" },
        "Step " + s.step + (s.after ? " (+" + s.after + ")" : ""))),
      sq.el("th", { scope: "col", class: "num" }, "All"));
    const days = Array.from(perDay.keys()).sort();
    table.querySelector("tbody").replaceChildren(...days.slice(0, 100).map((day) => {
      const counts = perDay.get(day);
      return sq.el("tr", { "data-day": day },
        sq.el("th", { scope: "row" }, day),
        ...counts.map((n) => sq.el("td", { class: "num" }, n)),
        sq.el("td", { class: "num" }, counts.reduce((a, b) => a + b, 0)));
    }));
  }

  const previewButton = document.getElementById("preview-button");
  const createButton = document.getElementById("create-button");

  async function submit(kind) {
    clearErrors();
    previewButton.disabled = true;
    createButton.disabled = true;
    sq.setText(status, kind === "preview" ? "Planning…" : "Creating…");
    try {
      if (kind === "preview") {
        const result = await sq.api("POST", "/api/campaigns/preview", body());
        showPreview(result);
        sq.setText(status, "Preview ready.");
      } else {
        const campaign = await sq.api("POST", "/api/campaigns", body());
        sq.setText(status, "Created; opening the campaign…");
        location.assign("/campaigns/" + encodeURIComponent(campaign.id));
        return;
      }
    } catch (exc) {
      sq.setText(status, "");
      showErrors(exc);
    }
    previewButton.disabled = false;
    createButton.disabled = false;
  }

  previewButton.addEventListener("click", () => submit("preview"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit("create");
  });
  renumberWindows();
})();
