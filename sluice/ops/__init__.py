"""Every user action, written once: start, stop, restart, supervise, status, backfill,
validate and publish. The CLI and the Airflow DAGs only translate arguments and errors."""
