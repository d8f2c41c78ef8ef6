"""The Data Docs' CDN links become links to the site's own copies (no network here: the
assets are stand-in files laid out as `make setup` lays out the real ones)."""

from __future__ import annotations

from pathlib import Path

from jobs.quality.offline_docs import ASSETS, VENDOR, local_path, localize


def test_every_cdn_link_points_at_a_copy_inside_the_site(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    for pkg, ver, file in ASSETS.values():
        (assets / local_path(pkg, ver, file)).parent.mkdir(parents=True, exist_ok=True)
        (assets / local_path(pkg, ver, file)).write_text(f"/* {pkg} {file} */")
    site = tmp_path / "site"
    (site / "validations" / "x").mkdir(parents=True)
    # As GX's template writes two of them: with the CDN's integrity hash and crossorigin.
    cors = ' integrity="sha384-x" crossorigin="anonymous"'
    head = "".join(f'<script src="{url}"{cors if "bootstrap" in url else ""}></script>' for url in ASSETS)
    (site / "static" / "images").mkdir(parents=True)
    (site / "static" / "images" / "logo-long.png").write_bytes(b"png")
    logo = (
        '<img src="https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?d=1&dataContextId=x">'
    )
    (site / "index.html").write_text(f"<html><head>{head}</head>{logo}</html>")
    (site / "validations" / "x" / "run.html").write_text(f"<html>{head}<a href='https://example.org'>x</a></html>")
    (site / "plain.html").write_text("<html>nothing to change</html>")

    assert localize(site, assets) == 2
    copied = site / VENDOR / local_path(*next(iter(ASSETS.values())))
    stamp = copied.stat().st_mtime_ns
    assert localize(site, assets) == 0 and copied.stat().st_mtime_ns == stamp  # nothing left to do the second time
    for page in (site / "index.html", site / "validations" / "x" / "run.html"):
        text = page.read_text()
        assert not any(url in text for url in ASSETS)
        for url, (pkg, ver, file) in ASSETS.items():
            link = text.split('<script src="')[list(ASSETS).index(url) + 1].split('"')[0]
            assert not link.startswith("http") and VENDOR in link
            assert (page.parent / link).resolve() == (site / VENDOR / local_path(pkg, ver, file)).resolve()
            assert (page.parent / link).read_text() == f"/* {pkg} {file} */"
    assert "https://example.org" in (site / "validations" / "x" / "run.html").read_text()  # other links stay
    # Chromium refuses a crossorigin script to a file:// page: the copies load as plain scripts.
    for page in (site / "index.html", site / "validations" / "x" / "run.html"):
        assert "crossorigin" not in page.read_text() and "integrity" not in page.read_text()
    assert '<img src="static/images/logo-long.png">' in (site / "index.html").read_text()  # and no context id
