"""numba's disk cache keyed by the source of a module's compiled code, not by its path and
modification time.

On a cluster the package is imported from the ``--py-files`` zip that Spark copies into every
application's folder, and numba's own path-keyed cache would compile the loops again in every
application on every worker. numba's own key also misses a change in another module that a
compiled function reads: a constant (a state's code, a limit) is frozen into the compiled code,
and a function of another module is compiled into it. A module calls :func:`cache_by_source`
once, before its first ``@njit(cache=True)``; its compiled code then lives in numba's folder
(``NUMBA_CACHE_DIR``, else the user's cache folder) under a digest of its own source and of
every module of this package it imports, directly or not.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
from collections.abc import Callable

from numba.core import config as numba_config
from numba.core.caching import CacheImpl, _CacheLocator
from numba.misc.appdirs import AppDirs

_DIGESTS: dict[str, str] = {}  # module name -> digest of its source


def cache_by_source(module: str, loader, file: str) -> None:
    """Key the cache of ``module``'s compiled functions by :func:`source_digest`."""
    own = loader.get_data(file)
    _DIGESTS[module] = source_digest(module, lambda name: own if name == module else _source(name))


def source_digest(module: str, read: Callable[[str], bytes]) -> str:
    """A digest of ``module``'s source (``read`` gives a module's by its name) and of the
    sources of the modules of this package it imports, directly or through another of them,
    in their name order: a rule compiled into a loop may sit two imports away."""
    own = read(module)
    package = module.split(".")[0]
    digest = hashlib.sha256(own)
    found, todo = {module}, [module]
    while todo:
        name = todo.pop()
        new = _imported(ast.parse(own if name == module else read(name)), package) - found
        found |= new
        todo.extend(new)
    for name in sorted(found - {module}):
        digest.update(b"\0" + name.encode() + b"\0" + read(name))
    return digest.hexdigest()[:16]


def _imported(tree: ast.Module, package: str) -> set[str]:
    """The modules of ``package`` that ``tree`` imports (``from a import b``: ``a.b`` where
    that is a module, else ``a``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == package:
            parent = importlib.util.find_spec(node.module)
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                inner = parent.submodule_search_locations and importlib.util.find_spec(name)
                found.add(name if inner else node.module)
    return found


def _source(name: str) -> bytes:
    spec = importlib.util.find_spec(name)
    return spec.loader.get_data(spec.origin)


class _BySourceLocator(_CacheLocator):
    def __init__(self, py_func, digest: str) -> None:
        self._lineno = py_func.__code__.co_firstlineno
        self._digest = digest
        base = numba_config.CACHE_DIR or AppDirs(appname="numba", appauthor=False).user_cache_dir
        self._path = os.path.join(base, "retrysim", digest)

    def get_cache_path(self) -> str:
        return self._path

    def get_source_stamp(self) -> str:
        return self._digest

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        digest = _DIGESTS.get(py_func.__module__)
        if digest is None:
            return None
        locator = cls(py_func, digest)
        try:
            locator.ensure_cache_path()
        except OSError:  # not writable: numba's own locators take over
            return None
        return locator


if not any(c.__name__ == _BySourceLocator.__name__ for c in CacheImpl._locator_classes):
    CacheImpl._locator_classes.insert(0, _BySourceLocator)
