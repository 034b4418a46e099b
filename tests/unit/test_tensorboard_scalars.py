"""``tensorboard.add_scalars``: many values in one event, read back by TensorBoard as one series per tag."""

from __future__ import annotations

import pytest
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


def _loaded(log_dir):
    """Every event of the one file in ``log_dir``, read by TensorBoard's own loader (which checks each record's
    CRCs)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    (path,) = list(log_dir.iterdir())
    return path, [Event.FromString(raw) for raw in RawEventFileLoader(str(path)).Load()]


def test_the_event_writer_writes_what_summary_writer_writes(tmp_path):
    """Scalars (one event per call, 32-bit values, an overflow an infinity), text and the custom-scalars layout read
    back the same from both writers; the scalar events are the very bytes protobuf gives."""
    from tensorboard.compat.proto.event_pb2 import Event

    values = {"memory/rss_mb/rank0": 512.5, "a/b": 1 / 3, "x": 3, "big": 1e39, "neg": -2.5, "tag/é": 2}
    read = {}
    for kind in ("ours", "theirs"):
        folder = tmp_path / kind
        writer = tensorboard.EventWriter(folder) if kind == "ours" else SummaryWriter(str(folder))
        tensorboard.add_scalars(writer, values, 10, walltime=1e9)
        tensorboard.add_scalars(writer, {"x": 4}, 0, walltime=2e9)
        writer.add_text("hf_distprof/warnings", "rank 1 is **slow**", 7)
        writer.add_custom_scalars({"timing": {"step": ["Multiline", ["timing/step_s/rank0"]]}})
        writer.close()
        acc, scalars = events_and_scalars(folder)
        text = [(e.step, e.tensor_proto.string_val) for e in acc.Tensors("hf_distprof/warnings/text_summary")]
        read[kind] = (scalars, text, sorted(acc.Tags()["tensors"]))
    assert read["ours"] == read["theirs"]
    assert read["ours"][0]["big"] == [(10, float("inf"))] and read["ours"][0]["x"] == [(10, 3.0), (0, 4.0)]
    path, events = _loaded(tmp_path / "ours")
    assert path.name.startswith("events.out.tfevents.") and path.name.endswith(".hf_distprof")
    assert events[0].file_version == "brain.Event:2" and len(events) == 5
    # The hand-made scalar events against protobuf's encoding of the same event (step 0 is left out, as proto3 does).
    from tensorboard.compat.proto.summary_pb2 import Summary

    for step in (0, 1, 300, 2**40):
        ref = Event(wall_time=123.25, step=step, summary=Summary(
            value=[Summary.Value(tag="a", simple_value=1.5), Summary.Value(tag="tag/é", simple_value=2.0)]))
        folder = tmp_path / f"step{step}"
        writer = tensorboard.EventWriter(folder)
        writer.add_scalars({"a": 1.5, "tag/é": 2}, step, walltime=123.25)
        writer.close()
        assert _loaded(folder)[1][1].SerializeToString() == ref.SerializeToString()


def test_the_event_writer_checksums_without_google_crc32c(tmp_path, monkeypatch):
    """Without google-crc32c's C code, tensorboard's own CRC-32C: the same file, slower."""
    import sys

    monkeypatch.setitem(sys.modules, "google_crc32c", None)  # import fails
    writer = tensorboard.EventWriter(tmp_path)
    writer.add_scalars({"a": 1.0}, 3, walltime=1.0)
    writer.close()
    assert events_and_scalars(tmp_path)[1] == {"a": [(3, 1.0)]}
    assert len(_loaded(tmp_path)[1]) == 2


def test_a_failed_write_is_one_warning_and_the_writer_stops(tmp_path, monkeypatch, caplog):
    import logging

    writer = tensorboard.EventWriter(tmp_path)
    real_write = tensorboard.os.write

    def full_disk(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tensorboard.os, "write", full_disk)
    with caplog.at_level(logging.WARNING):
        writer.add_scalars({"a": 1.0}, 1)
        writer.add_scalars({"a": 2.0}, 2)
        writer.add_text("t", "x", 3)
    monkeypatch.setattr(tensorboard.os, "write", real_write)
    writer.add_scalars({"a": 3.0}, 4)  # after the failure nothing more is written
    writer.close()
    writer.close()  # twice: nothing to close
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "cannot write TensorBoard events to" in messages[0] and "No space left" in messages[0]
    assert events_and_scalars(tmp_path)[1] == {}


def test_several_events_go_in_one_write_and_read_back_as_separate_ones(tmp_path, monkeypatch):
    """The memory logger's samples since its last gather: one event each (its own step and time), one write in all;
    a SummaryWriter gets them one by one; an event without values is none."""
    events = [({"memory/rss_mb/rank0": 100.0 + s}, s, 1e9 + s) for s in (1, 2, 3)] + [({}, 4, None)]
    writer = tensorboard.EventWriter(tmp_path / "ours")
    writes = []
    real_write = tensorboard.os.write
    monkeypatch.setattr(tensorboard.os, "write", lambda fd, data: writes.append(len(data)) or real_write(fd, data))
    tensorboard.add_scalar_events(writer, events)
    writer.close()
    assert len(writes) == 1
    theirs = SummaryWriter(str(tmp_path / "theirs"))
    tensorboard.add_scalar_events(theirs, events)
    theirs.close()
    expected = {"memory/rss_mb/rank0": [(1, 101.0), (2, 102.0), (3, 103.0)]}
    assert events_and_scalars(tmp_path / "ours")[1] == events_and_scalars(tmp_path / "theirs")[1] == expected
    assert [e.wall_time for e in _loaded(tmp_path / "ours")[1][1:]] == [1e9 + 1, 1e9 + 2, 1e9 + 3]


def test_a_short_write_is_finished_and_a_write_of_nothing_is_a_failure(tmp_path, monkeypatch, caplog):
    import logging

    writer = tensorboard.EventWriter(tmp_path)
    real_write = tensorboard.os.write
    monkeypatch.setattr(tensorboard.os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))  # 7 bytes a call
    writer.add_scalars({"a": 1.0}, 1)
    assert events_and_scalars(tmp_path)[1] == {"a": [(1, 1.0)]}
    monkeypatch.setattr(tensorboard.os, "write", lambda fd, data: 0)
    with caplog.at_level(logging.WARNING):
        writer.add_scalars({"a": 2.0}, 2)  # a write that writes nothing: without the check, a loop forever
    assert ["wrote 0 of" in r.getMessage() for r in caplog.records] == [True]
    writer.close()


def test_an_event_that_cannot_be_encoded_raises_after_the_ones_before_it_are_written(tmp_path):
    writer = tensorboard.EventWriter(tmp_path)
    with pytest.raises(TypeError):
        writer.add_scalar_events([({"a": 1.0}, 1, 1.0), ({"a": None}, 2, None), ({"a": 3.0}, 3, None)])
    with pytest.raises(ValueError):  # as protobuf refuses a step beyond 64 bits
        writer.add_scalars({"a": 4.0}, 2**63)
    writer.close()
    assert events_and_scalars(tmp_path)[1] == {"a": [(1, 1.0)]}
