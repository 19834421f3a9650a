"""``python -m meshlab``: the same command line as the ``meshlab`` script."""

from meshlab.cli.app import main

raise SystemExit(main())
