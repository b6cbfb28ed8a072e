"""`python -m collectors export-rules`: every core rule exported; `promtool check rules` passes;
`promtool test rules` sees every exported alert fire and resolve on synthetic series; inhibit_rules pass
`amtool check-config`; the PrometheusRule manifest carries the same groups."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import yaml

from collectors import prom_export
from collectors.prom_rules import (
    EXPORTS,
    ExportContext,
    NotExpressible,
    alert_name,
    missing_exports,
    rule_groups,
)
from core.alerts import INHIBITIONS, RULES, SPECS, AlertSettings
from tests.collectors.promtools import require_binary, run_tool
from tests.support import REPO

STEP = 15  # seconds between input samples and between rule evaluations
SIDE = {"job": "sidecar", "instance": "s:8100"}
ENG = {"job": "vllm", "instance": "e:8000"}


def steps(minutes: float) -> int:
    return round(minutes * 60 / STEP)


def gauge(*phases: tuple[float, float]) -> list[float]:
    """(minutes, value) phases -> one value per step."""
    return [v for m, v in phases for _ in range(steps(m))]


def counter(*phases: tuple[float, float]) -> list[float]:
    """(minutes, increment per step) phases -> cumulative values."""
    out, total = [], 0.0
    for m, inc in phases:
        for _ in range(steps(m)):
            total += inc
            out.append(total)
    return out


def sel(metric: str, labels: dict[str, str]) -> str:
    return metric + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def values(seq: list[float | None]) -> str:
    return " ".join("_" if v is None else f"{v:g}" for v in seq)


def sidecar_reuse(
    turns: list[tuple[float, float]], cached_fraction: list[tuple[float, float]]
) -> dict[str, list]:
    """Counters of a sidecar whose every known turn hits (R_r = 1); phases of (minutes, turns/step) and
    (minutes, cached fraction); 1000 prompt tokens per turn."""
    per_step_turns = gauge(*turns)
    per_step_cached = gauge(*cached_fraction)
    known, hits, prompt, cached = [], [], [], []
    t = h = p = c = 0.0
    for n, frac in zip(per_step_turns, per_step_cached, strict=True):
        t, h, p, c = t + n, h + n, p + 1000 * n, c + 1000 * n * frac
        known.append(t), hits.append(h), prompt.append(p), cached.append(c)
    return {
        sel("prefixops_sidecar_known_turns_total", SIDE): known,
        sel("prefixops_sidecar_hit_turns_total", SIDE): hits,
        sel("prefixops_sidecar_known_prompt_tokens_total", SIDE): prompt,
        sel("prefixops_sidecar_known_cached_tokens_total", SIDE): cached,
    }


def _collapse_sidecar() -> dict[str, list]:
    series = sidecar_reuse([(20, 15), (15, 5), (15, 15)], [(20, 0.9), (15, 0.2), (15, 0.9)])
    sessions = [8.0] * steps(20) + [8.0 + i for i in range(1, steps(15) + 1)]
    sessions += [max(8.0, sessions[-1] - i) for i in range(1, steps(15) + 1)]
    series[sel("prefixops_sidecar_sessions", {**SIDE, "state": "admitted"})] = sessions
    return series


def _collapse_engine() -> dict[str, list]:
    eng = {**ENG, "engine": "0", "model_name": "m"}
    waiting = [0.0] * steps(20) + [float(i) for i in range(1, steps(15) + 1)]
    waiting += [max(0.0, waiting[-1] - i) for i in range(1, steps(15) + 1)]
    return {
        sel("vllm:prefix_cache_queries_total", eng): counter((50, 15000)),
        sel("vllm:prefix_cache_hits_total", eng): counter((20, 13500), (15, 1500), (15, 13500)),
        sel("vllm:generation_tokens_total", eng): counter((20, 1500), (15, 450), (15, 1500)),
        sel("vllm:num_requests_running", eng): gauge((50, 4)),
        sel("vllm:num_requests_waiting", eng): waiting,
    }


# rule -> (case name, input series, [(minute, firing?)], extra alert labels)
CASES: list[tuple[str, str, dict[str, list], list[tuple[float, bool]], dict[str, str]]] = [
    (
        "target-down",
        "down-and-back",
        {
            sel("up", ENG): [1] * 4 + [0] * 8 + [1] * 8,
            sel("vllm:num_requests_running", {**ENG, "engine": "0"}): [1] * 4 + [None] * 8 + [1] * 8,
        },
        [(0.5, False), (1.75, True), (4.5, False)],
        ENG,
    ),
    (
        "stale-data",
        "scrapes-stop",
        {
            sel("up", ENG): [1] * 3 + [None] * 5 + [1] * 4,
            sel("vllm:num_requests_running", {**ENG, "engine": "0"}): [1] * 3 + [None] * 5 + [1] * 4,
        },
        [(0.25, False), (1.5, True), (2.5, False)],
        ENG,
    ),
    (
        "thin-reuse",
        "enter-hold-exit",
        sidecar_reuse(
            [(18, 10)], [(3, 0.9), (5, 0.3), (5, 0.55), (5, 0.7)]
        ),  # D: 0.1, 0.7, 0.45 (holds), 0.3
        [(2, False), (6, True), (11, True), (17, False)],
        SIDE,
    ),
    (
        "thin-reuse",
        "too-few-turns",
        sidecar_reuse([(10, 2)], [(10, 0.3)]),  # 8 known turns a minute < 20
        [(3, False), (6, False), (9, False)],
        SIDE,
    ),
    (
        "demand-over-band",
        "enter-hold-exit",
        {
            sel("prefixops_sidecar_demand_tokens", SIDE): gauge(
                (3, 50000), (5, 97000), (5, 94000), (5, 90000)
            ),
            sel("prefixops_sidecar_pool_tokens", SIDE): gauge((18, 100000)),
            sel("prefixops_sidecar_band_high", SIDE): gauge((18, 0.95)),
        },
        [(2, False), (6, True), (11, True), (17, False)],
        SIDE,
    ),
    (
        "compaction-in-thin-reuse",
        "grant-then-hold",
        {
            **sidecar_reuse([(20, 10)], [(20, 0.3)]),
            sel(
                "prefixops_sidecar_compaction_decisions_total",
                {**SIDE, "decision": "granted", "urgency": "normal"},
            ): gauge((4, 0), (16, 1)),
        },
        [(3, False), (5, True), (14, True), (19, False)],
        SIDE,
    ),
    (
        "admission-wait",
        "enter-hold-exit",
        {
            sel("prefixops_sidecar_oldest_waiting_seconds", SIDE): gauge((3, 0))
            + [61.0 + STEP * i for i in range(steps(5))]
            + gauge((5, 45), (5, 10)),
        },
        [(2, False), (6, True), (11, True), (17, False)],
        SIDE,
    ),
    (
        "collapse",
        "sidecar",
        _collapse_sidecar(),
        [(19, False), (30, True), (33, True), (48, False)],
        {**SIDE, "scope": "sidecar"},
    ),
    (
        "collapse",
        "engine",
        _collapse_engine(),
        [(19, False), (30, True), (33, True), (48, False)],
        {**ENG, "engine": "0", "scope": "engine"},
    ),
]


def _strip_annotations(groups: dict) -> dict:
    out = copy.deepcopy(groups)
    for group in out["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return out


def _unit_tests(cases) -> dict:
    tests = []
    for rule, _name, series, checks, labels in cases:
        spec = SPECS[rule]
        expected = {"rule": rule, "severity": spec.severity, "service": "prefixops", **labels}
        tests.append(
            {
                "interval": f"{STEP}s",
                "input_series": [{"series": s, "values": values(v)} for s, v in series.items()],
                "alert_rule_test": [
                    {
                        "eval_time": f"{round(minute * 60)}s",
                        "alertname": alert_name(rule),
                        "exp_alerts": [{"exp_labels": expected}] if firing else [],
                    }
                    for minute, firing in checks
                ],
            }
        )
    return {"rule_files": ["rules.yml"], "evaluation_interval": f"{STEP}s", "tests": tests}


def test_every_core_rule_is_exported_with_runbook_and_annotations():
    assert missing_exports() == []
    assert set(EXPORTS) == set(RULES)
    groups = rule_groups(ExportContext(AlertSettings(), dashboard_url="http://dash:8501"))
    alerts = [r for g in groups["groups"] for r in g["rules"] if "alert" in r]
    assert {a["labels"]["rule"] for a in alerts} == set(RULES)
    for a in alerts:
        rule = a["labels"]["rule"]
        assert a["alert"] == alert_name(rule) and a["labels"]["severity"] == SPECS[rule].severity
        ann = a["annotations"]
        assert ann["summary"] and ann["description"]
        assert ann["runbook_url"] == f"docs/runbook.md#{rule}"
        assert ann["dashboard_url"] == f"http://dash:8501/{SPECS[rule].fix_pages[0]}"


def test_thresholds_and_windows_follow_the_settings():
    s = AlertSettings(
        thin_reuse_enter=0.6,
        thin_reuse_exit=0.35,
        thin_reuse_min_turns=30,
        thin_reuse_for_s=45,
        admission_wait_s=120,
        collapse_window_s=600,
    )
    groups = rule_groups(ExportContext(s))
    by_rule = {r["labels"]["rule"]: r for g in groups["groups"] for r in g["rules"] if "alert" in r}
    thin = by_rule["thin-reuse"]
    assert ">= 0.6" in thin["expr"] and "< 0.35" in thin["expr"] and ">= 30" in thin["expr"]
    assert thin["for"] == "45s" and thin["keep_firing_for"] == "30s"
    assert "> 120" in by_rule["admission-wait"]["expr"] and "<= 60" in by_rule["admission-wait"]["expr"]
    assert "ratio_rate10m" in by_rule["collapse"]["expr"]
    assert "approximations" in by_rule["collapse"]["annotations"]["description"]


def test_a_rule_that_promql_cannot_express_is_exported_as_a_marked_placeholder(monkeypatch):
    monkeypatch.setitem(
        EXPORTS, "stale-data", lambda ctx: NotExpressible("stale-data", "needs the collector's clock")
    )
    groups = rule_groups(ExportContext(AlertSettings()))
    stale = next(
        r for g in groups["groups"] for r in g["rules"] if r.get("labels", {}).get("rule") == "stale-data"
    )
    assert stale["annotations"]["not_expressible_in_promql"] == "needs the collector's clock"
    assert "Not expressible in PromQL" in stale["annotations"]["description"]


def test_export_command_writes_files_that_promtool_and_amtool_accept(tmp_path):
    promtool = require_binary("promtool")
    proc = subprocess.run(
        [sys.executable, "-m", "collectors", "export-rules", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    rules = tmp_path / prom_export.RULES_FILE
    assert yaml.safe_load(rules.read_text()) == rule_groups(ExportContext(AlertSettings()))
    check = run_tool([promtool, "check", "rules", str(rules)], tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout

    inhibit = yaml.safe_load((tmp_path / prom_export.INHIBIT_FILE).read_text())["inhibit_rules"]
    assert len(inhibit) == len(INHIBITIONS)
    for entry, (cause, symptoms) in zip(inhibit, INHIBITIONS, strict=True):
        assert f'rule="{cause}"' in entry["source_matchers"]
        assert entry["target_matchers"][-1] == f'rule=~"{"|".join(symptoms)}"'
    amtool = require_binary("amtool")
    config = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}], "inhibit_rules": inhibit}
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(config))
    check = run_tool([amtool, "check-config", str(tmp_path / "alertmanager.yml")], tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr

    manifest = yaml.safe_load((tmp_path / prom_export.MANIFEST_FILE).read_text())
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1" and manifest["kind"] == "PrometheusRule"
    assert manifest["spec"] == rule_groups(ExportContext(AlertSettings()))


def test_every_exported_alert_has_a_promtool_case_that_fires_and_resolves():
    groups = rule_groups(ExportContext(AlertSettings()))
    exported = {
        (r["labels"]["rule"], r["labels"].get("scope"))
        for g in groups["groups"]
        for r in g["rules"]
        if "alert" in r and "not_expressible_in_promql" not in r["annotations"]
    }
    covered = set()
    for rule, _name, _series, checks, labels in CASES:
        states = [firing for _, firing in checks]
        if True in states and states[-1] is False:
            covered.add((rule, labels.get("scope")))
    assert exported <= covered, (
        f"exported alerts without a firing-and-resolving promtool case: {exported - covered}"
    )


def test_promtool_unit_tests_fire_and_resolve_every_alert(tmp_path: Path):
    promtool = require_binary("promtool")
    groups = _strip_annotations(rule_groups(ExportContext(AlertSettings())))
    (tmp_path / "rules.yml").write_text(prom_export.to_yaml(groups))
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(_unit_tests(CASES), sort_keys=False, width=10**6))
    result = run_tool([promtool, "test", "rules", "tests.yml"], tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert "SUCCESS" in result.stdout


def test_promtool_renders_the_annotations(tmp_path: Path):
    promtool = require_binary("promtool")
    (tmp_path / "rules.yml").write_text(prom_export.to_yaml(rule_groups(ExportContext(AlertSettings()))))
    labels = {"rule": "admission-wait", "severity": "warning", "service": "prefixops", **SIDE}
    spec = SPECS["admission-wait"]
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": f"{STEP}s",
        "tests": [
            {
                "interval": f"{STEP}s",
                "input_series": [
                    {
                        "series": sel("prefixops_sidecar_oldest_waiting_seconds", SIDE),
                        "values": values(gauge((3, 90))),
                    }
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "2m",
                        "alertname": "PrefixOpsAdmissionWait",
                        "exp_alerts": [
                            {
                                "exp_labels": labels,
                                "exp_annotations": {
                                    "summary": "sessions on s:8100 wait for admission: the oldest has waited 1m 30s",
                                    "description": f"{spec.meaning} Value: the oldest wait in seconds (90). Fix it on the "
                                    "dashboard's budgeter, sessions page.",
                                    "runbook_url": "docs/runbook.md#admission-wait",
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False, width=10**6))
    result = run_tool([promtool, "test", "rules", "tests.yml"], tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def test_export_reads_the_fleet_config(tmp_path):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('dashboard_url = "http://dash.example:8501"\n[alerts]\nadmission_wait_s = 120\n')
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "collectors",
            "export-rules",
            "--out",
            str(tmp_path / "out"),
            "--config",
            str(fleet),
            "--runbook-base",
            "https://git.example/prefixops/blob/main/",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    groups = yaml.safe_load((tmp_path / "out" / prom_export.RULES_FILE).read_text())
    wait = next(r for g in groups["groups"] for r in g["rules"] if r.get("alert") == "PrefixOpsAdmissionWait")
    assert "> 120" in wait["expr"]
    assert (
        wait["annotations"]["runbook_url"]
        == "https://git.example/prefixops/blob/main/docs/runbook.md#admission-wait"
    )
    assert wait["annotations"]["dashboard_url"] == "http://dash.example:8501/budgeter"
    bad = tmp_path / "bad.toml"
    bad.write_text("[alerts]\nadmission_wait_s = -1\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "collectors",
            "export-rules",
            "--out",
            str(tmp_path / "x"),
            "--config",
            str(bad),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "admission_wait_s must not be negative, got -1" in proc.stderr
