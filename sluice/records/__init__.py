"""What runs leave on disk, read without Spark: the driver record and the job's status,
batch audits, backfill plans, validation reports, a checkpoint's commit log, a Parquet
table's log, and the claims a driver holds. The jobs write them; the front ends read them."""
