"""The primary family's registered series (dmtp/analysis/report/registered.json) against the `mini` profile as it
stands: its experiment key (`data.experiment_key`) and this code's records revision (`dmtp.RECORDS_REVISION`).

    python -m experiments.register_series           # what differs (exit 1 when anything does; CPU, seconds)
    python -m experiments.register_series --write   # register the profile as it stands

Write only before the series' first realization exists: a realization at another key or revision is another series
(docs/DESIGN.md, "The pre-registered primary family").
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from dmtp import RECORDS_REVISION
from dmtp.analysis.report.data import differences, experiment_key
from dmtp.analysis.report.registered import KEY_FILE, read_key
from dmtp.experiment import write_experiment
from dmtp.io import read_json, write_text
from dmtp.profiles import resolve

PROFILE = "mini"


def profile_key(name: str = PROFILE) -> dict:
    """The experiment key of a profile as `dmtp pipeline --profile <name>` writes its experiment.json."""
    with tempfile.TemporaryDirectory() as d:
        path = write_experiment(Path(d, "experiment.json"), resolve(name))
        return experiment_key(read_json(path))


def changes(path: Path = KEY_FILE) -> list[str]:
    """What differs between the registered series and the profile as it stands with this code's revision."""
    profile, revision, key = read_key(path)
    out = [] if profile == PROFILE else [f"profile: {profile} -> {PROFILE}"]
    out += [] if revision == RECORDS_REVISION else [f"records_revision: {revision} -> {RECORDS_REVISION}"]
    return out + differences(key, profile_key())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {KEY_FILE.name} from the profile as it stands")
    args = ap.parse_args(argv)
    if args.write:
        write_text(KEY_FILE, json.dumps({"profile": PROFILE, "records_revision": RECORDS_REVISION,
                                         "experiment_key": profile_key()}, indent=2, sort_keys=True) + "\n")
        print(f"wrote {KEY_FILE}")
        return 0
    d = changes()
    print("\n".join(d) if d else f"the registered series is the `{PROFILE}` profile as it stands")
    return 1 if d else 0


if __name__ == "__main__":
    sys.exit(main())
