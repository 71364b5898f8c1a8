"""ackbus client library (trio)."""
