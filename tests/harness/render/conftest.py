"""The synthetic rows' report (``test_report.synthetic_rows``), figures drawn: built once per
test run for the render tests that only read it (``test_report``'s ``built``, the browser
tests' page with every section). A full build draws every figure: 20-35 s on 2 busy cores.
Under pytest-xdist the workers of one run share it (built by the first that asks, under a
file lock, in the run's common temporary folder), as test_report and test_browser usually
run on different workers."""

from __future__ import annotations

import json
import os

import pytest
from filelock import FileLock


@pytest.fixture(scope="session")
def synthetic_report(tmp_path_factory):
    """(base, the HTML page, the y-axis label of every claim figure its Claims section drew):
    ``base / "run"`` holds the rows and env.json, ``base / "out"`` the report. The labels are
    ``verdict_views.fit_over_utilization``'s ``ylabel``, recorded on the way through (the
    figures are drawn as they always are). Tests read these files; none may write there."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _build(tmp_path_factory.mktemp("report"))
    # a worker's base temp is <this run's folder>/popen-gwN: the parent is this run's alone
    shared = tmp_path_factory.getbasetemp().parent / "synthetic-report"
    labels = shared / "ylabels.json"  # written last: its presence says the report is whole
    with FileLock(f"{shared}.lock"):
        if not labels.is_file():
            shared.mkdir(exist_ok=True)
            built = _build(shared)
            labels.write_text(json.dumps(built[2]))
    return shared, shared / "out" / "index.html", tuple(json.loads(labels.read_text()))


def _build(base):
    from harness.render import report, verdict_views
    from harness.results import RowWriter, write_env
    from tests.harness.render.test_report import CALIBRATION, synthetic_rows

    writer = RowWriter(base / "run")
    for r in synthetic_rows():
        writer.write(r)
    write_env(
        base / "run",
        {
            "run_id": "r1",
            "suite": "synthetic",
            "device_name": "test cpu",
            "torch": "x",
            "calibration": CALIBRATION,
        },
    )
    ylabels = []
    drawn = verdict_views.fit_over_utilization

    def recorded(*args, **kwargs):
        ylabels.append(kwargs["ylabel"])
        return drawn(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(verdict_views, "fit_over_utilization", recorded)
        page = report.build_report([base / "run"], base / "out")
    return base, page, tuple(ylabels)
