"""The argument parser of the ``flowrt`` command line: its commands, options and help."""

from __future__ import annotations

import argparse

import flowrt

MODEL_HELP = "an .onnx or .flowrt file (default: the shufflenet shipped with onnx)"
BACKENDS_HELP = (
    "comma-separated backend preference list (default: the fastest available: "
    "GpuAcc,CpuAcc,CpuRef where OpenCL shows a GPU, else CpuAcc,CpuRef; a .flowrt file keeps "
    "the backends it was converted for)"
)


def _verbose(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default,
        help="log what flowrt does on stderr: -v INFO (fallbacks and their reasons), -vv DEBUG",
    )


def _command(sub, name: str, help_text: str) -> argparse.ArgumentParser:
    """A command's parser; ``flowrt.cli.<name>.command`` runs it (imported only then)."""
    parser = sub.add_parser(name, help=help_text, description=help_text)
    # SUPPRESS: `flowrt -v run` keeps the top-level count unless the command's own -v is given.
    _verbose(parser, argparse.SUPPRESS)
    parser.set_defaults(module=f"flowrt.cli.{name}")
    return parser


def _threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU worker threads (default: one per core this process may use)",
    )


def _optimizer_flags(parser: argparse.ArgumentParser) -> None:
    """``--fast-math`` and ``--fp16`` (``flowrt.cli.model.OPTIMIZER_FLAGS``)."""
    parser.add_argument(
        "--fast-math",
        action="store_true",
        help="let backends take faster, less exact algorithms (OptimizerOptions(fast_math=True); "
        "docs/performance.md says which and by how much; .onnx models, or a .flowrt converted with it)",
    )
    parser.add_argument(
        "--fp16",
        action="store_true",
        dest="reduce_fp32_to_fp16",
        help="keep weights as float16 where a backend can (OptimizerOptions(reduce_fp32_to_fp16=True): "
        "CpuAcc halves its weights' bytes and computes in float32, GpuAcc stores its layers' tensors and "
        "weights as half and computes in float, multiplying halves on tensor cores where the GPU has them; "
        ".onnx models, or a .flowrt converted with it)",
    )


def _add_run(sub) -> None:
    run = _command(sub, "run", "run a model and print latency and outputs (default: shufflenet)")
    run.add_argument("model", nargs="?", help=MODEL_HELP)
    run.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="feed an input from a .npy file (repeatable); inputs not given get the deterministic pattern",
    )
    run.add_argument(
        "--output-dir", metavar="DIR", help="write each output as NAME.npy here (made if missing)"
    )
    run.add_argument("--backends", help=BACKENDS_HELP)
    _optimizer_flags(run)
    run.add_argument("--iterations", type=int, default=1, help="how many runs to time (default: 1)")
    run.add_argument(
        "--profile", metavar="TRACE.json", help="record every workload and write a Chrome trace here"
    )
    _threads(run)


def _add_inspect(sub) -> None:
    inspect = _command(
        sub,
        "inspect",
        "print where each layer runs: a summary (layers per backend, fallbacks and why, copies), "
        "then, with --layers, every layer",
    )
    inspect.add_argument("model", nargs="?", help=MODEL_HELP)
    inspect.add_argument("--backends", help=BACKENDS_HELP)
    _optimizer_flags(inspect)
    inspect.add_argument(
        "--layers",
        action="store_true",
        help="also print the graph passes, substitutions, imports and the table of every layer",
    )
    inspect.add_argument(
        "--memory", action="store_true", help="also plan memory and print the per-backend report"
    )
    inspect.add_argument(
        "--hint",
        action="append",
        default=[],
        metavar="LAYER=BACKEND",
        help="put a layer on a backend of the list (layer_backend_hints; repeatable, .onnx only)",
    )
    inspect.add_argument(
        "--launches",
        action="store_true",
        help="also load the model, run it on pattern inputs and print the kernel launches a run "
        "on each device backend, by layer kind",
    )
    inspect.add_argument(
        "--stream-hint",
        choices=("latency", "throughput"),
        help="also load the model and print the stream settings this performance hint chooses, and why "
        "(throughput measures the model once; the measurement is cached)",
    )


def _add_convert(sub) -> None:
    convert = _command(sub, "convert", "optimize an ONNX model once and save it as a .flowrt file")
    convert.add_argument("model", help="an .onnx file")
    convert.add_argument("-o", "--output", help="the .flowrt file to write (default: the model's, renamed)")
    convert.add_argument("--backends", help=BACKENDS_HELP.split("; a .flowrt")[0] + ")")
    _optimizer_flags(convert)


def _add_bench(sub) -> None:
    bench = _command(sub, "bench", "latency percentiles and throughput, optionally vs ONNX Runtime")
    bench.add_argument("model", nargs="?", help=MODEL_HELP)
    bench.add_argument("--backends", help=BACKENDS_HELP)
    _optimizer_flags(bench)
    bench.add_argument("--iterations", type=int, default=50, help="requests to time per engine (default: 50)")
    bench.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (default: 1)")
    bench.add_argument(
        "--batch",
        type=int,
        default=1,
        help="samples per request: the model re-batched from its batch of 1 (default: 1); ONNX Runtime "
        "gets the same feeds, or runs N batch-1 runs per request where it refuses them (a note says so)",
    )
    bench.add_argument(
        "--vs",
        metavar="onnxruntime",
        help="also run ONNX Runtime (pip install onnxruntime) on the .onnx model, alternating, and print the ratios",
    )
    bench.add_argument(
        "--duration", type=float, help="run for this many seconds instead of --iterations requests"
    )
    bench.add_argument(
        "--hint",
        choices=("latency", "throughput"),
        help="flowrt streams the requests through model.stream() of a model loaded with this performance "
        "hint, and prints what it chose (--concurrency is then ONNX Runtime's only)",
    )
    bench.add_argument("--plot", metavar="PNG", help="draw the latency distribution (needs matplotlib)")
    bench.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    _threads(bench)


def _add_tune(sub) -> None:
    tune = _command(
        sub, "tune", "tune GpuAcc's local work sizes and GEMM plans for a model into a tuning file"
    )
    tune.add_argument("model", help="an .onnx or .flowrt file")
    tune.add_argument(
        "--mode", choices=["rapid", "normal", "exhaustive"], default="normal", help="how many sizes to time"
    )
    tune.add_argument(
        "-o", "--output", required=True, help="the msgpack tuning file to write (updated if it exists)"
    )
    tune.add_argument(
        "--backends",
        help="comma-separated backend preference list (default: GpuAcc,CpuRef; a .flowrt file keeps its own)",
    )


def _add_serve(sub) -> None:
    serve = _command(sub, "serve", "serve a model repository over HTTP and gRPC, Triton's KServe v2 protocol")
    serve.add_argument(
        "repository",
        help="a directory of models: <model>/<version>/model.onnx (or .flowrt), config.pbtxt optional",
    )
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)")
    serve.add_argument("--http-port", type=int, default=8000, help="HTTP port (default: 8000; 0: a free one)")
    serve.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (default: 8001; 0: a free one)")
    serve.add_argument("--no-grpc", action="store_true", help="serve HTTP only")
    serve.add_argument("--backends", help=BACKENDS_HELP + "; a model's config parameter 'backends' wins")
    serve.add_argument(
        "--max-body-mib", type=float, default=64, help="larger request bodies are refused (413; default: 64)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``flowrt`` parser: one sub-command per command, each with ``-v``."""
    parser = argparse.ArgumentParser(prog="flowrt", description="flowrt: an asynchronous inference engine")
    parser.add_argument("--version", action="version", version=f"flowrt {flowrt.__version__}")
    _verbose(parser, 0)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_run, _add_inspect, _add_convert, _add_bench, _add_tune, _add_serve):
        add(sub)
    backends = _command(sub, "backends", "list registered backends and OpenCL devices")
    backends.add_argument(
        "--ops",
        action="store_true",
        help="instead, each layer kind (ONNX operator) per backend, and what each kernel declines",
    )
    return parser
