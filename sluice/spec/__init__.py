"""The contract both sides read: a pipeline spec and everything derived from it, pure Python.

The Airflow side (``sluice.airflow``) and the Spark side (``jobs/``) import the same
:class:`Pipeline`; nothing here imports pyspark or Airflow.
"""

from sluice.spec.loader import all_pipelines, load_all, load_pipeline, parse_pipeline, valid_pipelines
from sluice.spec.model import duration_seconds
from sluice.spec.pipeline import Continuous, Pipeline, PipelineSpec, SpecError, Trigger

__all__ = [
    "Continuous",
    "Pipeline",
    "PipelineSpec",
    "SpecError",
    "Trigger",
    "all_pipelines",
    "duration_seconds",
    "load_all",
    "load_pipeline",
    "parse_pipeline",
    "valid_pipelines",
]
