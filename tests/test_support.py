"""tests/support.py's own behaviour where a failure report depends on it: what a time-out and a failed
process attach, so that a flake in CI says why it failed without a re-run."""

import pytest

from tests.support import PYTHON, NotYet, running, wait_for


def test_a_time_out_names_how_far_the_predicate_got():
    with pytest.raises(AssertionError) as failed:
        wait_for(lambda: NotYet({"token_weighted": 0.41}), 0.05, "the collapse", interval=0.01)
    assert "waiting for the collapse (last seen: not yet: {'token_weighted': 0.41})" in str(failed.value)
    assert wait_for(lambda: NotYet(1) or "done", 0.05) == "done"


def test_a_failure_attaches_the_logs_the_process_wrote_itself_without_access_lines(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "loadgen.log").write_text("sessions active 3\nloadgen: the engine refused every turn\n")
    (logs / "sidecar.log").write_text(
        'INFO:     127.0.0.1:5000 - "GET /state HTTP/1.1" 200 OK\nsidecar: engine unreachable\n'
    )
    cmd = [PYTHON, "-c", "print('parent up', flush=True); import time; time.sleep(30)"]
    with pytest.raises(RuntimeError) as failed, running(cmd, name="parent", log_dir=logs):
        raise RuntimeError("the body failed")
    notes = "\n".join(failed.value.__notes__)
    assert "--- last output of parent" in notes
    assert f"--- last output of {logs / 'loadgen.log'} ---\nsessions active 3\nloadgen: the engine" in notes
    assert "sidecar: engine unreachable" in notes
    assert "GET /state" not in notes
