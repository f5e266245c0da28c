"""The log: canonical bytes, hash chains, streams, the append script, the ledger
and the event store that keeps a saga's projection in step with its chain."""
