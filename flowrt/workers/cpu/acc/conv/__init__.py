"""CpuAcc's 2-D convolution (NCHW, float32): one module per algorithm, as the Compute Library's
``NEConvolutionLayer`` has one function per method. The registered kernel,
``kernels/conv.py``'s ``ConvKernel``, plans each input shape once: it makes the shape's
:class:`~.geometry.ConvGeometry` and takes the plan of the first algorithm of
``algorithms.ALGORITHMS`` that applies to it, under the kernel's frozen
:class:`~.tuning.ConvTuning`.

In the order they are tried:

- ``depthwise.py``: :class:`DepthwiseSame3` (3x3, unit strides, one pad cell on each side),
  then ``depthwise_same5.py``'s :class:`DepthwiseSame5` (5x5, two pad cells),
  ``depthwise_strided.py``'s :class:`DepthwiseStrided2` (3x3 and 5x5 at stride 2), then
  :class:`Depthwise`, a direct sliding window per (image, channel) plane;
- ``grouped_same3.py``: :class:`GroupedSame3` and :class:`GroupedStrided2`, grouped 3x3
  convs of few channels per group at stride 1 and 2, one pass per input channel; ``grouped.py``: :class:`Grouped`, other groups of few
  channels as direct windows;
- ``winograd_conv.py``: :class:`Winograd`, large 3x3 stride-1 convs by F(2x2, 3x3)
  (``winograd.py``) or F(4x4, 3x3) (``winograd4.py``);
- ``taps.py``: :class:`Taps`, stride 1 with few output channels, one GEMM per kernel tap;
- ``vector.py``: :class:`Vector`, a 1x1 conv on a 1x1 plane as weights times a vector;
- ``batched.py``: :class:`Batched`, a batch of small images through large weights as one GEMM;
- ``packed.py``: :class:`Packed`, 1x1 convs by register tiles over all the images' pixels;
- ``columns.py``: :class:`Columns` and :class:`Rows`, im2col (``im2col.py``) and GEMM,
  split over pixels or over output channels.

``weights.py`` keeps what the algorithms derive from constant weights (tap matrices, Winograd
transforms, register-tile panels).
"""
