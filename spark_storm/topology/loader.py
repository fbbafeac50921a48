"""Reading a topology: our YAML form or a Storm Flux file, told apart by their keys.

:mod:`~spark_storm.topology.model` knows our form and :mod:`~spark_storm.topology.flux`
Storm's; this module is the one that knows both, so neither imports the other's reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_storm.config import read_yaml
from spark_storm.topology.flux import is_flux, is_flux_file, load_flux, topology_from_flux
from spark_storm.topology.model import (
    MULTILANG_DIR,
    SHELL_BOLT,
    SHELL_SPOUT,
    Topology,
    topology_from_mapping,
)

__all__ = ["load_topology", "topology_from_dict"]


def topology_from_dict(data: Mapping[str, Any], origin: str = "topology") -> Topology:
    """Build a topology from its YAML/JSON mapping form: ours, or a self-contained Flux file."""
    if is_flux(data):
        return topology_from_flux(data, origin)
    return topology_from_mapping(data, origin)


def load_topology(path: str | Path, properties: str | Path | None = None) -> Topology:
    """Read a topology file: ours, or a Storm Flux file (told apart by its keys).

    A component's multilang child runs in ``topology.multilang.dir``, resolved against
    the file's directory; unset, it is the file's directory.

    Parameters
    ----------
    path : str or Path
        The topology YAML or Flux file.
    properties : str or Path, optional
        Flux's ``--filter``: a properties file whose values replace ``${name}`` in a Flux file.

    Raises
    ------
    ConfigError
        Unreadable file, bad YAML, or an invalid topology (the message names the part).
    """
    if properties is not None or is_flux_file(path):
        topo = load_flux(path, properties)
    else:
        topo = topology_from_dict(read_yaml(path, "topology file"), origin=str(path))
    base = Path(path).resolve().parent
    wanted = topo.conf.get(MULTILANG_DIR)
    if any(c.bolt in (SHELL_BOLT, SHELL_SPOUT) for c in topo.components.values()) and (
        wanted is None or not Path(str(wanted)).is_absolute()
    ):
        resolved = str((base / str(wanted)) if wanted else base)
        topo = Topology(topo.name, topo.components, topo.workers, {**topo.conf, MULTILANG_DIR: resolved}, topo.notes)
    return topo
