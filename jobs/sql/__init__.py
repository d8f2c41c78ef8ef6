"""SQL on the tables: the in-process session for `sluice sql`, the catalog's tables, and the
Thrift server's settings for the endpoint."""
