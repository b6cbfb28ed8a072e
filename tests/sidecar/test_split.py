"""Issue 10 item 1 for the sidecar: reads never advance the regime, reasons reach the audit, ConfigError
names its field, settings take their defaults from core and the flags from the settings."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from core.budgeter import BudgeterConfig, ConfigError
from core.compaction import CompactionPolicy, WarmthConfig
from core.reuse import RegimeConfig
from sidecar.settings import Settings, SettingsError, build_parser, settings_from_args
from tests.support import REPO

from .conftest import OP_HEADERS, sidecar

pytestmark = pytest.mark.anyio
FLAGS_DOC = Path(REPO, "docs", "sidecar-flags.md")


async def storm(h: object) -> None:
    for i in range(30):
        await h.chat(f"storm{i}", system="p" * 64, content=f"question {i} " + "q" * 400, max_tokens=1)  # type: ignore[attr-defined]


async def test_no_read_advances_the_regime_only_the_tick_does(tmp_path: Path) -> None:
    async with sidecar(tmp_path, regime_min_turns=5) as h:
        await storm(h)
        assert h.cp.regime.regime == "normal" and h.cp.regime.changes == 0
        assert (await h.state())["reuse"]["regime"] == "normal"
        assert (await h.client.get("/metrics")).status_code == 200
        decided = (await h.client.post("/compaction/requests", json={"subtrees": ["a"]})).json()
        assert decided["regime"] == "normal"
        assert h.cp.regime.changes == 0
        h.cp.tick()
        assert h.cp.regime.regime == "thin-reuse" and h.cp.regime.changes == 1
        assert (await h.state())["reuse"]["regime"] == "thin-reuse"


async def test_park_and_allow_reasons_reach_the_audit(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        await h.chat("s1")
        r = await h.client.post(
            "/control/sessions/s1/park", json={"reason": "hogging the pool"}, headers=OP_HEADERS
        )
        assert r.status_code == 200, r.text
        await h.client.post("/control/compaction/defer", json={"minutes": 5}, headers=OP_HEADERS)
        r = await h.client.post(
            "/control/compaction/allow", json={"reason": "incident over"}, headers=OP_HEADERS
        )
        assert r.status_code == 200, r.text
        audit = (await h.client.get("/audit")).json()
        park = next(a for a in audit if a["action"] == "session.park")
        allow = next(a for a in audit if a["action"] == "compaction.allow")
        assert park["params"] == {"session": "s1", "reason": "hogging the pool"}
        assert allow["params"] == {"reason": "incident over"}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"mode": "nope"}, "mode"),
        ({"low": 2.0}, "low"),
        ({"high": 0.0}, "high"),
        ({"low": 0.9, "high": 0.8}, "low"),
        ({"session_cap": 0}, "session_cap"),
        ({"bogus": 1}, "bogus"),
        ({"latency_limit_s": -1.0}, "latency_limit_s"),
    ],
)
def test_config_error_carries_its_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        BudgeterConfig().replace(**changes)
    assert info.value.field == field


def test_settings_defaults_come_from_the_core_configs() -> None:
    s, b, r, w, p = Settings(), BudgeterConfig(), RegimeConfig(), WarmthConfig(), CompactionPolicy()
    assert (s.mode, s.low, s.high, s.session_cap, s.latency_limit_s, s.default_output_budget) == (
        b.mode,
        b.low,
        b.high,
        b.session_cap,
        b.latency_limit_s,
        b.default_output_budget,
    )
    assert (s.regime_enter, s.regime_exit, s.regime_min_turns) == (r.enter, r.exit, r.min_turns)
    assert (s.warmth_window_s, s.warmth_floor, s.top_k_pinned) == (w.window_s, w.floor, p.top_k_pinned)
    source = Path(REPO, "sidecar", "settings.py").read_text()
    for literal in ("0.75", "0.95", "0.5,", "0.4,"):
        assert literal not in source, f"sidecar/settings.py restates {literal}"


OLD_FLAGS = [
    "--engine",
    "--host",
    "--port",
    "--state-db",
    "--pool-tokens",
    "--max-hold",
    "--window-s",
    "--last-n",
    "--idle-timeout",
    "--mode",
    "--low",
    "--high",
    "--session-cap",
    "--latency-limit",
    "--default-output-budget",
    "--regime-enter",
    "--regime-exit",
    "--regime-min-turns",
    "--warmth-window",
    "--warmth-floor",
    "--top-k-pinned",
    "--max-body-bytes",
    "--engine-timeout",
    "--engine-transport",
    "--pool-refresh",
    "--log-level",
    "--access-log",
    "--loop",
    "--http",
]


def test_every_flag_is_a_settings_field_and_the_old_flags_still_work() -> None:
    parser = build_parser({})
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    assert dests <= {f.name for f in fields(Settings)}
    options = {o for a in parser._actions for o in a.option_strings}
    assert set(OLD_FLAGS) <= options
    s = settings_from_args(
        [
            "--max-hold",
            "5",
            "--low",
            "0.5",
            "--high",
            "0.6",
            "--access-log",
            "--allowed-hosts",
            "a.example, b.example",
        ],
        {
            "PREFIXOPS_SIDECAR_PORT": "9100",
            "PREFIXOPS_OPERATOR_TOKEN": "x" * 8,
            "PREFIXOPS_CLIENT_TOKEN": "c" * 8,
        },
    )
    assert (s.max_hold_s, s.low, s.high, s.access_log, s.port) == (5.0, 0.5, 0.6, True, 9100)
    assert s.allowed_hosts == ("a.example", "b.example") and s.operator_token == "x" * 8
    assert s.client_token == "c" * 8
    with pytest.raises(SettingsError, match="PREFIXOPS_SIDECAR_PORT"):
        settings_from_args([], {"PREFIXOPS_SIDECAR_PORT": "many"})


def flags_markdown() -> str:
    from sidecar.settings import flags_table

    return flags_table()


def test_flags_doc_is_generated_from_the_parser() -> None:
    expected = flags_markdown()
    assert FLAGS_DOC.read_text() == expected, (
        "docs/sidecar-flags.md drifted from the settings: run python -m sidecar.settings > docs/sidecar-flags.md"
    )


def test_help_runs_from_the_command_line() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "sidecar", "--help"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert (
        run.returncode == 0 and "--allowed-hosts" in run.stdout and "PREFIXOPS_SIDECAR_ENGINE" in run.stdout
    )
