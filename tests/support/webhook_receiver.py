"""A webhook receiver process for end-to-end tests.

Run as ``python -m tests.support.webhook_receiver --port P --secret whsec_... --log FILE
[--hang-first]``. It listens on 127.0.0.1:P (0: a free port), prints ``PORT <n>``, and for
every POST verifies the Standard Webhooks signature with the ``standardwebhooks`` library,
as a receiver would (the timestamp within 5 minutes, one of the ``v1,`` signatures matching
``{webhook-id}.{webhook-timestamp}.{body}``). A verified delivery is appended to the log as
one JSON line (``{"id", "type", "data", "ok": true}``: the event's id, type and ``data``,
fsynced) and answered 204; a bad one is logged with ``"ok": false`` and answered 400. With
``--hang-first`` the first request is logged as ``{"hung": id}`` and never answered.

:class:`tests.support.webhook_e2e.Receiver` is a test's handle on this process.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sys
import threading

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

__all__ = ["verified"]


def verified(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Whether ``headers`` carry a valid signature of ``body`` by ``secret``."""
    try:
        Webhook(secret).verify(body, headers, json_parse=False)
    except WebhookVerificationError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--hang-first", action="store_true")
    args = parser.parse_args()
    lock = threading.Lock()
    hang = [args.hang_first]

    def write(record: dict[str, object]) -> None:
        with lock, open(args.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            with lock:
                hung, hang[0] = hang[0], False
            if hung:
                write({"hung": headers.get("webhook-id")})
                threading.Event().wait()
            ok = verified(args.secret, headers, body)
            document = json.loads(body) if ok else {}
            write(
                {
                    "id": headers.get("webhook-id"),
                    "type": document.get("type"),
                    "data": document.get("data"),
                    "ok": ok,
                }
            )
            self.send_response(204 if ok else 400)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    http.server.ThreadingHTTPServer.allow_reuse_address = True
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    sys.stdout.write(f"PORT {server.server_address[1]}\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
