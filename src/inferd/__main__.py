"""``python -m inferd`` runs the command line."""

from inferd.cli import main

raise SystemExit(main())
