"""The Data Docs pages as GX 1.x itself renders them (its pandas engine: no Spark), after
Sluice's touches: a failed warning marked as one on its own row, the asset named, the
favicon found, and no link to GX's site. If GX changes the layout the marks rely on, this
fails (``jobs/quality/docs_verdict.py``)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from jobs.quality.docs_verdict import WARNING_MARK
from jobs.quality.offline_docs import ASSETS, local_path, localize
from jobs.validate import context, publish


def rows(page: str) -> list[str]:
    """The text of each results row that has a status mark, in page order."""
    found = []
    for row in re.findall(r"<tr>.*?</tr>", page, re.S):
        if "fa-times text-danger" in row or "fa-check-circle" in row or "warning" in row:
            found.append(" ".join(re.sub(r"<[^>]+>", " ", row.replace(WARNING_MARK, " WARNING ")).split()))
    return found


def test_a_failed_warning_is_marked_on_its_row_and_the_page_keeps_to_itself(tmp_path: Path) -> None:
    import great_expectations as gx
    import great_expectations.expectations as gxe
    import pandas as pd
    from great_expectations.core.run_identifier import RunIdentifier

    ctx = context(tmp_path)
    batches = (
        ctx.data_sources.add_or_update_pandas(name="t")
        .add_dataframe_asset(name="payments")
        .add_batch_definition_whole_dataframe("day")
    )
    # On one column, a failed warning between a failed critical rule and a passed one; and a
    # failed warning at table level: each section's rows keep the results' order.
    suite = gx.ExpectationSuite(
        name="sluice.payments",
        expectations=[
            gxe.ExpectColumnValuesToBeInSet(column="currency", value_set=["EUR"], severity="critical"),
            gxe.ExpectColumnValuesToNotBeNull(column="currency", severity="warning"),
            gxe.ExpectColumnValuesToMatchRegex(column="currency", regex="^[A-Z]+$", severity="warning"),
            gxe.ExpectTableRowCountToBeBetween(min_value=10, severity="warning"),
            gxe.ExpectColumnValuesToNotBeNull(column="amount", severity="critical"),
        ],
    )
    definition = ctx.validation_definitions.add_or_update(
        gx.ValidationDefinition(name="v", data=batches, suite=ctx.suites.add_or_update(suite))
    )
    check = ctx.checkpoints.add_or_update(gx.Checkpoint(name="c", validation_definitions=[definition], actions=[]))
    frame = pd.DataFrame({"currency": ["EUR", "USD", None], "amount": [1.0, 2.0, 3.0]})
    result = check.run(batch_parameters={"dataframe": frame}, run_id=RunIdentifier(run_name="date=2026-11-28"))
    ((key, validation),) = result.run_results.items()
    assert [r.success for r in validation.results] == [False, False, True, False, True]

    url = publish(ctx, key, validation, "payments", passed=False, index=True)
    site = tmp_path / "uncommitted" / "data_docs" / "local_site"
    assets = tmp_path / "assets"
    for pkg, ver, file in ASSETS.values():
        (assets / local_path(pkg, ver, file)).parent.mkdir(parents=True, exist_ok=True)
        (assets / local_path(pkg, ver, file)).write_text("/* stand-in */")
    localize(site, assets)

    page = Path(unquote(urlparse(url).path))
    text = page.read_text()
    got = rows(text)
    marked = [r for r in got if "WARNING" in r]
    assert len(marked) == 2 and text.count(WARNING_MARK) == 2, got
    assert any("never be null" in r for r in marked) and any("greater than or equal to 10" in r for r in marked)
    crossed = [r for r in got if "WARNING" not in r and "unexpected" in r.lower()]
    assert crossed and all("never be null" not in r for r in crossed), got  # the critical one keeps its cross
    assert len(re.findall(r'fa-times text-danger"\s*>', text)) == 1  # the critical failure's row, no other
    assert "Data asset: payments" in " ".join(text.split())
    for html in (page, site / "index.html", *site.glob("expectations/**/*.html")):
        body = html.read_text()
        assert "greatexpectations.io" not in body, html  # no newsletter, no tutorials, no credit link
        favicon = re.search(r'rel="shortcut icon" href="([^"]+)"', body)
        assert favicon and (html.parent / favicon.group(1)).resolve() == (site / "static/images/favicon.ico").resolve()
        assert (html.parent / favicon.group(1)).is_file(), html
