"""A HIGH-priority GpuAcc run beside a LOW-priority stream: its latency against its idle latency.

    python benchmarks/gpu_priority.py [--model resnet50] [--batch 1] [--low-batch 8]
                                      [--low-clients 2] [--probes 30]

One torchvision model (random weights, exported to ONNX as ``benchmarks/gpu.py`` does) is
loaded twice on GpuAcc: at ``--batch`` for the probe and at ``--low-batch`` for the stream,
with ``--low-clients`` runs of the stream in flight (a memory pool each). The probe's latency
is measured idle (the stream stopped), then beside the stream three ways: the probe at HIGH
priority, and, as the baseline that shows what priority buys, at LOW like the stream. The
stream's images per second are printed beside each. flowrt's own admission orders a device's
runs by priority (NVIDIA's OpenCL driver takes no queue priority hints); a run already on the
device is not preempted, so a probe waits at most for the commands enqueued before it. While
HIGH runs are coming, the LOW runs go to the device in chunks; the LOW probes start
``RECENT_S`` after the last HIGH run, when they no longer are (see ``flowrt.workers.gpu.queues``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import trio

import flowrt
from flowrt.workers.gpu.queues import RECENT_S

sys.path.insert(0, str(Path(__file__).parent))
from gpu import _export, _torch_model  # noqa: E402 (a sibling script)

BACKENDS = ["GpuAcc", "CpuRef"]


async def _measure(probe_path: str, low_path: str, batch: int, low_batch: int, clients: int, probes: int):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)
    low_x = rng.standard_normal((low_batch, 3, 224, 224), dtype=np.float32)
    async with flowrt.Runtime() as rt:
        probe = await rt.load(
            flowrt.optimize(flowrt.onnx.load(probe_path), backends=BACKENDS), max_in_flight=1
        )
        low = await rt.load(
            flowrt.optimize(flowrt.onnx.load(low_path), backends=BACKENDS), max_in_flight=clients
        )
        (name,) = probe.inputs
        (low_name,) = low.inputs
        for _ in range(3):
            await probe.run({name: x}, priority=flowrt.Priority.HIGH)
            await low.run({low_name: low_x}, priority=flowrt.Priority.LOW)

        async def probe_latencies(priority: flowrt.Priority) -> list[float]:
            times = []
            for _ in range(probes):
                start = time.perf_counter()
                await probe.run({name: x}, priority=priority)
                times.append(time.perf_counter() - start)
                await trio.sleep(0.002)  # a request now and then, not a second stream
            return times

        rows = [("idle", "HIGH", statistics.median(await probe_latencies(flowrt.Priority.HIGH)), 0.0)]
        for priority in (flowrt.Priority.HIGH, flowrt.Priority.LOW):
            done = 0
            stop = trio.Event()

            async def stream(stop: trio.Event = stop) -> None:
                nonlocal done
                while not stop.is_set():
                    await low.run({low_name: low_x}, priority=flowrt.Priority.LOW)
                    done += low_batch

            async with trio.open_nursery() as nursery:
                for _ in range(clients):
                    nursery.start_soon(stream)
                # The stream at its pace; before the LOW probes, also past the time after the
                # last HIGH run in which GpuAcc still cuts the LOW runs into chunks.
                await trio.sleep(0.2 if priority == flowrt.Priority.HIGH else RECENT_S + 0.2)
                start, before = time.perf_counter(), done
                times = await probe_latencies(priority)
                ips = (done - before) / (time.perf_counter() - start)
                stop.set()
            rows.append(("beside the LOW stream", priority.name, statistics.median(times), ips))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--low-batch", type=int, default=8)
    parser.add_argument("--low-clients", type=int, default=2)
    parser.add_argument("--probes", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = _torch_model(args.model)
        probe_path = _export(model, args.batch, folder, args.model)
        low_path = _export(model, args.low_batch, folder, args.model)
        rows = trio.run(
            _measure, probe_path, low_path, args.batch, args.low_batch, args.low_clients, args.probes
        )
    idle = rows[0][2]
    print(
        f"{args.model}: probe batch {args.batch}; LOW stream batch {args.low_batch}, {args.low_clients} in flight"
    )
    print("| probe | priority | probe ms (median) | x idle | LOW stream img/s |")
    print("| --- | --- | ---: | ---: | ---: |")
    for where, priority, seconds, ips in rows:
        print(f"| {where} | {priority} | {seconds * 1e3:.2f} | {seconds / idle:.2f} | {ips:.0f} |")


if __name__ == "__main__":
    main()
