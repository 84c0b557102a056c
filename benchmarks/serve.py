"""Serving over HTTP: ``flowrt serve`` against FastAPI on uvicorn around ONNX Runtime, both
driven by Triton's HTTP client (``tritonclient.http``), measured in the same run.

    python benchmarks/serve.py [--models squeezenet,resnet50] [--clients 1,16,64]
        [--requests 200] [--duration 6] [--warmup 2] [--rounds 2] [--backends CpuAcc,CpuRef]

Per model, three servers, each started as a process of its own on a free port of 127.0.0.1:

- flowrt, batching on: ``flowrt serve`` on a temporary model repository holding the model as
  ``<model>/1/model.onnx`` and a ``config.pbtxt`` with ``max_batch_size: 8`` and
  ``dynamic_batching { max_queue_delay_microseconds: 2000 }``;
- flowrt, batching off: the same repository without ``dynamic_batching`` (``max_batch_size: 0``);
- the peer, the server people write today: ``benchmarks/serve_peer.py``, a FastAPI app on
  uvicorn (one worker process) running one ONNX Runtime session (CPUExecutionProvider, its
  default options) in Starlette's thread pool. It does not batch requests together, so its
  figures stand beside both flowrt rows of a client count.

Each server is measured alone: it is started, polled until ``is_server_ready``, sent one
request (the model's pattern input: ``arange(n) / n`` in the input's shape), warmed up for
``--warmup`` seconds by as many clients as the largest count, then measured once per count of
``--clients``; then it gets SIGTERM, the benchmark waits for it to exit (flowrt serve exits 0)
and pauses ``PAUSE`` seconds before the next server. ``--rounds`` rounds, the servers in the
opposite order every other round; the table gives the round with the most requests/s per
configuration.

A measurement with N clients is N threads, each with its own ``InferenceServerClient`` (its
connection opened before the clock starts), sending ``infer`` requests of that same input
with tritonclient's defaults (input and outputs as binary tensor data). A thread takes the
next request until ``--requests`` have been taken or ``--duration`` seconds have passed; a
request's latency is its ``infer`` call; requests/s are the requests completed over the wall
time from the start to the last response.

Threads rather than processes: the client's work per request (a JSON header and one copy of
the input's bytes, then parsing the response) is small beside a model's run, under 1 ms of
CPU for squeezenet's 600 KB input on a 2-core x86 machine, and a thread spends the rest
waiting on its socket, with the GIL released; 16 threads of it used under 0.15 of a core
there, so the GIL does not hold them back. Client processes would not give the server more
CPU either: the server uses every core, and the clients share them with it however they are
made. The client and its costs are the same for both servers.

Printed: the command line and machine, then per model a markdown table (requests/s and
p50/p99 latency of each server, the ratio flowrt / peer requests/s), the geometric mean of
the ratios, and the largest difference between the two servers' outputs for the same input.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from flowrt.bench import BenchResult
from flowrt.models import light_model

PEER = Path(__file__).resolve().with_name("serve_peer.py")
PAUSE = 2.0  # seconds between one server's exit and the next one's start
START_TIMEOUT = 600.0  # seconds a server may take to become ready (a first flowrt start compiles kernels)
BATCHING_ON = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 2000 }\n"
BATCHING_OFF = "max_batch_size: 0\n"
SERVERS = ("flowrt on", "flowrt off", "peer")
PACKAGES = ("flowrt", "onnxruntime", "tritonclient", "fastapi", "uvicorn", "uvloop", "httptools")


def _feeds(path: str) -> dict[str, np.ndarray]:
    """The model's pattern input: ``arange(n) / n`` (integers: ``% 10``), symbolic dims 1."""
    graph = onnx.load(path, load_external_data=False).graph
    weights = {i.name for i in graph.initializer}
    feeds = {}
    for entry in graph.input:
        if entry.name in weights:
            continue
        tensor = entry.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in tensor.shape.dim)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        ramp = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape)
        feeds[entry.name] = (ramp / max(ramp.size, 1) if dtype.kind == "f" else ramp % 10).astype(dtype)
    return feeds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _repository(root: Path, name: str, path: str, config: str) -> Path:
    """A model repository under ``root`` with the model ``name`` and its ``config.pbtxt``."""
    version = root / name / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").symlink_to(Path(path).resolve())
    (root / name / "config.pbtxt").write_text(config)
    return root


class Served:
    """One server process, from its start to its exit."""

    def __init__(self, label: str, command: list[str], port: int, log: Path) -> None:
        self.label, self.url, self.log = label, f"127.0.0.1:{port}", log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.perf_counter() + START_TIMEOUT
        with httpclient.InferenceServerClient(self.url) as client:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{label} exited with {self.process.returncode}:\n{self._tail()}")
                try:
                    if client.is_server_ready():
                        return
                except Exception:  # not listening yet
                    pass
                if time.perf_counter() > deadline:
                    self.process.kill()
                    raise RuntimeError(f"{label} not ready after {START_TIMEOUT:g} s:\n{self._tail()}")
                time.sleep(0.1)

    def _tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])

    def stop(self) -> int:
        """SIGTERM, then its exit status (a signal: minus its number)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"{self.label} still running 60 s after SIGTERM:\n{self._tail()}") from None


def _infer_inputs(feeds: dict[str, np.ndarray]) -> list[httpclient.InferInput]:
    inputs = []
    for name, value in feeds.items():
        entry = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        entry.set_data_from_numpy(value)  # binary_data=True, tritonclient's default
        inputs.append(entry)
    return inputs


def one_request(url: str, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The outputs of one request of ``feeds``."""
    with httpclient.InferenceServerClient(url, network_timeout=600) as client:
        result = client.infer(model, _infer_inputs(feeds))
        return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def load(
    url: str, model: str, feeds: dict[str, np.ndarray], clients: int, requests: int, duration: float
) -> BenchResult:
    """``clients`` threads sending requests until ``requests`` were taken or ``duration``
    seconds have passed; a failed request stops the measurement with its error."""
    left = [requests]
    lock = threading.Lock()
    latencies: list[float] = []
    errors: list[str] = []
    ready = threading.Barrier(clients + 1)
    deadline = [math.inf]

    def client() -> None:
        with httpclient.InferenceServerClient(url, network_timeout=600) as connection:
            inputs = _infer_inputs(feeds)
            try:
                connection.is_server_live()  # opens the connection before the clock starts
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
            ready.wait()
            while True:
                with lock:
                    if left[0] == 0 or time.perf_counter() >= deadline[0] or errors:
                        return
                    left[0] -= 1
                begin = time.perf_counter()
                try:
                    connection.infer(model, inputs)
                except Exception as e:
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")
                    return
                took = time.perf_counter() - begin
                with lock:
                    latencies.append(took)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    start = time.perf_counter()
    deadline[0] = start + duration
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} failed request(s) with {clients} clients, the first: {errors[0]}")
    return BenchResult("", tuple(latencies), wall, 0.0)


def _commands(name: str, path: str, work: Path, backends: str | None) -> dict[str, list[str]]:
    """Each server's command line, its port left out (the flowrt repositories made in ``work``)."""
    commands = {}
    for label, config in (("flowrt on", BATCHING_ON), ("flowrt off", BATCHING_OFF)):
        repository = _repository(work / label.replace(" ", "_"), name, path, config)
        commands[label] = [sys.executable, "-m", "flowrt", "serve", str(repository)]
        if backends:
            commands[label] += ["--backends", backends]
    commands["peer"] = [sys.executable, str(PEER), path, "--name", name]
    return commands


def measure(
    name: str, args: argparse.Namespace
) -> tuple[dict[tuple[str, int], BenchResult], dict[str, dict]]:
    """Per (server, clients) the best round; per server its outputs for the pattern input."""
    path = str(light_model(name))
    feeds = _feeds(path)
    best: dict[tuple[str, int], BenchResult] = {}
    outputs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        commands = _commands(name, path, work, args.backends)
        for round_ in range(args.rounds):
            for label in SERVERS if round_ % 2 == 0 else SERVERS[::-1]:
                port = _free_port()
                option = "--port" if label == "peer" else "--http-port"
                log = work / f"{label.replace(' ', '_')}.log"
                served = Served(label, [*commands[label], option, str(port)], port, log)
                try:
                    outputs.setdefault(label, one_request(served.url, name, feeds))
                    load(served.url, name, feeds, max(args.clients), 4 * max(args.clients), args.warmup)
                    for clients in args.clients:
                        r = load(served.url, name, feeds, clients, args.requests, args.duration)
                        if (label, clients) not in best or r.throughput > best[label, clients].throughput:
                            best[label, clients] = r
                finally:
                    status = served.stop()
                if label != "peer" and status != 0:
                    print(f"warning: {label}: flowrt serve exited with {status} on SIGTERM", flush=True)
                time.sleep(PAUSE)
    return best, outputs


def _cells(r: BenchResult) -> str:
    return f"{r.throughput:.1f} | {r.percentile_ms(50):.1f} | {r.percentile_ms(99):.1f}"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def report(
    name: str, best: dict[tuple[str, int], BenchResult], outputs: dict[str, dict], clients_counts: list[int]
) -> list[float]:
    """Prints the model's table and the comparison of outputs; the ratios flowrt / peer."""
    print(f"\n### {name}\n")
    print(
        "| clients | batching | flowrt req/s | p50 ms | p99 ms | peer req/s | p50 ms | p99 ms | flowrt/peer |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ratios = []
    for clients in clients_counts:
        peer = best["peer", clients]
        for label in ("flowrt on", "flowrt off"):
            ours = best[label, clients]
            ratio = ours.throughput / peer.throughput
            ratios.append(ratio)
            print(f"| {clients} | {label.split()[1]} | {_cells(ours)} | {_cells(peer)} | {ratio:.2f} |")
    print(f"\n{name}: geometric mean of flowrt/peer requests/s: {_geomean(ratios):.2f}")
    for label in ("flowrt on", "flowrt off"):
        for output, theirs in outputs["peer"].items():
            ours = outputs[label].get(output)
            if ours is None or ours.shape != theirs.shape:
                shape = None if ours is None else ours.shape
                print(f"{name}: {label} output {output!r}: {shape}, the peer's {theirs.shape}")
                continue
            diff = float(np.max(np.abs(ours.astype(np.float64) - theirs)))
            print(
                f"{name}: same input, {label} vs peer, output {output!r}: max |difference| {diff:.3g} "
                f"(values up to {float(np.max(np.abs(theirs))):.3g}), argmax {int(ours.argmax())} vs {int(theirs.argmax())}"
            )
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="squeezenet,resnet50", help="light models, comma-separated")
    parser.add_argument("--clients", default="1,16,64", help="counts of concurrent clients, comma-separated")
    parser.add_argument("--requests", type=int, default=200, help="requests per measurement, at most")
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per measurement, at most")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per server start")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backends", default=None, help="flowrt serve's --backends (default: its own)")
    args = parser.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    versions = ", ".join(f"{p} {_version(p)}" for p in PACKAGES)
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; {versions}")
    ratios = []
    for name in args.models.split(","):
        best, outputs = measure(name, args)
        ratios += report(name, best, outputs, args.clients)
    if len(args.models.split(",")) > 1:
        print(f"\nall models: geometric mean of flowrt/peer requests/s: {_geomean(ratios):.2f}")


if __name__ == "__main__":
    main()
