"""Ad-hoc SQL on the pipelines' tables: the catalog they are registered in, the JDBC/ODBC
endpoint (Spark's Thrift server) that serves it, and the client ``sluice sql`` uses.

Pure Python: the Spark side of it is ``jobs/sql_endpoint.py`` and ``jobs/sql/catalog.py``.
"""
