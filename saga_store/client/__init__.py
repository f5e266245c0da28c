"""The client API: ``SagaStore``, caller-driven sagas and context sync."""
