"""The stream: a pipeline's run modes, its batches from the parse to the commit, backfills,
and what a run reports (the event log, its status, its lineage)."""
