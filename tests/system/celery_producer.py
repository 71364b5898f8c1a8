"""A Celery producer as users write one: send tasks, print when sent, and end.

``python -m tests.system.celery_producer N``: ``record.delay(0)`` when ``N`` is 1,
else ``N`` ``apply_async`` calls; then prints ``sent <time.time()>`` and returns
without closing anything, as scripts do (the app's connection is left to the
interpreter's exit). Settings from the environment, as ``celery_app`` reads them.
"""

from __future__ import annotations

import sys
import time

from tests.system.celery_app import record


def main(count: int) -> None:
    if count == 1:
        record.delay(0)
    else:
        for i in range(count):
            record.apply_async((i,))
    print(f"sent {time.time()}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
