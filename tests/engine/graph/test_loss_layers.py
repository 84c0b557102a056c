"""Shape and type inference of NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss."""

import numpy as np
import pytest

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError, UnsupportedLayerError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

F32, F64, I32, I64 = DataType.FLOAT32, DataType.FLOAT64, DataType.INT32, DataType.INT64
LOSSES = ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"]


def _infer(kind, *infos, consts=None, **attributes):
    desc = get_layer_kind(kind).descriptor(**attributes)
    return get_layer_kind(kind).infer(desc, list(infos), consts or [None] * len(infos))


@pytest.mark.parametrize("kind", LOSSES)
def test_reduction_none_gives_the_labels_shape_with_known_dims_merged(kind):
    (loss,) = _infer(
        kind, TensorInfo(("N", 5, None, 7), F64), TensorInfo((None, 6, "W"), I32), reduction="none"
    )
    assert loss == TensorInfo(("N", 6, 7), F64)
    (loss,) = _infer(kind, TensorInfo((3, 5)), TensorInfo(None, I64), reduction="none")
    assert loss.shape == (3,)
    (loss,) = _infer(kind, TensorInfo(None), TensorInfo(None, I64), reduction="none")
    assert loss.shape is None


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_sum_and_mean_give_a_scalar_of_the_data_type(kind, reduction):
    (loss,) = _infer(kind, TensorInfo((2, 3, 4), F64), TensorInfo((2, 4), I64), TensorInfo((3,), F64))
    assert loss == TensorInfo((), F64)
    (loss,) = _infer(kind, TensorInfo(None), TensorInfo(None, I64), reduction=reduction)
    assert loss == TensorInfo((), F32)


def test_softmax_cross_entropy_log_prob_output_has_the_scores_info():
    scores = TensorInfo(("N", 4, 2), F32)
    loss, log_prob = _infer("SoftmaxCrossEntropyLoss", scores, TensorInfo(("N", 2), I64), num_outputs=2)
    assert loss == TensorInfo((), F32) and log_prob == scores


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize(
    ("infos", "error", "message"),
    [
        ([TensorInfo((5,)), TensorInfo((5,), I64)], ShapeError, r"input of rank 2 or more expected, got shape \(5,\)"),
        (
            [TensorInfo((2, 3, 4)), TensorInfo((2, 5), I64)],
            ShapeError,
            r"labels of shape \(2, 4\) \(the data's \(N, d1, ..., dk\)\) expected, got \(2, 5\) for data of shape \(2, 3, 4\)",
        ),
        ([TensorInfo((2, 3, 4)), TensorInfo((2,), I64)], ShapeError, r"labels of shape \(2, 4\).*got \(2,\)"),
        ([TensorInfo((2, 3)), TensorInfo((2,), I64), TensorInfo((4,))], ShapeError, r"weight of shape \(3,\) expected, got \(4,\)"),
        ([TensorInfo((2, 3)), TensorInfo((2,), I64), TensorInfo((1, 3))], ShapeError, r"weight of shape \(3,\) expected"),
        ([TensorInfo((2, 3)), TensorInfo((2,), I64), TensorInfo((3,), F64)], DataTypeError, r"input and weight expects inputs of one data type, got float32, float64"),
        ([TensorInfo((2, 3)), TensorInfo((2,), F32)], DataTypeError, r"labels expects one of int32, int64, got float32"),
        ([TensorInfo((2, 3), I64), TensorInfo((2,), I64)], DataTypeError, r"expects one of .*float32.*, got int64"),
    ],
)  # fmt: skip
def test_bad_operands_raise_errors_saying_what_was_expected(kind, infos, error, message):
    with pytest.raises(error, match=f"{kind}.*{message}"):
        _infer(kind, *infos)


@pytest.mark.parametrize("kind", LOSSES)
def test_constant_labels_outside_the_classes_are_refused_at_inference(kind):
    infos = [TensorInfo((2, 3, 2)), TensorInfo((2, 2), I64)]
    labels = np.array([[0, 2], [-1, 3]])
    with pytest.raises(ShapeError, match=r"labels must be in \[0, 3\), got -1 at index \[1, 0\]"):
        _infer(kind, *infos, consts=[None, labels])
    with pytest.raises(ShapeError, match=r"in \[0, 3\) or ignore_index -1, got 3 at index \[1, 1\]"):
        _infer(kind, *infos, consts=[None, labels], ignore_index=-1)
    assert _infer(kind, *infos, consts=[None, np.array([[0, 2], [3, 3]])], ignore_index=3)


@pytest.mark.parametrize("kind", LOSSES)
def test_onnx_attributes_are_checked_where_the_node_is_read(kind):
    with pytest.raises(ModelLoadError, match=f"invalid attributes for {kind}.*'reduction' must be in"):
        make_descriptor(kind, {"reduction": "avg"}, opset=13, num_outputs=1)
    with pytest.raises(UnsupportedLayerError, match="attribute.*axis are not supported"):
        make_descriptor(kind, {"axis": 1}, opset=13, num_outputs=1)
    desc = make_descriptor(kind, {"ignore_index": -100, "reduction": "sum"}, opset=22, num_outputs=1)
    assert (desc.ignore_index, desc.reduction) == (-100, "sum")


def test_softmax_cross_entropy_has_at_most_two_outputs():
    with pytest.raises(ModelLoadError, match="'num_outputs' must be in"):
        make_descriptor("SoftmaxCrossEntropyLoss", {}, opset=13, num_outputs=3)


def test_network_builder_names_the_loss_layer_whose_labels_do_not_fit():
    net = flowrt.Network()
    scores = net.add_input("scores", TensorInfo((2, 3, 4)))
    labels = net.add_input("labels", TensorInfo((2, 3), I64))
    loss = net.add_layer("SoftmaxCrossEntropyLoss", inputs=[scores, labels], name="xent")
    net.add_output("loss", loss)
    with pytest.raises(
        ShapeError, match=r"layer 'xent' \(SoftmaxCrossEntropyLoss\): .*labels of shape \(2, 4\)"
    ):
        net.validate()
