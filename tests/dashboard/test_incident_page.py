"""The Incident page: a bundle exported by `collectors export-incident` opened read-only, with the Engine
page's charts, markers and the timeline of alerts and actions."""

from __future__ import annotations

from pathlib import Path

from collectors.__main__ import main as collectors_main
from tests.dashboard.apptest import app, figures, texts, traces
from tests.dashboard.fill import COLLAPSE_AGO


def test_export_then_open_the_bundle_on_the_incident_page(
    db_url: str, fill_now: float, tmp_path: Path
) -> None:
    out = tmp_path / "incident.json.gz"
    start, end = fill_now - COLLAPSE_AGO - 600, fill_now - COLLAPSE_AGO + 900
    assert (
        collectors_main(
            [
                "export-incident",
                "--engine",
                "a",
                "--from",
                str(start),
                "--to",
                str(end),
                "--out",
                str(out),
                "--database-url",
                db_url,
            ]
        )
        == 0
    )
    at = app("incident", bundle=str(out))
    assert not at.exception, at.exception
    figs = figures(at)
    assert {"incident_hit_rates", "incident_kv", "incident_backlog"} <= set(figs)
    hit = traces(figs["incident_hit_rates"])
    rt = [y for y in hit["R_t (token-weighted)"]["y"] if y is not None]
    assert min(rt) < 0.2 and max(rt) > 0.8  # the collapse is inside the bundle's range
    assert any("collapse" in t for t in hit["alert"]["hovertext"])
    timeline = next(d.value for d in at.dataframe if "detail" in d.value.columns)
    assert any("collapse" in t for t in timeline["detail"]) and (timeline["what"] == "alert").any()
    assert "Engine a" in texts(at)


def test_a_file_that_is_not_a_bundle_is_named(db_url: str, tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    at = app("incident", bundle=str(bad))
    assert not at.exception
    assert "not an incident bundle" in at.error[0].value
