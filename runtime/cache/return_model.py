"""An online logistic model of whether a radix node comes back, and the figures that show it working:
calibration by decile and the return rates of what eviction kept against what it evicted.

Used by the ``predict`` eviction policy (``runtime/cache/predict.py``).  Pure Python on a feature
vector of a few dozen floats: cheap enough to score every evictable leaf at every eviction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

LEARNING_RATE = 0.2  # AdaGrad's step; the per-weight scaling makes the choice forgiving
DECILES = 10


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z > -30 else 0.0


class ReturnModel:
    """Logistic regression learned online by AdaGrad: ``p = sigmoid(w . x)``, ``x`` sparse: (index, value) pairs."""

    def __init__(self, n_features: int, learning_rate: float = LEARNING_RATE) -> None:
        self.w = [0.0] * n_features
        self.g2 = [1e-6] * n_features  # AdaGrad's sum of squared gradients
        self.lr = learning_rate
        self.examples = 0

    def log_odds(self, x: Sequence[tuple[int, float]]) -> float:
        """``w . x``: what eviction orders by (``predict.py`` bins it)."""
        w = self.w
        return sum(w[i] * v for i, v in x)

    def predict(self, x: Sequence[tuple[int, float]]) -> float:
        return sigmoid(self.log_odds(x))

    def learn(self, x: Sequence[tuple[int, float]], y: bool) -> float:
        """One gradient step on the log loss; returns the prediction before the step."""
        p = self.predict(x)
        err = p - (1.0 if y else 0.0)
        for i, v in x:
            g = err * v
            self.g2[i] += g * g
            self.w[i] -= self.lr * g / math.sqrt(self.g2[i])
        self.examples += 1
        return p


class Outcomes:
    """Labelled predictions: calibration by decile of the predicted probability, and the observed
    return rates of the nodes eviction kept against those it evicted (an operator's check that the
    predictor separates them on their own traffic)."""

    def __init__(self) -> None:
        self.bins = [[0, 0.0, 0] for _ in range(DECILES)]  # examples, sum of predictions, returns
        self.kept = [0, 0]  # examples, returns
        self.evicted = [0, 0]

    def add(self, p: float, y: bool, evicted: bool) -> None:
        b = self.bins[min(int(p * DECILES), DECILES - 1)]
        b[0] += 1
        b[1] += p
        b[2] += y
        side = self.evicted if evicted else self.kept
        side[0] += 1
        side[1] += y

    def summary(self) -> dict:
        rate = lambda n, k: round(k / n, 4) if n else None  # noqa: E731
        return {
            "labelled": self.kept[0] + self.evicted[0],
            "kept": {"labelled": self.kept[0], "return_rate": rate(*self.kept)},
            "evicted": {"labelled": self.evicted[0], "return_rate": rate(*self.evicted)},
            "calibration": [
                {"decile": i, "n": n, "predicted": rate(n, s), "observed": rate(n, k)}
                for i, (n, s, k) in enumerate(self.bins)
            ],
        }
