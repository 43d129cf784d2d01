"""A small stand-in for the ``datasets`` package: the part of its API Accelerate's example scripts use.

``load_dataset(path, name)`` reads ``$OFFLINE_HUB_DATA/datasets/<path with / as -->--<name>.json`` (``{split: {column:
[values]}}``), written by `tests.helpers.accelerate_examples.build_offline_hub`; nothing is downloaded. Rows come back
as dicts of plain Python values, as the real package returns them without a format set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any


class Dataset:
    """Columns of equal length; ``ds[i]`` is a row (dict), ``ds["column"]`` a column (list)."""

    def __init__(self, columns: dict[str, list[Any]]) -> None:
        lengths = {len(v) for v in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths: { {k: len(v) for k, v in columns.items()} }")
        self._columns = {k: list(v) for k, v in columns.items()}
        self._len = lengths.pop() if lengths else 0

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    @property
    def num_rows(self) -> int:
        return self._len

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            return list(self._columns[key])
        if key < 0:
            key += self._len
        if not 0 <= key < self._len:
            raise IndexError(f"index {key} out of range for a dataset of {self._len} rows")
        return {name: values[key] for name, values in self._columns.items()}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(self._len))

    def map(self, function: Callable[..., Any], batched: bool = False, batch_size: int | None = 1000,
            remove_columns: Iterable[str] | str | None = None, **_: Any) -> Dataset:
        removed = {remove_columns} if isinstance(remove_columns, str) else set(remove_columns or ())
        missing = removed - set(self._columns)
        if missing:
            raise ValueError(f"remove_columns={sorted(missing)} are not columns of this dataset: {self.column_names}")
        step = self._len if not batched or batch_size is None or batch_size <= 0 else batch_size
        outputs: list[dict[str, list[Any]]] = []
        if batched:
            for start in range(0, self._len, max(step, 1)):
                batch = {k: v[start:start + step] for k, v in self._columns.items()}
                outputs.append({k: list(v) for k, v in dict(function(batch)).items()})
        else:
            outputs = [{k: [v] for k, v in dict(function(row)).items()} for row in self]
        new: dict[str, list[Any]] = {}
        for out in outputs:
            for k, v in out.items():
                new.setdefault(k, []).extend(v)
        columns = {k: v for k, v in self._columns.items() if k not in removed and k not in new}
        return Dataset({**columns, **new})

    def rename_column(self, original_column_name: str, new_column_name: str) -> Dataset:
        if original_column_name not in self._columns:
            raise ValueError(f"column {original_column_name!r} is not in the dataset: {self.column_names}")
        return Dataset({(new_column_name if k == original_column_name else k): v for k, v in self._columns.items()})

    def select(self, indices: Iterable[int]) -> Dataset:
        picked = [int(i) for i in indices]
        return Dataset({k: [v[i] for i in picked] for k, v in self._columns.items()})


class DatasetDict(dict):
    """Splits by name; `map` / `rename_column` apply to each."""

    def map(self, function: Callable[..., Any], **kwargs: Any) -> DatasetDict:
        return DatasetDict({split: ds.map(function, **kwargs) for split, ds in self.items()})

    def rename_column(self, original_column_name: str, new_column_name: str) -> DatasetDict:
        return DatasetDict({split: ds.rename_column(original_column_name, new_column_name) for split, ds in self.items()})


def load_dataset(path: str, name: str | None = None, **_: Any) -> DatasetDict:
    root = os.environ.get("OFFLINE_HUB_DATA")
    if not root:
        raise RuntimeError("this offline stand-in of `datasets` reads $OFFLINE_HUB_DATA; set it to a folder built by "
                           "tests.helpers.accelerate_examples.build_offline_hub")
    file = Path(root) / "datasets" / f"{path.replace('/', '--')}--{name}.json"
    if not file.is_file():
        raise FileNotFoundError(f"no offline copy of dataset {path!r} ({name!r}): {file} does not exist")
    splits = json.loads(file.read_text())
    return DatasetDict({split: Dataset(columns) for split, columns in splits.items()})
