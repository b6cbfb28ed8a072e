"""`python -m dashboard accounts ...`: add (password from standard input), list, role, password, remove."""

from __future__ import annotations

import io
import json
import subprocess

from db import accounts, make_engine
from tests.support import PYTHON, REPO

PASSWORD = "a long enough password"


def run(url: str, *args: str, stdin: str = "") -> tuple[int, str]:
    from dashboard.__main__ import main

    out = io.StringIO()
    code = main(["--database-url", url, "accounts", *args], stdin=io.StringIO(stdin), stdout=out)
    return code, out.getvalue()


def test_accounts_lifecycle_from_the_command_line(tmp_path, capsys) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"  # no database yet: the CLI migrates it first
    assert run(url, "list") == (0, "no accounts\n")
    assert run(url, "add", "Ada", "--role", "admin", stdin=PASSWORD + "\n") == (0, "added ada (admin)\n")
    assert run(url, "add", "bob", "--role", "operator", stdin=PASSWORD + "\n") == (
        0,
        "added bob (operator)\n",
    )
    code, out = run(url, "list", "--json")
    assert code == 0 and [
        (a["name"], a["role"], a["created_by"].endswith("(shell)")) for a in json.loads(out)
    ] == [("ada", "admin", True), ("bob", "operator", True)]
    assert run(url, "role", "bob", "--role", "viewer") == (0, "bob is now viewer\n")
    engine = make_engine(url)
    assert accounts.sign_in(engine, "bob", PASSWORD).identity == accounts.Identity("bob", "viewer")
    assert run(url, "password", "bob", stdin="another long password\n")[0] == 0
    assert accounts.sign_in(engine, "bob", PASSWORD).identity is None
    assert run(url, "remove", "bob") == (0, "removed bob\n")
    assert [
        e["event"] for e in reversed(accounts.security_events(engine, since=0)) if e["method"] == "cli"
    ] == ["account.add", "account.add", "account.role", "account.password", "account.remove"]
    capsys.readouterr()


def test_refusals_exit_1_and_say_why(tmp_path, capsys) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert run(url, "add", "eve", "--role", "operator", stdin="short\n")[0] == 1
    assert "password too short: 5 characters, at least 12 needed" in capsys.readouterr().err
    assert run(url, "add", "eve x", "--role", "operator", stdin=PASSWORD + "\n")[0] == 1
    assert "account name 'eve x' is not usable" in capsys.readouterr().err
    assert run(url, "add", "eve", "--role", "operator")[0] == 1
    assert "no password on standard input" in capsys.readouterr().err
    assert run(url, "remove", "nobody")[0] == 1
    assert "no account named 'nobody'" in capsys.readouterr().err


def test_the_real_command_reads_the_password_from_a_pipe(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    done = subprocess.run(
        [PYTHON, "-m", "dashboard", "--database-url", url, "accounts", "add", "ops", "--role", "operator"],
        input=PASSWORD + "\n",
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (0, "added ops (operator)\n"), done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    bad = subprocess.run(
        [PYTHON, "-m", "dashboard", "accounts", "add", "x", "--role", "root"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert bad.returncode == 2 and "invalid choice: 'root'" in bad.stderr
