"""One environment prefix for every process: ``PREFIXOPS_*``.

`setting(env, name)` is the value of ``PREFIXOPS_<NAME>`` in the mapping `env`, else of the
unprefixed ``<NAME>`` when `name` is one of `LEGACY` (names the demo and the first releases
read: ``DATABASE_URL``, ``ENGINE_PORT``, ``SIDECAR_PORT``, ``DASHBOARD_PORT``,
``DEMO_SCENARIO``, ``DEMO_SPEED``, ``DEMO_ENGINE``), else None. Empty or blank values count
as unset. The prefixed name always wins over the unprefixed one.

Pure: the caller passes the environment (``os.environ`` or a test's dict).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

PREFIX: Final = "PREFIXOPS_"
LEGACY: Final = frozenset(
    {
        "DATABASE_URL",
        "ENGINE_PORT",
        "SIDECAR_PORT",
        "DASHBOARD_PORT",
        "DEMO_SCENARIO",
        "DEMO_SPEED",
        "DEMO_ENGINE",
    }
)


def setting(env: Mapping[str, str], name: str) -> str | None:
    """``PREFIXOPS_<name>``, else the unprefixed legacy ``<name>``, else None (blank counts as unset)."""
    name = name.removeprefix(PREFIX)
    for key in (PREFIX + name, name if name in LEGACY else None):
        if key is not None:
            value = env.get(key)
            if value is not None and value.strip():
                return value.strip()
    return None
