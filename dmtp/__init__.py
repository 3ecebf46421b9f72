"""DMTP suite: the library (README.md; docs/DESIGN.md, "Layering and the experiment object").

`RECORDS_REVISION` names the revision of the code that makes records: every artifact the pipeline writes from a
model's outputs or its training (targets, drafters, on-policy data, decoded records). It is bumped by hand, in the
same commit, by any change that alters such an artifact for the same experiment.json (a kernel choice, a loss, an
admission rule), and by no other change (docs/DESIGN.md, "The records revision"). The pipeline writes it into
experiment.json and every meta.json; the report pools a series only within one experiment key and one revision.
"""

RECORDS_REVISION = "2"
