"""``python -m truss`` runs the command-line front end."""

from truss_cli.main import main

raise SystemExit(main())
