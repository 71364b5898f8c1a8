"""Publisher-confirm bookkeeping for one channel.

Rules (the contract of docs/protocol.md "Confirm guarantees"):

* every publish tag gets exactly one ack or nack;
* confirms leave in tag order: a tag is released only when every earlier tag has been
  released, so ``multiple: true`` ("every tag up to and including this one") is always
  truthful;
* an ack waits until the log record it depends on is durable (its LSN ≤ the durable
  LSN); tags that depend on nothing use LSN 0;
* runs of consecutive acks are coalesced into one ``multiple`` confirm;
* a tag may also wait for answers from elsewhere (``hold``: a publish forwarded to
  the queues' owners in a cluster, or refused by a full ``reject-publish-dlx`` queue
  whose dead letter the cluster is delivering; holds add up); it is released once
  each is in (``settle_hold``), as a nack if any of them refused;
* an ack whose LSN is held from outside (``Broker.hold_confirms``: a replicated
  queue's record waiting for a majority of its replicas) waits for that word too
  (``release``'s ``waiting``), or becomes a nack (``fail_held``).

The two holds are independent and may both apply to one tag (a publish reaching a
quorum queue led here and a queue on another node): its ack leaves once its record is
durable and every hold is released; a nack from any of them makes it a nack.
"""

from __future__ import annotations

from collections import deque

__all__ = ["ConfirmTracker"]


class ConfirmTracker:
    __slots__ = ("_pending", "_returns", "_holds")

    def __init__(self) -> None:
        # tag -> [answers still awaited, its pending item]
        self._holds: dict[int, list[object]] = {}
        # [tag, lsn, ack, reason] in tag order
        self._pending: deque[list[object]] = deque()
        # (tag, return effect) held back behind earlier confirms, in tag order
        self._returns: deque[tuple[int, object]] = deque()

    def hold_return(self, tag: int, effect: object) -> bool:
        """Keep the ``return`` of publish ``tag`` until the confirms of earlier tags
        are released (events keep the order of the publishes that caused them: a nack
        of tag 1 waiting on nothing but order comes before the return of tag 2).
        Returns False when nothing is pending before it: send it at once."""
        if not self._pending:
            return False
        self._returns.append((tag, effect))
        return True

    def take_returns(self, up_to_tag: int) -> list[object]:
        """The held returns of tags up to ``up_to_tag``: to be sent before the confirm
        that covers them."""
        out: list[object] = []
        returns = self._returns
        while returns and returns[0][0] <= up_to_tag:
            out.append(returns.popleft()[1])
        return out

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, tag: int, lsn: int, ack: bool = True, reason: str | None = None) -> None:
        self._pending.append([tag, lsn, ack, reason])

    def hold(self, tag: int, count: int) -> bool:
        """Tag ``tag`` (the last one added) waits for ``count`` more answers (on top
        of those it waits for already); False when it is not pending (a transaction
        holds the publish itself)."""
        if not (self._pending and self._pending[-1][0] == tag):
            return False
        if count > 0:
            held = self._holds.get(tag)
            if held is None:
                self._holds[tag] = [count, self._pending[-1]]
            else:
                awaited = held[0]
                assert isinstance(awaited, int)
                held[0] = awaited + count
        return True

    def settle_hold(self, tag: int, ack: bool, reason: str | None) -> bool:
        """One answer awaited by ``tag`` is in (a nack makes the tag a nack); returns
        whether the tag changed (False: not held, e.g. its channel ended)."""
        held = self._holds.get(tag)
        if held is None:
            return False
        count, item = held
        assert isinstance(count, int) and isinstance(item, list)
        if not ack and item[2]:
            item[2] = False
            item[3] = reason
        if count <= 1:
            del self._holds[tag]
        else:
            held[0] = count - 1
        return True

    def fail_lsns(self, first: int, last: int, reason: str) -> bool:
        """Turn every pending ack waiting on an LSN in [first, last] into a nack."""
        changed = False
        for item in self._pending:
            lsn = item[1]
            assert isinstance(lsn, int)
            if first <= lsn <= last:
                item[1] = 0
                item[2] = False
                item[3] = reason
                changed = True
        return changed

    def release(self, durable_lsn: int, waiting: set[int] | None = None) -> list[tuple[int, bool, bool, str | None]]:
        """Pop every confirm now releasable: (tag, multiple, ack, reason) tuples, in order.
        ``waiting``: LSNs whose acks also wait for an outside word (``Broker.hold_confirms``)."""
        out: list[tuple[int, bool, bool, str | None]] = []
        pending = self._pending
        run_tag = 0
        run_len = 0
        # A tag with a held return ends the run before it: its return goes out after
        # the confirms of every earlier tag and before its own (``take_returns``).
        held = iter([t for t, _ in self._returns])
        next_held = next(held, None)
        while pending:
            tag, lsn, ack, reason = pending[0]
            assert isinstance(lsn, int) and isinstance(tag, int)
            if (
                lsn > durable_lsn
                or (self._holds and tag in self._holds)
                or (waiting and ack and lsn in waiting)
            ):
                break
            pending.popleft()
            while next_held is not None and next_held < tag:
                next_held = next(held, None)
            if next_held == tag and run_len:
                out.append((run_tag, run_len > 1, True, None))
                run_len = 0
            if ack:
                run_tag = tag
                run_len += 1
            else:
                if run_len:
                    out.append((run_tag, run_len > 1, True, None))
                    run_len = 0
                out.append((tag, False, False, reason if isinstance(reason, str) else None))
        if run_len:
            out.append((run_tag, run_len > 1, True, None))
        return out

    def fail_held(self, lsns: set[int], reason: str) -> bool:
        """Turn every pending ack waiting on an LSN in ``lsns`` into a nack."""
        changed = False
        for item in self._pending:
            if item[1] in lsns and item[2]:
                item[1] = 0
                item[2] = False
                item[3] = reason
                changed = True
        return changed

    def nack_all(self, reason: str) -> list[tuple[int, bool, bool, str | None]]:
        """Release everything pending as nacks (used when a channel ends)."""
        out: list[tuple[int, bool, bool, str | None]] = [
            (int(item[0]), False, False, reason) for item in self._pending  # type: ignore[call-overload]
        ]
        self._pending.clear()
        self._returns.clear()
        self._holds.clear()
        return out
