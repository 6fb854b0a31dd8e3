"""Columns of the method families' own tables: speculative steps (vLLM's speculative decoding,
SEED), A1's conformity tree and ToT's requests. `traces.schema` makes them schemas."""

from __future__ import annotations

import pyarrow as pa

from traces.fields import _RUN_ID, _f

SPEC_STEPS = [
    _RUN_ID,
    _f("request_id", pa.string(), "request id"),
    _f("draft_model_id", pa.string(), "draft model"),
    _f("target_model_id", pa.string(), "target model"),
    _f("replica_id", pa.int32(), "replica (engine) that ran the step"),
    _f("step_id", pa.int64(), "engine iteration (joins to steps)"),
    _f("step_index", pa.int32(), "speculation round of the request"),
    _f("proposed_tokens", pa.int32(), "draft tokens the target verified"),
    _f("accepted_tokens", pa.int32(), "draft tokens accepted (the target adds one of its own)"),
    _f("accepted_positions", pa.list_(pa.bool_()), "per drafted position: accepted"),
    _f("candidates_per_position", pa.list_(pa.int32()), "draft candidates per position (tree "
       "drafts, k_config); null: one", nullable=True),
    _f("num_speculative_tokens", pa.int32(), "K the engine drafts per step"),
    _f("temperature", pa.float64(), "sampling temperature (0: greedy acceptance)"),
    _f("phase", pa.string(), "program phase (thought generation, state evaluation)",
       nullable=True),
    _f("family", pa.string(), "task family", nullable=True),
    _f("difficulty", pa.int32(), "difficulty level", nullable=True),
    _f("draft_ms", pa.float64(), "drafting time of the whole step (all its requests)"),
    _f("verify_ms", pa.float64(), "the rest of the step: verification, sampling, scheduling"),
    _f("queue_wait_ms", pa.float64(), "wait for the verifier (separate draft/target engines)",
       nullable=True),
]

CONFORMITY = [
    _RUN_ID,
    _f("program_id", pa.string(), "A1 program (question x phase)"),
    _f("question_id", pa.string(), "question id"),
    _f("question_split", pa.string(), "calibration (never evaluated) or evaluation question"),
    _f("family", pa.string(), "task family", nullable=True),
    _f("difficulty", pa.int32(), "difficulty level", nullable=True),
    _f("gold_answer", pa.string(), "gold answer (scoring only; never seen by a policy)"),
    _f("sample", pa.int32(), "path (sample) of the program"),
    _f("turn", pa.int32(), "A1 turn: steps on the path before this one"),
    _f("path", pa.string(), "decisions before this turn, one letter a turn: A (draft step "
       "accepted) or R (target's step); with question, program and sample, the node's identity"),
    _f("policies", pa.list_(pa.string()), "policies whose path reaches this node"),
    _f("accepted_by", pa.list_(pa.string()), "policies that accepted the draft step"),
    _f("context_tokens", pa.int32(), "question + path tokens before the step"),
    _f("draft_tokens", pa.int32(), "tokens of the draft step", nullable=True),
    _f("draft_text", pa.string(), "the draft step", nullable=True),
    _f("draft_answer", pa.string(), "answer the draft step gives, if any", nullable=True),
    _f("draft_ended", pa.bool_(), "the draft step ends the path (answer or end of sequence)",
       nullable=True),
    _f("score", pa.float64(), "target nonconformity score of the draft step (mean NLL)",
       nullable=True),
    _f("score_prefill_tokens", pa.int32(), "step tokens the scoring prefill had to score",
       nullable=True),
    _f("score_cached_tokens", pa.int32(), "scoring prompt tokens read from the prefix cache",
       nullable=True),
    _f("score_rescored", pa.bool_(), "the cache covered part of the step, so the score was "
       "recomputed without it (vLLM returns no log-probabilities for cached tokens)",
       nullable=True),
    _f("p_value_marginal", pa.float64(), "conformal p-value against the pooled calibration set",
       nullable=True),
    _f("p_value_conditional", pa.float64(), "conformal p-value against the question's own "
       "calibration samples", nullable=True),
    _f("target_tokens", pa.int32(), "tokens of the target's own step from the same context",
       nullable=True),
    _f("target_text", pa.string(), "the target's step", nullable=True),
    _f("target_answer", pa.string(), "answer the target's step gives, if any", nullable=True),
    _f("target_ended", pa.bool_(), "the target's step ends the path", nullable=True),
    _f("target_score", pa.float64(), "mean NLL of the target's step under the target (its own "
       "sampled tokens' log-probabilities: the step's log-perplexity)", nullable=True),
    _f("draft_ms", pa.float64(), "draft step request latency (queueing included)",
       nullable=True),
    _f("score_ms", pa.float64(), "target scoring request latency", nullable=True),
    _f("target_ms", pa.float64(), "target step request latency", nullable=True),
    _f("draft_request_id", pa.string(), "draft step request (DIR/draft requests)",
       nullable=True),
    _f("score_request_id", pa.string(), "scoring request (DIR/target requests)", nullable=True),
    _f("target_request_id", pa.string(), "target step request (DIR/target requests)",
       nullable=True),
]


TOT_REQUESTS = [
    _RUN_ID,
    _f("program_id", pa.string(), "ToT program (a traced question x tree, or a workload's)"),
    _f("question_id", pa.string(), "question id"),
    _f("difficulty", pa.int32(), "difficulty level", nullable=True),
    _f("gold_answer", pa.string(), "gold answer (scoring only; never seen by a policy)"),
    _f("mode", pa.string(), "ar, ar_batched, sd, seed or seed_batched"),
    _f("node", pa.string(), "thought key: thought indices from the root, '.'-joined"),
    _f("level", pa.int32(), "tree level of the thought (1: the question's thoughts)"),
    _f("round", pa.int32(), "speculative round of the thought (eval: rounds taken)"),
    _f("kind", pa.string(), "draft, verify, ar (target writes the thought) or eval (value "
       "prompt); with program, node and round, the request's identity"),
    _f("role", pa.string(), "model pool: draft or target"),
    _f("request_id", pa.string(), "request id (DIR/draft or DIR/target requests)"),
    _f("prompt_tokens", pa.int32(), "prompt tokens (question + state + thought + drafted)"),
    _f("output_tokens", pa.int32(), "tokens the request added to the thought (verify: kept "
       "drafted tokens + the target's one, cut at the thought's end; eval: 1)"),
    _f("text", pa.string(), "text added to the thought (eval: the answer token)"),
    _f("ended", pa.bool_(), "the thought ended here (newline, end of sequence or its cap)"),
    _f("eos", pa.bool_(), "the thought ended the sequence"),
    _f("drafted_tokens", pa.int32(), "tokens drafted (draft, verify)", nullable=True),
    _f("accepted_tokens", pa.int32(), "drafted tokens the verification kept", nullable=True),
    _f("accepted_positions", pa.list_(pa.bool_()), "per drafted position: kept",
       nullable=True),
    _f("value", pa.float64(), "eval: the state's value (probability of its probe answer)",
       nullable=True),
    _f("answer", pa.string(), "eval: the state's probe answer", nullable=True),
    _f("rescored", pa.bool_(), "verify: the prefix cache covered part of the drafted tokens "
       "(a sibling verified the same ones), so it was re-run without the cache (vLLM returns no "
       "log-probabilities for cached tokens)", nullable=True),
    _f("sent_s", pa.float64(), "when the request reached its engine", nullable=True),
    _f("finish_s", pa.float64(), "when it finished", nullable=True),
]
