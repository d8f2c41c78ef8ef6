"""Airflow DAGs for every Sluice pipeline spec in pipelines/ (adding a spec adds its DAGs).

Kept thin on purpose: the DAG factory lives in ``sluice.airflow.dags`` and reads the specs;
nothing heavy (no pyspark) is imported when the scheduler parses this file.
"""

from sluice.airflow.dags import build_dags

globals().update(build_dags())
