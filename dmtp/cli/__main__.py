"""`python -m dmtp.cli ...`: the `dmtp` command line."""
from dmtp.cli.main import main

main()
