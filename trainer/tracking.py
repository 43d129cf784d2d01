"""Accelerate's ``accelerate.tracking`` under the renamed import: ``from trainer.tracking import GeneralTracker, ...``.

The trackers live in `callbacks.trackers` (they are callbacks of the `Trainer` too); this module gives the
names Accelerate's tracker guide and API reference use.
"""

from callbacks.trackers import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    CSVTracker,
    DVCLiveTracker,
    GeneralTracker,
    LoggerType,
    MLflowTracker,
    SwanLabTracker,
    TensorBoardTracker,
    TrackioTracker,
    WandBTracker,
    available_trackers,
    on_main_process,
    register_tracker_class,
)
from trainer.unsupported import unsupported_names

filter_trackers = available_trackers
get_available_trackers = available_trackers

# Accelerate's LoggerType -> tracker class (the trackers here are the same classes)
LOGGER_TYPE_TO_CLASS = {
    "aim": AimTracker, "comet_ml": CometMLTracker, "mlflow": MLflowTracker, "tensorboard": TensorBoardTracker, "wandb": WandBTracker,
    "clearml": ClearMLTracker, "dvclive": DVCLiveTracker, "swanlab": SwanLabTracker, "trackio": TrackioTracker,
}

__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "AimTracker",
    "CSVTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "LoggerType",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackioTracker",
    "WandBTracker",
    "available_trackers",
    "filter_trackers",
    "get_available_trackers",
    "on_main_process",
    "register_tracker_class",
]

# Accelerate names deliberately not provided (its module logger): see trainer.unsupported
__getattr__ = unsupported_names(__name__)
