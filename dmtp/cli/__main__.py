"""`python -m dmtp.cli ...`: the `dmtp` command line."""
from dmtp.cli.main import run_as_command

run_as_command()
