"""Great Expectations' Data Docs without the internet: its CDN assets, served from the site.

GX's pages load Bootstrap, jQuery, Font Awesome, bootstrap-table and Vega from public CDNs,
and its logo from its own bucket (with the data context's id in the URL), so on a machine
without internet ``index.html`` is a blank page. ``make setup`` fetches the
same files once from the npm registry (:func:`fetch`, each tarball checked against the
registry's integrity hash); after every validation :func:`localize` copies them into the
site and points every page at its own copies, so the site works from ``file://`` on a
machine with no network at all.

    python -m jobs.quality.offline_docs fetch DIR     # what make setup runs
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

#: Each CDN URL GX 1.x's templates use -> (npm package, version, file inside the package).
#: Font Awesome's CSS loads its fonts from ../webfonts/, which comes along whole.
ASSETS: dict[str, tuple[str, str, str]] = {
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css": (
        "@forevolve/bootstrap-dark",
        "1.1.0",
        "dist/css/bootstrap-prefers-dark.css",
    ),
    "https://cdn.jsdelivr.net/npm/vega-embed@6": ("vega-embed", "6.29.0", "build/vega-embed.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-lite@5": ("vega-lite", "5.23.0", "build/vega-lite.min.js"),
    "https://cdn.jsdelivr.net/npm/vega@5": ("vega", "5.33.1", "build/vega.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css": (
        "bootstrap-datepicker",
        "1.9.0",
        "dist/css/bootstrap-datepicker.min.css",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js": (
        "bootstrap-datepicker",
        "1.9.0",
        "dist/js/bootstrap-datepicker.min.js",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": (
        "@fortawesome/fontawesome-free",
        "6.6.0",
        "css/all.min.css",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": (
        "popper.js",
        "1.12.9",
        "dist/umd/popper.min.js",
    ),
    "https://code.jquery.com/jquery-3.7.1.min.js": ("jquery", "3.7.1", "dist/jquery.min.js"),
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": (
        "bootstrap",
        "4.3.1",
        "dist/css/bootstrap.min.css",
    ),
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": (
        "bootstrap",
        "4.3.1",
        "dist/js/bootstrap.min.js",
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css": (
        "bootstrap-table",
        "1.19.0",
        "dist/extensions/filter-control/bootstrap-table-filter-control.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css": (
        "bootstrap-table",
        "1.19.0",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": (
        "bootstrap-table",
        "1.19.1",
        "dist/bootstrap-table.min.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": (
        "bootstrap-table",
        "1.19.1",
        "dist/bootstrap-table.min.js",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js": (
        "bootstrap-table",
        "1.19.1",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
    ),
}
#: Whole folders a file above needs beside it.
EXTRA_DIRS = {("@fortawesome/fontawesome-free", "6.6.0"): ["webfonts/"]}
#: GX's logo comes from its web-assets bucket, with the data context's id in the query; the
#: site has the same images under static/images/.
GX_IMAGES = re.compile(r'"https://great-expectations-web-assets\.s3\.us-east-2\.amazonaws\.com/([\w.-]+)(?:\?[^"]*)?"')
REGISTRY = "https://registry.npmjs.org"
VENDOR = "static/vendor"
#: A tag that loads one of the site's own copies; its ``crossorigin`` makes Chromium fetch the
#: copy as a CORS request, which a ``file://`` page (origin null) is refused, so Bootstrap's
#: tabs and popovers did nothing. ``integrity`` goes with it: it was the CDN's promise.
_VENDOR_TAG = re.compile(r"<(?:script|link)\b[^>]*" + re.escape(VENDOR) + r"[^>]*>")
_CORS_ATTRIBUTES = re.compile(r'\s+(?:crossorigin|integrity)(?:="[^"]*")?')
#: GX's favicon link counts a validation page's folders one short (its run name adds one).
_FAVICON = re.compile(r'href="(?:\./|(?:\.\./)*)static/images/favicon\.ico"')
#: GX's newsletter footer, and its credit that links to its site: the internet, not the data.
_FOOTER = re.compile(r"\s*<footer>\s*<p>Stay current on everything GX.*?</footer>", re.S)
_GX_CREDIT = re.compile(r'<a href="https://greatexpectations\.io">(Great Expectations)</a>')


def local_path(package: str, version: str, file: str) -> str:
    """Where an asset lives, relative to the assets folder (and to the site's vendor folder)."""
    return f"{package}@{version}/{file}"


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as resp:  # noqa: S310 - the npm registry's https URLs
        return bytes(resp.read())


def fetch(dest: Path) -> None:
    """Download each package once from the npm registry, check it, and keep the files used."""
    packages = sorted({(pkg, ver) for pkg, ver, _ in ASSETS.values()})
    for pkg, ver in packages:
        wanted = [f for p, v, f in ASSETS.values() if (p, v) == (pkg, ver)]
        folders = EXTRA_DIRS.get((pkg, ver), [])
        if all((dest / local_path(pkg, ver, f)).is_file() for f in wanted) and all(
            (dest / local_path(pkg, ver, d)).is_dir() for d in folders
        ):
            continue
        meta = json.loads(_download(f"{REGISTRY}/{pkg}/{ver}"))
        tarball = _download(meta["dist"]["tarball"])
        algorithm, _, digest = meta["dist"]["integrity"].partition("-")
        if base64.b64encode(hashlib.new(algorithm, tarball).digest()).decode() != digest:
            raise RuntimeError(f"{pkg}@{ver}: the tarball does not match the registry's {algorithm} integrity hash")
        with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
            for member in tar.getmembers():
                name = member.name.split("/", 1)[1] if "/" in member.name else member.name
                if member.isfile() and (name in wanted or any(name.startswith(d) for d in folders)):
                    target = dest / local_path(pkg, ver, name)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    target.write_bytes(extracted.read())
        missing = [f for f in wanted if not (dest / local_path(pkg, ver, f)).is_file()]
        if missing:
            raise RuntimeError(f"{pkg}@{ver} has no {', '.join(missing)}")
        print(f"fetched {pkg}@{ver}")


def localize(site: Path, assets: Path) -> int:
    """Copy the assets into ``site`` and point every page at them (and at its own favicon,
    without GX's links to its site); the pages rewritten."""
    if not assets.is_dir():
        raise FileNotFoundError(f"no Data Docs assets in {assets}: run `make setup`")
    vendor = site / VENDOR
    for source in assets.rglob("*"):  # once per site: later validations find the copies there
        target = vendor / source.relative_to(assets)
        if source.is_file() and not (target.is_file() and target.stat().st_size == source.stat().st_size):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    rewritten = 0
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        new = text
        for url, (pkg, ver, file) in ASSETS.items():
            if url in new:
                target = vendor / local_path(pkg, ver, file)
                new = new.replace(f'"{url}"', f'"{os.path.relpath(target, page.parent)}"')

        def local_image(m: re.Match[str], page: Path = page) -> str:
            image = site / "static" / "images" / m.group(1)
            return f'"{os.path.relpath(image, page.parent)}"' if image.is_file() else m.group(0)

        new = GX_IMAGES.sub(local_image, new)
        favicon = os.path.relpath(site / "static" / "images" / "favicon.ico", page.parent)
        new = _FAVICON.sub(f'href="{favicon}"', new)
        new = _GX_CREDIT.sub(r"\1", _FOOTER.sub("", new))
        new = _VENDOR_TAG.sub(lambda m: _CORS_ATTRIBUTES.sub("", m.group(0)), new)
        if new != text:
            page.write_text(new, encoding="utf-8")
            rewritten += 1
    return rewritten


def assets_dir() -> Path:
    """Where `make setup` put the assets: beside the jars."""
    from sluice import config

    return config.jars_dir("web")


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) != 3 or sys.argv[1] != "fetch":
        sys.exit("usage: python -m jobs.quality.offline_docs fetch DIR")
    fetch(Path(sys.argv[2]))
