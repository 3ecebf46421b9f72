"""Timing-only drafters: a profile's drafters with their initial (untrained) weights, for stage-time benchmarks
where acceptance does not matter and the trained ones are not at hand (e.g. on a fresh GPU machine).

    python experiments/runs/untrained_drafters.py --profile mini --target work/mini/target \
        --out work/mini/drafters_untrained --variants dflash,zero_init_residual
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dmtp.cli.pipeline import _drafter_base  # noqa: E402
from dmtp.data.tokenizer import find_tokenizer  # noqa: E402
from dmtp.models.target import Target  # noqa: E402
from dmtp.training.drafters import new_drafters  # noqa: E402
from experiments.profiles import get_profile  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--profile", required=True)
ap.add_argument("--target", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--variants", default="dflash,zero_init_residual")
a = ap.parse_args()
tgt = Target.load(a.target)
tok = find_tokenizer(a.target)
if tok is None:
    sys.exit(f"{a.target}: no tokenizer (the mask token id comes from it)")
base = _drafter_base(type("Ctx", (), {"p": get_profile(a.profile)}), tgt, tok)
for v, d in new_drafters(tgt, a.variants.split(","), base).items():
    d.save(Path(a.out) / v / "drafter")
    print(f"{v}: {sum(x.numel() for x in d.parameters()):,} parameters -> {Path(a.out) / v / 'drafter'}")
