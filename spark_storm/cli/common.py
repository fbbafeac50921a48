"""What several commands share: ``--set`` overrides, the effective config, starting a UI."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from spark_storm.config import Config, load_config
from spark_storm.errors import ConfigError, StormError

if TYPE_CHECKING:
    from spark_storm.ui import UIServer

__all__ = ["command_conf", "overrides", "start_ui"]


def overrides(pairs: list[str] | None) -> dict[str, Any]:
    """Parse repeated ``--set key=value`` (the value as JSON when it parses, else as text)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            msg = f"--set expects key=value, got {pair!r}"
            raise ConfigError(msg)
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def command_conf(args: argparse.Namespace) -> Config:
    """Merge the defaults, the command's ``--conf`` file and its ``--set`` overrides."""
    return load_config(args.conf, overrides(args.set))


def start_ui(server: UIServer) -> UIServer:
    """Start a built UI; a port it cannot bind is one clear error (and its source is closed)."""
    try:
        return server.start()
    except OSError as exc:
        server.source.close()
        msg = (
            f"the UI cannot listen on {server.host}:{server.port}: {exc.strerror}; pick another with --port / --ui-port"
        )
        raise StormError(msg) from exc
