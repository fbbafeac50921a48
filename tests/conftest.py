from __future__ import annotations

import logging

logging.getLogger("spark_storm").setLevel(logging.DEBUG)
