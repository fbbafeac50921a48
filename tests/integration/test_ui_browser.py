"""The topology page in a real browser: Debian's chromium, headless, driven by selenium.

A local cluster is fed tuples by a raw client; the page must show the REST API's counts,
draw a throughput chart per component, and its Deactivate / Activate buttons must stop
and resume the bolts.  One screenshot is kept in ``.artifacts/ui/`` (git-ignored).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.ui_support import LedgerUI, UICluster, pipeline
from tests.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".artifacts" / "ui"
COMPONENTS = ("in", "stage1", "stage2")
COUNTS = ("executed", "emitted", "acked", "failed")


@pytest.fixture
def ui_cluster(tmp: Path) -> Iterator[UICluster]:
    run = UICluster(tmp, pipeline(tmp / "records")).start()
    yield run
    if not run.stopped:
        run.stop()


_READ_TABLE = """
const out = {};
for (const row of document.querySelectorAll('#components tbody tr[data-component]')) {
  const cells = {};
  for (const td of row.querySelectorAll('td[data-field]')) cells[td.dataset.field] = td.textContent;
  out[row.dataset.component] = cells;
}
return out;
"""


def _page_counts(driver: Any) -> dict[str, dict[str, str]]:
    """The components table as the user sees it, read in one go (the page redraws it every second)."""
    table: dict[str, dict[str, str]] = driver.execute_script(_READ_TABLE)
    return table


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _page_executed(driver: Any) -> dict[str, int]:
    return {c: _number(v["executed"]) for c, v in _page_counts(driver).items()}


def _press(driver: Any, button: str) -> None:
    driver.find_element("id", button).click()
    dialog = driver.find_element("id", "confirm")
    wait_until(lambda: dialog.get_attribute("open") is not None, what="the confirmation dialog")
    assert "topology pipeline" in driver.find_element("id", "confirm-text").text
    driver.find_element("id", "confirm-ok").click()


def _status(driver: Any) -> str:
    """The status badge's text (read by script: the badge is redrawn every refresh)."""
    return str(
        driver.execute_script("const b = document.querySelector('#status .badge'); return b ? b.dataset.status : '';")
    )


def test_topology_page_counts_chart_and_deactivate_activate(ui_cluster: UICluster, browser: Any) -> None:
    for _ in range(8):  # traffic spread over several samples: the charts get a shape
        ui_cluster.send(100)
        ui_cluster.wait_new_samples(2)
    ui_cluster.wait_executed("stage2", 800)

    browser.get(f"{ui_cluster.base}/topology.html?id=pipeline")
    wait_until(lambda: _page_executed(browser).get("stage2") == 800, what="the page to show 800 executed", timeout=20)
    # The table shows what the REST API says (the topology is idle now: nothing moves).
    rest = ui_cluster.components()
    page = _page_counts(browser)
    assert set(page) == set(COMPONENTS)
    for cid in COMPONENTS:
        assert {k: _number(page[cid][k]) for k in COUNTS} == {k: rest[cid][k] for k in COUNTS}, cid
        assert page[cid]["executors"] == str(rest[cid]["executors"])
        assert page[cid]["tasks"] == str(rest[cid]["tasks"])
    assert rest["stage1"]["acked"] == 800
    assert _status(browser) == "ACTIVE"

    # One uPlot chart per component, drawn on a canvas, holding the measured rates.
    for cid in COMPONENTS:
        chart = browser.find_element("css selector", f'#charts .chart[data-component="{cid}"]')
        canvas = chart.find_element("css selector", "canvas")
        assert canvas.size["width"] > 200
        assert canvas.size["height"] > 50
        peak = browser.execute_script(
            "const c = window.sparkStormCharts.get(arguments[0]);"
            "return Math.max(...c.plot.data[1].filter(v => v !== null));",
            cid,
        )
        assert peak > 0, cid
        assert int(chart.get_attribute("data-points")) >= 8

    # Deactivate: tuples sent now wait in the source's queues; no bolt executes them.
    _press(browser, "btn-deactivate")
    wait_until(lambda: _status(browser) == "INACTIVE", what="the page to show INACTIVE")
    assert ui_cluster.get("topology/pipeline")["status"] == "INACTIVE"
    before = _page_executed(browser)
    ui_cluster.send(300)
    wait_until(lambda: ui_cluster.components()["in"]["queuePopulation"] == 300, what="300 tuples queued")
    wait_until(
        lambda: _page_counts(browser)["in"]["queue"].startswith("300 /"), what="the page to show the queued tuples"
    )
    assert _page_executed(browser) == before == dict.fromkeys(COMPONENTS, 800)
    assert {c: v["executed"] for c, v in ui_cluster.components().items()} == before

    # Activate: the held tuples flow through every bolt.
    _press(browser, "btn-activate")
    wait_until(lambda: _page_executed(browser) == dict.fromkeys(COMPONENTS, 1100), what="1100 executed on the page")
    assert _status(browser) == "ACTIVE"
    wait_until(  # written when the POST's answer arrives, which the page's polling need not wait for
        lambda: "activate pipeline: success" in browser.find_element("id", "message").text,
        what="the page's message that the activation succeeded",
    )
    wait_until(
        lambda: browser.execute_script(
            "return window.sparkStormCharts.get('stage2').plot.data[1].slice(-8).some(v => v > 0);"
        ),
        what="the burst after activate in the chart",
    )

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "topology-page.png"
    assert browser.save_screenshot(str(shot))
    print(f"\nscreenshot of the topology page: {shot}")


_READ_STATE = """
const card = document.getElementById('state-card');
const stats = {};
for (const s of document.querySelectorAll('#state-stats [data-stat]')) stats[s.dataset.stat] = s.querySelector('.value').textContent;
const executors = {};
for (const row of document.querySelectorAll('#state-executors tbody tr[data-executor]')) {
  const cells = {};
  for (const td of row.querySelectorAll('td[data-field]')) cells[td.dataset.field] = td.textContent;
  executors[row.dataset.executor] = cells;
}
return {hidden: card.hidden, stats, executors};
"""

_READ_CHECKPOINTS = """
const out = {};
for (const row of document.querySelectorAll('#checkpoints tbody tr[data-worker]')) {
  const cells = {};
  for (const td of row.querySelectorAll('td[data-field]')) cells[td.dataset.field] = td.textContent;
  out[row.dataset.worker] = cells;
}
const comps = {};
for (const row of document.querySelectorAll('#state tbody tr[data-component]')) {
  const cells = {};
  for (const td of row.querySelectorAll('td[data-field]')) cells[td.dataset.field] = td.textContent;
  comps[row.dataset.component] = cells;
}
return {workers: out, components: comps, hidden: document.getElementById('state-card').hidden};
"""


def _shown(field: str, value: Any) -> str:
    """A state figure as the page formats it (app.js: fmt.int, fmt.ms, fmt.size)."""
    if value is None:
        return "\u2014"
    if field.endswith("Ms"):
        return f"{value:.3f}"
    if field == "lastCheckpointBytes":
        return (
            f"{value} B"
            if value < 1024
            else f"{value / 1024:.1f} KiB"
            if value < 1048576
            else f"{value / 1048576:.1f} MiB"
        )
    return f"{value:,}"


def test_component_page_shows_the_state_and_the_topology_page_the_checkpoints(tmp: Path, browser: Any) -> None:
    with LedgerUI(tmp) as run:
        plan = run.cluster.plan
        for batch in range(2):
            run.feed_and_commit(batch)
        victim = next(
            s for s in run.cluster.slots if any(plan.task_slot[t] == s for t in plan.component_tasks["ledger"])
        )
        run.cluster.kill(victim)  # its tasks restore at the restart, and the next commit rolls everyone back
        run.cluster.start_worker(victim)
        run.cluster.wait_running(60, [victim])
        run.feed_and_commit(2)
        rest = run.wait_state(lambda s: s["committedEpoch"] == 3 and s["rollbacks"] >= 1, "epoch 3 committed")
        assert rest["restores"] > 0
        assert rest["checkpointP99Ms"] is not None

        browser.get(f"{run.base}/component.html?topology=ledger&id=ledger")
        want = {k: _shown(k, v) for k, v in rest.items() if k != "executors"}
        wait_until(
            lambda: browser.execute_script(_READ_STATE)["stats"] == want,
            what=f"the component page to show the REST API's state {want}",
            timeout=20,
        )
        page = browser.execute_script(_READ_STATE)
        assert page["hidden"] is False
        executors = {x["id"]: x for x in run.ledger()["executorStats"]}
        assert set(page["executors"]) == set(executors)
        for eid, cells in page["executors"].items():
            st = executors[eid]["state"]
            assert cells == {"id": eid, "worker": executors[eid]["worker"], **{k: _shown(k, v) for k, v in st.items()}}

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(ARTIFACTS / "component-state.png"))

        # The topology page: the stateful component's row, and each worker's view of the protocol.
        browser.get(f"{run.base}/topology.html?id=ledger")
        topo = run.get("topology/ledger")
        wait_until(
            lambda: len(browser.execute_script(_READ_CHECKPOINTS)["workers"]) == 2,
            what="the workers' checkpoint rows",
            timeout=20,
        )
        shown = browser.execute_script(_READ_CHECKPOINTS)
        assert shown["hidden"] is False
        assert set(shown["components"]) == {"ledger"}  # in and mid keep no state
        assert shown["components"]["ledger"]["committedEpoch"] == "3"
        assert shown["components"]["ledger"]["rollbacks"] == str(rest["rollbacks"])
        for row in topo["checkpoints"]:
            cells = shown["workers"][row["worker"]]
            assert (cells["epoch"], cells["committed"], cells["generation"]) == (
                str(row["epoch"]),
                str(row["committed"]),
                str(row["generation"]),
            )
            assert cells["dirty"].startswith("clean")
            assert cells["rollbacks"] == str(row["rollbacks"])
            assert cells["replayedRecords"] == f"{row['replayedRecords']:,}"
        assert browser.save_screenshot(str(ARTIFACTS / "topology-state.png"))
