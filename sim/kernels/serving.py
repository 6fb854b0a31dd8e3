"""The `serving` step-time model compiled: its engine state, and a shared machine's speed spells.

`sim.step_time.serving_latency.ServingModel.step_ms` with `sim.engine.engine_state.EngineState`
(the step shapes seen, the idle since the last step, the after-prefill echo) and
`sim.step_time.spells.Spells` (a speed level per window of time in sampled latency), in the
same float expressions in the same order, so the plain kernel prices a step as the SimPy
replica does, bit for bit (`tests/test_compiled.py`).

State per replica in `sv` (float64, columns below from offset `o`) and `seen` (a flag per token
count from offset `so`: the shapes the engine has run a step with): arrays of their own in the
plain kernel (offsets 0), columns of the program kernel's `rf`. The spells' generators and log
quantiles lie beside them. A replica whose model is linear has `sv[j, o + SERVING] == 0` and no
spells.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from sim.step_time.serving_features import ECHO_WEIGHTS, FEATURES, IDLE_CAP_MS, IDLE_SHORT_MS
from sim.step_time.spells import SPELL_S, speed_levels

N_COEF = len(FEATURES)
# per replica (float64): the model's coefficients (the loop's step gap in the first), its
# caps, then the engine state and the spells' window
IDLE_SEEN, SHAPE_CAP, PAIRS, SERVING, ECHO_STEPS, SINCE_PREFILL, PRE_IDLE, PRE_TOKENS, \
    LAST_END, DRIFT, N_SPELLS, WINDOW, LEVEL, SV_COLS = range(N_COEF, N_COEF + 14)
W1, W2, W3 = ECHO_WEIGHTS


def serving_state(specs: list, rngs: list, sampled: bool):
    """The kernel's `eng`: (sv, seen, spell generators, spell log quantiles, a step's totals)
    for replicas
    `specs` [(Calibration, ReplicaConfig)], drawing each replica's run level (`sv[:, DRIFT]`)
    and spell seed from its noise generator as `Replica.__init__` does (`speed_levels`)."""
    nrep = len(specs)
    sv = np.zeros((nrep, SV_COLS))
    seen = np.zeros((nrep, max(rc.max_num_batched_tokens for _, rc in specs) + 1), np.uint8)
    spell_rngs, spell_q = [], []
    for j, (cal, rc) in enumerate(specs):
        model = cal.stepping  # the loop's step gap included
        drift, spells = speed_levels(model, rngs[j] if sampled else None)
        sv[j, DRIFT], sv[j, WINDOW], sv[j, LEVEL], sv[j, LAST_END] = drift, -1, 1.0, -np.inf
        spell_rngs.append(spells.rng if spells is not None else np.random.default_rng(0))
        spell_q.append(spells.log_q if spells is not None else ())
        sv[j, N_SPELLS] = len(spell_q[-1])
        if getattr(model, "engine_state", False):
            # an engine without prefix caching has no hits (`StepPricer`)
            sv[j, :N_COEF] = (model if rc.enable_prefix_caching else model.without_hits()).coef_ms
            sv[j, [IDLE_SEEN, SHAPE_CAP, PAIRS, SERVING]] = (
                model.idle_seen_ms, model.new_shape_cap_tokens, model.pairs, 1.0)
            # no prefill yet: no echo (`EngineState.__init__`)
            sv[j, ECHO_STEPS] = sv[j, SINCE_PREFILL] = len(ECHO_WEIGHTS) if model.echoes else 0
    q = np.zeros((nrep, max([len(v) for v in spell_q] + [1])))
    for j, v in enumerate(spell_q):
        q[j, :len(v)] = v
    from numba.typed import List

    # the last: a step's totals, reused by the plain kernel's every step (no allocation there)
    return sv, seen, List(spell_rngs), q, np.zeros(6, dtype=np.int64)


@njit(cache=True)
def step_ms(sv, o, seen, so, j, now_s, p, d, context, prefill_seqs, span_context, pair_tokens,
            span_pairs, linear_ms):
    """`EngineState.before_step` and `ServingModel.step_ms` of a step at now_s whose linear
    part is `linear_ms`: (its mean ms, whether it is plain: no first-of-shape or idle term, so
    a decode run may fast-forward, carrying any echo: `echo_head`). Marks the shape seen."""
    tokens = p + d
    new_shape = seen[j, so + tokens] == 0
    seen[j, so + tokens] = 1
    idle_ms = (now_s - sv[j, o + LAST_END]) * 1e3
    if idle_ms < 1e-3:  # float rounding of event times: no idle
        idle_ms = 0.0
    w = 0.0
    if p:
        sv[j, o + SINCE_PREFILL], sv[j, o + PRE_IDLE], sv[j, o + PRE_TOKENS] = \
            0.0, idle_ms, float(p)
    else:
        k = min(sv[j, o + SINCE_PREFILL] + 1.0, sv[j, o + ECHO_STEPS] + 1.0)
        sv[j, o + SINCE_PREFILL] = k
        if k <= sv[j, o + ECHO_STEPS]:
            w = W1 if k == 1.0 else (W2 if k == 2.0 else W3)
    c = sv[j, o:o + N_COEF]
    ms = linear_ms
    if p:
        if sv[j, o + PAIRS] > 0 and pair_tokens:
            pairs = float(pair_tokens)
        else:
            pairs = p * p / max(prefill_seqs, 1)
        ms += c[5] + c[10] * pairs / 1e3 + (
            c[14] * p + c[15] * span_context / 1e3 + c[16] * span_pairs / 1e6
            if span_context > 0 else 0.0)
    if new_shape:
        ms += c[6] + c[7] * min(float(tokens), sv[j, o + SHAPE_CAP]) / 100.0
    idle_seen = sv[j, o + IDLE_SEEN]
    if idle_ms > 0.0:
        seen_ms = min(idle_ms, idle_seen)
        ms += c[8] * min(seen_ms, IDLE_CAP_MS) / 100.0 + \
            c[9] * min(seen_ms, IDLE_SHORT_MS) / IDLE_SHORT_MS
    if w:
        ms += w * echo_ms(sv, o, j)
    return ms, not new_shape and idle_ms == 0.0


@njit(cache=True)
def echo_ms(sv, o, j):
    """`ServingModel.echo_ms` of replica j's last prefill step."""
    c = sv[j, o:o + N_COEF]
    return c[11] + c[12] * min(min(sv[j, o + PRE_IDLE], sv[j, o + IDLE_SEEN]), IDLE_CAP_MS) \
        / 100.0 + c[13] * sv[j, o + PRE_TOKENS] / 1e3


@njit(cache=True)
def echo_head(sv, o, j):
    """`StepPricer.echo_head` of the step just begun on replica j: (echo ms, its place 1-3) that
    a decode run starting with it carries, (0.0, 0) for none (or a linear replica's)."""
    at = sv[j, o + SINCE_PREFILL]
    if sv[j, o + SERVING] == 0.0 or at <= 0.0 or at > sv[j, o + ECHO_STEPS]:
        return 0.0, 0
    return echo_ms(sv, o, j), int(at)


@njit(cache=True)
def ran(sv, o, j, k):
    """`EngineState.ran`: replica j's decode run of k iterations has ended."""
    if k > 1 and sv[j, o + SERVING] > 0.0:
        sv[j, o + SINCE_PREFILL] = min(sv[j, o + SINCE_PREFILL] + k - 1.0,
                                       sv[j, o + ECHO_STEPS] + 1.0)


@njit(cache=True)
def spell_level(eng, j, now_s):
    """`Spells.at`: the level of the window holding now_s, every earlier window drawn first
    (`eng`: `serving_state`'s, offset 0)."""
    sv, spell_q = eng[0], eng[3]
    w = int(now_s // SPELL_S)
    g = eng[2][j]
    while sv[j, WINDOW] < w:
        sv[j, WINDOW] += 1.0
        sv[j, LEVEL] = math.exp(spell_q[j, g.integers(0, int(sv[j, N_SPELLS]))])
    return sv[j, LEVEL]


@njit(cache=True)
def spell_end_s(sv, j):
    """`Spells.end_s`: where the current window ends."""
    return (sv[j, WINDOW] + 1.0) * SPELL_S
