"""The pages' data as plain objects and pandas frames, built on `db.queries` (the one SQL layer).

No SQL here: each function calls a `db.queries` read and shapes its rows for a page. The pages
wrap these in `st.cache_data(ttl=...)` (see `dashboard.data`) and use this package as one
namespace (``from dashboard import frames as q``); its modules, by concern:

- `engines`: what an engine is (an engine target with the sidecars fronting it), the targets'
  health and the collectors' heartbeats;
- `series`: the latest values and the charts' series frames, data-parallel ranks combined;
- `records`: the sidecars' documents, the audit log, alerts, silences and chart events;
- `writes`: what the pages write (their audit rows, acknowledgements, silences).
"""

from __future__ import annotations

from dashboard.frames.engines import (
    EngineRef,
    Latest,
    TargetHealth,
    heartbeats,
    list_engines,
    natural_key,
    target_health,
)
from dashboard.frames.records import (
    ALERT_COLUMNS,
    SESSION_COLUMNS,
    SIGN_IN_ACTIONS,
    alerts_frame,
    audit_frame,
    decisions_frame,
    events_frame,
    firing_at,
    sessions_frame,
    sidecar_states,
    silences_frame,
    subtrees_frame,
)
from dashboard.frames.series import (
    LONG_SPAN_MAX_POINTS,
    LONG_SPAN_S,
    MAX_POINTS,
    combine_ranks,
    latest,
    max_points_for,
    series_frame,
    step_for_span,
)
from dashboard.frames.writes import acknowledge_alert, add_silence, expire_silence, write_audit

__all__ = [
    "ALERT_COLUMNS",
    "LONG_SPAN_MAX_POINTS",
    "LONG_SPAN_S",
    "MAX_POINTS",
    "SESSION_COLUMNS",
    "SIGN_IN_ACTIONS",
    "EngineRef",
    "Latest",
    "TargetHealth",
    "acknowledge_alert",
    "add_silence",
    "alerts_frame",
    "audit_frame",
    "combine_ranks",
    "decisions_frame",
    "events_frame",
    "expire_silence",
    "firing_at",
    "heartbeats",
    "latest",
    "list_engines",
    "max_points_for",
    "natural_key",
    "series_frame",
    "sessions_frame",
    "sidecar_states",
    "silences_frame",
    "step_for_span",
    "subtrees_frame",
    "target_health",
    "write_audit",
]
