"""`prefixops-dashboard`: start the Streamlit app from any directory.

`streamlit run app.py` reads `.streamlit/config.toml` from the *current* directory only, so an
installed command started elsewhere would lose the project's server and theme settings (loopback
bind, no telemetry). This launcher turns that file into Streamlit's own ``STREAMLIT_<SECTION>_<KEY>``
environment variables (one source: the file; anything already set in the environment wins) and
runs ``app.py`` by its absolute path. The database and every other setting still resolve against
the directory it was started in, like the collectors', so both commands started in one folder
share ``data/prefixops.db``. Extra arguments go to ``streamlit run`` (``--server.port 8600``).
"""

from __future__ import annotations

import os
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app.py"
CONFIG = ROOT / ".streamlit" / "config.toml"


def config_env(config: Mapping[str, object]) -> dict[str, str]:
    """``{"server": {"port": 8501}}`` -> ``{"STREAMLIT_SERVER_PORT": "8501"}`` (booleans lower-case)."""
    env: dict[str, str] = {}
    for section, values in config.items():
        if not isinstance(values, Mapping):
            continue
        for key, value in values.items():
            name = f"STREAMLIT_{section}_{key}".upper()
            env[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def command(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(APP), *args]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    with CONFIG.open("rb") as f:
        defaults = config_env(tomllib.load(f))
    env = {**defaults, **os.environ}
    os.execvpe(sys.executable, command(args), env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
