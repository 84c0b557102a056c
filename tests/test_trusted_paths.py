"""Dynamic backends are imported only from places that no one but you or root can write, as ssh
trusts its files: the directory, the file, every directory above them, after symbolic links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dynbackends import assert_runs, trusted_tmp_path_fixture, write_backend  # noqa: F401

import flowrt
import flowrt.registry.dynamic as dynamic
from flowrt.cli import main

OTHER_UID = 54321  # a user that does not own anything here


@pytest.fixture(autouse=True)
def isolated_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    """No installed distribution's entry points and no FLOWRT_BACKEND_PATHS from the environment."""
    monkeypatch.setattr(dynamic, "advertised_entry_points", lambda: [])
    monkeypatch.delenv(dynamic.BACKEND_PATHS_ENV, raising=False)


@pytest.fixture
def registry() -> flowrt.BackendRegistry:
    return flowrt.backend_registry().copy()


def _skipped(rt: flowrt.Runtime) -> dict[str, str]:
    return {s.source: s.reason for s in rt.dynamic_backends.skipped}


def _as_another_user(path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(path, OTHER_UID, -1)


@pytest.mark.parametrize(
    ("mode", "who"), [(0o777, "others"), (0o775, "its group"), (0o1777, "others")], ids=["777", "775", "1777"]
)
async def test_a_backend_directory_others_can_write_is_skipped_with_the_reason(
    trusted_tmp_path, registry, capsys, monkeypatch, mode, who
):
    shared = trusted_tmp_path / "shared"
    write_backend(shared)
    shared.chmod(mode)
    async with flowrt.Runtime(registry, backend_paths=[shared]) as rt:
        assert rt.dynamic_backends.ids == []
        reason = _skipped(rt)[str(shared)]
    assert f"directory {shared} is writable by {who} (mode 0o{mode:o})" in reason
    assert "untrusted" in reason
    monkeypatch.setenv(dynamic.BACKEND_PATHS_ENV, str(shared))
    assert main(["backends"]) == 0
    assert (
        f"  {shared}: untrusted, others could write code there: directory {shared}" in capsys.readouterr().out
    )


async def test_a_directory_above_that_others_can_write_makes_the_backend_path_untrusted(
    trusted_tmp_path, registry
):
    backends = trusted_tmp_path / "open" / "backends"
    write_backend(backends)
    backends.parent.chmod(0o777)
    async with flowrt.Runtime(registry, backend_paths=[backends]) as rt:
        assert rt.dynamic_backends.ids == []
        assert f"directory {backends.parent} is writable by others" in _skipped(rt)[str(backends)]


def test_a_private_backend_directory_below_the_sticky_tmp_loads(tmp_path, registry):
    write_backend(tmp_path)  # pytest's tmp_path: private, below the sticky, root-owned /tmp
    report = dynamic.load_dynamic_backends(registry, [tmp_path])
    assert list(report.ids) == ["Test_Tiny"] and not report.skipped


def test_a_sticky_world_writable_backend_directory_itself_is_refused(tmp_path, registry):
    backends = tmp_path / "shared"
    write_backend(backends)
    backends.chmod(0o1777)
    report = dynamic.load_dynamic_backends(registry, [backends])
    assert report.ids == []
    assert "is writable by others (mode 0o1777)" in report.skipped[0].reason


@pytest.mark.parametrize("owner", ["file", "directory"])
async def test_a_backend_owned_by_another_user_is_skipped(trusted_tmp_path, registry, owner):
    path = write_backend(trusted_tmp_path / "backends")
    _as_another_user(path if owner == "file" else path.parent)
    async with flowrt.Runtime(registry, backend_paths=[path.parent]) as rt:
        assert rt.dynamic_backends.ids == []
        skipped = _skipped(rt)
    source = str(path if owner == "file" else path.parent)
    assert f"{owner} {source} is owned by uid {OTHER_UID}, not by you (uid 0) or root" in skipped[source]


async def test_a_backend_file_others_can_write_is_skipped_and_the_good_one_loads(trusted_tmp_path, registry):
    writable = write_backend(trusted_tmp_path, "Bad_Case_backend.py")
    writable.chmod(0o666)
    write_backend(trusted_tmp_path)
    async with flowrt.Runtime(registry, backend_paths=[trusted_tmp_path]) as rt:
        assert rt.dynamic_backends.ids == ["Test_Tiny"]
        assert f"file {writable} is writable by others (mode 0o666)" in _skipped(rt)[str(writable)]
        await assert_runs(rt, ("Test_Tiny",))


@pytest.mark.parametrize("link", ["file", "directory"])
async def test_a_symbolic_link_to_an_untrusted_place_is_refused(trusted_tmp_path, registry, link):
    planted = write_backend(trusted_tmp_path / "open", "plugin.py")
    planted.parent.chmod(0o777)
    backends = trusted_tmp_path / "backends"
    backends.mkdir()
    if link == "file":  # a link in a trusted backend directory to a file in an open one
        source, target = backends / "Test_Tiny_backend.py", planted
    else:  # a backend path that is a link to an open directory
        source, target = trusted_tmp_path / "alias", planted.parent
        backends = source
    source.symlink_to(target)
    async with flowrt.Runtime(registry, backend_paths=[backends]) as rt:
        assert rt.dynamic_backends.ids == []
        reason = _skipped(rt)[str(source)]
    assert f"directory {planted.parent} is writable by others" in reason
    assert f"reached through the symbolic link {source} -> {target}" in reason


async def test_a_trusted_directory_and_a_link_into_it_still_load(trusted_tmp_path, registry):
    write_backend(trusted_tmp_path / "backends")
    (trusted_tmp_path / "alias").symlink_to(trusted_tmp_path / "backends")
    async with flowrt.Runtime(registry, backend_paths=[trusted_tmp_path / "alias"]) as rt:
        assert rt.dynamic_backends.ids == ["Test_Tiny"]
        assert rt.dynamic_backends.skipped == ()
        await assert_runs(rt, ("Test_Tiny",))
