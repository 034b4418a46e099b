"""``tensorboard.add_scalars``: many values in one event, read back by TensorBoard as one series per tag."""

from __future__ import annotations

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from hf_distprof import tensorboard


def events_and_scalars(log_dir):
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return acc, scalars


def test_one_event_per_call_and_one_series_per_tag(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    tensorboard.add_scalars(writer, {"memory/rss_mb/rank0": 512.5, "memory/rss_mb/rank1": 640.25, "x/max": 3}, 10)
    tensorboard.add_scalars(
        writer, {"memory/rss_mb/rank0": 513.0, "memory/rss_mb/rank1": 641.0, "x/max": 4}, 20, walltime=1e9
    )
    tensorboard.add_scalars(writer, {}, 30)  # nothing to write: no event
    writer.close()
    _, scalars = events_and_scalars(tmp_path)
    assert scalars == {
        "memory/rss_mb/rank0": [(10, 512.5), (20, 513.0)],
        "memory/rss_mb/rank1": [(10, 640.25), (20, 641.0)],
        "x/max": [(10, 3.0), (20, 4.0)],
    }
    # Two summary events (plus the file-version event), not six.
    files = list(tmp_path.iterdir())
    assert len(files) == 1
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    events = list(EventFileLoader(str(files[0])).Load())
    summaries = [e for e in events if e.HasField("summary")]
    assert [(e.step, len(e.summary.value)) for e in summaries] == [(10, 3), (20, 3)]
    assert summaries[0].wall_time > 1.7e9 and summaries[1].wall_time == 1e9  # now, or the one given


def test_values_are_32_bit_as_add_scalar_writes_them(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    value = 1 / 3
    w = SummaryWriter(str(ours))
    tensorboard.add_scalars(w, {"a": value}, 1)
    w.close()
    w = SummaryWriter(str(theirs))
    w.add_scalar("a", value, 1)
    w.close()
    assert events_and_scalars(ours)[1] == events_and_scalars(theirs)[1]


def test_a_writer_without_a_file_writer_gets_one_add_scalar_per_value():
    class Recorder:
        def __init__(self):
            self.calls = []

        def add_scalar(self, tag, value, step, walltime=None):
            self.calls.append((tag, value, step, walltime))

    rec = Recorder()
    tensorboard.add_scalars(rec, {"b": 2.0, "a": 1.0}, 7, walltime=123.5)
    assert rec.calls == [("b", 2.0, 7, 123.5), ("a", 1.0, 7, 123.5)]
