"""Sluice's Airflow plugin: the Great Expectations Data Docs, served by Airflow's API server.

Registered through the ``airflow.plugins`` entry point (pyproject.toml), so the API server
loads it with Sluice installed. Every page is behind Airflow's own login (the same cookie
as the UI) and needs the right to view the website. Pages are read from the Data Docs site
(:func:`sluice.records.validation.docs_site`) as they are: their CSS and JavaScript are the
site's own files (``jobs/offline_docs.py``), so the pages work without the internet.
"""

from __future__ import annotations

import mimetypes
from pathlib import PurePosixPath
from typing import Any, ClassVar

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import requires_access_view
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import RedirectResponse, Response

from sluice.airflow.links import URL_PREFIX
from sluice.records.validation import docs_site

app = FastAPI(
    title="Sluice Data Docs",
    dependencies=[Depends(requires_access_view(AccessView.WEBSITE))],
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)


@app.get("/")
def index() -> RedirectResponse:
    # Relative links in the pages resolve against a folder URL, so the root gets its slash.
    return RedirectResponse(f"{URL_PREFIX}/index.html")


@app.get("/{path:path}")
def page(path: str) -> Response:
    parts = PurePosixPath(path).parts
    if not parts or any(p in ("..", ".") for p in parts) or path.startswith("/"):
        raise HTTPException(404, "no such page")
    site = docs_site()
    file = site.joinpath(*parts)
    if not file.is_file():
        raise HTTPException(
            404,
            f"no Data Docs page {path} in {site} on this host: validations write their pages where they run",
        )
    if not file.resolve().is_relative_to(site.resolve()):
        raise HTTPException(404, "no such page")  # a link inside the site to a file outside it
    kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
    return Response(file.read_bytes(), media_type=kind, headers={"X-Content-Type-Options": "nosniff"})


class SluicePlugin(AirflowPlugin):
    name = "sluice"
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [{"app": app, "url_prefix": URL_PREFIX, "name": "Sluice Data Docs"}]
