"""The "Data Docs" button of a quality DAG's validate task, and the operator that carries it.

The validate task records the Data Docs page of what it validated (an XCom, pushed before the
task passes or fails: a failed validation is when the page matters most); at the end of the
task, Airflow asks :class:`DataDocsLink` for the URL and keeps it for the UI. The URL is
served by Sluice's Airflow plugin (:mod:`sluice.airflow.plugin`), behind Airflow's login.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from airflow.sdk import BaseOperatorLink

from sluice.airflow.lineage import PipelineOperator

#: Where the plugin serves the Data Docs site, on Airflow's API server.
URL_PREFIX = "/sluice-docs"
#: The XCom holding the page's path inside the site.
XCOM_KEY = "data_docs"


class DataDocsLink(BaseOperatorLink):
    name = "Data Docs"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        page = XCom.get_value(ti_key=ti_key, key=XCOM_KEY)
        if not page:
            return ""
        # The page links back to this task (sluice.airflow.plugin.way_back).
        parts = ("dags", ti_key.dag_id, "runs", ti_key.run_id, "tasks", ti_key.task_id)
        task = "/" + "/".join(quote(str(p), safe="") for p in parts)
        return f"{URL_PREFIX}/{page}?{urlencode({'back': task})}"


class ValidateOperator(PipelineOperator):
    """The quality task: it reads the pipeline's table, and has the Data Docs button."""

    operator_extra_links = (DataDocsLink(),)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(touches="reads_tables", **kwargs)
