"""The one SQL read layer: every read of the collectors' schema (`db.models`) that the pages,
`collectors status` and the tests make, and the dashboard's few writes.

Every function takes a SQLAlchemy ``Connection`` (or ``Engine``) and returns plain data: lists of
dicts with the column names of `db.models`, timestamps as epoch-second floats, ``engine`` = the
engine label or None. The dashboard builds its pandas frames on these (`dashboard.frames`); it
runs no SQL of its own.

By concern:

- `db.queries.targets`: targets, collectors' heartbeats;
- `db.queries.latest`: the newest sample per series, per target (`latest_samples`, `latest_signals`),
  also as of a past time; each target's scrape health at a past time (`up_as_of`);
- `db.queries.series`: points over a time range at a bounded resolution (`series_range`);
- `db.queries.sidecar`: sidecar /state, sessions, subtrees, compaction decisions, the audit;
- `db.queries.turns`: the turn trace and missed tokens by cause (`miss_attribution`, with the engine's
  KV block size from `engine_block_size`);
- `db.queries.alerts`: alerts and silences, and the dashboard writes (`record_dashboard_action`,
  `acknowledge_alert`, `add_silence`, `expire_silence`).
"""

from db.queries.alerts import (
    acknowledge_alert,
    add_silence,
    alerts,
    expire_silence,
    open_alerts,
    record_dashboard_action,
    silences,
)
from db.queries.latest import latest_samples, latest_signals, latest_value, target_totals, up_as_of
from db.queries.series import (
    DEFAULT_MAX_POINTS,
    RAW_RETENTION_KEY,
    ROLLUP10_WATERMARK_KEY,
    ROLLUP_WATERMARK_KEY,
    choose_resolution,
    rollup_watermark,
    series_range,
)
from db.queries.sidecar import audit, compaction_decisions, sessions, sidecar_state, subtrees
from db.queries.targets import heartbeat, target_by_url, targets
from db.queries.turns import engine_block_size, miss_attribution, pressure_intervals, turns

__all__ = [
    "DEFAULT_MAX_POINTS",
    "RAW_RETENTION_KEY",
    "ROLLUP10_WATERMARK_KEY",
    "ROLLUP_WATERMARK_KEY",
    "acknowledge_alert",
    "add_silence",
    "alerts",
    "audit",
    "choose_resolution",
    "compaction_decisions",
    "expire_silence",
    "heartbeat",
    "latest_samples",
    "latest_signals",
    "latest_value",
    "open_alerts",
    "record_dashboard_action",
    "rollup_watermark",
    "series_range",
    "sessions",
    "sidecar_state",
    "silences",
    "subtrees",
    "target_by_url",
    "target_totals",
    "targets",
    "engine_block_size",
    "miss_attribution",
    "pressure_intervals",
    "turns",
    "up_as_of",
]
