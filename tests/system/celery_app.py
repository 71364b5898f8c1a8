"""The Celery app the Celery system test runs a worker of (ackbus as its broker).

Settings come from the environment: ``ACKBUS_URL`` (the broker's http URL, turned into
``ackbus://host:port//``) and ``CELERY_JOURNAL`` (a file each task appends its id to).
"""

from __future__ import annotations

import os
import time
import urllib.parse

from celery import Celery

import client.kombu_transport  # noqa: F401  (registers the ackbus:// scheme)

_url = urllib.parse.urlsplit(os.environ.get("ACKBUS_URL", "http://127.0.0.1:8080"))

app = Celery("ackbus_celery_test", broker=f"ackbus://{_url.hostname}:{_url.port}//")
app.conf.update(
    task_acks_late=True,  # ack after the task ran: a crash in between runs it again
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=4,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    broker_transport_options={"visibility_timeout": 60, "polling_timeout": 0.5},
    task_default_queue="ackbus-celery-test",
)


@app.task(name="record")
def record(i: int) -> int:
    """Append ``i`` to the journal (a task that ran twice shows up twice)."""
    time.sleep(0.01)  # the task's work: tasks overlap the worker's restarts
    with open(os.environ["CELERY_JOURNAL"], "a") as journal:
        journal.write(f"{i}\n")
    return i


@app.task(name="flaky", bind=True, max_retries=3)
def flaky(self, i: int) -> int:  # type: ignore[no-untyped-def]
    """Fails its first run, then succeeds on the retry (Celery's retry path)."""
    if self.request.retries == 0:
        raise self.retry(countdown=0.2)
    with open(os.environ["CELERY_JOURNAL"], "a") as journal:
        journal.write(f"retried-{i}\n")
    return i
