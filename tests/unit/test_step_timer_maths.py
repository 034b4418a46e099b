"""The step timer's report maths and texts on hand-made rank summaries: exact words, exact numbers."""

from __future__ import annotations

import pytest

from hf_distprof.timing.report import RankSummary, format_bytes, memory_warning

ADVICE = (
    ". Look for work only that rank does (logging, evaluation, checkpoint saving on rank 0), uneven batch shapes "
    "(variable-length padding: pad to a fixed length or use --group_by_length), or tensors kept alive on one rank; "
    "sharding optimizer state and gradients (FSDP) also evens it out."
)


def rank(r: int, peak: int | None) -> RankSummary:
    return RankSummary(rank=r, host="h", steps=4, total_s=1.0, samples=8, tokens=64, samples_per_s=8.0,
                       tokens_per_s=64.0, peak_memory_bytes=peak)


def test_memory_warning_names_the_highest_and_lowest_rank_whatever_their_order():
    ranks = [rank(0, 3 * 2**30), rank(1, 2**30), rank(2, 5 * 2**30), rank(3, 2 * 2**30)]
    assert memory_warning(ranks, 150.0, 20.0) == (
        "Peak memory imbalance 150.0% > 20%: rank 2 peaks at 5.0 GiB vs 1.0 GiB on rank 1" + ADVICE
    )


def test_memory_warning_counts_an_unknown_peak_as_zero():
    assert memory_warning([rank(0, 1), rank(1, None)], 12.5, 10.0) == (
        "Peak memory imbalance 12.5% > 10%: rank 0 peaks at 1 B vs n/a on rank 1" + ADVICE
    )
    assert memory_warning([rank(0, None), rank(1, 1)], 7.0, 5.5) == (
        "Peak memory imbalance 7.0% > 5.5%: rank 1 peaks at 1 B vs n/a on rank 0" + ADVICE
    )


@pytest.mark.parametrize(
    ("n", "text"),
    [(None, "n/a"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 * 2**20, "5.0 MiB"), (3 * 2**40, "3072.0 GiB"),
     (-2048, "-2.0 KiB")],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text
