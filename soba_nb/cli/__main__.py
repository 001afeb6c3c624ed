"""`python -m soba_nb.cli`: the `soba-nb` command."""

from soba_nb.cli import main

raise SystemExit(main())
