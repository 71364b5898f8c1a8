"""The Celery app of the AMQP Celery system test: ackbus as its broker through Celery's
default transport (``amqp://``, kombu on py-amqp), nothing ackbus-specific.

``ACKBUS_AMQP_URL`` names the broker, ``CELERY_JOURNAL`` a file each task appends to.
"""

from __future__ import annotations

import os
import time

from celery import Celery

app = Celery("ackbus_celery_amqp_test", broker=os.environ.get("ACKBUS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_acks_late=True,  # ack after the task ran: a crash in between runs it again
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=4,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    task_default_queue="ackbus-celery-amqp-test",
)


@app.task(name="record")
def record(i: int) -> int:
    """Append ``i`` to the journal (a task that ran twice shows up twice)."""
    time.sleep(0.01)
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
