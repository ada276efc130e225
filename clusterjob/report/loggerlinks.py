"""The HTML report's links from each run to its logger runs (the spec's ``logging:``): the
TensorBoard folder, the MLflow run, the W&B page when online. Read from run.json, where
the run keeps each logger run's identity; the report never needs a logger.

run.json is input like any other: a link is made only of an http(s) or file address,
and every text is escaped.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Optional
from urllib.parse import quote, urlsplit

from clusterjob.core import record
from clusterjob.report.stats import Report

_SCHEMES = ("http", "https", "file")


def section(report: Report) -> str:
    """"Logger runs": a table of each run that has a logger run, with its links; empty
    when no run has one."""
    rows = []
    for run_id, path in zip(report.runs["run_id"], report.runs["path"]):
        links = run_links(record.read_record(str(path))[0])
        if links:
            rows.append(f"<tr><td>{html.escape(str(run_id))}</td><td>{' · '.join(links)}</td></tr>")
    if not rows:
        return ""
    return ('<h2>Logger runs</h2><div class="scroll"><table class="runs"><thead><tr><th>run</th>'
            f'<th>TensorBoard, MLflow, W&amp;B</th></tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


def run_links(info: record.RunRecord) -> list:
    """The HTML of one run's logger runs."""
    links = []
    if info.tensorboard_dir:
        links.append(_link(Path(info.tensorboard_dir).as_uri() if Path(info.tensorboard_dir).is_absolute() else None,
                           "TensorBoard", f"tensorboard --logdir {info.tensorboard_dir}"))
    if info.mlflow_run_id:
        links.append(_link(mlflow_url(info), f"MLflow run {info.mlflow_run_id[:8]}",
                           f"{info.mlflow_tracking_uri or ''} run {info.mlflow_run_id}"))
    if info.wandb_run_id:
        links.append(_link(info.wandb_url, "W&B" if info.wandb_url else f"W&B offline run {info.wandb_run_id}",
                           info.wandb_url or f"wandb sync --id {info.wandb_run_id} <run>/wandb/offline-run-*"))
    return links


def mlflow_url(info: record.RunRecord) -> Optional[str]:
    """The MLflow run's page (a tracking server) or folder (a file store)."""
    uri, experiment, run_id = info.mlflow_tracking_uri, info.mlflow_experiment_id, info.mlflow_run_id
    if not (uri and experiment and run_id):
        return None
    scheme = _scheme(uri)
    if scheme in ("http", "https"):
        return f"{uri.rstrip('/')}/#/experiments/{quote(experiment)}/runs/{quote(run_id)}"
    if scheme == "file":
        return f"{uri.rstrip('/')}/{quote(experiment)}/{quote(run_id)}"
    return None


def _link(url: Optional[str], text: str, title: str) -> str:
    """``text`` linked to ``url`` when it is an http(s) or file address, else plain."""
    shown, hint = html.escape(text), html.escape(title, quote=True)
    if url is None or _scheme(url) not in _SCHEMES:
        return f'<span title="{hint}">{shown}</span>'
    return f'<a href="{html.escape(url, quote=True)}" title="{hint}">{shown}</a>'


def _scheme(url: str) -> str:
    try:
        return urlsplit(url).scheme
    except ValueError:  # not a URL at all ("http://[::1")
        return ""
