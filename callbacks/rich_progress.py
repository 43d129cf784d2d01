"""`RichProgressBar`: the progress bars of `ProgressBar`, drawn with ``rich`` (Lightning 2.6's ``RichProgressBar``).

Needs the ``rich`` package (``pip install rich``); without it the first bar raises an ImportError that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from callbacks.progress import ProgressBar

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule


@dataclass
class RichProgressBarTheme:
    """The styles of the bars (rich style strings), Lightning's fields."""

    description: str = ""
    progress_bar: str = "#6206E0"
    progress_bar_finished: str = "#6206E0"
    progress_bar_pulse: str = "#6206E0"
    batch_progress: str = ""
    time: str = "dim"
    processing_speed: str = "dim underline"
    metrics: str = "italic"
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"


def _import_rich() -> Any:
    try:
        import rich.progress
    except ImportError as err:
        raise ImportError(
            "RichProgressBar requires the rich package, which is not installed. Install it with `pip install rich`, "
            "or use TQDMProgressBar / enable_progress_bar=False"
        ) from err
    return rich.progress


class RichProgressBar(ProgressBar):
    """Training, validation, test and predict bars drawn by ``rich``, on the global main process.

    Args:
        refresh_rate: redraw every this many batches (and at each bar's last batch); ``0`` disables the bars.
        leave: keep the finished training bar of each epoch on screen.
        theme: the bars' styles.
        console_kwargs: arguments of the ``rich.console.Console`` the bars draw on.

    Raises:
        ImportError: ``rich`` is not installed (at construction, naming ``pip install rich``).
    """

    def __init__(self, refresh_rate: int = 100, leave: bool = False, theme: RichProgressBarTheme | None = None,
                 console_kwargs: dict[str, Any] | None = None) -> None:
        _import_rich()
        super().__init__(refresh_rate=refresh_rate, leave=leave, min_interval=0.0)
        self.theme = theme if theme is not None else RichProgressBarTheme()
        self._console_kwargs = dict(console_kwargs or {})
        self.progress: Any = None  # the rich.progress.Progress the bars live in, while one is shown

    def _new_bar(self, desc: str, total: int | None, leave: bool) -> Any:
        rich_progress = _import_rich()
        if self.progress is None:
            from rich.console import Console

            theme = self.theme
            self.progress = rich_progress.Progress(
                rich_progress.TextColumn("[progress.description]{task.description}", style=theme.description),
                rich_progress.BarColumn(complete_style=theme.progress_bar, finished_style=theme.progress_bar_finished,
                                        pulse_style=theme.progress_bar_pulse),
                rich_progress.MofNCompleteColumn(),
                rich_progress.TimeElapsedColumn(),
                rich_progress.TextColumn("{task.fields[metrics]}", style=theme.metrics),
                console=Console(**self._console_kwargs), refresh_per_second=10, auto_refresh=False,
            )
            self.progress.start()
        return _RichBar(self, desc, total, leave)

    def _stop_if_idle(self) -> None:
        if self.progress is not None and self.train_bar is None and self.eval_bar is None:
            self.progress.stop()
            self.progress = None

    def teardown(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        super().teardown(trainer, module, stage)
        self._stop_if_idle()

    def on_exception(self, trainer: TrainerView, module: TrainModule, exception: BaseException) -> None:
        super().on_exception(trainer, module, exception)
        self._stop_if_idle()


class _RichBar:
    """One task of the callback's ``rich`` Progress, with the part of tqdm's interface `ProgressBar` uses."""

    def __init__(self, owner: RichProgressBar, desc: str, total: int | None, leave: bool) -> None:
        self.owner, self.total, self.n, self.leave = owner, total, 0, leave
        self.task = owner.progress.add_task(desc, total=total, metrics="")

    def update(self, n: int = 1) -> None:
        self.n += n
        self.owner.progress.update(self.task, completed=self.n)

    def set_postfix(self, values: dict[str, float], refresh: bool = True) -> None:
        theme = self.owner.theme
        text = theme.metrics_text_delimiter.join(f"{k}: {v:{theme.metrics_format}}" for k, v in values.items())
        self.owner.progress.update(self.task, metrics=text)
        if refresh:
            self.refresh()

    def refresh(self) -> None:
        self.owner.progress.refresh()

    def close(self) -> None:
        progress = self.owner.progress
        if progress is None:
            return
        progress.refresh()
        if not self.leave:
            progress.remove_task(self.task)


__all__ = ["RichProgressBar", "RichProgressBarTheme"]
