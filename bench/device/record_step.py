"""Record one finished step of bench/device/gpu.sh into $OUT at once, so a run killed later still returns it.

    python3 bench/device/record_step.py OUT WORK NAME EXIT SECONDS LIMIT

WORK/NAME.json is the step's stdout (one JSON document, or whatever it printed before it was killed),
WORK/NAME.log its stderr, WORK/card the card's name once the script knows it. Appends one line to
OUT/steps.jsonl ({"step", "card", "exit", "seconds", "limit_s", "result": the document or null, "stdout_tail"
where it was not one, "log_tail"}) and rewrites OUT/summary.json (every step so far without its result) and
OUT/logs.tar.gz (every log so far), each through a temporary file renamed over the old, under a lock (steps may
end together: the models are built in the background). Three of the eight files the device tool brings back
(gpu.sh's $OUT/running.log, the stderr of the step under way, is the fourth).
"""
from __future__ import annotations

import fcntl
import io
import json
import os
import sys
import tarfile
from pathlib import Path


def replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def tail(path: Path, lines: int) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""


def main(argv: list[str]) -> int:
    out, work, name, rc, seconds, limit = Path(argv[0]), Path(argv[1]), argv[2], *map(int, argv[3:6])
    card_file = work / "card"
    card = card_file.read_text().strip() if card_file.is_file() else None
    stdout = (work / f"{name}.json").read_text(errors="replace") if (work / f"{name}.json").is_file() else ""
    try:
        result = json.loads(stdout) if stdout.strip() else None
        cut = None
    except json.JSONDecodeError:  # killed mid-print, or not JSON at all
        result, cut = None, stdout[-2000:]
    if card is None and name.startswith("adapter") and isinstance(result, dict):  # the probe names the card
        card = result.get("device")
    line = {"step": name, "card": card, "exit": rc, "seconds": seconds, "limit_s": limit, "result": result}
    if cut is not None:
        line["stdout_tail"] = cut
    line["log_tail"] = tail(work / f"{name}.log", 5)
    with open(work / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(out / "steps.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        steps = [json.loads(s) for s in (out / "steps.jsonl").read_text().splitlines()]
        summary = [{k: s[k] for k in ("step", "card", "exit", "seconds", "limit_s")} for s in steps]
        replace(out / "summary.json", json.dumps({"steps": summary}, indent=1).encode())
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for log in sorted(work.glob("*.log")):
                tar.add(log, arcname=log.name)
        replace(out / "logs.tar.gz", buf.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
