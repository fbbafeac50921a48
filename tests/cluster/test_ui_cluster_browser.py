"""The cluster page and the topology page's buttons in a real browser, over a real cluster.

Nimbus serves the UI (``--ui-port``), a supervisor runs the workers; chromium headless
(selenium) reads the cluster page, then rebalances and deactivates from the topology page.
A screenshot of the cluster page is kept in ``.artifacts/ui/`` (git-ignored).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spark_storm.cluster.state import ClusterState
from tests.support import ROOT, wait_until, wordcount
from tests.support.cluster import Daemons, nimbus_with_ui, ports, running_workers, submit

pytestmark = [pytest.mark.cluster, pytest.mark.browser]

ARTIFACTS = ROOT / ".artifacts" / "ui"

_READ = """
const rows = (sel) => [...document.querySelectorAll(sel)].map((tr) => {
  const cells = {};
  for (const td of tr.querySelectorAll('td')) cells[td.dataset.field || td.querySelector('.badge') && 'status' || '?'] = td.textContent;
  return cells;
});
const stats = {};
for (const s of document.querySelectorAll('.stat')) stats[s.querySelector('.label').textContent] = s.querySelector('.value').textContent;
return {
  stats,
  nimbus: rows('#nimbus tbody tr[data-nimbus]'),
  supervisors: rows('#supervisors tbody tr[data-supervisor]'),
  topologies: rows('#topologies tbody tr[data-topology]'),
  slots: rows('#slots tbody tr'),
};
"""


def _press(driver: Any, button: str, workers: int | None = None) -> None:
    driver.find_element("id", button).click()
    dialog = driver.find_element("id", "confirm")
    wait_until(lambda: dialog.get_attribute("open") is not None, what="the confirmation dialog")
    assert "topology wordcount" in driver.find_element("id", "confirm-text").text
    if workers is not None:
        box = driver.find_element("id", "confirm-workers")
        assert box.is_displayed()
        box.clear()
        box.send_keys(str(workers))
    driver.find_element("id", "confirm-ok").click()


def _stat(driver: Any, label: str) -> str:
    return str(
        driver.execute_script(
            "const s = document.querySelector(`#topology-stats .stat[data-stat='${arguments[0]}'] .value`);"
            "return s ? s.textContent : '';",
            label,
        )
    )


def test_cluster_page_and_topology_buttons_in_a_browser(
    daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path, browser: Any
) -> None:
    nimbus, ui = nimbus_with_ui(daemons)
    nimbus.wait_for("is the leader")
    sup = daemons.supervisor(ports(2), sid="sup-a")
    sup.wait_for("offering")
    submit(zk, wordcount(tmp_path), 1)
    running_workers(daemons, state, "wordcount", 1)
    leader = state.nimbus_leader()

    browser.get(f"{ui.base}/")

    def page() -> dict[str, Any]:
        got: dict[str, Any] = browser.execute_script(_READ)
        return got

    def shows_the_cluster() -> bool:
        p = page()
        return (
            p["stats"].get("Nimbus leader") == leader
            and [(n["host"], n["status"]) for n in p["nimbus"]] == [(leader, "Leader")]
            and [(s["id"], s["slots"]) for s in p["supervisors"]] == [("sup-a", "1 / 2")]
            and [t["status"] for t in p["topologies"]] == ["ACTIVE"]
            # .get: until the worker's first heartbeat the slots table holds its "no worker" row
            and [(s.get("supervisor"), s.get("status")) for s in p["slots"]] == [("sup-a", "active")]
        )

    wait_until(
        shows_the_cluster, what=f"the cluster page to show nimbus, supervisor and topology: {page()}", timeout=30
    )
    assert page()["stats"]["Slots used / total"] == "1 / 2"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "cluster-page.png"
    assert browser.save_screenshot(str(shot))
    print(f"\nscreenshot of the cluster page: {shot}")

    browser.get(f"{ui.base}/topology.html?id=wordcount")
    wait_until(lambda: _stat(browser, "assignment") == "v1", what="the topology page to show assignment v1")
    assert _stat(browser, "workers") == "1 of 1"
    # Rebalance to 2 workers from the page: nimbus writes v2, the page follows
    _press(browser, "btn-rebalance", workers=2)
    wait_until(
        lambda: (a := state.read_assignment("wordcount")) is not None and a.version == 2 and len(a.slots) == 2,
        what="assignment v2 with 2 slots",
        timeout=30,
    )
    # The page writes its message when the POST's answer arrives, which may be after nimbus wrote v2
    wait_until(
        lambda: "rebalance wordcount: success" in browser.find_element("id", "message").text,
        what="the page's message that the rebalance succeeded",
        timeout=30,
    )
    running_workers(daemons, state, "wordcount", 2)
    wait_until(lambda: _stat(browser, "assignment") == "v2", what="the page to show v2", timeout=30)
    wait_until(lambda: _stat(browser, "workers") == "2 of 2", what="the page to show 2 of 2 workers", timeout=30)
    # Deactivate from the page: the status in ZooKeeper
    _press(browser, "btn-deactivate")
    wait_until(
        lambda: (r := state.find_topology("wordcount")) is not None and r.status == "inactive",
        what="the topology inactive in ZooKeeper",
    )
    wait_until(lambda: _stat(browser, "status") == "INACTIVE", what="the page to show INACTIVE")
