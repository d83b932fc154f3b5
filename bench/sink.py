"""An SMTP sink in its own process: ``python -m bench.sink PORT`` accepts every message on
127.0.0.1:PORT, prints ``ready`` once it listens, and runs until terminated."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from aiosmtpd.controller import Controller


class _Accept:
    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        return "250 OK"


def main() -> None:
    port = int(sys.argv[1])
    controller = Controller(_Accept(), hostname="127.0.0.1", port=port)
    controller.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        controller.stop()


if __name__ == "__main__":
    main()
