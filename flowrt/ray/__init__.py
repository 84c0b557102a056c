"""``flowrt.ray``: flowrt pipelines scaled out on a Ray cluster (``pip install 'flowrt[ray]'``).

::

    import ray
    import flowrt.ray

    ray.init(address="auto")
    stages = [flowrt.ray.Stage(detector_net, replicas=2), to_crops, flowrt.ray.Stage("classify.onnx")]
    async with flowrt.ray.Pipeline(stages) as pipeline:
        outputs = await pipeline.run({"image": frame})

Each replica of a ``Stage`` is a Ray actor that runs a flowrt ``Runtime`` in a thread of its
own (``flowrt.ray.replica``); the ``Pipeline`` on the driver sends requests to the least busy
live replica of each stage, keeps their results in submission order, bounds the requests in
flight per stage and in all, and sends a request once more to another replica when the one
running it dies (``flowrt.ray.replicas``). docs/scale-out.md has the design and its costs.
"""

try:
    import ray  # noqa: F401  # flowrt.ray is optional: say how to get Ray when it is missing
except ImportError as e:
    raise ImportError(
        "flowrt.ray needs Ray, which is not installed: pip install 'flowrt[ray]' (or 'ray>=2.40')"
    ) from e

from flowrt.ray.pipeline import Pipeline
from flowrt.ray.replicas import ReplicaInfo
from flowrt.ray.stage import Stage

__all__ = ["Pipeline", "ReplicaInfo", "Stage"]
