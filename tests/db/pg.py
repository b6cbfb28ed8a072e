"""A throwaway PostgreSQL server for storage and collector tests.

`postgres_server()` yields a server URL: $PREFIXOPS_TEST_POSTGRES_URL when set, else a
cluster made with initdb in a temporary directory and started with pg_ctl on a free loopback
port (as the `postgres` user when the tests run as root). Without PostgreSQL binaries the
tests that need it skip with the reason, except under CI=true, where they fail.
`fresh_database(server_url)` creates an empty database per test and returns its URL.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.support import free_port, unavailable


def _bin_dir() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _unavailable(reason: str) -> None:
    unavailable("PostgreSQL tests", reason)


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    env_url = os.environ.get("PREFIXOPS_TEST_POSTGRES_URL")
    if env_url:
        yield env_url
        return
    bin_dir = _bin_dir()
    if bin_dir is None:
        _unavailable(
            "PostgreSQL binaries (initdb, pg_ctl) not found; install the Debian package "
            "`postgresql` or set PREFIXOPS_TEST_POSTGRES_URL"
        )
    as_root = os.geteuid() == 0
    prefix: list[str] = []
    owner = None
    if as_root:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("running as root and there is no `postgres` user to run the server as")
        prefix = ["runuser", "-u", "postgres", "--"]
    base = Path(tempfile.mkdtemp(prefix="prefixops-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    if owner is not None:
        for p in (base, sock):
            os.chown(p, owner.pw_uid, owner.pw_gid)
    port = free_port()
    log = base / "server.log"
    try:
        subprocess.run(
            prefix
            + [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        opts = (
            f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=200"
        )
        started = subprocess.run(
            prefix
            + [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                opts,
                "-l",
                str(log),
                "-w",
                "-t",
                "60",
                "start",
            ],
            capture_output=True,
            timeout=90,
        )
        if started.returncode != 0:
            detail = log.read_text(errors="replace")[-2000:] if log.exists() else started.stderr.decode()
            raise RuntimeError(f"pg_ctl start failed: {detail}")
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(
                prefix + [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(base, ignore_errors=True)


def fresh_database(server_url: str) -> str:
    """CREATE an empty database on the server and return its URL."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(server_url)
    name = f"t_{uuid.uuid4().hex[:12]}"
    conninfo = f"host={url.host} port={url.port} user={url.username} dbname={url.database}"
    if url.password:
        conninfo += f" password={url.password}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name, drivername="postgresql+psycopg").render_as_string(hide_password=False)
