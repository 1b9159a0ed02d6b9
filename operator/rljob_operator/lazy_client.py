"""kubernetes_asyncio without importing its whole generated client at start.

`import kubernetes_asyncio` (kopf does it to log in, kube.py to talk) runs the package's
`client/__init__.py`, which imports every API class and all of the ~800 generated models: most of the
operator's memory at start, for the dozen classes it uses (the operator reads and writes plain dicts;
its only models are the delete options of a restart). `install()` puts lazy stand-ins for the
packages `kubernetes_asyncio.client`, `.client.api` and `.client.models` in `sys.modules` first: each
knows what its `__init__.py` exports (read from its source, never run) and imports a name's own module
the first time the name is used (PEP 562's module `__getattr__`). Code using the client sees the same
names; nothing else changes. Called by `__main__` before kopf is imported."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import re
import sys
import types
from pathlib import Path
from typing import Any

PACKAGES = ("kubernetes_asyncio.client", "kubernetes_asyncio.client.api", "kubernetes_asyncio.client.models")
_EXPORT = re.compile(r"^from ([\w.]+) import (\w+)$", re.MULTILINE)


class LazyPackage(types.ModuleType):
    """A package whose exported names are imported on first use, each from its own module."""

    def __init__(self, name: str, path: Path, exports: dict[str, str]) -> None:
        super().__init__(name)
        self.__path__ = [str(path)]
        self.__file__ = str(path / "__init__.py")
        self.__package__ = name
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        self.__spec__.submodule_search_locations = [str(path)]
        self.__all__ = list(exports)
        self._exports = exports

    def __getattr__(self, attr: str) -> Any:
        module = self.__dict__.get("_exports", {}).get(attr)
        if module is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        value = getattr(importlib.import_module(module), attr)
        setattr(self, attr, value)  # found directly from now on
        return value

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._exports})


def installed() -> bool:
    return isinstance(sys.modules.get(PACKAGES[0]), LazyPackage)


def install() -> None:
    """Put the lazy packages in place; nothing happens once the real client is imported."""
    if any(name in sys.modules for name in PACKAGES):
        return
    spec = importlib.util.find_spec("kubernetes_asyncio")  # a top-level package: not run by find_spec
    if spec is None or not spec.submodule_search_locations:
        return
    root = Path(next(iter(spec.submodule_search_locations)))
    packages: dict[str, LazyPackage] = {}
    for name in PACKAGES:
        path = root.joinpath(*name.split(".")[1:])
        source = (path / "__init__.py").read_text()
        exports = {attr: module for module, attr in _EXPORT.findall(source)}
        packages[name] = sys.modules[name] = LazyPackage(name, path, exports)
        if "__version__" in source:
            version = re.search(r'^__version__ = "([^"]+)"', source, re.MULTILINE)
            packages[name].__version__ = version.group(1) if version else ""  # type: ignore[attr-defined]
    client = packages[PACKAGES[0]]
    client.api = packages[PACKAGES[1]]  # type: ignore[attr-defined]
    client.models = packages[PACKAGES[2]]  # type: ignore[attr-defined]
    # The top package now, as `import kubernetes_asyncio.client` would: its modules import each other
    # (config needs client.ApiClient, whose module imports the package), which resolves only in
    # this order.
    importlib.import_module("kubernetes_asyncio")
