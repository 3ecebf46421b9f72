"""`python -m dmtp.cli.bench ...`: the command line of dmtp/cli/bench/__init__.py."""
from dmtp.cli.bench import main

main()
