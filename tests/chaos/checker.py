"""The checker of the fault test, over the whole history (:class:`History`):

- every confirmed publish delivered at least once (``lost`` must be 0). A lost message
  whose only ack was a duplicate's (``200``, ``routed: 0``) after every earlier attempt
  had been refused (nacked or returned, never unanswered) is counted apart, as
  ``lost_refused_then_deduplicated``: the broker remembered the message id of a
  publish it did not take, then acked the resend as a duplicate of it;
- a message delivered twice only as a marked redelivery (``duplicates_unmarked``);
- per publisher, first deliveries in publish order (``order_violations``);
- fencing tokens: each grant of the lock to a new owner carries a token above every
  earlier grant's (``fencing_violations``);
- never two leaders confirming in one epoch (``epoch_violations``): no two nodes ever
  said they lead the same epoch, and no node's commit offset moved forward (it
  confirmed) in an epoch after another node had been seen leading a later one — by
  then the older leader's lease had lapsed in etcd, so it must have stopped;
- the time from each fault that takes the leader away to the first confirm of a
  publish sent after it (``failover_p50_s``, ``failover_p99_s``; and the longest for
  each kind of fault).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from tests.chaos.nemesis import LEADER_FAULTS
from tests.chaos.workload import History

__all__ = ["check", "epoch_violations", "failovers", "fencing_violations", "refused_then_deduplicated", "table", "violations"]

Attempt = tuple[float, float, str, str, int, "str | None", "int | None", "str | None"]


def refused_then_deduplicated(body: str, attempts: Sequence[Attempt]) -> bool:
    """Whether ``body``'s ack was a duplicate's answer while every earlier attempt had
    been refused (so there was nothing for it to be a duplicate of)."""
    mine = sorted(a for a in attempts if a[2] == body)
    if not mine:
        return False
    *earlier, last = mine
    acked_as_duplicate = last[4] == 200 and last[5] == "ack" and last[6] == 0
    return acked_as_duplicate and bool(earlier) and all(a[4] in (404, 503) for a in earlier)


def fencing_violations(tokens: Sequence[tuple[float, str, int, str]]) -> list[str]:
    """Grants (in grant order) whose token is not above every earlier grant's."""
    found = []
    highest: tuple[int, str] | None = None
    for at, owner, token, node in sorted(tokens):
        if highest is not None and token <= highest[0]:
            found.append(f"{owner} got token {token} from {node} at {at:.3f} after {highest[1]} had {highest[0]}")
        if highest is None or token > highest[0]:
            highest = (token, owner)
    return found


def epoch_violations(samples: Sequence[tuple[float, str, str, int | None, int | None]]) -> list[str]:
    """Two nodes leading one epoch, or a node confirming after a later epoch's leader
    was seen (see the module docstring)."""
    found = []
    leaders: dict[int, set[str]] = {}
    for _t, node, role, epoch, _commit in samples:
        if role == "leader" and epoch is not None:
            leaders.setdefault(epoch, set()).add(node)
    for epoch, nodes in sorted(leaders.items()):
        if len(nodes) > 1:
            found.append(f"epoch {epoch} led by {sorted(nodes)}")
    # the first time each epoch was seen led
    first_seen: dict[int, tuple[float, str]] = {}
    for t, node, role, epoch, _commit in sorted(samples):
        if role == "leader" and epoch is not None and epoch not in first_seen:
            first_seen[epoch] = (t, node)
    last: dict[str, tuple[float, int | None, int | None]] = {}
    for t, node, role, epoch, commit in sorted(samples):
        prev = last.get(node)
        last[node] = (t, epoch, commit) if role == "leader" else (t, None, None)
        if prev is None or role != "leader" or epoch is None or commit is None:
            continue
        t_prev, epoch_prev, commit_prev = prev
        if epoch_prev != epoch or commit_prev is None or commit <= commit_prev:
            continue
        later = [(e, s) for e, s in first_seen.items() if e > epoch and s[0] <= t_prev and s[1] != node]
        if later:
            e, (seen_at, by) = min(later)
            found.append(
                f"{node} (epoch {epoch}) committed {commit_prev}->{commit} between {t_prev:.3f} and {t:.3f}, "
                f"after {by} was seen leading epoch {e} at {seen_at:.3f}"
            )
    return found


def failovers(history: History) -> list[tuple[str, float]]:
    """For each fault, its kind and the time from it to the first answer of a publish
    sent after it and taken (acked with ``routed`` 1: a confirm from whoever leads
    then; not one in flight at the fault, nor a duplicate's ack)."""
    taken = sorted((sent, answered) for sent, answered, _b, _n, status, confirm, routed, _r in history.attempt_log
                   if status == 200 and confirm == "ack" and routed)
    found = []
    for at, kind, _target in history.faults:
        later = [answered for sent, answered in taken if sent >= at]
        if later:
            found.append((kind, min(later) - at))
    return found


def check(history: History) -> dict[str, Any]:
    """The findings (see the module docstring)."""
    delivered: dict[str, list[bool]] = {}
    for _t, body, redelivered in history.deliveries:
        delivered.setdefault(body, []).append(redelivered)
    missing = sorted(b for b in history.confirmed if b not in delivered)
    refused_dedup = [b for b in missing if refused_then_deduplicated(b, history.attempt_log)]
    lost = [b for b in missing if b not in set(refused_dedup)]
    unmarked = sorted(b for b, flags in delivered.items() if len(flags) > 1 and not all(flags[1:]))
    marked = sum(len(flags) - 1 for flags in delivered.values() if len(flags) > 1 and all(flags[1:]))
    order_violations = 0
    last: dict[str, int] = {}
    for _t, body, redelivered in history.deliveries:
        if redelivered or "-" not in body:
            continue
        who, n = body.rsplit("-", 1)
        if int(n) < last.get(who, 0):
            order_violations += 1
        last[who] = max(last.get(who, 0), int(n))
    leader_times = sorted(t for kind, t in failovers(history) if kind in LEADER_FAULTS)
    by_kind_max: dict[str, float] = {}
    for kind, t in failovers(history):
        by_kind_max[kind] = round(max(t, by_kind_max.get(kind, 0.0)), 2)
    by_kind: dict[str, int] = {}
    for _at, kind, _target in history.faults:
        by_kind[kind] = by_kind.get(kind, 0) + 1
    fencing = fencing_violations(history.tokens)
    epochs = epoch_violations(history.replicas)
    return {
        "faults": dict(sorted(by_kind.items())),
        "faults_total": len(history.faults),
        "publish_attempts": history.attempts,
        "nacks_or_errors": history.nacks,
        "refusals": dict(sorted(history.refusals.items(), key=lambda kv: -kv[1])[:5]),
        "confirmed": len(history.confirmed),
        "abandoned": len(history.abandoned),
        "delivered_distinct": len(delivered),
        "lost": len(lost),
        "lost_examples": lost[:10],
        "lost_refused_then_deduplicated": len(refused_dedup),
        "lost_refused_then_deduplicated_examples": refused_dedup[:10],
        "redeliveries_marked": marked,
        "duplicates_unmarked": len(unmarked),
        "duplicates_unmarked_examples": unmarked[:10],
        "order_violations": order_violations,
        "lock_grants": len(history.tokens),
        "fencing_violations": len(fencing),
        "fencing_examples": fencing[:5],
        "epochs_led": len({e for _t, _n, role, e, _c in history.replicas if role == "leader"}),
        "epoch_violations": len(epochs),
        "epoch_examples": epochs[:5],
        "failover_p50_s": round(statistics.median(leader_times), 2) if leader_times else None,
        "failover_p99_s": round(_p99(leader_times), 2) if leader_times else None,
        "failover_max_s": round(max(leader_times), 2) if leader_times else None,
        "time_to_confirm_max_by_kind_s": dict(sorted(by_kind_max.items())),
    }


def violations(result: dict[str, Any]) -> list[str]:
    """The names of the checks that failed (empty: the run is clean)."""
    keys = ("lost", "lost_refused_then_deduplicated", "duplicates_unmarked", "order_violations", "fencing_violations", "epoch_violations")
    return [k for k in keys if result.get(k)]


def _p99(values: list[float]) -> float:
    return values[min(len(values) - 1, int(round(0.99 * (len(values) - 1))))]


def table(result: dict[str, Any]) -> str:
    """The findings as a two-column table."""
    width = max(len(k) for k in result)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in result.items())
