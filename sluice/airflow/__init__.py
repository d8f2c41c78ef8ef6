"""The Airflow front end: the DAG factory, the trigger forms, the environment Airflow runs
in, and the only module that touches the Spark provider (:mod:`sluice.airflow.target`)."""
