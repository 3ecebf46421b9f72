"""A wall-clock limit for the pipeline (`dmtp pipeline --deadline SECONDS`): a scheduler's job limit, a spot
instance's notice.

Optional stages (`OPTIONAL_UNDER_DEADLINE`) start only when their cost fits in the time left: the longest measured run
of the stage in this work folder (`TIMES`) or a declared one (`--costs FILE`, a JSON object stage -> seconds); a stage
of unknown cost is started. At the deadline less `reserve` seconds the running stage is interrupted (artifacts are
written atomically and stages resume), the results are packed (`--archive`), and the same command resumes.
"""
from __future__ import annotations

import json
import math
import signal
import time
from pathlib import Path

from dmtp.io import read_json, write_json

OPTIONAL_UNDER_DEADLINE = ("curve", "verify")  # left out when they would not finish in time; the tables need neither
TIMES = "stage_times.json"  # work/<folder>/: stage -> the longest measured wall time (s)


class DeadlineReached(BaseException):
    """The deadline interrupted a stage. A BaseException, so that the stages' per-run `except Exception` (one failing
    evaluation run does not cost the others) does not swallow it."""


MAX_SECONDS = 1e8  # the longest deadline (three years): beyond it the interval timer's time_t overflows


class Deadline:
    """Seconds left before `limit_s` (from construction) less `reserve_s`; None: no limit."""

    def __init__(self, limit_s: float | None, reserve_s: float = 30.0, clock=time.monotonic):
        if limit_s is not None and not 0 < limit_s <= MAX_SECONDS:
            raise ValueError(f"--deadline {limit_s:g}: expected a positive number of seconds, at most {MAX_SECONDS:g}")
        if reserve_s < 0 or (limit_s is not None and reserve_s >= limit_s):
            raise ValueError(f"--reserve {reserve_s:g}: expected seconds >= 0"
                             + ("" if limit_s is None else f" and below --deadline {limit_s:g} (no time left to work)"))
        self.limit_s, self.reserve_s, self.clock, self.t0 = limit_s, reserve_s, clock, clock()

    def left(self) -> float:
        """Seconds of work left (infinite without a limit; may be negative)."""
        if self.limit_s is None:
            return float("inf")
        return self.limit_s - self.reserve_s - (self.clock() - self.t0)

    def fits(self, cost: float | None) -> bool:
        """A stage of this cost (None: unknown, started) finishes in the time left."""
        return cost is None or cost <= self.left()

    def arm(self) -> None:
        """Raise DeadlineReached in the main thread when the time left runs out (SIGALRM; no-op without a limit)."""
        if self.limit_s is None:
            return
        left = self.left()
        if left <= 0:
            raise DeadlineReached()

        def fire(signum, frame):
            raise DeadlineReached()

        signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, left)

    def disarm(self) -> None:
        if self.limit_s is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)


def read_costs(work: Path, declared: str | Path | None = None) -> dict[str, float]:
    """Stage -> seconds: the measured times of `work` (TIMES), overridden by a declared file (`--costs`)."""
    path = Path(work) / TIMES
    costs = _seconds(read_json(path), f"{path}", "remove it (the stages write it again as they finish)") \
        if path.exists() else {}
    if declared is not None:
        try:
            d = json.loads(Path(declared).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"--costs {declared}: cannot be read as JSON ({e})") from None
        costs.update(_seconds(d, f"--costs {declared}", "fix the file"))
    return costs


def _seconds(d, where: str, remedy: str) -> dict[str, float]:
    """A stage-times object as {stage: seconds}, each a finite number >= 0 (true/false are not numbers)."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a JSON object stage -> seconds (numbers >= 0), got {type(d).__name__}")
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{where}: stage {k!r}: {v!r}: expected a JSON object stage -> seconds (numbers >= 0); "
                             f"{remedy}")
    return {k: float(v) for k, v in d.items()}


def record_cost(work: Path, stage: str, seconds: float) -> None:
    """Keep the longest measured wall time of `stage` in `work`/TIMES (a rerun that skips finished work is quick)."""
    path = Path(work) / TIMES
    times = read_costs(work)
    if seconds > times.get(stage, -1.0):
        times[stage] = round(seconds, 1)
        write_json(path, times)
