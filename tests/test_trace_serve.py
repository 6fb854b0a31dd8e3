"""`reasonsim trace serve` against a real vLLM OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TARGET_MODEL, run_cli
from traces import check_trace, read_run, read_table
from engines.server import LocalServer

pytestmark = pytest.mark.engine


def test_trace_serve_records_every_token(tmp_path):
    out = tmp_path / "serve"
    with LocalServer(TARGET_MODEL, log_path=tmp_path / "server.log") as server:
        # the server runs on the steady heap, as the in-process engines do
        environ = (Path("/proc") / str(server.proc.pid) / "environ").read_bytes().split(b"\0")
        assert b"MALLOC_MMAP_MAX_=0" in environ
        proc = run_cli("trace", "serve", "--url", server.url, "-o", str(out), "--num-requests",
                       "20", "--rate", "10", "--prompt-tokens", "16,48", "--output-tokens",
                       "8,24", "--json", "-q")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["requests"] == 20
    assert check_trace(out) == []
    assert read_run(out)["kind"] == "serve"
    reqs = read_table(out, "requests").to_pandas()
    toks = read_table(out, "token_times").to_pandas()
    assert set(reqs.output_tokens) <= {8, 24} and (reqs.finish_reason == "length").all()
    per_req = toks.groupby("request_id").size()
    assert (per_req.reindex(reqs.request_id).to_numpy() == reqs.output_tokens.to_numpy()).all()
    # Token times are non-decreasing within a request and bracketed by first token / finish.
    for rid, g in toks.groupby("request_id"):
        assert g.sort_values("token_index").time_s.is_monotonic_increasing
    assert (reqs.first_token_s > reqs.arrival_s).all()


def test_no_server_is_a_one_line_error(tmp_path):
    proc = run_cli("trace", "serve", "--url", "http://127.0.0.1:9", "-o", str(tmp_path / "x"),
                   check=False)
    assert proc.returncode == 2 and "no OpenAI-compatible server answers" in proc.stderr
