"""``python -m ollamatrio``: the command line."""

from ollamatrio.cli import main

raise SystemExit(main())
