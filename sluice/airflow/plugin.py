"""Sluice's Airflow plugin: the Great Expectations Data Docs, served by Airflow's API server.

Registered through the ``airflow.plugins`` entry point (pyproject.toml), so the API server
loads it with Sluice installed. Every page is behind Airflow's own login (the same cookie
as the UI) and needs the right to view the website. Pages are read from the Data Docs site as
they are: on one machine the local site (:func:`sluice.records.validation.docs_site`), on a
cluster the copy every validating host writes to the shared store
(:func:`sluice.records.validation.shared_quality`). Their CSS and JavaScript are the site's
own files (``jobs/quality/offline_docs.py``), so the pages work without the internet.
"""

from __future__ import annotations

import html
import mimetypes
import re
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import requires_access_view
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.airflow.links import URL_PREFIX
from sluice.records.validation import SITE, docs_site, safe_key, shared_quality
from sluice.storage import Location

app = FastAPI(
    title="Sluice Data Docs",
    dependencies=[Depends(requires_access_view(AccessView.WEBSITE))],
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)


@app.exception_handler(StarletteHTTPException)
async def signed_out(request: Request, exc: StarletteHTTPException) -> Response:
    """A browser without Airflow's login goes to the login page, and comes back after it;
    anything else (the API, a script) gets the refusal as it is."""
    if exc.status_code == 401 and "text/html" in request.headers.get("accept", ""):
        from airflow.api_fastapi.app import get_auth_manager

        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status_code=303)
    return await http_exception_handler(request, exc)


@app.get("/")
def index() -> RedirectResponse:
    # Relative links in the pages resolve against a folder URL, so the root gets its slash.
    return RedirectResponse(f"{URL_PREFIX}/index.html")


@app.get("/{path:path}")
def page(path: str, back: str | None = None) -> Response:
    parts = PurePosixPath(path).parts
    if not parts or path.startswith("/") or not safe_key("/".join(parts)):
        raise HTTPException(404, "no such page")
    shared = shared_quality()
    if shared is None:
        site: Path | Location = docs_site()
    else:  # a cluster's copy: a folder every host mounts, or an object store
        site = Path(shared.uri) / SITE if "://" not in shared.uri else shared / SITE
    body = _from_folder(site, parts) if isinstance(site, Path) else _from_store(site, parts)
    if body is None:
        raise HTTPException(404, f"no Data Docs page {path} in {site}")
    kind = mimetypes.guess_type(parts[-1])[0] or "application/octet-stream"
    if kind == "text/html":
        body = way_back(body, back)
    return Response(body, media_type=kind, headers={"X-Content-Type-Options": "nosniff"})


_LOCAL_PATH = re.compile(r"/(?![/\\])[^\s\\\x00-\x1f\x7f]*")


def way_back(body: bytes, back: str | None) -> bytes:
    """The page with a link back to Airflow at its top: to the task that opened it (the Data
    Docs button passes its page as ``back``), else to Airflow's home. Only a path on this
    server is taken: ``back`` comes from a URL anyone can write."""
    # Browsers drop tabs and newlines from a URL and read a backslash as "/": "/\t/host" is "//host".
    local = back is not None and _LOCAL_PATH.fullmatch(back) is not None
    target, label = (back, "Back to the task in Airflow") if local else ("/", "Back to Airflow")
    bar = (
        '<nav style="padding:6px 16px;border-bottom:1px solid #ddd;font-family:sans-serif">'
        f'<a href="{html.escape(str(target))}">&larr; {label}</a></nav>'
    )
    return re.sub(rb"<body[^>]*>", lambda m: m.group(0) + bar.encode(), body, count=1)


def _from_folder(site: Path, parts: tuple[str, ...]) -> bytes | None:
    file = site.joinpath(*parts)
    if not file.is_file() or not file.resolve().is_relative_to(site.resolve()):
        return None  # missing, or a link inside the site to a file outside it
    return file.read_bytes()


def _from_store(site: Location, parts: tuple[str, ...]) -> bytes | None:
    """A page of the site's copy in an object store (which has no links)."""
    file = site / "/".join(parts)
    return file.read_bytes() if file.is_file() else None


class SluicePlugin(AirflowPlugin):
    name = "sluice"
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [{"app": app, "url_prefix": URL_PREFIX, "name": "Sluice Data Docs"}]
