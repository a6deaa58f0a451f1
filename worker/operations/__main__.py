"""``python -m worker.operations``: the ``agent-worker`` command, where no console script is
installed (``python -m worker.operations status --json``)."""

from worker.operations._cli import main

raise SystemExit(main())
