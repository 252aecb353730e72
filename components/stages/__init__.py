"""Stage bodies behind ``dreamgym <stage>``, one module per stage family.

Each function is one DVC stage: it reads only its params sections and declared inputs,
writes its declared outputs and metrics, and records one MLflow run.
"""
