"""`LightningCLI`: a `Trainer` run driven by YAML configs and the command line, Lightning 2.6's contract on ``jsonargparse``.

``MyCLI(ModelClass, DataModuleClass)`` builds a parser from the constructors' signatures (``--trainer.*``,
``--model.*``, ``--data.*``, ``--optimizer``, ``--lr_scheduler``, ``--seed_everything``), reads ``--config`` files
(several, merged in order), instantiates the classes and runs ``fit|validate|test|predict``::

    python main.py fit --config base.yaml --config exp.yaml --trainer.max_epochs 3
    python main.py fit --config base.yaml --print_config > resolved.yaml

The resolved config is written to ``trainer.log_dir/config.yaml`` when the run starts (`SaveConfigCallback`), and an
existing one is an error unless ``save_config_kwargs={"overwrite": True}``. With ``parser_kwargs={"default_env": True}``
every setting is also read from environment variables (``PL_TRAINER__MAX_EPOCHS``, ``PL_CONFIG``; ``env_prefix`` renames
``PL``). Needs ``jsonargparse[signatures]`` (``pip install 'trainwright[cli]'``); ``trainer.cli.LightningCLI`` imports
this module on first use.
"""

from __future__ import annotations

import importlib
import os
import random
import sys
import warnings
from collections.abc import Callable, Iterable
from functools import partial, update_wrapper
from types import MethodType
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

try:
    from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, class_from_function
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "LightningCLI needs jsonargparse with its signatures extra; install it with "
        "pip install 'jsonargparse[signatures]>=4.49,<5' (or pip install 'trainwright[cli]')"
    ) from err

import callbacks
from callbacks.base import Callback
from trainer import __version__
from trainer.fit.config_errors import config_files_of, where_in_config_files
from trainer.fit.datamodule import DataModule
from trainer.fit.module import TrainModule
from trainer.fit.trainer import Trainer
from trainer.utils import seed_everything

if TYPE_CHECKING:
    from callbacks.view import TrainerView


def _import_builtin_callbacks() -> None:
    """Import every built-in callback, so a config may name one by its class name (``class_path: EarlyStopping``),
    as it may with Lightning, which imports them all with its package."""
    for name in callbacks.__all__:
        getattr(callbacks, name)


_import_builtin_callbacks()


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """``torch.optim.lr_scheduler.ReduceLROnPlateau`` with the metric it follows, `monitor` (the CLI's scheduler)."""

    def __init__(self, optimizer: Optimizer, monitor: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, *args, **kwargs)
        self.monitor = monitor


LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = LRScheduler | ReduceLROnPlateau
LRSchedulerType = type[LRScheduler] | type[ReduceLROnPlateau]
ArgsType = list[str] | dict[str, Any] | Namespace | None
OptimizerCallable = Callable[[Iterable], Optimizer]
LRSchedulerCallable = Callable[[Optimizer], LRScheduler | ReduceLROnPlateau]
_Registered = dict[str, tuple[type | tuple[type, ...], str]]


class LightningArgumentParser(ArgumentParser):
    """jsonargparse's ``ArgumentParser`` that knows the Trainer's classes, optimizers and schedulers.

    Args:
        description: shown by ``--help``.
        env_prefix: the prefix of the environment variables (``PL_TRAINER__MAX_EPOCHS``) read with `default_env`.
        default_env: read every setting from environment variables too.
        **kwargs: passed to ``jsonargparse.ArgumentParser``.
    """

    def __init__(self, *args: Any, description: str = "Trainwright Trainer command line tool", env_prefix: str = "PL",
                 default_env: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, description=description, env_prefix=env_prefix, default_env=default_env, **kwargs)
        self.callback_keys: list[str] = []
        self._optimizers: _Registered = {}
        self._lr_schedulers: _Registered = {}
        self.config_files: list[str] = []  # the --config files of the command line, named in errors

    def error(self, message: str, ex: Exception | None = None) -> Any:
        """jsonargparse's error (usage, message, exit 2), with the config file that holds the bad key or bad YAML."""
        first, newline, rest = message.partition("\n")
        return super().error(first + where_in_config_files(message, self.config_files) + newline + rest, ex)

    def add_lightning_class_args(self, lightning_class: Any, nested_key: str, subclass_mode: bool = False,
                                 required: bool = True) -> list[str]:
        """Add the constructor arguments of `lightning_class` (a `Trainer`, `TrainModule`, `DataModule` or `Callback`
        subclass, or a function returning one) under `nested_key`; with `subclass_mode`, any subclass by ``class_path``.

        Raises:
            TypeError: `lightning_class` is none of those.
        """
        if callable(lightning_class) and not isinstance(lightning_class, type):
            lightning_class = class_from_function(lightning_class)
        if not (isinstance(lightning_class, type) and issubclass(lightning_class, (Trainer, TrainModule, DataModule, Callback))):
            raise TypeError(
                f"add_lightning_class_args({lightning_class!r}, {nested_key!r}): pass a callable or a subclass of "
                "Trainer, TrainModule, DataModule or Callback"
            )
        if issubclass(lightning_class, Callback):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            return list(self.add_subclass_arguments(lightning_class, nested_key, fail_untyped=False, required=required) or [])
        return list(self.add_class_arguments(lightning_class, nested_key, fail_untyped=False,
                                             instantiate=not issubclass(lightning_class, Trainer), sub_configs=True) or [])

    def add_optimizer_args(self, optimizer_class: type[Optimizer] | tuple[type[Optimizer], ...] = (Optimizer,),
                           nested_key: str = "optimizer", link_to: str = "AUTOMATIC") -> None:
        """Add an optimizer's arguments under `nested_key` (a tuple of classes: any subclass by ``class_path``);
        `link_to` names the parser key that receives it, or ``"AUTOMATIC"``: the CLI's `configure_optimizers`."""
        _check_classes(optimizer_class, (Optimizer,), "add_optimizer_args", "a torch.optim.Optimizer subclass")
        kwargs: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": {"params"}}
        if isinstance(optimizer_class, tuple):
            self.add_subclass_arguments(optimizer_class, nested_key, **kwargs)
        else:
            self.add_class_arguments(optimizer_class, nested_key, sub_configs=True, **kwargs)
        self._optimizers[nested_key] = (optimizer_class, link_to)

    def add_lr_scheduler_args(self, lr_scheduler_class: Any = LRSchedulerTypeTuple, nested_key: str = "lr_scheduler",
                              link_to: str = "AUTOMATIC") -> None:
        """Add a learning-rate scheduler's arguments under `nested_key` (see `add_optimizer_args`)."""
        _check_classes(lr_scheduler_class, LRSchedulerTypeTuple, "add_lr_scheduler_args",
                       "a torch.optim.lr_scheduler.LRScheduler subclass or trainer.cli.ReduceLROnPlateau")
        kwargs: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": {"optimizer"}}
        if isinstance(lr_scheduler_class, tuple):
            self.add_subclass_arguments(lr_scheduler_class, nested_key, **kwargs)
        else:
            self.add_class_arguments(lr_scheduler_class, nested_key, sub_configs=True, **kwargs)
        self._lr_schedulers[nested_key] = (lr_scheduler_class, link_to)


def _check_classes(value: Any, bases: tuple[type, ...], method: str, what: str) -> None:
    for cls in value if isinstance(value, tuple) else (value,):
        if not (isinstance(cls, type) and issubclass(cls, bases)):
            raise TypeError(f"{method}({value!r}): {cls!r} is not {what}")


class SaveConfigCallback(Callback):
    """Write the CLI's resolved config to ``trainer.log_dir/<config_filename>`` at the run's ``setup`` (process 0).

    Args:
        parser: the parser that parsed `config`.
        config: the parsed config.
        config_filename: the file name in the log directory.
        overwrite: replace an existing file (otherwise an existing one is an error, so no earlier run's config is lost).
        multifile: keep the structure of several input config files.
        save_to_log_dir: False only in a subclass that overrides `save_config` to save elsewhere.

    Raises:
        RuntimeError: at ``setup``, the file exists and `overwrite` is False.
    """

    def __init__(self, parser: LightningArgumentParser, config: Namespace, config_filename: str = "config.yaml",
                 overwrite: bool = False, multifile: bool = False, save_to_log_dir: bool = True) -> None:
        self.parser, self.config, self.config_filename = parser, config, config_filename
        self.overwrite, self.multifile, self.save_to_log_dir = overwrite, multifile, save_to_log_dir
        self.already_saved = False
        if not save_to_log_dir and type(self).save_config is SaveConfigCallback.save_config:
            raise ValueError(
                "SaveConfigCallback(save_to_log_dir=False) saves nothing: subclass it and override save_config to save "
                "the config elsewhere, or pass LightningCLI(save_config_callback=None) to save none"
            )

    def setup(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        if self.already_saved:
            return
        if self.save_to_log_dir:
            # the first tracker's run starts now (not at on_fit_start), so that trainer.log_dir is its run directory
            # (``logs/<Module>/version_<n>``), where Lightning puts the config too: a new run writes a new directory
            if trainer.logger is not None:
                trainer.logger.start_from_trainer(trainer, module)
            log_dir = trainer.strategy.broadcast_object(trainer.log_dir)
            config_path = os.path.join(log_dir, self.config_filename)
            if not self.overwrite:
                exists = trainer.strategy.broadcast_object(os.path.isfile(config_path) if trainer.is_global_zero else False)
                if exists:
                    raise RuntimeError(
                        f"{type(self).__name__} expected {config_path} to NOT exist. Aborting to avoid overwriting the "
                        "results of a previous run. Delete the previous config file, set "
                        "LightningCLI(save_config_callback=None) to save no config, or set "
                        'LightningCLI(save_config_kwargs={"overwrite": True}) to overwrite it.'
                    )
            if trainer.is_global_zero:
                os.makedirs(log_dir, exist_ok=True)
                self.parser.save(self.config, config_path, skip_unset=False, overwrite=self.overwrite, multifile=self.multifile)
        if trainer.is_global_zero:
            self.save_config(trainer, module, stage)
            self.already_saved = True
        self.already_saved = bool(trainer.strategy.broadcast_object(self.already_saved))

    def save_config(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        """Override to save the config somewhere else too (process 0 only: no collective calls here)."""


class LightningCLI:
    """A command line tool that builds a `Trainer`, a module and a datamodule from configs and runs a subcommand.

    Lightning 2.6's ``LightningCLI`` (see the module docstring); the subcommands call ``Trainer.fit``/``validate``/
    ``test``/``predict`` with the module (and the datamodule), plus the method's own options (``--ckpt_path``, ...).

    Args:
        model_class: a `TrainModule` subclass or a function returning one; None: any, chosen by ``--model`` class path.
        datamodule_class: a `DataModule` subclass or a function returning one; None: any (optional) by ``--data``.
        save_config_callback: the class that saves the resolved config (None: save none).
        save_config_kwargs: its arguments (``{"overwrite": True}``, ``{"config_filename": ...}``).
        trainer_class: the `Trainer` class or a function returning one.
        trainer_defaults: Trainer argument defaults; its ``callbacks`` are always added and not configurable.
        seed_everything_default: the ``--seed_everything`` default: an int, True (a random seed) or False (no seeding).
        parser_kwargs: arguments of every parser, or per subcommand under its name (``{"fit": {"default_env": True}}``).
        parser_class: the parser class.
        subclass_mode_model: the model is any subclass of `model_class`, given by ``class_path``/``init_args``.
        subclass_mode_data: the same for the datamodule.
        args: what to parse instead of ``sys.argv[1:]``: a list of command line arguments, or a dict / Namespace config.
        run: add and run the subcommands; False only parses and instantiates (``cli.trainer``, ``cli.model``).
        auto_configure_optimizers: add ``--optimizer``/``--lr_scheduler`` and use them as the module's optimizers.
        load_from_checkpoint_support: Lightning's switch for saving the parsed config as the module's hyperparameters.
            Here ``save_hyperparameters`` always records what ``__init__`` received (Lightning's False); True is accepted
            as the default, and ``load_from_checkpoint`` needs arguments that are modules passed again.
    """

    def __init__(
        self,
        model_class: type[TrainModule] | Callable[..., TrainModule] | None = None,
        datamodule_class: type[DataModule] | Callable[..., DataModule] | None = None,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
        save_config_kwargs: dict[str, Any] | None = None,
        trainer_class: type[Trainer] | Callable[..., Trainer] = Trainer,
        trainer_defaults: dict[str, Any] | None = None,
        seed_everything_default: bool | int = True,
        parser_kwargs: dict[str, Any] | None = None,
        parser_class: type[LightningArgumentParser] = LightningArgumentParser,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        args: ArgsType = None,
        run: bool = True,
        auto_configure_optimizers: bool = True,
        load_from_checkpoint_support: bool = True,
    ) -> None:
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = dict(save_config_kwargs or {})
        self.trainer_class = trainer_class
        self.trainer_defaults = dict(trainer_defaults or {})
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = dict(parser_kwargs or {})
        self.parser_class = parser_class
        self.auto_configure_optimizers = auto_configure_optimizers
        self.load_from_checkpoint_support = load_from_checkpoint_support
        self.model_class = model_class
        self._model_class = model_class or TrainModule
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.datamodule_class = datamodule_class
        self._datamodule_class = datamodule_class or DataModule
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data
        self.model: TrainModule | None = None
        self.datamodule: DataModule | None = None
        self._subcommand_method_arguments: dict[str, list[str]] = {}
        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}

        main_kwargs = {k: v for k, v in self.parser_kwargs.items() if k not in self.subcommands()}
        subparser_kwargs = {k: v for k, v in self.parser_kwargs.items() if k in self.subcommands()}
        self.setup_parser(run, main_kwargs, subparser_kwargs)
        self.parse_arguments(self.parser, args)
        self.subcommand: str | None = self.config["subcommand"] if run else None
        self._set_seed()
        self.before_instantiate_classes()
        self.instantiate_classes()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # ------------------------------------------------------------------ the parser
    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """The parser with its ``-c/--config`` option."""
        kwargs.setdefault("dump_header", [f"trainwright=={__version__}"])
        parser = self.parser_class(**kwargs)
        parser.add_argument("-c", "--config", action=ActionConfigFile, help="Path to a configuration file in json or yaml format.")
        return parser

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]) -> None:
        """Build `parser`, with the subcommands' parsers when `add_subcommands`."""
        self.parser = self.init_parser(**main_kwargs)
        if add_subcommands:
            self._add_subcommands(self.parser, **subparser_kwargs)
        else:
            self._add_arguments(self.parser)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add ``--seed_everything``."""
        parser.add_argument("--seed_everything", type=bool | int, default=self.seed_everything_default,
                            help="Set to an int to run seed_everything with this value before classes instantiation. "
                                 "Set to True to use a random seed.")

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add the Trainer's, the model's and the datamodule's arguments."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"})
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(self._datamodule_class, "data", subclass_mode=self.subclass_mode_data,
                                        required=self.datamodule_class is not None)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Override to add arguments or ``parser.link_arguments(source, target)``."""

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser._optimizers:
                parser.add_optimizer_args((Optimizer,))
            if not parser._lr_schedulers:
                parser.add_lr_scheduler_args(LRSchedulerTypeTuple)
        self.link_optimizers_and_lr_schedulers(parser)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The subcommands and the arguments of their Trainer methods that the CLI fills (not offered as options)."""
        return {
            "fit": {"model", "module", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "module", "dataloaders", "datamodule"},
            "test": {"model", "module", "dataloaders", "datamodule"},
            "predict": {"model", "module", "dataloaders", "datamodule"},
        }

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        subcommands = parser.add_subcommands()
        trainer_class = self.trainer_class if isinstance(self.trainer_class, type) else class_from_function(self.trainer_class)
        for subcommand, skip in self.subcommands().items():
            doc = (getattr(trainer_class, subcommand).__doc__ or "").strip()
            description = doc.splitlines()[0] if doc else None
            subparser_kwargs = dict(kwargs.get(subcommand, {}))
            subparser_kwargs.setdefault("description", description)
            subparser = self.init_parser(**subparser_kwargs)
            self._add_arguments(subparser)
            # the module is passed by the CLI: whatever its name in an overridden subcommands()
            added = subparser.add_method_arguments(trainer_class, subcommand, skip=set(skip) | {"model", "module"})
            self._subcommand_method_arguments[subcommand] = list(added or [])
            self._subcommand_parsers[subcommand] = subparser
            subcommands.add_subcommand(subcommand, subparser, help=description)

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser: LightningArgumentParser) -> None:
        """Link the optimizers and schedulers added with a ``link_to`` to their targets."""
        for key, (class_type, link_to) in {**parser._optimizers, **parser._lr_schedulers}.items():
            if link_to == "AUTOMATIC":
                continue
            if isinstance(class_type, tuple):
                parser.link_arguments(key, link_to)
            else:
                parser.link_arguments(key, link_to, compute_fn=partial(_add_class_path, class_type))

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse `args` (``sys.argv[1:]`` when None) into `config`."""
        if args is not None and len(sys.argv) > 1:
            warnings.warn(
                "LightningCLI's args parameter is intended to run from within Python like if it were from the command line; "
                f"both args and command line arguments were given: sys.argv[1:]={sys.argv[1:]}, args={args}", stacklevel=3
            )
        files = config_files_of(list(sys.argv[1:] if args is None else args if isinstance(args, list) else []))
        for each in (parser, *self._subcommand_parsers.values()):
            each.config_files = files
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    # ------------------------------------------------------------------ instantiation
    def before_instantiate_classes(self) -> None:
        """Override to run code before the classes are instantiated."""

    def instantiate_classes(self) -> None:
        """Instantiate the datamodule, the model (with the CLI's optimizers) and the Trainer."""
        self.config_init = self.parser.instantiate(self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()

    def after_instantiate_classes(self) -> None:
        """Override to run code after the classes are instantiated."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The Trainer, from its config updated with `kwargs`, with the configured callbacks, the defaults' callbacks
        and the config-saving callback."""
        extra_callbacks = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        return self._instantiate_trainer(config, extra_callbacks)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        given = config.get("callbacks")
        config["callbacks"] = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
        config["callbacks"].extend(callbacks)
        default = self.trainer_defaults.get("callbacks")
        if default is not None:
            config["callbacks"] += list(default) if isinstance(default, (list, tuple)) else [default]
        if self.save_config_callback is not None and not config.get("fast_dev_run", False):
            config["callbacks"].append(self.save_config_callback(
                self._parser(self.subcommand), self.config.get(str(self.subcommand), self.config), **self.save_config_kwargs
            ))
        return self.trainer_class(**config)

    def _parser(self, subcommand: str | None) -> LightningArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    @staticmethod
    def configure_optimizers(lightning_module: TrainModule, optimizer: Optimizer, lr_scheduler: LRSchedulerTypeUnion | None = None) -> Any:
        """What the module's ``configure_optimizers`` returns with the CLI's optimizer (and scheduler); override to change it."""
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor}}
        return [optimizer], [lr_scheduler]

    def _add_configure_optimizers_method_to_model(self, subcommand: str | None) -> None:
        if not self.auto_configure_optimizers or self.model is None:
            return
        parser = self._parser(subcommand)
        optimizers = _automatic(Optimizer, parser._optimizers)
        schedulers = _automatic(LRSchedulerTypeTuple, parser._lr_schedulers)
        if not optimizers:
            return
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise ValueError(
                f"{type(self).__name__} can configure at most one optimizer and one lr_scheduler 'AUTOMATIC'ally, found "
                f"{optimizers + schedulers}; link the argument groups to the model (link_to=...) and implement configure_optimizers"
            )
        optimizer_init = self._init_of(parser._optimizers, optimizers[0])
        if not optimizer_init:
            return  # registered automatically, not given
        scheduler_init = self._init_of(parser._lr_schedulers, schedulers[0]) if schedulers else None
        if type(self.model).configure_optimizers is not TrainModule.configure_optimizers:
            warnings.warn(f"`{type(self.model).__name__}.configure_optimizers` will be overridden by "
                          f"`{type(self).__name__}.configure_optimizers`.", stacklevel=2)
        optimizer = instantiate_class(self.model.parameters(), optimizer_init)
        scheduler = instantiate_class(optimizer, scheduler_init) if scheduler_init else None
        fn = partial(self.configure_optimizers, optimizer=optimizer, lr_scheduler=scheduler)
        update_wrapper(fn, self.configure_optimizers)
        self.model.configure_optimizers = MethodType(fn, self.model)  # type: ignore[method-assign]

    def _init_of(self, registered: _Registered, key: str) -> dict[str, Any] | None:
        class_type = registered[key][0]
        init = self._get(self.config_init, key)
        if not isinstance(class_type, tuple):
            init = _add_class_path(class_type, init)
        return init.as_dict() if isinstance(init, Namespace) else init

    def _get(self, config: Namespace, key: str, default: Any = None) -> Any:
        """`key` of `config`, under the subcommand's section when there is one."""
        return config.get(str(self.subcommand), config).get(key, default)

    # ------------------------------------------------------------------ running
    def _run_subcommand(self, subcommand: str) -> None:
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        fn = getattr(self, subcommand, getattr(self.trainer, subcommand))
        section = self.config_init[subcommand]
        kwargs = {k: v for k, v in section.items() if k in self._subcommand_method_arguments[subcommand]}
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        fn(self.model, **kwargs)
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()

    def _set_seed(self) -> None:
        seed = self._get(self.config, "seed_everything")
        if seed is False:
            return
        if seed is True:  # Lightning's seed_everything() without a seed: the environment's, else a random one
            env = os.environ.get("PL_GLOBAL_SEED")
            seed = int(env) if env else random.randint(0, 2**32 - 1)
        seed = seed_everything(int(seed), workers=True, verbose=False)
        if self.subcommand:
            self.config[self.subcommand]["seed_everything"] = seed
        else:
            self.config["seed_everything"] = seed


def _automatic(base: type | tuple[type, ...], registered: _Registered) -> list[str]:
    keys = []
    for key, (classes, link_to) in registered.items():
        classes = classes if isinstance(classes, tuple) else (classes,)
        if link_to == "AUTOMATIC" and any(issubclass(c, base) for c in classes):
            keys.append(key)
    return keys


def _add_class_path(class_type: type, init_args: Namespace | dict[str, Any] | None = None) -> dict[str, Any]:
    if isinstance(init_args, Namespace):
        init_args = init_args.as_dict()
    return {"class_path": f"{class_type.__module__}.{class_type.__name__}", "init_args": init_args or {}}


def instantiate_class(args: Any, init: dict[str, Any]) -> Any:
    """``class_path(*args, **init_args)`` for ``init = {"class_path": "pkg.mod.Class", "init_args": {...}}``."""
    module_name, _, class_name = init["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(*(args if isinstance(args, tuple) else (args,)), **init.get("init_args", {}))


__all__ = [
    "ArgsType", "LRSchedulerCallable", "LRSchedulerType", "LRSchedulerTypeTuple", "LRSchedulerTypeUnion", "LightningArgumentParser",
    "LightningCLI", "OptimizerCallable", "ReduceLROnPlateau", "SaveConfigCallback", "instantiate_class",
]
