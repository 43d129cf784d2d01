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

filter_trackers = available_trackers

__all__ = [
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
    "on_main_process",
    "register_tracker_class",
]
