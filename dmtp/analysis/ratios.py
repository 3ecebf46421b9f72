"""Engine targets as typed records: `bench/ratios.json`, written by `python -m dmtp.cli.bench`, shown in REPORT.md.

A record is one target measured side by side in one run, e.g. "DMTP's round / DFlash's round <= 1.04 at batch 8".
`(setup, name)` identifies it: a rerun replaces the record of the same setup and name (measured under whatever
`condition`, e.g. the largest batch cap both methods reached) and keeps every other one.

    r = Ratio("mini", "zero_init_residual round / dflash round", 1.18, "<=", 1.04, condition="batch 8")
    r.met, r.target                  # False, 'mini zero_init_residual round / dflash round (batch 8)'
    write(path, merge(read(path), [r]))
    python -m dmtp.analysis.ratios results/mini/bench/ratios.json    # every record, MET or MISS, one line each

In the file each record also carries `met` and `target` (the label) as the report prints them. Records written
before the typed fields existed (only `target`, `value`, `goal` as text, `met`, `note`) still read, as setup "" and
their label as name; the committed ones were converted once (docs/DESIGN.md, "Engine ratio targets").
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from dmtp.io import write_text
from dmtp.schema import from_dict

DIRECTIONS = ("<=", ">=", "report")
# the main method's end-to-end tok/s over AR at T = 0 by batch cap (issue "Speculative decoding must pay": B1 and the
# largest cap, keyed 32), which bench's ratios and the report's throughput sentences hold it to
SPEEDUP_GOALS = {1: 2.5, 32: 2.0}


def speedup_goal(cap: int, top: int, temperature: float) -> float | None:
    """The main method's speed-up goal at batch cap `cap` (`top`: the run's largest cap), T = 0 only; None elsewhere."""
    return SPEEDUP_GOALS.get(1 if cap == 1 else 32) if temperature == 0 and cap in (1, top) else None


@dataclass(frozen=True)
class Ratio:
    setup: str  # where it was measured: the profile ("mini") or "8b-shape" (random weights, timing only)
    name: str  # what is measured, e.g. "zero_init_residual round / dflash round"
    value: float
    direction: str = "report"  # "<=" / ">=": value must be at most / at least `goal`; "report": shown, no goal
    goal: float | None = None
    unit: str = "x"  # "x": a ratio of two measurements
    condition: str = ""  # how it was measured, not part of its identity (e.g. "batch 8", "B32")
    note: str = ""  # the measurements behind the value

    def __post_init__(self):
        if self.direction not in DIRECTIONS or (self.direction != "report") != (self.goal is not None):
            raise ValueError(f"ratio {self.name!r}: direction {self.direction!r} with goal {self.goal!r}; expected "
                             "'<=' or '>=' with a goal, or 'report' without one")

    @property
    def key(self) -> tuple[str, str]:
        return self.setup, self.name

    @property
    def met(self) -> bool:
        if self.direction == "report":
            return True
        return (self.value <= self.goal) if self.direction == "<=" else (self.value >= self.goal)

    @property
    def target(self) -> str:
        """The printed label: setup, name and (condition)."""
        return " ".join(x for x in (self.setup, self.name) if x) + (f" ({self.condition})" if self.condition else "")

    @property
    def goal_text(self) -> str:
        return "report" if self.direction == "report" else f"{self.direction} {self.goal:g}"

    def to_json(self) -> dict:
        return {**asdict(self), "met": self.met, "target": self.target}

    @classmethod
    def from_json(cls, d: dict) -> "Ratio":
        if "setup" not in d:  # written before the typed fields: the label was the identity, the goal text
            direction, _, goal = str(d["goal"]).partition(" ")
            return cls("", d["target"], float(d["value"]), direction, float(goal) if goal else None,
                       note=d.get("note", ""))
        return from_dict(cls, {k: v for k, v in d.items() if k not in ("met", "target")}, "ratio")

    def show(self) -> "Ratio":
        """Print the record (bench's log line) and return it."""
        v = f"{self.value:.3f}" if math.isfinite(self.value) else str(self.value)
        tag = "    " if self.direction == "report" else "MET " if self.met else "MISS"  # no goal: neither met nor missed
        print(f"[bench] {tag} {self.target}: {v} (goal {self.goal_text}) {self.note}")
        return self


def read(path: str | Path) -> list[Ratio]:
    path = Path(path)
    return [Ratio.from_json(d) for d in json.loads(path.read_text())] if path.exists() else []


def merge(old: list[Ratio], new: list[Ratio]) -> list[Ratio]:
    """`old` without the targets `new` measures again, then `new`."""
    keys = {r.key for r in new}
    return [r for r in old if r.key not in keys] + list(new)


def write(path: str | Path, ratios: list[Ratio]) -> None:
    write_text(path, json.dumps([r.to_json() for r in ratios], indent=2) + "\n")


if __name__ == "__main__":
    for r in read(sys.argv[1]):
        r.show()
