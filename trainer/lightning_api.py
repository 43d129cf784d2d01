"""Lightning 2.6's import paths under the rename (``lightning.pytorch.X`` -> ``trainer.X``), and what a name we do not
offer stands for there.

    trainer.strategies          the top-level `strategies` package under Lightning's names
    trainer.plugins             precision objects (`strategies.precision`) with Lightning's constructors
    trainer.utilities           rank_zero_only, rank_zero_info/warn, grad_norm, CombinedLoader, isolate_rng, ...
    trainer.accelerators        none: accelerator="cpu"/"gpu"/"cuda"/"mps"/"tpu" is a string here
    trainer.core                TrainModule, DataModule
    trainer.trainer             Trainer, seed_everything
    trainer.tuner               Tuner (the tuners are trainer.fit.tuner's)
    trainer.callbacks           the `callbacks` package itself, and trainer.loggers `callbacks.trackers`
                                (attributes of `trainer`: ``import trainer as pl; pl.callbacks.ModelCheckpoint``)

These modules are thin: each re-exports what lives elsewhere. They sit on top of every layer (as `trainer.fit`
does) and no module of the project imports them; they are for user scripts (``tests/unit/test_layers.py``).
``tests/fixtures/lightning_api.json`` lists Lightning 2.6's public names per module and the ones not offered here,
each with its reason (``tests/unit/test_lightning_api.py`` checks both ways).

A name Lightning has and we deliberately do not is a placeholder (`not_offered`): importing it works, so a script
that only names it (an ``isinstance`` check, an annotation) runs; using it (calling, subclassing, reading an
attribute) raises with the reason and what to use instead.
"""

from __future__ import annotations

from typing import Any, NoReturn


class NotOffered(type):
    """The type of a placeholder: calling it or subclassing it raises ``NotImplementedError``, reading an attribute
    it lacks ``AttributeError``, each with the message naming the alternative."""

    message: str

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> NotOffered:
        for base in bases:
            if isinstance(base, NotOffered):
                raise NotImplementedError(f"class {name}({base.__name__}): {base.message}")
        return super().__new__(mcs, name, bases, namespace)

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(cls.message)

    def __getattr__(cls, attribute: str) -> NoReturn:
        raise AttributeError(f"{cls.__name__}.{attribute}: {cls.message}")

    def __repr__(cls) -> str:
        return f"<not offered: {cls.__module__}.{cls.__name__}>"


def not_offered(name: str, lightning_module: str, reason: str, *, module: str) -> type:
    """A placeholder for Lightning's `lightning_module`.`name`, which Trainwright does not offer because of `reason`
    (say what to use instead); `module` is the module that holds the placeholder."""
    message = f"{lightning_module}.{name} is not offered by Trainwright: {reason}"
    return NotOffered(name, (), {"__module__": module, "__doc__": message, "__qualname__": name, "message": message})


def is_not_offered(obj: Any) -> bool:
    """True for a placeholder made by `not_offered`."""
    return isinstance(obj, NotOffered)
