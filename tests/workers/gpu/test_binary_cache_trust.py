"""The OpenCL program binary cache is read only from a directory no one but you or root can
write, and only files you own: a binary planted by someone else is never run."""

import logging
import os
import shutil

import pytest

from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.program import ProgramCache, cache_dir

LOGGER = "flowrt.workers.gpu.program"


def _kernel_names(program) -> set[str]:
    return set(program.get_info(cl.program_info.KERNEL_NAMES).split(";"))


@pytest.fixture
def planted(gpu, tmp_path, monkeypatch):
    """A cache whose file for program ``layout`` holds another program's binary (``pad``):
    a binary that builds and runs, but is not the one flowrt compiled for that name."""
    monkeypatch.setenv("FLOWRT_CACHE_DIR", str(tmp_path / "cache"))
    ProgramCache(gpu.context, gpu.device, store_binaries=True).get("layout")
    ProgramCache(gpu.context, gpu.device, store_binaries=True).get("pad")
    (layout,) = cache_dir().glob("layout--*.bin")
    (pad,) = cache_dir().glob("pad--*.bin")
    shutil.copyfile(pad, layout)
    return layout


def test_a_planted_binary_in_a_trusted_cache_would_run(gpu, planted):
    # The control: in a cache only we can write, the file is taken as ours.
    cache = ProgramCache(gpu.context, gpu.device, store_binaries=True)
    assert "transpose" not in _kernel_names(cache.get("layout"))
    assert cache.builds == {"layout": "binary"}


@pytest.mark.parametrize("open_dir", ["cache", "above"])
def test_a_planted_binary_in_a_world_writable_cache_is_not_used(gpu, planted, caplog, open_dir):
    (planted.parent if open_dir == "cache" else planted.parent.parent).chmod(0o777)
    before = planted.read_bytes()
    cache = ProgramCache(gpu.context, gpu.device, store_binaries=True)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert {"transpose", "concat_slab"} <= _kernel_names(cache.get("layout"))
    assert cache.builds == {"layout": "source"}
    assert "not using the OpenCL binary cache" in caplog.text
    assert "is writable by others (mode 0o777)" in caplog.text
    assert planted.read_bytes() == before  # nor written into


def test_a_cache_file_not_owned_by_you_is_ignored_and_replaced(gpu, planted, caplog):
    if os.getuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(planted, 54321, -1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cache = ProgramCache(gpu.context, gpu.device, store_binaries=True)
        assert "transpose" in _kernel_names(cache.get("layout"))
    assert cache.builds == {"layout": "source"}
    assert f"ignoring cached OpenCL binary {planted}" in caplog.text
    assert "owned by uid 54321, not by you (uid 0)" in caplog.text
    assert planted.stat().st_uid == 0  # the rebuilt binary took its place
    assert (planted.parent.stat().st_mode & 0o777, planted.parent.parent.stat().st_mode & 0o777) == (
        0o700,
        0o700,
    )  # the cache directories flowrt made are private
