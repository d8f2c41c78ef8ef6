"""The Spark side of Sluice: jobs that spark-submit runs (``jobs/ingest.py``).

Importing this package is cheap; the modules in it import pyspark.
"""
