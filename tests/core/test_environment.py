"""core.environment: exact values of the one environment prefix with legacy fallbacks."""

from __future__ import annotations

from core.environment import setting


def test_prefixed_name_wins_and_legacy_names_fall_back() -> None:
    env = {
        "PREFIXOPS_DATABASE_URL": "sqlite:///a.db",
        "DATABASE_URL": "sqlite:///b.db",
        "ENGINE_PORT": "9000",
        "PREFIXOPS_CONFIG": " fleet.toml ",
        "CONFIG": "ignored.toml",
        "PREFIXOPS_DEMO_SPEED": "  ",
    }
    assert setting(env, "DATABASE_URL") == "sqlite:///a.db"
    assert setting(env, "PREFIXOPS_DATABASE_URL") == "sqlite:///a.db"
    assert setting(env, "ENGINE_PORT") == "9000"
    assert setting(env, "CONFIG") == "fleet.toml"  # CONFIG is not a legacy name: only the prefixed one counts
    assert setting({"CONFIG": "x.toml"}, "CONFIG") is None
    assert setting(env, "DEMO_SPEED") is None  # blank is unset
    assert setting({"DATABASE_URL": "sqlite:///b.db"}, "DATABASE_URL") == "sqlite:///b.db"
    assert setting({}, "SIDECAR_PORT") is None
