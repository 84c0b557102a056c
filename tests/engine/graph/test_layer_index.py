"""The layers package's tables, by which a look-up of one kind imports one module: each kind's
module, and the modules of the activation table's kinds, as the modules themselves register
them."""

from __future__ import annotations

import json
import subprocess
import sys

from flowrt.engine.graph import layer_kind, layers

PREFIX = "flowrt.engine.graph.layers."


def _registered() -> dict[str, str]:
    layers.register_all()
    return {kind: module.removeprefix(PREFIX) for kind, module in sorted(layer_kind.REGISTERED_BY.items())}


def test_each_kind_is_looked_up_in_the_module_that_registers_it():
    registered = _registered()
    table = "\n".join(f'    "{k}": "{m}",' for k, m in sorted(registered.items(), key=lambda i: (i[1], i[0])))
    assert registered == layers.KIND_MODULES, f"layers.KIND_MODULES is out of date; it should read:\n{table}"


def test_every_activation_is_registered_by_a_module_of_the_activation_table():
    registered = _registered()
    assert {registered[kind] for kind in layer_kind.ACTIVATIONS} == set(layers.ACTIVATION_MODULES)


# A fresh process: a look-up by name imports that kind's module only, and the activation
# table those of the activations; the listing of every kind imports them all.
_SCRIPT = """
import json, sys
from flowrt.engine.graph import layer_kind
before = {m for m in sys.modules if m.startswith("flowrt.engine.graph.layers.")}
layer_kind.get_layer_kind("GridSample")
layer_kind.activation_facts()
after = {m for m in sys.modules if m.startswith("flowrt.engine.graph.layers.")}
print(json.dumps(sorted(after - before)))
print(len(layer_kind.known_layer_kinds()) == len(layer_kind.LAYER_KINDS) > 150)
"""


def test_a_look_up_imports_the_kinds_module_only():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    imported, listed = set(json.loads(lines[0])), lines[1]
    wanted = {f"{PREFIX}{m}" for m in ("grid", *layers.ACTIVATION_MODULES)}
    assert wanted <= imported and len(imported) <= len(wanted) + 2  # and what those import
    assert f"{PREFIX}recurrent" not in imported and f"{PREFIX}attention" not in imported
    assert listed == "True"
