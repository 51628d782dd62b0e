"""Reference CNNs built directly in the engine IR (no TensorFlow): MobileNet v1 and v2.

Used by the CUDA benchmark, where TensorFlow is absent. BatchNorm is already folded (every conv has
a bias and a fused activation), weights are seeded He-uniform. Padding is explicit and symmetric
(1 pixel for 3×3, as in torchvision), so the same graph maps exactly onto other frameworks; the
shapes equal Keras' MobileNets at 224×224.
"""

from __future__ import annotations

import numpy as np

from leti.engine.graph import Graph


class _Builder:
    def __init__(self, shape, seed: int):
        self.g = Graph()
        self.rng = np.random.default_rng(seed)
        self.g.add_tensor("input", shape)
        self.g.inputs = ["input"]
        self.shape = {"input": tuple(shape)}
        self.n = 0

    def _name(self, kind: str) -> str:
        self.n += 1
        return f"{kind}_{self.n}"

    def _u(self, shape, fan_in):
        b = float(np.sqrt(6.0 / fan_in))
        return self.rng.uniform(-b, b, shape).astype(np.float32)

    def _out(self, name, shape, op, inputs, **attrs) -> str:
        self.g.add_tensor(name, shape)
        self.g.add_node(op, inputs, [name], name=name, **attrs)
        self.shape[name] = tuple(shape)
        return name

    def conv(self, x, cout, k=1, stride=1, act="relu6") -> str:
        n, h, w, cin = self.shape[x]
        name = self._name("conv")
        wt = self.g.add_constant(f"{name}/w", self._u((k, k, cin, cout), k * k * cin))
        b = self.g.add_constant(f"{name}/b", self.rng.uniform(-0.1, 0.1, cout).astype(np.float32))
        p = (k - 1) // 2
        oh, ow = (h + 2 * p - k) // stride + 1, (w + 2 * p - k) // stride + 1
        return self._out(name, (n, oh, ow, cout), "conv2d", [x, wt, b], strides=[stride] * 2, padding=[p] * 4,
                         activation=act)

    def dw(self, x, stride=1, act="relu6") -> str:
        n, h, w, c = self.shape[x]
        name = self._name("dw")
        wt = self.g.add_constant(f"{name}/w", self._u((3, 3, c), 9))
        b = self.g.add_constant(f"{name}/b", self.rng.uniform(-0.1, 0.1, c).astype(np.float32))
        oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
        return self._out(name, (n, oh, ow, c), "depthwise_conv2d", [x, wt, b], strides=[stride] * 2,
                         padding=[1, 1, 1, 1], activation=act)

    def head(self, x, classes: int) -> Graph:
        n, _, _, c = self.shape[x]
        gap = self._out("gap", (n, c), "mean", [x], axes=[1, 2], keepdims=False)
        wt = self.g.add_constant("fc/w", self._u((c, classes), c))
        b = self.g.add_constant("fc/b", np.zeros(classes, np.float32))
        fc = self._out("fc", (n, classes), "fully_connected", [gap, wt, b])
        out = self._out("softmax", (n, classes), "softmax", [fc])
        self.g.outputs = [out]
        return self.g


def mobilenet_v1(input_size: int = 224, classes: int = 1000, batch: int = 1, seed: int = 0) -> Graph:
    b = _Builder((batch, input_size, input_size, 3), seed)
    x = b.conv("input", 32, k=3, stride=2)
    for cout, stride in [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + \
            [(1024, 2), (1024, 1)]:
        x = b.conv(b.dw(x, stride), cout)
    g = b.head(x, classes)
    g.metadata = {"producer": "leti.engine.models", "model": "mobilenet_v1", "input_size": input_size}
    return g


def mobilenet_v2(input_size: int = 224, classes: int = 1000, batch: int = 1, seed: int = 0) -> Graph:
    b = _Builder((batch, input_size, input_size, 3), seed)
    x = b.conv("input", 32, k=3, stride=2)
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            cin = b.shape[x][3]
            y = b.conv(x, cin * t) if t != 1 else x
            y = b.conv(b.dw(y, stride), c, act="none")
            if stride == 1 and cin == c:
                y = b._out(b._name("add"), b.shape[y], "add", [x, y])
            x = y
    x = b.conv(x, 1280)
    g = b.head(x, classes)
    g.metadata = {"producer": "leti.engine.models", "model": "mobilenet_v2", "input_size": input_size}
    return g


MODELS = {"mobilenet_v1": mobilenet_v1, "mobilenet_v2": mobilenet_v2}
