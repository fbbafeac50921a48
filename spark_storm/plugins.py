"""Naming things the user typed: "did you mean" hints and objects named by a dotted path.

Every layer names user-supplied things (config keys, groupings, components, transports,
bolt classes, serializers), so these two helpers live at the bottom, beside
:mod:`spark_storm.config` and :mod:`spark_storm.errors`.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable
from typing import Any

from spark_storm.errors import ConfigError

__all__ = ["closest", "did_you_mean", "load_object", "split_dotted_path"]


def closest(name: str, choices: Iterable[str]) -> str | None:
    """Return the choice closest to ``name`` (difflib's ratio >= 0.6), or None."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return close[0] if close else None


def did_you_mean(name: str, choices: Iterable[str], *, show: str = "{!r}", lead: str = " ") -> str:
    """Return ``" Did you mean 'x'?"`` for the closest choice, or ``""``.

    Parameters
    ----------
    show : str
        How to show the match (a format string with one field), e.g. ``"module:{}"``.
    lead : str
        What precedes the hint: ``" "`` (a new sentence) or ``"; "`` (a clause).
    """
    match = closest(name, choices)
    if match is None:
        return ""
    word = "Did" if lead.strip() in ("", ".") else "did"
    return f"{lead}{word} you mean {show.format(match)}?"


def split_dotted_path(path: str) -> tuple[str, str]:
    """Split ``pkg.mod:Name`` or ``pkg.mod.Name`` into (module, attribute); empty parts if it is neither."""
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    return module_name, attr


def load_object(path: str, what: str) -> Any:
    """Import ``pkg.mod:Name`` or ``pkg.mod.Name``; errors name ``what``, the path and the fix.

    Raises
    ------
    ConfigError
        Not a dotted path, the module is missing or fails to import (a syntax error names
        file:line), or it has no such attribute (with the closest name it has).
    """
    module_name, attr = split_dotted_path(path)
    if not module_name or not attr:
        msg = f"{what} {path!r} is not a dotted path like 'package.module:ClassName'"
        raise ConfigError(msg)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        msg = f"{what} {path!r}: cannot import {module_name!r}: {exc}"
        raise ConfigError(msg) from exc
    except SyntaxError as exc:
        msg = f"{what} {path!r}: {module_name!r} has a syntax error at {exc.filename}:{exc.lineno}: {exc.msg}"
        raise ConfigError(msg) from exc
    except Exception as exc:  # the module ran and raised while importing: say so, with the cause
        msg = f"{what} {path!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        raise ConfigError(msg) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        public = [a for a in dir(module) if not a.startswith("_")]
        hint = did_you_mean(attr, public, show=module_name + ":{}", lead="; ")
        msg = f"{what} {path!r}: module {module_name!r} has no {attr!r}{hint}"
        raise ConfigError(msg) from None
