"""Sluice's tasks as Airflow's OpenLineage provider sees them: what each one reads and writes.

With ``apache-airflow-providers-openlineage`` configured (``[openlineage] transport``), Airflow
sends a START and a COMPLETE or FAIL event for every task. It asks an operator for its
datasets through ``get_openlineage_facets_on_start``; a task built from a plain function
would report none. :class:`PipelineOperator` answers from the spec (:mod:`sluice.lineage`),
so the events carry the topics, the tables and their column lineage. Nothing is imported for
it while the DAG file is parsed.
"""

from __future__ import annotations

from typing import Any, Literal

from airflow.providers.standard.operators.python import PythonOperator

#: What a task does with a pipeline's datasets: runs its stream (reads the sources, writes
#: the tables), reads its table (quality), or rewrites its tables in place (maintenance).
Touches = Literal["stream", "reads_tables", "rewrites_tables"]


class PipelineOperator(PythonOperator):
    """A Python task acting on one pipeline: ``python_callable(spec_path, *op_args)``, reporting
    the pipeline's datasets as its lineage."""

    def __init__(
        self, *, spec_path: str, touches: Touches = "stream", op_args: list[Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(op_args=[spec_path, *(op_args or [])], **kwargs)
        self.spec_path, self.touches = spec_path, touches

    def get_openlineage_facets_on_start(self) -> Any:
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import InputDataset, OutputDataset

        from sluice import lineage, registry
        from sluice.spec import load_pipeline

        found = lineage.of(load_pipeline(self.spec_path, schemas=registry.schema_file))
        if self.touches == "stream":
            return OperatorLineage(inputs=found.inputs, outputs=found.outputs)
        # The tables as they are (their schemas): where their columns came from is the stream's
        # lineage, not this task's.
        tables = [
            (d.namespace, d.name, {"schema": (d.facets or {})["schema"]})
            for d in (found.outputs if self.touches == "rewrites_tables" else found.outputs[:1])
        ]
        inputs = [InputDataset(namespace, name, facets=f) for namespace, name, f in tables]
        if self.touches == "reads_tables":
            return OperatorLineage(inputs=inputs)
        return OperatorLineage(inputs=inputs, outputs=[OutputDataset(n, name, facets=f) for n, name, f in tables])
