"""Sluice: Kafka JSON events to date-partitioned Delta/Parquet tables, run by Airflow.

This package is the pure-Python side shared by the Airflow DAGs (``dags/``) and the
Spark jobs (``jobs/``): the pipeline spec, schemas, the embedded broker, producers and
the ``sluice`` command. It never imports pyspark at module level.
"""

__version__ = "0.1.0"
