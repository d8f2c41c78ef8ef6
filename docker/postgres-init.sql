-- Sluice's run-state store (SLUICE_STATE), beside Airflow's metadata in the same server.
CREATE DATABASE sluice_state OWNER airflow;
