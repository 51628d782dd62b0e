"""The building blocks of the zoo's own networks (:mod:`leti.models.zoo`): nn-Meter-style variants of
MobileNetV1/V2, ResNet, ShuffleNetV2 and GhostNet, and RegNetX/Y (Keras 3 dropped ``keras.applications.RegNet*``).

Why one vocabulary with two back ends: the zoo must keep every model under a latency budget *before*
building it (choosing a resolution that fits), and the count and the model must never disagree. Every
builder here is written once against :class:`Net`; :class:`CountNet` runs it on ``(H, W, C)`` shapes and
adds up multiply-accumulates (convolutions and dense layers), :class:`KerasNet` runs it on Keras tensors.

Builders take the JSON-able parameter dict a :class:`~leti.models.zoo.ZooEntry` carries, plus the net.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

Shape = tuple[int, int, int]


def _same(size: int, stride: int) -> int:
    return -(-size // stride)


class Net:
    """The operations a builder may use; ``x`` is whatever the back end passes around."""

    def conv(self, x, c: int, k: int = 1, s: int = 1, groups: int = 1, act: str | None = "relu", bn: bool = True):
        raise NotImplementedError

    def dw(self, x, k: int = 3, s: int = 1, act: str | None = "relu"):
        raise NotImplementedError

    def se(self, x, squeeze: int, gate: str = "hard_sigmoid"):
        """Squeeze-excite: global pool, 1×1 conv to ``squeeze`` (ReLU), 1×1 conv back with ``gate``, scale."""
        raise NotImplementedError

    def act(self, x, kind: str | None):
        raise NotImplementedError

    def add(self, a, b):
        raise NotImplementedError

    def concat(self, xs):
        raise NotImplementedError

    def split(self, x):
        """Two channel halves (ShuffleNetV2's channel split)."""
        raise NotImplementedError

    def shuffle(self, x, groups: int = 2):
        raise NotImplementedError

    def maxpool(self, x, k: int = 3, s: int = 2):
        raise NotImplementedError

    def avgpool(self, x, k: int = 3, s: int = 1):
        """Average pool, ``same`` padding (NASNet's 1×1 stride-2 pool of its adjust path included)."""
        raise NotImplementedError

    def truncate(self, x, c: int):
        """The first ``c`` channels, as NAS-Bench-101 cells truncate: an uneven two-way channel split keeping the
        first part (TFLite ``SPLIT_V``, which XNNPACK leaves to TFLite's own kernels)."""
        raise NotImplementedError

    def head(self, x, classes: int):
        """Global average pool and a dense classifier."""
        raise NotImplementedError

    @staticmethod
    def channels(x) -> int:
        raise NotImplementedError


class CountNet(Net):
    """Runs a builder on shapes, counting multiply-accumulates in :attr:`macs`."""

    def __init__(self) -> None:
        self.macs = 0

    def conv(self, x, c, k=1, s=1, groups=1, act="relu", bn=True):
        h, w, cin = x
        out = (_same(h, s), _same(w, s), c)
        self.macs += out[0] * out[1] * c * k * k * (cin // groups)
        return out

    def dw(self, x, k=3, s=1, act="relu"):
        h, w, c = x
        out = (_same(h, s), _same(w, s), c)
        self.macs += out[0] * out[1] * c * k * k
        return out

    def se(self, x, squeeze, gate="hard_sigmoid"):
        self.macs += 2 * x[2] * squeeze
        return x

    def act(self, x, kind):
        return x

    def add(self, a, b):
        return a

    def concat(self, xs):
        return (xs[0][0], xs[0][1], sum(x[2] for x in xs))

    def split(self, x):
        half = (x[0], x[1], x[2] // 2)
        return half, half

    def shuffle(self, x, groups=2):
        return x

    def maxpool(self, x, k=3, s=2):
        return (_same(x[0], s), _same(x[1], s), x[2])

    def avgpool(self, x, k=3, s=1):
        return (_same(x[0], s), _same(x[1], s), x[2])

    def truncate(self, x, c):
        return (x[0], x[1], min(c, x[2]))

    def head(self, x, classes):
        self.macs += x[2] * classes
        return (1, 1, classes)

    @staticmethod
    def channels(x) -> int:
        return x[2]


class KerasNet(Net):
    """Runs a builder on Keras tensors. Batch norm follows every conv that asks for it (TFLite folds it)."""

    def __init__(self) -> None:
        from keras import layers

        self.L = layers

    def act(self, x, kind):
        return x if kind is None else self.L.Activation(kind)(x)

    def conv(self, x, c, k=1, s=1, groups=1, act="relu", bn=True):
        x = self.L.Conv2D(c, k, strides=s, padding="same", groups=groups, use_bias=not bn)(x)
        if bn:
            x = self.L.BatchNormalization()(x)
        return self.act(x, act)

    def dw(self, x, k=3, s=1, act="relu"):
        x = self.L.DepthwiseConv2D(k, strides=s, padding="same", use_bias=False)(x)
        return self.act(self.L.BatchNormalization()(x), act)

    def se(self, x, squeeze, gate="hard_sigmoid"):
        s = self.L.GlobalAveragePooling2D(keepdims=True)(x)
        s = self.L.Conv2D(squeeze, 1, activation="relu")(s)
        s = self.L.Conv2D(self.channels(x), 1, activation=gate)(s)
        return self.L.Multiply()([x, s])

    def add(self, a, b):
        return self.L.Add()([a, b])

    def concat(self, xs):
        return self.L.Concatenate()(list(xs))

    def split(self, x):
        from keras import ops

        c = self.channels(x) // 2
        a, b = self.L.Lambda(lambda t: ops.split(t, 2, axis=-1), output_shape=lambda s: [(*s[:-1], c)] * 2)(x)
        return a, b

    def shuffle(self, x, groups=2):
        h, w, c = x.shape[1:]
        x = self.L.Reshape((h, w, groups, c // groups))(x)
        x = self.L.Permute((1, 2, 4, 3))(x)
        return self.L.Reshape((h, w, c))(x)

    def maxpool(self, x, k=3, s=2):
        return self.L.MaxPooling2D(k, strides=s, padding="same")(x)

    def avgpool(self, x, k=3, s=1):
        return self.L.AveragePooling2D(k, strides=s, padding="same")(x)

    def truncate(self, x, c):
        from keras import ops

        cin = self.channels(x)
        if c >= cin:
            return x
        return self.L.Lambda(lambda t: ops.split(t, [c], axis=-1)[0], output_shape=lambda s: (*s[:-1], c))(x)

    def head(self, x, classes):
        return self.L.Dense(classes, activation="softmax")(self.L.GlobalAveragePooling2D()(x))

    @staticmethod
    def channels(x) -> int:
        return int(x.shape[-1])


def make_divisible(v: float, divisor: int = 8) -> int:
    """Round a channel count to a multiple of ``divisor`` (at least one), never more than 10 % down."""
    out = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * v else out


# ---- nn-Meter-style variants -------------------------------------------------------------------
def mobilenetv2_like(p: Mapping, net: Net, x):
    """Inverted residuals; ``p["stages"]``: ``[expand, channels, repeats, stride, kernel, se]`` each."""
    act = p["act"]
    x = net.conv(x, p["stem"], 3, 2, act=act)
    for t, c, n, s, k, se in p["stages"]:
        for i in range(n):
            stride = s if i == 0 else 1
            cin = net.channels(x)
            y = net.conv(x, cin * t, 1, act=act) if t != 1 else x
            y = net.dw(y, k, stride, act=act)
            if se:
                y = net.se(y, make_divisible(net.channels(y) / 4))
            y = net.conv(y, c, 1, act=None)
            x = net.add(x, y) if stride == 1 and cin == c else y
    x = net.conv(x, p["last"], 1, act=act)
    return net.head(x, p["classes"])


def mobilenetv1_like(p: Mapping, net: Net, x):
    """Depthwise-separable stacks; ``p["stages"]``: ``[channels, repeats, stride, kernel, se]`` each."""
    act = p["act"]
    x = net.conv(x, p["stem"], 3, 2, act=act)
    for c, n, s, k, se in p["stages"]:
        for i in range(n):
            x = net.dw(x, k, s if i == 0 else 1, act=act)
            if se:
                x = net.se(x, make_divisible(net.channels(x) / 4))
            x = net.conv(x, c, 1, act=act)
    return net.head(x, p["classes"])


def resnet_like(p: Mapping, net: Net, x):
    """Basic or bottleneck residual stages; ``p["stages"]``: ``[width, repeats, stride, kernel, se]`` each."""
    x = net.maxpool(net.conv(x, p["stem"], p["stem_kernel"], 2), 3, 2)
    bottleneck = p["block"] == "bottleneck"
    for c, n, s, k, se in p["stages"]:
        for i in range(n):
            stride = s if i == 0 else 1
            out = c * 4 if bottleneck else c
            if bottleneck:
                y = net.conv(net.conv(x, c, 1), c, k, stride)
                y = net.conv(y, out, 1, act=None)
            else:
                y = net.conv(net.conv(x, c, k, stride), out, k, act=None)
            if se:
                y = net.se(y, make_divisible(out / 16), gate="sigmoid")
            short = x if stride == 1 and net.channels(x) == out else net.conv(x, out, 1, stride, act=None)
            x = net.act(net.add(short, y), "relu")
    return net.head(x, p["classes"])


def shufflenet_like(p: Mapping, net: Net, x):
    """ShuffleNetV2 units (channel split, shuffle); ``p["stages"]``: ``[channels, repeats, kernel, se]``."""
    x = net.maxpool(net.conv(x, p["stem"], 3, 2), 3, 2)
    for c, n, k, se in p["stages"]:
        for i in range(n):
            if i == 0:  # stride 2, both branches
                half = c // 2
                a = net.conv(net.dw(x, k, 2, act=None), half, 1)
                b = net.conv(net.dw(net.conv(x, half, 1), k, 2, act=None), half, 1)
            else:
                a, b = net.split(x)
                half = net.channels(b)
                b = net.conv(net.dw(net.conv(b, half, 1), k, 1, act=None), half, 1)
            if se:
                b = net.se(b, make_divisible(half / 4))
            x = net.shuffle(net.concat([a, b]), 2)
    x = net.conv(x, p["last"], 1)
    return net.head(x, p["classes"])


def _ghost(net: Net, x, c: int, act: str | None):
    """Ghost module: a 1×1 conv makes half the channels, a cheap 3×3 depthwise the other half."""
    primary = net.conv(x, c // 2, 1, act=act)
    return net.concat([primary, net.dw(primary, 3, 1, act=act)])


def ghostnet_like(p: Mapping, net: Net, x):
    """Ghost bottlenecks; ``p["blocks"]``: ``[kernel, expand, channels, se, stride]`` each."""
    x = net.conv(x, p["stem"], 3, 2)
    for k, exp, c, se, s in p["blocks"]:
        cin = net.channels(x)
        y = _ghost(net, x, exp, "relu")
        if s > 1:
            y = net.dw(y, k, s, act=None)
        if se:
            y = net.se(y, make_divisible(exp / 4))
        y = _ghost(net, y, c, None)
        if s == 1 and cin == c:
            short = x
        else:
            short = net.conv(net.dw(x, k, s, act=None), c, 1, act=None)
        x = net.add(short, y)
    x = net.conv(x, p["last"], 1)
    return net.head(x, p["classes"])


def regnet(p: Mapping, net: Net, x):
    """RegNetX (``se`` false) or RegNetY (squeeze-excite, sigmoid gate) with bottleneck ratio 1."""
    x = net.conv(x, 32, 3, 2)
    for depth, width in zip(p["depths"], p["widths"]):
        groups = max(1, width // p["group_width"])
        for i in range(depth):
            stride = 2 if i == 0 else 1
            cin = net.channels(x)
            y = net.conv(net.conv(x, width, 1), width, 3, stride, groups=groups)
            if p["se"]:
                y = net.se(y, max(1, int(cin * 0.25)), gate="sigmoid")
            y = net.conv(y, width, 1, act=None)
            short = x if stride == 1 and cin == width else net.conv(x, width, 1, stride, act=None)
            x = net.act(net.add(short, y), "relu")
    return net.head(x, p["classes"])


#: builder name (the ``builder`` of a ZooEntry's params) -> builder(params, net, x).
BUILDERS: dict[str, Callable] = {
    "mobilenetv2_like": mobilenetv2_like, "mobilenetv1_like": mobilenetv1_like, "resnet_like": resnet_like,
    "shufflenet_like": shufflenet_like, "ghostnet_like": ghostnet_like, "regnet": regnet,
}


def count_macs(builder: str, params: Mapping, res: int) -> int:
    """Multiply-accumulates of a zoo network of ours at ``res``×``res``×3, without building it."""
    net = CountNet()
    BUILDERS[builder](params, net, (res, res, 3))
    return net.macs


def build_keras_net(builder: str, params: Mapping, res: int, name: str):
    """The Keras model of a zoo network of ours (batch 1, random weights)."""
    import keras

    inp = keras.Input((res, res, 3), batch_size=1)
    return keras.Model(inp, BUILDERS[builder](params, KerasNet(), inp), name=name)


def width_of(stage_channels, base_channels) -> float:
    """A variant's overall width: the geometric mean of its per-stage channel multipliers."""
    ratios = [c / b for c, b in zip(stage_channels, base_channels)]
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))
