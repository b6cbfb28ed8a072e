"""The collectors' TOML configuration: targets, webhooks, retention and alert settings.

Format (all sections optional; see docs/collectors.md)::

    [collector]
    interval_s = 1.0            # default scrape interval per target
    timeout_s = 2.0             # HTTP timeout per request
    raw_retention_h = 24        # raw samples kept
    rollup_retention_d = 30     # 1-minute rollups kept
    max_page_bytes = 20_000_000 # larger /metrics pages are a failed scrape

    [[engines]]
    url = "http://10.0.0.5:8000"   # base URL; /metrics is added
    kind = "auto"                  # vllm | sglang | auto
    name = "gpu-a/0"
    labels = { cluster = "eu-1", model = "llama-3.1-8b" }
    interval_s = 1.0

    [[engines]]                    # engines read from a Prometheus query API (collectors.prom_source)
    url = "http://prometheus:9090"
    kind = "prometheus"
    matchers = 'job="vllm"'
    auth_header = "Bearer ..."     # optional

    [[sidecars]]
    url = "http://10.0.0.5:8100"
    engine = "http://10.0.0.5:8000"  # the engine it fronts
    name = "gpu-a/0 sidecar"
    viewer_token = "..."             # sent as Authorization: Bearer on reads
    operator_token = "..."           # not used by the collectors; the dashboard reads it

    [[webhooks]]
    url = "https://hooks.example/alerts"
    format = "alertmanager"          # json | alertmanager
    max_attempts = 8
    headers = { Authorization = "Bearer ..." }

    [alerts]                         # any field of core.alerts.AlertSettings
    thin_reuse_enter = 0.5
    admission_wait_s = 60

    dashboard_url = "http://dash.example:8501"  # top level: links in alerts (generatorURL)
    [[alertmanagers]]                # alerts POSTed to Alertmanager's API v2 (collectors.alertmanager)
    url = "http://alertmanager.example:9093"
    auth_header = "Bearer ..."       # optional Authorization header

Errors: `ConfigError` names the file, the entry and the offending value.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from collectors.alertmanager import (
    AlertmanagerConfigError,
    AlertmanagerTarget,
    parse_alertmanagers,
    parse_dashboard_url,
)
from core.alerts import AlertSettings

ENGINE_KINDS = ("vllm", "sglang", "auto", "prometheus")
WEBHOOK_FORMATS = ("json", "alertmanager")


class ConfigError(ValueError):
    """A configuration file or command-line target that cannot be used; the message says why."""


def normalise_url(url: str, *, where: str = "target") -> str:
    url = (url or "").strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{where}: URL must be http(s)://host[:port][/path], got {url!r}")
    for suffix in ("/metrics", "/state"):
        if url.endswith(suffix):
            raise ConfigError(
                f"{where}: give the base URL, not {suffix} (the collector adds it), got {url!r}"
            )
    return url


def check_matchers(matchers: str, where: str) -> str:
    """Prometheus label matchers (``job="vllm", cluster=~"eu-.*"``), lightly checked: Prometheus
    validates them fully at query time."""
    text = matchers.strip().strip("{}").strip()
    if text and ("=" not in text or any(c in text for c in "\n{}")):
        raise ConfigError(
            f'{where}: matchers must look like \'job="vllm", cluster=~"eu-.*"\', got {matchers!r}'
        )
    return text


def _positive(value: Any, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{where}: {name} must be a positive number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class EngineTarget:
    url: str
    kind: str = "auto"
    name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    interval_s: float | None = None
    # kind = "prometheus" only (collectors.prom_source): label matchers and an Authorization header.
    matchers: str = ""
    auth_header: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ENGINE_KINDS:
            raise ConfigError(f"engine {self.url}: kind must be one of {ENGINE_KINDS}, got {self.kind!r}")
        if self.kind != "prometheus" and (self.matchers or self.auth_header):
            raise ConfigError(
                f'engine {self.url}: matchers and auth_header apply to kind = "prometheus" only'
            )
        if self.kind == "prometheus":
            check_matchers(self.matchers, f"engine {self.url}")


@dataclass(frozen=True)
class SidecarTarget:
    url: str
    engine: str | None = None
    name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    viewer_token: str | None = None
    operator_token: str | None = None
    interval_s: float | None = None


@dataclass(frozen=True)
class Webhook:
    url: str
    format: str = "json"
    max_attempts: int = 8
    timeout_s: float = 5.0
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.format not in WEBHOOK_FORMATS:
            raise ConfigError(
                f"webhook {self.url}: format must be one of {WEBHOOK_FORMATS}, got {self.format!r}"
            )
        if self.max_attempts < 1:
            raise ConfigError(f"webhook {self.url}: max_attempts must be at least 1, got {self.max_attempts}")


@dataclass(frozen=True)
class CollectorConfig:
    engines: tuple[EngineTarget, ...] = ()
    sidecars: tuple[SidecarTarget, ...] = ()
    webhooks: tuple[Webhook, ...] = ()
    interval_s: float = 1.0
    timeout_s: float = 2.0
    raw_retention_s: float = 24 * 3600.0
    rollup_retention_s: float = 30 * 86400.0
    max_page_bytes: int = 20_000_000
    alerts: AlertSettings = field(default_factory=AlertSettings)
    source: str | None = None  # the file it came from
    alertmanagers: tuple[AlertmanagerTarget, ...] = ()  # [[alertmanagers]]: see collectors.alertmanager
    dashboard_url: str | None = None  # the dashboard's base URL, for links in alerts

    def interval_for(self, target: EngineTarget | SidecarTarget) -> float:
        return target.interval_s or self.interval_s

    def with_cli_targets(self, engines: list[str], sidecars: list[str]) -> CollectorConfig:
        """Add --engine/--sidecar targets (``URL`` or ``NAME=URL``; engines of auto kind) to the file's
        targets, without duplicates; a name given on the command line names a target the file lists."""
        from dataclasses import replace

        def parsed(values: list[str], flag: str) -> dict[str, str | None]:
            out: dict[str, str | None] = {}
            for value in values:
                name, url = cli_target(value, flag)
                out[url] = name or out.get(url)
            return out

        cli_e, cli_s = parsed(engines, "--engine"), parsed(sidecars, "--sidecar")
        file_engines = tuple(replace(e, name=cli_e.get(e.url) or e.name) for e in self.engines)
        file_sidecars = tuple(replace(t, name=cli_s.get(t.url) or t.name) for t in self.sidecars)
        known_engines = {e.url for e in self.engines}
        known_sidecars = {t.url for t in self.sidecars}
        extra_e = tuple(EngineTarget(url=u, name=n) for u, n in cli_e.items() if u not in known_engines)
        extra_s = tuple(SidecarTarget(url=u, name=n) for u, n in cli_s.items() if u not in known_sidecars)
        return replace(self, engines=file_engines + extra_e, sidecars=file_sidecars + extra_s)


def cli_target(value: str, flag: str) -> tuple[str | None, str]:
    """``URL`` or ``NAME=URL`` (a display name, e.g. ``gpu-a=http://10.0.0.5:8000``) -> (name, base URL)."""
    name, sep, rest = value.partition("=")
    if sep and "://" not in name:
        name = name.strip()
        if not name:
            raise ConfigError(f"{flag}: the name before '=' is empty in {value!r} (use NAME=URL or URL)")
        return name, normalise_url(rest, where=f"{flag} {name}")
    return None, normalise_url(value, where=flag)


def _table_list(data: dict[str, Any], key: str, path: str) -> list[dict[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"{path}: [[{key}]] must be an array of tables")
    return value


def _check_keys(entry: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _labels(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: labels must be a table of strings, got {value!r}")
    return {str(k): str(v) for k, v in value.items()}


def parse_config(data: dict[str, Any], path: str = "<config>") -> CollectorConfig:
    """Validate a parsed TOML document into a CollectorConfig (raises ConfigError)."""
    _check_keys(
        data,
        {"collector", "engines", "sidecars", "webhooks", "alerts", "alertmanagers", "dashboard_url"},
        path,
    )
    general = data.get("collector", {})
    if not isinstance(general, dict):
        raise ConfigError(f"{path}: [collector] must be a table")
    _check_keys(
        general,
        {"interval_s", "timeout_s", "raw_retention_h", "rollup_retention_d", "max_page_bytes"},
        f"{path} [collector]",
    )
    engines = []
    for i, entry in enumerate(_table_list(data, "engines", path)):
        where = f"{path} engines[{i}]"
        _check_keys(entry, {"url", "kind", "name", "labels", "interval_s", "matchers", "auth_header"}, where)
        engines.append(
            EngineTarget(
                url=normalise_url(str(entry.get("url", "")), where=where),
                kind=str(entry.get("kind", "auto")),
                name=entry.get("name"),
                labels=_labels(entry.get("labels"), where),
                matchers=str(entry.get("matchers", "")),
                auth_header=entry.get("auth_header"),
                interval_s=_positive(entry["interval_s"], "interval_s", where)
                if "interval_s" in entry
                else None,
            )
        )
    sidecars = []
    for i, entry in enumerate(_table_list(data, "sidecars", path)):
        where = f"{path} sidecars[{i}]"
        _check_keys(
            entry, {"url", "engine", "name", "labels", "viewer_token", "operator_token", "interval_s"}, where
        )
        engine = entry.get("engine")
        sidecars.append(
            SidecarTarget(
                url=normalise_url(str(entry.get("url", "")), where=where),
                engine=normalise_url(str(engine), where=f"{where} engine") if engine else None,
                name=entry.get("name"),
                labels=_labels(entry.get("labels"), where),
                viewer_token=entry.get("viewer_token"),
                operator_token=entry.get("operator_token"),
                interval_s=_positive(entry["interval_s"], "interval_s", where)
                if "interval_s" in entry
                else None,
            )
        )
    webhooks = []
    for i, entry in enumerate(_table_list(data, "webhooks", path)):
        where = f"{path} webhooks[{i}]"
        _check_keys(entry, {"url", "format", "max_attempts", "timeout_s", "headers"}, where)
        url = str(entry.get("url", ""))
        if urlsplit(url).scheme not in ("http", "https"):
            raise ConfigError(f"{where}: url must be http(s), got {url!r}")
        webhooks.append(
            Webhook(
                url=url,
                format=str(entry.get("format", "json")),
                max_attempts=int(entry.get("max_attempts", 8)),
                timeout_s=_positive(entry.get("timeout_s", 5.0), "timeout_s", where),
                headers=_labels(entry.get("headers"), where),
            )
        )
    for kind, items in (("engine", engines), ("sidecar", sidecars)):
        urls = [t.url for t in items]
        dupes = sorted({u for u in urls if urls.count(u) > 1})
        if dupes:
            raise ConfigError(f"{path}: {kind} URL(s) listed twice: {dupes}")
    alert_table = data.get("alerts", {})
    try:
        alert_settings = AlertSettings.from_mapping(alert_table)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path} [alerts]: {exc}") from None
    try:
        alertmanagers = parse_alertmanagers(data.get("alertmanagers"), path)
        dashboard_url = parse_dashboard_url(data.get("dashboard_url"), path)
    except AlertmanagerConfigError as exc:
        raise ConfigError(str(exc)) from None
    return CollectorConfig(
        engines=tuple(engines),
        sidecars=tuple(sidecars),
        webhooks=tuple(webhooks),
        alertmanagers=alertmanagers,
        dashboard_url=dashboard_url,
        interval_s=_positive(general.get("interval_s", 1.0), "interval_s", f"{path} [collector]"),
        timeout_s=_positive(general.get("timeout_s", 2.0), "timeout_s", f"{path} [collector]"),
        raw_retention_s=_positive(general.get("raw_retention_h", 24), "raw_retention_h", path) * 3600.0,
        rollup_retention_s=_positive(general.get("rollup_retention_d", 30), "rollup_retention_d", path)
        * 86400.0,
        max_page_bytes=int(_positive(general.get("max_page_bytes", 20_000_000), "max_page_bytes", path)),
        alerts=alert_settings,
        source=path,
    )


def load_config(path: str | Path) -> CollectorConfig:
    """Read and validate a TOML file (raises ConfigError with the file name and the problem)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return parse_config(data, str(p))


class ConfigWatcher:
    """Re-reads the config file when its modification time or size changes.

    `poll()` returns a new CollectorConfig after a change, None otherwise; a broken edit is
    reported once (logged by the caller) and the previous config stays in force.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._stamp = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def poll(self) -> CollectorConfig | None:
        stamp = self._stat()
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        return load_config(self.path)


def config_from_args(
    config_path: str | None, engines: list[str], sidecars: list[str], interval_s: float | None = None
) -> CollectorConfig:
    """The command line's configuration: the file (if any), its --engine/--sidecar targets, --interval."""
    config = load_config(config_path) if config_path else CollectorConfig()
    config = config.with_cli_targets(engines, sidecars)
    if interval_s is not None:
        from dataclasses import replace

        if interval_s <= 0:
            raise ConfigError(f"--interval must be positive, got {interval_s}")
        config = replace(config, interval_s=interval_s)
    return config
