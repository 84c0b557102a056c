"""``onnxruntime.capi``'s place in flowrt, for code that reaches ONNX Runtime's exception
names through it: ``from flowrt.capi.onnxruntime_pybind11_state import InvalidArgument``, or
``ort.capi.onnxruntime_pybind11_state.Fail`` after ``import flowrt as ort``. Light to import:
it loads flowrt's error classes only."""

from flowrt.capi import onnxruntime_pybind11_state

__all__ = ["onnxruntime_pybind11_state"]
