"""core.accounts: account names, roles, password rules and the sign-in throttle, exact values."""

from __future__ import annotations

import pytest

from core.accounts import (
    AccountError,
    SignInPolicy,
    can_act,
    can_manage_accounts,
    check_password,
    check_role,
    lockout_remaining,
    normalize_name,
)


@pytest.mark.parametrize(
    ("name", "stored"),
    [
        ("alice", "alice"),
        (" Alice ", "alice"),
        ("ops@example.com", "ops@example.com"),
        ("a.b_c+d-e", "a.b_c+d-e"),
        ("x" * 64, "x" * 64),
    ],
)
def test_usable_names_are_stored_lower_case(name: str, stored: str) -> None:
    assert normalize_name(name) == stored


@pytest.mark.parametrize("name", ["", " ", "Bob Smith", "a\r\nX-Evil: 1", "élodie", "x" * 65, "-alice", ".a"])
def test_unusable_names_are_refused_with_the_name(name: str) -> None:
    with pytest.raises(AccountError, match="is not usable"):
        normalize_name(name)


def test_roles_and_what_they_may_do() -> None:
    assert [r for r in ("viewer", "operator", "admin") if can_act(r)] == ["operator", "admin"]
    assert [r for r in ("viewer", "operator", "admin") if can_manage_accounts(r)] == ["admin"]
    assert not can_act(None) and not can_manage_accounts(None)
    assert check_role("viewer") == "viewer"
    with pytest.raises(AccountError, match="role must be one of viewer, operator, admin, got 'root'"):
        check_role("root")


def test_password_length_rules() -> None:
    assert check_password("x" * 12) == "x" * 12
    with pytest.raises(AccountError, match="password too short: 11 characters, at least 12 needed"):
        check_password("x" * 11)
    with pytest.raises(AccountError, match="password too long: 1025 characters, at most 1024"):
        check_password("x" * 1025)


def test_lockout_example_of_the_docstring() -> None:
    failures = [0.0, 10.0, 20.0, 30.0, 40.0]
    assert lockout_remaining(failures[:4], 40.0, 5, 300.0) == 0.0
    assert lockout_remaining(failures, 40.0, 5, 300.0) == 260.0
    assert lockout_remaining(failures, 299.0, 5, 300.0) == 1.0
    assert lockout_remaining(failures, 300.0, 5, 300.0) == 0.0  # t = 0 has left the window


def test_lockout_counts_the_newest_failures_and_ignores_future_ones() -> None:
    failures = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert lockout_remaining(failures, 60.0, 5, 300.0) == 260.0  # allowed once t = 20 leaves, at 320
    assert lockout_remaining([100.0] * 5, 50.0, 5, 300.0) == 0.0


def test_policy_rejects_nonsense() -> None:
    assert SignInPolicy().session_ttl_s == 43200.0
    with pytest.raises(ValueError, match="failure limits must be at least 1, got 0 per name"):
        SignInPolicy(max_failures_per_name=0)
    with pytest.raises(ValueError, match="window and session lifetime must be positive"):
        SignInPolicy(window_s=0)
