"""tests/xdist_groups.py: under ``-n 2 --dist loadgroup`` one worker runs a whole xdist_group.

The suite this guards: ``tests/engine/test_real_engine.py`` shares one real vLLM engine (a session
fixture) between its tests, and a split group starts a second engine on the other worker.
"""

from __future__ import annotations

import os
import subprocess
import textwrap

from tests.support import PYTHON, REPO

CONFTEST = """
import os
import pytest

pytest_plugins = ["tests.xdist_groups"]


@pytest.fixture(scope="session")
def expensive():
    with open(os.environ["STARTS"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    yield


@pytest.fixture(autouse=True)
def record(request):
    with open(os.environ["RAN"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + " " + request.node.nodeid + "\\n")
"""
GROUPED = (
    """
import pytest

pytestmark = [pytest.mark.xdist_group(name="engine"), pytest.mark.timeout(60)]
"""
    + "".join(f"\n\ndef test_g{i}(expensive):\n    pass\n" for i in range(6))
    + """

@pytest.mark.parametrize("k", [1, 2])
def test_p(expensive, k):
    pass
"""
)
OTHERS = "".join(f"\n\ndef test_o{i}():\n    pass\n" for i in range(20))


def test_a_group_runs_on_one_worker_and_its_session_fixture_starts_once(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_others.py").write_text(OTHERS)
    starts, ran = tmp_path / "starts", tmp_path / "ran"
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-v",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=REPO,
        env={**os.environ, "STARTS": str(starts), "RAN": str(ran), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    rows = [line.split(" ", 1) for line in ran.read_text().splitlines()]
    grouped = [(worker, nodeid) for worker, nodeid in rows if "test_grouped.py" in nodeid]
    assert len(grouped) == 8 and len(rows) == 28, rows
    assert all(nodeid.endswith("@engine") for _, nodeid in grouped), grouped
    workers = {worker for worker, _ in grouped}
    assert len(workers) == 1, f"the group was split over {sorted(workers)}: {grouped}"
    assert starts.read_text().split() == list(workers), "the session fixture started once"
