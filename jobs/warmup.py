"""The job whose classes become the drivers' class-data archive (sluice.ops.cds).

What a Sluice batch does, on a few rows and without a broker: JSON parsed with ``from_json``
and as a VARIANT, nested fields flattened, a date partition, idempotent Delta appends from a
stream's ``foreachBatch`` with observed metrics, a Parquet table, and reading both back. The
classes it loads are the ones every driver loads before its first batch; what it misses
loads as before. Run by ``python -m sluice.ops.cds``, with the folder to write in.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

SCHEMA = "id string, at timestamp, device struct<kind: string, level: double>, tags array<string>"


def main(folder: Path) -> None:
    spark = SparkSession.builder.getOrCreate()
    rows = [
        (f'{{"id": "e{i}", "at": "2024-05-0{i % 9 + 1}T10:00:00Z", "device": {{"kind": "k", "level": {i}}}}}',)
        for i in range(20)
    ]
    spark.createDataFrame(rows, "value string").write.text(str(folder / "in"))

    def write(batch: DataFrame, batch_id: int) -> None:
        seen = Observation("audit")
        batch = batch.observe(seen, F.count(F.lit(1)).alias("rows"))
        parsed = batch.select(
            F.from_json("value", SCHEMA).alias("r"), F.try_parse_json("value").alias("v"), "value"
        ).select(
            "r.id",
            "r.at",
            F.col("r.device.kind").alias("device_kind"),
            F.col("r.device.level").alias("device_level"),
            F.variant_get("v", "$.device.kind", "string").alias("kind"),
            F.to_date("r.at").alias("date"),
        )
        parsed.cache()
        (
            parsed.write.format("delta")
            .mode("append")
            .partitionBy("date")
            .option("txnAppId", "warmup")
            .option("txnVersion", batch_id)
            .save(str(folder / "delta"))
        )
        parsed.write.mode("append").partitionBy("date").parquet(str(folder / "parquet"))
        parsed.unpersist()
        assert seen.get["rows"] == len(rows)

    query = (
        spark.readStream.format("text")
        .load(str(folder / "in"))
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(folder / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert spark.read.format("delta").load(str(folder / "delta")).count() == len(rows)
    assert spark.read.parquet(str(folder / "parquet")).groupBy("date").count().count() > 1
    spark.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
