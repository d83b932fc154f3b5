"""A real process that provisions one campaign, for the concurrency tests of sender booking.

Run as ``python -m tests.support.provision_proc CAMPAIGN_ID START_AT CHUNK``; settings come
from the SENDQUEUE_* environment. It waits until the wall clock reaches ``START_AT`` (epoch
seconds, so two processes begin together), provisions in chunks of ``CHUNK`` recipients and
prints the report as one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, replace

from sendqueue.bootstrap import bootstrap
from sendqueue.settings import Settings


def main() -> None:
    campaign_id, start_at, chunk = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    app = bootstrap(Settings())
    app.config = replace(app.config, provision_chunk=chunk)
    try:
        app.store.get_campaign(campaign_id)  # connect before the start line
        time.sleep(max(0.0, start_at - time.time()))
        report = app.provisioner.provision(campaign_id)
        print(json.dumps(asdict(report)), flush=True)
    finally:
        app.close()


if __name__ == "__main__":
    main()
