"""Whether a file or directory could have been written by someone other than you or root.

The rule is OpenSSH's StrictModes: the path is resolved (symbolic links followed), then the
file itself and every directory above it up to ``/`` must be owned by the current user or
root and be writable by neither group nor others. A directory that others may write lets
them replace what lies below it, so one such directory anywhere above makes the whole path
untrusted. One exception (``allow_sticky``), for backend code and caches alike: a sticky
directory owned by root or us, like ``/tmp``, may sit *above* the path (never be the
directory itself), since its sticky bit stops others from renaming or replacing what we own
in it; a repository cloned into ``/tmp/x`` is then as trusted as one in a home directory.

On a platform without POSIX owners (Windows) nothing is checked.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PathLike = str | os.PathLike[str]

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _has_owners() -> bool:
    return hasattr(os, "getuid")


def _mode_problem(path: Path, info: os.stat_result, *, sticky_ok: bool) -> str | None:
    """Why ``info`` (of ``path``) is not safe, or None."""
    uid = os.getuid()
    kind = "directory" if stat.S_ISDIR(info.st_mode) else "file"
    mode = f"mode 0o{stat.S_IMODE(info.st_mode):o}"
    if info.st_uid not in (uid, 0):
        return f"{kind} {path} is owned by uid {info.st_uid}, not by you (uid {uid}) or root"
    writable = info.st_mode & _OTHERS_WRITE
    if writable and not (sticky_ok and stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX):
        who = "others" if info.st_mode & stat.S_IWOTH else "its group"
        return f"{kind} {path} is writable by {who} ({mode})"
    return None


def untrusted_reason(path: PathLike, *, allow_sticky: bool = False) -> str | None:
    """Why ``path`` could have been written by someone other than the current user or root,
    or None when it could not. Symbolic links are followed; the reason then names the link's
    target. ``allow_sticky`` accepts sticky directories (``/tmp``) *above* the path, never the
    path itself. Reads metadata only; never raises for a missing or unreadable path (that is
    a reason too)."""
    if not _has_owners():
        return None
    given = Path(path)
    try:
        real = Path(os.path.realpath(given))
        info = os.stat(real)
    except (OSError, ValueError) as e:
        return f"{given} cannot be examined: {e}"
    problem = _mode_problem(real, info, sticky_ok=False)
    for parent in real.parents:
        if problem:
            break
        try:
            problem = _mode_problem(parent, os.stat(parent), sticky_ok=allow_sticky)
        except OSError as e:
            problem = f"directory {parent} cannot be examined: {e}"
    if problem and real != given.absolute():
        return f"{problem} (reached through the symbolic link {given} -> {real})"
    return problem


def owned_file_problem(info: os.stat_result) -> str | None:
    """Why a file whose ``os.fstat`` is ``info`` may not be trusted as data we wrote: not a
    regular file, not owned by the current user, or writable by group or others; None if fine."""
    if not _has_owners():
        return None
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    if info.st_uid != os.getuid():
        return f"it is owned by uid {info.st_uid}, not by you (uid {os.getuid()})"
    if info.st_mode & _OTHERS_WRITE:
        return f"it is writable by group or others (mode 0o{stat.S_IMODE(info.st_mode):o})"
    return None


def private_directory(path: PathLike) -> str | None:
    """Create directory ``path`` (and any missing parent) with mode 0o700 if it is missing,
    then check it as :func:`untrusted_reason` does with sticky parents allowed. Returns why it
    may not be trusted (or could not be made), None when only you (or root) can write it."""
    directory = Path(path)
    missing = [p for p in (directory, *directory.parents) if not os.path.lexists(p)]
    for component in reversed(missing):
        # One by one: os.makedirs gives its mode to the last directory only.
        try:
            os.mkdir(component, 0o700)
        except FileExistsError:
            pass  # another process made it first; the check below judges it
        except OSError as e:
            return f"directory {component} cannot be created: {e}"
    return untrusted_reason(directory, allow_sticky=True)
