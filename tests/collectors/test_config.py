from __future__ import annotations

import os

import pytest

from collectors.config import (
    CollectorConfig,
    ConfigError,
    ConfigWatcher,
    EngineTarget,
    load_config,
    parse_config,
)

GOOD = """
[collector]
interval_s = 2
timeout_s = 1.5
raw_retention_h = 12
rollup_retention_d = 7

[[engines]]
url = "http://10.0.0.5:8000/"
kind = "vllm"
name = "gpu-a/0"
labels = { cluster = "eu-1", model = "llama" }

[[engines]]
url = "http://10.0.0.6:30000"
kind = "sglang"
interval_s = 5

[[sidecars]]
url = "http://10.0.0.5:8100"
engine = "http://10.0.0.5:8000"
viewer_token = "v"
operator_token = "o"

[[webhooks]]
url = "https://hooks.example/alerts"
format = "alertmanager"
max_attempts = 3

[alerts]
thin_reuse_enter = 0.6
thin_reuse_exit = 0.45
"""


def test_full_config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    config = load_config(path)
    assert [e.url for e in config.engines] == ["http://10.0.0.5:8000", "http://10.0.0.6:30000"]
    assert (
        config.engines[0].labels == {"cluster": "eu-1", "model": "llama"} and config.engines[0].kind == "vllm"
    )
    assert config.interval_for(config.engines[0]) == 2 and config.interval_for(config.engines[1]) == 5
    assert config.sidecars[0].engine == "http://10.0.0.5:8000" and config.sidecars[0].viewer_token == "v"
    assert config.webhooks[0].format == "alertmanager" and config.webhooks[0].max_attempts == 3
    assert config.raw_retention_s == 12 * 3600 and config.rollup_retention_s == 7 * 86400
    assert config.alerts.thin_reuse_enter == 0.6
    assert config.source == str(path)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ('[[engines]]\nurl = "10.0.0.5:8000"', "URL must be http"),
        ('[[engines]]\nurl = "http://h:1/metrics"', "give the base URL"),
        ('[[engines]]\nurl = "http://h:1"\nkind = "tgi"', "kind must be one of"),
        ('[[engines]]\nurl = "http://h:1"\ncolour = "red"', "unknown key"),
        ('[[engines]]\nurl = "http://h:1"\n[[engines]]\nurl = "http://h:1/"', "listed twice"),
        ('[[engines]]\nurl = "http://h:1"\ninterval_s = 0', "interval_s must be a positive number"),
        ('[[webhooks]]\nurl = "http://h"\nformat = "slack"', "format must be one of"),
        ("[alerts]\nthin_reuse_exit = 0.9", "thin_reuse_exit must be below"),
        ("[nope]\nx = 1", "unknown key"),
    ],
)
def test_bad_config_is_rejected_with_the_offending_value(doc, message):
    import tomllib

    with pytest.raises(ConfigError, match=message):
        parse_config(tomllib.loads(doc), "c.toml")


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[engines]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_cli_targets_merge_without_duplicates():
    config = CollectorConfig().with_cli_targets(["http://a:1/", "http://a:1"], ["http://s:2"])
    assert [e.url for e in config.engines] == ["http://a:1"] and config.engines[0].kind == "auto"
    assert [s.url for s in config.sidecars] == ["http://s:2"]
    with pytest.raises(ConfigError, match="--engine"):
        CollectorConfig().with_cli_targets(["ftp://x"], [])


def test_cli_targets_take_a_display_name():
    file_config = CollectorConfig(engines=(EngineTarget("http://b:1", name="from-file"),))
    config = file_config.with_cli_targets(
        ["gpu-a=http://a:1/", "http://c:1", "gpu-b = http://b:1"], ["gpu-a sidecar=http://s:2"]
    )
    assert [(e.url, e.name) for e in config.engines] == [
        ("http://b:1", "gpu-b"),
        ("http://a:1", "gpu-a"),
        ("http://c:1", None),
    ]
    assert [(s.url, s.name) for s in config.sidecars] == [("http://s:2", "gpu-a sidecar")]
    with pytest.raises(ConfigError, match="name before '=' is empty"):
        CollectorConfig().with_cli_targets(["=http://a:1"], [])
    with pytest.raises(ConfigError, match="--engine gpu-a: URL must be"):
        CollectorConfig().with_cli_targets(["gpu-a=a:1"], [])


def test_environment_prefix_for_config_and_database(monkeypatch, tmp_path):
    from collectors.__main__ import _run_parser
    from db import database_url

    monkeypatch.setenv("PREFIXOPS_CONFIG", str(tmp_path / "fleet.toml"))
    monkeypatch.setenv("DATABASE_URL", "sqlite:///legacy.db")
    assert _run_parser().parse_args([]).config == str(tmp_path / "fleet.toml")
    assert database_url() == "sqlite:///legacy.db"  # the unprefixed name is still read
    monkeypatch.setenv("PREFIXOPS_DATABASE_URL", "sqlite:///prefixed.db")
    assert (
        database_url() == "sqlite:///prefixed.db" and database_url("sqlite:///cli.db") == "sqlite:///cli.db"
    )


def test_watcher_sees_changes_and_reports_broken_edits(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[[engines]]\nurl = "http://a:1"\n')
    watcher = ConfigWatcher(path)
    assert watcher.poll() is None
    path.write_text('[[engines]]\nurl = "http://a:1"\n[[engines]]\nurl = "http://b:2"\n')
    os.utime(path, ns=(1, 10**18))
    assert [e.url for e in watcher.poll().engines] == ["http://a:1", "http://b:2"]
    assert watcher.poll() is None
    path.write_text("[[engines]\n")
    with pytest.raises(ConfigError):
        watcher.poll()
