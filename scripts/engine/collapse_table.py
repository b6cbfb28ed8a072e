"""Print the collapse table (Markdown) from the run.json files under a directory (scripts/engine/collapse-table.sh)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def fmt(v: object) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def main(root: Path) -> int:
    runs = [json.loads(p.read_text()) for p in sorted(root.glob("**/run.json"))]
    runs.sort(key=lambda r: (r["seed"], r["scenario"] != "agent-steady", r["control"] != "off"))
    print(
        "| seed | scenario | control | collapsed (min 3) | degraded at minutes | degraded at end | recovered "
        "| min to recover | R_t before / during / after | turns/s before / during / after | engine preemptions "
        "| sessions at end |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        s = r["summary"]
        ph = s.get("phases", {})
        rt = " / ".join(fmt(ph.get(k, {}).get("token_weighted")) for k in ("before", "during", "after"))
        tps = " / ".join(fmt(ph.get(k, {}).get("turns_per_s")) for k in ("before", "during", "after"))
        degraded = ", ".join(str(m) for m in s["degraded_at"]) or "none"
        print(
            f"| {r['seed']} | {r['scenario']} | {r['control']} | {s['collapsed']} | {degraded} | "
            f"{s['degraded_at_end']} | {s['recovered']} | {fmt(s['minutes_to_recover'])} | {rt} | {tps} | "
            f"{fmt(s['preemptions'])} | {int(s['end_sessions_in_system'])} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
