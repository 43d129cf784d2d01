"""Experiment trackers: one API for the ``Accelerator`` (``log_with=``) and the ``Trainer`` (callbacks).

Importing this package imports no tracker library; each integration imports its package in
``start()``.
"""

from callbacks.trackers.aim import AimTracker
from callbacks.trackers.base import GeneralTracker, NoOpTracker, on_main_process
from callbacks.trackers.clearml import ClearMLTracker
from callbacks.trackers.comet import CometMLTracker
from callbacks.trackers.csv_tracker import CSVTracker
from callbacks.trackers.dvclive import DVCLiveTracker
from callbacks.trackers.lightning_loggers import CometLogger, CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger
from callbacks.trackers.mlflow import MLflowTracker
from callbacks.trackers.registry import (
    LoggerType,
    TrackerHub,
    available_trackers,
    register_built_in,
    register_tracker_class,
    resolve_trackers,
    tracker_names,
)
from callbacks.trackers.swanlab import SwanLabTracker
from callbacks.trackers.tensorboard import TensorBoardTracker
from callbacks.trackers.trackio import TrackioTracker
from callbacks.trackers.wandb import WandBTracker

register_built_in(CSVTracker, TensorBoardTracker, WandBTracker, CometMLTracker, AimTracker, MLflowTracker, ClearMLTracker,
                  DVCLiveTracker, TrackioTracker, SwanLabTracker)

__all__ = [
    "AimTracker",
    "CSVLogger",
    "CSVTracker",
    "ClearMLTracker",
    "CometLogger",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "LoggerType",
    "MLFlowLogger",
    "MLflowTracker",
    "NoOpTracker",
    "SwanLabTracker",
    "TensorBoardLogger",
    "TensorBoardTracker",
    "TrackerHub",
    "TrackioTracker",
    "WandBTracker",
    "WandbLogger",
    "available_trackers",
    "on_main_process",
    "register_tracker_class",
    "resolve_trackers",
    "tracker_names",
]
