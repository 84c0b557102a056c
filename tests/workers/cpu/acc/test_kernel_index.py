"""CpuAcc's index of kernel modules by layer kind matches what the modules register, and a
kind's kernel is found by importing its module alone."""

import json
import subprocess
import sys

from flowrt.workers.cpu.acc.kernels import KERNEL_MODULES, load_all

PACKAGE = "flowrt.workers.cpu.acc.kernels"


def test_the_index_names_the_module_of_every_registered_kernel():
    registered = {kind: cls.__module__ for kind, cls in load_all().items()}
    assert {kind: f"{PACKAGE}.{module}" for kind, module in KERNEL_MODULES.items()} == registered


def test_asking_for_one_kind_imports_its_module_and_not_the_others():
    code = f"""
import json, sys
from flowrt.workers.cpu.acc.kernels import kernel_for
assert kernel_for("Relu").__module__ == "{PACKAGE}.activation"
assert kernel_for("NoSuchKind") is None
print(json.dumps([m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("{PACKAGE}.")]))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(result.stdout))
    assert "activation" in loaded
    assert not loaded & {"qlinear", "recurrent", "conv", "gemm", "resize"}
