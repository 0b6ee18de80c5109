"""Proof before publishing: the invariants, their digests and row checks, and run digests."""
