"""What an alert card shows, as plain text: readable values, the rule's meaning, its runbook section,
and the pages where its fix is applied (all from `core.alerts`, the rules as data).

- `readable_values`: an alert's stored values without raw dicts, 17-digit floats or epoch stamps
  (``D = 0.80, backlog 120, oldest_waiting 80 s, at 13:02:11 UTC``).
- `runbook_section`: the rule's section of ``docs/runbook.md`` (anchor = the rule's name), shown on
  the card so the next step is one click away even without a docs server.
- `fix_links`: (page file, label) of each page where the fix is applied, the main one first.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from core.alerts import SPECS, causes_of, runbook_anchor

RUNBOOK = Path(__file__).resolve().parent.parent / "docs" / "runbook.md"
PAGE_TITLES = {
    "overview": "Overview",
    "engine": "Engine",
    "sessions": "Sessions",
    "budgeter": "Budgeter",
    "compaction": "Compaction",
    "alerts": "Alerts",
    "audit": "Audit",
}
NAMES = {
    "divergence": "D",
    "token_weighted": "R_t",
    "request_weighted": "R_r",
    "hit_ratio": "hit ratio",
    "demand_fraction": "demand/pool",
}


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def readable_value(key: str, value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, int | float):
        if key.endswith("_ts") or key == "ts":
            return datetime.fromtimestamp(float(value), UTC).strftime("%H:%M:%S UTC")
        if key.endswith("_s"):
            return f"{float(value):.0f} s" if value < 120 else f"{float(value) / 60:.1f} min"
        if key.endswith("fraction") and 0 <= value <= 10:
            return f"{float(value):.0%}"
        return _number(float(value))
    if isinstance(value, dict):
        return "(" + readable_values(value) + ")"
    if isinstance(value, list | tuple):
        return ", ".join(readable_value(key, v) for v in value[:10]) + (" ..." if len(value) > 10 else "")
    return str(value)


def readable_values(values: Any) -> str:
    if not isinstance(values, dict) or not values:
        return "-"
    parts = []
    for key, value in values.items():
        label = NAMES.get(key, key.removesuffix("_ts").removesuffix("_s").replace("_", " "))
        parts.append(
            f"{label} {readable_value(key, value)}"
            if label not in NAMES.values()
            else f"{label} = {readable_value(key, value)}"
        )
    return ", ".join(parts)


def meaning(rule: str) -> str:
    spec = SPECS.get(rule)
    return spec.meaning if spec else "A rule this dashboard does not know (newer collectors?)."


def fix_links(rule: str) -> list[tuple[str, str]]:
    spec = SPECS.get(rule)
    pages = spec.fix_pages if spec else ("engine",)
    return [(f"pages/{p}.py", f"Fix it on the {PAGE_TITLES.get(p, p)} page") for p in pages]


def runbook_ref(rule: str) -> str:
    try:
        return runbook_anchor(rule)
    except KeyError:
        return "docs/runbook.md"


@lru_cache(maxsize=1)
def _runbook_sections() -> dict[str, str]:
    try:
        text = RUNBOOK.read_text()
    except OSError:
        return {}
    sections: dict[str, str] = {}
    for match in re.finditer(r"^## (\S+)\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL):
        sections[match.group(1)] = match.group(2).strip()
    return sections


def runbook_section(rule: str) -> str | None:
    return _runbook_sections().get(rule)


def inhibited_by(rule: str, firing_on_target: set[str]) -> list[str]:
    """The causes of `rule` firing on the same target (the symptom is not what to work on)."""
    return [cause for cause in causes_of(rule) if cause in firing_on_target]
