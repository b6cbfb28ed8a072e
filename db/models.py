"""SQLAlchemy 2 declarative models: the schema the collectors write and the pages read.

Conventions (stable; columns may be added, never renamed):

- Every timestamp is a float of Unix epoch seconds (UTC), column names end in ``_ts``
  (``samples.ts`` and ``rollups_1m.ts`` too).
- ``engine_label`` is the value of an engine's ``engine`` label (vLLM data-parallel
  rank, SGLang ``dp_rank``), or ``""`` when the target has none (sidecars, engines
  without the label). `db.queries` turns ``""`` into ``None`` for callers.
- ``signal`` values are the canonical names in `core.signals`.
- JSON columns hold the sidecar's own objects as received, so nothing a sidecar
  adds is lost; the typed columns next to them are read defensively (None when
  the sidecar did not send the field).
- The collectors process is the only writer, except ``audit`` rows with
  ``source='dashboard'``, ``alerts.acknowledged_*`` and ``silences``, which the
  dashboard writes, and ``accounts``, ``account_sessions`` and ``security_log``,
  which the dashboard and its CLI (`python -m dashboard accounts ...`) write.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, float: Double}


class Target(Base):
    """One scraped endpoint: an engine's /metrics or a sidecar's /state (and friends)."""

    __tablename__ = "targets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str] = mapped_column(String(512), unique=True)  # base URL, no trailing slash
    role: Mapped[str] = mapped_column(String(16))  # "engine" | "sidecar"
    kind: Mapped[str] = mapped_column(String(16), default="unknown")  # vllm|sglang|sidecar|unknown
    configured_kind: Mapped[str] = mapped_column(String(16), default="auto")  # vllm|sglang|auto|sidecar
    name: Mapped[str | None] = mapped_column(String(200))
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    engine_url: Mapped[str | None] = mapped_column(String(512))  # sidecars: the engine it fronts
    configured: Mapped[bool] = mapped_column(Boolean, default=True)  # in the current target list
    interval_s: Mapped[float] = mapped_column(default=1.0)
    up: Mapped[bool] = mapped_column(Boolean, default=False)
    last_scrape_ts: Mapped[float | None]
    last_success_ts: Mapped[float | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    last_error_ts: Mapped[float | None]
    scrape_duration_s: Mapped[float | None]
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    process_start_ts: Mapped[float | None]  # engine's process_start_time_seconds, to detect restarts
    created_ts: Mapped[float]


class Series(Base):
    """One time series: (target, engine label, canonical signal)."""

    __tablename__ = "series"
    __table_args__ = (UniqueConstraint("target_id", "engine_label", "signal"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    engine_label: Mapped[str] = mapped_column(String(64), default="")
    signal: Mapped[str] = mapped_column(String(64))


class Sample(Base):
    """Raw samples, kept for the raw retention window (default 24 h)."""

    __tablename__ = "samples"
    __table_args__ = {"sqlite_with_rowid": False}

    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(primary_key=True)
    value: Mapped[float]


class Rollup1m(Base):
    """1-minute rollups of raw samples (minute start in ``ts``), kept 30 days."""

    __tablename__ = "rollups_1m"
    __table_args__ = {"sqlite_with_rowid": False}

    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(primary_key=True)
    min: Mapped[float]
    max: Mapped[float]
    mean: Mapped[float]
    last: Mapped[float]
    count: Mapped[int] = mapped_column(Integer)


class Rollup10m(Base):
    """10-minute rollups built from the 1-minute ones (minute start of the period in ``ts``), kept as
    long as those; they keep week- and month-long views to a few thousand rows per series."""

    __tablename__ = "rollups_10m"
    __table_args__ = {"sqlite_with_rowid": False}

    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(primary_key=True)
    min: Mapped[float]
    max: Mapped[float]
    mean: Mapped[float]
    last: Mapped[float]
    count: Mapped[int] = mapped_column(Integer)


class SidecarState(Base):
    """The latest /state JSON per sidecar."""

    __tablename__ = "sidecar_state"

    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"), primary_key=True)
    ts: Mapped[float]
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    regime: Mapped[str | None] = mapped_column(String(32))
    budgeter_mode: Mapped[str | None] = mapped_column(String(32))
    compaction_deferred_until: Mapped[float | None]
    warnings: Mapped[list[Any] | None] = mapped_column(JSON)


class Session(Base):
    """Sessions a sidecar knows, as of its latest /sessions answer (``present`` false once gone)."""

    __tablename__ = "sessions"
    __table_args__ = (UniqueConstraint("target_id", "session_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    session_id: Mapped[str] = mapped_column(String(256))
    state: Mapped[str | None] = mapped_column(String(32))  # admitted | parked | waiting | ...
    context_tokens: Mapped[int | None] = mapped_column(Integer)
    turns: Mapped[int | None] = mapped_column(Integer)
    manual: Mapped[bool | None] = mapped_column(Boolean)
    pinned: Mapped[bool | None] = mapped_column(Boolean)
    last_cached_fraction: Mapped[float | None]
    present: Mapped[bool] = mapped_column(Boolean, default=True)
    first_seen_ts: Mapped[float]
    last_seen_ts: Mapped[float]
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Subtree(Base):
    """Shared prompt prefixes a sidecar reports, as of its latest /subtrees answer."""

    __tablename__ = "subtrees"
    __table_args__ = (UniqueConstraint("target_id", "subtree_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    subtree_id: Mapped[str] = mapped_column(String(256))
    tokens: Mapped[int | None] = mapped_column(Integer)
    warm: Mapped[bool | None] = mapped_column(Boolean)
    pinned: Mapped[bool | None] = mapped_column(Boolean)
    recent_hits: Mapped[float | None]
    last_hit_ts: Mapped[float | None]
    present: Mapped[bool] = mapped_column(Boolean, default=True)
    first_seen_ts: Mapped[float]
    last_seen_ts: Mapped[float]
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class CompactionDecision(Base):
    """Compaction gate decisions fetched incrementally from /compaction/decisions?after_id=N."""

    __tablename__ = "compaction_decisions"
    __table_args__ = (UniqueConstraint("target_id", "epoch", "remote_id"), Index(None, "ts"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    # Which of the sidecar's logs: a sidecar whose state db was wiped numbers its entries from 1 again.
    epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    remote_id: Mapped[int] = mapped_column(Integer)  # the sidecar's own ascending id
    ts: Mapped[float]
    subtree_id: Mapped[str | None] = mapped_column(String(256))
    decision: Mapped[str | None] = mapped_column(String(32))  # e.g. grant | defer | deny
    granted: Mapped[bool | None] = mapped_column(Boolean)
    reason: Mapped[str | None] = mapped_column(Text)
    divergence: Mapped[float | None]
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Turn(Base):
    """The sidecars' turn trace (GET /turns?after_id=N), one row per turn; no prompt content.

    Kept as long as raw samples (``raw_retention_h``)."""

    __tablename__ = "turns"
    __table_args__ = (
        UniqueConstraint("target_id", "epoch", "remote_id"),
        Index(None, "ts"),
        Index(None, "session_id", "ts"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # as for decisions
    remote_id: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float]
    session_id: Mapped[str | None] = mapped_column(String(256))
    subtree_id: Mapped[str | None] = mapped_column(String(256))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    held_s: Mapped[float | None]
    parked_s: Mapped[float | None]
    latency_s: Mapped[float | None]
    outcome: Mapped[str | None] = mapped_column(String(32))
    model: Mapped[str | None] = mapped_column(String(200))


class AuditEntry(Base):
    """The audit trail: sidecar audit entries (source='sidecar') and dashboard actions (source='dashboard')."""

    __tablename__ = "audit"
    __table_args__ = (UniqueConstraint("target_id", "epoch", "remote_id"), Index(None, "ts"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source: Mapped[str] = mapped_column(String(16))  # sidecar | dashboard | collector
    target_id: Mapped[int | None] = mapped_column(ForeignKey("targets.id", ondelete="SET NULL"))
    epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # as for decisions
    remote_id: Mapped[int | None] = mapped_column(Integer)  # sidecar's id; NULL for dashboard rows
    ts: Mapped[float]
    actor: Mapped[str | None] = mapped_column(String(200))
    action: Mapped[str | None] = mapped_column(String(200))
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    outcome: Mapped[str | None] = mapped_column(Text)  # ok | error message | HTTP status ...
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Alert(Base):
    """One alert episode: opened when a rule fires for (rule, target, engine label), closed on resolve."""

    __tablename__ = "alerts"
    __table_args__ = (Index(None, "state"), Index(None, "rule", "target_id", "engine_label"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rule: Mapped[str] = mapped_column(String(64))
    target_id: Mapped[int | None] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    engine_label: Mapped[str] = mapped_column(String(64), default="")
    severity: Mapped[str] = mapped_column(String(16))  # critical | warning | info
    state: Mapped[str] = mapped_column(String(16))  # firing | resolved
    started_ts: Mapped[float]
    resolved_ts: Mapped[float | None]
    last_eval_ts: Mapped[float | None]
    summary: Mapped[str] = mapped_column(Text)
    values: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    acknowledged_by: Mapped[str | None] = mapped_column(String(200))
    acknowledged_ts: Mapped[float | None]
    silenced: Mapped[bool] = mapped_column(Boolean, default=False)  # a silence matched when it fired


class Silence(Base):
    """Mutes notifications for a rule and/or target (NULL = any) from starts_ts to ends_ts."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rule: Mapped[str | None] = mapped_column(String(64))
    target_id: Mapped[int | None] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    starts_ts: Mapped[float]
    ends_ts: Mapped[float]
    created_by: Mapped[str | None] = mapped_column(String(200))
    created_ts: Mapped[float]
    comment: Mapped[str | None] = mapped_column(Text)


class Notification(Base):
    """Outbox of webhook deliveries; the unique key keeps a restart from sending twice."""

    __tablename__ = "notifications"
    __table_args__ = (UniqueConstraint("alert_id", "event", "webhook_url"), Index(None, "sent_ts"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(16))  # firing | resolved | acknowledged
    webhook_url: Mapped[str] = mapped_column(String(1024))
    payload_format: Mapped[str] = mapped_column(String(16), default="json")  # json | alertmanager
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_ts: Mapped[float]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_ts: Mapped[float]
    sent_ts: Mapped[float | None]
    failed: Mapped[bool] = mapped_column(Boolean, default=False)  # gave up after max attempts
    last_error: Mapped[str | None] = mapped_column(Text)


class CollectorHeartbeat(Base):
    """One row per collector process name, updated every tick."""

    __tablename__ = "collector_heartbeat"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    pid: Mapped[int] = mapped_column(Integer)
    host: Mapped[str | None] = mapped_column(String(200))
    started_ts: Mapped[float]
    last_beat_ts: Mapped[float]
    targets: Mapped[int] = mapped_column(Integer, default=0)
    targets_up: Mapped[int] = mapped_column(Integer, default=0)
    config_path: Mapped[str | None] = mapped_column(String(1024))
    info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class CollectorState(Base):
    """Small key/value bookkeeping (rollup watermark, last retention run)."""

    __tablename__ = "collector_state"

    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[float | None]
    text: Mapped[str | None] = mapped_column(Text)


class Account(Base):
    """An individual operator account (see core.accounts for names and roles); the password only as a hash."""

    __tablename__ = "accounts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)  # lower case, core.accounts.NAME_RE
    role: Mapped[str] = mapped_column(String(16))  # viewer | operator | admin
    password_hash: Mapped[str] = mapped_column(String(255))  # argon2id, PHC string format
    created_ts: Mapped[float]
    created_by: Mapped[str | None] = mapped_column(String(200))
    password_changed_ts: Mapped[float]
    last_sign_in_ts: Mapped[float | None]


class AccountSession(Base):
    """A signed-in browser: the SHA-256 of its random session token (the token itself is only in the cookie)."""

    __tablename__ = "account_sessions"
    __table_args__ = (Index(None, "account_id"), Index(None, "expires_ts"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    created_ts: Mapped[float]
    expires_ts: Mapped[float]
    client: Mapped[str | None] = mapped_column(String(200))


class SecurityEvent(Base):
    """The security log: sign-ins (both outcomes), sign-outs and account changes; kept apart from the audit."""

    __tablename__ = "security_log"
    __table_args__ = (Index(None, "ts"), Index(None, "account", "ts"), Index(None, "client", "ts"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float]
    event: Mapped[str] = mapped_column(String(32))  # sign-in | sign-out | account.add | account.remove | ...
    account: Mapped[str | None] = mapped_column(String(200))  # the account concerned (as typed, for failures)
    outcome: Mapped[str] = mapped_column(String(200))  # ok | wrong password | locked | ...
    method: Mapped[str | None] = mapped_column(String(16))  # password | oidc | cli
    client: Mapped[str | None] = mapped_column(String(200))  # the browser's address, when known
    actor: Mapped[str | None] = mapped_column(String(200))  # who made an account change
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
