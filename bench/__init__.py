"""The ackbus benchmark harness (``scripts/bench``, ``python -m bench``).

It benchmarks ackbus and, with ``--peer rabbitmq``, ``redis`` or ``rabbitmq,redis``, a
private RabbitMQ node and/or redis-server on the same machine in the same invocation
(and with ``--peer null --amqp`` the null AMQP peer, pika's ceiling),
alternating them for every round of every workload, and prints each figure's median,
min and max and the ackbus/peer ratio per peer.
The method is described in ``docs/benchmarks.md``.

Layout:

- ``cli``: options, the run loop (workload × round × side), progress line, results.
- ``params``: the workload sizes, full and ``--quick``.
- ``workloads``: what each workload does to a server, which figures it yields, and
  its time budget.
- ``servers``: start, crash (``kill -9``) and stop the brokers, by PID;
  ``server_redis``: the same for redis-server; ``server_nullamqp``: for the null AMQP
  peer, whose process is ``nullamqp`` (an AMQP server that does no broker work; what it
  keeps: ``nullamqp_state``).
- ``procs``: client worker processes with a ready/go handshake, under timeouts.
- ``worker_ackbus`` / ``worker_rabbitmq`` / ``worker_redis``: the client side of each
  workload, one process each (ackbus's own client library; pika for RabbitMQ;
  redis-py with hiredis for Redis).
- ``growth``: the growth-with-work workloads (fan-out to 1…1,000 queues, 1…100
  publisher channels, memory and recovery at 1M and 10M queued), registered in
  ``workloads``.
- ``profile``: ``python -m bench.profile``, the CPU time per message of the broker
  and of one client, and with ``--sample`` (py-spy) where it goes, per hop.
- ``stats``: percentiles, summaries and the table. ``plot``: the chart;
  ``plot_growth``: the growth chart beside it.

The suite's smoke test of the harness is ``tests/bench/test_bench_smoke.py``.
"""
