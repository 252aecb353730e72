"""Reliability and security suite (issue 11): fault injection, resume, idempotency, secrets.

One file per case, all on real components (real ingestion + Great Expectations, real
LanceDB, real TextWorld, the real CLI and MLflow; the only fake is the local
OpenAI-compatible server of tests/fakes):

1. test_bad_input.py         malformed corpus (corpus.py): ingested or quarantined, counts add up
2. test_crash_resume.py      kill -9 of annotation (CLI) and of buffer ingest, then resume
                             (collection: tests/integration/test_collect.py, test_env_faults.py)
3. test_idempotency.py       ingest / annotate / build_buffer stages twice: identical outputs
4. test_api_faults.py        fault storm on the teacher: retries, backoff, budget, server gone
5. test_model_output_faults.py  adversarial experience-model answers counted by reason
6. test_env_faults.py        the TextWorld engine (or its host process) dies mid-episode
7. test_secrets.py           a sentinel API key appears in no file, log or MLflow record
8. test_concurrency.py       two processes appending to one buffer lose nothing

Run: ``.venv/bin/pytest tests/reliability -q -s`` (``-s`` prints each case's counts).
"""
