"""The fault test of quorum queues (``scripts/chaos``): harness.py."""
