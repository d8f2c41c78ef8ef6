"""``python -m sluice.cli``: the same as the ``sluice`` console script."""

from sluice.cli import main

main()
