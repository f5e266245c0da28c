"""Verification: chains, saga invariants and the ledger, online and offline
(exports)."""
