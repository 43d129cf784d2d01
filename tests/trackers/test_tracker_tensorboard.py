"""TensorBoard: config and steps read back from the event files with TensorBoard's own reader."""

from __future__ import annotations

import pytest
from tracker_scenario import CONFIG, FLAT_CONFIG, STEPS, expected_acc, expected_loss


def test_tensorboard_round_trip(run_scenario, offline_env):
    pytest.importorskip("tensorboard")  # after offline_env: some packages read the environment at import
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    hub = run_scenario("tensorboard", project_name="tb-proj")
    from callbacks.trackers import TrackerHub

    text_hub = TrackerHub("tensorboard", project_dir=offline_env / "out")
    text_hub.init("tb-text")
    text_hub.log({"note": "hello"}, step=3)
    text_hub.finish()

    run_dir = offline_env / "out" / "tb-proj"
    assert hub.trackers[0].log_dir == str(run_dir)
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    loss = events.Scalars("loss")
    # the dict value {"val": {"acc": ...}} as Accelerate writes it (add_scalars): a sub-run folder val_acc, tag val
    assert "val/acc" not in events.Tags()["scalars"] and "val" not in events.Tags()["scalars"]
    sub_run = EventAccumulator(str(run_dir / "val_acc"), size_guidance={"scalars": 0})
    sub_run.Reload()
    assert sub_run.Tags()["scalars"] == ["val"]
    acc = sub_run.Scalars("val")
    assert [event.step for event in loss] == list(STEPS)
    assert [event.step for event in acc] == list(STEPS)
    for event in loss:
        assert event.value == pytest.approx(expected_loss(event.step), rel=1e-6)
    for event in acc:
        assert event.value == pytest.approx(expected_acc(event.step), rel=1e-6)

    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["lr"].number_value == pytest.approx(CONFIG["lr"])
    assert hparams["batch_size"].number_value == 32
    assert hparams["optimizer/name"].string_value == "adamw"
    assert set(hparams) == set(FLAT_CONFIG)
    import yaml

    assert yaml.safe_load((run_dir / "hparams.yml").read_text()) == CONFIG  # as Accelerate writes it, nested

    text_events = EventAccumulator(str(offline_env / "out" / "tb-text"), size_guidance={"tensors": 0})
    text_events.Reload()
    (note,) = text_events.Tensors("note/text_summary")
    assert note.step == 3
    assert note.tensor_proto.string_val[0].decode() == "hello"


def test_a_dict_value_is_laid_out_as_accelerate_writes_it(offline_env):
    """What transformers' no_trainer scripts log (``accelerator.log({"glue": eval_metric, "train_loss": ...})`` with
    ``eval_metric = {"accuracy": ..., "f1": ...}``), through the Accelerator, against the calls Accelerate's
    TensorBoardTracker.log makes on a SummaryWriter of the same run folder: add_scalar for a number, add_scalars for a
    dict. Same sub-run folders, tags, steps and values."""
    pytest.importorskip("tensorboard")
    import torch

    from tests.helpers.tensorboard_events import scalars_by_folder, write_as_accelerate
    from trainer import Accelerator

    logged = [({"glue": {"accuracy": 0.625, "f1": torch.tensor(0.5)}, "train_loss": torch.tensor(1.25), "epoch": 0}, 10),
              ({"glue": {"accuracy": 0.75, "f1": 0.625}, "train_loss": 0.75, "epoch": 1}, 20)]
    accelerator = Accelerator(log_with="tensorboard", project_dir=offline_env / "ours", cpu=True)
    accelerator.init_trackers("glue_no_trainer")
    for values, step in logged:
        accelerator.log(values, step=step)
    accelerator.end_training()

    write_as_accelerate(offline_env / "accelerate" / "glue_no_trainer", logged)  # Accelerate's calls, by hand

    ours = scalars_by_folder(offline_env / "ours" / "glue_no_trainer")
    assert ours == scalars_by_folder(offline_env / "accelerate" / "glue_no_trainer")
    assert set(ours) == {".", "glue_accuracy", "glue_f1"}
    assert ours["glue_accuracy"] == {"glue": [(10, 0.625), (20, 0.75)]}
    assert set(ours["."]) == {"train_loss", "epoch"}


def test_the_trainer_face_keeps_lightnings_flat_tags(offline_env):
    """``self.log_dict({"val/acc": ..., ...})`` in a TrainModule: each entry its own tag in the run folder (Lightning's
    log_dict flattens), no sub-run folders."""
    pytest.importorskip("tensorboard")
    import torch

    from trainer import Trainer, TrainModule

    class Module(TrainModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch).pow(2).mean()
            self.log_dict({"metrics/loss": loss, "metrics/half": loss / 2})
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)
    trainer = Trainer(max_epochs=1, log_with="tensorboard", project_dir=offline_env / "fit", accelerator="cpu", log_every_n_steps=1,
                      enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(Module(), loader)
    from tests.helpers.tensorboard_events import scalars_by_folder

    folders = scalars_by_folder(offline_env / "fit")
    assert len(folders) == 1
    (tags,) = folders.values()
    assert {"metrics/loss", "metrics/half"} <= set(tags)
    assert [step for step, _ in tags["metrics/loss"]] == [0, 1]
