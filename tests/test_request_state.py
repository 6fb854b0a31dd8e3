"""The run-of-iterations records: appended as tuples, packed into float blocks as they fill,
truncated wherever they sit, read back as the columns every record would give."""

from __future__ import annotations

import numpy as np

from sim.engine.request_state import _BLOCK, SEG_COLUMNS, Results


def test_records_read_back_the_same_packed_or_not_and_truncate_in_a_block():
    res = Results(0)
    rows = [tuple(float(i * 100 + j) if j != 2 else i % 7 + 2 for j in range(len(SEG_COLUMNS)))
            for i in range(2 * _BLOCK + 5)]
    for i, row in enumerate(rows):
        assert res.add_segment(row) == i
    # one record in the first packed block, one still a tuple
    res.truncate_segment(3, 1)
    res.truncate_segment(2 * _BLOCK + 1, 1)
    expected = np.array(rows, dtype=float)
    expected[[3, 2 * _BLOCK + 1], 2] = 1
    got = np.column_stack([res.seg[c] for c in SEG_COLUMNS])
    assert np.array_equal(got, expected)
    res.add_segment(rows[0])  # a record added after reading: the columns are rebuilt
    assert len(res.seg["k_iters"]) == len(rows) + 1
