"""Timing-only drafters: a profile's drafters with their initial (untrained) weights, for stage-time benchmarks
where acceptance does not matter and the trained ones are not at hand (e.g. on a fresh GPU machine).

    python experiments/runs/untrained_drafters.py --profile mini --target work/mini/target \
        --out work/mini/drafters_untrained --variants dflash,zero_init_residual
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dmtp.data.tokenizer import find_tokenizer  # noqa: E402
from dmtp.experiment import drafter_config  # noqa: E402
from dmtp.models.target import Target  # noqa: E402
from dmtp.training.drafters import new_drafters  # noqa: E402
from experiments.profiles import get_profile  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--profile", required=True)
ap.add_argument("--target", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--variants", default="dflash,zero_init_residual")
a = ap.parse_args()
prof = get_profile(a.profile)
tgt = Target.load(a.target)
tok = find_tokenizer(a.target)
mask = tok.convert_tokens_to_ids("<|mask|>") if tok is not None else None
base = dict(drafter_config(prof, tgt.config, mask), seed=prof.ablation.seeds[0])
for v, d in new_drafters(tgt, a.variants.split(","), base, variant_configs=prof.drafter.variants).items():
    d.save(Path(a.out) / v / "drafter")
    print(f"{v}: {sum(x.numel() for x in d.parameters()):,} parameters -> {Path(a.out) / v / 'drafter'}")
