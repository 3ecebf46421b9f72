"""Where a CUDA memory peak lies: the allocations live at the highest point of a recorded allocation trace, grouped by
the code that made them, as a short text file (a full snapshot is far too large to keep).

`recording` turns torch's allocation history (with Python stacks) on; `peak_report` replays the snapshot's trace
(allocated bytes rise at "alloc", fall at "free_requested") and sums the allocations live at the peak by site: the
innermost frame of the suite's code (dmtp/, experiments/) beside the innermost frame of any code. Memory allocated
before the recording began is the `baseline`.

    with recording(torch.device("cuda")) as rec:
        train_step()
    write_text("peak.txt", peak_report(rec.snapshot, rec.baseline))
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

OWN = ("/dmtp/", "/experiments/")  # path parts of the suite's own code
GB = 1e9


@dataclass
class Recording:
    baseline: int = 0  # bytes allocated when the recording began
    snapshot: dict = field(default_factory=dict)  # torch.cuda.memory._snapshot() at its end


@contextlib.contextmanager
def recording(dev, max_entries: int = 2_000_000):
    """Record the device's allocations (Python stacks) inside the block; `Recording.snapshot` holds them after it."""
    import torch

    rec = Recording(baseline=torch.cuda.memory_allocated(dev))
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python", device=dev)
    try:
        yield rec
    finally:
        rec.snapshot = torch.cuda.memory._snapshot(dev)
        torch.cuda.memory._record_memory_history(enabled=None, device=dev)


def site(frames: list[dict], own=OWN) -> tuple[str, str]:
    """(the innermost frame of the suite's code, the innermost frame of any code) of an allocation's stack, each as
    "file:line name" with the file cut to its last two parts; "-" where there is none."""
    def fmt(f):
        return f"{'/'.join(f['filename'].split('/')[-2:])}:{f['line']} {f['name']}"
    ours = next((fmt(f) for f in frames if any(p in f["filename"] for p in own)), "-")
    return ours, fmt(frames[0]) if frames else "-"


def _replay(trace: list[dict], stop: int | None = None):
    """Allocations live after event `stop` (None: the whole trace), by address; the highest allocated bytes above
    the start and the index of the event that reached it; frees of allocations the trace never saw (count, bytes)."""
    live: dict[int, dict] = {}
    now = top = at = unseen = unseen_bytes = 0
    for i, e in enumerate(trace if stop is None else trace[: stop + 1]):
        act = e.get("action")
        if act == "alloc":
            live[e["addr"]] = e
            now += e["size"]
            if now > top:
                top, at = now, i
        elif act == "free_requested" or (act == "free_completed" and e["addr"] in live):
            if live.pop(e["addr"], None) is not None:
                now -= e["size"]
            elif act == "free_requested":  # made before the trace began (the baseline) or dropped from its window
                unseen, unseen_bytes = unseen + 1, unseen_bytes + e["size"]
    return live, top, at, unseen, unseen_bytes


def peak_state(trace: list[dict]) -> tuple[int, dict[int, dict], dict]:
    """Replay one device's trace: (the highest allocated bytes above the start, the allocations live then by address,
    counts: events replayed, frees of allocations made before the trace began and their bytes). Two passes: the
    peak's event, then the live set up to it."""
    _, top, at, unseen, unseen_bytes = _replay(trace)
    live = _replay(trace, at)[0] if top else {}
    return top, live, {"events": len(trace), "unseen_frees": unseen, "unseen_bytes": unseen_bytes}


def peak_report(snapshot: dict, baseline: int, device: int = 0, top: int = 15, title: str = "") -> str:
    """The allocations live at the trace's highest point, summed by site (`site`), largest first, as text."""
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    high, live, n = peak_state(trace)
    groups: dict[tuple[str, str], list[int]] = {}
    for e in live.values():
        groups.setdefault(site(e.get("frames") or []), []).append(e["size"])
    rows = sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    lines = [title] if title else []
    lines += [f"peak {(baseline + high) / GB:.2f} GB allocated = {baseline / GB:.2f} GB before the recording + "
              f"{high / GB:.2f} GB made inside it ({n['events']:,} events replayed"
              + (f"; {n['unseen_frees']} frees of {n['unseen_bytes'] / GB:.2f} GB made before it" if n["unseen_frees"]
                 else "") + ")",
              f"live at the peak, by site (the suite's innermost frame | the innermost frame), top {top}:",
              "    GB  count  largest GB  site"]
    for (ours, inner), sizes in rows[:top]:
        lines.append(f"{sum(sizes) / GB:6.2f} {len(sizes):6d} {max(sizes) / GB:11.3f}  {ours} | {inner}")
    rest = rows[top:]
    if rest:
        lines.append(f"{sum(sum(s) for _, s in rest) / GB:6.2f} {sum(len(s) for _, s in rest):6d}"
                     f"{'':12s}  ({len(rest)} other sites)")
    return "\n".join(lines) + "\n"
