"""``python -m spark_storm.cli``: what the supervisor and local-cluster launch workers with."""

from __future__ import annotations

from spark_storm.cli.parser import main

raise SystemExit(main())
