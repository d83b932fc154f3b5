/* The campaign page's live feed: the event stream, and the polling that stands in for it.
 *
 * An EventSource on /api/campaigns/{id}/events hands each change to the page, which patches
 * its rows and schedules a (throttled) refetch of the counts and the visible page. While the
 * campaign has Pending or Running emails the page also refetches in the background: every 30 s
 * while the stream is live (SENDQUEUE_UI_REFETCH_INTERVAL; a change the stream missed shows
 * within that), every 5 s (SENDQUEUE_UI_POLL_INTERVAL) while it is delayed or down. The server
 * says "delayed" in a `status` event when its change-log reader fails or falls behind the
 * store; a ping only proves the connection, never that changes still arrive. When the stream
 * errors, or is silent for longer than the heartbeat allows, the feed keeps trying to reopen
 * it with backoff. The indicator (#connection[data-connection]) says which: connecting, live,
 * delayed, polling (the stream is down) or idle (down, and nothing in flight to poll).
 */
(function () {
  "use strict";

  const sq = window.sq;
  if (!sq) {
    return;
  }

  const STALE_MS = 20000; // the server pings every 15 s (docs/api.md)
  const BACKOFF_MIN_MS = 1000;
  const BACKOFF_MAX_MS = 10000;

  /**
   * Open the feed of ``eventsUrl`` after the event id ``lastEventId``; ``start()`` connects.
   * The page's callbacks: ``refresh()`` refetches now, ``refreshSoon()`` when a burst settles,
   * ``active()`` says whether emails are in flight, ``onChange(event, eventId)`` applies a
   * change event. ``refetchMs`` and ``pollMs`` are the refetch periods while live and while
   * delayed or down.
   */
  sq.liveFeed = function ({ eventsUrl, lastEventId, refetchMs, pollMs, refresh, refreshSoon, active, onChange }) {
    const indicator = document.getElementById("connection");
    let source = null;
    let lastHeard = 0;
    let backoff = BACKOFF_MIN_MS;
    let reconnectTimer = null;
    let pollTimer = null;
    let pollEvery = null; // the period pollTimer was set for
    let serverDelayed = false; // the last status event said "delayed"
    const every = Math.round(pollMs / 100) / 10 + " s";
    const LABELS = {
      connecting: "Connecting…",
      live: "Live",
      delayed: "Delayed: live updates are behind; refreshing every " + every,
      polling: "Polling every " + every + " (live updates interrupted)",
      idle: "Not live; nothing in flight to poll",
    };

    function setMode(mode) {
      if (indicator.dataset.connection !== mode) {
        indicator.dataset.connection = mode;
        sq.setText(document.getElementById("connection-text"), LABELS[mode]);
      }
      schedulePoll();
    }

    /** How often to refetch now: never with nothing in flight (nor before the stream opened). */
    function pollPeriod() {
      const mode = indicator.dataset.connection;
      if (!active() || mode === "connecting" || mode === "idle") {
        return null;
      }
      return mode === "live" ? refetchMs : pollMs;
    }

    /** Keep one refetch timer at the period the mode asks for (a running one keeps its beat). */
    function schedulePoll() {
      const period = pollPeriod();
      if (pollTimer !== null && period === pollEvery) {
        return;
      }
      stopPolling();
      pollEvery = period;
      if (period !== null) {
        pollTimer = setTimeout(() => {
          pollTimer = null;
          refresh();
        }, period);
      }
    }

    function heard() {
      lastHeard = Date.now();
    }

    function connect() {
      reconnectTimer = null;
      if (source) {
        source.close();
      }
      const es = new EventSource(eventsUrl + "?after=" + encodeURIComponent(String(lastEventId)));
      source = es;
      heard();
      es.addEventListener("open", () => {
        if (source !== es) {
          return;
        }
        heard();
        backoff = BACKOFF_MIN_MS;
        // the stream's first frame says whether the server is delayed; until then, as it was
        setMode(serverDelayed ? "delayed" : "live");
        refreshSoon(); // catch up with whatever changed while we were away
      });
      es.addEventListener("ping", () => {
        // the connection is open; that says nothing of the changes, so the mode stays
        if (source === es) {
          heard();
        }
      });
      es.addEventListener("status", (event) => {
        if (source === es) {
          heard();
          onStatus(event);
        }
      });
      es.addEventListener("change", (event) => {
        if (source === es) {
          heard();
          const eventId = Number(event.lastEventId);
          if (eventId > lastEventId) {
            lastEventId = eventId;
          }
          onChange(event, eventId);
        }
      });
      es.addEventListener("error", () => {
        if (source === es) {
          streamDown();
        }
      });
    }

    /** The stream failed or went stale: close it, fall back, and try again later. */
    function streamDown() {
      if (source) {
        source.close();
        source = null;
      }
      fallback();
      if (reconnectTimer === null) {
        const wait = backoff + Math.floor(Math.random() * 250);
        backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
        reconnectTimer = setTimeout(connect, wait);
      }
    }

    /** Without an open stream, poll while emails are in flight, else sit idle; with one, keep
     * the mode the stream set, at the period it asks for. */
    function fallback() {
      const mode = indicator.dataset.connection;
      if (source && (mode === "live" || mode === "delayed" || mode === "connecting")) {
        schedulePoll();
        return;
      }
      setMode(active() ? "polling" : "idle");
    }

    function stopPolling() {
      if (pollTimer !== null) {
        clearTimeout(pollTimer);
        pollTimer = null;
      }
      pollEvery = null;
    }

    /** The server's word on its change-log reader: "delayed" (poll) or "live" again. */
    function onStatus(event) {
      let data;
      try {
        data = JSON.parse(event.data);
      } catch (exc) {
        return;
      }
      serverDelayed = data.state === "delayed";
      const mode = indicator.dataset.connection;
      if (serverDelayed) {
        indicator.setAttribute("title", data.reason || "");
        setMode("delayed");
      } else {
        indicator.removeAttribute("title");
        setMode("live");
        if (mode === "delayed") {
          refreshSoon(); // what the delay held back
        }
      }
    }

    function start() {
      // a stream that says nothing past the heartbeat is as good as gone
      setInterval(() => {
        if (source && Date.now() - lastHeard > STALE_MS) {
          streamDown();
        }
      }, 1000);
      connect();
    }

    return { start, fallback, lastEventId: () => lastEventId };
  };
})();
