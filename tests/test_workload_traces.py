"""Trace replay workloads: every format, bad rows and files named, Mooncake prefix sharing."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import numpy as np
import pytest

from sim.workloads.requests import workload_from_config, workload_to_vidur_csv
from sim.workloads.traces import mooncake_prefixes

SYNTHETIC = {"arrival": {"kind": "poisson", "rate_per_s": 4.0}, "num_requests": 50,
             "prompt_tokens": {"kind": "uniform", "low": 1, "high": 900}, "output_tokens": 128}

# ---------------------------------------------------------------- trace formats


def _write(path, text: str):
    path.write_text(text)
    return path


def test_azure_trace(tmp_path):
    _write(tmp_path / "azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
           "2023-11-16 18:15:46.6805900,374,44\n"
           "2023-11-16 18:15:50.9951690,396,109\n"
           "2023-11-16 18:16:46.6805900,879,20\n")
    w = workload_from_config({"trace": {"format": "azure", "path": "azure.csv"}}, seed=0,
                             base_dir=tmp_path)
    assert w.arrival_s == pytest.approx([0.0, 4.314579, 60.0], abs=1e-6)
    assert w.prompt_tokens.tolist() == [374, 396, 879] and w.output_tokens.tolist() == [44, 109, 20]
    half = workload_from_config({"trace": {"format": "azure", "path": str(tmp_path / "azure.csv"),
                                           "time_scale": 0.5, "limit": 2}}, seed=0)
    assert half.arrival_s == pytest.approx([0.0, 4.314579 / 2], abs=1e-6)


def test_azure_bad_timestamp_names_row(tmp_path):
    _write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
           "2023-11-16 18:15:46.6805900,374,44\nyesterday,1,1\n")
    with pytest.raises(ValueError, match=r"a.csv: row 2 .*'TIMESTAMP' value 'yesterday'"):
        workload_from_config({"trace": {"format": "azure", "path": "a.csv"}}, 0, tmp_path)


def test_azure_mixed_timezones_name_the_row(tmp_path):
    _write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
           "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.1+01:00,1,1\n")
    with pytest.raises(ValueError, match=r"a.csv: row 2 .*has a timezone and row 1 none"):
        workload_from_config({"trace": {"format": "azure", "path": "a.csv"}}, 0, tmp_path)
    _write(tmp_path / "z.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
           "2023-11-16 18:15:46Z,374,44\n2023-11-16 18:15:48Z,1,1\n")
    wl = workload_from_config({"trace": {"format": "azure", "path": "z.csv"}}, 0, tmp_path)
    assert wl.arrival_s == pytest.approx([0.0, 2.0])
    # Offsets in either spelling name instants: 19:15:49+01:00 is 18:15:49Z, 3 s after row 1.
    _write(tmp_path / "o.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
           "2023-11-16 18:15:46Z,374,44\n2023-11-16 19:15:49+01:00,1,1\n"
           "2023-11-16 20:15:50+0200,1,1\n")
    wl = workload_from_config({"trace": {"format": "azure", "path": "o.csv"}}, 0, tmp_path)
    assert wl.arrival_s == pytest.approx([0.0, 3.0, 4.0])


def test_vidur_trace_roundtrip_and_unsorted_rows(tmp_path):
    src = workload_from_config(SYNTHETIC, seed=4)
    path = workload_to_vidur_csv(src, tmp_path / "out" / "v.csv")
    assert path.read_text().splitlines()[0] == "arrived_at,num_prefill_tokens,num_decode_tokens"
    back = workload_from_config({"trace": {"format": "vidur", "path": str(path)}}, seed=0)
    assert np.array_equal(back.arrival_s, src.arrival_s - src.arrival_s[0])
    assert np.array_equal(back.prompt_tokens, src.prompt_tokens)
    assert np.array_equal(back.output_tokens, src.output_tokens)
    # Rows out of time order are sorted, not dropped; `limit` keeps the earliest.
    _write(tmp_path / "u.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
           "5.0,10,1\n2.0,20,2\n3.5,30,3\n")
    w = workload_from_config({"trace": {"format": "vidur", "path": "u.csv", "limit": 2}}, 0,
                             tmp_path)
    assert w.arrival_s.tolist() == [0.0, 1.5] and w.prompt_tokens.tolist() == [20, 30]


@pytest.mark.parametrize("row, match", [
    ("1.0,abc,3", r"row 2 \(after the header\): column 'num_prefill_tokens' value 'abc' is not"),
    ("1.0,5,-3", r"row 2 .*'num_decode_tokens' value '-3' is negative"),
    ("-1.0,5,3", r"row 2 .*'arrived_at' value '-1.0' is negative"),
    ("1.0,5.5,3", r"row 2 .*'num_prefill_tokens' value '5.5' is not a whole number"),
    ("1.0,5", r"row 2 .*'num_decode_tokens' value '' is not a number"),
    ("1.0,0,3", r"row 2 .*num_prefill_tokens is 0, must be >= 1"),
])
def test_bad_row_names_file_and_row(tmp_path, row, match):
    _write(tmp_path / "bad.csv", f"arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n{row}\n")
    with pytest.raises(ValueError, match="bad.csv: " + match):
        workload_from_config({"trace": {"format": "vidur", "path": "bad.csv"}}, 0, tmp_path)


@pytest.mark.parametrize("fmt, header, missing", [
    ("vidur", "arrived_at,num_prefill_tokens", "num_decode_tokens"),
    ("azure", "TIMESTAMP,ContextTokens", "GeneratedTokens"),
    ("burstgpt", "Timestamp,Model,Request tokens,Total tokens,Log Type", "Response tokens"),
])
def test_missing_column_names_file_and_column(tmp_path, fmt, header, missing):
    _write(tmp_path / "t.csv", header + "\n" + ",".join("1" * len(header.split(","))) + "\n")
    with pytest.raises(ValueError, match=f"t.csv: missing column '{missing}'"):
        workload_from_config({"trace": {"format": fmt, "path": "t.csv"}}, 0, tmp_path)


BURST = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
         "5,ChatGPT,472,18,490,Conversation log\n"
         "45,ChatGPT,1087,0,1087,Conversation log\n"
         "118,GPT-4,417,276,693,API log\n")


def test_burstgpt_drops_failed_only_when_asked(tmp_path):
    _write(tmp_path / "b.csv", BURST)
    w = workload_from_config({"trace": {"format": "burstgpt", "path": "b.csv"}}, 0, tmp_path)
    assert w.arrival_s.tolist() == [0.0, 113.0] and w.output_tokens.tolist() == [18, 276]
    # Without drop_failed the failed row is kept, and a 0-token output is an error, not a clip.
    with pytest.raises(ValueError, match=r"b.csv: row 2 .*Response tokens is 0, must be >= 1"):
        workload_from_config({"trace": {"format": "burstgpt", "path": "b.csv",
                                        "drop_failed": False}}, 0, tmp_path)
    _write(tmp_path / "ok.csv", BURST.replace(",0,1087", ",7,1094"))
    kept = workload_from_config({"trace": {"format": "burstgpt", "path": "ok.csv",
                                           "drop_failed": False}}, 0, tmp_path)
    assert len(kept) == 3


def test_burstgpt_bad_row_after_a_dropped_one_keeps_its_file_row(tmp_path):
    _write(tmp_path / "b.csv", BURST + "200,GPT-4,0,5,5,API log\n")
    with pytest.raises(ValueError, match=r"row 4 .*Request tokens is 0"):
        workload_from_config({"trace": {"format": "burstgpt", "path": "b.csv"}}, 0, tmp_path)


def _mooncake_lines(rows) -> str:
    return "".join(json.dumps(dict(zip(("timestamp", "input_length", "output_length",
                                        "hash_ids"), r))) + "\n" for r in rows)


def test_mooncake_trace_and_prefix_rule(tmp_path):
    rows = [(0, 1300, 10, [1, 2, 3]),     # shares [1, 2] with the next row
            (1500, 1100, 20, [1, 2, 9]),  # shares [1, 2]
            (2000, 600, 5, [1, 7]),       # shares only [1] with the others
            (2500, 700, 8, [4, 5]),       # shares nothing: own group, 0 tokens
            (3000, 300, 4, [1])]          # shares [1], capped at its 300-token prompt
    _write(tmp_path / "m.jsonl", _mooncake_lines(rows) + "\n")
    w = workload_from_config({"trace": {"format": "mooncake", "path": "m.jsonl"}}, 0, tmp_path)
    assert w.arrival_s.tolist() == [0.0, 1.5, 2.0, 2.5, 3.0]
    assert w.prompt_tokens.tolist() == [1300, 1100, 600, 700, 300]
    assert w.prefix_group.tolist() == [1, 1, 1, 4, 1]
    assert w.prefix_tokens.tolist() == [1024, 1024, 512, 0, 300]
    # Sharing counts only the replayed requests: with limit 1 nothing is shared.
    one = workload_from_config({"trace": {"format": "mooncake", "path": "m.jsonl", "limit": 1}},
                               0, tmp_path)
    assert one.prefix_tokens.tolist() == [0]
    with pytest.raises(ValueError, match="carries its own prefix sharing"):
        workload_from_config({"trace": {"format": "mooncake", "path": "m.jsonl"},
                              "prefix": {"groups": 2, "tokens": 5}}, 0, tmp_path)


def test_mooncake_prefixes_direct():
    group, shared = mooncake_prefixes([(1, 2), (1, 2), ()], np.array([2000, 700, 5]))
    assert group.tolist() == [1, 1, -1] and shared.tolist() == [1024, 700, 0]


def test_mooncake_non_utf8_line_names_file_and_line(tmp_path):
    (tmp_path / "m.jsonl").write_bytes(_mooncake_lines([(0, 5, 2, [1])]).encode() + b"\xff\n")
    with pytest.raises(ValueError, match=r"m.jsonl: line 2: not UTF-8 text"):
        workload_from_config({"trace": {"format": "mooncake", "path": "m.jsonl"}}, 0, tmp_path)


@pytest.mark.parametrize("line, match", [
    ('{"timestamp": 1, "input_length": 5, "output_length": 2}',
     r"line 2: missing field 'hash_ids'"),
    ('{"timestamp": 1, "input_length": "x", "output_length": 2, "hash_ids": []}',
     r"line 2: field 'input_length' value 'x' is not a number"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 2, "hash_ids": [1]}',
     r"line 2: field 'timestamp' value -1 is negative"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": ["a"]}',
     r"line 2: field 'hash_ids' must be a list of ints"),
    ("not json", r"line 2: not valid JSON"),
])
def test_mooncake_bad_line_names_file_and_line(tmp_path, line, match):
    _write(tmp_path / "m.jsonl", _mooncake_lines([(0, 5, 2, [1])]) + line + "\n")
    with pytest.raises(ValueError, match="m.jsonl: " + match):
        workload_from_config({"trace": {"format": "mooncake", "path": "m.jsonl"}}, 0, tmp_path)


RUN = {"kind": "serve", "engine": "test", "engine_version": "0", "device": "cpu",
       "device_count": 1, "model_id": "m", "model_config_hash": "h", "dtype": "float32",
       "load_format": "dummy", "seed": 0, "git_rev": "x", "command": "c",
       "created_at": datetime.now(timezone.utc), "params_json": "{}"}


def _requests_trace(path, arrival_s, prompt, output):
    from traces import write_tables

    n = len(arrival_s)
    write_tables(path, RUN, {"requests": {
        "request_id": [f"r{i}" for i in range(n)], "replica_id": [0] * n, "priority": [0] * n,
        "arrival_s": arrival_s, "prompt_tokens": prompt, "output_tokens": output,
        "cached_prompt_tokens": [0] * n}})


def test_requests_trace(tmp_path):
    _requests_trace(tmp_path / "t", [10.0, 10.5, 12.0], [64, 256, 64], [32, 128, 32])
    w = workload_from_config({"trace": {"format": "requests", "path": "t", "time_scale": 2.0}},
                             seed=0, base_dir=tmp_path)
    assert w.arrival_s.tolist() == [0.0, 1.0, 4.0]
    assert w.prompt_tokens.tolist() == [64, 256, 64] and w.output_tokens.tolist() == [32, 128, 32]
    with pytest.raises(ValueError, match="t must be a file for format vidur"):
        workload_from_config({"trace": {"format": "vidur", "path": "t"}}, 0, tmp_path)


def test_requests_trace_zero_output_names_row(tmp_path):
    _requests_trace(tmp_path / "t", [0.0, 1.0], [5, 5], [3, 0])
    with pytest.raises(ValueError, match=r"requests: row 1 .*output_tokens is 0"):
        workload_from_config({"trace": {"format": "requests", "path": "t"}}, 0, tmp_path)


def test_empty_trace_is_an_error(tmp_path):
    _write(tmp_path / "e.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n")
    with pytest.raises(ValueError, match="e.csv: no requests"):
        workload_from_config({"trace": {"format": "vidur", "path": "e.csv"}}, 0, tmp_path)


def test_lengths_beyond_32_bit_token_counts_name_the_row(tmp_path):
    _write(tmp_path / "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
           "0,10,9.223372036854776e+18\n")
    with pytest.raises(ValueError, match=r"v.csv: row 1 .*num_decode_tokens is 9.22337e\+18, "
                                         r"more than 2147483647 tokens"):
        workload_from_config({"trace": {"format": "vidur", "path": "v.csv"}}, 0, tmp_path)
