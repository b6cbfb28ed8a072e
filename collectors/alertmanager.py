"""Send the collectors' alerts to Alertmanager the way Prometheus does: ``POST /api/v2/alerts``.

Configured in the fleet TOML::

    dashboard_url = "http://dashboard.example:8501"    # links (generatorURL, dashboard_url annotation)

    [[alertmanagers]]
    url = "http://alertmanager.example:9093"
    auth_header = "Bearer s3cret"        # optional: sent as the Authorization header
    resend_s = 60                        # optional: re-send firing alerts this often (default 60)
    timeout_s = 5                        # optional

Every second (`AlertmanagerSender.tick`) the sender reads the open alerts from the database (the
source of truth, so a restarted collector carries on) and POSTs, to every configured Alertmanager:

- a new firing alert at once, then again every ``resend_s`` while it fires, with ``endsAt`` =
  now + 4 x ``resend_s`` (Alertmanager resolves it by itself if the collectors stop);
- a resolved alert with ``endsAt`` = its resolve time, at once and again at every resend for
  ``RESOLVED_RESEND_S`` (so one lost POST does not leave it open).

Labels are stable for an alert's life: ``alertname`` (the rule in CamelCase, as in the exported Prometheus
rules), ``rule``, ``severity``, ``service="prefixops"``, ``instance`` (host:port of the target),
``target`` (its URL), ``role``, ``target_name`` and ``engine`` when set. Annotations: ``summary``,
``description``, ``runbook_url`` and ``dashboard_url`` (the page where the fix is applied).
``generatorURL`` opens the engine's page on the dashboard at the alert's start.

**Silences.** An alert silenced in PrefixOps (it fired under a silence, or a silence matching its rule and
target is active now) is not sent; if it had been sent it is ended (``endsAt`` = now), and it is sent again
if it still fires when the silence ends. Silences set in Alertmanager only mute Alertmanager's receivers:
PrefixOps still shows, records and sends the alert.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from sqlalchemy import Engine, select

from collectors.prom_rules import alert_name
from core.alerts import SPECS, runbook_anchor
from db.models import Alert, Silence, Target

log = logging.getLogger(__name__)

RESOLVED_RESEND_S = 300.0


class AlertmanagerConfigError(ValueError):
    """An [[alertmanagers]] entry or dashboard_url is invalid; the message names the entry and the value."""


@dataclass(frozen=True)
class AlertmanagerTarget:
    url: str
    auth_header: str | None = None
    resend_s: float = 60.0
    timeout_s: float = 5.0

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": self.auth_header} if self.auth_header else {}


def _http_url(value: object, where: str) -> str:
    url = str(value or "").rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise AlertmanagerConfigError(f"{where}: url must be an http(s) URL, got {value!r}")
    return url


def parse_alertmanagers(value: object, where: str) -> tuple[AlertmanagerTarget, ...]:
    """The ``[[alertmanagers]]`` array of tables of a fleet TOML."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise AlertmanagerConfigError(f"{where}: [[alertmanagers]] must be an array of tables")
    out = []
    for i, entry in enumerate(value):
        here = f"{where} alertmanagers[{i}]"
        unknown = sorted(set(entry) - {"url", "auth_header", "resend_s", "timeout_s"})
        if unknown:
            raise AlertmanagerConfigError(
                f"{here}: unknown key(s) {unknown}; allowed: ['auth_header', 'resend_s', 'timeout_s', 'url']"
            )
        numbers = {}
        for key, default in (("resend_s", 60.0), ("timeout_s", 5.0)):
            raw = entry.get(key, default)
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not raw > 0:
                raise AlertmanagerConfigError(
                    f"{here}: {key} must be a positive number of seconds, got {raw!r}"
                )
            numbers[key] = float(raw)
        auth = entry.get("auth_header")
        if auth is not None and (not isinstance(auth, str) or not auth.strip() or "\n" in auth):
            raise AlertmanagerConfigError(
                f"{here}: auth_header must be a one-line string, got {type(auth).__name__}"
            )
        out.append(AlertmanagerTarget(url=_http_url(entry.get("url"), here), auth_header=auth, **numbers))
    urls = [a.url for a in out]
    dupes = sorted({u for u in urls if urls.count(u) > 1})
    if dupes:
        raise AlertmanagerConfigError(f"{where}: alertmanager URL(s) listed twice: {dupes}")
    return tuple(out)


def parse_dashboard_url(value: object, where: str) -> str | None:
    if value is None:
        return None
    return _http_url(value, f"{where} dashboard_url")


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def engine_page_key(target: Mapping[str, Any], by_url: Mapping[str, Mapping[str, Any]]) -> str:
    """The dashboard's engine key of a target (engine name or URL; a sidecar's fronted engine's)."""
    if target.get("role") == "sidecar" and target.get("engine_url") in by_url:
        engine = by_url[target["engine_url"]]
        return str(engine.get("name") or engine["url"])
    return str(target.get("name") or target["url"])


def alert_payload(
    alert: Mapping[str, Any],
    target: Mapping[str, Any],
    by_url: Mapping[str, Mapping[str, Any]],
    *,
    dashboard_url: str | None,
    ends_ts: float,
) -> dict[str, Any]:
    rule = str(alert["rule"])
    spec = SPECS.get(rule)
    url = str(target["url"])
    labels = {
        "alertname": alert_name(rule),
        "rule": rule,
        "severity": str(alert["severity"]),
        "service": "prefixops",
        "instance": urlsplit(url).netloc or url,
        "target": url,
        "role": str(target.get("role") or ""),
    }
    if target.get("name"):
        labels["target_name"] = str(target["name"])
    if alert.get("engine_label"):
        labels["engine"] = str(alert["engine_label"])
    annotations = {
        "summary": str(alert.get("summary") or rule),
        "description": spec.meaning if spec else rule,
        "runbook_url": runbook_anchor(rule) if spec else "",
    }
    generator = ""
    if dashboard_url:
        key = engine_page_key(target, by_url)
        generator = (
            f"{dashboard_url}/engine?engine={quote(key, safe='')}&at={alert['started_ts']:.0f}&range=1h"
        )
        if spec:
            annotations["dashboard_url"] = f"{dashboard_url}/{spec.fix_pages[0]}?engine={quote(key, safe='')}"
    return {
        "labels": labels,
        "annotations": annotations,
        "startsAt": iso(float(alert["started_ts"])),
        "endsAt": iso(ends_ts),
        "generatorURL": generator,
    }


@dataclass
class _Sent:
    last_ts: float
    resolved_ts: float | None = None  # set once the alert was sent as ended


@dataclass
class _Snapshot:
    open_rows: dict[int, dict[str, Any]]
    closed: dict[int, dict[str, Any]]
    targets: dict[int, dict[str, Any]]
    silences: list[tuple[str | None, int | None]]


class AlertmanagerSender:
    """Keeps every configured Alertmanager up to date with the open alerts in the database."""

    def __init__(
        self, engine: Engine, client: httpx.Client, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.engine = engine
        self.client = client
        self.clock = clock
        self.sent: dict[str, dict[int, _Sent]] = {}  # alertmanager URL -> alert id -> last send
        self._errors: dict[str, str] = {}

    def _read(self, now: float, ids: Sequence[int]) -> _Snapshot:
        cols = Alert.__table__.columns
        with self.engine.connect() as conn:
            open_rows = {
                r.id: dict(r._mapping) for r in conn.execute(select(*cols).where(Alert.state == "firing"))
            }
            others = [i for i in ids if i not in open_rows]
            closed = (
                {r.id: dict(r._mapping) for r in conn.execute(select(*cols).where(Alert.id.in_(others)))}
                if others
                else {}
            )
            targets = {
                r.id: dict(r._mapping)
                for r in conn.execute(
                    select(Target.id, Target.url, Target.name, Target.role, Target.engine_url)
                )
            }
            silences = [
                (r.rule, r.target_id)
                for r in conn.execute(
                    select(Silence.rule, Silence.target_id).where(
                        Silence.starts_ts <= now, Silence.ends_ts > now
                    )
                )
            ]
        return _Snapshot(open_rows, closed, targets, silences)

    def tick(self, alertmanagers: Sequence[AlertmanagerTarget], dashboard_url: str | None) -> int:
        """Send what is due to every Alertmanager; returns the number of alerts delivered."""
        if not alertmanagers:
            return 0
        now = self.clock()
        snap = self._read(now, sorted({i for per in self.sent.values() for i in per}))
        by_url = {t["url"]: t for t in snap.targets.values()}

        def muted(a: Mapping[str, Any]) -> bool:
            return bool(a.get("silenced")) or any(
                rule in (None, a["rule"]) and target in (None, a["target_id"])
                for rule, target in snap.silences
            )

        firing = {
            i: a for i, a in snap.open_rows.items() if a.get("target_id") in snap.targets and not muted(a)
        }
        delivered = 0
        for am in alertmanagers:
            sent = dict(self.sent.get(am.url, {}))  # committed only when the POST succeeds
            batch: list[dict[str, Any]] = []
            for alert_id, alert in firing.items():
                last = sent.get(alert_id)
                if last is None or last.resolved_ts is not None or now - last.last_ts >= am.resend_s:
                    batch.append(
                        alert_payload(
                            alert,
                            snap.targets[alert["target_id"]],
                            by_url,
                            dashboard_url=dashboard_url,
                            ends_ts=now + 4 * am.resend_s,
                        )
                    )
                    sent[alert_id] = _Sent(now)
            for alert_id, last in list(sent.items()):
                if alert_id in firing:
                    continue
                ending = snap.closed.get(alert_id) or snap.open_rows.get(alert_id)  # resolved, or muted now
                if ending is None or ending.get("target_id") not in snap.targets:
                    del sent[alert_id]  # gone from the database (target removed): nothing left to end
                    continue
                ended = last.resolved_ts or (
                    float(ending["resolved_ts"]) if ending.get("resolved_ts") else now
                )
                if last.resolved_ts is not None and now - last.resolved_ts >= RESOLVED_RESEND_S:
                    del sent[alert_id]
                    continue
                if last.resolved_ts is None or now - last.last_ts >= am.resend_s:
                    batch.append(
                        alert_payload(
                            ending,
                            snap.targets[ending["target_id"]],
                            by_url,
                            dashboard_url=dashboard_url,
                            ends_ts=ended,
                        )
                    )
                    sent[alert_id] = _Sent(now, ended)
            if not batch or self._post(am, batch):
                self.sent[am.url] = sent
                delivered += len(batch)
        return delivered

    def _post(self, am: AlertmanagerTarget, batch: list[dict[str, Any]]) -> bool:
        try:
            response = self.client.post(
                am.url + "/api/v2/alerts", json=batch, headers=am.headers, timeout=am.timeout_s
            )
            ok = 200 <= response.status_code < 300
            error = None if ok else f"HTTP {response.status_code}: {response.text[:200]!r}"
        except httpx.HTTPError as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"
        if error is not None:
            if self._errors.get(am.url) != error:
                log.warning("alertmanager %s: POST /api/v2/alerts failed: %s (retrying)", am.url, error)
            self._errors[am.url] = error
        elif am.url in self._errors:
            log.info("alertmanager %s: delivering again", am.url)
            del self._errors[am.url]
        return ok
