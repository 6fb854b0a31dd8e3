"""How the PyTorch engine picks each sequence's token from the per-exit logits: its exit (the
first loaded layer confident enough, else the last), then greedy or seeded sampling at the
request's temperature within its nucleus (`top_p`), and the token's log-probability when asked
(a mixin of `TorchEngine`)."""

from __future__ import annotations

import torch

from engines.pytorch.spec import Token


def sample(row, temperature: float, top_p: float, generator) -> int:
    """A token drawn from one row of logits at `temperature`, within the smallest set of most
    likely tokens whose probability reaches `top_p` (the token that crosses it included)."""
    p = torch.softmax(row / temperature, dim=-1)
    if top_p < 1:
        sorted_p, order = p.sort(descending=True)
        sorted_p[(sorted_p.cumsum(0) - sorted_p) >= top_p] = 0  # after the nucleus
        p = torch.zeros_like(p).scatter_(0, order, sorted_p)
    return int(torch.multinomial(p, 1, generator=generator))


class TokenChoice:
    """`_choose`: each sequence's exit and token from one forward's logits."""

    def _choose(self, logits, seqs: list) -> list[Token]:
        """Each sequence's exit and token from the per-exit logits [layers, batch, vocab]."""
        probs = torch.softmax(logits, dim=-1)
        max_p, argmax = probs.max(dim=-1)  # [layers, batch]
        depth = logits.shape[0]
        exit_idx = torch.full((len(seqs),), depth - 1)
        # One device-to-host copy per step (each is a sync): argmax ids are exact in float32.
        max_p, argmax = torch.stack((max_p, argmax.to(max_p.dtype))).cpu()
        argmax = argmax.long()
        if self.spec.exit_threshold is not None:
            reached = max_p >= self.spec.exit_threshold
            reached[-1] = True
            exit_idx = reached.float().argmax(0)
        out = []
        for j, seq in enumerate(seqs):
            e = int(exit_idx[j])
            if seq.temperature > 0:
                tok = sample(logits[e, j], seq.temperature, seq.top_p, seq.generator)
            else:
                tok = int(argmax[e, j])
            seq.output_ids.append(tok)
            if seq.logprobs:  # under the model's distribution, as vLLM reports it
                seq.output_logprobs.append(float(torch.log_softmax(logits[e, j], -1)[tok]))
            layer = self.loaded_layers if depth == 1 and not self.spec.skip_layers else e + 1
            t = Token(seq.request_id, len(seq.output_ids) - 1, tok, layer, float(max_p[e, j]))
            if self.spec.record_exits:
                t.max_probs = max_p[:, j].tolist()
                t.argmax_ids = argmax[:, j].tolist()
            out.append(t)
        return out
