"""A small stand-in for the ``evaluate`` package: ``evaluate.load("glue", "mrpc")`` (accuracy and F1, computed as
the hub's GLUE metric computes them for MRPC) and ``"accuracy"``. Nothing is downloaded."""

from __future__ import annotations

from typing import Any


class Metric:
    def __init__(self, name: str, config_name: str | None) -> None:
        self.name, self.config_name = name, config_name
        self._predictions: list[Any] = []
        self._references: list[Any] = []

    def add_batch(self, *, predictions: Any = None, references: Any = None) -> None:
        self._predictions.extend(_values(predictions))
        self._references.extend(_values(references))

    def add(self, *, prediction: Any = None, reference: Any = None) -> None:
        self.add_batch(predictions=[prediction], references=[reference])

    def compute(self, *, predictions: Any = None, references: Any = None) -> dict[str, float]:
        if predictions is not None or references is not None:
            self.add_batch(predictions=predictions, references=references)
        preds, refs = self._predictions, self._references
        self._predictions, self._references = [], []
        if len(preds) != len(refs):
            raise ValueError(f"{len(preds)} predictions but {len(refs)} references")
        accuracy = float(sum(int(p == r) for p, r in zip(preds, refs)) / len(refs)) if refs else 0.0
        if (self.name, self.config_name) == ("glue", "mrpc"):
            from sklearn.metrics import f1_score  # what the hub's glue metric uses

            return {"accuracy": accuracy, "f1": float(f1_score(y_true=refs, y_pred=preds))}
        return {"accuracy": accuracy}


def _values(data: Any) -> list[Any]:
    if data is None:
        return []
    if hasattr(data, "tolist"):
        return list(data.tolist())
    return list(data)


def load(path: str, config_name: str | None = None, **_: Any) -> Metric:
    if (path, config_name) not in (("glue", "mrpc"), ("accuracy", None)):
        raise ValueError(f"this offline stand-in of `evaluate` has glue/mrpc and accuracy only, not {path!r} ({config_name!r})")
    return Metric(path, config_name)
