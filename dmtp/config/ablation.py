"""What an ablation runs and how its rows are reported: the one place a method list lives (pure data, no torch).

A *run* is a name under `results/<profile>/runs/ablation/<run>/`: an engine baseline (`ar`, `mtp`), a variant trained
from scratch (its registry name), a continued run (a variant trained further from another run's drafter) or a
backbone run (a variant on another drafter backbone). The pipeline trains and evaluates the runs, bench times them,
and the report orders, groups and compares its rows by this spec, which it reads from `results/<profile>/
experiment.json` (written by the pipeline): the report never imports the experiment definitions.

    spec = AblationSpec(baselines=("ar", "mtp"), main=("dflash", "token_only"), reference="token_only",
                        main_method="token_only", drafter_baseline="dflash")
    spec.runs()          # ('ar', 'mtp', 'dflash', 'token_only')
    spec.group("mtp")    # 'baseline'; a run the spec does not name: 'other' (still reported)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dmtp.checks import at_least, check, each

GROUPS = ("baseline", "main", "supplementary", "control", "backbone", "other")  # row groups, in table order


@dataclass(frozen=True)
class AblationSpec:
    name: str = ""  # the ablation's name (e.g. "code")
    baselines: tuple[str, ...] = ()  # engine methods without a drafter: "ar" (target alone), "mtp" (native MTP-k)
    main: tuple[str, ...] = ()  # variants trained from scratch with identical data/budget/seed: the main rows
    supplementary: tuple[str, ...] = ()  # variants trained the same way, reported as supplementary rows
    controls: tuple[str, ...] = ()  # control variants trained the same way (rows of group "control")
    continued: dict[str, tuple[str, str]] = field(default_factory=dict)  # run -> (variant, run whose drafter it
    # continues from), trained `continue_steps` more steps with seed + 1; reported among the main rows
    continue_steps: int = 100  # optimizer steps of each continued run
    backbones: dict[str, tuple[str, str]] = field(default_factory=dict)  # run -> (variant, drafter backbone),
    # trained from scratch beside the variants and evaluated with the main table (e.g. DFlash2 runs)
    reference: str = ""  # the row every other row is reported relative to (rel_to_<reference>, vs_<reference>)
    main_method: str = ""  # our DMTP method (the current main method): the bench ratio targets
    blog_method: str = ""  # the run the blog's DMTP numbers were measured with (its "dmtp" columns are compared
    # with this row); "": the main method
    drafter_baseline: str = ""  # the DFlash baseline the main method is measured against (gain, vs_<it> columns)
    main_table: tuple[str, ...] = ()  # runs evaluated on every dataset (the others: on eval.all_methods_on only)
    bench: tuple[str, ...] = ()  # runs the engine benchmarks time when --methods is not given
    seeds: tuple[int, ...] = (0,)  # drafter seeds (initialisation, data order, anchors) of the main and control
    # runs; supplementary, continued and backbone runs are trained with the first seed only
    budgets: tuple[int, ...] = ()  # learning-curve budgets: training steps after which the `curve` runs are also
    # evaluated (HumanEval, T = 0, natural mode; every seed); (): no learning curve
    curve: tuple[str, ...] = ()  # runs with a learning curve
    anneal: float = 0.2  # a curve point below the final step is an annealed branch: run b's state at step
    # b - round(anneal * b) (at least 1 step before b), trained on to b with the learning rate decayed linearly from
    # the run's own at the branch point to ~0 (the same batches the run sees); 0: the weights mid-schedule (a snapshot)
    only: tuple[str, ...] = ()  # train / evaluate only these runs (a subset); (): every run
    only_seeds: tuple[int, ...] = ()  # train / evaluate only these seeds (a subset of `seeds`); (): every seed

    def __post_init__(self):
        check(self, continue_steps=at_least(0), seeds=each(at_least(0), "tuple of seeds"))
        if not 0 <= self.anneal < 1:
            raise ValueError(f"ablation.anneal = {self.anneal!r}: expected a fraction of a budget in [0, 1)")
        if self.budgets:
            check(self, budgets=each(at_least(1), "tuple of training steps"))
        names = self.runs()
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"ablation {self.name!r}: runs named twice: {dup}")
        for key in ("reference", "main_method", "blog_method", "drafter_baseline"):
            v = getattr(self, key)
            if v and v not in names:
                raise ValueError(f"ablation.{key} = {v!r} is not a run of the ablation ({', '.join(names)})")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"ablation.seeds = {list(self.seeds)}: expected distinct seeds, at least one")
        if sorted(self.budgets) != list(self.budgets) or len(set(self.budgets)) != len(self.budgets):
            raise ValueError(f"ablation.budgets = {list(self.budgets)}: expected increasing training steps")
        bad = sorted(set(self.only_seeds) - set(self.seeds))
        if bad:
            raise ValueError(f"ablation.only_seeds: {bad} not in ablation.seeds {list(self.seeds)}")
        bad = [r for r in self.curve if r not in self.main + self.controls]
        if bad:
            raise ValueError(f"ablation.curve: {bad} are not main or control runs ({', '.join(self.main + self.controls)})")
        if self.curve and not self.budgets:
            raise ValueError("ablation.curve names runs but ablation.budgets is empty")
        for key in ("main_table", "bench", "only"):
            bad = [n for n in getattr(self, key) if n.partition("+")[0] not in names]
            if bad:
                raise ValueError(f"ablation.{key}: unknown runs {bad}; runs: {', '.join(names)}")
        for run, (_, src) in self.continued.items():
            if src not in names or src in self.continued:
                raise ValueError(f"ablation.continued[{run!r}] continues from {src!r}, which is not a run trained "
                                 "from scratch")

    # --- the runs -------------------------------------------------------------------------------------------------
    @property
    def variants(self) -> tuple[str, ...]:
        """Variants trained from scratch under their own name."""
        return self.main + self.supplementary + self.controls

    def branch_step(self, budget: int) -> int:
        """The step a learning-curve point's annealed branch leaves its run at (`anneal`; the budget itself: none)."""
        return budget - max(1, round(self.anneal * budget)) if self.anneal and budget > 1 else budget

    def runs(self) -> tuple[str, ...]:
        """Every run, in report order: baselines, main, continued, supplementary, controls, backbones."""
        return (self.baselines + self.main + tuple(self.continued) + self.supplementary + self.controls
                + tuple(self.backbones))

    def selected(self, runs=None) -> list[str]:
        """`runs` (default: every run) restricted to `only`, in their order."""
        runs = self.runs() if runs is None else runs
        return [r for r in runs if not self.only or r in self.only]

    def seeds_of(self, run: str) -> tuple[int, ...]:
        """The drafter seeds a run is trained and evaluated with (restricted to `only_seeds`): every seed for the
        main and control runs, the first for the others (baselines have no drafter: the first)."""
        seeds = self.seeds if run in self.main + self.controls else self.seeds[:1]
        return tuple(s for s in seeds if not self.only_seeds or s in self.only_seeds)

    def group(self, run: str) -> str:
        """The run's row group (GROUPS); a run the spec does not name is "other", never dropped."""
        for g, members in (("baseline", self.baselines), ("main", self.main + tuple(self.continued)),
                           ("supplementary", self.supplementary), ("control", self.controls),
                           ("backbone", tuple(self.backbones))):
            if run in members:
                return g
        return "other"

    def rank(self, run: str) -> int:
        """Position in report order; runs the spec does not name come after all of its own."""
        order = self.runs()
        return order.index(run) if run in order else len(order)

    @property
    def blog_run(self) -> str:
        """The run set beside the blog's DMTP numbers: `blog_method`, else the main method."""
        return self.blog_method or self.main_method

    @property
    def study_runs(self) -> tuple[str, ...]:
        """The runs the verification-mode study decodes unless `verify.methods` names others: the baselines, the
        drafter baseline, the blog's run and the main method."""
        roles = self.baselines + (self.drafter_baseline, self.blog_run, self.main_method)
        return tuple(dict.fromkeys(r for r in roles if r))

    @property
    def compared(self) -> tuple[str, ...]:
        """The rows of the pairwise tests: the baselines that draft (all but "ar", the target alone), the main and
        the control runs."""
        return tuple(m for m in self.baselines if m != "ar") + self.main + self.controls

    def backbone_run(self, variant: str, backbone: str) -> str | None:
        """The run training `variant` on `backbone` (e.g. ("dflash", "dflash2") -> "dflash2"), or None."""
        return next((r for r, vb in self.backbones.items() if tuple(vb) == (variant, backbone)), None)


# --- the named ablations ------------------------------------------------------------------------------------------
def code(**over) -> AblationSpec:
    """The Code ablation (docs/METHOD.md, "The blog's numbers"): which runs are trained and evaluated, how the rows
    are grouped, the reference row. `code().runs()`: ar, mtp, the main variants, the continued run, the
    supplementary variants, the backbones."""
    return AblationSpec(**{**dict(
        name="code",
        baselines=("ar", "mtp"),  # AR target alone; native MTP415 (4 chained steps)
        main=("dflash", "token_only", "t1_residual", "double_anchor_fusion", "fusion", "zero_init_residual"),
        supplementary=("mask_residual", "context_fusion", "mtp_context"),
        # zero_init_residual as initialised: [A, E(T1), MASK x6] without the MTP hidden (isolates what the hidden adds)
        controls=("double_anchor_token_only",),
        continued={"zero_init_residual_from_dflash": ("zero_init_residual", "dflash")},
        # the DFlash2 axis (docs/METHOD.md, "The injection variants"): trained from scratch beside the variants,
        # evaluated with the main table
        backbones={"dflash2": ("dflash", "dflash2"), "dmtp_d2": ("zero_init_residual", "dflash2")},
        reference="token_only",  # the blog's ablation reports every row relative to this one
        main_method="zero_init_residual",  # DMTP (Nov 9 main method)
        # every DMTP number of the blog predates the updates ("existing data unchanged", Nov 4): single-anchor fusion
        blog_method="fusion",
        drafter_baseline="dflash",
        main_table=("ar", "mtp", "dflash", "zero_init_residual"),
        bench=("ar", "mtp", "dflash", "t1_residual", "zero_init_residual"),
        seeds=(0, 1, 2),  # main and control runs; the others: the first seed
    ), **over})


def open_reproduction(**over) -> AblationSpec:
    """The open reproduction's runs (the blog's 27B table: docs/METHOD.md, "The blog's numbers"): MTP415 beside
    DFlash, DMTP(D) and the DFlash2 pair."""
    return AblationSpec(**{**dict(
        name="open",
        baselines=("mtp",),  # native MTP415 (4 chained steps): the blog's baseline column
        # dflash: the DFlash column; fusion: single-anchor T1 fusion, the model the blog's DMTP numbers come from;
        # zero_init_residual: the Nov 9 main method (no number of its own in the blog: "close to fusion")
        main=("dflash", "fusion", "zero_init_residual"),
        # DFlash2 and DMTP(D2): zero_init_residual on the dflash2 backbone (docs/METHOD.md, "The injection variants")
        backbones={"dflash2": ("dflash", "dflash2"), "dmtp_d2": ("zero_init_residual", "dflash2")},
        reference="dflash",  # every row is also reported relative to DFlash
        main_method="zero_init_residual",
        blog_method="fusion",  # the open reproduction's "MTP representation fusion at the first slot"
        drafter_baseline="dflash",
        main_table=("mtp", "dflash", "fusion", "zero_init_residual", "dflash2", "dmtp_d2"),
        seeds=(0,),
    ), **over})
