"""Reported leak: an RL trainer's per-agent dicts keep an entry for every agent id ever seen.

Thread: https://github.com/Unity-Technologies/ml-agents/pull/3383 ("Change AgentProcessor logic
to fix memory leak", merged; follow-up PR 3437 for resets forced from Python). "In a recent
change, the Agent ID now changes after every episode reset. This caused the dictionary of keys
to grow inside the AgentProcessor." The ``AgentProcessor`` kept, per global agent id, the last
step result it had seen (``last_step_result``: the whole batched step result of that step), the
last action outputs, step and reward counters; with a new id every episode, the entries of
finished agents were never deleted. The fix deletes an agent's entries when its episode ends.

Reproduction: 32 agents act in one environment under one shared policy; each agent's episode
ends with probability 1/8 per step and the agent comes back under a new id. The processor
stores, per agent id, the step's batched result (32 agents x 512-float observations, 64 KiB,
shared by all agents of that step) and the step's batched action outputs, and builds
trajectories from them; a learner trains on the trajectories. Every step whose batch saw an
episode end leaves that batch (64 KiB) behind, reachable only from stale ids. The holder is
``AgentProcessor.last_step_result``. Fixed twin: ``ho_fix_agent_id_dicts`` (entries of a finished
agent deleted, as in PR 3383).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import Scenario
from .._common import CLASSES, IN_DIM, MLP, epochs_loop

SOURCE = "https://github.com/Unity-Technologies/ml-agents/pull/3383"
AGENTS = 32
OBS_SIZE = 512  # floats per agent observation
END_PROB = 1 / 8
TIME_HORIZON = 16

SCENARIO = Scenario(
    name="ho_rep_agent_id_dicts",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="last_step_result",
    description="ml-agents#3383: AgentProcessor dicts keep every episode's agent id and step",
    # About one batched step result (32 x 512 float32) per step, reachable from finished ids.
    planted_bytes_per_step=AGENTS * OBS_SIZE * 4,
    source=SOURCE,
    split="heldout",
    reported=True,
)


@dataclass
class BatchedStepResult:
    obs: np.ndarray  # (agents, OBS_SIZE)
    reward: np.ndarray
    done: np.ndarray
    agent_id: np.ndarray

    def index_of(self, agent_id: int) -> int:
        return int(np.flatnonzero(self.agent_id == agent_id)[0])


class AgentProcessor:
    """Turns per-step results into per-agent trajectories (ml-agents 0.14's shape)."""

    def __init__(self, delete_finished: bool) -> None:
        self.delete_finished = delete_finished
        self.experience_buffers: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.last_step_result: dict[str, tuple[BatchedStepResult, int]] = {}
        self.last_take_action_outputs: dict[str, dict[str, np.ndarray]] = {}
        self.episode_steps: Counter[str] = Counter()
        self.episode_rewards: dict[str, float] = defaultdict(float)
        self.trajectories: list[list[dict[str, Any]]] = []

    def add_experiences(self, step: BatchedStepResult, worker_id: int,
                        take_action_outputs: dict[str, np.ndarray]) -> None:
        for index, agent_id in enumerate(step.agent_id.tolist()):
            global_id = f"{worker_id}-{agent_id}"
            stored = self.last_step_result.get(global_id)
            if stored is not None:
                prev, prev_index = stored
                outputs = self.last_take_action_outputs[global_id]
                self.experience_buffers[global_id].append({
                    "obs": prev.obs[prev_index], "action": outputs["action"][prev_index],
                    "reward": float(step.reward[index]), "done": bool(step.done[index])})
            self.last_step_result[global_id] = (step, index)
            self.last_take_action_outputs[global_id] = take_action_outputs
            self.episode_rewards[global_id] += float(step.reward[index])
            self.episode_steps[global_id] += 1
            buffer = self.experience_buffers[global_id]
            if step.done[index] or len(buffer) >= TIME_HORIZON:
                if buffer:
                    self.trajectories.append(buffer)
                self.experience_buffers[global_id] = []
            if step.done[index] and self.delete_finished:  # PR 3383: forget finished agents
                for table in (self.last_step_result, self.last_take_action_outputs,
                              self.episode_steps, self.episode_rewards,
                              self.experience_buffers):
                    table.pop(global_id, None)


class Environment:
    """32 agents; an agent whose episode ended comes back under a new id."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.ids = itertools.count()
        self.agent_id = np.array([next(self.ids) for _ in range(AGENTS)])
        self.done = np.zeros(AGENTS, dtype=bool)

    def step(self, action: np.ndarray) -> BatchedStepResult:
        # Agents that finished last step were reset: they come back with new ids.
        for k in np.flatnonzero(self.done):
            self.agent_id[k] = next(self.ids)
        self.done = self.rng.random(AGENTS) < END_PROB
        return BatchedStepResult(
            obs=self.rng.standard_normal((AGENTS, OBS_SIZE), dtype=np.float32),
            reward=(action == 0).astype(np.float32), done=self.done.copy(),
            agent_id=self.agent_id.copy())


def _run(mw: Any, epochs: int, steps_per_epoch: int, delete_finished: bool) -> list[list[Any]]:
    torch.manual_seed(0)
    policy = MLP()
    opt = torch.optim.SGD(policy.parameters(), lr=0.01, momentum=0.9)
    env = Environment()
    processor = AgentProcessor(delete_finished)
    step_result = env.step(np.zeros(AGENTS, dtype=np.int64))

    def step(epoch: int, i: int) -> None:
        nonlocal step_result
        with torch.no_grad():
            logits = policy(torch.from_numpy(step_result.obs[:, :IN_DIM]))
        action = logits.argmax(1).numpy()
        outputs = {"action": action, "log_probs": torch.log_softmax(logits, 1).numpy(),
                   "value": logits.mean(1).numpy()}
        processor.add_experiences(step_result, 0, outputs)
        step_result = env.step(action)
        # The learner: one update on the trajectories completed so far, then they are consumed.
        batch = [e for t in processor.trajectories for e in t][-64:]
        processor.trajectories.clear()
        if batch:
            x = torch.from_numpy(np.stack([e["obs"][:IN_DIM] for e in batch]))
            y = torch.tensor([int(e["action"]) % CLASSES for e in batch])
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(policy(x), y).backward()
            opt.step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, delete_finished=False)
