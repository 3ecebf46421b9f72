"""Every notebook executes headless on synthetic artifacts (parameters injected by replacing the parameter cell)."""
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from ablations.code import code  # noqa: E402
from dmtp.analysis.report.synthetic import write_synthetic, write_synthetic_verify  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    write_synthetic(code(), root, "nbtest", n=3, temps=(0,),
                    methods=["dflash", "token_only", "zero_init_residual", "mtp"], bench=False)
    write_synthetic_verify(root, "nbtest", n=6)
    return root


@pytest.mark.parametrize("name", ["ablation", "per_position", "verify"])
def test_notebook_runs(name, results):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "store notebooks without outputs"
    (param,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    param.source = f'PROFILE = "nbtest"\nRESULTS = "{results}"'
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(results)}}).execute()
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the notebook shows the rendered figures"
    assert (results / "nbtest" / "figures").is_dir()
