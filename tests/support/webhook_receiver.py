"""A webhook receiver process for end-to-end tests.

Run as ``python -m tests.support.webhook_receiver --port P --secret whsec_... --log FILE
[--hang-first]``. It listens on 127.0.0.1:P (0: a free port), prints ``PORT <n>``, and for
every POST verifies the Standard Webhooks signature per the spec with hmac (the
``standardwebhooks`` package is not installed here): the signed content
``{webhook-id}.{webhook-timestamp}.{body}``, HMAC-SHA256 keyed with the base64-decoded secret
after ``whsec_``, one of the space-separated ``v1,<base64>`` signatures matching, and the
timestamp within 5 minutes. A verified delivery is appended to the log as one JSON line
(``{"id", "type", "ok": true}``, fsynced) and answered 204; a bad one is logged with
``"ok": false`` and answered 400. With ``--hang-first`` the first request is logged as
``{"hung": id}`` and never answered.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import http.server
import json
import os
import sys
import threading
import time

__all__ = ["verified"]


def verified(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Whether ``headers`` carry a valid signature of ``body`` by ``secret``."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    msg_id, timestamp = headers.get("webhook-id", ""), headers.get("webhook-timestamp", "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > 300:
        return False
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    expected = "v1," + base64.b64encode(digest).decode()
    return any(
        hmac.compare_digest(expected, s) for s in headers.get("webhook-signature", "").split()
    )


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
            write({"id": headers.get("webhook-id"), "type": document.get("type"), "ok": ok})
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
