"""numba's disk cache keyed by a module's source, not its path and modification time.

On a cluster the package is imported from the ``--py-files`` zip that Spark copies into every
application's folder, and numba's own path-keyed cache would compile the loops again (about
40 s for the event engine) in every application on every worker. A module calls
:func:`cache_by_source` once, before its first ``@njit(cache=True)``; its compiled code then
lives in numba's folder (``NUMBA_CACHE_DIR``, else the user's cache folder) under a digest of
its source.
"""

from __future__ import annotations

import hashlib
import os

from numba.core import config as numba_config
from numba.core.caching import CacheImpl, _CacheLocator
from numba.misc.appdirs import AppDirs

_DIGESTS: dict[str, str] = {}  # module name -> digest of its source


def cache_by_source(module: str, loader, file: str) -> None:
    """Key the cache of ``module``'s compiled functions by a digest of its source."""
    _DIGESTS[module] = hashlib.sha256(loader.get_data(file)).hexdigest()[:16]


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
