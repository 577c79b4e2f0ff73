"""Reported leak: a recurrent state carried from step to step with its autograd graph.

Thread: https://github.com/pytorch/pytorch/issues/2198 ("Memory leak problem in LSTM and RNN").
The reporter fed an RNN one step at a time, ``out, hidden = rnn(data, hidden)``, for thousands of
steps and memory grew until it ran out. The maintainers' diagnosis (apaszke, after Stonesjtu):
``hidden`` prevents any part of the graph from being freed, so autograd keeps the state for a
backward over the whole sequence; detaching it periodically (truncated backpropagation through
time, ``repackage_hidden`` in the word-language-model example) fixes it. Unity ml-agents PR 5048
fixed the same bug in an RL trainer: the LSTM memory was kept as a tensor with its gradient from
one step to the next, and for long episodes the graph exploded.

Reproduction: an RL-style loop. Every step the policy acts on a batch of 16 environments: its
``GRUCell`` updates ``policy.hidden`` from the observation and the previous state with autograd
on, as in the thread, and ``hidden`` is carried to the next step as it is; then the learner
takes one supervised step on a replayed batch (its own forward from a zero state). Nothing ever
backpropagates through the acting chain, so every step's GRU node stays alive with the tensors
it saved (the observation, the previous state, the gates), and the episode never ends in the
run: the chain grows for the whole run. The holder is ``policy.hidden`` (a tensor whose graph
grows by one GRU step per step). Fixed twin: ``fix_rnn_hidden_graph`` (the state is detached
after each step).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, CLASSES, HIDDEN, IN_DIM, Data, epochs_loop

SOURCE = "https://github.com/pytorch/pytorch/issues/2198"
ENVS = 16

SCENARIO = Scenario(
    name="rep_rnn_hidden_graph",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="hidden",
    description="pytorch#2198: RNN state carried across steps with its graph (never detached)",
    # Measured (glibc in-use bytes at epoch ends, reported/README.md): one GRU step's saved
    # tensors for 16 environments (input, previous state, gates) and its autograd nodes.
    planted_bytes_per_step=148_000,
    source=SOURCE,
    reported=True,
)


class RecurrentPolicy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(IN_DIM, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)
        self.hidden = torch.zeros(ENVS, HIDDEN)

    def act(self, obs: torch.Tensor, detach: bool) -> torch.Tensor:
        """One environment step: the state advances; autograd is on, as in the thread."""
        self.hidden = self.cell(obs, self.hidden)
        if detach:
            self.hidden = self.hidden.detach()  # the fix: truncate the graph at every step
        return self.head(self.hidden).argmax(dim=1)

    def learn_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.cell(x, torch.zeros(len(x), HIDDEN)))


policy: RecurrentPolicy | None = None


def _run(mw: Any, epochs: int, steps_per_epoch: int, detach: bool) -> list[list[Any]]:
    global policy
    torch.manual_seed(0)
    policy = agent = RecurrentPolicy()
    opt = torch.optim.SGD(agent.parameters(), lr=0.05, momentum=0.9)
    data = Data()

    def step(epoch: int, i: int) -> None:
        obs, _ = data.batch(ENVS)
        agent.act(obs, detach)
        x, y = data.batch(BATCH)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(agent.learn_logits(x), y).backward()
        opt.step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, detach=False)
