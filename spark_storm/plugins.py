"""Naming things the user typed: "did you mean" hints and objects named by a dotted path.

Every layer names user-supplied things (config keys, groupings, components, transports,
bolt classes, serializers), so these helpers live at the bottom, beside
:mod:`spark_storm.config` and :mod:`spark_storm.errors`.  :func:`import_target` is the one
place a dotted path is imported; :func:`load_object` words its errors for configuration,
the transport registry for transports.
"""

from __future__ import annotations

import difflib
import enum
import importlib
from collections.abc import Iterable
from typing import Any

from spark_storm.errors import ConfigError, TargetError

__all__ = [
    "Problem",
    "TargetError",
    "attribute_hint",
    "closest",
    "did_you_mean",
    "import_target",
    "load_object",
    "split_dotted_path",
]


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


class Problem(enum.StrEnum):
    """What kept a dotted path from importing."""

    PATH = "not a dotted path"
    MODULE = "no such module"
    SYNTAX = "a syntax error"
    FAILED = "the module raised while importing"
    ATTRIBUTE = "no such attribute"


def attribute_hint(err: TargetError, lead: str) -> str:
    """Return the "did you mean" of an attribute a module does not have ('' when none is close)."""
    module = importlib.import_module(err.module)
    public = [a for a in dir(module) if not a.startswith("_")]
    return did_you_mean(err.attr, public, show=err.module + ":{}", lead=lead)


def split_dotted_path(path: str) -> tuple[str, str]:
    """Split ``pkg.mod:Name`` or ``pkg.mod.Name`` into (module, attribute); empty parts if it is neither."""
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    return module_name, attr


def import_target(path: str, *, module_alone: bool = False) -> Any:
    """Import what ``pkg.mod:Name`` or ``pkg.mod.Name`` names; the one place a dotted path is imported.

    ``module_alone``: ``pkg.mod`` may name a module itself (a plugin module); then
    ``pkg.mod.Name`` is tried as a module first.

    Raises
    ------
    TargetError
        What went wrong, for the caller to word (its ``cause`` chained).
    """
    if ":" in path or not module_alone:
        module_name, attr = split_dotted_path(path)
        if not module_name or not attr:
            raise TargetError(Problem.PATH, module_name, attr)
    else:
        module_name, attr = path, ""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not attr and exc.name is not None and module_name.startswith(exc.name) and "." in module_name:
            # "pkg.mod.Name": not a module; the last part may be an attribute of pkg.mod
            return import_target(":".join(module_name.rsplit(".", 1)), module_alone=module_alone)
        raise TargetError(Problem.MODULE, module_name, attr, exc, exc.name) from exc
    except ImportError as exc:
        raise TargetError(Problem.MODULE, module_name, attr, exc, exc.name) from exc
    except SyntaxError as exc:
        raise TargetError(Problem.SYNTAX, module_name, attr, exc) from exc
    except Exception as exc:  # the module ran and raised while importing
        raise TargetError(Problem.FAILED, module_name, attr, exc) from exc
    if not attr:
        return module
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TargetError(Problem.ATTRIBUTE, module_name, attr) from None


def load_object(path: str, what: str) -> Any:
    """Import ``pkg.mod:Name`` or ``pkg.mod.Name``; errors name ``what``, the path and the fix.

    Raises
    ------
    ConfigError
        Not a dotted path, the module is missing or fails to import (a syntax error names
        file:line), or it has no such attribute (with the closest name it has).
    """
    try:
        return import_target(path)
    except TargetError as err:
        cause, module = err.cause, err.module
        if err.kind == Problem.PATH:
            msg = f"{what} {path!r} is not a dotted path like 'package.module:ClassName'"
        elif err.kind == Problem.MODULE:
            msg = f"{what} {path!r}: cannot import {module!r}: {cause}"
        elif err.kind == Problem.SYNTAX:
            assert isinstance(cause, SyntaxError)
            msg = f"{what} {path!r}: {module!r} has a syntax error at {cause.filename}:{cause.lineno}: {cause.msg}"
        elif err.kind == Problem.FAILED:
            msg = f"{what} {path!r}: importing {module!r} raised {type(cause).__name__}: {cause}"
        else:
            msg = f"{what} {path!r}: module {module!r} has no {err.attr!r}{attribute_hint(err, '; ')}"
        raise ConfigError(msg) from cause
