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
    acc = events.Scalars("val/acc")
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
