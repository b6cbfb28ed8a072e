"""Canonical signal names, re-exported from `core.signals` (the single definition)."""

from core.signals import *  # noqa: F403
from core.signals import ALL_SIGNALS, ENGINE_SIGNALS, SIDECAR_SIGNALS, TARGET_SIGNALS  # noqa: F401
