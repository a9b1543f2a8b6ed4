"""The flotilla CLI as a Python package: ``python -m flotilla`` runs the ``flotilla`` binary that
this wheel installed into the environment's scripts directory."""

import os
import sys
import sysconfig


def find_flotilla_bin() -> str:
    """The path of the ``flotilla`` binary installed with this package."""
    name = "flotilla"
    candidates = [os.path.join(sysconfig.get_path("scripts"), name)]
    if sys.version_info >= (3, 10):
        user_scheme = sysconfig.get_preferred_scheme("user")
    else:
        user_scheme = "posix_user"
    candidates.append(os.path.join(sysconfig.get_path("scripts", scheme=user_scheme), name))
    # a --target or --prefix install: <prefix>/bin beside <prefix>/lib/pythonX.Y/site-packages
    package_dir = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(package_dir, "..", "..", "..", "..", "bin", name))
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.normpath(candidate)
    raise FileNotFoundError(
        "the flotilla binary is not installed beside this package (looked at "
        + ", ".join(os.path.normpath(c) for c in candidates)
        + "); reinstall it: pip install --force-reinstall flotilla"
    )
