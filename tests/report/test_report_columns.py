"""A family of report columns is one module (clusterjob.report.provider): a provider
registered beside the others shows its columns in the grouped and the per-run table, in
md, csv, json and html, its legend, its notes and its line, with nothing else of the
report changed (its curves on the html page too); the grouping and the writers name no
provider."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pandas as pd
import pytest
from test_results import sweep

from clusterjob.report import assemble
from clusterjob.report.build import build_report, render
from clusterjob.report.provider import Provider, RunCurves, Runs
from clusterjob.report.termtable import Column


class Ranks(Provider):
    """Each run's ranks, a group's summed: a family of one column, with a note and a line."""

    run_columns = ("ranks",)
    group_columns = ("ranks_sum",)
    legend = "ranks: the processes of each run."
    group_legend = "Groups sum them."
    notes_heading = "Rank notes:"
    summary_key = "ranks_all"

    def columns(self, runs: Runs) -> pd.DataFrame:
        return pd.DataFrame({"ranks": [float(info["world_size"]) for info in runs.results.infos]})

    def group(self, runs: pd.DataFrame, grouped) -> dict:
        return {"ranks_sum": grouped["ranks"].sum()}

    def cells(self, frame: pd.DataFrame, grouped: bool) -> list:
        cells = [f"{value:g}" for value in frame["ranks_sum" if grouped else "ranks"]]
        return [Column("ranks", "ranks", cells, cells)]

    def notes(self, runs: pd.DataFrame) -> list:
        return ["its ranks waited" if run_id == "r4" else "" for run_id in runs["run_id"]]

    def summary(self, runs: Runs) -> "RanksLine":
        assert runs.table is not None
        return RanksLine(int(runs.table["ranks"].sum()))

    def curves(self, runs: pd.DataFrame) -> RunCurves:
        return RunCurves("Ranks over time", "ranks", {path: ranks for path, ranks in zip(runs["path"], runs["ranks"])},
                         lambda title, ranks: f'<svg xmlns="http://www.w3.org/2000/svg"><text>{ranks:g}</text></svg>'
                         .encode(), having="had ranks")


class RanksLine:
    def __init__(self, ranks: int):
        self.ranks = ranks

    def line(self) -> str:
        return f"{self.ranks} ranks in all"

    def as_json(self) -> dict:
        return {"ranks": self.ranks}


@pytest.fixture
def reports(tmp_path):
    """The report of a sweep of 2 lrs x 3 seeds (2 ranks each), as registered and with Ranks too."""
    root = sweep(tmp_path / "results")
    return build_report(root, cache=False), build_report(root, cache=False,
                                                        providers=(*assemble.PROVIDERS, Ranks()))


def test_a_new_provider_is_summed_in_the_grouped_table_and_changes_nothing_else(reports):
    plain, ranked = reports
    assert ranked.groups["ranks_sum"].tolist() == [6.0, 6.0]
    pd.testing.assert_frame_equal(ranked.groups.drop(columns="ranks_sum"), plain.groups)
    pd.testing.assert_frame_equal(ranked.runs.drop(columns="ranks"), plain.runs)
    assert ranked.runs["ranks"].tolist() == [2.0] * 6


def test_its_column_ends_each_csv_table(reports):
    plain, ranked = reports
    for runs, value in ((False, "6.0"), (True, "2.0")):
        before, after = render(plain, "csv", runs).splitlines(), render(ranked, "csv", runs).splitlines()
        assert after == [before[0] + (",ranks" if runs else ",ranks_sum")] + [line + f",{value}" for line in before[1:]]


def test_its_cells_legend_notes_and_line_are_in_md_json_and_html(reports):
    plain, ranked = reports
    md, rows = render(ranked, "md", width=200), render(ranked, "md", runs=True, width=400)
    assert "| ranks |" in md and "ranks: the processes of each run. Groups sum them." in md
    assert "ranks: the processes of each run." in rows and "Groups sum them." not in rows
    assert "12 ranks in all" in md and "Rank notes:\n- r4: its ranks waited" in rows
    assert "Rank notes" not in render(plain, "md", runs=True, width=200)
    data = json.loads(render(ranked, "json", runs=True))
    assert data["ranks_all"] == data["experiments"][0]["ranks_all"] == {"ranks": 12}
    assert list(data)[:list(data).index("ranks_all") + 1][-3:] == ["best", "search_hours", "ranks_all"]
    assert [row["ranks"] for row in data["runs"]] == [2.0] * 6
    assert "ranks_all" not in json.loads(render(plain, "json"))
    page = render(ranked, "html")
    assert "12 ranks in all" in page and "its ranks waited" in page and "Groups sum them." in page
    assert "<h2>Ranks over time</h2>" in page and page.count('data-metric="ranks"') == 6  # a panel per run
    assert "Ranks over time" not in render(plain, "html")


GROUPING_AND_WRITERS = ("stats", "cells", "build", "tables", "reading", "htmlpage")


def test_the_grouping_and_the_writers_import_no_provider():
    providers = {type(provider).__module__ for provider in assemble.PROVIDERS}
    folder = Path(assemble.__file__).parent
    for name in GROUPING_AND_WRITERS:
        tree = ast.parse((folder / f"{name}.py").read_text())
        named = {f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 for alias in node.names} | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        named |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert not named & providers, name
    assert providers == {"clusterjob.report.cost", "clusterjob.report.efficiency", "clusterjob.report.memory",
                         "clusterjob.report.searchcost"}


def test_a_provider_that_adds_nothing_leaves_every_format_as_it_was(reports):
    plain, _ = reports
    bare = build_report(plain.root, cache=False, providers=(*assemble.PROVIDERS, Provider()))
    for fmt in ("md", "csv", "json", "html"):
        for runs in (False, True):
            assert render(bare, fmt, runs) == render(plain, fmt, runs), (fmt, runs)


class Hosts(Provider):
    """A family that reads a run.json field the tables do not (``hosts``), named in ``fields``."""

    fields = ("hosts",)
    run_columns = ("hosts_seen",)

    def columns(self, runs: Runs) -> pd.DataFrame:
        return pd.DataFrame({"hosts_seen": [",".join(info["hosts"]) for info in runs.results.infos]})


def test_a_provider_reads_the_run_fields_it_names_through_the_cache_of_a_report_without_it(tmp_path):
    root = sweep(tmp_path / "results")
    plain = build_report(root)  # its cache holds the tables' fields only
    plain.save_cache()
    assert "hosts" not in plain.results.infos[0]
    first = build_report(root, providers=(*assemble.PROVIDERS, Hosts()))
    assert first.runs["hosts_seen"].tolist() == ["n1"] * 6
    first.save_cache()
    cached = build_report(root, providers=(*assemble.PROVIDERS, Hosts()))
    assert cached.results.cache_plan is None  # every row read from the cache, hosts and all
    assert cached.runs["hosts_seen"].tolist() == ["n1"] * 6
    again = build_report(root)  # the cache's rows hold more than the tables need: still used
    assert again.results.cache_plan is None and again.runs.equals(plain.runs)


def test_a_provider_naming_no_field_of_the_run_record_is_refused(tmp_path):
    class Typo(Provider):
        fields = ("hostz",)

    with pytest.raises(ValueError, match="not fields of run.json: hostz"):
        build_report(sweep(tmp_path / "results"), cache=False, providers=(Typo(),))
