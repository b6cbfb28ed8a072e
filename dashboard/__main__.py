"""`python -m dashboard`: manage the dashboard's operator accounts from the server's shell.

    python -m dashboard accounts add NAME --role viewer|operator|admin   # password from standard input
    python -m dashboard accounts list [--json]
    python -m dashboard accounts remove NAME
    python -m dashboard accounts role NAME --role ROLE
    python -m dashboard accounts password NAME                            # new password from standard input

The password is read from standard input: typed twice without echo at a terminal,
else the first line (``printf '%s\\n' "$PW" | python -m dashboard accounts add ...``),
so it never appears in the process list or the shell history. The database is
``--database-url`` > ``$PREFIXOPS_DATABASE_URL`` > ``$DATABASE_URL`` > ``sqlite:///data/prefixops.db``; its schema
is migrated to the newest first (as the collectors do on start). Every change is
written to the security log with the method ``cli`` and the acting OS user.
Exit status: 0 done, 1 refused (the message says why), 2 usage error.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import sys
from typing import TextIO

from core.accounts import ROLES, AccountError, normalize_name

log = logging.getLogger("dashboard.cli")


def read_password(stdin: TextIO, *, prompt: str = "Password: ") -> str:
    """The password from a terminal (asked twice, no echo) or the first line of piped standard input."""
    if stdin.isatty():
        first = getpass.getpass(prompt)
        if getpass.getpass("Again: ") != first:
            raise AccountError("the two passwords typed differ")
        return first
    line = stdin.readline()
    if not line:
        raise AccountError("no password on standard input (pipe it in, one line)")
    return line.rstrip("\r\n")


def _os_user() -> str:
    try:
        return f"{getpass.getuser()} (shell)"
    except Exception:
        return "shell"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dashboard", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url",
        default=None,
        help="default: $PREFIXOPS_DATABASE_URL, else $DATABASE_URL, else sqlite:///data/prefixops.db",
    )
    groups = parser.add_subparsers(dest="group", required=True)
    acc = groups.add_parser("accounts", help="operator accounts").add_subparsers(
        dest="command", required=True
    )
    add = acc.add_parser("add", help="create an account (password from standard input)")
    add.add_argument("name", help="1-64 ASCII letters, digits or . _ @ + - (stored in lower case)")
    add.add_argument(
        "--role",
        required=True,
        choices=ROLES,
        help="viewer reads; operator also acts and silences; admin also manages accounts",
    )
    lst = acc.add_parser("list", help="every account with its role and last sign-in")
    lst.add_argument("--json", action="store_true", help="a JSON list of accounts instead of text")
    rm = acc.add_parser("remove", help="delete an account and end its sessions")
    rm.add_argument("name")
    role = acc.add_parser("role", help="change an account's role")
    role.add_argument("name")
    role.add_argument("--role", required=True, choices=ROLES)
    pw = acc.add_parser("password", help="set a new password (from standard input) and end its sessions")
    pw.add_argument("name")
    return parser


def _fmt_ts(ts: float | None) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if ts else "never"


def main(argv: list[str] | None = None, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    stdin = sys.stdin if stdin is None else stdin
    out = sys.stdout if stdout is None else stdout
    from sqlalchemy.exc import SQLAlchemyError

    from db import accounts, database_url, make_engine
    from db.migrate import upgrade

    url = database_url(args.database_url)
    actor = _os_user()
    try:
        engine = make_engine(url)
        upgrade(engine)
        if args.command == "list":
            rows = accounts.list_accounts(engine)
            if args.json:
                out.write(json.dumps(rows, indent=2) + "\n")
            elif not rows:
                out.write("no accounts\n")
            else:
                for r in rows:
                    out.write(
                        f"{r['name']:<32} {r['role']:<9} last sign-in {_fmt_ts(r['last_sign_in_ts'])}, "
                        f"{r['sessions']} signed-in session(s)\n"
                    )
        elif args.command == "add":
            normalize_name(args.name)  # refuse a bad name before asking for a password
            who = accounts.add_account(
                engine, args.name, args.role, read_password(stdin), actor=actor, method="cli"
            )
            out.write(f"added {who.name} ({who.role})\n")
        elif args.command == "remove":
            accounts.remove_account(engine, args.name, actor=actor, method="cli")
            out.write(f"removed {args.name.strip().lower()}\n")
        elif args.command == "role":
            accounts.set_role(engine, args.name, args.role, actor=actor, method="cli")
            out.write(f"{args.name.strip().lower()} is now {args.role}\n")
        elif args.command == "password":
            accounts.set_password(
                engine, args.name, read_password(stdin, prompt="New password: "), actor=actor, method="cli"
            )
            out.write(f"password of {args.name.strip().lower()} changed; its sessions are ended\n")
    except AccountError as exc:
        print(f"python -m dashboard accounts {args.command}: {exc}", file=sys.stderr)
        return 1
    except SQLAlchemyError as exc:
        print(
            f"python -m dashboard accounts {args.command}: database {url.split('@')[-1]}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0]}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
