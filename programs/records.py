"""A program's row of the `programs` table, the same for the simulator and the live runner."""

from __future__ import annotations

import json



def describe_policy(policy) -> str:
    """A policy as short text (for tables and plots): its own `name`, else its repr."""
    return getattr(policy, "name", None) or repr(policy)


def describe_scheduler(scheduler) -> str:
    """The `scheduler` column's text of a scheduler spec (a name, or a mapping as JSON)."""
    return scheduler if isinstance(scheduler, str) else json.dumps(scheduler, sort_keys=True)


def program_row(plan, program, finish_s: float, method: str, policy, scheduler,
                gold_answer: str) -> dict:
    """The `programs` row of a finished program (without run_id); `policy` and `scheduler` may
    come described already (text: a workload's rows all share them)."""
    described = policy if isinstance(policy, str) else describe_policy(policy)
    return {"program_id": plan.program_id, "question_id": plan.question_id, "method": method,
            "policy": described, "scheduler": describe_scheduler(scheduler),
            "difficulty": plan.difficulty, "arrival_s": plan.arrival_s, "finish_s": finish_s,
            "deadline_s": plan.deadline_s, "paths": program.paths_used,
            "reasoning_tokens": program.reasoning, "probe_tokens": program.probe_tokens,
            "tokens_generated": program.tokens, "stop_position_tokens": program.stop_at,
            "answer": program.answer, "gold_answer": gold_answer,
            "is_correct": program.answer == gold_answer,
            "met_deadline": bool(finish_s - plan.arrival_s <= plan.deadline_s)}
