"""``python -m ollamatrio``: the command line (``fleet ...``: the fleet's commands)."""

import sys

if sys.argv[1:2] == ["fleet"]:
    from ollamatrio.fleet.cli import main as fleet_main

    raise SystemExit(fleet_main(sys.argv[2:]))

from ollamatrio.cli import main

raise SystemExit(main())
