"""The pre-registered primary family: the four claims the `mini` series is run to test, and the series itself, as
data (one place).

The family is fixed before the realizations that decide it exist (docs/DESIGN.md, "The pre-registered primary
family"). Each claim is a paired contrast a - b of per-request acceptance length on one dataset at one temperature;
the test is one-sided (the blog's direction, a > b) on the realization means of the difference, a paired t-test over
realizations, and the family's p-values are adjusted together (Holm over the four).

The series is an experiment key and a records revision: the `mini` profile's experiment.json as the report compares
realizations (`data.experiment_key`: without `realization` and run control) when the family was registered, stored
in registered.json beside this file, and the revision of the record-making code (`dmtp.RECORDS_REVISION`) its
realizations are made at. Profile name and step count do not define it: earlier `mini` realizations share both. A
claim is decided ("holds" / "not resolved") only on that series with at least `min_realizations` realizations; on
fewer it is an interim reading and says so; on any other series (an earlier `mini` corpus, another revision, the
4,000-step speed series, `tiny`) the same contrasts are exploratory. Every other comparison a report prints is
exploratory. `python -m experiments.register_series` compares the stored key with the profile as it stands.

    from dmtp.analysis.report.registered import PRIMARY
    [c.key for c in PRIMARY.claims]   # ['P1', 'P2', 'P3', 'P4']
    PRIMARY.registered_on(key, "1")   # whether a realization (its experiment key, its revision) is of the series

Also here, what a series cannot show, said at the top of its REPORT.md and of every table it renders (`caveat`):
the smoke series (`SMOKE`), and runs on a random-weight target (`RANDOM_WEIGHTS`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

KEY_FILE = Path(__file__).with_name("registered.json")  # {"profile", "records_revision", "experiment_key"}


@dataclass(frozen=True)
class Claim:
    key: str  # its name in every report ("P1")
    a: str  # the run the claim puts above (the main method)
    b: str  # the run it is compared with
    temperature: float  # the sampling temperature of both runs
    text: str  # the claim in words, as a report prints it
    beside: str = ""  # a run printed beside `a` on the same contrast, exploratory (the blog's own DMTP model)


@dataclass(frozen=True)
class Family:
    name: str  # how reports name the family
    experiment: str  # experiment.json `name` of the series the family is registered on (the profile)
    key: dict  # the series' experiment key (`data.experiment_key` of the profile as registered)
    records_revision: str  # the revision of the record-making code the series is made at (`dmtp.RECORDS_REVISION`)
    dataset: str  # the evaluation set of every claim
    metric: str  # the record column compared: per-request acceptance length (incl. bonus)
    alpha: float  # one-sided level of each test, after Holm over the family
    min_realizations: int  # realizations the registered test needs (5 degrees of freedom at the top level)
    claims: tuple[Claim, ...]  # the family, in order
    seen_before: tuple[str, ...] = ()  # realizations of results/<experiment> whose numbers were seen when the family
    # was written (reports say so wherever they pool them)

    @property
    def digest(self) -> str:
        """sha256 (16 hex digits) of the experiment key: how reports name the series."""
        return hashlib.sha256(json.dumps(self.key, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def series(self) -> str:
        """The series in words: 'the `mini` series (experiment key 1a2b..., records revision 1)'."""
        return (f"the `{self.experiment}` series (experiment key {self.digest}, records revision "
                f"{self.records_revision})")

    def registered_on(self, key: dict | None, revision: str | None) -> bool:
        """Whether a realization with this experiment key and records revision is of the registered series."""
        return key == self.key and revision == self.records_revision

    def as_experiment(self) -> dict:
        """experiment.json fields that make a realization one of the series (its key and revision), e.g. for a
        synthetic realization (`synthetic.write_synthetic(..., experiment=PRIMARY.as_experiment())`)."""
        return dict(self.key, records_revision=self.records_revision)


def read_key(path: Path = KEY_FILE) -> tuple[str, str, dict]:
    """(profile, records revision, experiment key) of the registered series, from registered.json."""
    d = json.loads(Path(path).read_text())
    return str(d["profile"]), str(d["records_revision"]), d["experiment_key"]


# series that run every stage at a size too small to show the method (experiment.json `name` -> what it is)
SMOKE = {
    "tiny": ("the CPU profile: every stage of the pipeline at a size too small to show the method (its drafters' "
             "own slots are almost never accepted; `mini` on one GPU is the smallest run that shows it)"),
    "smoke": "the CI profile: every stage in seconds; its numbers test the pipeline and mean nothing else",
}
# a run's target with random weights (`dmtp reproduce` on `experiments.reproduce_standin`'s stand-in, stages.json
# `random_weights`): a drafter trained on its outputs is accepted at chance, so acceptance is not measured there
RANDOM_WEIGHTS = ("**Random weights: acceptance is not measured here.** The target is a stand-in with random weights "
                  "(`experiments.reproduce_standin`): its drafters are accepted at chance, so every acceptance below "
                  "(about 1, beside the blog's numbers where a table sets them) tests the stages, not a method; "
                  "what such a run measures is time (stages.json)")


def caveat(experiment: str, random_weights: bool = False, short: bool = False) -> str:
    """What a reader must know before any number of a series: a smoke run (`SMOKE`), a random-weight target
    (`RANDOM_WEIGHTS`); "" for a run of the method. short: the few words a figure's title carries."""
    if short:
        return "; ".join(x for x, on in ((f"a smoke run ({experiment}): not a finding about the method",
                                          experiment in SMOKE),
                                         ("random weights: acceptance not measured", random_weights)) if on)
    out = []
    if experiment in SMOKE:
        out.append(f"**A smoke run** (`{experiment}`, {SMOKE[experiment]}): no number below is a finding about the "
                   "method, and no verdict reaches beyond this one realization.")
    if random_weights:
        out.append(RANDOM_WEIGHTS + ".")
    return " ".join(out)


MAIN, BLOG = "zero_init_residual", "fusion"  # the main method; the blog's DMTP model, printed beside it
_PROFILE, _REVISION, _KEY = read_key()

PRIMARY = Family(
    name="primary family (pre-registered: P1-P4, one-sided paired t over realizations, Holm over 4)",
    experiment=_PROFILE, key=_KEY, records_revision=_REVISION, dataset="humaneval", metric="acceptance_length",
    alpha=0.05, min_realizations=6,
    claims=(
        Claim("P1", MAIN, "dflash", 0.0, "DMTP > DFlash at T = 0", BLOG),
        Claim("P2", MAIN, "dflash", 1.0, "DMTP > DFlash at T = 1", BLOG),
        Claim("P3", MAIN, "mtp", 0.0, "DMTP > MTP415 at T = 0", BLOG),
        Claim("P4", MAIN, "double_anchor_token_only", 0.0,
              "what the MTP hidden adds: zero_init_residual > double_anchor_token_only at T = 0"),
    ),
    seen_before=("r5", "r6", "r7"))
