"""Prefect flows: thin wiring of DVC stages; no method logic lives here."""
