/* sendqueue UI: helpers every page uses (window.sq).
 *
 * Rule of the house: data reaches the DOM only through textContent and attributes set one by
 * one (createElement / createElementNS); never innerHTML. The CSP forbids inline scripts and
 * styles, so there is no style attribute either: geometry lives in SVG attributes.
 */
(function () {
  "use strict";

  const sq = {};
  window.sq = sq;

  /** The double-submit CSRF token: the sq_csrf cookie, else the page's <meta>. */
  sq.csrfToken = function () {
    for (const part of document.cookie.split(";")) {
      const [key, ...rest] = part.trim().split("=");
      if (key === "sq_csrf" && rest.length) {
        return decodeURIComponent(rest.join("="));
      }
    }
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  };

  /** An error the API answered with (docs/api.md, "Errors"), or a network failure. */
  class ApiError extends Error {
    constructor(status, detail) {
      super((detail && detail.message) || (status ? "HTTP " + status : "the server cannot be reached"));
      this.status = status;
      this.detail = detail || {};
    }
  }
  sq.ApiError = ApiError;

  /**
   * Call the JSON API. ``body`` may be a FormData (sent as multipart) or a plain object (JSON).
   * Resolves with the parsed JSON; rejects with an ApiError. A 401 sends the user to /login.
   */
  sq.api = async function (method, url, body) {
    const headers = { Accept: "application/json" };
    const init = { method: method, headers: headers, credentials: "same-origin", cache: "no-store" };
    if (method !== "GET" && method !== "HEAD") {
      headers["X-CSRF-Token"] = sq.csrfToken();
    }
    if (body instanceof FormData) {
      init.body = body;
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(url, init);
    } catch (exc) {
      throw new ApiError(0, { message: "the server cannot be reached" });
    }
    let data = null;
    const type = response.headers.get("Content-Type") || "";
    if (type.includes("application/json")) {
      try {
        data = await response.json();
      } catch (exc) {
        data = null;
      }
    }
    if (response.status === 401) {
      const next = location.pathname + location.search;
      location.assign("/login?next=" + encodeURIComponent(next));
      throw new ApiError(401, { message: "log in first" });
    }
    if (!response.ok) {
      const detail = data && data.error ? data.error : { message: "HTTP " + response.status };
      if (!detail.status) {
        detail.status = response.status;
      }
      throw new ApiError(response.status, detail);
    }
    return data;
  };

  /** createElement with attributes and text children (strings become text nodes). */
  sq.el = function (tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) {
        continue;
      }
      node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) {
        continue;
      }
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  };

  const SVG_NS = "http://www.w3.org/2000/svg";
  sq.svg = function (tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      node.setAttribute(key, String(value));
    }
    if (text !== undefined) {
      node.textContent = String(text);
    }
    return node;
  };

  /** Set text only when it changed, so observers see real changes only. */
  sq.setText = function (node, text) {
    const value = text === null || text === undefined ? "" : String(text);
    if (node && node.textContent !== value) {
      node.textContent = value;
    }
  };

  /**
   * ``count`` and ``word``, plural unless the count is 1: sq.plural(2, "email") is "2 emails".
   * ``many`` is an irregular plural ("addresses"). The pages' templates use the same helper
   * (sendqueue.domain.wording.plural, their ``plural`` filter).
   */
  sq.plural = function (count, word, many) {
    return count + " " + (Math.abs(count) === 1 ? word : many || word + "s");
  };

  const formatters = new Map();
  /** The parts of ``date`` on the wall clock of ``timeZone`` (UTC for a zone Intl lacks). */
  function wallClock(date, timeZone) {
    let fmt = formatters.get(timeZone);
    if (!fmt) {
      const options = {
        hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
        hour: "2-digit", minute: "2-digit", second: "2-digit",
      };
      try {
        fmt = new Intl.DateTimeFormat("en-GB", Object.assign({ timeZone: timeZone }, options));
      } catch (exc) {
        fmt = new Intl.DateTimeFormat("en-GB", Object.assign({ timeZone: "UTC" }, options));
      }
      formatters.set(timeZone, fmt);
    }
    const p = {};
    for (const part of fmt.formatToParts(date)) {
      p[part.type] = part.value;
    }
    return p;
  }

  function parseInstant(isoValue) {
    if (!isoValue) {
      return null;
    }
    const date = new Date(isoValue);
    return Number.isNaN(date.getTime()) ? null : date;
  }

  // The zones' abbreviations by UTC offset in minutes, from the page (times.py, zone_names)
  // and from API answers that carry them (a preview's zone_names).
  const zoneNames = {};
  try {
    Object.assign(zoneNames, JSON.parse(document.body.dataset.zoneNames || "{}"));
  } catch (exc) {
    // a page without the table: times fall back to their UTC offset
  }
  /** Learn more zones' abbreviations ({zone: {offset: name}}). */
  sq.addZoneNames = function (names) {
    Object.assign(zoneNames, names || {});
  };

  function offsetName(minutes) {
    const sign = minutes < 0 ? "-" : "+";
    const abs = Math.abs(minutes);
    return "UTC" + sign + String(Math.floor(abs / 60)).padStart(2, "0") + ":" + String(abs % 60).padStart(2, "0");
  }

  /**
   * "2026-12-04 09:30 CET": an ISO instant on the wall clock of ``timeZone`` with the zone's
   * abbreviation at that instant; times.py (human_time) writes the same. "" for no instant.
   */
  sq.formatTime = function (isoValue, timeZone) {
    const date = parseInstant(isoValue);
    if (!date) {
      return "";
    }
    const p = wallClock(date, timeZone);
    const wall = Date.UTC(Number(p.year), Number(p.month) - 1, Number(p.day), Number(p.hour),
      Number(p.minute), Number(p.second));
    const offset = Math.round((wall - Math.floor(date.getTime() / 1000) * 1000) / 60000);
    const known = zoneNames[timeZone] || {};
    const name = known[String(offset)] || offsetName(offset);
    return p.year + "-" + p.month + "-" + p.day + " " + p.hour + ":" + p.minute + " " + name;
  };

  /** "2026-12-05 01:30 Asia/Tokyo": a recipient's own time, named by its zone (times.py,
   * zone_time). */
  sq.formatZoneTime = function (isoValue, timeZone) {
    const date = parseInstant(isoValue);
    if (!date) {
      return "";
    }
    const p = wallClock(date, timeZone);
    return p.year + "-" + p.month + "-" + p.day + " " + p.hour + ":" + p.minute + " " + timeZone;
  };

  // The day chart. Geometry mirrors pages.py (day_chart); keep both in step.
  const CHART = { maxBars: 60, slot: 32, bar: 22, left: 44, right: 8, top: 12, plot: 120, bottom: 28 };

  /** Draw planned/done bars per day into ``svg`` from rows {day, planned, done}. */
  sq.drawDayChart = function (svg, rows) {
    const size = Math.max(1, Math.ceil(rows.length / CHART.maxBars));
    const buckets = [];
    for (let start = 0; start < rows.length; start += size) {
      const chunk = rows.slice(start, start + size);
      buckets.push({
        first: String(chunk[0].day),
        last: String(chunk[chunk.length - 1].day),
        planned: chunk.reduce((n, r) => n + Number(r.planned || 0), 0),
        done: chunk.reduce((n, r) => n + Number(r.done || 0), 0),
      });
    }
    const peak = Math.max(1, ...buckets.map((b) => Math.max(b.planned, b.done)));
    const baseline = CHART.top + CHART.plot;
    const width = CHART.left + buckets.length * CHART.slot + CHART.right;
    const height = CHART.top + CHART.plot + CHART.bottom;
    const labelY = height - 10;
    const planned = buckets.reduce((n, b) => n + b.planned, 0);
    const done = buckets.reduce((n, b) => n + b.done, 0);
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.setAttribute("width", String(width));
    svg.setAttribute("height", String(height));
    const label = svg.getAttribute("data-chart-label") || "Emails per day";
    svg.setAttribute("aria-label", label + ": " + planned + " planned and " + done +
      " sent over " + sq.plural(buckets.length, "bar"));
    const nodes = [];
    if (buckets.length) {
      nodes.push(sq.svg("line", {
        class: "axis", x1: CHART.left, y1: baseline, x2: CHART.left + buckets.length * CHART.slot, y2: baseline,
      }));
      nodes.push(sq.svg("text", { class: "tick", x: CHART.left - 6, y: CHART.top + 4, "text-anchor": "end" }, peak));
      nodes.push(sq.svg("text", { class: "tick", x: CHART.left - 6, y: baseline, "text-anchor": "end" }, 0));
      buckets.forEach((b, i) => {
        const x = CHART.left + i * CHART.slot + Math.floor((CHART.slot - CHART.bar) / 2);
        const plannedH = Math.floor((b.planned * CHART.plot) / peak);
        const doneH = Math.floor((b.done * CHART.plot) / peak);
        const span = b.first === b.last ? b.first : b.first + " to " + b.last;
        const g = sq.svg("g", { class: "day" });
        g.append(sq.svg("title", {}, span + ": " + b.planned + " planned, " + b.done + " sent"));
        g.append(sq.svg("rect", { class: "bar-planned", x: x, y: baseline - plannedH, width: CHART.bar, height: plannedH }));
        g.append(sq.svg("rect", { class: "bar-done", x: x, y: baseline - doneH, width: CHART.bar, height: doneH }));
        g.append(sq.svg("text", {
          class: "day-label", x: x + Math.floor(CHART.bar / 2), y: labelY, "text-anchor": "middle",
        }, b.first.slice(5)));
        nodes.push(g);
      });
    } else {
      nodes.push(sq.svg("text", { class: "tick", x: CHART.left, y: baseline - 50 }, "No sends planned"));
    }
    svg.replaceChildren(...nodes);
  };

  /** Update a progress widget (macros.html: progress) from counts per state. */
  sq.updateProgress = function (widget, counts, total) {
    if (!widget) {
      return;
    }
    const final = (counts.Finished || 0) + (counts.Failed || 0) + (counts.Cancelled || 0);
    const percent = total ? Math.floor((final * 100) / total) : 0;
    let x = 0;
    for (const state of ["Finished", "Failed", "Cancelled", "Running"]) {
      const width = total > 0 ? Math.floor(((counts[state] || 0) * 1000) / total) : 0;
      const rect = widget.querySelector('[data-seg="' + state + '"]');
      if (rect) {
        rect.setAttribute("x", String(x));
        rect.setAttribute("width", String(width));
      }
      x += width;
    }
    widget.setAttribute("aria-valuemax", String(total));
    widget.setAttribute("aria-valuenow", String(final));
    widget.setAttribute("aria-valuetext", final + " of " + total + " done (" + percent + "%)");
    sq.setText(widget.querySelector("[data-progress-text]"), final + " / " + total + " (" + percent + "%)");
  };

  /** A state badge, as macros.html renders it. */
  sq.badge = function (state) {
    return sq.el("span", { class: "badge state-" + String(state).toLowerCase() }, state);
  };

  /**
   * Ask before something that cannot be undone. Uses the shared <dialog> (modal: focus stays
   * inside, Escape cancels). Resolves true when the user confirmed.
   */
  sq.confirm = function (message, confirmLabel) {
    const dialog = document.getElementById("confirm-dialog");
    if (!dialog || typeof dialog.showModal !== "function") {
      return Promise.resolve(window.confirm(message));
    }
    sq.setText(document.getElementById("confirm-message"), message);
    sq.setText(document.getElementById("confirm-ok"), confirmLabel || "Confirm");
    dialog.returnValue = "";
    return new Promise((resolve) => {
      const opener = document.activeElement;
      const form = dialog.querySelector("form");
      // This opening's answer, taken when it is given (the form's submit, Escape's cancel):
      // the close event comes later, queued, and input can overtake it, so a close still
      // queued from the opening before this one can arrive while this one is open.
      let answer = null;
      const onSubmit = (event) => {
        answer = event.submitter ? event.submitter.value : "";
      };
      const onCancel = () => {
        answer = "cancel";
      };
      const onClose = () => {
        if (answer === null && dialog.open) {
          return; // an earlier opening's close: not ours
        }
        form.removeEventListener("submit", onSubmit);
        dialog.removeEventListener("cancel", onCancel);
        dialog.removeEventListener("close", onClose);
        if (opener && typeof opener.focus === "function" && document.contains(opener)) {
          opener.focus();
        }
        resolve(answer === "confirm");
      };
      form.addEventListener("submit", onSubmit);
      dialog.addEventListener("cancel", onCancel);
      dialog.addEventListener("close", onClose);
      dialog.showModal();
    });
  };

  /** Show (or hide, with an empty message) an inline error box. */
  sq.showError = function (node, message) {
    if (!node) {
      return;
    }
    sq.setText(node, message || "");
    node.hidden = !message;
  };
})();
