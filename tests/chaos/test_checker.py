"""The checker's fencing, epoch and refused-then-deduplicated rules on small made-up
histories (fast: no cluster)."""

from __future__ import annotations

from tests.chaos.checker import (
    epoch_violations,
    fencing_violations,
    refused_then_deduplicated,
)


def test_fencing_tokens_must_grow_from_grant_to_grant() -> None:
    assert fencing_violations([(1.0, "a", 10, "n1"), (2.0, "b", 12, "n2"), (3.0, "c", 30, "n1")]) == []
    found = fencing_violations([(1.0, "a", 10, "n1"), (2.0, "b", 12, "n2"), (3.0, "c", 12, "n3"), (4.0, "d", 11, "n1")])
    assert len(found) == 2 and "c got token 12" in found[0] and "d got token 11" in found[1]


def test_two_nodes_leading_one_epoch_is_a_violation() -> None:
    samples = [(1.0, "n1", "leader", 5, 10), (1.1, "n2", "leader", 5, 10), (1.2, "n3", "follower", 5, None)]
    assert epoch_violations(samples) == ["epoch 5 led by ['n1', 'n2']"]


def test_a_leader_committing_after_a_later_epoch_was_led_is_a_violation() -> None:
    clean = [
        (1.0, "n1", "leader", 5, 10), (2.0, "n1", "leader", 5, 20),  # commits in epoch 5
        (3.0, "n2", "leader", 9, 21),  # epoch 9 led from 3.0
        (4.0, "n1", "leader", 5, 20), (5.0, "n1", "follower", 9, None),  # n1 stale, no commit
    ]
    assert epoch_violations(clean) == []
    dirty = [*clean[:4], (4.5, "n1", "leader", 5, 25)]  # n1's commit moved after 3.0
    found = epoch_violations(dirty)
    assert len(found) == 1 and "n1 (epoch 5) committed 20->25" in found[0] and "epoch 9" in found[0]


def test_an_ack_as_duplicate_of_refused_attempts_is_told_apart() -> None:
    refused = [(1.0, 1.1, "p0-1", "n1", 503, "nack", None, "no quorum"), (1.2, 1.3, "p0-1", "n1", 200, "ack", 0, None)]
    assert refused_then_deduplicated("p0-1", refused)
    returned = [(1.0, 1.1, "p0-2", "n1", 404, "ack", 0, "no_route"), (1.2, 1.3, "p0-2", "n1", 200, "ack", 0, None)]
    assert refused_then_deduplicated("p0-2", returned)
    # an unanswered attempt may have been taken: a duplicate's ack is then rightful
    unanswered = [(1.0, 11.0, "p0-3", "n1", 0, None, None, None), (11.1, 11.2, "p0-3", "n2", 200, "ack", 0, None)]
    assert not refused_then_deduplicated("p0-3", unanswered)
    taken = [(1.0, 1.1, "p0-4", "n1", 200, "ack", 1, None)]
    assert not refused_then_deduplicated("p0-4", taken)
