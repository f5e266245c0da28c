"""On the way to a worker: RQ jobs, intents and idempotency keys."""
